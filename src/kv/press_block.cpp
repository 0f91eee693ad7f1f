// Block press — kvpress's BlockPress (NVIDIA/kvpress, kvpress/presses/block_press.py, last
// changed 4485538; read at 8bb29b9), which simulates the block-wise prompt processing of
// Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
// Resource-Constrained Environments", arXiv 2504.15364, 2025: the cache never holds more than
// n_kept + block_size tokens while the prompt streams in. After the prompt, per KV head holding
// n tokens, n_kept = floor((1 - ratio) n) (budget=B: min(B, n)):
//   kept = the first n_kept tokens
//   for i = n_kept, n_kept + b, ... < n:     (b = min(block_size, n))
//     cur  = kept + tokens [i, min(i + b, n))
//     kept = the n_kept best of cur by the inner scorer, scoring cur ALONE
// so a token is compared only with the survivors before it and its own block. The inner scorer
// (inner=, any scorer press that needs no queries; default keydiff, kvpress's block_keydiff)
// sees exactly the tokens of cur, as if the cache held nothing else: a scratch cache is filled
// with them (keys as stored, post-RoPE; values; their positions) and the scorer runs on it.
// Its scores are reduced over the GQA group as the frame does; the frame's protected tokens
// (n_sink of the sequence, the last `window` of cur: the inner's defaults) score above the rest,
// as kvpress's scorers give theirs max + 1. Ties go to the lower token index.
//
// Differences from kvpress (docs/kv-press.md):
//   - cur is handed to the scorer in sequence order; kvpress concatenates kept in topk order
//     (best first) before the block. The same for scorers that ignore order (keydiff, knorm: a
//     mean and norms); order-dependent ones (lagkv's partitions, streaming_llm) see the sequence
//     as a real chunked prefill would have it;
//   - scorers that need queries (snapkv, tova, expected_attention, h2o, speckv) are refused:
//     kvpress recomputes each block's window queries from the gathered hidden states, but the
//     runtime keeps the queries of the prompt's last tokens only (use NAME:chunk=1, which
//     compresses after every real prefill chunk);
//   - the scratch cache's sequence indices count the tokens of cur (0, 1, ...) and its RoPE table
//     is the identity (the keys arrive rotated): a scorer reading either sees cur's order only;
//   - heads of different lengths (an earlier per-head eviction) run apart, each with its own n;
//     then the scorer is run per head (random's draws depend on the head index it sees: 0);
//   - at least one token is kept per head (kvpress asserts ratio < 1).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kv/press_impl.h"

