// Dense attention over the paged cache: softmax(q K^T / sqrt(d)) V, computed tile by tile with
// an online softmax (FlashAttention, Dao et al. 2022: m' = max(m, max_j s_j),
// l' = l e^{m-m'} + sum_j e^{s_j-m'}, o' = o e^{m-m'} + sum_j e^{s_j-m'} v_j), so no n x n
// score matrix exists. A tile is up to 64 query rows (tokens x the heads of one GQA group)
// against one KV block: each block is loaded once per tile. The default method.
#include <cstring>

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
  if (record_) {
    selection_ = Selection{il, n, shape_.n_head, {}};
    selection_.keys.assign(static_cast<size_t>(n * shape_.n_head), {});
    ctx.sel = &selection_;
  }
  add_variant(0, q, pos, kv, ctx);
  return Status::ok();
}

void ExecBackend::add_variant(int v, const float* q, const int32_t* qpos, const KvCache& kv, attn::ExecCtx& ctx) {
  const size_t need = static_cast<size_t>(ctx.n * ctx.n_head * ctx.d);
  if (qbuf_[v].size() < need) qbuf_[v].resize(need);
  qpos_[v].assign(qpos, qpos + ctx.n);
  attn::prepare_queries(q, ctx.n, ctx.n_head, ctx.d, kv.rope(ctx.il), qpos_[v].data(), shape_.scale,
                        qbuf_[v].data());
  ctx.var[v] = attn::QueryVariant{qbuf_[v].data(), qpos_[v].data()};
}

void ExecBackend::run_dense(const attn::ExecCtx& ctx, ThreadPool& pool) {
  const std::vector<attn::Item> items = attn::make_items(ctx);
  const int64_t B = ctx.kv->block_tokens();
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
    attn::Runner& run = attn::thread_runner();
    for (int64_t i = b; i < e; ++i) {
      run.begin(ctx, items[static_cast<size_t>(i)]);
      const int64_t last_vis = run.vis(run.rows() - 1);  // the tile's last token sees the most
      for (int64_t first = 0; first < last_vis; first += B)
        run.run(attn::Span{first, std::min(B, last_vis - first), 0, false, run.all_rows()});
      run.finish();
    }
  });
}

namespace {

class DenseBackend final : public ExecBackend {
 public:
  explicit DenseBackend(const AttnShape& s) : ExecBackend(s) {}
  std::string spec() const override { return "dense"; }
  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    run_dense(ctx, pool);
    return Status::ok();
  }
};

}  // namespace

Expected<BackendPtr> make_dense(MethodSpec& spec, const AttnShape& s) {
  LC_TRY(spec.finish());
  return BackendPtr(new DenseBackend(s));
}

}  // namespace lc
