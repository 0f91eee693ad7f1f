// Dense attention over the paged cache: softmax(q K^T / sqrt(d)) V, computed tile by tile with
// an online softmax (FlashAttention, Dao et al. 2022: m' = max(m, max_j s_j),
// l' = l e^{m-m'} + sum_j e^{s_j-m'}, o' = o e^{m-m'} + sum_j e^{s_j-m'} v_j), so no n x n
// score matrix exists. A tile is up to 64 query rows (tokens x the heads of one GQA group)
// against one KV block: each block is loaded once per tile. The default method.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "attention/methods.h"

namespace lc {

Status ExecBackend::begin_forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv,
                                  float* out, attn::ExecCtx& ctx) {
  LC_TRY(check_call(il, n, kv));
  ctx = attn::ExecCtx{};
  ctx.kv = &kv;
  ctx.il = il;
  ctx.n = n;
  ctx.n_head = shape_.n_head;
  ctx.n_head_kv = shape_.n_head_kv;
  ctx.group = shape_.n_head / shape_.n_head_kv;
  ctx.d = shape_.head_dim;
  ctx.dv = shape_.head_dim_v;
  ctx.out = out;
  ctx.detached = detached_;
  if (keep_lse_ || keep_partial_) {
    lse_.assign(static_cast<size_t>(n * shape_.n_head), -std::numeric_limits<float>::infinity());
    ctx.lse = lse_.data();
  }
  if (record_) {
    selection_ = Selection{il, n, shape_.n_head, {}};
    selection_.keys.assign(static_cast<size_t>(n * shape_.n_head), {});
    ctx.sel = &selection_;
  }
  add_variant(0, q, pos, kv, ctx);
  return ok_status();
}

void ExecBackend::add_variant(int v, const float* q, const int32_t* qpos, const KvCache& kv, attn::ExecCtx& ctx) {
  const size_t need = static_cast<size_t>(ctx.n * ctx.n_head * ctx.d);
  if (qbuf_[v].size() < need) qbuf_[v].resize(need);
  qpos_[v].assign(qpos, qpos + ctx.n);
  attn::prepare_queries(q, ctx.n, ctx.n_head, ctx.d, kv.rope(ctx.il), qpos_[v].data(), shape_.scale,
                        qbuf_[v].data());
  ctx.var[v] = attn::QueryVariant{qbuf_[v].data(), qpos_[v].data()};
}

namespace {
// The blocks of one KV head are scattered through the pool (interleaved with every other layer
// and head's), so the hardware prefetcher loses the stream at each block boundary. Touching the
// first rows of the next block while this one is scored restarts it early.
void prefetch_next(const attn::ExecCtx& ctx, int64_t hk, int64_t next, int64_t end) {
  if (next < end) ctx.kv->prefetch(ctx.il, hk, next, std::min<int64_t>(8, end - next));
}
// Tokens [s0, s1) of the runner's item, one span per run of stored rows (a block, or a thin
// block of keys without dropped channels), the next one's first rows prefetched.
void run_segment(const attn::ExecCtx& ctx, attn::Runner& run, int64_t s0, int64_t s1) {
  for (int64_t first = s0; first < s1;) {
    const int64_t next = run.cut(first, s1);
    prefetch_next(ctx, run.item().hk, next, s1);
    run.run(attn::Span{first, next - first, 0, false, run.all_rows()});
    first = next;
  }
}
}  // namespace

