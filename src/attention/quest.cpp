// Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference", ICML 2024; official code mit-han-lab/Quest). Keys are grouped in pages of `page`
// tokens from the first token; each page keeps the per-channel minimum m and maximum M of its
// stored (post-RoPE) keys, which bound any query's score on the page from above:
//     U(q, page) = sum_i max(q_i m_i, q_i M_i)  >=  q . k   for every k in the page.
//
// Two registry names share this file.
//
// `quest` is the paper's method, as the official code that produced the paper's accuracy
// figures runs it (evaluation/quest_attention.py):
//   - a forward call of more than one token (prefill) attends densely (`q_len > 1`);
//   - the first dense_layers (2) layers attend densely (`layer_id < 2`);
//   - a decoded token's query head h chooses its own pages (repeat_kv: no sharing across the
//     GQA group): with L visible tokens, n_pages = ceil(L / page) pages (the last one partial,
//     bounded by its keys alone, the current token's page included and scored like the others),
//     it attends the top K = min(max(3, min(L, budget) / page), n_pages) pages by U, exact
//     float bounds, scores summed in double; K = n_pages is dense. Ties go to the lower page
//     index (torch.topk leaves them unspecified).
//
// `quest_fast` is the project's faster relative (docs/attention.md): sparse prefill (a prefill
// tile chooses once, with the bound of its query box), the query heads of a GQA group choosing
// one set of pages by their largest bound (share=1), the tile's own pages always attended, K =
// budget/page pages (at least 2), and bounds kept as 8-bit codes with per-channel scales
// rounded outward (attn::PageBounds: about a 28th of the f16 K/V bytes at pages of 16, read for
// every decoded token).
//
// Both: decoding has one tile per KV head, fewer than the threads: the attention over the
// chosen pages (and, in quest_fast, the bounds pass) are split into units of `split` tokens
// (split-K, flash-decoding). Pages of one KV head are the outer loop, the query heads that
// selected a page the inner one: a page is loaded once for the whole GQA group.
//
// quest_fast in detail. GQA (the paper's models are MHA): with share=1 (default) the query
// heads of a group choose one set of pages by the largest of their bounds, which still bounds
// every head's scores, so the budget is also what is read per KV head. share=0 keeps the
// per-head choice, where the union of a group's choices can be g times the budget. In a
// prefill tile (up to 64 rows: a few tokens x the heads of a GQA group) the pages are chosen
// once per query head for the tile's tokens, with the bound of the tile's query box (sum_i max
// over q_i in [lo_i, hi_i], k_i in [m_i, M_i] of q_i k_i), which still bounds every query of the
// tile from above; the tile's own pages are always attended. Selection then costs n_pages per
// tile and head instead of per query, so a 1M-token prompt no longer spends O(n^2 / page) on
// bounds per query. Queries that see no more than `budget` tokens attend densely.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <functional>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/methods.h"
#include "attention/page_bounds.h"

namespace lc {
namespace {

class QuestBackend final : public ExecBackend {
 public:
  // paper: `quest` (the official code's method); otherwise `quest_fast`.
  QuestBackend(const AttnShape& s, bool paper, int64_t budget, int64_t page, int64_t dense_layers, bool share,
               int64_t split)
      : ExecBackend(s), paper_(paper), budget_(budget), page_(page), dense_layers_(dense_layers), share_(share),
        heads_(static_cast<size_t>(s.n_layer * s.n_head_kv)) {
    split_ = split;
  }

  std::string spec() const override {
    std::string s = paper_ ? fmt::format("quest:budget={},page={},dense_layers={}", budget_, page_, dense_layers_)
                           : fmt::format("quest_fast:budget={},page={},dense_layers={},share={}", budget_, page_,
                                         dense_layers_, share_ ? 1 : 0);
    if (split_ != kDefaultSplit) s += fmt::format(",split={}", split_);
    return s;
  }

