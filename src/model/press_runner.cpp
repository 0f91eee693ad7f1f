#include "model/press_runner.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/binary_io.h"
#include "core/sys.h"
#include "kernels/kernels.h"
#include "kv/press_kvzip.h"
#include "kv/press_spec.h"

namespace lc {

namespace {
// Adds the seconds since it was made to acc when it goes.
struct ScopedTimer {
  double& acc;
  double t0 = now_seconds();
  ~ScopedTimer() { acc += now_seconds() - t0; }
};

// The model's W_o for the presses (PressContext::out_proj): a layer's matrix is dequantised to
// f32 when a press first asks for it and kept (n_embd x n_head * head_dim_v floats per layer).
class ModelOutputProjection final : public OutputProjection {
 public:
  explicit ModelOutputProjection(const Model& m) : model_(m), f32_(m.layers().size()) {}
  int64_t n_embd() const override { return model_.hparams().n_embd; }
  const float* layer(int64_t il) override {
    std::vector<float>& w = f32_[static_cast<size_t>(il)];
    if (w.empty()) {
      const TensorView& wo = model_.layers()[static_cast<size_t>(il)].wo;  // rows: outputs
      w.resize(static_cast<size_t>(wo.n_rows() * wo.ne[0]));
      for (int64_t r = 0; r < wo.n_rows(); ++r)
        kernels::dequantize_row(wo.type, wo.row(r), w.data() + r * wo.ne[0], wo.ne[0]);
    }
    return w.data();
  }

