// Draft models (SpecKV / SpecPC, Galim et al., arXiv 2506.08373): a small model that reads the
// same token ids as the target. Token ids are only interchangeable when both vocabularies are
// the same list of pieces, so a draft is checked piece by piece before use.
//
// The draft interface of the draft-guided presses: DraftRunner runs the draft greedily in a
// context of its own and records its last queries; the press runner (model/press_runner.h)
// asks it for lookahead tokens (SpecKV) and for its attention over a prompt (SpecPC).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/context.h"
#include "model/model.h"
#include "model/query_window.h"

namespace lc {

// Ok when draft's vocabulary is target's (same size, the same piece for every id); otherwise an
// error naming both files and the first difference.
Status check_draft_vocab(const Model& target, const std::string& target_name, const Model& draft,
                         const std::string& draft_name);

class DraftRunner {
 public:
  // base: the target context's settings; the draft's context takes its size, batch, threads
  // and KV block (and nothing else: no press, no rope or attention change).
  DraftRunner(const Model& draft, std::string name, const ContextParams& base);
  // The draft's greedy continuation of `prompt` by n tokens (lowest id on ties), read from an
  // empty draft context. The queries of its last `record` tokens (the prompt's and the n - 1
  // generated tokens fed back) are kept in recorded(). stop_at_eog: the continuation ends with
  // the first end-of-generation token it produces (an answer; SpecKV's lookahead, as the
  // authors' draft.generate with max_new_tokens).
  Expected<std::vector<int32_t>> generate(std::span<const int32_t> prompt, int64_t n, int64_t record,
                                          bool stop_at_eog = false);
  // The draft's context after generate(): its cache holds the prompt and the tokens fed back.
  const Context& context() const { return *ctx_; }
  const QueryWindow& recorded() const { return recorder_->window(); }
  // Empties the draft's context (its memory stays for the next call).
  void clear();

 private:
  const Model& model_;
  std::string name_;
  ContextParams base_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<QueryRecorder> recorder_;
};

}  // namespace lc
