// The shape of a model the trainer builds: the same Llama architecture the engine runs
// (token embedding, RMSNorm, RoPE on adjacent pairs, GQA attention, SwiGLU MLP, tied or separate
// output matrix), so an exported file is an ordinary `llama` GGUF.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace lc::train {

struct ModelConfig {
  int64_t n_layer = 4;
  int64_t n_embd = 128;
  int64_t n_head = 4;
  int64_t n_head_kv = 0;   // 0: n_head; fewer: grouped-query attention
  int64_t n_ff = 0;        // 0: 8/3 * n_embd rounded up to a multiple of 32 (Llama's ratio)
  int64_t n_vocab = 0;     // from the tokenizer GGUF
  int64_t n_ctx = 0;       // context written as context_length; 0: the training sequence length
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied = true;        // output matrix = token embedding
  int64_t fixed_distance = 0;  // > 0: keys further than this attended as if this far (grad::AttnDims)
  int64_t logn_orig = 0;       // > 0: q at position n scaled by max(1, ln n / ln logn_orig) (rope `logn`)

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t q_dim() const { return n_head * head_dim(); }
  int64_t kv_dim() const { return n_head_kv * head_dim(); }
};

// Fills n_ff when 0 and checks every field; the error names the field and the rule.
Expected<ModelConfig> resolve_config(ModelConfig c);

// A short description ("4 layers, n_embd 128, ...") for logs and docs.
std::string describe(const ModelConfig& c);

}  // namespace lc::train