 private:
  const Model& model_;
  std::vector<std::vector<float>> f32_;
};
}  // namespace

PressRunner::PressRunner(std::unique_ptr<KvPress> press, const Model& model, const ContextParams& p)
    : press_(std::move(press)), out_proj_(std::make_unique<ModelOutputProjection>(model)),
      n_layer_(model.hparams().n_layer) {
  const HParams& hp = model.hparams();
  observer_ = press_->observer();
  kvzip_ = press_->reconstruction();
  if (kvzip_) {  // KVzip's reconstruction prompts, encoded as kvpress does (no BOS, no special tokens)
    const Tokenizer& tok = model.tokenizer();
    kvzip_first_ = tok.encode(kKvzipFirstPrompt, false, false);
    kvzip_next_ = tok.encode(kKvzipNextPrompt, false, false);
    kvzip_suffix_ = tok.encode(kKvzipSuffix, false, false);
  }
  // The draft's context is made on its first call, with this context's size and batch.
  if (press_->needs_draft() && p.draft) draft_ = std::make_unique<DraftRunner>(*p.draft, p.draft_name, p);
  window_.resize(hp.n_layer, hp.n_head * hp.head_dim, press_->n_obs());
}

Expected<std::unique_ptr<PressRunner>> PressRunner::create(const Model& model, const ContextParams& p,
                                                           AttentionBackend& backend) {
  if (p.kv_press.empty() || p.kv_press == "none") return std::unique_ptr<PressRunner>();
  const HParams& hp = model.hparams();
  PressShape ps{hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.head_dim_v, 0.0f};
  auto press = make_kv_press(p.kv_press, ps);
  if (!press) return make_error("--kv-press: " + press.error().message);
  auto r = std::unique_ptr<PressRunner>(new PressRunner(std::move(*press), model, p));
  LC_TRY(r->attach_backend(backend));
  if (r->press_->needs_draft() && !p.draft)
    return make_error(fmt::format("--kv-press {} needs a draft model: give --draft DRAFT.gguf (a small model with the "
                                  "same vocabulary as {})", p.kv_press, p.model_name));
  return r;
}

Status PressRunner::attach_backend(AttentionBackend& backend) {
  Status st = press_->check_backend(backend.caps());
  if (!st) return make_error("--kv-press: " + st.message());
  // The observer normalises with the dense backend's row log-sum-exp (one pass instead of two).
  backend.keep_row_lse(observer_ != nullptr);
  return ok_status();
}

// Query-agnostic presses compress the context part only; the question after it stays whole.
// SpecPC selects the prompt tokens to evaluate when the prompt starts the sequence.
Status PressRunner::before_prompt(Context& ctx, std::span<const int32_t> prompt, const DecodeCall& call,
                                  std::optional<std::vector<int32_t>>& replace) {
  const bool agnostic = !press_->schedule().query_aware;
  active_ = !agnostic || call.context_part || !context_done_;
  if (active_ && ctx.n_past() == 0 && press_->lookahead() != 0 && press_->schedule().covers(PressPhase::kPrefill) &&
      press_->sparse_prefill())
    return sparse_begin(ctx, prompt, call, replace);
  if (!press_->prompt_compression() || !active_ || ctx.n_past() != 0) return ok_status();
  if (call.which == Logits::kAll)
    return make_error("kv press specpc evaluates only the prompt tokens it selects: the logits of every prompt "
                      "token (perplexity) do not exist");
  prompt_kept_.clear();
  ScopedTimer timer{t_press_};
  std::vector<int32_t> selected;
  LC_TRY(select_prompt(prompt, selected));
  replace = std::move(selected);
  return ok_status();
}

void PressRunner::on_queries(int64_t il, const float* q, const int32_t* pos, int64_t n) {
  if (sparse_.active && il == 0 && sparse_.first_chunk < 0) sparse_.first_chunk = n;
  window_.push(il, q, pos, n);
}

// H2O: the attention these queries just paid, accumulated on the press side (positions are the
// sequence indices here).
void PressRunner::on_attention(Context& ctx, int64_t il, const float* q, const int32_t* pos, int64_t n) {
  if (in_kvzip_) {  // KVzip's reconstruction tokens: their attention scores the context
    if (!kvzip_error_.empty()) return;  // the first error is reported after the pass
    const Status st = kvzip_->observe(ctx.kv(), il, q, pos, pos, n, &ctx.pool());
    if (!st) kvzip_error_ = st.message();
    return;
  }
  if (in_lookahead_) {
    capture_lookahead_keys(ctx.kv(), il, n);
    return;
  }
  if (!observer_) return;
  ScopedTimer timer{t_press_};
  observer_->observe(ctx.kv(), il, q, pos, pos, n, &ctx.pool(), ctx.attention().row_lse());
}

Status PressRunner::after_chunk(Context& ctx) { return active_ ? compress(ctx, PressPhase::kChunk) : ok_status(); }

Status PressRunner::after_prompt(Context& ctx, const DecodeCall& call) {
  n_generated_ = 0;
  if (!active_) return ok_status();
  if (sparse_.active) return sparse_finish(ctx);
  LC_TRY(compress(ctx, PressPhase::kChunk));
  if (kvzip_ && press_->schedule().covers(PressPhase::kPrefill)) {
    LC_TRY(kvzip_compress(ctx));
  } else if (press_->lookahead() != 0 && press_->schedule().covers(PressPhase::kPrefill)) {
    LC_TRY(lookahead_compress(ctx));
  } else {
    LC_TRY(compress(ctx, PressPhase::kPrefill));
  }
  if (!press_->schedule().query_aware && call.context_part) context_done_ = true;
  return ok_status();
}

Status PressRunner::after_token(Context& ctx) {
  if (in_recompute_) return ok_status();  // the last prompt token, evaluated again (sparse_finish)
  if (press_->schedule().decode_due(++n_generated_)) return compress(ctx, PressPhase::kDecode);
  return ok_status();
}

void PressRunner::on_truncate(int64_t n) {
  if (keep_window_) return;  // sparse_finish's own cuts
  if (observer_) observer_->truncate(n);
  window_.clear();  // the observation window restarts with the next tokens
  context_done_ = false;
  if (n == 0) t_press_ = 0;
}

Status PressRunner::compress(Context& ctx, PressPhase phase, int64_t n_lookahead) {
  if (!press_->schedule().covers(phase)) return ok_status();
  ScopedTimer timer{t_press_};
  const int64_t m = std::min(window_.size(), press_->n_obs() + n_lookahead);
  LC_CHECK(m >= n_lookahead);
  const int64_t per_layer = ctx.kv().n_head_kv() * n_lookahead * ctx.kv().head_dim();
  for (int64_t il = 0; il < n_layer_; ++il) {
    PressContext pc;
    pc.kv = &ctx.kv();
    pc.pool = &ctx.pool();
    pc.phase = phase;
    pc.queries = m > 0 ? window_.queries(il, m) : nullptr;
    pc.query_pos = m > 0 ? window_.positions(m) : nullptr;
    // Positions are sequence indices in a context (pos = n_past + t); after SpecKV's lookahead
    // the window's last queries lie past the cache's end, which the indices say explicitly.
    pc.query_seq = pc.query_pos;
    pc.n_obs = m;
    pc.n_lookahead = n_lookahead;
    pc.lookahead_keys = n_lookahead > 0 ? lookahead_keys_.data() + il * per_layer : nullptr;
    pc.out_proj = out_proj_.get();
    LC_TRY(press_->compress(pc, il));
  }
  return ok_status();
}

// SpecKV (Galim et al., arXiv 2506.08373): the draft answers the prompt greedily (up to the
// lookahead, ending after an end-of-generation token); the model runs that answer over its
// cache, so that its queries join the observation window and its keys join the scores'
// softmax, as in the authors' code, where the target prefills prompt + draft answer in one
// pass and scores before the answer is cropped away. The tokens leave the cache again
// (evaluate_scratch), and the press scores the prompt's keys with the last prompt queries
// plus the lookahead queries, the lookahead keys copied aside while they were in the cache.
Status PressRunner::lookahead_compress(Context& ctx) {
  const int64_t want = press_->lookahead() == kLookaheadAnswer
                           ? (answer_tokens_ >= 0 ? answer_tokens_ : kLookaheadNoAnswer)
                           : press_->lookahead();
  const int64_t la = std::min(want, ctx.n_ctx() - ctx.n_past());
  lookahead_run_ = 0;
  if (la <= 0) return compress(ctx, PressPhase::kPrefill);
  // The window of the real tokens comes back afterwards (later compressions while decoding,
  // TOVA's last query, must not see the draft's tokens).
  const QueryWindow saved = window_;
  Status st = ok_status();
  {
    ScopedTimer timer{t_press_};  // the draft and the lookahead forward (compress() times itself)
    LC_ASSIGN_OR_RETURN(std::vector<int32_t> drafted, draft_->generate(ctx.tokens(), la, 0, true));
    const KvCache& kv = ctx.kv();
    lookahead_n_ = static_cast<int64_t>(drafted.size());
    lookahead_seq0_ = ctx.n_past();
    lookahead_keys_.assign(static_cast<size_t>(n_layer_ * kv.n_head_kv() * lookahead_n_ * kv.head_dim()), 0.0f);
    lookahead_done_.assign(static_cast<size_t>(n_layer_), 0);
    lookahead_error_.clear();
    window_.grow(saved.width() + lookahead_n_);
    in_lookahead_ = true;  // the draft's tokens are not attention the model really computed
    st = ctx.evaluate_scratch(drafted);
    in_lookahead_ = false;
    if (st && lookahead_error_.empty())
      for (int64_t il = 0; il < n_layer_; ++il)
        if (lookahead_done_[static_cast<size_t>(il)] != lookahead_n_)
          lookahead_error_ = fmt::format("layer {} stored {} of the {} lookahead tokens", il,
                                         lookahead_done_[static_cast<size_t>(il)], lookahead_n_);
    if (st && !lookahead_error_.empty())
      st = make_error(fmt::format("--kv-press {}: the draft's lookahead tokens: {}", press_->spec(), lookahead_error_));
  }
  if (st) st = compress(ctx, PressPhase::kPrefill, lookahead_n_);
  if (st) lookahead_run_ = lookahead_n_;
  window_ = saved;
  std::vector<float>().swap(lookahead_keys_);  // up to n_layer x n_head_kv x lookahead keys
  return st;
}

// SpecKV's sparse prefill as the authors' code runs it (speckv.py, llama_util.py): the draft
// answers the prompt first; the target evaluates prompt + answer in one pass, each layer with the
// vertical-slash attention (vslash: sparse above vertical + slash tokens) whose vertical tokens the
// window (the last obs prompt tokens and the answer) chooses; the press scores with the same
// window; the answer and the last prompt token are cropped, and that token is evaluated again
// over the compressed cache, whose logits start the answer.
Status PressRunner::sparse_begin(Context& ctx, std::span<const int32_t> prompt, const DecodeCall& call,
                                 std::optional<std::vector<int32_t>>& replace) {
  if (call.which == Logits::kAll)
    return make_error(fmt::format("--kv-press {}: prefill=sparse evaluates the prompt with the draft's answer; the "
                                  "logits of every prompt token (perplexity) are not kept", press_->spec()));
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t want = press_->lookahead() == kLookaheadAnswer
                           ? (answer_tokens_ >= 0 ? answer_tokens_ : kLookaheadNoAnswer)
                           : press_->lookahead();
  const int64_t la = std::min(want, ctx.n_ctx() - P);
  lookahead_run_ = 0;
  if (la <= 0) return ok_status();  // no room for an answer: the prompt alone, compressed after it
  std::vector<int32_t> drafted;
  {
    ScopedTimer timer{t_press_};
    LC_ASSIGN_OR_RETURN(drafted, draft_->generate(std::vector<int32_t>(prompt.begin(), prompt.end()), la, 0, true));
  }
  const int64_t n = P + static_cast<int64_t>(drafted.size());
  if (n > ctx.n_batch())
    return make_error(fmt::format("--kv-press {}: prefill=sparse evaluates the prompt and the draft's answer ({} "
                                  "tokens) in one forward pass: give -b {} or more (or prefill=dense)",
                                  press_->spec(), n, n));
  lookahead_n_ = static_cast<int64_t>(drafted.size());
  sparse_ = SparsePrefill{true, P, -1, prompt[static_cast<size_t>(P - 1)], ctx.attention().spec()};
  if (Status st = ctx.set_attention(press_->prefill_attention(press_->n_obs() + lookahead_n_)); !st) {
    sparse_ = SparsePrefill{};
    return st;
  }
  window_.grow(press_->n_obs() + lookahead_n_);
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), drafted.begin(), drafted.end());
  replace = std::move(all);
  return ok_status();
}