void ExecBackend::run_dense(const attn::ExecCtx& ctx, ThreadPool& pool) {
  const std::vector<attn::Item> items = attn::make_items(ctx);
  const int64_t B = ctx.kv->block_tokens();
  // Segments of `split_` tokens (whole blocks) are merged in order into each row's result,
  // whether they run on one thread or several, so the split never changes a bit.
  const int64_t seg = std::max(B, split_ / B * B);
  // Rows a tile's last token sees; items of one call differ only by their tokens.
  auto last_vis = [&](const attn::Item& it) {
    return ctx.visible(ctx.kv->n_tokens(ctx.il, it.hk), it.t0 + it.nt - 1);
  };
  int64_t n_seg_max = 0;
  for (const auto& it : items) n_seg_max = std::max(n_seg_max, (last_vis(it) + seg - 1) / seg);
  const int64_t threads = pool.size();
  if (static_cast<int64_t>(items.size()) >= 4 * threads || n_seg_max < 2) {
    pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
      attn::Runner& run = attn::thread_runner();
      for (int64_t i = b; i < e; ++i) {
        run.begin(ctx, items[static_cast<size_t>(i)]);
        const int64_t lv = run.vis(run.rows() - 1);  // the tile's last token sees the most
        for (int64_t s0 = 0; s0 < lv; s0 += seg) {
          if (s0 > 0) run.flush();
          run_segment(ctx, run, s0, std::min(lv, s0 + seg));
        }
        run.finish();
      }
    });
    return;
  }
  // Split-K (flash-decoding, Dao et al. 2023): too few tiles to keep every thread busy (one
  // decoded token has one tile per KV head), so each (tile, segment) is a work unit that
  // leaves its partial softmax state in a buffer; the partials are merged per tile in order.
  std::vector<int64_t> unit_first(items.size() + 1, 0);
  for (size_t i = 0; i < items.size(); ++i)
    unit_first[i + 1] = unit_first[i] + (last_vis(items[i]) + seg - 1) / seg;
  const int64_t n_units = unit_first.back();
  const int64_t stride = attn::kMaxRows * (2 + ctx.dv);
  if (static_cast<int64_t>(partials_.size()) < n_units * stride) partials_.resize(static_cast<size_t>(n_units * stride));
  pool.parallel_for(n_units, [&](int64_t b, int64_t e, int) {
    attn::Runner& run = attn::thread_runner();
    size_t i = static_cast<size_t>(std::upper_bound(unit_first.begin(), unit_first.end(), b) - unit_first.begin() - 1);
    for (int64_t u = b; u < e; ++u) {
      while (unit_first[i + 1] <= u) ++i;
      run.begin(ctx, items[i]);
      const int64_t lv = run.vis(run.rows() - 1);
      const int64_t s0 = (u - unit_first[i]) * seg, s1 = std::min(lv, s0 + seg);
      run_segment(ctx, run, s0, s1);
      run.export_partial(partials_.data() + u * stride);
    }
  }, attn::unit_grain(ctx, n_units));
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
    attn::Runner& run = attn::thread_runner();
    for (int64_t i = b; i < e; ++i) {
      run.begin(ctx, items[static_cast<size_t>(i)]);
      for (int64_t u = unit_first[static_cast<size_t>(i)]; u < unit_first[static_cast<size_t>(i) + 1]; ++u)
        run.merge_partial(partials_.data() + u * stride);
      run.finish();
    }
  });
}

