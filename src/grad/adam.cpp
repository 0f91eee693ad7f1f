#include "grad/adam.h"

#include <cmath>

namespace lc::grad {

void adam_update(const AdamParams& a, int64_t t, float lr, float* params, const float* grads, float* m, float* v,
                 int64_t n, ThreadPool& pool) {
  const float b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
  const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), static_cast<double>(t)));
  const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), static_cast<double>(t)));
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * grads[i];
      v[i] = b2 * v[i] + (1.0f - b2) * grads[i] * grads[i];
      const float mh = m[i] / c1, vh = v[i] / c2;
      params[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * params[i]);
    }
  }, 256);
}

}  // namespace lc::grad
