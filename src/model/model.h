// A loaded model: hyper-parameters, weights as views into the mapped GGUF file, tokenizer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "tokenizer/tokenizer.h"

namespace lc {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  TensorView wq;                     // [n_embd -> n_head * head_dim]
  TensorView wk;                     // [n_embd -> n_head_kv * head_dim]
  TensorView wv;                     // [n_embd -> n_head_kv * head_dim_v]
  TensorView wo;                     // [n_head * head_dim_v -> n_embd]
  const float* bq = nullptr;         // [n_head * head_dim] (qwen2)
  const float* bk = nullptr;         // [n_head_kv * head_dim]
  const float* bv = nullptr;         // [n_head_kv * head_dim_v]
  const float* q_norm = nullptr;     // [head_dim] (qwen3)
  const float* k_norm = nullptr;     // [head_dim]
  const float* ffn_norm = nullptr;   // [n_embd]
  TensorView w_gate;                 // [n_embd -> n_ff]
  TensorView w_up;                   // [n_embd -> n_ff]
  TensorView w_down;                 // [n_ff -> n_embd]
};

class Model {
 public:
  // Loads and validates a GGUF model (architecture, hyper-parameters, every tensor's presence,
  // shape and type). Errors name the file and the problem.
  static Expected<std::unique_ptr<Model>> load(const std::string& path);
  // Loads from a GGUF image in memory that outlives the model (the embedded default model).
  static Expected<std::unique_ptr<Model>> load_memory(const uint8_t* data, size_t size,
                                                      const std::string& name);

  const HParams& hparams() const { return hp_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  const gguf::File& file() const { return *file_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const TensorView& tok_embd() const { return tok_embd_; }  // [n_embd, n_vocab]
  const TensorView& output() const { return output_; }      // [n_embd -> n_vocab]
  const float* output_norm() const { return output_norm_; } // [n_embd]
  bool tied_output() const { return tied_; }
  // Per-pair divisors of the rope frequencies (Llama 3.1 rope_freqs); empty if absent.
  const std::vector<float>& rope_freq_factors() const { return rope_freqs_; }
  size_t weight_bytes() const;

 private:
  static Expected<std::unique_ptr<Model>> from_file(std::unique_ptr<gguf::File> file);
  Status bind(const std::string& path);
  Expected<TensorView> matrix(const std::string& name, int64_t n_in, int64_t n_out, bool required);
  Expected<const float*> vec(const std::string& name, int64_t n, bool required);
  void pack_matrices();

  HParams hp_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<LayerWeights> layers_;
  TensorView tok_embd_, output_;
  const float* output_norm_ = nullptr;
  bool tied_ = false;
  std::vector<float> rope_freqs_;
  // Small vectors (norms, biases) stored in another type are widened to f32 here.
  std::vector<std::vector<float>> owned_;
  std::vector<Buffer<uint8_t>> packed_;  // row-interleaved copies the views' `packed` point into
};

}  // namespace lc
