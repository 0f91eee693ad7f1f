// AdamW (the update itself is grad::adam_update) with linear warm-up then cosine decay, and
// clipping by the global gradient norm.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "train/transformer.h"

namespace lc::train {

struct OptimConfig {
  float lr = 1e-3f;            // peak learning rate
  float min_lr_ratio = 0.1f;   // the cosine ends at lr * min_lr_ratio
  int64_t warmup = 0;          // steps of linear warm-up
  int64_t steps = 1000;        // total steps: the cosine reaches its floor at the last one
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;   // decoupled, on matrices only
  float grad_clip = 1.0f;      // max global L2 norm; 0 disables
};

Status validate(const OptimConfig& o);

// Learning rate of optimizer step `step` (0-based): (step + 1) / warmup * lr during warm-up,
// then a cosine from lr down to lr * min_lr_ratio at step steps - 1.
float learning_rate(const OptimConfig& o, int64_t step);

// Global L2 norm of g: [n], summed in double over a fixed split (deterministic per thread count).
double global_norm(const float* g, size_t n, ThreadPool& pool);

class AdamW {
 public:
  explicit AdamW(size_t n_params) : m_(n_params), v_(n_params) {}
  // One update of params: [n] from grads: [n] (already clipped) at learning rate lr;
  // `tensors` says which ranges take weight decay.
  void update(const OptimConfig& o, float lr, float* params, const float* grads,
              const std::vector<ParamTensor>& tensors, ThreadPool& pool);
  int64_t t() const { return t_; }
  void set_t(int64_t t) { t_ = t; }
  float* m() { return m_.data(); }  // [n] first moments
  float* v() { return v_.data(); }  // [n] second moments
  size_t size() const { return m_.size(); }

 private:
  Buffer<float> m_, v_;
  int64_t t_ = 0;  // updates done
};

}  // namespace lc::train
