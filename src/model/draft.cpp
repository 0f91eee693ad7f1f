#include "model/draft.h"

namespace lc {

Status check_draft_vocab(const Model& target, const std::string& target_name, const Model& draft,
                         const std::string& draft_name) {
  const Tokenizer& a = target.tokenizer();
  const Tokenizer& b = draft.tokenizer();
  if (a.n_vocab() != b.n_vocab())
    return make_error(strprintf("draft model %s has a vocabulary of %d tokens but the model %s has %d: a draft must "
                                "share the model's vocabulary",
                                draft_name.c_str(), b.n_vocab(), target_name.c_str(), a.n_vocab()));
  for (int32_t id = 0; id < a.n_vocab(); ++id)
    if (a.token_text(id) != b.token_text(id))
      return make_error(strprintf("draft model %s and the model %s have different vocabularies: token %d is \"%s\" in "
                                  "the draft and \"%s\" in the model",
                                  draft_name.c_str(), target_name.c_str(), id, b.token_text(id).c_str(),
                                  a.token_text(id).c_str()));
  return Status::ok();
}

}  // namespace lc
