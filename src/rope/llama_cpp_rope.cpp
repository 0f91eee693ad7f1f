#include "rope/rope_table.h"

#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>

namespace lc {
namespace {

// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
// Models"): the dimension at which a pair's wavelength spans n_ctx_orig / beta rotations.
double yarn_corr_dim(double n_rot, double n_ctx_orig, double beta, double base) {
  return n_rot * std::log(n_ctx_orig / (beta * 2.0 * M_PI)) / (2.0 * std::log(base));
}

}  // namespace

void RopeTable::apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim,
                      const int32_t* pos) const {
  kernels::rope_apply(x, n_tokens, n_head, head_dim, n_rot, pos, inv_freq.data(), mscale, neox);
}

RopeTable make_llama_cpp_rope(const LlamaCppRopeParams& hp) {
  const std::vector<float>& freq_factors = hp.freq_factors;
  RopeTable t;
  t.n_rot = hp.n_rot;
  t.neox = hp.neox;
  const int64_t n_pairs = hp.n_rot / 2;
  t.inv_freq.resize(static_cast<size_t>(n_pairs));
  const double freq_scale = hp.freq_scale;
  double low = 0, high = 0;
  const bool yarn = hp.ext_factor != 0.0f;
  if (yarn) {
    const double n_rot = static_cast<double>(hp.n_rot);
    low = std::max(0.0, std::floor(yarn_corr_dim(n_rot, static_cast<double>(hp.orig_ctx),
                                                 hp.beta_fast, hp.base)));
    high = std::min(n_rot - 1, std::ceil(yarn_corr_dim(n_rot, static_cast<double>(hp.orig_ctx),
                                                       hp.beta_slow, hp.base)));
  }
  for (int64_t i = 0; i < n_pairs; ++i) {
    double extrap = std::pow(static_cast<double>(hp.base),
                             -2.0 * static_cast<double>(i) / static_cast<double>(hp.n_rot));
    if (!freq_factors.empty()) extrap /= freq_factors[static_cast<size_t>(i)];
    double f = freq_scale * extrap;  // interpolated
    if (yarn) {
      const double y = (static_cast<double>(i) - low) / std::max(0.001, high - low);
      const double ramp = (1.0 - std::clamp(y, 0.0, 1.0)) * hp.ext_factor;
      f = f * (1.0 - ramp) + extrap * ramp;
    }
    t.inv_freq[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  t.mscale = hp.attn_factor;
  if (yarn) t.mscale *= static_cast<float>(1.0 + 0.1 * std::log(1.0 / freq_scale));
  return t;
}

}  // namespace lc
