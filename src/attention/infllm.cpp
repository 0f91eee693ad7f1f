// InfLLM (Xiao et al. 2024, "InfLLM: Training-Free Long-Context Extrapolation for LLMs with an
// Efficient Context Memory"), laid out as its reference code (thunlp/InfLLM,
// inf_llm/attention/context_manager.py) reads the cache. A call's queries go in sub-chunks of
// `chunk` (exc_block_size), one after another. Each query reads
//   * its local window: its last n_local tokens, at their real positions (a sliding window);
//   * the global part, every key scored "as if at a fixed distance", rope(q, n_local) .
//     rope(k, 0): the first n_init tokens (sinks), the top-k memory blocks chosen for its
//     sub-chunk, and the remainder (tokens after the last memory block), each only where it
//     is older than the query's window (complement_sliding_window).
// Memory blocks are `block` tokens from n_init on; block m exists before a sub-chunk whose
// queries follow P tokens when n_init + (m + 1) * block <= P - n_local (append_global moves a
// block out of the remainder once the tokens after it still fill the local window).
// Representative tokens (repr=attention, the reference's get_block_k): while a token waits in the
// remainder, every query whose local window holds it adds, per query head, its final softmax
// probability on it (one softmax over the local and global keys together: torch_impl.py's
// finalize, local part); when the block becomes memory, each query head keeps its `reps`
// highest-scoring tokens (ties: the lower token) and the block's key for that head is their
// (un-rotated) keys' sum (the reference's mean, up to a constant factor).
// Block relevance, once per layer and sub-chunk as calc_block_topk does over every head: the sum
// over query heads of (sum of the sub-chunk's queries, rotated at n_local) . (the head's
// representative key); the top-k, ties to the lower block.
// repr=qsum (the project's earlier rule, cheaper: no second pass over the local window): the
// `reps` tokens with the largest k . (sum of the queries of the block's own tokens over the GQA
// group), the same for every head of the group, kept as running sums (independent of chunking).
// Memory blocks live in the paged cache (they may be spilled to disk with --kv-spill).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "attention/methods.h"
#include "kernels/kernels.h"

namespace lc {
namespace {

enum class Repr { kAttention, kQuerySum };

class InfLlmBackend final : public ExecBackend {
 public:
  InfLlmBackend(const AttnShape& s, int64_t n_init, int64_t n_local, int64_t block, int64_t reps,
                int64_t topk, int64_t chunk, Repr repr, int64_t split)
      : ExecBackend(s), n_init_(n_init), n_local_(n_local), block_(block), reps_(reps), topk_(topk),
        chunk_(chunk), repr_(repr), heads_(static_cast<size_t>(s.n_layer * s.n_head_kv)) {
    split_ = split;
  }

  std::string spec() const override {
    std::string s = fmt::format("infllm:sinks={},local={},block={},reps={},topk={},chunk={}",
                                n_init_, n_local_, block_, reps_,
                                topk_, chunk_);
    if (repr_ == Repr::kQuerySum) s += ",repr=qsum";
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
    if (repr_ == Repr::kAttention) {  // each row's log-sum-exp: the normaliser of the scores
      lse_.assign(static_cast<size_t>(n * H), -std::numeric_limits<float>::infinity());
      ctx.lse = lse_.data();
    }
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
      for (int64_t hk = b; hk < e; ++hk) {
        HeadState& hs = heads_[static_cast<size_t>(il * Hkv + hk)];
        if (hs.epoch != kv.epoch(il, hk)) {
          hs = HeadState{kv.epoch(il, hk)};
          hs.score_first = n_init_;
        }
        const int64_t low = kv.take_low_water(il, hk);
        if (low != INT64_MAX) cut(hs, low, g);
        if (repr_ == Repr::kQuerySum) {
          // Running query sums of each block, from this call's queries.
          for (int64_t t = 0; t < n; ++t) {
            const int64_t j = N - n + t;  // the query's own head index
            if (j < n_init_) continue;
            const int64_t m = (j - n_init_) / block_;
            if (static_cast<int64_t>(hs.qsum.size()) < (m + 1) * d) hs.qsum.resize(static_cast<size_t>((m + 1) * d), 0.0f);
            for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
              kernels::add_inplace(hs.qsum.data() + m * d, q + (t * H + h) * d, d);
          }
        } else {
          // A score slot per query head for every token from score_first on.
          if (N > hs.score_first && static_cast<int64_t>(hs.score.size()) < (N - hs.score_first) * g)
            hs.score.resize(static_cast<size_t>((N - hs.score_first) * g), 0.0f);
        }
      }
    });

