// Token sampling: repetition penalty, top-k, top-p, min-p, temperature, then a draw (or
// argmax when temperature <= 0). The order follows llama.cpp's default sampler chain.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"

namespace lc {

struct SamplerParams {
  float temp = 0.8f;
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  // OpenAI's presence and frequency penalties, as llama.cpp applies them: a token seen c > 0
  // times in the last repeat_last_n tokens loses c * frequency_penalty + presence_penalty.
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // 0: off
  int32_t repeat_last_n = 64;
  uint64_t seed = 0;
};

Status validate(const SamplerParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);
  // Picks the next token from logits [n_vocab]; history: the tokens so far (for penalties).
  int32_t sample(const float* logits, int32_t n_vocab, std::span<const int32_t> history);

 private:
  struct Cand {
    int32_t id;
    float logit;
  };
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<Cand> cands_;
  std::vector<float> probs_;
};

// Index of the largest value; ties go to the lowest index.
int32_t argmax(const float* x, int32_t n);

}  // namespace lc
