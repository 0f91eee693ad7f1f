// Factories of the attention methods and the common base of the fast backends (internal to
// src/attention; the public entry point is make_attention_backend in backend.h).
#pragma once

#include <memory>
#include <vector>

#include "attention/backend.h"
#include "attention/exec.h"
#include "core/method_spec.h"

namespace lc {

using BackendPtr = std::unique_ptr<AttentionBackend>;

// make_<name> of every method in the registry list (<name>.cpp).
#define LC_ATTENTION(name, help, paper) Expected<BackendPtr> make_##name(MethodSpec& spec, const AttnShape& s);
#include "attention/attention_list.h"

// Base of the backends built on attn::Runner: owns the rotated query copies.
class ExecBackend : public AttentionBackend {
 public:
  // The kept log-sum-exps (finish() writes them), for the backends that attend detached shards.
  const float* partial_lse() const override {
    return supports_detached() && keep_partial_ && !lse_.empty() ? lse_.data() : nullptr;
  }

  // Tokens per split-K segment of dense attention (rounded down to whole KV blocks).
  static constexpr int64_t kDefaultSplit = 1024;
  // The help line of the split= key every ExecBackend reads.
  static constexpr const char* kSplitHelp =
      "tokens per split-K segment (whole KV blocks): with too few tiles for the threads (decoding), a row's keys "
      "run in such segments on several threads";

 protected:
  using AttentionBackend::AttentionBackend;

  // Checks the call, fills ctx, makes variant 0 (q rotated at pos, scaled) and prepares the
  // selection record.
  Status begin_forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                       attn::ExecCtx& ctx);
  // Variant v: q rotated at qpos[t] (copied, so the caller's array may be scratch).
  void add_variant(int v, const float* q, const int32_t* qpos, const KvCache& kv, attn::ExecCtx& ctx);
  // Dense attention of every row over every visible token of its KV head; splits the keys
  // across threads (split-K) when there are too few tiles, with bit-identical results.
  void run_dense(const attn::ExecCtx& ctx, ThreadPool& pool);

  // Runs spans[i] (each inside one KV block, all rows) for item i. With fewer than 4 items per
  // thread (decoding), an item's spans are cut into units of about split_ tokens that run on
  // different threads, whose partial softmax states are merged per item in order (split-K).
  void run_spans(const attn::ExecCtx& ctx, const std::vector<attn::Item>& items,
                 const std::vector<std::vector<attn::Span>>& spans, ThreadPool& pool);

  int64_t split_ = kDefaultSplit;
  std::vector<float> partials_;  // split-K partial states
  std::vector<float> lse_;       // [n, n_head] of the last forward, with keep_row_lse or keep_partial_lse

  Buffer<float> qbuf_[attn::kMaxVariants];     // [n, n_head, head_dim] each
  std::vector<int32_t> qpos_[attn::kMaxVariants];  // [n] each
};

}  // namespace lc