    const std::vector<attn::Item> items = attn::make_items(ctx, chunk_);
    const int64_t B = kv.block_tokens();
    std::vector<float> tot;
    std::vector<int32_t> order;
    for (int64_t s = 0; s < n_sub; ++s) {
      const int64_t n_mem = n_mem_of(s), t0 = s * chunk_, t1 = std::min(n, t0 + chunk_);
      // The blocks formed before this sub-chunk get their representatives, and, when there are
      // more than topk, their relevance to its queries.
      pool.parallel_for(Hkv, [&](int64_t b, int64_t e, int) {
        thread_local std::vector<float> qs, kbuf;  // per worker, kept between forwards
        qs.resize(static_cast<size_t>(d));
        for (int64_t hk = b; hk < e; ++hk) {
          HeadState& hs = heads_[static_cast<size_t>(il * Hkv + hk)];
          while (hs.n_rep < n_mem) make_representative(kv, il, hk, hs, rt, g, kbuf);
          if (n_mem <= topk_) continue;
          float* rel = rel_.data() + (s * Hkv + hk) * m_max;
          std::fill(rel, rel + n_mem, 0.0f);
          const int32_t p = static_cast<int32_t>(n_local_);
          for (int64_t u = 0; u < g; ++u) {
            // The head's query sum at the fixed distance (rope is linear: rotate the sum once).
            std::fill(qs.begin(), qs.end(), 0.0f);
            for (int64_t t = t0; t < t1; ++t) kernels::add_inplace(qs.data(), q + (t * H + hk * g + u) * d, d);
            if (rt.n_rot > 0) rt.apply(qs.data(), 1, 1, d, &p);
            for (int64_t m = 0; m < n_mem; ++m) rel[m] += attn::dot(qs.data(), hs.rep.data() + (m * g + u) * d, d);
          }
        }
      });
      // One choice per layer and sub-chunk, as InfLLM's (its blocks' representative vectors
      // span every head): the blocks' relevance summed over the KV heads.
      std::vector<int32_t>& chosen = sel_[static_cast<size_t>(s)];
      order.resize(static_cast<size_t>(n_mem));
      std::iota(order.begin(), order.end(), 0);
      if (n_mem <= topk_) {
        chosen = order;
      } else {
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

      // What each query of the sub-chunk reads: its local window, the last n_local tokens at
      // their real positions (a sliding window); and, at the fixed distance, the initial
      // tokens, the chosen blocks and the remainder (tokens past the last memory block), all
      // only where they are older than its window.
      items_.clear();
      for (const attn::Item& it : items)
        if (it.t0 >= t0 && it.t0 < t1) items_.push_back(it);
      spans_.resize(items_.size());
      const int64_t mem_end = n_init_ + n_mem * block_;
      for (size_t i = 0; i < items_.size(); ++i) {
        const attn::Item& it = items_[i];
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
        auto global = [&](int64_t a, int64_t b) {  // S's interval [a, b)
          const int64_t all_end = std::min(b, u0);
          if (all_end > a) attn::add_spans(sp, a, all_end - a, B, 1, true);
          for (int64_t j = std::max(a, u0); j < std::min(b, u1); ++j)
            sp.push_back(attn::Span{j, 1, 1, true, rows_from(j - u0 + 1)});
        };
        global(0, std::min(n_init_, mem_end));
        for (int32_t m : chosen) global(n_init_ + m * block_, n_init_ + (m + 1) * block_);
        global(mem_end, u1);
        // Local part: key j is in token tt's window when vis_tt - n_local <= j.
        const int64_t l0 = std::max<int64_t>(0, u0), l1 = std::max<int64_t>(0, u1);
        for (int64_t j = l0; j < l1; ++j) sp.push_back(attn::Span{j, 1, 0, false, rows_to(j - u0)});
        attn::add_spans(sp, l1, vis1 - l1, B);
      }
      run_spans(ctx, items_, spans_, pool);
      if (repr_ == Repr::kAttention) add_scores(ctx, kv, il, N, t0, t1, pool);
    }
    return ok_status();
  }

 private:
  struct HeadState {
    uint64_t epoch = ~uint64_t{0};
    int64_t n_rep = 0;          // memory blocks with representatives
    std::vector<float> rep;     // [n_rep, group, head_dim] each query head's representative key sum, un-rotated
    std::vector<float> qsum;    // repr=qsum: [blocks, head_dim] pre-RoPE query sums of each block's tokens
    // repr=attention: [tokens from score_first, group] the attention each token received from
    // the queries whose local window held it, per query head. The scores of the last
    // kept_blocks() memory blocks stay (a cut may put them back into the remainder).
    std::vector<float> score;
    int64_t score_first = -1;  // set with the state (n_init)
  };

