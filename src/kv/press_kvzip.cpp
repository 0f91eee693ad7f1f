// KVzip — Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
// arXiv 2505.23416, 2025, as kvpress implements it (NVIDIA/kvpress,
// kvpress/presses/kvzip_press.py at commit 8bb29b9, read for this file; the original code is
// snu-mllab/KVzip). After the context is prefilled, the model reads a reconstruction prompt
// followed by the context again, chunk by chunk (the runtime runs it: kv/press_kvzip.h,
// model/press_runner.cpp), and every cached context token is scored by the most attention any
// reconstruction query pays it. For chunk [s, e) of the context, with reconstruction tokens R
// (prompt + "\n" + the chunk's tokens, appended after the whole context and removed again
// before the next chunk), per KV head h and context token j in [s, e):
//   p_{t,j}  = exp(q_t . k_j / sqrt(d)) / Z_t, t in R, over the query heads of h's group, where
//   Z_t      = the sum over: the first min(n_sink, s) context tokens (sinks), the chunk's tokens
//              [s, e), and R's own keys up to t (causal among R) — nothing else of the context;
//   score_j  = max over group x R of p_{t,j}                     (kvpress score_kvzip, amax)
// Every context token is in exactly one chunk; its score is that chunk's. Selection
// (compress_post): the floor(ratio x N) lowest of all N (layer, KV head, token) scores go
// (layerwise=1: floor(ratio x n_head_kv x n) per layer), i.e. head-wise and layer-wise budgets
// from one global ranking, with no per-head floor ("KVzip does not rely on safeguards": a head
// may lose every context token). Query-agnostic by construction: nothing the question says
// enters the scores, and the runtime compresses after the context part, before the question.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/kernels.h"
#include "kv/press_impl.h"
#include "kv/press_kvzip.h"

namespace lc::press {
namespace {

class KvzipPress final : public KvPress, public KvzipReconstruction {
 public:
  KvzipPress(const PressShape& s, double ratio, int64_t budget, bool layerwise, int64_t n_sink, int64_t chunk,
             int64_t postfix)
      : shape_(s), ratio_(ratio), budget_(budget), layerwise_(layerwise), n_sink_(n_sink), chunk_(chunk),
        postfix_(postfix) {
    schedule_.after_prefill = true;
    schedule_.query_aware = false;
  }

  std::string spec() const override {
    return fmt::format("kvzip:{},layerwise={},n_sink={},chunk_size={},postfix={}",
                       budget_ >= 0 ? fmt::format("budget={}", budget_) : fmt::format("ratio={}", ratio_),
                       layerwise_ ? 1 : 0, n_sink_, chunk_, postfix_);
  }
  const PressSchedule& schedule() const override { return schedule_; }
  int64_t n_obs() const override { return 0; }
  KvzipReconstruction* reconstruction() override { return this; }

  // The reconstruction tokens must stay in the cache as its newest tokens, and the scores are a
  // softmax over keys at their stored positions.
  Status check_backend(const AttentionCaps& attn) const override {
    if (attn.evicts || attn.relabels_positions)
      return make_error(fmt::format("kv press kvzip: --attn {} {} the cache's tokens, but KVzip scores the stored "
                                    "keys at their positions with reconstruction tokens appended after them "
                                    "(use --attn dense)",
                                    attn.spec, attn.evicts ? "evicts" : "re-assigns the positions of"));
    return ok_status();
  }

  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override {
    if (!selected_)
      return make_error("kv press kvzip: no context reconstruction ran before compress() (kvzip scores by running "
                        "the model over a reconstruction prompt after the context: it needs the model runtime and "
                        "cannot be part of a chain)");
    if (il < 0 || il >= shape_.n_layer) return make_error(fmt::format("kv press kvzip: layer {} out of range", il));
    const int64_t Hkv = shape_.n_head_kv;
    for (int64_t h = 0; h < Hkv; ++h)
      if (c.kv->n_tokens(il, h) != held_[static_cast<size_t>(il * Hkv + h)])
        return make_error(fmt::format("kv press kvzip: layer {} head {} holds {} tokens, {} when it was scored", il,
                                      h, c.kv->n_tokens(il, h), held_[static_cast<size_t>(il * Hkv + h)]));
    keep = std::move(keep_[static_cast<size_t>(il)]);
    keep_[static_cast<size_t>(il)].clear();
    if (++handed_ == shape_.n_layer) reset();
    return ok_status();
  }

  // ---- KvzipReconstruction ----

