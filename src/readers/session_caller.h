// The engine's ModelCaller: each call is a fresh request of a runtime::Session (so the
// Session's rope, attention, press and qTTT settings apply inside every call), its prompt
// rendered through the model's chat template, or as plain text for a model without one.
#pragma once

#include <memory>
#include <vector>

#include "readers/reader.h"
#include "runtime/session.h"
#include "tasks/tasks.h"

namespace lc::readers {

class SessionCaller final : public ModelCaller {
 public:
  // The Session and the sampler outlive the caller. reuse_prefix: a call keeps the cache of the
  // prompt it shares with the previous call (the template and the question) and evaluates the
  // rest (Session::continue_with), where that gives what a fresh request gives: no press, no
  // qTTT, an attention that neither evicts nor relabels positions.
  SessionCaller(Session& session, Sampler& sampler, ChatTemplate tmpl, bool reuse_prefix = true);
  Expected<std::string> call(const std::string& user, const std::string& reply_prefix, int64_t max_tokens,
                             const std::vector<std::string>& stop, CallCost& cost) override;
  // Call i in a Session of its own (the caller's Session for the first, others made once with
  // its settings and kept), each prompt prefilled in its context, then every reply generated
  // as one row of a decode batch per token (Context::decode_batch). The replies equal call()'s
  // one after another at temperature 0; with sampling, each row samples from a copy of the
  // caller's sampler. Runs the calls one after another when the Sessions' passes go through a
  // StepGate (the server batches them there) or qTTT is on.
  Expected<std::vector<std::string>> call_batch(const std::vector<std::string>& users, const std::string& reply_prefix,
                                                int64_t max_tokens, const std::vector<std::string>& stop,
                                                std::vector<CallCost>& costs) override;
  int64_t prompt_tokens(const std::string& user, const std::string& reply_prefix) const override;
  const Tokenizer& tokenizer() const override { return session_.model().tokenizer(); }
  int64_t default_window() const override;
  // A conversation in a Session of its own, made with the same model and settings as the one
  // the caller runs calls in.
  Expected<std::unique_ptr<Conversation>> converse() override;

 private:
  Session& session_;
  Sampler& sampler_;
  bool reuse_ = false;
  bool first_ = true;
  std::vector<std::unique_ptr<Session>> extra_;  // call_batch's other Sessions
  std::vector<char> extra_first_;                // whether each has served no call yet
  tasks::PromptRenderer render_;
};

}  // namespace lc::readers
