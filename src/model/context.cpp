#include "model/context.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>

#include "core/sys.h"
#include "kernels/kernels.h"
#include "kv/press_spec.h"
#include "model/draft.h"

namespace lc {

namespace {
LlamaCppRopeParams llama_cpp_rope_params(const HParams& hp, const std::vector<float>& freq_factors) {
  LlamaCppRopeParams r;
  r.n_rot = hp.n_rot;
  r.neox = hp.rope_kind == RopeKind::kNeox;
  r.base = hp.rope_base;
  r.freq_scale = hp.rope_freq_scale;
  r.ext_factor = hp.yarn_ext_factor;
  r.attn_factor = hp.yarn_attn_factor;
  r.beta_fast = hp.yarn_beta_fast;
  r.beta_slow = hp.yarn_beta_slow;
  r.orig_ctx = hp.rope_orig_ctx;
  r.freq_factors = freq_factors;
  return r;
}
AttnShape attn_shape_of(const HParams& hp) {
  AttnShape as;
  as.n_layer = hp.n_layer;
  as.n_head = hp.n_head;
  as.n_head_kv = hp.n_head_kv;
  as.head_dim = hp.head_dim;
  as.head_dim_v = hp.head_dim_v;
  as.fixed_distance = hp.fixed_distance;
  return as;
}
}  // namespace

Context::Context(const Model& model, const ContextParams& p)
    : model_(model), hp_(model.hparams()), params_(p),
      pool_(p.n_threads > 0 ? p.n_threads : default_thread_count()) {}

Expected<std::unique_ptr<Context>> Context::create(const Model& model, const ContextParams& p) {
  return create(model, p, nullptr);
}

Expected<std::unique_ptr<Context>> Context::create(const Model& model, const ContextParams& in,
                                                   std::unique_ptr<AttentionBackend> backend) {
  ContextParams p = in;
  const HParams& hp = model.hparams();
  const bool grow = p.n_ctx == 0;
  if (grow) p.n_ctx = kGrowingContext;
  if (p.n_ctx < 1 || p.n_ctx > (int64_t{1} << 31))
    return make_error(strprintf("context size %lld is out of range", (long long)p.n_ctx));
  if (p.n_batch < 1 || p.n_batch > 65536)
    return make_error(strprintf("batch size %lld is out of range [1, 65536]", (long long)p.n_batch));
  p.n_batch = std::min(p.n_batch, p.n_ctx);
  if (p.n_threads < 0 || p.n_threads > 1024)
    return make_error(strprintf("thread count %d is out of range", p.n_threads));
  RopeModelInfo ri;
  ri.gguf = llama_cpp_rope_params(hp, model.rope_freq_factors());
  ri.n_ctx_train = hp.n_ctx_train;
  // A model trained with logit scaling gets it with its GGUF rope ("" or "gguf"); any other
  // --rope (e.g. `none`, the plain rope) is taken as given.
  const bool own_rope = p.rope.empty() || p.rope == "gguf";
  const std::string rope_spec =
      own_rope && hp.logn_orig > 0 ? strprintf("logn:orig=%lld", (long long)hp.logn_orig) : p.rope;
  auto plan = make_rope_plan(rope_spec, ri);
  if (!plan) return make_error("--rope: " + plan.error().message);
  auto c = std::unique_ptr<Context>(new Context(model, p));
  c->rope_plan_ = std::make_unique<RopePlan>(std::move(*plan));
  // A growing context starts from the table of the trained length; a dynamic scaling follows the
  // length as it grows (the cache asks the plan per append).
  c->rope_ = c->rope_plan_->table(grow ? std::max<int64_t>(hp.n_ctx_train, 512) : p.n_ctx);

  KvCacheConfig kc;
  kc.n_layer = hp.n_layer;
  kc.n_head_kv = hp.n_head_kv;
  kc.head_dim = hp.head_dim;
  kc.head_dim_v = hp.head_dim_v;
  kc.block_tokens = p.kv_block;
  kc.type_k = p.kv_type_k;
  kc.type_v = p.kv_type_v;
  kc.budget_bytes = p.kv_budget;
  if (grow && p.kv_budget == 0 && p.kv_spill.empty()) {
    // Bounded by the machine: an error that names the limit, never an out-of-memory kill.
    const int64_t avail = available_memory_bytes();
    if (avail > 0) {
      kc.budget_bytes = avail / 4 * 3;
      kc.budget_is_default = true;
    }
  }
  kc.spill_dir = p.kv_spill;
  kc.policy = p.kv_spill.empty() ? KvBudgetPolicy::kEvict : KvBudgetPolicy::kSpill;
  kc.rope = c->rope_;
  if (c->rope_plan_->dynamic()) {
    const RopePlan* plan = c->rope_plan_.get();
    kc.rope_provider = [plan](int64_t n_ctx) { return plan->table(n_ctx); };
  }
  LC_ASSIGN_OR_RETURN(c->kv_, KvCache::create(kc));
  const AttnShape as = attn_shape_of(hp);
  if (backend) {
    c->backend_ = std::move(backend);
  } else {
    auto attn = make_attention_backend(p.attn, as);
    if (!attn) return make_error("--attn: " + attn.error().message);
    c->backend_ = std::move(*attn);
  }
  LC_TRY(c->backend_->attach(*c->kv_));
  if (p.draft) LC_TRY(check_draft_vocab(model, p.model_name, *p.draft, p.draft_name));
  if (!p.kv_press.empty() && p.kv_press != "none") {
    PressShape ps{hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.head_dim_v, 0.0f};
    auto press = make_kv_press(p.kv_press, ps);
    if (!press) return make_error("--kv-press: " + press.error().message);
    c->press_ = std::move(*press);
    Status st = c->press_->check_backend(c->backend_->caps());
    if (!st) return make_error("--kv-press: " + st.message());
    if (c->press_->needs_draft() && !p.draft)
      return make_error(strprintf("--kv-press %s needs a draft model: give --draft DRAFT.gguf (a small model with the "
                                  "same vocabulary as %s)", p.kv_press.c_str(), p.model_name.c_str()));
    c->observer_ = c->press_->observer();
    // The observer normalises with the dense backend's row log-sum-exp (one pass instead of two).
    c->backend_->keep_row_lse(c->observer_ != nullptr);
    c->record_queries(c->press_->n_obs());
  }
  const size_t nb = static_cast<size_t>(p.n_batch);
  const int64_t q_dim = hp.n_head * hp.head_dim;
  const int64_t o_dim = hp.n_head * hp.head_dim_v;
  try {
    c->x_.resize(nb * static_cast<size_t>(hp.n_embd));
    c->cur_.resize(nb * static_cast<size_t>(std::max({hp.n_embd, q_dim, o_dim})));
    c->q_.resize(nb * static_cast<size_t>(q_dim));
    c->k_.resize(nb * static_cast<size_t>(hp.n_head_kv * hp.head_dim));
    c->v_.resize(nb * static_cast<size_t>(hp.n_head_kv * hp.head_dim_v));
    c->attn_.resize(nb * static_cast<size_t>(o_dim));
    c->gate_.resize(nb * static_cast<size_t>(hp.n_ff));
    c->up_.resize(nb * static_cast<size_t>(hp.n_ff));
    c->embd_.resize(static_cast<size_t>(hp.n_embd));
    c->pos_.resize(nb);
  } catch (const std::bad_alloc&) {
    return make_error(strprintf("out of memory allocating activations for batch size %lld",
                                (long long)p.n_batch));
  }
  return c;
}

size_t Context::activation_bytes() const {
  return (x_.size() + cur_.size() + q_.size() + k_.size() + v_.size() + attn_.size() +
          gate_.size() + up_.size()) * sizeof(float) + logits_.capacity() * sizeof(float);
}

void Context::truncate(int64_t n) {
  n_past_ = n < n_past_ ? n : n_past_;
  kv_->truncate(n_past_);
  if (static_cast<int64_t>(tokens_.size()) > n_past_) tokens_.resize(static_cast<size_t>(n_past_));
  if (observer_) observer_->truncate(n_past_);
  n_obs_ = 0;  // the observation window restarts with the next tokens
  context_done_ = false;
  if (n_past_ == 0) t_press_ = 0;
}

void Context::record_queries(int64_t n) {
  if (n <= obs_w_) return;
  obs_w_ = n;
  obs_q_.resize(static_cast<size_t>(hp_.n_layer * n * hp_.n_head * hp_.head_dim));
  obs_pos_.assign(static_cast<size_t>(n), 0);
  n_obs_ = 0;
}

Status Context::decode(std::span<const int32_t> tokens, Logits which) { return decode_impl(tokens, which, false); }

Status Context::decode_context(std::span<const int32_t> tokens) { return decode_impl(tokens, Logits::kNone, true); }

Status Context::decode_impl(std::span<const int32_t> in, Logits which, bool context_part) {
  if (in.empty()) return make_error("decode: no tokens");
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] < 0 || in[i] >= hp_.n_vocab)
      return make_error(strprintf("token id %d at index %zu is outside the vocabulary [0, %lld)", in[i], i,
                                  (long long)hp_.n_vocab));
  }
  const bool prompt = in.size() > 1 || context_part;
  // Query-agnostic presses compress the context part only; the question after it stays whole.
  const bool agnostic = press_ && !press_->schedule().query_aware;
  const bool compress_now = press_ && (!agnostic || context_part || !context_done_);
  std::span<const int32_t> tokens = in;
  std::vector<int32_t> selected;
  if (press_ && press_->prompt_compression() && prompt && compress_now && n_past_ == 0) {
    if (which == Logits::kAll)
      return make_error("kv press specpc evaluates only the prompt tokens it selects: the logits of every prompt "
                        "token (perplexity) do not exist");
    prompt_kept_.clear();
    const double t0 = now_seconds();
    LC_TRY(select_prompt(in, selected));
    t_press_ += now_seconds() - t0;
    tokens = selected;
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n_past_ + n > params_.n_ctx) {
    return make_error(ErrorCode::kContextFull, strprintf("%lld tokens do not fit: %lld already in the context of %lld "
                                "(raise --ctx-size)",
                                (long long)n, (long long)n_past_, (long long)params_.n_ctx));
  }
  n_outputs_ = which == Logits::kAll ? n : which == Logits::kLast ? 1 : 0;
  logits_.resize(static_cast<size_t>(n_outputs_ * hp_.n_vocab));
  for (int64_t i = 0; i < n; i += params_.n_batch) {
    const int64_t m = std::min(params_.n_batch, n - i);
    Logits w = Logits::kNone;
    if (which == Logits::kAll) w = Logits::kAll;
    if (which == Logits::kLast && i + m == n) w = Logits::kLast;
    Status st = forward_chunk(tokens.data() + i, m, w, logits_.data() + (w == Logits::kAll ? i * hp_.n_vocab : 0));
    if (!st.is_ok()) {
      kv_->truncate(n_past_);  // drop this chunk's partial appends: the cache stays consistent
      return st;
    }
    tokens_.insert(tokens_.end(), tokens.begin() + i, tokens.begin() + i + m);
    if (press_ && prompt && compress_now && i + m < n) LC_TRY(compress(PressPhase::kChunk));
    if (on_chunk_ && !on_chunk_(i + m, n) && i + m < n)
      return make_error(ErrorCode::kCancelled, strprintf("cancelled after %lld of %lld tokens", (long long)(i + m), (long long)n));
  }
  if (press_) {
    if (prompt) {
      n_generated_ = 0;
      if (compress_now) {
        LC_TRY(compress(PressPhase::kChunk));
        if (press_->lookahead() > 0 && press_->schedule().covers(PressPhase::kPrefill)) {
          LC_TRY(lookahead_compress());
        } else {
          LC_TRY(compress(PressPhase::kPrefill));
        }
        if (agnostic && context_part) context_done_ = true;
      }
    } else if (press_->schedule().decode_due(++n_generated_)) {
      LC_TRY(compress(PressPhase::kDecode));
    }
  }
  return Status::ok();
}

