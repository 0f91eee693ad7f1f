// DSSA, Dense-Sparse Switchable Attention (InfLLM-v2; seed 002; Zhao et al., "InfLLM-V2:
// Dense-Sparse Switchable Attention for Seamless Short-to-Long Adaptation", arXiv 2509.24663),
// as the authors' inference code runs it (OpenBMB/infllmv2_cuda_impl with MiniCPM4's
// `compressed_attention` and CPM.cu's defaults): the model's own dense attention for short
// inputs, block-sparse attention beyond `switch` tokens, with no new parameters.
//   1. Semantic kernels: mean keys c_i over `kernel` tokens every `stride` tokens (post-RoPE).
//      A query sees the kernels that lie wholly inside its visible tokens.
//   2. Each query head h scores the kernels with a softmax over the ones it sees (the model's
//      score scale), p_h(i) = softmax_i(q_h . c_i); the GQA group sums them:
//      G(i) = sum_{h in group} p_h(i) (the stage-1 kernel, infllmv2_attn_stage1).
//   3. A block's score is the largest G(i) over the kernels that overlap it (max_pooling_1d;
//      with kernel = 2 x stride that is the authors' pooling window of block/stride + 1
//      kernels from one before the block's first).
//   4. The initial blocks (`sinks` tokens, rounded up to blocks) score +inf and count towards
//      `topk`; the local window (the query's own block and the ones before it, `local` tokens
//      in whole blocks) is attended anyway. A query attends the initial blocks, the best
//      topk - (initial blocks) other blocks before its window (ties: the lower block), and
//      its window. The whole GQA group shares the choice; each query token makes its own.
// Queries that see no more than `switch` tokens attend densely.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/methods.h"
#include "kernels/kernels.h"

namespace lc {
namespace {

class DssaBackend final : public ExecBackend {
 public:
  DssaBackend(const AttnShape& s, int64_t sw, int64_t block, int64_t kernel, int64_t stride, int64_t topk,
              int64_t sinks, int64_t local)
      : ExecBackend(s), switch_(sw), block_(block), kernel_(kernel), stride_(stride), topk_(topk),
        init_end_((sinks + block - 1) / block * block), sinks_(sinks), local_(local),
        local_blocks_((local + block - 1) / block),
        heads_(static_cast<size_t>(s.n_layer * s.n_head_kv)) {}