void ExecBackend::run_spans(const attn::ExecCtx& ctx, const std::vector<attn::Item>& items,
                            const std::vector<std::vector<attn::Span>>& spans, ThreadPool& pool) {
  const int64_t n_items = static_cast<int64_t>(items.size());
  // Units: runs of consecutive spans of one item holding about split_ tokens.
  struct Unit {
    size_t item, a, b;  // spans [a, b) of item
  };
  std::vector<Unit> units;
  std::vector<size_t> unit_first(items.size() + 1, 0);
  const bool split = n_items < 4 * pool.size();
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& sp = spans[i];
    size_t a = 0;
    int64_t acc = 0;
    for (size_t j = 0; j < sp.size(); ++j) {
      if (split && acc >= split_ && j > a) {
        units.push_back(Unit{i, a, j});
        a = j;
        acc = 0;
      }
      acc += sp[j].count;
    }
    units.push_back(Unit{i, a, sp.size()});
    unit_first[i + 1] = units.size();
  }
  if (static_cast<int64_t>(units.size()) == n_items) {
    pool.parallel_for(n_items, [&](int64_t b, int64_t e, int) {
      attn::Runner& run = attn::thread_runner();
      for (int64_t i = b; i < e; ++i) {
        run.begin(ctx, items[static_cast<size_t>(i)]);
        const auto& sp = spans[static_cast<size_t>(i)];
        attn::run_prefetched(run, sp.data(), sp.size());
        run.finish();
      }
    });
    return;
  }
  const int64_t n_units = static_cast<int64_t>(units.size());
  const int64_t stride = attn::kMaxRows * (2 + ctx.dv);
  if (static_cast<int64_t>(partials_.size()) < n_units * stride) partials_.resize(static_cast<size_t>(n_units * stride));
  auto unit = [&](int64_t u) {
    attn::Runner& run = attn::thread_runner();
    const Unit& un = units[static_cast<size_t>(u)];
    run.begin(ctx, items[un.item]);
    attn::run_prefetched(run, spans[un.item].data() + un.a, un.b - un.a);
    run.export_partial(partials_.data() + u * stride);
  };
  if (ctx.sel) {  // recording: one thread, in order (attn::unit_grain)
    pool.parallel_for(n_units, [&](int64_t b, int64_t e, int) {
      for (int64_t u = b; u < e; ++u) unit(u);
    }, attn::unit_grain(ctx, n_units));
  } else {
    // Units cost unevenly (spans of rotated-back keys, blocks in another order): threads take
    // the next unit when free. Each unit's partial lands in its own slot and the merge below
    // is in order, so the result does not depend on which thread ran what.
    pool.for_each_dynamic(n_units, [&](int64_t u, int) { unit(u); });
  }
  pool.parallel_for(n_items, [&](int64_t b, int64_t e, int) {
    attn::Runner& run = attn::thread_runner();
    for (int64_t i = b; i < e; ++i) {
      run.begin(ctx, items[static_cast<size_t>(i)]);
      for (size_t u = unit_first[static_cast<size_t>(i)]; u < unit_first[static_cast<size_t>(i) + 1]; ++u)
        run.merge_partial(partials_.data() + static_cast<int64_t>(u) * stride);
      run.finish();
    }
  });
}

void attn::run_prefetched(Runner& run, const Span* spans, size_t n) {
  const ExecCtx& c = run.ctx();
  // The next spans are usually elsewhere in the pool (chosen pages, other blocks): their first
  // rows are asked for kAhead spans ahead, since scoring one small span (a 16-token page for a
  // GQA group) takes less time than a fetch from memory.
  constexpr size_t kAhead = 3;
  auto ask = [&](size_t j) {
    c.kv->prefetch(c.il, run.item().hk, spans[j].first, std::min<int64_t>(16, spans[j].count));
  };
  for (size_t j = 1; j < std::min(n, kAhead); ++j) ask(j);
  for (size_t j = 0; j < n; ++j) {
    if (j + kAhead < n) ask(j + kAhead);
    run.run(spans[j]);
  }
}

void attn::add_spans(std::vector<Span>& out, int64_t first, int64_t count, int64_t block_tokens, int var,
                     bool unrotate) {
  while (count > 0) {
    const int64_t in_block = std::min(count, block_tokens - first % block_tokens);
    out.push_back(Span{first, in_block, var, unrotate, ~uint64_t{0}});
    first += in_block;
    count -= in_block;
  }
}

namespace {

class DenseBackend final : public ExecBackend {
 public:
  DenseBackend(const AttnShape& s, int64_t split) : ExecBackend(s) { split_ = split; }
  std::string spec() const override { return split_ == kDefaultSplit ? "dense" : fmt::format("dense:split={}", split_); }
  AttentionCaps caps() const override { return exact_caps(); }
  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    run_dense(ctx, pool);
    return ok_status();
  }
  // Every row attends every visible token, so the kept log-sum-exp is the full softmax's.
  const float* row_lse() const override { return keep_lse_ && !lse_.empty() ? lse_.data() : nullptr; }
  bool supports_detached() const override { return true; }
};

}  // namespace

Expected<BackendPtr> make_dense(MethodSpec& spec, const AttnShape& s) {
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  LC_TRY(spec.finish());
  return BackendPtr(new DenseBackend(s, split));
}

}  // namespace lc
