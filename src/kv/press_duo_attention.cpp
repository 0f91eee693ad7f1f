// DuoAttention — Xiao et al., "DuoAttention: Efficient Long-Context LLM Inference with Retrieval
// and Streaming Heads", ICLR 2025; as kvpress's DuoAttentionPress (NVIDIA/kvpress,
// kvpress/presses/duo_attention_press.py). Every (layer, KV head) gets a score; the
// round(n_layer x n_head_kv x head_ratio) lowest scores over the WHOLE model (one ranking across
// layers, np.argsort(head_scores, axis=None)) are streaming heads, which keep their first `sink`
// and last `recent` held tokens after prefill; the others (retrieval heads) keep everything.
//
// Scores (kvpress's duo_attention_on_the_fly, "area under the cumulated attention curve"):
//   q̄_h = mean of the pre-RoPE queries of query head h over the text's tokens,
//   k̄_h = mean of the pre-RoPE keys of KV head h over the same tokens,
//   a_p = softmax_p( R(P-1) q̄_h · R(p) k̄_{h/g} / sqrt(d) ),  p = 0 .. P-1  (P = n_pos = 500: both
//         means repeated at positions 0..P-1 and rotated; only the last query is used),
//   s_h = mean_p cumsum(a)_p,  then the mean over the GQA group: one score per KV head.
// A head whose attention goes to recent positions has a low score (streaming); one that reaches
// back far has a high score. kvpress averages these over 50 BookSum texts, fixed per model, with
// sink 128 and recent 256; BookSum is not here, so the text is the prompt itself: the press
// observes every query the model runs (AttentionObserver: the pre-RoPE queries of each forward,
// prefill chunks and decode steps since the sequence started or was last truncated) and takes the
// keys the layer holds when it compresses (stored post-RoPE: rotated back by -pos, mscale removed).
// The pattern is recomputed from those statistics at every after-prefill compression.
//
// patterns=FILE instead gives the scores, as the DuoAttention repository's
// full_attention_heads.tsv (kvpress's load_attention_pattern): n_layer lines of n_head_kv numbers
// separated by tabs or spaces (lines starting with '#' and empty lines are skipped), clipped to
// [0, 1]; a low value = a streaming head. The repository's config.json sink_size / recent_size
// are given as sink= and recent= (the pattern files themselves are not shipped).
//
// As kvpress: prefill only (the streaming heads then grow again while decoding); the first and
// last tokens are the first and last HELD by the head; a head holding no more than sink + recent
// tokens is not touched; ties in the ranking go to the lower (layer, head) (np.argsort's
// quicksort leaves them unspecified). The compression achieved is logged (info) after the last
// layer: kvpress's compression_ratio, removed / held over every head (kvpress writes it
// mean(streaming) x (1 - (sink + recent) / k_len)).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.h"
#include "kv/press_impl.h"

