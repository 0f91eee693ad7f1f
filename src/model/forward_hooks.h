// The points where methods attach to a Context's forward pass: the press runner
// (model/press_runner.h: scheduling, the observation window, H2O's observer, the draft-guided
// presses) and the query recorder (model/query_window.h). A Context calls every attached hook,
// in the order attached, at these points and nowhere else; the forward pass itself never asks
// which method is running.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"

namespace lc {

class AttentionBackend;
class Context;

// Which logits a decode() keeps: of the last token, of every token, or none.
enum class Logits { kLast, kAll, kNone };

// What a Context's decode() is evaluating: a prompt (more than one token, or the context part of
// a query-agnostic prompt) or one generated token.
struct DecodeCall {
  bool prompt = false;
  bool context_part = false;  // Context::decode_context(): the document before the question
  Logits which = Logits::kLast;
};

class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // A prompt is about to be evaluated into ctx. A hook may choose the tokens evaluated instead
  // (SpecPC: the prompt tokens a draft selects) by filling `replace`; it must not be empty.
  virtual Status before_prompt(Context& ctx, std::span<const int32_t> prompt, const DecodeCall& call,
                               std::optional<std::vector<int32_t>>& replace) {
    return ok_status();
  }
  // Layer il's queries of the n tokens at positions pos ([n, n_head * head_dim], before RoPE,
  // after logit scaling), before they attend.
  virtual void on_queries(int64_t il, const float* q, const int32_t* pos, int64_t n) {}
  // The same queries after layer il's attention: ctx.kv() holds what they attended.
  virtual void on_attention(Context& ctx, int64_t il, const float* q, const int32_t* pos, int64_t n) {}
  // After every chunk of a prompt but the last.
  virtual Status after_chunk(Context& ctx) { return ok_status(); }
  // After the whole prompt is in, and after every single generated token.
  virtual Status after_prompt(Context& ctx, const DecodeCall& call) { return ok_status(); }
  virtual Status after_token(Context& ctx) { return ok_status(); }
  // The sequence was cut back to n tokens (Context::truncate, clear).
  virtual void on_truncate(int64_t n) {}
  // A backend about to serve the context: an error refuses it (a hook that cannot work with
  // it); a hook may ask it for what it needs (e.g. row log-sum-exps).
  virtual Status attach_backend(AttentionBackend& backend) { return ok_status(); }
};

}  // namespace lc