Expected<std::vector<int32_t>> Context::draft_generate(std::span<const int32_t> prompt, int64_t n, int64_t record) {
  const int64_t need = static_cast<int64_t>(prompt.size()) + n;
  if (!draft_ctx_ || draft_ctx_->n_ctx() < need) {
    ContextParams dp;
    dp.n_ctx = std::max(params_.n_ctx, need);
    dp.n_batch = params_.n_batch;
    dp.n_threads = params_.n_threads;
    dp.kv_block = params_.kv_block;
    draft_ctx_.reset();
    auto d = Context::create(*params_.draft, dp);
    if (!d) return make_error("draft model " + params_.draft_name + ": " + d.error().message);
    draft_ctx_ = std::move(*d);
  }
  Context& dc = *draft_ctx_;
  dc.clear();
  dc.record_queries(record);
  LC_TRY(dc.decode(prompt, Logits::kLast));
  std::vector<int32_t> out;
  const int64_t nv = dc.model().hparams().n_vocab;
  for (int64_t i = 0; i < n; ++i) {
    const float* lg = dc.logits(0);
    const int32_t id = static_cast<int32_t>(std::max_element(lg, lg + nv) - lg);  // greedy, lowest id on ties
    out.push_back(id);
    if (i + 1 < n) LC_TRY(dc.decode(std::span<const int32_t>(&id, 1), Logits::kLast));
  }
  return out;
}