namespace lc::press {
namespace {

struct DuoOptions {
  double head_ratio = 0.0;
  int64_t sink = 128, recent = 256, n_pos = 500;
  std::string patterns;  // empty: on the fly
  bool query_aware = true;
};

class DuoAttentionPress final : public KvPress, private AttentionObserver {
 public:
  DuoAttentionPress(DuoOptions o, const PressShape& s, std::vector<double> file_scores)
      : o_(std::move(o)), shape_(s), scores_(std::move(file_scores)) {
    sched_.after_prefill = true;
    sched_.query_aware = o_.query_aware;
    if (!scores_.empty()) mask_from_scores();
  }
  std::string spec() const override {
    std::string s = fmt::format("duo_attention:head_ratio={},sink={},recent={},n_pos={}", o_.head_ratio, o_.sink,
                                o_.recent, o_.n_pos);
    if (!o_.patterns.empty()) s += ",patterns=" + o_.patterns;
    return s + (o_.query_aware ? ",query=aware" : ",query=agnostic");
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override { return 0; }
  // On the fly: every query of the forward passes, for the mean query per (layer, query head).
  AttentionObserver* observer() override { return on_the_fly() ? this : nullptr; }

  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override {
    keep.clear();
    if (!sched_.covers(c.phase)) return ok_status();
    const KvCache& kv = *c.kv;
    if (il < 0 || il >= kv.n_layer() || kv.n_layer() != shape_.n_layer)
      return make_error(fmt::format("kv press duo_attention: layer {} of a cache of {} layers (the press was made "
                                    "for {})",
                                    il, kv.n_layer(), shape_.n_layer));
    if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
      return make_error(fmt::format("kv press duo_attention: the cache has {} KV heads of dim {}, the press was made "
                                    "for {} of dim {}",
                                    kv.n_head_kv(), kv.head_dim(), shape_.n_head_kv, shape_.head_dim));
    if (on_the_fly() && (dirty_ || scores_.empty())) LC_TRY(score_on_the_fly(c));
    if (il == 0) {
      held_.assign(static_cast<size_t>(kv.n_layer()), 0);
      removed_.assign(static_cast<size_t>(kv.n_layer()), 0);
    }
    const int64_t Hkv = kv.n_head_kv();
    bool any = false;
    std::vector<std::vector<int32_t>> k(static_cast<size_t>(Hkv));
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t n = kv.n_tokens(il, h);
      held_[static_cast<size_t>(il)] += n;
      auto& kh = k[static_cast<size_t>(h)];
      if (!streaming_[static_cast<size_t>(il * Hkv + h)] || n <= o_.sink + o_.recent) {
        kh.resize(static_cast<size_t>(n));
        std::iota(kh.begin(), kh.end(), 0);
        continue;
      }
      for (int64_t j = 0; j < o_.sink; ++j) kh.push_back(static_cast<int32_t>(j));
      for (int64_t j = n - o_.recent; j < n; ++j) kh.push_back(static_cast<int32_t>(j));
      removed_[static_cast<size_t>(il)] += n - static_cast<int64_t>(kh.size());
      any = true;
    }
    if (any) keep = std::move(k);
    if (il == kv.n_layer() - 1) report();
    return ok_status();
  }

 private:
  bool on_the_fly() const { return o_.patterns.empty(); }

  // ---- AttentionObserver: the sum of every pre-RoPE query per (layer, query head) ----
  void observe(const KvCache&, int64_t il, const float* q, const int32_t*, const int32_t*, int64_t n, ThreadPool*,
               const float*) override {
    const int64_t w = shape_.n_head * shape_.head_dim;
    if (q_sum_.empty()) {
      q_sum_.assign(static_cast<size_t>(shape_.n_layer * w), 0.0);
      q_count_.assign(static_cast<size_t>(shape_.n_layer), 0);
    }
    if (il < 0 || il >= shape_.n_layer) return;
    double* s = q_sum_.data() + il * w;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t x = 0; x < w; ++x) s[x] += q[t * w + x];
    q_count_[static_cast<size_t>(il)] += n;
    dirty_ = true;
  }
  // A sum cannot forget the queries of the dropped tokens: the statistics restart.
  void truncate(int64_t) override {
    q_sum_.clear();
    q_count_.clear();
    dirty_ = true;
  }

