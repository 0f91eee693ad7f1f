// Token sampling: logit biases, repetition penalty, top-k, top-p, min-p, temperature, then a
// draw (or argmax when temperature <= 0). The order follows llama.cpp's default sampler chain.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <utility>
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
  // OpenAI's logit_bias (llama.cpp's --logit-bias): bias added to a token's logit before
  // anything else, in [-100, 100], or -infinity to ban the token. Ids at or past the model's
  // vocabulary are refused by the callers, which know it.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

Status validate(const SamplerParams& p);

// One --logit-bias value, llama.cpp's form: TOKEN_ID followed by +BIAS or -BIAS ("15043+1.5",
// "29871-inf": a ban). Errors name the value.
Expected<std::pair<int32_t, float>> parse_logit_bias(std::string_view text);
// An error naming the first biased token id at or past n_vocab.
Status check_logit_bias_vocab(const SamplerParams& p, int32_t n_vocab);

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
