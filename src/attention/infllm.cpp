// InfLLM (Xiao et al. 2024, "InfLLM: Training-Free Long-Context Extrapolation for LLMs with an
// Efficient Context Memory"): a query attends
//   * the first n_init tokens (sinks) and the local window (the last n_local tokens, plus the
//     not yet complete memory block) at their real positions, and
//   * the top-k memory blocks (blocks of `block` tokens between sinks and the local window),
//     retrieved once per chunk of `chunk` queries, "as if at a fixed distance": every distant
//     key is scored at relative distance n_local, rope(q, n_local) . rope(k, 0).
// Block relevance: sum over the chunk's queries q and the block's representative tokens r of
// q . r (the paper's sim(X, B)); by linearity, (sum q) . (sum r), both at the fixed distance.
// Representative tokens: the `reps` tokens of a block with the largest score k_m . sum q_j
// over the queries of the block's own tokens (a training-free stand-in for the paper's
// "attention received from the following local tokens", computed without rotation and kept
// as running sums, so it does not depend on how prefill is chunked). Memory blocks live in the
// paged cache (they may be spilled to disk with --kv-spill).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "attention/methods.h"
#include "kernels/kernels.h"

namespace lc {
namespace {

class InfLlmBackend final : public ExecBackend {
 public:
  InfLlmBackend(const AttnShape& s, int64_t n_init, int64_t n_local, int64_t block, int64_t reps,
                int64_t topk, int64_t chunk, int64_t split)
      : ExecBackend(s), n_init_(n_init), n_local_(n_local), block_(block), reps_(reps), topk_(topk),
        chunk_(chunk), heads_(static_cast<size_t>(s.n_layer * s.n_head_kv)) {
    split_ = split;
  }

  std::string spec() const override {
    std::string s = fmt::format("infllm:sinks={},local={},block={},reps={},topk={},chunk={}",
                                n_init_, n_local_, block_, reps_,
                                topk_, chunk_);
    if (split_ != kDefaultSplit) s += fmt::format(",split={}", split_);
    return s;
  }

  AttentionCaps caps() const override {
    AttentionCaps c{spec()};
    c.unrotates_keys = true;  // representatives, and memory blocks scored at the fixed distance
    return c;
  }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    fixed_.assign(static_cast<size_t>(n), static_cast<int32_t>(n_local_));
    add_variant(1, q, fixed_.data(), kv, ctx);
    const int64_t H = shape_.n_head, d = shape_.head_dim, g = H / shape_.n_head_kv;
    const int64_t n_sub = (n + chunk_ - 1) / chunk_;
    sel_.assign(static_cast<size_t>(n_sub * shape_.n_head_kv), {});
    mem_end_.assign(static_cast<size_t>(n_sub * shape_.n_head_kv), 0);
    const RopeTable& rt = kv.rope(il);

    pool.parallel_for(shape_.n_head_kv, [&](int64_t b, int64_t e, int) {
      std::vector<float> qs(static_cast<size_t>(d)), kbuf;
      std::vector<float> rel;
      std::vector<int32_t> order;
      for (int64_t hk = b; hk < e; ++hk) {
        HeadState& hs = heads_[static_cast<size_t>(il * shape_.n_head_kv + hk)];
        if (hs.epoch != kv.epoch(il, hk)) hs = HeadState{kv.epoch(il, hk)};
        const int64_t low = kv.take_low_water(il, hk);
        if (low != INT64_MAX) {
          // Truncated to `low` tokens: representatives of whole blocks below stay; the query
          // sums of the block cut in two restart (its kept tokens' queries are not separable).
          const int64_t keep = low > n_init_ ? (low - n_init_) / block_ : 0;
          hs.n_rep = std::min(hs.n_rep, keep);
          hs.rep.resize(static_cast<size_t>(hs.n_rep * d));
          if (static_cast<int64_t>(hs.qsum.size()) > keep * d) hs.qsum.resize(static_cast<size_t>(keep * d));
        }
        const int64_t N = kv.n_tokens(il, hk);
        // Running query sums of each block (for representatives), from this chunk's queries.
        for (int64_t t = 0; t < n; ++t) {
          const int64_t j = N - n + t;  // the query's own head index
          if (j < n_init_) continue;
          const int64_t m = (j - n_init_) / block_;
          if (static_cast<int64_t>(hs.qsum.size()) < (m + 1) * d) hs.qsum.resize(static_cast<size_t>((m + 1) * d), 0.0f);
          for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
            kernels::add_inplace(hs.qsum.data() + m * d, q + (t * H + h) * d, d);
        }
        for (int64_t s = 0; s < n_sub; ++s) {
          const int64_t t0 = s * chunk_, t1 = std::min(n, t0 + chunk_);
          const int64_t first_vis = N - n + t0 + 1;
          const int64_t local_start = std::max(n_init_, first_vis - n_local_);
          const int64_t n_mem = std::max<int64_t>(0, (local_start - n_init_) / block_);
          mem_end_[static_cast<size_t>(s * shape_.n_head_kv + hk)] = n_init_ + n_mem * block_;
          if (n_mem == 0) continue;
          while (hs.n_rep < n_mem) make_representative(kv, il, hk, hs, rt, kbuf);
          std::vector<int32_t>& chosen = sel_[static_cast<size_t>(s * shape_.n_head_kv + hk)];
          if (n_mem <= topk_) {
            chosen.resize(static_cast<size_t>(n_mem));
            std::iota(chosen.begin(), chosen.end(), 0);
            continue;
          }
          // Query summary at the fixed distance: rope is linear, so rotate the sum once.
          std::fill(qs.begin(), qs.end(), 0.0f);
          for (int64_t t = t0; t < t1; ++t)
            for (int64_t h = hk * g; h < (hk + 1) * g; ++h) kernels::add_inplace(qs.data(), q + (t * H + h) * d, d);
          const int32_t p = static_cast<int32_t>(n_local_);
          if (rt.n_rot > 0) rt.apply(qs.data(), 1, 1, d, &p);
          rel.resize(static_cast<size_t>(n_mem));
          for (int64_t m = 0; m < n_mem; ++m)
            rel[static_cast<size_t>(m)] = attn::dot(qs.data(), hs.rep.data() + m * d, d);
          order.resize(static_cast<size_t>(n_mem));
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(order.begin(), order.begin() + topk_, order.end(), [&](int32_t a, int32_t c) {
            return rel[static_cast<size_t>(a)] > rel[static_cast<size_t>(c)] ||
                   (rel[static_cast<size_t>(a)] == rel[static_cast<size_t>(c)] && a < c);
          });
          chosen.assign(order.begin(), order.begin() + topk_);
          std::sort(chosen.begin(), chosen.end());
        }
      }
    });