// SpecKV (Galim et al., arXiv 2506.08373): the draft continues the prompt greedily; this model
// runs those tokens over its cache so that their queries join the observation window (the
// approximate future queries), the tokens are removed again (truncate), and the press scores
// the prompt's keys with the last prompt queries plus the lookahead queries.
Status Context::lookahead_compress() {
  const int64_t P = n_past_;
  const int64_t la = std::min(press_->lookahead(), params_.n_ctx - P);
  if (la <= 0 || obs_w_ == 0) return compress(PressPhase::kPrefill);
  const double t0 = now_seconds();  // the draft and the lookahead forward (compress() times itself)
  LC_ASSIGN_OR_RETURN(std::vector<int32_t> drafted, draft_generate(tokens_, la, 0));
  // The window of the real tokens comes back afterwards (later compressions while decoding,
  // TOVA's last query, must not see the draft's tokens).
  std::vector<float> saved_q(obs_q_.data(), obs_q_.data() + obs_q_.size());
  std::vector<int32_t> saved_pos = obs_pos_;
  const int64_t saved_n = n_obs_;
  auto restore = [&] {
    kv_->truncate(P);
    n_past_ = P;
    std::copy(saved_q.begin(), saved_q.end(), obs_q_.data());
    obs_pos_ = saved_pos;
    n_obs_ = saved_n;
    observing_ = true;
  };
  observing_ = false;  // the draft's tokens are not attention the model really computed
  for (int64_t i = 0; i < la; i += params_.n_batch) {
    const int64_t m = std::min(params_.n_batch, la - i);
    Status st = forward_chunk(drafted.data() + i, m, Logits::kNone, nullptr);
    if (!st) {
      restore();
      return st;
    }
  }
  kv_->truncate(P);  // the lookahead tokens leave the cache; their queries stay in the window
  n_past_ = P;
  t_press_ += now_seconds() - t0;
  Status st = compress(PressPhase::kPrefill);
  restore();
  return st;
}