  // kvpress's duo_attention_on_the_fly with the prompt as its one text (see the file comment).
  Status score_on_the_fly(const PressContext& c) {
    const KvCache& kv = *c.kv;
    const int64_t L = shape_.n_layer, H = shape_.n_head, Hkv = shape_.n_head_kv, d = shape_.head_dim;
    const int64_t g = H / Hkv, P = o_.n_pos;
    for (int64_t il = 0; il < L; ++il)
      if (q_count_.empty() || q_count_[static_cast<size_t>(il)] == 0)
        return make_error(fmt::format("kv press duo_attention: no queries of layer {} were observed (on-the-fly "
                                      "scoring needs the model to feed observer() every forward pass; or give "
                                      "patterns=FILE)",
                                      il));
    scores_.assign(static_cast<size_t>(L * Hkv), 0.0);
    std::vector<int32_t> syn(static_cast<size_t>(P));
    std::iota(syn.begin(), syn.end(), 0);
    const int32_t last = static_cast<int32_t>(P - 1);
    const double scale = attn_scale(shape_);
    for (int64_t il = 0; il < L; ++il) {
      const RopeTable& rt = kv.rope(il);
      const double m2 = static_cast<double>(rt.mscale) * rt.mscale;
      std::vector<float> qbar(static_cast<size_t>(H * d));
      const double inv_n = 1.0 / static_cast<double>(q_count_[static_cast<size_t>(il)]);
      for (int64_t x = 0; x < H * d; ++x)
        qbar[static_cast<size_t>(x)] = static_cast<float>(q_sum_[static_cast<size_t>(il * H * d + x)] * inv_n);
      if (rt.n_rot > 0) rt.apply(qbar.data(), 1, H, d, &last);  // the last of the P repeated queries
      for_each_head(c, Hkv, [&](int64_t h) {
        // The mean pre-RoPE key: stored keys are mscale * R(pos) k; R(-pos) with mscale gives
        // mscale^2 k in the rotated dims.
        std::vector<float> K;
        read_head_keys(kv, il, h, K);
        const int64_t n = kv.n_tokens(il, h);
        if (rt.n_rot > 0 && n > 0) {
          std::vector<int32_t> neg(kv.positions(il, h), kv.positions(il, h) + n);
          for (int32_t& p : neg) p = -p;
          rt.apply(K.data(), n, 1, d, neg.data());
        }
        std::vector<double> kmean(static_cast<size_t>(d), 0.0);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t e = 0; e < d; ++e) kmean[static_cast<size_t>(e)] += K[static_cast<size_t>(j * d + e)];
        std::vector<float> ksyn(static_cast<size_t>(P * d));
        for (int64_t e = 0; e < d; ++e) {
          double x = n > 0 ? kmean[static_cast<size_t>(e)] / static_cast<double>(n) : 0.0;
          if (e < rt.n_rot) x /= m2;
          for (int64_t p = 0; p < P; ++p) ksyn[static_cast<size_t>(p * d + e)] = static_cast<float>(x);
        }
        if (rt.n_rot > 0) rt.apply(ksyn.data(), P, 1, d, syn.data());
        double acc = 0;
        std::vector<double> a(static_cast<size_t>(P));
        for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
          const float* qv = qbar.data() + hq * d;
          double mx = -INFINITY;
          for (int64_t p = 0; p < P; ++p) {
            double dot = 0;
            for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(qv[e]) * ksyn[static_cast<size_t>(p * d + e)];
            a[static_cast<size_t>(p)] = dot * scale;
            mx = std::max(mx, a[static_cast<size_t>(p)]);
          }
          double sum = 0;
          for (double& x : a) sum += (x = std::exp(x - mx));
          // mean_p cumsum(a)_p = sum_p a_p (P - p) / P
          double area = 0, cum = 0;
          for (int64_t p = 0; p < P; ++p) area += (cum += a[static_cast<size_t>(p)] / sum);
          acc += area / static_cast<double>(P);
        }
        scores_[static_cast<size_t>(il * Hkv + h)] = acc / static_cast<double>(g);
      });
    }
    dirty_ = false;
    mask_from_scores();
    return ok_status();
  }

  // The round(n x head_ratio) lowest scores over every (layer, KV head) are streaming heads.
  void mask_from_scores() {
    const int64_t n = static_cast<int64_t>(scores_.size());
    const auto n_pruned = static_cast<int64_t>(std::nearbyint(static_cast<double>(n) * o_.head_ratio));  // half to even
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return scores_[static_cast<size_t>(a)] < scores_[static_cast<size_t>(b)];
    });
    streaming_.assign(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < std::min(n_pruned, n); ++i) streaming_[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  }

  void report() const {
    int64_t held = 0, removed = 0, n_stream = 0;
    for (size_t il = 0; il < held_.size(); ++il) held += held_[il], removed += removed_[il];
    for (uint8_t s : streaming_) n_stream += s;
    LC_LOG_INFO("kv press duo_attention: {} of {} KV heads streaming, compression {:.4f}", n_stream,
                streaming_.size(), held > 0 ? static_cast<double>(removed) / static_cast<double>(held) : 0.0);
  }

  DuoOptions o_;
  PressShape shape_;
  PressSchedule sched_;
  std::vector<double> scores_;       // [n_layer * n_head_kv] (file, or on the fly)
  std::vector<uint8_t> streaming_;   // [n_layer * n_head_kv]
  std::vector<double> q_sum_;        // [n_layer][n_head * head_dim] observed queries, summed
  std::vector<int64_t> q_count_;     // [n_layer]
  bool dirty_ = true;                // queries observed since the scores were computed
  std::vector<int64_t> held_, removed_;  // [n_layer] of the last pass
};

