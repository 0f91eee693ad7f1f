// Decoding press — kvpress's DecodingPress (NVIDIA/kvpress, kvpress/presses/decoding_press.py,
// last changed b59fdb9; read at 8bb29b9; no paper of its own: kvpress's citation is Jegou, Jeblick,
// Devoto, "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries
// Distribution", arXiv 2510.00636, 2025): compression DURING generation, for long answers
// (reasoning traces) rather than long prompts. The prompt is left whole; every interval generated
// tokens (kvpress's compression_interval, 512) each KV head holding more than target tokens
// (target_size, 2048) keeps its target best by an inner scorer (inner=, any scorer press; default
// knorm, kvpress's decoding_knorm):
//   kept = topk(target) of the inner scores over every token the head holds (the prompt's and
//          the answer's), the tokens generated since the last compression included.
// kvpress finds a compression_ratio with int(k_len (1 - ratio)) = target_size by bisection; the
// count here is target exactly. Scores are reduced over the GQA group as the frame does; the
// frame's protected tokens (the inner's n_sink and window) score above the rest, as kvpress's
// scorers give theirs max + 1; ties go to the lower token index.
//
// The query buffer. kvpress keeps the hidden states of the decode steps since the last
// compression, trimmed to the last hidden_states_buffer_size (256) after each step, and scores
// with the buffer plus the current step's state: at most buffer + 1 of them, and no more than
// interval (the buffer is emptied at each compression); buffer=0: the current token's only. A
// query-based inner scorer (snapkv, tova, expected_attention, h2o's window source) gets the last
// min(its own obs, buffer + 1, interval) queries of the generated tokens here, and the runtime
// keeps exactly that many per layer (n_obs(): the buffer's memory is real). A scorer that needs no
// queries (knorm, keydiff, lagkv, streaming_llm, random) keeps none, as kvpress's buffer is then
// unused.
//
// Why a press of its own and not snapkv:interval=N,target=T (the frame's decoding schedule, which
// this press uses too: PressSchedule::decode_interval / decode_target, so the runtime calls
// compress(kDecode) after every interval-th generated token): the frame needs both keys given and
// has no notion of the buffer (a scorer sees its own obs queries, which may reach back before
// the last compression); this press has kvpress's defaults, caps the queries by the buffer, and
// never compresses the prompt.
//
// Differences: kvpress also compresses at a step whose input is target_size tokens or more (a
// batch of that many tokens while decoding): here one token enters per step, so only the
// interval counts; steps count from the prompt (a new prompt restarts them, as the runtime
// resets its count), kvpress's counter runs on across generate calls.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kv/press_impl.h"