// SpecPC (Galim et al., arXiv 2506.08373): the draft reads the whole prompt and looks ahead;
// its attention picks the prompt tokens this model evaluates (press_spec.cpp).
// Positions: the kept tokens are evaluated as a shorter prompt at contiguous positions 0..k-1
// (re-assigned), as the authors' implementation does (it gathers the token ids and prefills
// them as a new prompt). This keeps every later position inside the range the model was
// trained on (the point of compressing a long prompt), keeps n_past() == tokens held for the
// runtime and the other presses, and needs no special case in the attention backends.
Status Context::select_prompt(std::span<const int32_t> prompt, std::vector<int32_t>& selected) {
  const PromptCompression& pc = *press_->prompt_compression();
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t keep = std::max<int64_t>(1, pc.kept(P));
  if (keep >= P) {
    selected.assign(prompt.begin(), prompt.end());
    for (int64_t j = 0; j < P; ++j) prompt_kept_.push_back(static_cast<int32_t>(j));
    return Status::ok();
  }
  const int64_t la = pc.lookahead;
  LC_ASSIGN_OR_RETURN(std::vector<int32_t> drafted, draft_generate(prompt, la, pc.window + la - 1));
  (void)drafted;
  const Context& dc = *draft_ctx_;
  const HParams& dh = dc.model().hparams();
  const PressShape ds{dh.n_layer, dh.n_head, dh.n_head_kv, dh.head_dim, dh.head_dim_v, 0.0f};
  const int64_t n_q = dc.n_recorded();
  const int64_t n_win = n_q - (la - 1);  // the generated tokens fed to the draft come last
  std::vector<const float*> q(static_cast<size_t>(dh.n_layer));
  for (int64_t il = 0; il < dh.n_layer; ++il) q[static_cast<size_t>(il)] = dc.recorded_queries(il);
  const std::vector<float> scores =
      specpc_scores(dc.kv(), ds, q, dc.recorded_positions(), dc.recorded_positions(), n_q, n_win, P, pc);
  prompt_kept_ = specpc_select(scores, keep, pc);
  selected.clear();
  for (int32_t j : prompt_kept_) selected.push_back(prompt[static_cast<size_t>(j)]);
  draft_ctx_->clear();
  return Status::ok();
}