Status PressRunner::sparse_finish(Context& ctx) {
  const int64_t P = sparse_.prompt, la = lookahead_n_;
  const SparsePrefill sp = sparse_;
  sparse_ = SparsePrefill{};
  LC_TRY(ctx.set_attention(sp.attn));
  if (sp.first_chunk != P + la || ctx.n_past() != P + la)
    return make_error(fmt::format("--kv-press {}: prefill=sparse: the prompt and the answer ({} tokens) were not "
                                  "evaluated in one forward pass ({} in the first)", press_->spec(), P + la,
                                  sp.first_chunk));
  const KvCache& kv = ctx.kv();
  const int64_t Hkv = kv.n_head_kv(), d = kv.head_dim();
  Status st = ok_status();
  {
    ScopedTimer timer{t_press_};
    // The answer's keys, as the scores' softmax needs them once the answer has left the cache.
    lookahead_keys_.assign(static_cast<size_t>(n_layer_ * Hkv * la * d), 0.0f);
    for (int64_t il = 0; il < n_layer_ && st; ++il)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t nh = kv.n_tokens(il, h);
        const int32_t* idx = kv.seq_index(il, h);
        if (nh < la || idx[nh - la] != P || idx[nh - 1] != P + la - 1) {
          st = make_error(fmt::format("--kv-press {}: layer {} head {} does not hold the answer as its newest tokens",
                                      press_->spec(), il, h));
          break;
        }
        kv.read_keys(il, h, nh - la, la, lookahead_keys_.data() + (il * Hkv + h) * la * d);
      }
  }
  keep_window_ = true;  // the window (prompt and answer queries) outlives the cuts
  if (st) ctx.truncate(P);
  if (st) st = compress(ctx, PressPhase::kPrefill, la);
  if (st) lookahead_run_ = la;
  std::vector<float>().swap(lookahead_keys_);
  window_.drop_newest(la);  // the answer's queries; then the last prompt token's, evaluated again
  window_.drop_newest(1);
  if (st) ctx.truncate(P - 1);
  keep_window_ = false;
  if (st) {
    in_recompute_ = true;
    st = ctx.decode(std::span<const int32_t>(&sp.last, 1), Logits::kLast);
    in_recompute_ = false;
  }
  return st;
}

