#include "train/export.h"

#include <fmt/format.h>

#include <cstring>

namespace lc::train {

Status export_gguf(const Transformer<float>& model, const gguf::File& vocab, const std::string& path,
                   const std::string& name) {
  const ModelConfig& c = model.config();
  LC_ASSIGN_OR_RETURN(auto tokens, vocab.get_string_array("tokenizer.ggml.tokens"));
  if (static_cast<int64_t>(tokens.size()) != c.n_vocab)
    return make_error(fmt::format("export: vocabulary '{}' has {} tokens but the model has {}",
                                  vocab.path(), tokens.size(), c.n_vocab));
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", name);
  w.set_u32("general.file_type", 0);  // all f32
  w.set_u32("llama.block_count", static_cast<uint32_t>(c.n_layer));
  w.set_u32("llama.context_length", static_cast<uint32_t>(c.n_ctx));
  w.set_u32("llama.embedding_length", static_cast<uint32_t>(c.n_embd));
  w.set_u32("llama.feed_forward_length", static_cast<uint32_t>(c.n_ff));
  w.set_u32("llama.attention.head_count", static_cast<uint32_t>(c.n_head));
  w.set_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
  // The trainer rotates adjacent pairs over the whole head, as llama.cpp does for `llama`, so
  // no Q/K permutation is needed (unlike converted Hugging Face checkpoints).
  w.set_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim()));
  w.set_f32("llama.rope.freq_base", c.rope_base);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", c.rms_eps);
  w.set_u32("llama.vocab_size", static_cast<uint32_t>(c.n_vocab));
  // Trained with a distance ceiling: the engine's default attention for this file attends keys
  // beyond it at that distance (attention `fixed`); other readers ignore the key and see a
  // plain llama model, identical within the ceiling.
  if (c.fixed_distance > 0)
    w.set_u32("longctx.attention.fixed_distance", static_cast<uint32_t>(c.fixed_distance));
  // Trained with logit scaling: the engine composes `logn:orig=N` with the GGUF's rope unless
  // --rope says otherwise.
  if (c.logn_orig > 0) w.set_u32("longctx.attention.logn_orig", static_cast<uint32_t>(c.logn_orig));
  for (const std::string& key : vocab.keys()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    w.set_value(key, *vocab.find(key));
  }
  for (const ParamTensor& t : model.tensors()) {
    std::vector<uint8_t> bytes(t.size * sizeof(float));
    std::memcpy(bytes.data(), model.params() + t.offset, bytes.size());
    w.add_tensor(t.name, DType::F32, t.ne, std::move(bytes));
  }
  LC_TRY(w.status());
  Status st = w.write(path);
  if (!st) return make_error(fmt::format("export to '{}': {}", path, st.message()));
  return ok_status();
}

}  // namespace lc::train