namespace lc::press {

namespace {

constexpr const char* kInnerHelp =
    "the scorer that picks the target tokens kept at each compression (any scorer press; its keys are accepted "
    "here); kvpress's decoding_knorm uses knorm";

class DecodingPress final : public KvPress {
 public:
  DecodingPress(int64_t interval, int64_t target, int64_t buffer, std::unique_ptr<PressScorer> inner, int64_t n_sink,
                int64_t window, bool reduce_max, const PressShape& s)
      : buffer_(buffer), inner_(std::move(inner)), n_sink_(n_sink), window_(window), reduce_max_(reduce_max),
        shape_(s) {
    sched_.after_prefill = false;
    sched_.decode_interval = interval;
    sched_.decode_target = target;
  }
  std::string spec() const override {
    std::string s = fmt::format("decoding:inner={},interval={},target={},buffer={},n_sink={},window={},reduce={}",
                                inner_->name(), sched_.decode_interval, sched_.decode_target, buffer_, n_sink_,
                                window_, reduce_max_ ? "max" : "mean");
    const std::string p = inner_->params();
    return p.empty() ? s : s + "," + p;
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override {
    const int64_t w = inner_->n_obs();
    return w > 0 ? std::min({w, buffer_ + 1, sched_.decode_interval}) : 0;
  }
  AttentionObserver* observer() override { return inner_->observer(); }
  Status check_backend(const AttentionCaps& attn) const override {
    if (inner_->observer() && !attn.exact)
      return make_error(fmt::format("kv press decoding: inner={} accumulates the attention of the forward pass as "
                                    "dense softmax, but --attn {} attends a subset of the tokens or re-assigns their "
                                    "positions",
                                    inner_->name(), attn.spec));
    return ok_status();
  }
  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override;

 private:
  int64_t buffer_;
  std::unique_ptr<PressScorer> inner_;
  int64_t n_sink_, window_;
  bool reduce_max_;
  PressShape shape_;
  PressSchedule sched_;
};

Status DecodingPress::select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) {
  keep.clear();
  if (c.phase != PressPhase::kDecode) return ok_status();
  const KvCache& kv = *c.kv;
  if (il < 0 || il >= kv.n_layer()) return make_error(fmt::format("kv press decoding: layer {} out of range", il));
  if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
    return make_error(fmt::format("kv press decoding: the cache has {} KV heads of dim {}, the press was made for {} "
                                  "of dim {}",
                                  kv.n_head_kv(), kv.head_dim(), shape_.n_head_kv, shape_.head_dim));
  const int64_t Hkv = kv.n_head_kv(), target = sched_.decode_target;
  bool any = false;
  for (int64_t h = 0; h < Hkv; ++h) any |= kv.n_tokens(il, h) > target;
  if (!any) return ok_status();

  // The buffer: the last n_obs() queries (a chain may hand more).
  PressContext ci = c;
  const int64_t m = std::min(c.n_obs, n_obs());
  if (m > 0 && (!c.queries || !c.query_pos))
    return make_error(fmt::format("kv press decoding: n_obs={} but no queries given", c.n_obs));
  const int64_t skip = c.n_obs - m;
  ci.n_obs = m;
  ci.n_lookahead = 0;
  ci.lookahead_keys = nullptr;
  if (m == 0) {
    ci.queries = nullptr;
    ci.query_pos = nullptr;
    ci.query_seq = nullptr;
  } else if (skip > 0) {
    ci.queries = c.queries + skip * shape_.n_head * shape_.head_dim;
    ci.query_pos = c.query_pos + skip;
    ci.query_seq = c.query_seq ? c.query_seq + skip : nullptr;
  }

  std::vector<std::vector<float>> sc;
  LC_TRY(inner_kv_scores(*inner_, ci, il, shape_, reduce_max_, sc));
  std::vector<std::vector<uint8_t>> prot(static_cast<size_t>(Hkv));
  for (int64_t h = 0; h < Hkv; ++h)
    prot[static_cast<size_t>(h)] = protected_mask(kv.seq_index(il, h), kv.n_tokens(il, h), n_sink_, window_);
  raise_protected(sc, prot);
  keep.assign(static_cast<size_t>(Hkv), {});
  for (int64_t h = 0; h < Hkv; ++h) {
    std::vector<int32_t> all(static_cast<size_t>(kv.n_tokens(il, h)));
    std::iota(all.begin(), all.end(), 0);
    keep[static_cast<size_t>(h)] = top_k(sc[static_cast<size_t>(h)].data(), std::move(all), target);
  }
  return ok_status();
}

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_decoding(Args& a, const PressShape& s) {
  int64_t n_sink = 0, window = 0;
  bool reduce_max = false;
  LC_ASSIGN_OR_RETURN(std::unique_ptr<PressScorer> inner,
                      parse_inner_scorer(a, s, "knorm", kInnerHelp, false, n_sink, window, reduce_max));
  LC_ASSIGN_OR_RETURN(int64_t interval, a.integer("interval", 512, 1, INT32_MAX,
                                                  "compress every N generated tokens (kvpress's "
                                                  "compression_interval), tokens"));
  LC_ASSIGN_OR_RETURN(int64_t target, a.integer("target", 2048, 1, INT32_MAX,
                                                "tokens per KV head kept at each compression (kvpress's target_size), "
                                                "at least n_sink + window, tokens"));
  LC_ASSIGN_OR_RETURN(int64_t buffer, a.integer("buffer", 256, 0, INT32_MAX,
                                                "generated tokens' queries kept for a query-based inner scorer besides "
                                                "the current one (kvpress's hidden_states_buffer_size; 0: the current "
                                                "token's only), tokens"));
  if (target < n_sink + window)
    return make_error(fmt::format("kv press decoding: target={} is below n_sink + window = {}", target,
                                  n_sink + window));
  return std::unique_ptr<KvPress>(
      std::make_unique<DecodingPress>(interval, target, buffer, std::move(inner), n_sink, window, reduce_max, s));
}

}  // namespace lc::press
