// Fixed-distance attention: exact attention over every cached key, where a key more than
// `distance` positions before its query is scored as if exactly `distance` away,
//     score = rope(q, W) . rope(k, 0)  for p_q - p_k > W,   rope(q, p_q) . rope(k, p_k) otherwise.
// This is the distance ceiling of LM-Infinite (Han et al. 2023, "LM-Infinite: Zero-Shot Extreme
// Length Generalization for Large Language Models") and of InfLLM's memory (Xiao et al. 2024),
// without their sinks and block retrieval: the model never sees a relative distance above W,
// however long the input. A model trained with the same ceiling (`longctx train
// --fixed-distance W`, which writes `longctx.attention.fixed_distance` into its GGUF) reads any
// length at trained distances, and this is its default attention.
//
// Keys are stored rotated at their positions; far keys are rotated back to position 0 as they
// are read (Span::unrotate), the queries rotated at W once per call (variant 1).
//
// With budget=B > 0 the far keys are read sparsely, as Quest (Tang et al. 2024) reads a cache:
// pages of `page` far keys keep the per-channel min/max of their keys rotated back to 0, and
// a tile attends only the B/page pages with the largest bound sum_i max(q_i m_i, q_i M_i) for
// its queries at the fixed distance (the box of a tile's queries, per head, the largest over
// the GQA group), plus the near keys and the far keys of the last, incomplete page, exactly.
// The last `tail` tokens of each call (the decoded token; the question at the end of a prompt)
// choose alone; earlier tokens choose per tile of up to 64 query rows.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "attention/methods.h"
#include "attention/page_bounds.h"

namespace lc {
namespace {

class FixedBackend final : public ExecBackend {
 public:
  FixedBackend(const AttnShape& s, int64_t distance, int64_t budget, int64_t page, int64_t tail, int64_t split)
      : ExecBackend(s), distance_(distance), budget_(budget), page_(page), tail_(tail),
        heads_(static_cast<size_t>(s.n_layer * s.n_head_kv)) {
    split_ = split;
  }

  std::string spec() const override {
    std::string s = fmt::format("fixed:distance={}", distance_);
    if (budget_ > 0) s += fmt::format(",budget={},page={},tail={}", budget_, page_, tail_);
    if (split_ != kDefaultSplit) s += fmt::format(",split={}", split_);
    return s;
  }

  bool supports_detached() const override { return true; }

