// Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference"): keys are grouped in pages; each page keeps the per-channel minimum m and
// maximum M of its keys, which bound any query's score on the page from above:
//     U(q, page) = sum_i max(q_i m_i, q_i M_i)  >=  q . k   for every k in the page.
// Each query head attends exactly to the top budget/page pages by U (its own page always
// included); the first dense_layers layers, and queries that see no more than `budget`
// tokens, attend densely. Bounds are over the stored post-RoPE keys, as in the paper.
//
// The paper selects per decoded token. In a prefill tile (up to 64 rows: a few tokens x the
// heads of a GQA group) the pages are chosen once per query head for the tile's tokens, with
// the bound of the tile's query box (sum_i max over q_i in [lo_i, hi_i], k_i in [m_i, M_i]
// of q_i k_i), which still bounds every query of the tile from above; the tile's own pages are
// always attended. Selection then costs n_pages per tile and head instead of per query, so a
// 1M-token prompt no longer spends O(n^2 / page) on bounds per query. One query (decoding)
// gets exactly the paper's selection.
//
// Pages of one KV head are the outer loop, the query heads (and tokens) that selected a page
// the inner one: a page is loaded once for the whole GQA group.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/methods.h"

namespace lc {
namespace {

class QuestBackend final : public ExecBackend {
 public:
  QuestBackend(const AttnShape& s, int64_t budget, int64_t page, int64_t dense_layers)
      : ExecBackend(s), budget_(budget), page_(page), dense_layers_(dense_layers),
        heads_(static_cast<size_t>(s.n_layer * s.n_head_kv)) {}