  // Context parallelism: a shard attended detached is paged from its own first token, and its
  // query heads choose their K pages among that shard's pages (the budget is per shard).
  bool supports_detached() const override { return true; }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    if (il < dense_layers_ || (paper_ && n > 1)) {  // Quest: `q_len > 1 or layer_id < 2` is dense
      run_dense(ctx, pool);
      return ok_status();
    }
    refresh_bounds(kv, il, pool);
    if (paper_) return forward_paper(ctx, kv, pool);
    const std::vector<attn::Item> items = attn::make_items(ctx);
    const int64_t n_items = static_cast<int64_t>(items.size());
    auto head = [&](const attn::Item& it) -> const HeadState& {
      return heads_[static_cast<size_t>(il * shape_.n_head_kv + it.hk)];
    };
    const int64_t seg = std::max<int64_t>(1, split_ / page_);  // pages per split-K unit
    int64_t max_pages = 0;
    for (const auto& it : items)
      max_pages = std::max(max_pages, (ctx.visible(kv.n_tokens(il, it.hk), it.t0 + it.nt - 1) + page_ - 1) / page_);
    if (n_items >= 4 * pool.size() || max_pages <= seg) {
      // Enough tiles for every thread (prefill): each thread plans, bounds, selects and
      // attends whole tiles.
      pool.parallel_for(n_items, [&](int64_t b, int64_t e, int) {
        attn::Runner& run = attn::thread_runner();
        thread_local Plan plan;
        thread_local std::vector<uint64_t> mask;
        thread_local std::vector<attn::Span> spans;
        for (int64_t i = b; i < e; ++i) {
          const attn::Item& it = items[static_cast<size_t>(i)];
          run.begin(ctx, it);
          make_plan(ctx, run, plan);
          bound_pages(head(it), plan, 0, plan.own_first);
          for (int64_t sh = 0; sh < plan.n_sel; ++sh) select(plan, sh);
          page_spans(plan, kv.block_tokens(), mask, spans);
          attn::run_prefetched(run, spans.data(), spans.size());
          run.finish();
        }
      });
      return ok_status();
    }
    // Decoding: a token has one tile per KV head, fewer than the threads. The page bounds are
    // computed in units of `seg` pages on all threads, and the attention over the chosen pages
    // runs split-K (run_spans): partial softmax states merged per tile in order, so the result
    // does not depend on the number of threads.
    if (static_cast<int64_t>(plans_.size()) < n_items) plans_.resize(static_cast<size_t>(n_items));
    const int64_t bseg = 4 * seg;  // pages per bounds unit: longer streams, still many units
    std::vector<int64_t> unit_first(static_cast<size_t>(n_items + 1), 0);
    {
      attn::Runner& run = attn::thread_runner();
      for (int64_t i = 0; i < n_items; ++i) {
        Plan& plan = plans_[static_cast<size_t>(i)];
        run.begin(ctx, items[static_cast<size_t>(i)]);
        make_plan(ctx, run, plan);
        const int64_t bounded = plan.n_scored > 0 ? plan.own_first : 0;
        unit_first[static_cast<size_t>(i + 1)] = unit_first[static_cast<size_t>(i)] + (bounded + bseg - 1) / bseg;
      }
    }
    const int64_t n_units = unit_first.back();
    const int64_t B = kv.block_tokens();
    spans_.resize(items.size());
    // A tile's pages are chosen, and its spans made, by the thread that bounds its last unit, so
    // one tile's selection overlaps the next tile's bounds and no pass through the pool waits
    // for the slowest tile. Each step is a function of the tile alone: which thread runs it
    // changes no result.
    if (left_cap_ < n_items) {
      left_.reset(new std::atomic<int64_t>[static_cast<size_t>(n_items)]);
      left_cap_ = n_items;
    }
    for (int64_t i = 0; i < n_items; ++i)
      left_[static_cast<size_t>(i)].store(unit_first[static_cast<size_t>(i + 1)] - unit_first[static_cast<size_t>(i)],
                                          std::memory_order_relaxed);
    auto choose = [&](size_t i) {
      thread_local std::vector<uint64_t> mask;
      Plan& plan = plans_[i];
      for (int64_t sh = 0; sh < plan.n_sel; ++sh) select(plan, sh);
      page_spans(plan, B, mask, spans_[i]);
    };
    for (int64_t i = 0; i < n_items; ++i)
      if (unit_first[static_cast<size_t>(i + 1)] == unit_first[static_cast<size_t>(i)]) choose(static_cast<size_t>(i));
    pool.for_each_dynamic(n_units, [&](int64_t u, int) {
      const size_t i = static_cast<size_t>(std::upper_bound(unit_first.begin(), unit_first.end(), u) - unit_first.begin() - 1);
      const int64_t p0 = (u - unit_first[i]) * bseg;
      bound_pages(head(items[i]), plans_[i], p0, p0 + bseg);
      if (left_[i].fetch_sub(1, std::memory_order_acq_rel) == 1) choose(i);
    });
    // The chosen pages of each tile, attended split-K (ExecBackend::run_spans).
    run_spans(ctx, items, spans_, pool);
    return ok_status();
  }

