// One sequence's inference state over a Model: the KV cache, activation buffers sized for one
// prefill chunk (n_batch tokens), and the forward pass. A prompt longer than n_batch is
// evaluated chunk by chunk, so activation memory does not grow with the prompt.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "attention/backend.h"
#include "kv/kv_cache.h"
#include "kv/press.h"
#include "model/model.h"
#include "rope/rope_scaling.h"
#include "rope/rope_table.h"

namespace lc {

struct ContextParams {
  int64_t n_ctx = 0;     // 0: the model's training context (at least 512)
  int64_t n_batch = 512; // tokens per forward chunk
  int n_threads = 0;     // 0: all cores
  std::string rope;      // --rope spec; "" = the model's own rope from its GGUF metadata
  std::string attn = "dense";  // --attn spec (attention backend registry)
  int64_t kv_block = 64;       // --kv-block: tokens per KV block
  DType kv_type_k = DType::F32, kv_type_v = DType::F32;  // --kv-type-k / --kv-type-v
  int64_t kv_budget = 0;       // --kv-budget in bytes; 0 = no cap
  std::string kv_spill;        // --kv-spill DIR: cold blocks go to a file there
  std::string kv_press;        // --kv-press spec ("" or "none": no compression)
};

enum class Logits { kLast, kAll, kNone };

class Context {
 public:
  static Expected<std::unique_ptr<Context>> create(const Model& model, const ContextParams& p);
  // With an attention backend made by the caller (e.g. a calibrating one) instead of p.attn.
  static Expected<std::unique_ptr<Context>> create(const Model& model, const ContextParams& p,
                                                   std::unique_ptr<AttentionBackend> backend);

  // Appends tokens to the sequence (positions n_past() ...) and runs the forward pass.
  // kLast keeps the logits of the last token, kAll of every token of this call.
  Status decode(std::span<const int32_t> tokens, Logits which = Logits::kLast);

  // Logits of output row i of the last decode() ([n_vocab]); row 0 for kLast.
  const float* logits(int64_t i = 0) const { return logits_.data() + i * hp_.n_vocab; }
  int64_t n_outputs() const { return n_outputs_; }
  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return params_.n_ctx; }
  int64_t n_batch() const { return params_.n_batch; }
  void clear() { truncate(0); }
  // Forgets every token after the first n.
  void truncate(int64_t n) {
    n_past_ = n < n_past_ ? n : n_past_;
    kv_->truncate(n_past_);
    n_obs_ = 0;  // the observation window restarts with the next tokens
  }

  const Model& model() const { return model_; }
  const RopePlan& rope_plan() const { return *rope_plan_; }
  const KvCache& kv() const { return *kv_; }
  KvCache& kv() { return *kv_; }
  const AttentionBackend& attention() const { return *backend_; }
  const KvPress* press() const { return press_.get(); }
  ThreadPool& pool() { return pool_; }
  size_t activation_bytes() const;

 private:
  Context(const Model& model, const ContextParams& p);
  // logits: [n_tokens or 1, n_vocab] destination of this chunk's output rows.
  Status forward_chunk(const int32_t* tokens, int64_t n, Logits which, float* logits);

  const Model& model_;
  const HParams& hp_;
  ContextParams params_;
  ThreadPool pool_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<KvPress> press_;  // null: no compression
  // The press's observation window: pre-RoPE queries of the last n_obs_ tokens per layer.
  Buffer<float> obs_q_;             // [n_layer, press n_obs, n_head * head_dim]
  std::vector<int32_t> obs_pos_;    // [press n_obs]
  int64_t n_obs_ = 0;
  int64_t n_generated_ = 0;         // single-token decodes since the last prompt
  Status compress(PressPhase phase);
  void observe(int64_t il, const float* q /*[n, n_head * head_dim]*/, int64_t n);
  std::unique_ptr<RopePlan> rope_plan_;
  RopeTable rope_;        // the table in use (recomputed per chunk for dynamic scalings)
  int64_t n_past_ = 0;
  int64_t n_outputs_ = 0;

  // Activations for one chunk of at most n_batch tokens.
  Buffer<float> x_;      // [n_batch, n_embd] residual stream
  Buffer<float> cur_;    // [n_batch, max(n_embd, q_dim)]
  Buffer<float> q_;      // [n_batch, n_head * head_dim]
  Buffer<float> k_;      // [n_batch, n_head_kv * head_dim]
  Buffer<float> v_;      // [n_batch, n_head_kv * head_dim_v]
  Buffer<float> attn_;   // [n_batch, n_head * head_dim_v]
  Buffer<float> gate_;   // [n_batch, n_ff]
  Buffer<float> up_;     // [n_batch, n_ff]
  Buffer<float> embd_;   // [n_embd] one dequantised embedding row
  std::vector<int32_t> pos_;  // [n_batch]
  std::vector<float> logits_; // [n_outputs, n_vocab]
};

}  // namespace lc