// KVzip (Kim et al., arXiv 2505.23416; kvpress KVzipPress): after the context, the model reads a
// reconstruction prompt and the context again, chunk_size context tokens at a time: "Repeat the
// previous context exactly." (later chunks: "Repeat the part of the previous context exactly,
// starting with" + the previous chunk's last `postfix` tokens), "\n", then the chunk's tokens.
// Each pass attends the whole context and its own tokens, and leaves the cache again before the
// next (evaluate_scratch), as kvpress cuts its cache back to the context after every layer; the
// press scores the context with the passes' attention (kv/press_kvzip.cpp), then compresses.
Status PressRunner::kvzip_compress(Context& ctx) {
  kvzip_passes_ = kvzip_tokens_ = 0;
  if (!kvzip_->needed(ctx.kv())) return ok_status();  // kvpress runs nothing at ratio 0
  const std::vector<int32_t>& toks = ctx.tokens();
  const int64_t n = static_cast<int64_t>(toks.size());
  if (n == 0) return ok_status();
  // The context tokens' sequence indices: every one below n_past() but the hidden ones.
  std::vector<int32_t> seq;
  seq.reserve(static_cast<size_t>(n));
  size_t hi = 0;
  const auto& hidden = ctx.hidden();
  for (int64_t s = 0; s < ctx.n_past(); ++s) {
    while (hi < hidden.size() && s >= hidden[hi].first + hidden[hi].count) ++hi;
    if (hi < hidden.size() && s >= hidden[hi].first) continue;
    seq.push_back(static_cast<int32_t>(s));
  }
  if (static_cast<int64_t>(seq.size()) != n)
    return make_error(fmt::format("--kv-press {}: {} tokens held but {} sequence indices", press_->spec(), n,
                                  seq.size()));
  const QueryWindow saved = window_;  // the reconstruction tokens are not the sequence's
  Status st = ok_status();
  {
    ScopedTimer timer{t_press_};  // the reconstruction passes (compress() times itself)
    st = kvzip_->begin(ctx.kv(), std::move(seq));
    const std::vector<KvzipChunk> chunks = kvzip_->chunks(n);
    for (size_t i = 0; i < chunks.size() && st; ++i) {
      const KvzipChunk& c = chunks[i];
      std::vector<int32_t> ids = i == 0 ? kvzip_first_ : kvzip_next_;
      if (i > 0) {
        const KvzipChunk& prev = chunks[i - 1];
        const int64_t take = std::min(kvzip_->postfix(), prev.end - prev.first);
        ids.insert(ids.end(), toks.begin() + (prev.end - take), toks.begin() + prev.end);
      }
      ids.insert(ids.end(), kvzip_suffix_.begin(), kvzip_suffix_.end());
      ids.insert(ids.end(), toks.begin() + c.first, toks.begin() + c.end);
      if (ctx.n_past() + static_cast<int64_t>(ids.size()) > ctx.n_ctx()) {
        st = make_error(ErrorCode::kContextFull,
                        fmt::format("--kv-press {}: reconstruction pass {} of {} needs {} tokens after the {} of the "
                                    "sequence, but the context holds {} (raise --ctx-size to {}, or lower "
                                    "chunk_size=)",
                                    press_->spec(), i + 1, chunks.size(), ids.size(), ctx.n_past(), ctx.n_ctx(),
                                    ctx.n_past() + static_cast<int64_t>(ids.size())));
        break;
      }
      st = kvzip_->begin_chunk(ctx.kv(), c, ctx.n_past());
      if (st) {
        kvzip_error_.clear();
        in_kvzip_ = true;
        st = ctx.evaluate_scratch(ids);
        in_kvzip_ = false;
        if (st && !kvzip_error_.empty()) st = make_error(kvzip_error_);
      }
      if (!st) {
        st = make_error(st.code(), fmt::format("--kv-press {}: reconstruction pass {} of {} ({} tokens after the {} "
                                               "of the context): {}",
                                               press_->spec(), i + 1, chunks.size(), ids.size(), n, st.message()));
      } else {
        ++kvzip_passes_;
        kvzip_tokens_ += static_cast<int64_t>(ids.size());
      }
    }
    if (st) st = kvzip_->finish(ctx.kv());
  }
  window_ = saved;
  if (st) st = compress(ctx, PressPhase::kPrefill);
  if (!st) kvzip_->reset();
  return st;
}