  AttentionCaps caps() const override {
    AttentionCaps c{spec()};
    c.fixed_distance = distance_;
    c.reads_all_keys = budget_ == 0;
    c.unrotates_keys = true;
    return c;
  }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    wpos_.assign(static_cast<size_t>(n), static_cast<int32_t>(distance_));
    add_variant(1, q, wpos_.data(), kv, ctx);
    const int64_t Hkv = shape_.n_head_kv;
    std::vector<attn::Item> items = attn::make_items(ctx);
    if (budget_ > 0) {
      items = split_tail(items, n - tail_);
      pool.parallel_for(Hkv, [&](int64_t b, int64_t e, int) {
        for (int64_t hk = b; hk < e; ++hk) update_bounds(kv, il, hk);
      });
    }
    spans_.resize(items.size());
    // near_[hk * n + t]: the first key of KV head hk that query t sees at its real distance.
    // Keys are in position order, so it is a binary search; beyond it every key is near.
    near_.resize(static_cast<size_t>(Hkv * n));
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      const int64_t N = kv.n_tokens(il, hk);
      const int32_t* kp = kv.positions(il, hk);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t vis = ctx.visible(N, t);
        const int64_t lo_pos = static_cast<int64_t>(pos[t]) - distance_;
        near_[static_cast<size_t>(hk * n + t)] =
            std::lower_bound(kp, kp + vis, lo_pos, [](int32_t a, int64_t b) { return a < b; }) - kp;
      }
    }
    pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i)
        item_spans(ctx, kv, il, n, items[static_cast<size_t>(i)], spans_[static_cast<size_t>(i)]);
    });
    run_spans(ctx, items, spans_, pool);
    return ok_status();
  }

 private:
  struct HeadState {
    uint64_t epoch = ~uint64_t{0};
    int64_t n_full = 0;         // complete pages with bounds
    attn::PageBounds pb;        // [n_full] pages: min | max of the keys at position 0 (8-bit codes)
  };

  // What the rows of one item attend. Rows are (token, head) with tokens in order and near
  // nondecreasing in the token, so the keys below the first row's bound are far for every row
  // and those from the last row's on are near for every row; in between, each row is far up to
  // its own bound.
  void item_spans(const attn::ExecCtx& ctx, const KvCache& kv, int64_t il, int64_t n, const attn::Item& it,
                  std::vector<attn::Span>& sp) const {
    const int64_t B = kv.block_tokens();
    const int64_t* near = near_.data() + it.hk * n;
    sp.clear();
    const int64_t a = near[it.t0], b = near[it.t0 + it.nt - 1];
    add_far(ctx, kv, il, it, a, sp);
    for (int64_t t = it.t0; t < it.t0 + it.nt - 1; ++t) {
      const int64_t lo = near[t], hi = near[t + 1];
      if (hi <= lo) continue;
      // Keys [lo, hi): near for tokens <= t, far for tokens > t.
      uint64_t near_rows = 0;
      for (int64_t r = 0; r < it.rows(); ++r)
        if (it.t0 + r / it.g <= t) near_rows |= uint64_t{1} << r;
      const size_t first = sp.size();
      attn::add_spans(sp, lo, hi - lo, B, 0, false);
      attn::add_spans(sp, lo, hi - lo, B, 1, true);
      const size_t mid = first + (sp.size() - first) / 2;
      for (size_t j = first; j < sp.size(); ++j) sp[j].rows = j < mid ? near_rows : ~near_rows;
    }
    const int64_t vis_max = ctx.visible(kv.n_tokens(il, it.hk), it.t0 + it.nt - 1);
    attn::add_spans(sp, b, vis_max - b, B, 0, false);
  }

  // Items of tokens >= first cut into one-token items (they choose their pages alone).
  static std::vector<attn::Item> split_tail(const std::vector<attn::Item>& in, int64_t first) {
    std::vector<attn::Item> out;
    for (const attn::Item& it : in) {
      if (it.t0 + it.nt <= first || it.nt == 1) {
        out.push_back(it);
        continue;
      }
      const int64_t keep = std::max<int64_t>(0, first - it.t0);
      if (keep > 0) out.push_back(attn::Item{it.hk, it.t0, keep, it.h0, it.g});
      for (int64_t t = it.t0 + keep; t < it.t0 + it.nt; ++t) out.push_back(attn::Item{it.hk, t, 1, it.h0, it.g});
    }
    return out;
  }

  // Bounds of every complete page of KV head hk, from its keys rotated back to position 0.
  void update_bounds(KvCache& kv, int64_t il, int64_t hk) {
    HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + hk)];
    const int64_t d = shape_.head_dim;
    const int64_t low = kv.take_low_water(il, hk);  // truncated: pages below stay valid
    hs.n_full = std::min(hs.n_full, low / page_);
    if (hs.epoch != kv.epoch(il, hk)) {  // tokens changed under us: rebuild
      hs.epoch = kv.epoch(il, hk);
      hs.n_full = 0;
    }
    const int64_t n_full = kv.n_tokens(il, hk) / page_;
    if (hs.pb.head_dim() != d) hs.pb.reset(d);
    hs.n_full = hs.pb.restart(hs.n_full);
    hs.pb.resize(n_full);
    thread_local std::vector<float> rows;  // scratch: no allocation per decoded token
    rows.resize(static_cast<size_t>(page_ * d));
    for (int64_t p = hs.n_full; p < n_full; ++p) {
      kv.read_keys(il, hk, p * page_, page_, rows.data());
      attn::unrotate_rows(rows.data(), page_, d, kv.positions(il, hk) + p * page_, kv.rope(il));
      hs.pb.set_rows(p, rows.data(), page_);
    }
    hs.n_full = n_full;
  }

  // Spans of the keys [0, a), far for every row of the item: all of them, or with a budget the
  // pages of the largest bounds for the item's queries at the fixed distance.
  void add_far(const attn::ExecCtx& ctx, const KvCache& kv, int64_t il, const attn::Item& it, int64_t a,
               std::vector<attn::Span>& sp) const {
    const int64_t B = kv.block_tokens(), d = shape_.head_dim;
    const int64_t n_pages = a / page_, k = budget_ / page_;
    if (budget_ == 0 || n_pages <= k) {
      attn::add_spans(sp, 0, a, B, 1, true);
      return;
    }
    const HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + it.hk)];
    // Per head of the group, its queries (variant 1) as a box [lo, hi]; one query: hi null.
    thread_local std::vector<float> box;
    thread_local std::vector<float> ub;
    thread_local std::vector<int32_t> order;
    const float* lo[attn::kMaxRows];
    const float* hi[attn::kMaxRows];
    box.resize(static_cast<size_t>(it.g * 2 * d));
    const float* qv = ctx.var[1].q;
    for (int64_t hg = 0; hg < it.g; ++hg) {
      const int64_t h = it.h0 + hg;
      if (it.nt == 1) {
        lo[hg] = qv + (it.t0 * ctx.n_head + h) * d;
        hi[hg] = nullptr;
        continue;
      }
      float* l = box.data() + hg * 2 * d;
      float* u = l + d;
      std::copy_n(qv + (it.t0 * ctx.n_head + h) * d, d, l);
      std::copy_n(l, d, u);
      for (int64_t t = it.t0 + 1; t < it.t0 + it.nt; ++t) {
        const float* q = qv + (t * ctx.n_head + h) * d;
        for (int64_t c = 0; c < d; ++c) {
          l[c] = std::min(l[c], q[c]);
          u[c] = std::max(u[c], q[c]);
        }
      }
      lo[hg] = l;
      hi[hg] = u;
    }
    ub.resize(static_cast<size_t>(n_pages));
    hs.pb.bounds(lo, hi, it.g, 0, n_pages, ub.data(), true);  // the group's largest bound per page
    for (float& u : ub)
      if (u != u) u = std::numeric_limits<float>::infinity();  // a NaN query: always a candidate
    order.resize(static_cast<size_t>(n_pages));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      const float bx = ub[static_cast<size_t>(x)], by = ub[static_cast<size_t>(y)];
      return bx > by || (bx == by && x < y);
    });
    std::sort(order.begin(), order.begin() + k);
    for (int64_t j = 0; j < k; ++j) attn::add_spans(sp, order[static_cast<size_t>(j)] * page_, page_, B, 1, true);
    attn::add_spans(sp, n_pages * page_, a - n_pages * page_, B, 1, true);  // the incomplete page
  }

  int64_t distance_, budget_, page_, tail_;
  std::vector<HeadState> heads_;                // [n_layer * n_head_kv] page bounds (budget > 0)
  std::vector<int32_t> wpos_;                   // [n] the fixed distance
  std::vector<int64_t> near_;                   // [n_head_kv, n] first near key of each query
  std::vector<std::vector<attn::Span>> spans_;  // [items]
};

}  // namespace