  static constexpr int64_t kScoreKeys = 256;  // keys per unit of the score pass
  // Memory blocks whose scores are kept: a cut into the last n_local tokens puts at most these
  // back into the remainder.
  int64_t kept_blocks() const { return (n_local_ + block_ - 1) / block_ + 1; }

  // Adds, for the queries [t0, t1) of the call just attended, each query head's final softmax
  // probability on every key of its local window (from n_init on) to that key's score. Units of
  // (KV head, kScoreKeys keys) write disjoint scores.
  void add_scores(const attn::ExecCtx& ctx, const KvCache& kv, int64_t il, int64_t N, int64_t t0, int64_t t1,
                  ThreadPool& pool) {
    const int64_t H = shape_.n_head, d = shape_.head_dim, Hkv = shape_.n_head_kv, g = H / Hkv, n = ctx.n;
    const int64_t first = std::max(n_init_, N - n + t0 + 1 - n_local_), end = N - n + t1;
    if (end <= first) return;
    const int64_t per_head = (end - first + kScoreKeys - 1) / kScoreKeys;
    pool.parallel_for(Hkv * per_head, [&](int64_t b, int64_t e, int) {
      thread_local std::vector<float> kbuf, pbuf;
      kbuf.resize(static_cast<size_t>(kScoreKeys * d));
      pbuf.resize(static_cast<size_t>(kScoreKeys));
      for (int64_t unit = b; unit < e; ++unit) {
        const int64_t hk = unit / per_head, j0 = first + (unit % per_head) * kScoreKeys;
        const int64_t j1 = std::min(end, j0 + kScoreKeys);
        HeadState& hs = heads_[static_cast<size_t>(il * Hkv + hk)];
        const int64_t base = hs.score_first;
        kv.read_keys(il, hk, j0, j1 - j0, kbuf.data());
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t i = N - n + t;  // the query's token; its window is (i - n_local, i]
          const int64_t lo = std::max({j0, i + 1 - n_local_, base}), hi = std::min(j1, i + 1);
          for (int64_t h = hk * g; h < (hk + 1) * g; ++h) {
            const float* qv = ctx.var[0].q + (t * H + h) * d;
            const float l = ctx.lse[t * H + h];
            if (hi <= lo) continue;
            kernels::dot_rows_f32(qv, kbuf.data() + (lo - j0) * d, hi - lo, d, pbuf.data());
            kernels::exp_sub_sum(pbuf.data(), hi - lo, l);
            float* sc = hs.score.data() + (h - hk * g);
            for (int64_t j = lo; j < hi; ++j) sc[(j - base) * g] += pbuf[static_cast<size_t>(j - lo)];
          }
        }
      }
    });
  }

  // The cache was cut to `low` tokens. qsum: representatives of whole blocks below stay, and the
  // query sums of the blocks cut off go. attention: the memory blocks a run of the first `low`
  // tokens would have (n_init + (m + 1) * block <= low - n_local) keep their representatives,
  // whose scores came from queries before `low` only; later blocks go back to the remainder
  // with their tokens' scores (kept for that), and the scores of the tokens cut off go. The
  // tokens that stay keep what the cut queries added: the queries are not kept, so it cannot be
  // taken back, and later choices can differ slightly from a run that never saw them.
  void cut(HeadState& hs, int64_t low, int64_t g) {
    const int64_t d = shape_.head_dim;
    if (repr_ == Repr::kQuerySum) {
      const int64_t keep = low > n_init_ ? (low - n_init_) / block_ : 0;
      hs.n_rep = std::min(hs.n_rep, keep);
      hs.rep.resize(static_cast<size_t>(hs.n_rep * g * d));
      if (static_cast<int64_t>(hs.qsum.size()) > keep * d) hs.qsum.resize(static_cast<size_t>(keep * d));
      return;
    }
    const int64_t formed = low - n_local_ - n_init_ > 0 ? (low - n_local_ - n_init_) / block_ : 0;
    hs.n_rep = std::min(hs.n_rep, formed);
    hs.rep.resize(static_cast<size_t>(hs.n_rep * g * d));
    const int64_t first = n_init_ + hs.n_rep * block_;  // the remainder's first token now
    if (first < hs.score_first) {  // a deep cut: scores older than the kept ones start from 0
      hs.score.insert(hs.score.begin(), static_cast<size_t>((hs.score_first - first) * g), 0.0f);
      hs.score_first = first;
    }
    const int64_t keep_tokens = std::max<int64_t>(0, low - hs.score_first);
    if (static_cast<int64_t>(hs.score.size()) > keep_tokens * g) hs.score.resize(static_cast<size_t>(keep_tokens * g));
  }