    const std::vector<attn::Item> items = attn::make_items(ctx, chunk_);
    const int64_t B = kv.block_tokens();
    spans_.resize(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const attn::Item& it = items[i];
      const size_t si = static_cast<size_t>((it.t0 / chunk_) * shape_.n_head_kv + it.hk);
      const int64_t max_vis = kv.n_tokens(il, it.hk) - n + it.t0 + it.nt;
      const int64_t mem_end = mem_end_[si];
      auto& sp = spans_[i];
      sp.clear();
      attn::add_spans(sp, 0, std::min(n_init_, max_vis), B);
      for (int32_t m : sel_[si]) attn::add_spans(sp, n_init_ + m * block_, block_, B, 1, true);
      if (max_vis > mem_end) attn::add_spans(sp, mem_end, max_vis - mem_end, B);
    }
    run_spans(ctx, items, spans_, pool);
    return ok_status();
  }

 private:
  struct HeadState {
    uint64_t epoch = ~uint64_t{0};
    int64_t n_rep = 0;          // memory blocks with a representative
    std::vector<float> qsum;    // [blocks, head_dim] pre-RoPE query sums of each block's tokens
    std::vector<float> rep;     // [n_rep, head_dim] sum of the representative keys, un-rotated
  };

  void make_representative(const KvCache& kv, int64_t il, int64_t hk, HeadState& hs, const RopeTable& rt,
                           std::vector<float>& kbuf) {
    const int64_t d = shape_.head_dim, m = hs.n_rep, first = n_init_ + m * block_;
    kbuf.resize(static_cast<size_t>(block_ * d));
    kv.read_keys(il, hk, first, block_, kbuf.data());
    attn::unrotate_rows(kbuf.data(), block_, d, kv.positions(il, hk) + first, rt);
    if (static_cast<int64_t>(hs.qsum.size()) < (m + 1) * d) hs.qsum.resize(static_cast<size_t>((m + 1) * d), 0.0f);
    std::vector<std::pair<float, int32_t>> sc(static_cast<size_t>(block_));
    for (int64_t j = 0; j < block_; ++j)
      sc[static_cast<size_t>(j)] = {attn::dot(kbuf.data() + j * d, hs.qsum.data() + m * d, d), static_cast<int32_t>(j)};
    const int64_t r = std::min(reps_, block_);
    std::partial_sort(sc.begin(), sc.begin() + r, sc.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    hs.rep.resize(static_cast<size_t>((m + 1) * d), 0.0f);
    float* dst = hs.rep.data() + m * d;
    std::fill(dst, dst + d, 0.0f);
    for (int64_t j = 0; j < r; ++j) kernels::add_inplace(dst, kbuf.data() + sc[static_cast<size_t>(j)].second * d, d);
    ++hs.n_rep;
  }

  int64_t n_init_, n_local_, block_, reps_, topk_, chunk_;
  std::vector<HeadState> heads_;              // [n_layer * n_head_kv]
  std::vector<int32_t> fixed_;                // [n] the fixed distance
  std::vector<std::vector<int32_t>> sel_;     // [n_sub * n_head_kv] chosen memory blocks
  std::vector<int64_t> mem_end_;              // [n_sub * n_head_kv]
  std::vector<std::vector<attn::Span>> spans_;  // [items] what each tile attends
};

}  // namespace

Expected<BackendPtr> make_infllm(MethodSpec& spec, const AttnShape& s) {
  int64_t n_init = 128, n_local = 4096, block = 128, reps = 4, topk = 16, chunk = 512;
  LC_TRY(spec.get_int("sinks", &n_init, 0, int64_t{1} << 30,
                      "first tokens, always attended at their real positions (initial tokens), tokens"));
  LC_TRY(spec.get_int("local", &n_local, 1, int64_t{1} << 30,
                      "most recent tokens, attended at their real positions; also the fixed distance at which "
                      "memory blocks are scored, tokens"));
  LC_TRY(spec.get_int("block", &block, 1, 65536, "tokens per memory block (the tokens between sinks and local)"));
  LC_TRY(spec.get_int("reps", &reps, 1, 65536, "representative tokens per block whose keys score it for retrieval"));
  LC_TRY(spec.get_int("topk", &topk, 0, 1 << 20,
                      "memory blocks retrieved per chunk of queries (0: sinks and local only), blocks"));
  LC_TRY(spec.get_int("chunk", &chunk, 1, 1 << 20, "queries that share one retrieval of memory blocks, tokens"));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  LC_TRY(spec.finish());
  return BackendPtr(new InfLlmBackend(s, n_init, n_local, block, reps, topk, chunk, split));
}

}  // namespace lc
