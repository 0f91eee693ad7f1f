// The trainable Llama model: parameters and their gradients in one flat buffer each, the
// activations of one sequence of up to max_tokens saved for the backward pass, all allocated
// once at creation (no allocation per step). T = float trains; T = double exists so the tests
// can check the whole model's gradients against finite differences.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "rope/rope_table.h"
#include "train/block.h"
#include "train/config.h"

namespace lc::train {

// One parameter tensor inside the flat buffer, under its GGUF name and shape.
struct ParamTensor {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the row length (n_in of a matrix)
  size_t offset = 0;        // in elements
  size_t size = 0;          // in elements
  bool decay = false;       // weight decay applies (matrices), not to norms
};

template <class T>
class Transformer {
 public:
  // max_tokens: the longest sequence forward() will see (sizes the saved activations).
  static Expected<std::unique_ptr<Transformer>> create(const ModelConfig& c, int64_t max_tokens);

  const ModelConfig& config() const { return c_; }
  int64_t max_tokens() const { return max_t_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor* find(const std::string& name) const;
  // Offsets of block il's tensors in params() and grads().
  const BlockOffsets& block(int64_t il) const { return layers_[static_cast<size_t>(il)]; }
  size_t n_params() const { return params_.size(); }
  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  size_t activation_bytes() const;

  // Norm weights 1; matrices N(0, std), the residual outputs (attn_output, ffn_down) scaled by
  // 1/sqrt(2 n_layer) as in GPT-2.
  void init(uint64_t seed, double std = 0.02);
  void zero_grads();

  // tokens, targets: [n] (n <= max_tokens; targets may be null: logits only). Token t sits at
  // position t. A target of -1 ignores that position (no loss, no gradient): the curriculum
  // scores answers only. Returns the mean cross-entropy over the scored tokens (0 without
  // targets or when none is scored).
  double forward(const int32_t* tokens, const int32_t* targets, int64_t n, ThreadPool& pool);
  // [n, n_vocab] logits of the last forward(); backward() overwrites them.
  const T* logits() const { return logits_.data(); }
  // Scored positions (target >= 0) of the last forward().
  int64_t n_targets() const { return n_targets_; }
  // Adds loss_scale * d(sum of the last forward's token losses)/d(params) to grads(). Needs a
  // forward() with targets just before.
  void backward(T loss_scale, ThreadPool& pool);

 private:
  BlockActs<T> acts(int64_t il);  // layer il's slots of the saved activations
  grad::AttnDims attn_dims(int64_t n) const;  // the attention of an n-token window
  Transformer() = default;
  void layout();
  void allocate();

  ModelConfig c_;
  int64_t max_t_ = 0;
  std::vector<ParamTensor> tensors_;
  std::vector<BlockOffsets> layers_;
  size_t tok_embd_ = 0, output_norm_ = 0, output_ = 0;  // output_ == tok_embd_ when tied
  Buffer<T> params_, grads_;
  RopeTable rope_, rope_inv_;
  std::vector<int32_t> pos_, tokens_, targets_;  // [max_tokens]
  int64_t n_ = 0;                                // tokens of the last forward
  bool have_targets_ = false;
  int64_t n_targets_ = 0;                        // targets >= 0 of the last forward

  // Saved activations; per-layer slots are max_tokens rows long.
  Buffer<T> resid_;        // [n_layer + 1, T, n_embd] input of each layer, then the final one
  Buffer<T> mid_;          // [n_layer, T, n_embd] residual after attention
  Buffer<T> ln1_, ln2_;    // [n_layer, T, n_embd] normalised inputs of attention / MLP
  Buffer<T> rstd1_, rstd2_;// [n_layer, T]
  Buffer<T> q_, att_;      // [n_layer, T, q_dim] rotated queries, attention output
  Buffer<T> k_, v_;        // [n_layer, T, kv_dim] rotated keys, values
  Buffer<T> probs_;        // [n_layer, n_head, T, T]
  Buffer<T> gate_, up_, h_;// [n_layer, T, n_ff]
  Buffer<T> lnf_, rstdf_;  // [T, n_embd], [T]
  Buffer<T> logits_;       // [T, n_vocab] (then dlogits)
  Buffer<T> lse_, losses_; // [T]
  // Backward scratch, reused by every layer.
  Buffer<T> dresid_, dln_, tmp_;   // [T, n_embd]
  Buffer<T> datt_, dq_;            // [T, q_dim]
  Buffer<T> dk_, dv_;              // [T, kv_dim]
  Buffer<T> dh_, dgate_, dup_;     // [T, n_ff]
  Buffer<T> dscores_;              // [n_head, T, T]
};

extern template class Transformer<float>;
extern template class Transformer<double>;

// The rope the engine derives from a llama GGUF of this config (adjacent pairs, n_rot =
// head_dim, no scaling): trainer and inference rotate identically.
RopeTable make_train_rope(const ModelConfig& c);

}  // namespace lc::train
