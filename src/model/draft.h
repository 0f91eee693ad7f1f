// Draft models (SpecKV / SpecPC, Galim et al., arXiv 2506.08373): a small model that reads the
// same token ids as the target. Token ids are only interchangeable when both vocabularies are
// the same list of pieces, so a draft is checked piece by piece before use.
#pragma once

#include <string>

#include "core/status.h"
#include "model/model.h"

namespace lc {

// Ok when draft's vocabulary is target's (same size, the same piece for every id); otherwise an
// error naming both files and the first difference.
Status check_draft_vocab(const Model& target, const std::string& target_name, const Model& draft,
                         const std::string& draft_name);

}  // namespace lc
