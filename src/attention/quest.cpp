// Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference"): keys are grouped in pages; each page keeps the per-channel minimum m and
// maximum M of its keys, which bound any query's score on the page from above:
//     U(q, page) = sum_i max(q_i m_i, q_i M_i)  >=  q . k   for every k in the page.
// Each query head attends exactly to the top budget/page pages by U (its own page always
// included); the first dense_layers layers, and queries that see no more than `budget`
// tokens, attend densely. Bounds are over the stored post-RoPE keys, as in the paper.
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
      thread_local std::vector<float> ub;          // [rows, n_pages]
      thread_local std::vector<int32_t> order;     // [n_pages]
      thread_local std::vector<uint64_t> mask;     // [n_pages]
      for (int64_t i = b; i < e; ++i) {
        const attn::Item& it = items[static_cast<size_t>(i)];
        run.begin(ctx, it);
        const HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + it.hk)];
        const int64_t rows = run.rows();
        const int64_t max_vis = run.vis(rows - 1);
        const int64_t n_pages = (max_vis + page_ - 1) / page_;
        ub.resize(static_cast<size_t>(rows * n_pages));
        mask.assign(static_cast<size_t>(n_pages), 0);
        // Bounds: pages outer, rows inner (a page's min/max stays in cache for the group).
        for (int64_t p = 0; p < n_pages; ++p) {
          const float* mn = hs.mn.data() + p * d;
          const float* mx = hs.mx.data() + p * d;
          for (int64_t r = 0; r < rows; ++r) {
            const float* qr = ctx.var[0].q + (run.token_of(r) * shape_.n_head + run.head_of(r)) * d;
            ub[static_cast<size_t>(r * n_pages + p)] = attn::page_bound(qr, mn, mx, d);
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t vis = run.vis(r);
          const int64_t np = (vis + page_ - 1) / page_;
          const uint64_t bit = uint64_t{1} << r;
          if (vis <= budget_ || np <= k_pages) {
            for (int64_t p = 0; p < np; ++p) mask[static_cast<size_t>(p)] |= bit;
            continue;
          }
          mask[static_cast<size_t>(np - 1)] |= bit;  // the query's own page
          order.resize(static_cast<size_t>(np - 1));
          for (int64_t p = 0; p < np - 1; ++p) order[static_cast<size_t>(p)] = static_cast<int32_t>(p);
          const float* u = ub.data() + r * n_pages;
          // Ties broken by page index so the choice is deterministic.
          auto better = [u](int32_t a, int32_t c) { return u[a] > u[c] || (u[a] == u[c] && a < c); };
          std::nth_element(order.begin(), order.begin() + (k_pages - 2), order.end(), better);
          for (int64_t j = 0; j < k_pages - 1; ++j) mask[static_cast<size_t>(order[static_cast<size_t>(j)])] |= bit;
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

  void update_bounds(const KvCache& kv, int64_t il, int64_t hk) {
    HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + hk)];
    const int64_t d = shape_.head_dim;
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