Status Context::compress(PressPhase phase) {
  if (!press_->schedule().covers(phase)) return Status::ok();
  const double t0 = now_seconds();
  struct Timer {
    double t0;
    double& acc;
    ~Timer() { acc += now_seconds() - t0; }
  } timer{t0, t_press_};
  const int64_t W = obs_w_, row = hp_.n_head * hp_.head_dim;
  const int64_t m = std::min(n_obs_, press_->n_obs());
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    PressContext pc;
    pc.kv = kv_.get();
    pc.pool = &pool_;
    pc.phase = phase;
    pc.queries = m > 0 ? obs_q_.data() + (il * W + (W - m)) * row : nullptr;
    pc.query_pos = m > 0 ? obs_pos_.data() + (W - m) : nullptr;
    // Positions are sequence indices in a context (pos = n_past + t); after SpecKV's lookahead
    // the window's last queries lie past the cache's end, which the indices say explicitly.
    pc.query_seq = pc.query_pos;
    pc.n_obs = m;
    LC_TRY(press_->compress(pc, il));
  }
  return Status::ok();
}

// Keeps the last obs_w_ queries of layer il right-aligned in its window: the press reads the
// queries of the latest tokens whatever the chunking.
void Context::observe(int64_t il, const float* q, int64_t n) {
  const int64_t w = obs_w_, row = hp_.n_head * hp_.head_dim;
  const int64_t take = std::min(n, w);
  float* buf = obs_q_.data() + il * w * row;
  std::memmove(buf, buf + take * row, static_cast<size_t>((w - take) * row) * sizeof(float));
  std::memcpy(buf + (w - take) * row, q + (n - take) * row, static_cast<size_t>(take * row) * sizeof(float));
  if (il == 0) {
    std::memmove(obs_pos_.data(), obs_pos_.data() + take, static_cast<size_t>(w - take) * sizeof(int32_t));
    std::memcpy(obs_pos_.data() + (w - take), pos_.data() + (n - take), static_cast<size_t>(take) * sizeof(int32_t));
    n_obs_ = std::min(w, n_obs_ + n);
  }
}