void PressRunner::capture_lookahead_keys(const KvCache& kv, int64_t il, int64_t n) {
  if (!lookahead_error_.empty()) return;
  const int64_t Hkv = kv.n_head_kv(), d = kv.head_dim();
  int64_t& done = lookahead_done_[static_cast<size_t>(il)];
  if (done + n > lookahead_n_) {
    lookahead_error_ = fmt::format("layer {} ran {} tokens, more than the {} drafted", il, done + n, lookahead_n_);
    return;
  }
  for (int64_t h = 0; h < Hkv; ++h) {
    const int64_t nh = kv.n_tokens(il, h);
    const int32_t* idx = kv.seq_index(il, h);
    // The chunk's tokens are the newest of every head: sequence indices seq0 + done ... + n - 1.
    if (nh < n || idx[nh - n] != lookahead_seq0_ + done || idx[nh - 1] != lookahead_seq0_ + done + n - 1) {
      lookahead_error_ = fmt::format("layer {} head {} does not hold them as its newest tokens (the attention "
                                     "backend moved or dropped them)",
                                     il, h);
      return;
    }
    kv.read_keys(il, h, nh - n, n, lookahead_keys_.data() + ((il * Hkv + h) * lookahead_n_ + done) * d);
  }
  done += n;
}

// SpecPC (Galim et al., arXiv 2506.08373): the draft reads the whole prompt and looks ahead;
// its attention picks the prompt tokens this model evaluates (press_spec.cpp).
// Positions: the kept tokens are evaluated as a shorter prompt at contiguous positions 0..k-1
// (re-assigned), as the authors' implementation does (it gathers the token ids and prefills
// them as a new prompt). This keeps every later position inside the range the model was
// trained on (the point of compressing a long prompt), keeps n_past() == tokens held for the
// runtime and the other presses, and needs no special case in the attention backends.
Status PressRunner::select_prompt(std::span<const int32_t> prompt, std::vector<int32_t>& selected) {
  const PromptCompression& pc = *press_->prompt_compression();
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t keep = std::max<int64_t>(1, pc.kept(P));
  if (keep >= P) {
    selected.assign(prompt.begin(), prompt.end());
    for (int64_t j = 0; j < P; ++j) prompt_kept_.push_back(static_cast<int32_t>(j));
    return ok_status();
  }
  const int64_t la = pc.lookahead;
  DraftRunner& d = *draft_;
  LC_TRY(d.generate(prompt, la, pc.window + la - 1).status());
  const HParams& dh = d.context().model().hparams();
  const PressShape ds{dh.n_layer, dh.n_head, dh.n_head_kv, dh.head_dim, dh.head_dim_v, 0.0f};
  const QueryWindow& w = d.recorded();
  const int64_t n_q = w.size();
  const int64_t n_win = n_q - (la - 1);  // the generated tokens fed to the draft come last
  std::vector<const float*> q(static_cast<size_t>(dh.n_layer));
  for (int64_t il = 0; il < dh.n_layer; ++il) q[static_cast<size_t>(il)] = w.queries(il, n_q);
  const std::vector<float> scores =
      specpc_scores(d.context().kv(), ds, q, w.positions(n_q), w.positions(n_q), n_q, n_win, P, pc);
  prompt_kept_ = specpc_select(scores, keep, pc);
  selected.clear();
  for (int32_t j : prompt_kept_) selected.push_back(prompt[static_cast<size_t>(j)]);
  d.clear();
  return ok_status();
}

