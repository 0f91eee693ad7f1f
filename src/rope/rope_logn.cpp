// `logn`: attention logit scaling by the log of the position.
// Qwen (2023, "logn attention", modeling_qwen.py) and the critical-scaling analysis of
// seeds/000 ("attention scaling ... critical scaling β_n ≍ log n", justifying YaRN's and
// Qwen's scaling): softmax over n keys flattens as n grows; multiplying the logits of the
// query at 1-based position n by log_L0(n) beyond the training length keeps its entropy in
// range. Applied to q (so the logits scale once):
//   q_n *= max(1, ln n / ln L0),   n = pos + 1.
// It composes with any position method: `SPEC+logn` or `SPEC+logn:orig=N`.
#include <cmath>

#include "kernels/kernels.h"
#include "rope/rope_method.h"

namespace lc {

float logn_scale(int64_t pos, int64_t l0) {
  const int64_t n = pos + 1;
  if (n <= l0) return 1.0f;
  return static_cast<float>(std::log(static_cast<double>(n)) / std::log(static_cast<double>(l0)));
}

void RopePlan::scale_q(float* q, int64_t n_tokens, int64_t n_head, int64_t head_dim,
                       const int32_t* pos) const {
  if (!logn()) return;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float f = q_scale(pos[t]);
    if (f != 1.0f) kernels::scale_inplace(q + t * n_head * head_dim, f, n_head * head_dim);
  }
}

namespace rope_detail {

const RopeMethodDef& method_logn() {
  static const RopeMethodDef def{
      "logn", "q at 1-based position n scaled by max(1, ln n / ln L0); composes: SPEC+logn",
      "attention-logit scaling with log n (seeds/000, critical scaling beta_n ~ log n); Qwen's "
      "logn attention (Bai et al., \"Qwen Technical Report\", arXiv 2309.16609, 2023)",
      {{"orig", KeyKind::kPositiveInt, kDefaultCtxTrain, "training context L0 (>= 2)"}},
      nullptr};
  return def;
}

}  // namespace rope_detail
}  // namespace lc