  std::vector<KvzipChunk> chunks(int64_t n) const override {
    std::vector<KvzipChunk> out;
    if (n <= 0) return out;
    if (chunk_ == 0 || n <= chunk_) return {KvzipChunk{0, n}};
    for (int64_t s = 0; s < n; s += chunk_) out.push_back({s, std::min(n, s + chunk_)});
    return out;
  }
  int64_t postfix() const override { return postfix_; }

  bool needed(const KvCache& kv) const override {
    int64_t all = 0;
    for (int64_t il = 0; il < kv.n_layer(); ++il) {
      int64_t layer = 0;
      for (int64_t h = 0; h < kv.n_head_kv(); ++h) layer += kv.n_tokens(il, h);
      if (layerwise_ && pruned(layer, kv.n_head_kv()) > 0) return true;
      all += layer;
    }
    return !layerwise_ && pruned(all, kv.n_head_kv() * kv.n_layer()) > 0;
  }

  Status begin(const KvCache& kv, std::vector<int32_t> ctx_seq) override {
    reset();
    if (kv.n_layer() != shape_.n_layer || kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
      return make_error(fmt::format("kv press kvzip: a cache of {} layers x {} KV heads x {} dims, the press was made "
                                    "for {} x {} x {}",
                                    kv.n_layer(), kv.n_head_kv(), kv.head_dim(), shape_.n_layer, shape_.n_head_kv,
                                    shape_.head_dim));
    for (size_t i = 1; i < ctx_seq.size(); ++i)
      if (ctx_seq[i] <= ctx_seq[i - 1])
        return make_error("kv press kvzip: the context's sequence indices must ascend");
    const int64_t K = shape_.n_layer * shape_.n_head_kv;
    ctx_seq_ = std::move(ctx_seq);
    held_.resize(static_cast<size_t>(K));
    score_.resize(static_cast<size_t>(K));
    sink_end_.assign(static_cast<size_t>(K), 0);
    lo_.assign(static_cast<size_t>(K), 0);
    hi_.assign(static_cast<size_t>(K), 0);
    for (int64_t il = 0; il < shape_.n_layer; ++il)
      for (int64_t h = 0; h < shape_.n_head_kv; ++h) {
        const size_t k = static_cast<size_t>(il * shape_.n_head_kv + h);
        held_[k] = kv.n_tokens(il, h);
        // kvpress: zeros, the first n_sink set to 1, then every chunk's scores written over its
        // tokens; with no chat-template prefix the first chunk starts at token 0, so every
        // context token ends with its chunk's score.
        score_[k].assign(static_cast<size_t>(held_[k]), 0.0f);
      }
    running_ = true;
    return ok_status();
  }

  Status begin_chunk(const KvCache& kv, const KvzipChunk& c, int64_t rep_seq0) override {
    if (!running_) return make_error("kv press kvzip: begin_chunk() before begin()");
    const int64_t n = static_cast<int64_t>(ctx_seq_.size());
    if (c.first < 0 || c.end <= c.first || c.end > n)
      return make_error(fmt::format("kv press kvzip: chunk [{}, {}) of a context of {} tokens", c.first, c.end, n));
    if (rep_seq0 <= ctx_seq_.back())
      return make_error(fmt::format("kv press kvzip: reconstruction tokens from sequence index {}, not after the "
                                    "context (last {})",
                                    rep_seq0, ctx_seq_.back()));
    const int64_t s = std::min(n_sink_, c.first);  // kvpress: sink = min(n_sink, start_idx)
    for (int64_t il = 0; il < shape_.n_layer; ++il)
      for (int64_t h = 0; h < shape_.n_head_kv; ++h) {
        const size_t k = static_cast<size_t>(il * shape_.n_head_kv + h);
        if (kv.n_tokens(il, h) != held_[k])
          return make_error(fmt::format("kv press kvzip: layer {} head {} holds {} tokens at a chunk's start, {} at "
                                        "the run's (the previous reconstruction tokens were not removed)",
                                        il, h, kv.n_tokens(il, h), held_[k]));
        const int32_t* idx = kv.seq_index(il, h);
        const int32_t* end = idx + held_[k];
        sink_end_[k] = s > 0 ? std::upper_bound(idx, end, ctx_seq_[static_cast<size_t>(s - 1)]) - idx : 0;
        lo_[k] = std::lower_bound(idx, end, ctx_seq_[static_cast<size_t>(c.first)]) - idx;
        hi_[k] = std::upper_bound(idx, end, ctx_seq_[static_cast<size_t>(c.end - 1)]) - idx;
        // The chunk's scores are assigned (kvpress: score_val[..., start:end] = scores).
        std::fill(score_[k].begin() + lo_[k], score_[k].begin() + hi_[k], 0.0f);
      }
    rep_seq0_ = rep_seq0;
    chunk_open_ = true;
    return ok_status();
  }

  Status observe(const KvCache& kv, int64_t il, const float* q, const int32_t* pos, const int32_t* seq, int64_t n,
                 ThreadPool* pool) override {
    if (!chunk_open_) return make_error("kv press kvzip: reconstruction queries outside a chunk");
    if (n <= 0) return ok_status();
    const int64_t r0 = seq[0] - rep_seq0_, r_end = seq[n - 1] - rep_seq0_ + 1;
    if (r0 < 0 || r_end - r0 != n)
      return make_error(fmt::format("kv press kvzip: reconstruction queries at sequence indices {}..{}, expected {} "
                                    "consecutive from {} on",
                                    seq[0], seq[n - 1], n, rep_seq0_));
    const int64_t H = shape_.n_head, Hkv = shape_.n_head_kv, d = shape_.head_dim, g = H / Hkv;
    std::vector<float> qr(q, q + n * H * d);
    const RopeTable& rt = kv.rope(il);
    if (rt.n_rot > 0) rt.apply(qr.data(), n, H, d, pos);
    // Per KV head: [sinks | the chunk's tokens | reconstruction keys 0 .. r_end) in one array.
    std::vector<std::vector<float>> keys(static_cast<size_t>(Hkv));
    std::vector<int64_t> off(static_cast<size_t>(Hkv) + 1, 0);
    for (int64_t h = 0; h < Hkv; ++h) {
      const size_t k = static_cast<size_t>(il * Hkv + h);
      const int64_t base = held_[k], nh = kv.n_tokens(il, h);
      const int32_t* idx = kv.seq_index(il, h);
      if (nh != base + r_end || idx[base] != rep_seq0_ || idx[nh - 1] != rep_seq0_ + r_end - 1)
        return make_error(fmt::format("kv press kvzip: layer {} head {} does not hold the {} reconstruction tokens "
                                      "as its newest (the attention backend moved or dropped them)",
                                      il, h, r_end));
      const int64_t S = sink_end_[k], C = hi_[k] - lo_[k];
      auto& K = keys[static_cast<size_t>(h)];
      K.resize(static_cast<size_t>((S + C + r_end) * d));
      if (S > 0) kv.read_keys(il, h, 0, S, K.data());
      if (C > 0) kv.read_keys(il, h, lo_[k], C, K.data() + S * d);
      kv.read_keys(il, h, base, r_end, K.data() + (S + C) * d);
      off[static_cast<size_t>(h) + 1] = off[static_cast<size_t>(h)] + C;
    }
    const int64_t total = off[static_cast<size_t>(Hkv)];
    if (total == 0) return ok_status();
    const float scale = attn_scale(shape_);
    const int n_threads = pool ? std::max(1, pool->size()) : 1;
    // Per thread: the running max of every chunk token of every head (max is exact whatever the
    // order, so the result does not depend on the threads).
    std::vector<std::vector<float>> acc(static_cast<size_t>(n_threads));
    std::vector<std::vector<float>> z(static_cast<size_t>(n_threads));
    constexpr int64_t kRows = 8;  // (head, query head, query) rows per work item
    const int64_t rows = Hkv * g * n, items = (rows + kRows - 1) / kRows;
    auto work = [&](int64_t item, int thread) {
      auto& a = acc[static_cast<size_t>(thread)];
      auto& e = z[static_cast<size_t>(thread)];
      if (a.empty()) a.assign(static_cast<size_t>(total), 0.0f);
      for (int64_t row = item * kRows; row < std::min(rows, (item + 1) * kRows); ++row) {
        const int64_t h = row / (g * n), hq = h * g + (row / n) % g, t = row % n;
        const size_t k = static_cast<size_t>(il * Hkv + h);
        const int64_t S = sink_end_[k], C = hi_[k] - lo_[k];
        if (C == 0) continue;
        const int64_t m = S + C + r0 + t + 1;  // causal among the reconstruction tokens
        e.resize(static_cast<size_t>(m));
        kernels::dot_rows_f32(qr.data() + (t * H + hq) * d, keys[static_cast<size_t>(h)].data(), m, d, e.data());
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < m; ++j) mx = std::max(mx, e[static_cast<size_t>(j)] *= scale);
        const float inv = 1.0f / kernels::exp_sub_sum(e.data(), m, mx);  // the attention's vector exp
        float* ah = a.data() + off[static_cast<size_t>(h)];
        for (int64_t j = 0; j < C; ++j) ah[j] = std::max(ah[j], e[static_cast<size_t>(S + j)] * inv);
      }
    };
    if (n_threads > 1 && items > 1) {
      pool->for_each_dynamic(items, work);
    } else {
      for (int64_t i = 0; i < items; ++i) work(i, 0);
    }
    for (int64_t h = 0; h < Hkv; ++h) {
      const size_t k = static_cast<size_t>(il * Hkv + h);
      float* sc = score_[k].data() + lo_[k];
      for (const auto& a : acc) {
        if (a.empty()) continue;
        const float* ah = a.data() + off[static_cast<size_t>(h)];
        for (int64_t j = 0; j < hi_[k] - lo_[k]; ++j) sc[j] = std::max(sc[j], ah[j]);
      }
    }
    return ok_status();
  }