namespace lc::press {

namespace {

constexpr const char* kInnerHelp =
    "the scorer that ranks the survivors and each new block (a scorer press that needs no queries; its keys are "
    "accepted here); kvpress's block_keydiff uses keydiff";

class BlockPress final : public KvPress {
 public:
  BlockPress(BudgetKeys b, int64_t block, std::unique_ptr<PressScorer> inner, int64_t n_sink, int64_t window,
             bool reduce_max, const PressShape& s)
      : b_(b), block_(block), inner_(std::move(inner)), n_sink_(n_sink), window_(window), reduce_max_(reduce_max),
        shape_(s) {
    sched_.after_prefill = true;
    sched_.query_aware = b.query_aware;
  }
  std::string spec() const override {
    std::string s = fmt::format("block:{},inner={},block_size={},n_sink={},window={},reduce={}", b_.spec(),
                                inner_->name(), block_, n_sink_, window_, reduce_max_ ? "max" : "mean");
    const std::string p = inner_->params();
    return p.empty() ? s : s + "," + p;
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override { return 0; }
  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override;

 private:
  // The block loop for the KV heads `heads` (all holding n tokens), into keep[h].
  Status run(const PressContext& c, int64_t il, const std::vector<int64_t>& heads, int64_t n,
             std::vector<std::vector<int32_t>>& keep);

  BudgetKeys b_;
  int64_t block_;
  std::unique_ptr<PressScorer> inner_;
  int64_t n_sink_, window_;
  bool reduce_max_;
  PressShape shape_;
  PressSchedule sched_;
};

Status BlockPress::select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) {
  keep.clear();
  if (!sched_.covers(c.phase) || b_.ratio == 0) return ok_status();
  const KvCache& kv = *c.kv;
  if (il < 0 || il >= kv.n_layer()) return make_error(fmt::format("kv press block: layer {} out of range", il));
  if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
    return make_error(fmt::format("kv press block: the cache has {} KV heads of dim {}, the press was made for {} of "
                                  "dim {}",
                                  kv.n_head_kv(), kv.head_dim(), shape_.n_head_kv, shape_.head_dim));
  const int64_t Hkv = kv.n_head_kv();
  bool equal = true, any = false;
  for (int64_t h = 0; h < Hkv; ++h) {
    const int64_t n = kv.n_tokens(il, h);
    equal &= n == kv.n_tokens(il, 0);
    any |= std::max<int64_t>(1, b_.kept(n)) < n;
  }
  if (!any) return ok_status();
  keep.assign(static_cast<size_t>(Hkv), {});
  for (int64_t h = 0; h < Hkv; ++h) {  // heads left alone keep everything
    keep[static_cast<size_t>(h)].resize(static_cast<size_t>(kv.n_tokens(il, h)));
    std::iota(keep[static_cast<size_t>(h)].begin(), keep[static_cast<size_t>(h)].end(), 0);
  }
  if (equal) {
    std::vector<int64_t> all(static_cast<size_t>(Hkv));
    std::iota(all.begin(), all.end(), 0);
    return run(c, il, all, kv.n_tokens(il, 0), keep);
  }
  for (int64_t h = 0; h < Hkv; ++h) LC_TRY(run(c, il, {h}, kv.n_tokens(il, h), keep));
  return ok_status();
}

Status BlockPress::run(const PressContext& c, int64_t il, const std::vector<int64_t>& heads, int64_t n,
                       std::vector<std::vector<int32_t>>& keep) {
  const KvCache& kv = *c.kv;
  const int64_t n_kept = std::max<int64_t>(1, b_.kept(n));
  if (n_kept >= n) return ok_status();
  const int64_t G = static_cast<int64_t>(heads.size()), d = kv.head_dim(), dv = kv.head_dim_v();
  const int64_t bs = std::min(block_, n);

  // The scratch cache: layer il of G heads, f32, keys stored as given (identity RoPE).
  KvCacheConfig cfg;
  cfg.n_layer = il + 1;
  cfg.n_head_kv = G;
  cfg.head_dim = d;
  cfg.head_dim_v = dv;
  cfg.block_tokens = std::max<int64_t>(16, kv.block_tokens());
  LC_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> scratch, KvCache::create(cfg));
  PressShape gs = shape_;
  gs.n_head_kv = G;
  gs.n_head = G * (shape_.n_head / shape_.n_head_kv);
  PressContext sc_ctx;
  sc_ctx.kv = scratch.get();
  sc_ctx.pool = c.pool;
  sc_ctx.phase = c.phase;

