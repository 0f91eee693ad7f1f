#include "model/context.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

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
  if (p.n_ctx == 0) p.n_ctx = std::max<int64_t>(hp.n_ctx_train, 512);
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
  auto plan = make_rope_plan(p.rope, ri);
  if (!plan) return make_error("--rope: " + plan.error().message);
  auto c = std::unique_ptr<Context>(new Context(model, p));
  c->rope_plan_ = std::make_unique<RopePlan>(std::move(*plan));
  c->rope_ = c->rope_plan_->table(p.n_ctx);

  KvCacheConfig kc;
  kc.n_layer = hp.n_layer;
  kc.n_head_kv = hp.n_head_kv;
  kc.head_dim = hp.head_dim;
  kc.head_dim_v = hp.head_dim_v;
  kc.block_tokens = p.kv_block;
  kc.type_k = p.kv_type_k;
  kc.type_v = p.kv_type_v;
  kc.budget_bytes = p.kv_budget;
  kc.spill_dir = p.kv_spill;
  kc.policy = p.kv_spill.empty() ? KvBudgetPolicy::kEvict : KvBudgetPolicy::kSpill;
  kc.rope = c->rope_;
  if (c->rope_plan_->dynamic()) {
    const RopePlan* plan = c->rope_plan_.get();
    kc.rope_provider = [plan](int64_t n_ctx) { return plan->table(n_ctx); };
  }
  LC_ASSIGN_OR_RETURN(c->kv_, KvCache::create(kc));
  AttnShape as;
  as.n_layer = hp.n_layer;
  as.n_head = hp.n_head;
  as.n_head_kv = hp.n_head_kv;
  as.head_dim = hp.head_dim;
  as.head_dim_v = hp.head_dim_v;
  if (backend) {
    c->backend_ = std::move(backend);
  } else {
    auto attn = make_attention_backend(p.attn, as);
    if (!attn) return make_error("--attn: " + attn.error().message);
    c->backend_ = std::move(*attn);
  }
  LC_TRY(c->backend_->attach(*c->kv_));
  if (!p.kv_press.empty() && p.kv_press != "none") {
    PressShape ps{hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.head_dim_v, 0.0f};
    auto press = make_kv_press(p.kv_press, ps);
    if (!press) return make_error("--kv-press: " + press.error().message);
    c->press_ = std::move(*press);
    const int64_t w = c->press_->n_obs();
    if (w > 0) {
      c->obs_q_.resize(static_cast<size_t>(hp.n_layer * w * hp.n_head * hp.head_dim));
      c->obs_pos_.resize(static_cast<size_t>(w));
    }
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

Status Context::decode(std::span<const int32_t> tokens, Logits which) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return make_error("decode: no tokens");
  if (n_past_ + n > params_.n_ctx) {
    return make_error(strprintf("%lld tokens do not fit: %lld already in the context of %lld "
                                "(raise --ctx-size)",
                                (long long)n, (long long)n_past_, (long long)params_.n_ctx));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= hp_.n_vocab)
      return make_error(strprintf("token id %d at index %lld is outside the vocabulary [0, %lld)",
                                  tokens[static_cast<size_t>(i)], (long long)i, (long long)hp_.n_vocab));
  }
  n_outputs_ = which == Logits::kAll ? n : which == Logits::kLast ? 1 : 0;
  logits_.resize(static_cast<size_t>(n_outputs_ * hp_.n_vocab));
  const bool prompt = n > 1;
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
    if (press_ && prompt && i + m < n) LC_TRY(compress(PressPhase::kChunk));
  }
  if (press_) {
    if (prompt) {
      n_generated_ = 0;
      LC_TRY(compress(PressPhase::kChunk));
      LC_TRY(compress(PressPhase::kPrefill));
    } else if (press_->schedule().decode_due(++n_generated_)) {
      LC_TRY(compress(PressPhase::kDecode));
    }
  }
  return Status::ok();
}

Status Context::compress(PressPhase phase) {
  if (!press_->schedule().covers(phase)) return Status::ok();
  const int64_t w = press_->n_obs(), row = hp_.n_head * hp_.head_dim;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    PressContext pc;
    pc.kv = kv_.get();
    pc.pool = &pool_;
    pc.phase = phase;
    pc.queries = w > 0 ? obs_q_.data() + (il * w + (w - n_obs_)) * row : nullptr;
    pc.query_pos = w > 0 ? obs_pos_.data() + (w - n_obs_) : nullptr;
    pc.n_obs = n_obs_;
    LC_TRY(press_->compress(pc, il));
  }
  return Status::ok();
}

// Keeps the last n_obs() queries of layer il right-aligned in its window: the press reads the
// queries of the latest tokens whatever the chunking.
void Context::observe(int64_t il, const float* q, int64_t n) {
  const int64_t w = press_->n_obs(), row = hp_.n_head * hp_.head_dim;
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
    kernels::matmul(L.wq, cur, n, q_.data(), pool_);
    kernels::matmul(L.wk, cur, n, k_.data(), pool_);
    kernels::matmul(L.wv, cur, n, v_.data(), pool_);
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
    if (press_ && press_->n_obs() > 0) observe(il, q_.data(), n);
    LC_TRY(kv_->append(il, n, k_.data(), v_.data(), pos_.data()));
    LC_TRY(backend_->forward(il, n, q_.data(), pos_.data(), *kv_, attn_.data(), pool_));
    kernels::matmul(L.wo, attn_.data(), n, cur, pool_);
    rows(n, [&](int64_t t) { kernels::add_inplace(x + t * E, cur + t * E, E); });

    rows(n, [&](int64_t t) { kernels::rmsnorm(x + t * E, L.ffn_norm, cur + t * E, E, hp.rms_eps); });
    kernels::matmul(L.w_gate, cur, n, gate_.data(), pool_);
    kernels::matmul(L.w_up, cur, n, up_.data(), pool_);
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

}  // namespace lc