Expected<BackendPtr> make_fixed(MethodSpec& spec, const AttnShape& s) {
  int64_t distance = s.fixed_distance;
  LC_TRY(spec.get_int("distance", &distance, 0, int64_t{1} << 30,
                      "W: a key more than W positions before its query is scored as if W away, tokens (default: "
                      "the W the model was trained with, from its GGUF; required otherwise)"));
  int64_t budget = 0, page = 16, tail = 64;
  LC_TRY(spec.get_int("budget", &budget, 0, int64_t{1} << 30,
                      "0: every far key is read; else far-key tokens read, the top budget/page pages by their "
                      "Quest bound (at least one page)"));
  LC_TRY(spec.get_int("page", &page, 1, 65536, "far keys per page of key min/max bounds (budget > 0), tokens"));
  LC_TRY(spec.get_int("tail", &tail, 0, int64_t{1} << 30,
                      "last tokens of each call that choose their pages alone (budget > 0); earlier ones choose "
                      "per tile of up to 64 query rows, tokens"));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  LC_TRY(spec.finish());
  if (budget > 0 && budget < page)
    return make_error(fmt::format("fixed: budget={} is less than one page (page={}); give budget=0 for all far "
                                  "keys or at least one page", budget, page));
  if (distance < 1)
    return make_error("fixed: give distance=N (the model was not trained with a distance ceiling, so there is no "
                      "default: its GGUF has no longctx.attention.fixed_distance)");
  return BackendPtr(new FixedBackend(s, distance, budget, page, tail, split));
}

}  // namespace lc