  std::string spec() const override {
    return fmt::format("dssa:switch={},block={},kernel={},stride={},topk={},sinks={},local={}",
                       switch_, block_, kernel_, stride_,
                       topk_, sinks_, local_);
  }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    if (kv.n_tokens(il, 0) <= switch_) {  // short: the dense path, nothing to maintain yet
      bool all_short = true;
      for (int64_t h = 0; h < shape_.n_head_kv; ++h) all_short = all_short && kv.n_tokens(il, h) <= switch_;
      if (all_short) {
        run_dense(ctx, pool);
        return ok_status();
      }
    }
    pool.parallel_for(shape_.n_head_kv, [&](int64_t b, int64_t e, int) {
      for (int64_t hk = b; hk < e; ++hk) update_kernels(kv, il, hk);
    });
    const std::vector<attn::Item> items = attn::make_items(ctx);
    const int64_t d = shape_.head_dim;
    pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
      attn::Runner& run = attn::thread_runner();
      thread_local std::vector<float> ks;        // [rows, n_kernels] scores, then probabilities
      thread_local std::vector<float> gs;        // [n_kernels] the group's summed probabilities
      thread_local std::vector<float> bs;        // [n_blocks]
      thread_local std::vector<int32_t> order;
      thread_local std::vector<uint64_t> mask;   // [n_blocks]
      int64_t lower[attn::kMaxRows];
      const int64_t n_init_blocks = init_end_ / block_;
      const int64_t slots = std::max<int64_t>(0, topk_ - n_init_blocks);  // the initial blocks count in topk
      for (int64_t i = b; i < e; ++i) {
        const attn::Item& it = items[static_cast<size_t>(i)];
        run.begin(ctx, it);
        const HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + it.hk)];
        const int64_t rows = run.rows(), g = it.g;
        const int64_t max_vis = run.vis(rows - 1);
        const int64_t n_blocks = (max_vis + block_ - 1) / block_;
        const int64_t nk = hs.n_kernels;
        ks.resize(static_cast<size_t>(rows * std::max<int64_t>(nk, 1)));
        gs.resize(static_cast<size_t>(std::max<int64_t>(nk, 1)));
        for (int64_t k = 0; k < nk; ++k) {  // kernels outer, rows inner
          const float* c = hs.means.data() + k * d;
          for (int64_t r = 0; r < rows; ++r)
            ks[static_cast<size_t>(r * nk + k)] =
                attn::dot(ctx.var[0].q + (run.token_of(r) * shape_.n_head + run.head_of(r)) * d, c, d);
        }
        mask.assign(static_cast<size_t>(n_blocks), 0);
        bs.resize(static_cast<size_t>(n_blocks));
        for (int64_t tt = 0; tt < it.nt; ++tt) {
          const int64_t vis = run.vis(tt * g);
          const int64_t q_block = (vis - 1) / block_;
          const int64_t lb = std::max(init_end_, (q_block - local_blocks_ + 1) * block_);
          lower[tt] = std::min(lb, vis);
          const int64_t b0 = n_init_blocks, b1 = lb / block_;  // candidates [b0, b1)
          uint64_t token_rows = 0;
          for (int64_t j = 0; j < g; ++j) token_rows |= uint64_t{1} << (tt * g + j);
          if (b1 <= b0) continue;
          if (vis <= switch_ || b1 - b0 <= slots) {
            for (int64_t bb = b0; bb < b1; ++bb) mask[static_cast<size_t>(bb)] |= token_rows;
            continue;
          }
          // The kernels this token sees: wholly inside its visible tokens.
          const int64_t nk_vis = std::min(nk, vis >= kernel_ ? (vis - kernel_) / stride_ + 1 : 0);
          std::fill(gs.begin(), gs.begin() + nk_vis, 0.0f);
          for (int64_t j = 0; j < g; ++j) {  // softmax per query head, summed over the group
            float* row = ks.data() + (tt * g + j) * nk;
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t k = 0; k < nk_vis; ++k) mx = std::max(mx, row[k]);
            float sum = 0.0f;
            for (int64_t k = 0; k < nk_vis; ++k) sum += row[k] = std::exp(row[k] - mx);
            const float inv = 1.0f / sum;
            for (int64_t k = 0; k < nk_vis; ++k) gs[static_cast<size_t>(k)] += row[k] * inv;
          }
          for (int64_t bb = b0; bb < b1; ++bb) {
            // Kernels overlapping [bb*block, (bb+1)*block) that the token sees.
            const int64_t k0 = std::max<int64_t>(0, (bb * block_ - kernel_ + stride_) / stride_);
            const int64_t k1 = std::min(nk_vis, ((bb + 1) * block_ - 1) / stride_ + 1);
            bs[static_cast<size_t>(bb)] = k1 <= k0 ? -std::numeric_limits<float>::infinity()
                                                   : *std::max_element(gs.begin() + k0, gs.begin() + k1);
          }
          order.resize(static_cast<size_t>(b1 - b0));
          for (int64_t bb = b0; bb < b1; ++bb) order[static_cast<size_t>(bb - b0)] = static_cast<int32_t>(bb);
          const float* sc = bs.data();
          std::partial_sort(order.begin(), order.begin() + slots, order.end(), [sc](int32_t a, int32_t c) {
            return sc[a] > sc[c] || (sc[a] == sc[c] && a < c);
          });
          for (int64_t j = 0; j < slots; ++j) mask[static_cast<size_t>(order[static_cast<size_t>(j)])] |= token_rows;
        }
        run.run_range(0, std::min(init_end_, max_vis), 0, false, run.all_rows());
        for (int64_t bb = 0; bb < n_blocks; ++bb)
          if (mask[static_cast<size_t>(bb)])
            run.run_range(bb * block_, block_, 0, false, mask[static_cast<size_t>(bb)]);
        run.run_windows(lower, 0);
        run.finish();
      }
    });
    return ok_status();
  }

 private:
  struct HeadState {
    uint64_t epoch = ~uint64_t{0};
    int64_t n_kernels = 0;
    std::vector<float> means;  // [n_kernels, head_dim] mean post-RoPE keys
    std::vector<float> rows;   // [kernel, head_dim] scratch
  };

  void update_kernels(KvCache& kv, int64_t il, int64_t hk) {
    HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + hk)];
    const int64_t low = kv.take_low_water(il, hk);  // truncated: kernels below stay valid
    if (low != INT64_MAX) hs.n_kernels = std::min(hs.n_kernels, low >= kernel_ ? (low - kernel_) / stride_ + 1 : 0);
    if (hs.epoch != kv.epoch(il, hk)) {
      hs.epoch = kv.epoch(il, hk);
      hs.n_kernels = 0;
    }
    const int64_t d = shape_.head_dim, N = kv.n_tokens(il, hk);
    const int64_t want = N >= kernel_ ? (N - kernel_) / stride_ + 1 : 0;
    hs.means.resize(static_cast<size_t>(std::max(want, hs.n_kernels) * d));
    hs.rows.resize(static_cast<size_t>(kernel_ * d));
    for (int64_t k = hs.n_kernels; k < want; ++k) {
      kv.read_keys(il, hk, k * stride_, kernel_, hs.rows.data());
      float* m = hs.means.data() + k * d;
      std::fill(m, m + d, 0.0f);
      for (int64_t j = 0; j < kernel_; ++j) kernels::add_inplace(m, hs.rows.data() + j * d, d);
      kernels::scale_inplace(m, 1.0f / static_cast<float>(kernel_), d);
    }
    hs.n_kernels = want;
  }

  int64_t switch_, block_, kernel_, stride_, topk_, init_end_, sinks_, local_, local_blocks_;
  std::vector<HeadState> heads_;  // [n_layer * n_head_kv]
};

}  // namespace