 private:
  struct HeadState {
    uint64_t epoch = ~uint64_t{0};
    int64_t n_full = 0;          // pages whose bounds are final
    attn::PageBounds pb;         // quest_fast: per page min | max as 8-bit codes, in tiles of 16 pages
    std::vector<float> exact;    // quest: [page][min[d], max[d]], the keys' own values
    std::vector<float> rows;     // [page, head_dim] scratch
  };

  // Page bounds, brought up to date per KV head: in parallel after a prefill chunk (or, in
  // quest, at the first decoded token after it), on this thread when decoding (one page per
  // head changes), which saves a pass through the pool.
  void refresh_bounds(KvCache& kv, int64_t il, ThreadPool& pool) {
    int64_t stale = 0;
    for (int64_t hk = 0; hk < shape_.n_head_kv; ++hk) stale += stale_pages(kv, il, hk);
    if (stale <= 4 * shape_.n_head_kv) {
      for (int64_t hk = 0; hk < shape_.n_head_kv; ++hk) update_bounds(kv, il, hk);
    } else {
      pool.parallel_for(shape_.n_head_kv, [&](int64_t b, int64_t e, int) {
        for (int64_t hk = b; hk < e; ++hk) update_bounds(kv, il, hk);
      });
    }
  }

  // The paper's decoding step (one token, every query head on its own): K pages of highest
  // U(q, page) among all ceil(L / page) pages, with K = min(max(3, min(L, budget) / page),
  // n_pages) (evaluation/quest_attention.py: token_budget = min(kv_seq_len, budget), topk k =
  // min(max(3, token_budget // chunk_size), n_chunks)). The chosen pages of a KV head are
  // attended as spans carrying the rows (query heads) that chose them.
  Status forward_paper(const attn::ExecCtx& ctx, KvCache& kv, ThreadPool& pool) {
    const int64_t il = ctx.il, H = shape_.n_head;
    if (static_cast<int64_t>(paper_pages_.size()) < H) paper_pages_.resize(static_cast<size_t>(H));
    paper_all_.assign(static_cast<size_t>(H), 0);
    pool.parallel_for(H, [&](int64_t b, int64_t e, int) {
      for (int64_t h = b; h < e; ++h) choose_paper(ctx, kv, h);
    });
    const std::vector<attn::Item> items = attn::make_items(ctx);
    spans_.resize(items.size());
    const int64_t B = kv.block_tokens();
    std::vector<uint64_t> mask;
    for (size_t i = 0; i < items.size(); ++i) {
      const attn::Item& it = items[i];
      const int64_t L = kv.n_tokens(il, it.hk);
      const int64_t n_pages = (L + page_ - 1) / page_;
      mask.assign(static_cast<size_t>(n_pages), 0);
      for (int64_t r = 0; r < it.rows(); ++r) {  // one token: row r is query head h0 + r
        const int64_t h = it.h0 + r % it.g;
        if (paper_all_[static_cast<size_t>(h)]) {
          for (auto& m : mask) m |= uint64_t{1} << r;
          continue;
        }
        for (int32_t p : paper_pages_[static_cast<size_t>(h)]) mask[static_cast<size_t>(p)] |= uint64_t{1} << r;
      }
      spans_[i].clear();
      for (int64_t p = 0; p < n_pages; ++p) {
        if (!mask[static_cast<size_t>(p)]) continue;
        const size_t at = spans_[i].size();
        attn::add_spans(spans_[i], p * page_, std::min(page_, L - p * page_), B);
        for (size_t j = at; j < spans_[i].size(); ++j) spans_[i][j].rows = mask[static_cast<size_t>(p)];
      }
    }
    run_spans(ctx, items, spans_, pool);
    return ok_status();
  }