  Status finish(const KvCache& kv) override {
    if (!running_) return make_error("kv press kvzip: finish() before begin()");
    chunk_open_ = false;
    const int64_t L = shape_.n_layer, Hkv = shape_.n_head_kv;
    for (int64_t il = 0; il < L; ++il)
      for (int64_t h = 0; h < Hkv; ++h)
        if (kv.n_tokens(il, h) != held_[static_cast<size_t>(il * Hkv + h)])
          return make_error(fmt::format("kv press kvzip: layer {} head {} holds {} tokens after the reconstruction, "
                                        "{} before",
                                        il, h, kv.n_tokens(il, h), held_[static_cast<size_t>(il * Hkv + h)]));
    for (auto& s : score_)
      for (float& x : s)
        if (std::isnan(x)) x = -std::numeric_limits<float>::infinity();  // NaN counts as the lowest
    keep_.assign(static_cast<size_t>(L), std::vector<std::vector<int32_t>>(static_cast<size_t>(Hkv)));
    if (layerwise_) {
      for (int64_t il = 0; il < L; ++il) {
        int64_t n = 0;
        for (int64_t h = 0; h < Hkv; ++h) n += held_[static_cast<size_t>(il * Hkv + h)];
        drop_lowest(il * Hkv, (il + 1) * Hkv, pruned(n, Hkv));
      }
    } else {
      int64_t n = 0;
      for (int64_t x : held_) n += x;
      drop_lowest(0, L * Hkv, pruned(n, Hkv * L));
    }
    std::vector<std::vector<float>>().swap(score_);  // n_layer x n_head_kv x n floats
    running_ = false;
    selected_ = true;
    handed_ = 0;
    return ok_status();
  }