Status Context::forward_chunk(const int32_t* tokens, int64_t n, Logits which, float* logits) {
  const HParams& hp = hp_;
  const int64_t E = hp.n_embd, q_dim = hp.n_head * hp.head_dim,
                k_dim = hp.n_head_kv * hp.head_dim, v_dim = hp.n_head_kv * hp.head_dim_v;
  float* x = x_.data();
  float* cur = cur_.data();

  for (int64_t t = 0; t < n; ++t) {
    const TensorView& te = model_.tok_embd();
    kernels::dequantize_row(te.type, te.row(tokens[t]), x + t * E, E);
    pos_[static_cast<size_t>(t)] = static_cast<int32_t>(n_past_ + t);
  }

  auto rows = [&](int64_t count, auto&& fn) {
    pool_.parallel_for(count, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) fn(i);
    }, count >= 64 ? 8 : count);
  };

  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = model_.layers()[static_cast<size_t>(il)];
    rows(n, [&](int64_t t) { kernels::rmsnorm(x + t * E, L.attn_norm, cur + t * E, E, hp.rms_eps); });
    {
      const TensorView* w[3] = {wq_views_.empty() ? &L.wq : &wq_views_[static_cast<size_t>(il)], &L.wk, &L.wv};
      float* y[3] = {q_.data(), k_.data(), v_.data()};
      kernels::matmul_multi(w, y, cur, n, pool_);
    }
    rows(n, [&](int64_t t) {
      float* qt = q_.data() + t * q_dim;
      float* kt = k_.data() + t * k_dim;
      float* vt = v_.data() + t * v_dim;
      if (L.bq) kernels::add_inplace(qt, L.bq, q_dim);
      if (L.bk) kernels::add_inplace(kt, L.bk, k_dim);
      if (L.bv) kernels::add_inplace(vt, L.bv, v_dim);
      if (L.q_norm) {
        for (int64_t h = 0; h < hp.n_head; ++h)
          kernels::rmsnorm(qt + h * hp.head_dim, L.q_norm, qt + h * hp.head_dim, hp.head_dim, hp.rms_eps);
        for (int64_t h = 0; h < hp.n_head_kv; ++h)
          kernels::rmsnorm(kt + h * hp.head_dim, L.k_norm, kt + h * hp.head_dim, hp.head_dim, hp.rms_eps);
      }
      // Queries and keys go to the attention backend and the cache before RoPE: the cache
      // rotates keys with its table, the backend rotates queries at the positions it uses.
      rope_plan_->scale_q(qt, 1, hp.n_head, hp.head_dim, &pos_[static_cast<size_t>(t)]);
    });
    if (obs_w_ > 0) observe(il, q_.data(), n);
    LC_TRY(kv_->append(il, n, k_.data(), v_.data(), pos_.data()));
    LC_TRY(backend_->forward(il, n, q_.data(), pos_.data(), *kv_, attn_.data(), pool_));
    // H2O: the attention these queries just paid, accumulated on the press side (positions are
    // the sequence indices here).
    if (observer_ && observing_) {
      const double t0 = now_seconds();
      observer_->observe(*kv_, il, q_.data(), pos_.data(), pos_.data(), n, &pool_, backend_->row_lse());
      t_press_ += now_seconds() - t0;
    }
    kernels::matmul(L.wo, attn_.data(), n, cur, pool_);
    rows(n, [&](int64_t t) { kernels::add_inplace(x + t * E, cur + t * E, E); });

    rows(n, [&](int64_t t) { kernels::rmsnorm(x + t * E, L.ffn_norm, cur + t * E, E, hp.rms_eps); });
    {
      const TensorView* w[2] = {&L.w_gate, &L.w_up};
      float* y[2] = {gate_.data(), up_.data()};
      kernels::matmul_multi(w, y, cur, n, pool_);
    }
    rows(n, [&](int64_t t) {
      kernels::swiglu(gate_.data() + t * hp.n_ff, up_.data() + t * hp.n_ff, gate_.data() + t * hp.n_ff, hp.n_ff);
    });
    kernels::matmul(L.w_down, gate_.data(), n, cur, pool_);
    rows(n, [&](int64_t t) { kernels::add_inplace(x + t * E, cur + t * E, E); });
  }
  n_past_ += n;

  if (which == Logits::kNone) return Status::ok();
  const int64_t first = which == Logits::kAll ? 0 : n - 1;
  const int64_t n_out = n - first;
  rows(n_out, [&](int64_t i) {
    kernels::rmsnorm(x + (first + i) * E, model_.output_norm(), cur + i * E, E, hp.rms_eps);
  });
  kernels::matmul(model_.output(), cur, n_out, logits, pool_);
  return Status::ok();
}