// full_attention_heads.tsv: n_layer rows of n_head_kv numbers, clipped to [0, 1] (kvpress).
Expected<std::vector<double>> read_patterns(const std::string& path, const PressShape& s) {
  std::ifstream in(path);
  if (!in)
    return make_error(fmt::format("kv press duo_attention: patterns={}: cannot open the file", path));
  std::vector<double> out;
  std::string line;
  int64_t row = 0, line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::istringstream ls(line);
    std::string tok;
    int64_t cols = 0;
    while (ls >> tok) {
      char* end = nullptr;
      const double x = std::strtod(tok.c_str(), &end);
      if (*end != '\0' || !std::isfinite(x))
        return make_error(fmt::format("kv press duo_attention: patterns={}: line {}: \"{}\" is not a number", path,
                                      line_no, tok));
      out.push_back(std::clamp(x, 0.0, 1.0));
      ++cols;
    }
    if (cols != s.n_head_kv)
      return make_error(fmt::format("kv press duo_attention: patterns={}: line {} has {} values, expected one per KV "
                                    "head ({})",
                                    path, line_no, cols, s.n_head_kv));
    ++row;
  }
  if (row != s.n_layer)
    return make_error(fmt::format("kv press duo_attention: patterns={}: {} rows, expected one per layer ({})", path,
                                  row, s.n_layer));
  return out;
}

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_duo_attention(Args& a, const PressShape& s) {
  DuoOptions o;
  LC_ASSIGN_OR_RETURN(o.head_ratio, a.number("head_ratio", 0.0, 0, 1,
                                             "fraction of the (layer, KV head) pairs made streaming heads, the lowest "
                                             "scores over the whole model (kvpress's head_compression_ratio; 0: none)"));
  LC_ASSIGN_OR_RETURN(o.sink, a.integer("sink", 128, 0, INT32_MAX,
                                        "first held tokens a streaming head keeps (kvpress's on-the-fly sink_size), "
                                        "tokens"));
  LC_ASSIGN_OR_RETURN(o.recent, a.integer("recent", 256, 1, INT32_MAX,
                                          "last held tokens a streaming head keeps (kvpress's on-the-fly "
                                          "recent_size), tokens"));
  LC_ASSIGN_OR_RETURN(o.patterns, a.text("patterns", "",
                                         "head scores file: n_layer lines of n_head_kv numbers (DuoAttention's "
                                         "full_attention_heads.tsv), low = streaming; empty: scored on the fly from "
                                         "the prompt"));
  LC_ASSIGN_OR_RETURN(o.n_pos, a.integer("n_pos", 500, 1, 1 << 20,
                                         "on the fly: positions the mean query and key are repeated at (kvpress's "
                                         "q_len), tokens"));
  LC_ASSIGN_OR_RETURN(std::string q, a.choice("query", "aware", {"aware", "agnostic"},
                                              "aware: compress with the whole prompt in; agnostic: after the "
                                              "context, before the question is read (run --question, bench run)"));
  o.query_aware = q == "aware";
  std::vector<double> scores;
  if (!o.patterns.empty()) {
    LC_ASSIGN_OR_RETURN(scores, read_patterns(o.patterns, s));
  }
  return std::unique_ptr<KvPress>(std::make_unique<DuoAttentionPress>(std::move(o), s, std::move(scores)));
}

}  // namespace lc::press
