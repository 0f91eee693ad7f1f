// Rotary position tables from a model's hyper-parameters, computed the way llama.cpp's ggml
// rope (with YaRN) computes its angles: the angle of pair i at position p is p * inv_freq[i].
#pragma once

#include <vector>

#include "model/hparams.h"

namespace lc {

struct RopeTable {
  std::vector<float> inv_freq;  // [n_rot / 2]
  float mscale = 1.0f;          // multiplies cos and sin (YaRN attention factor)
};

// freq_factors: per-pair divisors (rope_freqs tensor, Llama 3.1), may be empty.
RopeTable make_rope_table(const HParams& hp, const std::vector<float>& freq_factors);

}  // namespace lc