void Context::set_query_weights(Buffer<float> wq) {
  const int64_t q_dim = hp_.n_head * hp_.head_dim;
  LC_CHECK(wq.size() == static_cast<size_t>(hp_.n_layer * q_dim * hp_.n_embd));
  wq_override_ = std::move(wq);
  wq_views_.assign(static_cast<size_t>(hp_.n_layer), TensorView{});
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    TensorView& v = wq_views_[static_cast<size_t>(il)];
    v.data = wq_override_.data() + il * q_dim * hp_.n_embd;
    v.type = DType::F32;
    v.ne[0] = hp_.n_embd;
    v.ne[1] = q_dim;
  }
}

namespace {
constexpr uint32_t kCtxStateMagic = 0x5843434cu;  // "LCCX"
template <class T>
void put(std::ostream& o, const T& v) {
  o.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
void put_array(std::ostream& o, const T* p, size_t n) {
  put<uint64_t>(o, n);
  if (n) o.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(T)));
}
template <class T>
bool get(std::istream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof v));
}
// Reads a count (at most max_n) then the elements into out (resized with resize()).
template <class V>
bool get_array(std::istream& in, V& out, uint64_t max_n) {
  uint64_t n = 0;
  if (!get(in, n) || n > max_n) return false;
  out.resize(static_cast<size_t>(n));
  return n == 0 || static_cast<bool>(in.read(reinterpret_cast<char*>(out.data()),
                                             static_cast<std::streamsize>(n * sizeof(out.data()[0]))));
}
}  // namespace

Status Context::save_state(std::ostream& out) const {
  if (observer_)
    return make_error(ErrorCode::kUnsupported,
                      strprintf("cannot save a session with --kv-press %s: its attention statistics of the forward "
                                "passes are not part of the cache", press_->spec().c_str()));
  put(out, kCtxStateMagic);
  put<int64_t>(out, n_past_);
  put_array(out, tokens_.data(), tokens_.size());
  put_array(out, prompt_kept_.data(), prompt_kept_.size());
  put<int64_t>(out, n_outputs_);
  put_array(out, logits_.data(), logits_.size());
  put<int64_t>(out, n_generated_);
  put<uint8_t>(out, context_done_ ? 1 : 0);
  put<int64_t>(out, obs_w_);
  put<int64_t>(out, n_obs_);
  put_array(out, obs_q_.data(), obs_q_.size());
  put_array(out, obs_pos_.data(), obs_pos_.size());
  put_array(out, wq_override_.data(), wq_views_.empty() ? 0 : wq_override_.size());
  if (!out) return make_error(ErrorCode::kIo, "context: write error while saving the state");
  return kv_->write_state(out);
}

