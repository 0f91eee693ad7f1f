// Writes random-weight GGUF models of a given shape (benchmarks, tests of the loader), with
// the tokenizer copied from another GGUF file.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace lc {

struct RandomModelSpec {
  int64_t n_layer = 30, n_embd = 576, n_head = 9, n_head_kv = 3, n_ff = 1536;
  int64_t n_ctx_train = 8192;
  float rope_base = 100000.0f;
  bool tied = true;
  DType weight_type = DType::F16;  // all 2-D weights; norms stay f32
  uint64_t seed = 42;
  std::string vocab_path;          // a GGUF whose tokenizer.* keys are copied
};

// SmolLM2-135M's shape.
RandomModelSpec smollm2_135m_spec();

Status write_random_model(const RandomModelSpec& spec, const std::string& out_path);

}  // namespace lc