  // Query head h of a decoded token: paper_all_[h] (every page), or paper_pages_[h], its K pages
  // of highest U in ascending order. U is summed in double over the exact float bounds; a NaN
  // (from a NaN query or key) counts as +inf; ties go to the lower page index.
  void choose_paper(const attn::ExecCtx& ctx, const KvCache& kv, int64_t h) {
    const int64_t d = shape_.head_dim, hk = h / ctx.group;
    const int64_t L = kv.n_tokens(ctx.il, hk);
    const int64_t n_pages = (L + page_ - 1) / page_;
    const int64_t K = std::min(std::max<int64_t>(3, std::min(L, budget_) / page_), n_pages);
    std::vector<int32_t>& chosen = paper_pages_[static_cast<size_t>(h)];
    chosen.clear();
    if (K >= n_pages) {
      paper_all_[static_cast<size_t>(h)] = 1;
      return;
    }
    const HeadState& hs = heads_[static_cast<size_t>(ctx.il * shape_.n_head_kv + hk)];
    const float* q = ctx.var[0].q + h * d;  // rotated and scaled by scale > 0: the same order
    thread_local std::vector<double> score;
    thread_local std::vector<int32_t> order;
    score.resize(static_cast<size_t>(n_pages));
    order.resize(static_cast<size_t>(n_pages));
    for (int64_t p = 0; p < n_pages; ++p) {
      const float* mn = hs.exact.data() + p * 2 * d;
      const float* mx = mn + d;
      double u = 0;
      for (int64_t c = 0; c < d; ++c) {
        const double a = static_cast<double>(q[c]) * mn[c], b = static_cast<double>(q[c]) * mx[c];
        u += a > b ? a : b;
      }
      score[static_cast<size_t>(p)] = u == u ? u : std::numeric_limits<double>::infinity();
      order[static_cast<size_t>(p)] = static_cast<int32_t>(p);
    }
    const double* sc = score.data();
    auto before = [sc](int32_t x, int32_t y) { return sc[x] > sc[y] || (sc[x] == sc[y] && x < y); };
    std::nth_element(order.begin(), order.begin() + (K - 1), order.end(), before);
    chosen.assign(order.begin(), order.begin() + K);
    std::sort(chosen.begin(), chosen.end());
  }

  // What one tile attends. Pages [own_first, n_pages) hold the tile's own tokens and are always
  // attended (causality trims them); rows in `all_rows` (queries that see no more than the
  // budget) attend every page; rows in `below_rows` attend every page below own_first (the
  // budget covers them all); each scored head chooses `want` of the pages below own_first by
  // its bound, or (share) the scored heads of the group choose together by the largest of
  // their bounds.
  struct Plan {
    int64_t n_pages = 0, own_first = 0, want = 0, max_vis = 0, n_scored = 0, n_sel = 0;
    uint64_t all_rows = 0, own_rows = 0, below_rows = 0;
    int64_t scored[attn::kMaxRows];        // heads of the group that choose pages by bound
    uint64_t scored_rows[attn::kMaxRows];  // their rows
    const float* lo[attn::kMaxRows];       // each scored head's query box [lo, hi];
    const float* hi[attn::kMaxRows];       // hi null: one query (decoding), Quest's own bound
    uint64_t sel_rows[attn::kMaxRows];     // rows of each choice: one per scored head, or one
    std::vector<float> box;                // [g, 2, head_dim] each head's query box
    std::vector<float> ub;                 // [own_first, n_sel] page bounds
    std::vector<int32_t> chosen;           // [n_sel, want] chosen pages, ascending
  };