  void reset() override {
    running_ = chunk_open_ = selected_ = false;
    handed_ = 0;
    std::vector<std::vector<float>>().swap(score_);
    std::vector<std::vector<std::vector<int32_t>>>().swap(keep_);
    std::vector<int32_t>().swap(ctx_seq_);
  }

 private:
  // Entries removed of n held by `heads` (layer, KV head) pairs: floor(ratio x n), kvpress's
  // int(numel x compression_ratio), or what exceeds budget x heads.
  int64_t pruned(int64_t n, int64_t heads) const {
    if (budget_ >= 0) return std::max<int64_t>(0, n - budget_ * heads);
    return static_cast<int64_t>(std::floor(ratio_ * static_cast<double>(n) + 1e-9));
  }

  // Keep lists of the (layer, KV head) pairs k0 .. k1 - 1 (flat k = il * n_head_kv + h) without
  // the p lowest scores among them; ties: the later entry (in k, then token order) goes first,
  // so a higher score, then an earlier entry, is kept (kvpress's topk leaves ties unspecified).
  void drop_lowest(int64_t k0, int64_t k1, int64_t p) {
    std::vector<float> all;
    for (int64_t k = k0; k < k1; ++k) all.insert(all.end(), score_[static_cast<size_t>(k)].begin(), score_[static_cast<size_t>(k)].end());
    const int64_t N = static_cast<int64_t>(all.size());
    p = std::clamp<int64_t>(p, 0, N);
    float thr = -std::numeric_limits<float>::infinity();
    int64_t ties = 0;  // entries equal to thr that go, the latest first
    if (p > 0) {
      std::nth_element(all.begin(), all.begin() + (p - 1), all.end());
      thr = all[static_cast<size_t>(p - 1)];
      int64_t below = 0;
      for (int64_t k = k0; k < k1; ++k)
        for (float x : score_[static_cast<size_t>(k)]) below += x < thr;
      ties = p - below;
    }
    // Walk backwards so that the latest tied entries are the ones dropped.
    for (int64_t k = k1 - 1; k >= k0; --k) {
      const auto& s = score_[static_cast<size_t>(k)];
      std::vector<int32_t>& keep = keep_[static_cast<size_t>(k / shape_.n_head_kv)][static_cast<size_t>(k % shape_.n_head_kv)];
      keep.clear();
      for (int64_t j = static_cast<int64_t>(s.size()) - 1; j >= 0; --j) {
        const float x = s[static_cast<size_t>(j)];
        if (p == 0 || x > thr) {
          keep.push_back(static_cast<int32_t>(j));
        } else if (x == thr) {
          if (ties > 0) {
            --ties;
          } else {
            keep.push_back(static_cast<int32_t>(j));
          }
        }
      }
      std::reverse(keep.begin(), keep.end());
    }
  }