Status Context::load_state(std::istream& in) {
  clear();
  clear_query_weights();
  auto bad = [&](const char* what) {
    clear();
    clear_query_weights();
    return make_error(ErrorCode::kBadFile, strprintf("saved context: %s", what));
  };
  uint32_t magic = 0;
  int64_t n_past = 0, n_outputs = 0, n_generated = 0, obs_w = 0, n_obs = 0;
  uint8_t done = 0;
  std::vector<int32_t> tokens, kept, obs_pos;
  std::vector<float> logits;
  if (!get(in, magic) || magic != kCtxStateMagic) return bad("not a saved context (bad magic)");
  const uint64_t max_tokens = static_cast<uint64_t>(params_.n_ctx);
  if (!get(in, n_past) || n_past < 0 || n_past > params_.n_ctx) {
    if (n_past > params_.n_ctx)
      return make_error(ErrorCode::kContextFull,
                        strprintf("the saved session holds %lld tokens but the context holds %lld (raise --ctx-size)",
                                  (long long)n_past, (long long)params_.n_ctx));
    return bad("truncated header");
  }
  if (!get_array(in, tokens, max_tokens) || static_cast<int64_t>(tokens.size()) != n_past) return bad("bad token list");
  for (int32_t t : tokens)
    if (t < 0 || t >= hp_.n_vocab) return bad("a token id is outside the vocabulary");
  if (!get_array(in, kept, max_tokens)) return bad("bad prompt selection");
  if (!get(in, n_outputs) || n_outputs < 0 || n_outputs > n_past) return bad("bad output count");
  if (!get_array(in, logits, static_cast<uint64_t>(n_outputs * hp_.n_vocab)) ||
      static_cast<int64_t>(logits.size()) != n_outputs * hp_.n_vocab)
    return bad("bad logits");
  if (!get(in, n_generated) || !get(in, done) || !get(in, obs_w) || !get(in, n_obs)) return bad("truncated press state");
  if (obs_w != obs_w_ || n_obs < 0 || n_obs > obs_w_)
    return make_error(ErrorCode::kInvalidArgument, "the saved session was made with another --kv-press (its "
                                                   "observation window differs)");
  const size_t obs_q_n = obs_q_.size(), obs_pos_n = obs_pos_.size();
  if (!get_array(in, obs_q_, obs_q_n) || !get_array(in, obs_pos_, obs_pos_n) || obs_q_.size() != obs_q_n ||
      obs_pos_.size() != obs_pos_n) {
    obs_q_.resize(obs_q_n);
    obs_pos_.resize(obs_pos_n);
    return bad("bad observation window");
  }
  Buffer<float> wq;
  const uint64_t wq_n = static_cast<uint64_t>(hp_.n_layer * hp_.n_head * hp_.head_dim * hp_.n_embd);
  if (!get_array(in, wq, wq_n) || (wq.size() != 0 && wq.size() != wq_n)) return bad("bad query weights");
  LC_TRY(kv_->read_state(in));
  // A fresh backend: it summarises the restored cache from scratch.
  if (Status st = set_attention(backend_->spec()); !st) {
    clear();
    return st;
  }
  n_past_ = n_past;
  tokens_ = std::move(tokens);
  prompt_kept_ = std::move(kept);
  n_outputs_ = n_outputs;
  logits_ = std::move(logits);
  n_generated_ = n_generated;
  context_done_ = done != 0;
  n_obs_ = n_obs;
  if (wq.size() != 0) set_query_weights(std::move(wq));
  return Status::ok();
}

void Context::clear_query_weights() {
  wq_views_.clear();
  wq_override_.resize(0);
}

Status Context::set_attention(std::string_view spec) {
  const AttnShape as = attn_shape_of(hp_);
  auto attn = make_attention_backend(spec, as);
  if (!attn) return make_error("--attn: " + attn.error().message);
  if (press_) {
    Status st = press_->check_backend((*attn)->caps());
    if (!st) return make_error("--kv-press: " + st.message());
  }
  LC_TRY((*attn)->attach(*kv_));
  (*attn)->keep_row_lse(observer_ != nullptr);
  backend_ = std::move(*attn);
  params_.attn = std::string(spec);
  return Status::ok();
}

}  // namespace lc