  void make_plan(const attn::ExecCtx& ctx, const attn::Runner& run, Plan& plan) const {
    const attn::Item& it = run.item();
    const int64_t d = shape_.head_dim;
    const int64_t k_pages = std::max<int64_t>(1, budget_ / page_);
    const int64_t rows = run.rows();
    plan.max_vis = run.vis(rows - 1);
    const int64_t min_vis = run.vis(0);
    plan.n_pages = (plan.max_vis + page_ - 1) / page_;
    // Detached (a shard that does not hold the queries): no page is the tile's own.
    plan.own_first = ctx.detached ? plan.n_pages : (min_vis - 1) / page_;
    plan.want = k_pages - (plan.n_pages - plan.own_first);  // pages to choose by bound
    plan.all_rows = plan.own_rows = plan.below_rows = 0;
    plan.n_scored = 0;
    plan.box.resize(static_cast<size_t>(it.g * 2 * d));
    for (int64_t hg = 0; hg < it.g; ++hg) {
      uint64_t head_rows = 0, dense_rows = 0;
      for (int64_t r = hg; r < rows; r += it.g) {
        head_rows |= uint64_t{1} << r;
        const int64_t vis = run.vis(r);
        if (vis <= budget_ || (vis + page_ - 1) / page_ <= k_pages) dense_rows |= uint64_t{1} << r;
      }
      plan.all_rows |= dense_rows;
      const uint64_t sparse_rows = head_rows & ~dense_rows;
      if (!sparse_rows) continue;
      plan.own_rows |= sparse_rows;
      if (plan.want <= 0 || plan.own_first == 0) continue;
      if (plan.want >= plan.own_first) {
        plan.below_rows |= sparse_rows;
        continue;
      }
      // The tile's queries of this head as a box [lo, hi]: the page bound becomes
      // sum_i max(lo_i m_i, lo_i M_i, hi_i m_i, hi_i M_i) >= q . k for every query of the
      // box and every key of the page. One query (decoding) is Quest's own bound.
      float* lo = plan.box.data() + hg * 2 * d;
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
      plan.lo[plan.n_scored] = lo;
      plan.hi[plan.n_scored] = __builtin_popcountll(sparse_rows) == 1 ? nullptr : hi;
      plan.scored_rows[plan.n_scored++] = sparse_rows;
    }
    plan.n_sel = share_ && plan.n_scored > 1 ? 1 : plan.n_scored;
    if (plan.n_sel == 1) {
      plan.sel_rows[0] = 0;
      for (int64_t sh = 0; sh < plan.n_scored; ++sh) plan.sel_rows[0] |= plan.scored_rows[sh];
    } else {
      std::copy(plan.scored_rows, plan.scored_rows + plan.n_scored, plan.sel_rows);
    }
    plan.ub.resize(static_cast<size_t>(plan.n_sel * plan.own_first));
    plan.chosen.resize(static_cast<size_t>(plan.n_sel * std::max<int64_t>(plan.want, 0)));
  }

