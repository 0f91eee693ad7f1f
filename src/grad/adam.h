// The Adam update (Kingma & Ba 2015) with decoupled weight decay (AdamW, Loshchilov & Hutter
// 2019), shared by the trainer (train::AdamW: schedule, clipping, decay on matrices only) and
// qTTT (plain Adam on W_q). The caller keeps the moments and the step count.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace lc::grad {

struct AdamParams {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: p -= lr * weight_decay * p
};

// Update number t (1-based; it sets the bias corrections c1 = 1 - beta1^t, c2 = 1 - beta2^t) of
// params: [n] from grads: [n], the moments m, v: [n] updated in place:
//   m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2,
//   p -= lr * ((m / c1) / (sqrt(v / c2) + eps) + weight_decay * p).
// Element-wise, so the result does not depend on the pool's size.
void adam_update(const AdamParams& a, int64_t t, float lr, float* params, const float* grads, float* m, float* v,
                 int64_t n, ThreadPool& pool);

}  // namespace lc::grad