namespace {
constexpr uint32_t kPressStateMagic = 0x5250434cu;  // "LCPR"
}

Status PressRunner::save(std::ostream& out) const {
  if (observer_)
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("cannot save a session with --kv-press {}: its attention statistics of the forward "
                                  "passes are not part of the cache", press_->spec()));
  bin::put(out, kPressStateMagic);
  bin::put_vec(out, prompt_kept_);
  bin::put<int64_t>(out, n_generated_);
  bin::put<uint8_t>(out, context_done_ ? 1 : 0);
  window_.save(out);
  return ok_status();
}

Status PressRunner::load(std::istream& in, int64_t max_tokens) {
  uint32_t magic = 0;
  std::vector<int32_t> kept;
  int64_t n_generated = 0;
  uint8_t done = 0;
  if (!bin::get(in, magic) || magic != kPressStateMagic)
    return make_error(ErrorCode::kBadFile, "saved context: no press state (the session was saved without --kv-press)");
  if (!bin::get_array(in, kept, static_cast<uint64_t>(max_tokens)) || !bin::get(in, n_generated) ||
      !bin::get(in, done))
    return make_error(ErrorCode::kBadFile, "saved context: truncated press state");
  if (!window_.load(in)) {
    window_.clear();
    return make_error(ErrorCode::kBadFile, "saved context: bad observation window (or one of another --kv-press)");
  }
  prompt_kept_ = std::move(kept);
  n_generated_ = n_generated;
  context_done_ = done != 0;
  return ok_status();
}

}  // namespace lc
