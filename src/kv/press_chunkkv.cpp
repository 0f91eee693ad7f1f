// ChunkKV — Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient
// Long-Context LLM Inference", arXiv 2502.00299, 2025; as kvpress's ChunkKVPress (NVIDIA/kvpress,
// kvpress/presses/chunkkv_press.py, last changed 8306602; read at 8bb29b9). Tokens are kept in
// whole chunks of chunk_length consecutive tokens, so that what survives is readable text, not
// scattered words. Over an inner scorer (inner=, any scorer press; kvpress's registry: SnapKV):
//   S_j     = sum over the layer's KV heads of the inner score of token j   (one row per layer)
//   chunk c = tokens [c L, (c + 1) L) of the n held, L = chunk_length; the last, partial chunk
//             (n mod L tokens, if any) is a chunk of its own
//   score_c = mean of S_j over the chunk's tokens (the partial chunk: over its own n mod L)
//   the best max(1, floor((1 - ratio) n_chunks)) chunks stay, the SAME chunks in every KV head
//   (ties to the lower chunk); budget=B keeps max(1, floor(B n_chunks / n)) chunks.
// Fewer than L tokens (no complete chunk): as the reference, the inner press alone decides per
// head (top floor((1 - ratio) n) by its scores).
//
// The inner scores are reduced over the GQA group as the frame does (reduce=, the scorer's
// default). The frame's protected tokens (n_sink, window: the inner scorer's defaults) and the
// tokens a scorer marks FLT_MAX (snapkv's window) score M + 1, M the layer's largest other score:
// what kvpress's scorers give them themselves (SnapKV, TOVA, ExpectedAttention pad with
// scores.max() + 1); a protected token already holding the top score keeps it (LagKV's sinks
// score 1, as its tail). In ChunkKV they only weigh in their chunk's score, as in kvpress.
//
// Heads holding different tokens (an earlier per-head eviction; kvpress's heads never do): the
// chunks are cut over the union of the layer's held tokens in sequence order, a head adding 0
// for a token it does not hold; each head keeps the tokens it holds in the chosen chunks.
//
// The helpers after the press are shared with the block and decoding presses (declared again in
// press_block.cpp and press_decoding.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kv/press_impl.h"

