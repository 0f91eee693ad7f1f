// InfLLM (Xiao et al. 2024, "InfLLM: Training-Free Long-Context Extrapolation for LLMs with an
// Efficient Context Memory"), laid out as its reference code (thunlp/InfLLM,
// inf_llm/attention/context_manager.py) reads the cache. A call's queries go in sub-chunks of
// `chunk` (exc_block_size). Each query reads
//   * its local window: its last n_local tokens, at their real positions (a sliding window);
//   * the global part, every key scored "as if at a fixed distance", rope(q, n_local) .
//     rope(k, 0): the first n_init tokens (sinks), the top-k memory blocks chosen for its
//     sub-chunk, and the remainder (tokens after the last memory block), each only where it
//     is older than the query's window (complement_sliding_window).
// Memory blocks are `block` tokens from n_init on; block m exists before a sub-chunk whose
// queries follow P tokens when n_init + (m + 1) * block <= P - n_local (append_global moves a
// block out of the remainder once the tokens after it still fill the local window).
// Block relevance, once per layer and sub-chunk as calc_block_topk does over every head: the
// sum over KV heads of (sum of the sub-chunk's queries of the group, rotated at n_local) .
// (sum of the block's representative keys, un-rotated); the top-k, ties to the lower block.
// Representative tokens differ from the paper's: InfLLM keeps the `reps` tokens that received
// the most attention from the local window's queries; here they are the `reps` tokens with the
// largest k_m . (sum of the queries of the block's own tokens), computed without rotation and
// kept as running sums, so they do not depend on how prefill is chunked and need no attention
// scores. Memory blocks live in the paged cache (they may be spilled to disk with --kv-spill).
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
    const int64_t H = shape_.n_head, d = shape_.head_dim, Hkv = shape_.n_head_kv, g = H / Hkv;
    const int64_t N = kv.n_tokens(il, 0);
    for (int64_t h = 1; h < Hkv; ++h)
      if (kv.n_tokens(il, h) != N)
        return make_error("infllm: the KV heads of a layer must hold the same tokens (blocks are chosen per layer)");
    const int64_t n_sub = (n + chunk_ - 1) / chunk_;
    // Memory blocks formed before sub-chunk s: InfLLM moves a block out of its remainder once
    // the tokens after it still fill the local window, i.e. block m exists when
    // n_init + (m + 1) * block <= (tokens before the sub-chunk) - n_local.
    auto n_mem_of = [&](int64_t s) {
      const int64_t past = N - n + s * chunk_ - n_local_ - n_init_;
      return past > 0 ? past / block_ : int64_t{0};
    };
    const int64_t m_max = n_mem_of(n_sub - 1);
    sel_.assign(static_cast<size_t>(n_sub), {});
    rel_.assign(static_cast<size_t>(n_sub * Hkv * std::max<int64_t>(m_max, 1)), 0.0f);
    const RopeTable& rt = kv.rope(il);

    pool.parallel_for(Hkv, [&](int64_t b, int64_t e, int) {
      std::vector<float> qs(static_cast<size_t>(d)), kbuf;
      for (int64_t hk = b; hk < e; ++hk) {
        HeadState& hs = heads_[static_cast<size_t>(il * Hkv + hk)];
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
        // Running query sums of each block (for representatives), from this call's queries.
        for (int64_t t = 0; t < n; ++t) {
          const int64_t j = N - n + t;  // the query's own head index
          if (j < n_init_) continue;
          const int64_t m = (j - n_init_) / block_;
          if (static_cast<int64_t>(hs.qsum.size()) < (m + 1) * d) hs.qsum.resize(static_cast<size_t>((m + 1) * d), 0.0f);
          for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
            kernels::add_inplace(hs.qsum.data() + m * d, q + (t * H + h) * d, d);
        }
        for (int64_t s = 0; s < n_sub; ++s) {
          const int64_t n_mem = n_mem_of(s);
          while (hs.n_rep < n_mem) make_representative(kv, il, hk, hs, rt, kbuf);
          if (n_mem <= topk_) continue;
          // The group's query sum at the fixed distance (rope is linear: rotate the sum once)
          // against each block's representative sum.
          const int64_t t0 = s * chunk_, t1 = std::min(n, t0 + chunk_);
          std::fill(qs.begin(), qs.end(), 0.0f);
          for (int64_t t = t0; t < t1; ++t)
            for (int64_t h = hk * g; h < (hk + 1) * g; ++h) kernels::add_inplace(qs.data(), q + (t * H + h) * d, d);
          const int32_t p = static_cast<int32_t>(n_local_);
          if (rt.n_rot > 0) rt.apply(qs.data(), 1, 1, d, &p);
          float* rel = rel_.data() + (s * Hkv + hk) * m_max;
          for (int64_t m = 0; m < n_mem; ++m) rel[m] = attn::dot(qs.data(), hs.rep.data() + m * d, d);
        }
      }
    });
    // One choice per layer and sub-chunk, as InfLLM's (its blocks' representative vectors span
    // every head): the blocks' relevance summed over the KV heads.
    std::vector<float> tot;
    std::vector<int32_t> order;
    for (int64_t s = 0; s < n_sub; ++s) {
      const int64_t n_mem = n_mem_of(s);
      std::vector<int32_t>& chosen = sel_[static_cast<size_t>(s)];
      order.resize(static_cast<size_t>(n_mem));
      std::iota(order.begin(), order.end(), 0);
      if (n_mem <= topk_) {
        chosen = order;
        continue;
      }
      tot.assign(static_cast<size_t>(n_mem), 0.0f);
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        const float* rel = rel_.data() + (s * Hkv + hk) * m_max;
        for (int64_t m = 0; m < n_mem; ++m) tot[static_cast<size_t>(m)] += rel[m];
      }
      std::partial_sort(order.begin(), order.begin() + topk_, order.end(), [&](int32_t a, int32_t c) {
        return tot[static_cast<size_t>(a)] > tot[static_cast<size_t>(c)] ||
               (tot[static_cast<size_t>(a)] == tot[static_cast<size_t>(c)] && a < c);
      });
      chosen.assign(order.begin(), order.begin() + topk_);
      std::sort(chosen.begin(), chosen.end());
    }

    // What each query reads: its local window, the last n_local tokens at their real positions
    // (a sliding window); and, at the fixed distance, the initial tokens, the chosen blocks and
    // the remainder (tokens past the last memory block), all only where they are older than
    // its window.
    const std::vector<attn::Item> items = attn::make_items(ctx, chunk_);
    const int64_t B = kv.block_tokens();
    spans_.resize(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const attn::Item& it = items[i];
      const int64_t s = it.t0 / chunk_;
      const int64_t vis0 = N - n + it.t0 + 1, vis1 = vis0 + it.nt - 1;  // first and last token's
      const uint64_t token_mask = (uint64_t{1} << it.g) - 1;
      auto rows_from = [&](int64_t tt) {  // rows of tokens tt.. of the item
        uint64_t m = 0;
        for (int64_t u = std::max<int64_t>(tt, 0); u < it.nt; ++u) m |= token_mask << (u * it.g);
        return m;
      };
      auto rows_to = [&](int64_t tt) {  // rows of tokens ..tt
        uint64_t m = 0;
        for (int64_t u = 0; u <= std::min(tt, it.nt - 1); ++u) m |= token_mask << (u * it.g);
        return m;
      };
      auto& sp = spans_[i];
      sp.clear();
      // Global part: keys j of S = [0, n_init) + chosen blocks + [mem_end, inf), for the rows
      // whose window starts after j (U_t = vis_t - n_local > j).
      const int64_t u0 = vis0 - n_local_, u1 = vis1 - n_local_;
      const int64_t mem_end = n_init_ + n_mem_of(s) * block_;
      auto global = [&](int64_t a, int64_t b) {  // S's interval [a, b)
        const int64_t all_end = std::min(b, u0);
        if (all_end > a) attn::add_spans(sp, a, all_end - a, B, 1, true);
        for (int64_t j = std::max(a, u0); j < std::min(b, u1); ++j)
          sp.push_back(attn::Span{j, 1, 1, true, rows_from(j - u0 + 1)});
      };
      global(0, std::min(n_init_, mem_end));
      for (int32_t m : sel_[static_cast<size_t>(s)]) global(n_init_ + m * block_, n_init_ + (m + 1) * block_);
      global(mem_end, u1);
      // Local part: key j is in token tt's window when vis_tt - n_local <= j.
      const int64_t l0 = std::max<int64_t>(0, u0), l1 = std::max<int64_t>(0, u1);
      for (int64_t j = l0; j < l1; ++j) sp.push_back(attn::Span{j, 1, 0, false, rows_to(j - u0)});
      attn::add_spans(sp, l1, vis1 - l1, B);
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
  std::vector<std::vector<int32_t>> sel_;     // [n_sub] chosen memory blocks (per layer)
  std::vector<float> rel_;                    // [n_sub, n_head_kv, blocks] relevance per KV head
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