  void make_representative(const KvCache& kv, int64_t il, int64_t hk, HeadState& hs, const RopeTable& rt, int64_t g,
                           std::vector<float>& kbuf) {
    const int64_t d = shape_.head_dim, m = hs.n_rep, first = n_init_ + m * block_;
    kbuf.resize(static_cast<size_t>(block_ * d));
    kv.read_keys(il, hk, first, block_, kbuf.data());
    attn::unrotate_rows(kbuf.data(), block_, d, kv.positions(il, hk) + first, rt);
    hs.rep.resize(static_cast<size_t>((m + 1) * g * d), 0.0f);
    const int64_t r = std::min(reps_, block_);
    std::vector<std::pair<float, int32_t>> sc(static_cast<size_t>(block_));
    auto top_sum = [&](float* dst) {  // dst = the sum of the keys of the r highest scores of sc
      std::partial_sort(sc.begin(), sc.begin() + r, sc.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      std::fill(dst, dst + d, 0.0f);
      for (int64_t j = 0; j < r; ++j) kernels::add_inplace(dst, kbuf.data() + sc[static_cast<size_t>(j)].second * d, d);
    };
    if (repr_ == Repr::kQuerySum) {
      if (static_cast<int64_t>(hs.qsum.size()) < (m + 1) * d) hs.qsum.resize(static_cast<size_t>((m + 1) * d), 0.0f);
      for (int64_t j = 0; j < block_; ++j)
        sc[static_cast<size_t>(j)] = {attn::dot(kbuf.data() + j * d, hs.qsum.data() + m * d, d), static_cast<int32_t>(j)};
      top_sum(hs.rep.data() + m * g * d);
      for (int64_t u = 1; u < g; ++u)
        std::copy_n(hs.rep.data() + m * g * d, d, hs.rep.data() + (m * g + u) * d);
    } else {
      const int64_t at = (first - hs.score_first) * g;
      if (static_cast<int64_t>(hs.score.size()) < at + block_ * g)
        hs.score.resize(static_cast<size_t>(at + block_ * g), 0.0f);
      for (int64_t u = 0; u < g; ++u) {
        for (int64_t j = 0; j < block_; ++j)
          sc[static_cast<size_t>(j)] = {hs.score[static_cast<size_t>(at + j * g + u)], static_cast<int32_t>(j)};
        top_sum(hs.rep.data() + (m * g + u) * d);
      }
    }
    ++hs.n_rep;
    // Scores older than the last kept_blocks() memory blocks are not needed again.
    const int64_t keep_from = n_init_ + std::max<int64_t>(0, hs.n_rep - kept_blocks()) * block_;
    if (repr_ == Repr::kAttention && keep_from > hs.score_first) {
      const int64_t drop = std::min<int64_t>((keep_from - hs.score_first) * g, static_cast<int64_t>(hs.score.size()));
      hs.score.erase(hs.score.begin(), hs.score.begin() + drop);
      hs.score_first = keep_from;
    }
  }

  int64_t n_init_, n_local_, block_, reps_, topk_, chunk_;
  Repr repr_;
  std::vector<HeadState> heads_;              // [n_layer * n_head_kv]
  std::vector<int32_t> fixed_;                // [n] the fixed distance
  std::vector<std::vector<int32_t>> sel_;     // [n_sub] chosen memory blocks (per layer)
  std::vector<float> rel_;                    // [n_sub, n_head_kv, blocks] relevance per KV head
  std::vector<attn::Item> items_;             // the items of one sub-chunk
  std::vector<std::vector<attn::Span>> spans_;  // [items_] what each tile attends
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
  std::string repr = "attention";
  LC_TRY(spec.get_string("repr", &repr,
                         "how a block's representative tokens are chosen: attention (InfLLM's: the most attended "
                         "by the local window's queries, per query head) or qsum (the largest dot product with "
                         "the block's own queries' sum, per KV head; no second pass over the window)"));
  if (repr != "attention" && repr != "qsum")
    return make_error(ErrorCode::kInvalidArgument, fmt::format("infllm: repr must be attention or qsum, not '{}'", repr));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  LC_TRY(spec.finish());
  return BackendPtr(new InfLlmBackend(s, n_init, n_local, block, reps, topk, chunk,
                                      repr == "qsum" ? Repr::kQuerySum : Repr::kAttention, split));
}

}  // namespace lc