Expected<BackendPtr> make_dssa(MethodSpec& spec, const AttnShape& s) {
  // The authors' configuration (MiniCPM4's sparse_config, CPM.cu's defaults): dense up to 8,192
  // tokens, 64-token blocks, kernels of 32 every 16, top-64 blocks with one initial block
  // among them, and a 2,048-token (32-block) local window.
  int64_t sw = 8192, block = 64, kernel = 32, stride = 16, topk = 64, sinks = 64, local = 2048;
  LC_TRY(spec.get_int("switch", &sw, 0, int64_t{1} << 40,
                      "a query that sees at most this many tokens attends densely, beyond it block-sparse, tokens"));
  LC_TRY(spec.get_int("block", &block, 1, 65536, "tokens per block, the unit of sparse selection"));
  LC_TRY(spec.get_int("kernel", &kernel, 1, 65536,
                      "tokens per semantic kernel, a mean key that scores the blocks it overlaps"));
  LC_TRY(spec.get_int("stride", &stride, 1, 65536, "tokens between the starts of consecutive kernels"));
  LC_TRY(spec.get_int("topk", &topk, 1, 1 << 20,
                      "blocks a query attends besides its local window, the initial ones included, chosen per "
                      "GQA group"));
  LC_TRY(spec.get_int("sinks", &sinks, 0, int64_t{1} << 30,
                      "first tokens, always attended (rounded up to whole blocks), tokens"));
  LC_TRY(spec.get_int("local", &local, 1, int64_t{1} << 30,
                      "most recent tokens, always attended, in whole blocks: the query's own block and the ones "
                      "before it, tokens"));
  LC_TRY(spec.finish());
  return BackendPtr(new DssaBackend(s, sw, block, kernel, stride, topk, sinks, local));
}

}  // namespace lc
