#include "train/optimizer.h"

#include <array>
#include <cmath>

#include "grad/adam.h"

namespace lc::train {

Status validate(const OptimConfig& o) {
  auto bad = [](const char* m) { return Status(make_error(std::string("optimizer: ") + m)); };
  if (!(o.lr > 0.0f) || !std::isfinite(o.lr)) return bad("learning rate must be > 0");
  if (!(o.min_lr_ratio >= 0.0f && o.min_lr_ratio <= 1.0f)) return bad("min lr ratio must be in [0, 1]");
  if (o.steps < 1) return bad("steps must be >= 1");
  if (o.warmup < 0 || o.warmup > o.steps) return bad("warm-up must be in [0, steps]");
  if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f) || !(o.beta2 >= 0.0f && o.beta2 < 1.0f))
    return bad("betas must be in [0, 1)");
  if (!(o.eps > 0.0f)) return bad("eps must be > 0");
  if (!(o.weight_decay >= 0.0f) || !std::isfinite(o.weight_decay)) return bad("weight decay must be >= 0");
  if (!(o.grad_clip >= 0.0f) || !std::isfinite(o.grad_clip)) return bad("gradient clip must be >= 0");
  return ok_status();
}

float learning_rate(const OptimConfig& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<float>(step + 1) / static_cast<float>(o.warmup);
  const int64_t span = o.steps - 1 - o.warmup;
  if (span <= 0) return o.lr;
  const double f = std::min(1.0, static_cast<double>(step - o.warmup) / static_cast<double>(span));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * f));  // 1 -> 0
  const double floor = o.min_lr_ratio;
  return static_cast<float>(o.lr * (floor + (1.0 - floor) * cosine));
}

double global_norm(const float* g, size_t n, ThreadPool& pool) {
  // One partial sum per thread, on the stack: no allocation per step.
  constexpr int kMaxThreads = 1024;
  LC_CHECK(pool.size() <= kMaxThreads);
  std::array<double, kMaxThreads> part{};
  pool.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int ith) {
    double s = 0;
    for (int64_t i = b; i < e; ++i) s += static_cast<double>(g[i]) * g[i];
    part[static_cast<size_t>(ith)] = s;
  }, 1024);
  double s = 0;
  for (int i = 0; i < pool.size(); ++i) s += part[static_cast<size_t>(i)];
  return std::sqrt(s);
}

void AdamW::update(const OptimConfig& o, float lr, float* params, const float* grads,
                   const std::vector<ParamTensor>& tensors, ThreadPool& pool) {
  ++t_;
  for (const ParamTensor& pt : tensors) {
    const grad::AdamParams a{o.beta1, o.beta2, o.eps, pt.decay ? o.weight_decay : 0.0f};
    grad::adam_update(a, t_, lr, params + pt.offset, grads + pt.offset, m_.data() + pt.offset, v_.data() + pt.offset,
                      static_cast<int64_t>(pt.size), pool);
  }
}

}  // namespace lc::train