  // Bounds of pages [p0, p1) below own_first for every scored head, or (shared) the largest of
  // them. Pages outer, heads inner: a tile of pages is read from memory once for every head of
  // the group (the bounds are a 28th of the f16 K/V bytes, read for every decoded token).
  void bound_pages(const HeadState& hs, Plan& plan, int64_t p0, int64_t p1) const {
    if (plan.n_scored == 0) return;
    p1 = std::min(p1, plan.own_first);
    if (p0 >= p1) return;
    hs.pb.bounds(plan.lo, plan.hi, plan.n_scored, p0, p1, plan.ub.data() + p0 * plan.n_sel,
                 plan.n_sel != plan.n_scored);
  }

  // Scored head sh chooses its `want` pages of highest bound; ties go to the lower page index
  // so the choice is deterministic. The want-th largest bound is found on the values (a NaN,
  // from a NaN query, counts as +inf), then the pages above it and the first pages equal to it
  // are taken in page order.
  static void select(Plan& plan, int64_t sh) {
    thread_local std::vector<float> vals;
    const int64_t n = plan.own_first, ns = plan.n_sel, want = plan.want;
    vals.resize(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; ++p) {
      const float v = plan.ub[static_cast<size_t>(p * ns + sh)];
      vals[static_cast<size_t>(p)] = v == v ? v : std::numeric_limits<float>::infinity();
    }
    const float thr = attn::kth_largest(vals.data(), n, want);
    int64_t above = 0;
    for (int64_t p = 0; p < n; ++p) above += vals[static_cast<size_t>(p)] > thr;
    int64_t ties = want - above;
    int32_t* out = plan.chosen.data() + sh * want;
    for (int64_t p = 0; p < n; ++p) {
      const float v = vals[static_cast<size_t>(p)];
      if (v > thr || (v == thr && ties-- > 0)) *out++ = static_cast<int32_t>(p);
    }
  }

  // The spans the tile attends (after select): every page that some row takes, cut at KV
  // blocks, with the rows that take it.
  void page_spans(const Plan& plan, int64_t block_tokens, std::vector<uint64_t>& mask,
                  std::vector<attn::Span>& out) const {
    out.clear();
    mask.assign(static_cast<size_t>(plan.n_pages), 0);
    for (int64_t sh = 0; sh < plan.n_sel; ++sh) {
      const int32_t* chosen = plan.chosen.data() + sh * plan.want;
      for (int64_t j = 0; j < plan.want; ++j) mask[static_cast<size_t>(chosen[j])] |= plan.sel_rows[sh];
    }
    for (int64_t p = 0; p < plan.n_pages; ++p) {
      const uint64_t m = mask[static_cast<size_t>(p)] | plan.all_rows |
                         (p >= plan.own_first ? plan.own_rows : plan.below_rows);
      if (!m) continue;
      const size_t at = out.size();
      attn::add_spans(out, p * page_, std::min(page_, plan.max_vis - p * page_), block_tokens);
      for (size_t j = at; j < out.size(); ++j) out[j].rows = m;
    }
  }