  PressShape shape_;
  double ratio_;
  int64_t budget_;
  bool layerwise_;
  int64_t n_sink_, chunk_, postfix_;
  PressSchedule schedule_;
  // One scoring run (begin() ... finish()), then its keep lists until select() hands them out.
  bool running_ = false, chunk_open_ = false, selected_ = false;
  int64_t handed_ = 0;
  std::vector<int32_t> ctx_seq_;
  std::vector<int64_t> held_;                // [n_layer * n_head_kv] tokens held at begin()
  std::vector<std::vector<float>> score_;    // [n_layer * n_head_kv][held]
  std::vector<int64_t> sink_end_, lo_, hi_;  // this chunk's held indices: sinks [0, sink_end), chunk [lo, hi)
  int64_t rep_seq0_ = 0;
  std::vector<std::vector<std::vector<int32_t>>> keep_;  // [n_layer][n_head_kv] after finish()
};

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_kvzip(Args& a, const PressShape& s) {
  if (a.has("ratio") && a.has("budget"))
    return make_error(fmt::format("kv press {}: give ratio= or budget=, not both", a.name()));
  LC_ASSIGN_OR_RETURN(double ratio, a.number("ratio", -1, 0, 1,
                                             "fraction of ALL cached (layer, KV head, token) entries removed, "
                                             "floor(ratio x N), the lowest scores wherever they are (kvpress "
                                             "compression_ratio; layerwise=1: of each layer's); below 1; 0.5 when "
                                             "budget= is not given"));
  LC_ASSIGN_OR_RETURN(int64_t budget, a.integer("budget", -1, 1, INT32_MAX,
                                                "mean tokens kept per KV head: budget x n_head_kv x n_layer entries "
                                                "kept in all (layerwise=1: budget x n_head_kv per layer), shared "
                                                "out by the scores; not with ratio="));
  if (ratio >= 1)
    return make_error(fmt::format("kv press {}: ratio={}: expected a value in [0, 1) (kvpress asserts "
                                  "compression_ratio < 1)", a.name(), ratio));
  if (ratio < 0 && budget < 0) ratio = 0.5;
  LC_ASSIGN_OR_RETURN(int64_t layerwise, a.integer("layerwise", 0, 0, 1,
                                                   "1: every layer loses the same share, heads sharing it by score; "
                                                   "0 (kvpress's default): one ranking over all layers"));
  LC_ASSIGN_OR_RETURN(int64_t n_sink, a.integer("n_sink", 4, 0, 1 << 20,
                                                "first context tokens whose keys join the softmax of every later "
                                                "chunk's reconstruction (kvpress n_sink), tokens"));
  LC_ASSIGN_OR_RETURN(int64_t chunk, a.integer("chunk_size", 2048, 0, 1 << 30,
                                               "context tokens reconstructed per pass (kvpress chunk_size); a pass's "
                                               "softmax covers the sinks, its chunk and its own reconstruction "
                                               "tokens; 0: the whole context in one pass, tokens"));
  LC_ASSIGN_OR_RETURN(int64_t postfix, a.integer("postfix", 8, 0, 1 << 20,
                                                 "last tokens of the previous chunk repeated after a later chunk's "
                                                 "prompt (kvpress prev_postfix_size), tokens"));
  return std::unique_ptr<KvPress>(std::make_unique<KvzipPress>(s, ratio < 0 ? -1.0 : ratio, budget, layerwise == 1,
                                                               n_sink, chunk, postfix));
}

}  // namespace lc::press
