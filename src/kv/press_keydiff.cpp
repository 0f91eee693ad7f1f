// KeyDiff — Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
// Inference in Resource-Constrained Environments", arXiv 2504.15364, 2025 (kvpress KeyDiffPress).
// Keys that point where most keys point add little; the distinctive ones are kept:
//   a        = (1/n) sum_{i < n} k_i / ||k_i||      (anchor: the head's mean unit key)
//   score(j) = -cos(k_j, a)
// per KV head, over the n tokens the head holds (its protected tokens included, as kvpress
// scores every cached key). No queries are needed, so it is query-agnostic by construction.
//
// Keys are the stored post-RoPE ones, as kvpress scores the cached keys. Unlike knorm, this is
// not rotation invariant (each key is rotated by its own position), so the paper's definition
// on cached keys is what is implemented, not a pre-RoPE variant.
//
// Zero and tiny norms follow torch, which kvpress runs on: the anchor terms are
// F.normalize(k) = k / max(||k||, 1e-12), and F.cosine_similarity(k, a) (eps 1e-8) is, as
// current torch implements it (ATen Distance.cpp), <k / max(||k||, 1e-8), a / max(||a||, 1e-8)>:
// each norm clamped separately. The docs' k.a / max(||k|| ||a||, 1e-8), the older code, differs
// only when a norm or the product is below 1e-8; both give a zero key similarity 0. So a zero key
// adds nothing to the anchor but counts in n, and has similarity 0 (score 0, no NaN); a zero
// anchor (every key zero, or keys cancelling exactly) gives every token score 0, and the
// framework's ties keep the lower indices. Computed in double: the anchor sums n unit vectors,
// and a float sum's rounding error would grow with the context length.
// The paper evicts block by block as the prompt streams in (kvpress: BlockPress over
// KeyDiffPress); chunk=1 compresses after every prefill chunk in the same spirit.
#include <algorithm>
#include <cmath>

#include "kv/press_impl.h"

namespace lc::press {
namespace {

constexpr double kNormalizeEps = 1e-12;  // torch F.normalize
constexpr double kCosineEps = 1e-8;      // torch F.cosine_similarity

class KeyDiff final : public PressScorer {
 public:
  std::string name() const override { return "keydiff"; }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    score_heads_by_keys(c, il, s, out, [](const float* K, int64_t n, int64_t d, float* r) {
      std::vector<double> norm(static_cast<size_t>(n)), a(static_cast<size_t>(d), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const float* k = K + j * d;
        double q = 0;
        for (int64_t e = 0; e < d; ++e) q += static_cast<double>(k[e]) * k[e];
        norm[static_cast<size_t>(j)] = std::sqrt(q);
        const double inv = 1.0 / std::max(norm[static_cast<size_t>(j)], kNormalizeEps);
        for (int64_t e = 0; e < d; ++e) a[static_cast<size_t>(e)] += k[e] * inv;
      }
      double an = 0;
      for (double& x : a) {
        x /= static_cast<double>(n);
        an += x * x;
      }
      const double inv_an = 1.0 / std::max(std::sqrt(an), kCosineEps);
      for (int64_t j = 0; j < n; ++j) {
        const float* k = K + j * d;
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += k[e] * a[static_cast<size_t>(e)];
        const double sim = dot * inv_an / std::max(norm[static_cast<size_t>(j)], kCosineEps);
        r[j] = static_cast<float>(-sim);
      }
    });
    return ok_status();
  }
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_keydiff(Args&, const PressShape&) {
  return std::unique_ptr<PressScorer>(std::make_unique<KeyDiff>());
}

}  // namespace lc::press