  std::string spec() const override {
    return strprintf("quest:budget=%lld,page=%lld,dense_layers=%lld", (long long)budget_, (long long)page_,
                     (long long)dense_layers_);
  }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    if (il < dense_layers_) {
      run_dense(ctx, pool);
      return Status::ok();
    }
    // Page bounds, brought up to date per KV head.
    pool.parallel_for(shape_.n_head_kv, [&](int64_t b, int64_t e, int) {
      for (int64_t hk = b; hk < e; ++hk) update_bounds(kv, il, hk);
    });
    const std::vector<attn::Item> items = attn::make_items(ctx);
    const int64_t d = shape_.head_dim;
    const int64_t k_pages = std::max<int64_t>(1, budget_ / page_);
    pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
      attn::Runner& run = attn::thread_runner();
      thread_local std::vector<float> ub;          // [scored heads, own_first] page bounds
      thread_local std::vector<float> box;         // [g, 2, head_dim] each head's query box
      thread_local std::vector<int32_t> order;     // [n_pages]
      thread_local std::vector<uint64_t> mask;     // [n_pages]
      for (int64_t i = b; i < e; ++i) {
        const attn::Item& it = items[static_cast<size_t>(i)];
        run.begin(ctx, it);
        const HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + it.hk)];
        const int64_t rows = run.rows();
        const int64_t max_vis = run.vis(rows - 1), min_vis = run.vis(0);
        const int64_t n_pages = (max_vis + page_ - 1) / page_;
        // Pages holding one of the tile's own tokens: always attended (causality trims them).
        const int64_t own_first = (min_vis - 1) / page_;
        const int64_t want = k_pages - (n_pages - own_first);  // pages to choose by bound
        mask.assign(static_cast<size_t>(n_pages), 0);
        box.resize(static_cast<size_t>(it.g * 2 * d));
        int64_t scored[attn::kMaxRows];  // heads of the group that choose pages by bound
        uint64_t scored_rows[attn::kMaxRows];
        bool single[attn::kMaxRows];  // the box is one query (decoding): lo == hi
        int64_t n_scored = 0;
        for (int64_t hg = 0; hg < it.g; ++hg) {
          uint64_t head_rows = 0, dense_rows = 0;
          for (int64_t r = hg; r < rows; r += it.g) {
            head_rows |= uint64_t{1} << r;
            const int64_t vis = run.vis(r);
            if (vis <= budget_ || (vis + page_ - 1) / page_ <= k_pages) dense_rows |= uint64_t{1} << r;
          }
          if (dense_rows)
            for (int64_t p = 0; p < n_pages; ++p) mask[static_cast<size_t>(p)] |= dense_rows;
          const uint64_t sparse_rows = head_rows & ~dense_rows;
          if (!sparse_rows) continue;
          for (int64_t p = own_first; p < n_pages; ++p) mask[static_cast<size_t>(p)] |= sparse_rows;
          if (want <= 0 || own_first == 0) continue;
          if (want >= own_first) {
            for (int64_t p = 0; p < own_first; ++p) mask[static_cast<size_t>(p)] |= sparse_rows;
            continue;
          }
          // The tile's queries of this head as a box [lo, hi]: the page bound becomes
          // sum_i max(lo_i m_i, lo_i M_i, hi_i m_i, hi_i M_i) >= q . k for every query of the
          // box and every key of the page. One query (decoding) is Quest's own bound.
          float* lo = box.data() + hg * 2 * d;
          float* hi = lo + d;
          std::fill(lo, lo + d, std::numeric_limits<float>::infinity());
          std::fill(hi, hi + d, -std::numeric_limits<float>::infinity());
          for (int64_t r = hg; r < rows; r += it.g) {
            if (!(sparse_rows >> r & 1)) continue;
            const float* qr = ctx.var[0].q + (run.token_of(r) * shape_.n_head + run.head_of(r)) * d;
            for (int64_t c = 0; c < d; ++c) {
              lo[c] = std::min(lo[c], qr[c]);
              hi[c] = std::max(hi[c], qr[c]);
            }
          }
          scored[n_scored] = hg;
          single[n_scored] = __builtin_popcountll(sparse_rows) == 1;
          scored_rows[n_scored++] = sparse_rows;
        }
        if (n_scored > 0) {
          // Pages outer, heads inner: a page's bounds are read from memory once for every head
          // of the group (they are a quarter of the keys' bytes; reading them once per head
          // cost as much as half of dense attention at 64K).
          ub.resize(static_cast<size_t>(n_scored * own_first));
          for (int64_t p = 0; p < own_first; ++p) {
            const float* mn = hs.mn.data() + p * d;
            const float* mx = hs.mx.data() + p * d;
            for (int64_t s = 0; s < n_scored; ++s) {
              const float* lo = box.data() + scored[s] * 2 * d;
              // One query: Quest's bound, half the arithmetic of the box's and the same value.
              ub[static_cast<size_t>(s * own_first + p)] =
                  single[s] ? attn::page_bound(lo, mn, mx, d) : attn::box_bound(lo, lo + d, mn, mx, d);
            }
          }
          order.resize(static_cast<size_t>(own_first));
          for (int64_t s = 0; s < n_scored; ++s) {
            for (int64_t p = 0; p < own_first; ++p) order[static_cast<size_t>(p)] = static_cast<int32_t>(p);
            const float* u = ub.data() + s * own_first;
            // Ties broken by page index so the choice is deterministic.
            auto better = [u](int32_t x, int32_t y) { return u[x] > u[y] || (u[x] == u[y] && x < y); };
            std::nth_element(order.begin(), order.begin() + (want - 1), order.end(), better);
            for (int64_t j = 0; j < want; ++j) mask[static_cast<size_t>(order[static_cast<size_t>(j)])] |= scored_rows[s];
          }
        }
        for (int64_t p = 0; p < n_pages; ++p)
          if (mask[static_cast<size_t>(p)])
            run.run_range(p * page_, std::min(page_, max_vis - p * page_), 0, false, mask[static_cast<size_t>(p)]);
        run.finish();
      }
    });
    return Status::ok();
  }

 private:
  struct HeadState {
    uint64_t epoch = ~uint64_t{0};
    int64_t n_full = 0;         // pages whose bounds are final
    std::vector<float> mn, mx;  // [n_pages, head_dim]
    std::vector<float> rows;    // [page, head_dim] scratch
  };

  void update_bounds(KvCache& kv, int64_t il, int64_t hk) {
    HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + hk)];
    const int64_t d = shape_.head_dim;
    const int64_t low = kv.take_low_water(il, hk);  // truncated: pages below stay valid
    hs.n_full = std::min(hs.n_full, low / page_);
    if (hs.epoch != kv.epoch(il, hk)) {  // tokens changed under us: rebuild
      hs.epoch = kv.epoch(il, hk);
      hs.n_full = 0;
    }
    const int64_t N = kv.n_tokens(il, hk);
    const int64_t n_pages = (N + page_ - 1) / page_;
    hs.mn.resize(static_cast<size_t>(n_pages * d));
    hs.mx.resize(static_cast<size_t>(n_pages * d));
    hs.rows.resize(static_cast<size_t>(page_ * d));
    for (int64_t p = hs.n_full; p < n_pages; ++p) {
      const int64_t first = p * page_, cnt = std::min(page_, N - first);
      kv.read_keys(il, hk, first, cnt, hs.rows.data());
      float* mn = hs.mn.data() + p * d;
      float* mx = hs.mx.data() + p * d;
      std::fill(mn, mn + d, std::numeric_limits<float>::infinity());
      std::fill(mx, mx + d, -std::numeric_limits<float>::infinity());
      for (int64_t j = 0; j < cnt; ++j)
        for (int64_t c = 0; c < d; ++c) {
          mn[c] = std::min(mn[c], hs.rows[static_cast<size_t>(j * d + c)]);
          mx[c] = std::max(mx[c], hs.rows[static_cast<size_t>(j * d + c)]);
        }
      if (cnt == page_) hs.n_full = p + 1;
    }
  }

  int64_t budget_, page_, dense_layers_;
  std::vector<HeadState> heads_;  // [n_layer * n_head_kv]
};

}  // namespace

Expected<BackendPtr> make_quest(MethodSpec& spec, const AttnShape& s) {
  int64_t budget = 2048, page = 16, dense_layers = 2;
  LC_TRY(spec.get_int("budget", &budget, 1, int64_t{1} << 30));
  LC_TRY(spec.get_int("page", &page, 1, 65536));
  LC_TRY(spec.get_int("dense_layers", &dense_layers, 0, 1 << 20));
  LC_TRY(spec.finish());
  if (budget < 2 * page)
    return make_error(strprintf("attention method 'quest': budget %lld must hold at least two pages of %lld tokens",
                                (long long)budget, (long long)page));
  return BackendPtr(new QuestBackend(s, budget, page, dense_layers));
}

}  // namespace lc