  // Pages of KV head hk whose bounds update_bounds would compute now (without changing state).
  int64_t stale_pages(KvCache& kv, int64_t il, int64_t hk) const {
    const HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + hk)];
    const int64_t n_pages = (kv.n_tokens(il, hk) + page_ - 1) / page_;
    if (hs.epoch != kv.epoch(il, hk)) return n_pages;
    return n_pages - std::min(hs.n_full, kv.low_water(il, hk) / page_);
  }

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
    hs.rows.resize(static_cast<size_t>(page_ * d));
    if (paper_) {
      hs.exact.resize(static_cast<size_t>(n_pages * 2 * d));
      for (int64_t p = hs.n_full; p < n_pages; ++p) {
        const int64_t first = p * page_, cnt = std::min(page_, N - first);
        kv.read_keys(il, hk, first, cnt, hs.rows.data());
        float* mn = hs.exact.data() + p * 2 * d;
        float* mx = mn + d;
        std::copy(hs.rows.data(), hs.rows.data() + d, mn);
        std::copy(hs.rows.data(), hs.rows.data() + d, mx);
        for (int64_t j = 1; j < cnt; ++j)
          for (int64_t c = 0; c < d; ++c) {
            const float x = hs.rows[static_cast<size_t>(j * d + c)];
            // a NaN key makes its channel's bounds NaN (std::min and std::max would drop it)
            if (mn[c] == mn[c]) mn[c] = x != x ? x : std::min(mn[c], x);
            if (mx[c] == mx[c]) mx[c] = x != x ? x : std::max(mx[c], x);
          }
        if (cnt == page_) hs.n_full = p + 1;
      }
      return;
    }
    if (hs.pb.head_dim() != d) hs.pb.reset(d);
    hs.n_full = hs.pb.restart(hs.n_full);
    hs.pb.resize(n_pages);
    for (int64_t p = hs.n_full; p < n_pages; ++p) {
      const int64_t first = p * page_, cnt = std::min(page_, N - first);
      kv.read_keys(il, hk, first, cnt, hs.rows.data());
      hs.pb.set_rows(p, hs.rows.data(), cnt);
      if (cnt == page_) hs.n_full = p + 1;
    }
  }

  bool paper_;
  int64_t budget_, page_, dense_layers_;
  bool share_;
  std::vector<std::vector<int32_t>> paper_pages_;  // quest, decoding: each query head's pages
  std::vector<uint8_t> paper_all_;                 // quest, decoding: 1 = the head attends every page
  std::vector<HeadState> heads_;  // [n_layer * n_head_kv]
  std::vector<Plan> plans_;       // decoding: one per tile
  std::vector<std::vector<attn::Span>> spans_;  // decoding: what each tile attends
  std::unique_ptr<std::atomic<int64_t>[]> left_;  // decoding: units of each tile not yet bounded
  int64_t left_cap_ = 0;
};

}  // namespace

Expected<BackendPtr> make_quest(MethodSpec& spec, const AttnShape& s) {
  int64_t budget = 2048, page = 16, dense_layers = 2;
  LC_TRY(spec.get_int("budget", &budget, 1, int64_t{1} << 30,
                      "token budget B: a decoded token's query head attends its top K = min(max(3, min(L, B) / "
                      "page), ceil(L / page)) pages of L visible tokens by their score bound (the official "
                      "code's rule; K = all pages is dense); prefill is dense"));
  LC_TRY(spec.get_int("page", &page, 1, 65536,
                      "tokens per page (the paper's chunk_size), the unit of selection with its key min/max bounds"));
  LC_TRY(spec.get_int("dense_layers", &dense_layers, 0, 1 << 20,
                      "first layers that attend densely (the official code: 2), layers"));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  LC_TRY(spec.finish());
  return BackendPtr(new QuestBackend(s, /*paper=*/true, budget, page, dense_layers, /*share=*/false, split));
}

Expected<BackendPtr> make_quest_fast(MethodSpec& spec, const AttnShape& s) {
  int64_t budget = 2048, page = 16, dense_layers = 2;
  LC_TRY(spec.get_int("budget", &budget, 1, int64_t{1} << 30,
                      "tokens a query head attends: the top budget/page pages by their score bound (at least "
                      "2 pages; the tile's own pages included); a query that sees no more attends densely"));
  LC_TRY(spec.get_int("page", &page, 1, 65536, "tokens per page, the unit of selection with its key min/max bounds"));
  LC_TRY(spec.get_int("dense_layers", &dense_layers, 0, 1 << 20, "first layers that attend densely, layers"));
  bool share = true;
  LC_TRY(spec.get_bool("share", &share,
                       "1: the query heads of a GQA group choose one set of pages by their largest bound; 0: each "
                       "head chooses its own (a group may then read up to group x budget)"));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  LC_TRY(spec.finish());
  if (budget < 2 * page)
    return make_error(fmt::format(
        "attention method 'quest_fast': budget {} must hold at least two pages of {} tokens", budget, page));
  return BackendPtr(new QuestBackend(s, /*paper=*/false, budget, page, dense_layers, share, split));
}

}  // namespace lc
