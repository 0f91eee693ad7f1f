// A method setting of the run matrix: the registry names of a RoPE scaling, an attention
// backend and a KV press, with their parameters ("yarn:factor=8", "topk:k=16", "snapkv:ratio=0.5").
// make_session_for() is the one place that turns a setting into a runtime::Session: RoPE,
// attention and press specs go to their registries through ContextParams, and the Session
// checks a qTTT setting against them (it needs the whole cache: dense or fixed, no press).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "model/context.h"
#include "model/model.h"
#include "runtime/qttt.h"
#include "runtime/session.h"

namespace lc::bench {

struct MethodSetting {
  std::string name;            // label in reports; empty: made from the specs
  std::string rope = "gguf";   // "" or "gguf": the scaling the GGUF file asks for
  std::string attn;  // empty: the model's default (dense, or fixed)
  std::string press = "none";
  std::string qttt = "none";   // "steps=N,lr=X,span=S": query-only test-time training (runtime/qttt.h)
  // A reading agent (src/readers, "memagent:chunk=..."); "none": the prompt is read whole.
  // With a reader, rope, attention and press apply inside each of its model calls.
  std::string reader = "none";
  // A GGUF path: the setting runs on that model only (added to the run's models when missing);
  // empty: on every model of the run.
  std::string model;
  bool has_reader() const;
  std::string label() const;   // name, or the non-default specs joined by " + ", or "baseline"
};

// "rope=yarn:factor=8;attn=dense;press=none;qttt=steps=8,lr=1e-3,span=128;reader=memagent;model=M.gguf;name=yarn8"
// (any subset, ';'-separated).
Expected<MethodSetting> parse_method(std::string_view text);
// The setting's qTTT parameters (steps == 0: off).
Expected<QtttParams> qttt_params(const MethodSetting& m);
// p gives everything but the methods (context size, batch, threads, KV cache settings, draft).
Expected<std::unique_ptr<Session>> make_session_for(const Model& model, const MethodSetting& m,
                                                    const ContextParams& p);

}  // namespace lc::bench