namespace lc::press {

// ---- shared by the wrapper presses (chunkkv, block, decoding) ----

// inner= and the inner scorer's own keys, then the frame's n_sink, window and reduce with the
// scorer's defaults. Refuses a scorer that looks ahead with a draft (speckv) unless allowed.
Expected<std::unique_ptr<PressScorer>> parse_inner_scorer(Args& a, const PressShape& s, const char* def,
                                                          const char* help, bool allow_lookahead, int64_t& n_sink,
                                                          int64_t& window, bool& reduce_max) {
  LC_ASSIGN_OR_RETURN(std::string inner, a.text("inner", def, help));
  const ScorerFactory* f = find_scorer(inner);
  if (!f) {
    std::string names;
#define LC_PRESS_SCORER(name, help, paper) \
  if (!names.empty()) names += ", ";       \
  names += #name;
#include "kv/press_list.h"
    return make_error(fmt::format("kv press {}: inner={}: expected a scorer ({})", a.name(), inner, names));
  }
  LC_ASSIGN_OR_RETURN(std::unique_ptr<PressScorer> scorer, (*f)(a, s));
  if (!allow_lookahead && scorer->lookahead() != 0)
    return make_error(fmt::format("kv press {}: inner={} needs a draft's lookahead, which this press does not run",
                                  a.name(), inner));
  LC_ASSIGN_OR_RETURN(n_sink, a.integer("n_sink", scorer->default_sinks(), 0, INT32_MAX,
                                        "first tokens of the sequence, protected (the inner scorer's default), "
                                        "tokens"));
  LC_ASSIGN_OR_RETURN(window, a.integer("window", scorer->default_window(), 0, INT32_MAX,
                                        "most recent tokens, protected (the inner scorer's default), tokens"));
  LC_ASSIGN_OR_RETURN(std::string red, a.choice("reduce", scorer->default_reduce_max() ? "max" : "mean",
                                                {"mean", "max"},
                                                "how the inner per-query-head scores of a GQA group become one per "
                                                "KV head"));
  reduce_max = red == "max";
  return scorer;
}

// The inner scores of layer il, one row per KV head (the frame's group reduction; NaN -> -inf).
Status inner_kv_scores(PressScorer& inner, const PressContext& c, int64_t il, const PressShape& s, bool reduce_max,
                       std::vector<std::vector<float>>& out) {
  PressScores sc;
  LC_TRY(inner.score(c, il, s, sc));
  const int64_t Hkv = s.n_head_kv, g = s.n_head / s.n_head_kv;
  if (sc.by_kv_head.empty()) {
    if (static_cast<int64_t>(sc.by_query_head.size()) != s.n_head)
      return make_error(fmt::format("kv press: inner={} returned no scores", inner.name()));
    sc.by_kv_head.resize(static_cast<size_t>(Hkv));
    for (int64_t h = 0; h < Hkv; ++h) {
      auto& r = sc.by_kv_head[static_cast<size_t>(h)];
      r = sc.by_query_head[static_cast<size_t>(h * g)];
      for (int64_t q = 1; q < g; ++q) {
        const auto& x = sc.by_query_head[static_cast<size_t>(h * g + q)];
        for (size_t j = 0; j < r.size(); ++j) r[j] = reduce_max ? std::max(r[j], x[j]) : r[j] + x[j];
      }
      if (!reduce_max && g > 1)
        for (float& v : r) v /= static_cast<float>(g);
    }
  }
  if (static_cast<int64_t>(sc.by_kv_head.size()) != Hkv)
    return make_error(fmt::format("kv press: inner={} returned {} rows for {} KV heads", inner.name(),
                                  sc.by_kv_head.size(), Hkv));
  for (int64_t h = 0; h < Hkv; ++h) {
    auto& r = sc.by_kv_head[static_cast<size_t>(h)];
    if (static_cast<int64_t>(r.size()) != c.kv->n_tokens(il, h))
      return make_error(fmt::format("kv press: inner={} scored {} tokens of a head holding {}", inner.name(), r.size(),
                                    c.kv->n_tokens(il, h)));
    for (float& v : r)
      if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  }
  out = std::move(sc.by_kv_head);
  return ok_status();
}

// 1 for the frame's protected tokens of a head holding n tokens with sequence indices seq: the
// first n_sink of the sequence and the last `window` held.
std::vector<uint8_t> protected_mask(const int32_t* seq, int64_t n, int64_t n_sink, int64_t window) {
  std::vector<uint8_t> p(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < n && seq[j] < n_sink; ++j) p[static_cast<size_t>(j)] = 1;
  for (int64_t j = std::max<int64_t>(0, n - window); j < n; ++j) p[static_cast<size_t>(j)] = 1;
  return p;
}

// kvpress's convention for the tokens a scorer keeps: score M + 1, M the largest score of the
// other tokens over every row. Applies to protected tokens below M and to FLT_MAX marks.
void raise_protected(std::vector<std::vector<float>>& sc, const std::vector<std::vector<uint8_t>>& prot) {
  float M = -std::numeric_limits<float>::infinity();
  for (size_t h = 0; h < sc.size(); ++h)
    for (size_t j = 0; j < sc[h].size(); ++j)
      if (!prot[h][j] && sc[h][j] < FLT_MAX) M = std::max(M, sc[h][j]);
  if (!std::isfinite(M)) M = 0;
  const float top = std::max(M + 1.0f, std::nextafter(M, std::numeric_limits<float>::infinity()));
  for (size_t h = 0; h < sc.size(); ++h)
    for (size_t j = 0; j < sc[h].size(); ++j) {
      float& v = sc[h][j];
      if (v >= FLT_MAX || (prot[h][j] && v < M)) v = top;
    }
}

namespace {

constexpr const char* kInnerHelp =
    "the scorer whose scores, summed over the layer's KV heads, rank the chunks (any scorer press; its keys are "
    "accepted here); kvpress's chunkkv uses snapkv";

class ChunkKv final : public KvPress {
 public:
  ChunkKv(BudgetKeys b, int64_t chunk, std::unique_ptr<PressScorer> inner, int64_t n_sink, int64_t window,
          bool reduce_max, const PressShape& s)
      : b_(b), chunk_(chunk), inner_(std::move(inner)), n_sink_(n_sink), window_(window), reduce_max_(reduce_max),
        shape_(s) {
    sched_.after_prefill = true;
    sched_.query_aware = b.query_aware;
  }
  std::string spec() const override {
    std::string s = fmt::format("chunkkv:{},inner={},chunk_length={},n_sink={},window={},reduce={}", b_.spec(),
                                inner_->name(), chunk_, n_sink_, window_, reduce_max_ ? "max" : "mean");
    const std::string p = inner_->params();
    return p.empty() ? s : s + "," + p;
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override { return inner_->n_obs(); }
  AttentionObserver* observer() override { return inner_->observer(); }
  int64_t lookahead() const override { return inner_->lookahead(); }
  Status check_backend(const AttentionCaps& attn) const override {
    if (inner_->observer() && !attn.exact)
      return make_error(fmt::format("kv press chunkkv: inner={} accumulates the attention of the forward pass as "
                                    "dense softmax, but --attn {} attends a subset of the tokens or re-assigns their "
                                    "positions",
                                    inner_->name(), attn.spec));
    return ok_status();
  }
  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override;

 private:
  BudgetKeys b_;
  int64_t chunk_;
  std::unique_ptr<PressScorer> inner_;
  int64_t n_sink_, window_;
  bool reduce_max_;
  PressShape shape_;
  PressSchedule sched_;
};

Status ChunkKv::select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) {
  keep.clear();
  if (!sched_.covers(c.phase) || b_.ratio == 0) return ok_status();
  const KvCache& kv = *c.kv;
  if (il < 0 || il >= kv.n_layer()) return make_error(fmt::format("kv press chunkkv: layer {} out of range", il));
  if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
    return make_error(fmt::format("kv press chunkkv: the cache has {} KV heads of dim {}, the press was made for {} "
                                  "of dim {}",
                                  kv.n_head_kv(), kv.head_dim(), shape_.n_head_kv, shape_.head_dim));
  if (inner_->n_obs() > 0 && c.n_obs > 0 && (!c.queries || !c.query_pos))
    return make_error(fmt::format("kv press chunkkv: n_obs={} but no queries given", c.n_obs));
  const int64_t Hkv = kv.n_head_kv();

  // The layer's tokens: the union of what its heads hold, in sequence order.
  std::vector<int32_t> U;
  for (int64_t h = 0; h < Hkv; ++h) {
    const int32_t* idx = kv.seq_index(il, h);
    std::vector<int32_t> m;
    std::set_union(U.begin(), U.end(), idx, idx + kv.n_tokens(il, h), std::back_inserter(m));
    U = std::move(m);
  }
  const int64_t n = static_cast<int64_t>(U.size()), L = chunk_;
  const int64_t n_full = n / L, rem = n % L, n_chunks = n_full + (rem > 0 ? 1 : 0);
  if (n == 0) return ok_status();
  int64_t k_chunks = 0;
  if (n_full > 0) {
    k_chunks = b_.budget >= 0 ? std::min(n_chunks, b_.budget * n_chunks / n)
                              : static_cast<int64_t>(std::floor((1.0 - b_.ratio) * static_cast<double>(n_chunks) + 1e-9));
    k_chunks = std::max<int64_t>(1, k_chunks);
    if (k_chunks >= n_chunks) return ok_status();
  } else {
    bool any = false;  // the inner press alone: anything to evict?
    for (int64_t h = 0; h < Hkv; ++h)
      any |= std::max<int64_t>(1, b_.kept(kv.n_tokens(il, h))) < kv.n_tokens(il, h);
    if (!any) return ok_status();
  }

  std::vector<std::vector<float>> sc;
  LC_TRY(inner_kv_scores(*inner_, c, il, shape_, reduce_max_, sc));
  std::vector<std::vector<uint8_t>> prot(static_cast<size_t>(Hkv));
  for (int64_t h = 0; h < Hkv; ++h)
    prot[static_cast<size_t>(h)] = protected_mask(kv.seq_index(il, h), kv.n_tokens(il, h), n_sink_, window_);
  raise_protected(sc, prot);
  keep.assign(static_cast<size_t>(Hkv), {});

  if (n_full == 0) {  // kvpress: self.press.compress(...)
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t nh = kv.n_tokens(il, h);
      std::vector<int32_t> all(static_cast<size_t>(nh));
      std::iota(all.begin(), all.end(), 0);
      keep[static_cast<size_t>(h)] = top_k(sc[static_cast<size_t>(h)].data(), std::move(all), std::max<int64_t>(1, b_.kept(nh)));
    }
    return ok_status();
  }

