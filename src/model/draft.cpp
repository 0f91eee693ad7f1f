#include "model/draft.h"

#include <fmt/format.h>

#include <algorithm>

namespace lc {

Status check_draft_vocab(const Model& target, const std::string& target_name, const Model& draft,
                         const std::string& draft_name) {
  const Tokenizer& a = target.tokenizer();
  const Tokenizer& b = draft.tokenizer();
  if (a.n_vocab() != b.n_vocab())
    return make_error(fmt::format("draft model {} has a vocabulary of {} tokens but the model {} has {}: a draft must "
                                  "share the model's vocabulary",
                                  draft_name, b.n_vocab(), target_name, a.n_vocab()));
  for (int32_t id = 0; id < a.n_vocab(); ++id)
    if (a.token_text(id) != b.token_text(id))
      return make_error(fmt::format("draft model {} and the model {} have different vocabularies: token {} is \"{}\" in "
                                    "the draft and \"{}\" in the model",
                                    draft_name, target_name, id, b.token_text(id),
                                    a.token_text(id)));
  return ok_status();
}

DraftRunner::DraftRunner(const Model& draft, std::string name, const ContextParams& base)
    : model_(draft), name_(std::move(name)), base_(base) {}

Expected<std::vector<int32_t>> DraftRunner::generate(std::span<const int32_t> prompt, int64_t n, int64_t record,
                                                     bool stop_at_eog) {
  const int64_t need = static_cast<int64_t>(prompt.size()) + n;
  if (!ctx_ || ctx_->n_ctx() < need) {
    ContextParams dp;
    dp.n_ctx = std::max(base_.n_ctx, need);
    dp.n_batch = base_.n_batch;
    dp.n_threads = base_.n_threads;
    dp.kv_block = base_.kv_block;
    ctx_.reset();
    auto d = Context::create(model_, dp);
    if (!d) return make_error("draft model " + name_ + ": " + d.error().message);
    ctx_ = std::move(*d);
  }
  Context& dc = *ctx_;
  dc.clear();
  if (!recorder_ || recorder_->window().width() != record) {
    if (recorder_) dc.detach_hooks(recorder_.get());
    const HParams& h = model_.hparams();
    recorder_ = std::make_unique<QueryRecorder>(h.n_layer, h.n_head * h.head_dim, record);
    dc.attach_hooks(recorder_.get());
  }
  LC_TRY(dc.decode(prompt, Logits::kLast));
  std::vector<int32_t> out;
  const int64_t nv = model_.hparams().n_vocab;
  for (int64_t i = 0; i < n; ++i) {
    const float* lg = dc.logits(0);
    const int32_t id = static_cast<int32_t>(std::max_element(lg, lg + nv) - lg);
    out.push_back(id);
    if (stop_at_eog && model_.tokenizer().is_eog(id)) break;
    if (i + 1 < n) LC_TRY(dc.decode(std::span<const int32_t>(&id, 1), Logits::kLast));
  }
  return out;
}

void DraftRunner::clear() {
  if (ctx_) ctx_->clear();
}

}  // namespace lc
