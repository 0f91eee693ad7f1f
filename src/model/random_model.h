// Writes random-weight GGUF models of a given shape (benchmarks, tests of the loader), with
// the tokenizer copied from another GGUF file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace lc {

// How the 2-D weights are typed. kUniform: every matrix has weight_type (as llama-quantize
// --pure writes it). The others are llama.cpp's k-quant mixtures, each tensor typed as
// llama-quantize picks it for that file type (random_model.cpp says which of its rules apply).
enum class WeightMix { kUniform, kQ4_K_M, kQ5_K_M, kQ6_K };

struct RandomModelSpec {
  std::string arch = "llama";  // general.architecture: llama or qwen2
  int64_t n_layer = 30, n_embd = 576, n_head = 9, n_head_kv = 3, n_ff = 1536;
  int64_t n_ctx_train = 8192;
  float rope_base = 100000.0f;
  float rms_eps = 1e-5f;
  bool tied = true;                // no output.weight: token_embd is also the LM head
  bool qkv_bias = false;           // attn_q/attn_k/attn_v biases (f32), as Qwen2 has
  DType weight_type = DType::F16;  // all 2-D weights when mix is kUniform; norms and biases stay f32
  WeightMix mix = WeightMix::kUniform;
  uint64_t seed = 42;
  std::string vocab_path;          // a GGUF whose tokenizer.* keys are copied
};

// SmolLM2-135M's shape.
RandomModelSpec smollm2_135m_spec();
// Qwen2.5-0.5B's shape: qwen2, 24 layers, 896 wide, 14 query and 2 KV heads of 64, Q/K/V biases.
RandomModelSpec qwen25_05b_spec();
// The shapes by the names make-model takes ("smollm2-135m", "qwen2.5-0.5b"); an unknown name
// is an error that lists them.
Expected<RandomModelSpec> model_shape(const std::string& name);
std::vector<std::string> model_shape_names();

// Sets spec.weight_type / spec.mix from a type name: a plain type ("f16", "q8_0", "q4_k", ...:
// every matrix of that type) or a llama.cpp mixture ("q4_k_m", "q5_k_m", "q6_k"). An unknown
// or unwritable name is an error that lists the accepted ones.
Status set_weight_type(RandomModelSpec& spec, const std::string& name);

Status write_random_model(const RandomModelSpec& spec, const std::string& out_path);

}  // namespace lc