  // S_u: the sum over heads at each union position; each head's tokens' union positions.
  std::vector<double> S(static_cast<size_t>(n), 0.0);
  std::vector<std::vector<int32_t>> upos(static_cast<size_t>(Hkv));
  for (int64_t h = 0; h < Hkv; ++h) {
    const int32_t* idx = kv.seq_index(il, h);
    const int64_t nh = kv.n_tokens(il, h);
    auto& up = upos[static_cast<size_t>(h)];
    up.resize(static_cast<size_t>(nh));
    int64_t u = 0;
    for (int64_t j = 0; j < nh; ++j) {
      while (U[static_cast<size_t>(u)] != idx[j]) ++u;
      up[static_cast<size_t>(j)] = static_cast<int32_t>(u);
      S[static_cast<size_t>(u)] += sc[static_cast<size_t>(h)][static_cast<size_t>(j)];
    }
  }
  std::vector<double> cs(static_cast<size_t>(n_chunks), 0.0);
  for (int64_t u = 0; u < n; ++u) cs[static_cast<size_t>(u / L)] += S[static_cast<size_t>(u)];
  for (int64_t ci = 0; ci < n_chunks; ++ci)
    cs[static_cast<size_t>(ci)] /= static_cast<double>(ci < n_full ? L : rem);
  std::vector<int32_t> order(static_cast<size_t>(n_chunks));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return cs[static_cast<size_t>(x)] > cs[static_cast<size_t>(y)]; });
  std::vector<uint8_t> chosen(static_cast<size_t>(n_chunks), 0);
  for (int64_t i = 0; i < k_chunks; ++i) chosen[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  for (int64_t h = 0; h < Hkv; ++h) {
    const auto& up = upos[static_cast<size_t>(h)];
    auto& k = keep[static_cast<size_t>(h)];
    for (size_t j = 0; j < up.size(); ++j)
      if (chosen[static_cast<size_t>(up[j] / L)]) k.push_back(static_cast<int32_t>(j));
  }
  return ok_status();
}

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_chunkkv(Args& a, const PressShape& s) {
  LC_ASSIGN_OR_RETURN(BudgetKeys b, parse_budget_keys(a, 0.5));
  int64_t n_sink = 0, window = 0;
  bool reduce_max = false;
  LC_ASSIGN_OR_RETURN(std::unique_ptr<PressScorer> inner,
                      parse_inner_scorer(a, s, "snapkv", kInnerHelp, true, n_sink, window, reduce_max));
  LC_ASSIGN_OR_RETURN(int64_t chunk, a.integer("chunk_length", 20, 1, 1 << 20,
                                               "tokens per chunk: whole chunks are kept or evicted, the same in "
                                               "every KV head of a layer; the last may be shorter, tokens"));
  return std::unique_ptr<KvPress>(
      std::make_unique<ChunkKv>(b, chunk, std::move(inner), n_sink, window, reduce_max, s));
}

}  // namespace lc::press
