// Rotary position tables: the angle of pair i at position p is p * inv_freq[i]; cos and sin are
// multiplied by mscale. Every RoPE scaling method computes one of these; one kernel applies it.
#pragma once

#include <cstdint>
#include <vector>

namespace lc {

struct RopeTable {
  std::vector<float> inv_freq;  // [n_rot / 2]
  float mscale = 1.0f;          // multiplies cos and sin (YaRN attention factor)
  int64_t n_rot = 0;            // rotated dims per head (the first n_rot of head_dim)
  bool neox = false;            // rotate (x[i], x[i + n_rot/2]) instead of (x[2i], x[2i+1])

  // Rotates x: [n_tokens, n_head, head_dim] in place, token t at position pos[t].
  void apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, const int32_t* pos) const;
};

// The model's own rope as llama.cpp computes it from GGUF metadata (base, linear/YaRN scaling,
// rope_freqs divisors): the default when no --rope override is given.
struct LlamaCppRopeParams {
  int64_t n_rot = 0;
  bool neox = false;
  float base = 10000.0f;
  float freq_scale = 1.0f;      // 1 / scaling factor
  float ext_factor = 0.0f;      // 1 for YaRN
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int64_t orig_ctx = 0;
  std::vector<float> freq_factors;  // per-pair divisors (rope_freqs), may be empty
};
RopeTable make_llama_cpp_rope(const LlamaCppRopeParams& p);

}  // namespace lc