  // Each head's rows, read once; orig[g][j]: the head's token index of scratch token j.
  std::vector<std::vector<float>> K(static_cast<size_t>(G)), V(static_cast<size_t>(G));
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t h = heads[static_cast<size_t>(gi)];
    read_head_keys(kv, il, h, K[static_cast<size_t>(gi)]);
    V[static_cast<size_t>(gi)].resize(static_cast<size_t>(n * dv));
    kv.read_values(il, h, 0, n, V[static_cast<size_t>(gi)].data());
  }
  const int32_t* pos = kv.positions(il, heads[0]);  // only recorded; equal lengths need not share positions
  std::vector<std::vector<int32_t>> orig(static_cast<size_t>(G));
  std::vector<float> kb, vb;
  std::vector<int32_t> pb;
  auto append = [&](int64_t first, int64_t count) -> Status {
    kb.resize(static_cast<size_t>(count * G * d));
    vb.resize(static_cast<size_t>(count * G * dv));
    pb.assign(pos + first, pos + first + count);
    for (int64_t t = 0; t < count; ++t)
      for (int64_t gi = 0; gi < G; ++gi) {
        std::copy_n(K[static_cast<size_t>(gi)].data() + (first + t) * d, d, kb.data() + (t * G + gi) * d);
        std::copy_n(V[static_cast<size_t>(gi)].data() + (first + t) * dv, dv, vb.data() + (t * G + gi) * dv);
      }
    for (int64_t gi = 0; gi < G; ++gi)
      for (int64_t t = 0; t < count; ++t) orig[static_cast<size_t>(gi)].push_back(static_cast<int32_t>(first + t));
    return scratch->append(il, count, kb.data(), vb.data(), pb.data());
  };

  LC_TRY(append(0, n_kept));
  std::vector<std::vector<float>> sc;
  std::vector<std::vector<uint8_t>> prot(static_cast<size_t>(G));
  for (int64_t i = n_kept; i < n; i += bs) {
    const int64_t e = std::min(i + bs, n);
    LC_TRY(append(i, e - i));
    const int64_t m = n_kept + (e - i);
    LC_TRY(inner_kv_scores(*inner_, sc_ctx, il, gs, reduce_max_, sc));
    for (int64_t gi = 0; gi < G; ++gi) {
      const int32_t* seq = kv.seq_index(il, heads[static_cast<size_t>(gi)]);
      std::vector<int32_t> s(static_cast<size_t>(m));
      for (int64_t j = 0; j < m; ++j) s[static_cast<size_t>(j)] = seq[orig[static_cast<size_t>(gi)][static_cast<size_t>(j)]];
      prot[static_cast<size_t>(gi)] = protected_mask(s.data(), m, n_sink_, window_);
    }
    raise_protected(sc, prot);
    for (int64_t gi = 0; gi < G; ++gi) {
      std::vector<int32_t> all(static_cast<size_t>(m));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<int32_t> best = top_k(sc[static_cast<size_t>(gi)].data(), std::move(all), n_kept);
      auto& o = orig[static_cast<size_t>(gi)];
      std::vector<int32_t> no;
      for (int32_t j : best) no.push_back(o[static_cast<size_t>(j)]);
      o = std::move(no);
      LC_TRY(scratch->retain(il, gi, best));
    }
  }
  for (int64_t gi = 0; gi < G; ++gi) keep[static_cast<size_t>(heads[static_cast<size_t>(gi)])] = orig[static_cast<size_t>(gi)];
  return ok_status();
}

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_block(Args& a, const PressShape& s) {
  LC_ASSIGN_OR_RETURN(BudgetKeys b, parse_budget_keys(a, 0.5));
  int64_t n_sink = 0, window = 0;
  bool reduce_max = false;
  LC_ASSIGN_OR_RETURN(std::unique_ptr<PressScorer> inner,
                      parse_inner_scorer(a, s, "keydiff", kInnerHelp, false, n_sink, window, reduce_max));
  if (inner->n_obs() > 0 || inner->observer())
    return make_error(fmt::format("kv press block: inner={} scores with queries, but the runtime keeps only the "
                                  "prompt's last queries, not each block's (use {}:chunk=1 to compress after every "
                                  "prefill chunk)",
                                  inner->name(), inner->name()));
  LC_ASSIGN_OR_RETURN(int64_t block, a.integer("block_size", 128, 1, 1 << 24,
                                               "tokens per simulated prefill block: each block competes with the "
                                               "survivors of the blocks before it, tokens"));
  return std::unique_ptr<KvPress>(std::make_unique<BlockPress>(b, block, std::move(inner), n_sink, window, reduce_max, s));
}

}  // namespace lc::press
