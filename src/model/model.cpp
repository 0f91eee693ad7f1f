#include "model/model.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

#include "kernels/kernels.h"

namespace lc {

Expected<TensorView> Model::matrix(const std::string& name, int64_t n_in, int64_t n_out,
                                   bool required) {
  const gguf::TensorInfo* t = file_->find_tensor(name);
  if (!t) {
    if (!required) return TensorView{};
    return make_error(fmt::format("{}: missing tensor '{}'", file_->path(), name));
  }
  if (t->n_dims > 2 || t->ne[0] != n_in || t->ne[1] != n_out) {
    return make_error(fmt::format(
        "{}: tensor '{}' has shape [{}, {}, {}, {}], expected [{}, {}]",
        file_->path(), name, t->ne[0], t->ne[1],
        t->ne[2], t->ne[3], n_in, n_out));
  }
  if (!kernels::matmul_supports(t->type)) {
    return make_error(fmt::format("{}: tensor '{}' has type {}, which longctx cannot multiply "
                                  "(supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k)",
                                  file_->path(), name, dtype_name(t->type)));
  }
  return t->view();
}

Expected<const float*> Model::vec(const std::string& name, int64_t n, bool required) {
  const gguf::TensorInfo* t = file_->find_tensor(name);
  if (!t) {
    if (!required) return static_cast<const float*>(nullptr);
    return make_error(fmt::format("{}: missing tensor '{}'", file_->path(), name));
  }
  if (t->n_dims != 1 || t->ne[0] != n) {
    return make_error(fmt::format("{}: tensor '{}' has shape [{}, {}], expected [{}]",
                                  file_->path(), name, t->ne[0],
                                  t->ne[1], n));
  }
  if (t->type == DType::F32) return reinterpret_cast<const float*>(t->data);
  if (t->type != DType::F16 && t->type != DType::BF16) {
    return make_error(fmt::format("{}: tensor '{}' has type {}, expected f32, f16 or bf16",
                                  file_->path(), name, dtype_name(t->type)));
  }
  owned_.emplace_back(static_cast<size_t>(n));
  kernels::dequantize_row(t->type, t->data, owned_.back().data(), n);
  return static_cast<const float*>(owned_.back().data());
}

Status Model::bind(const std::string& path) {
  const HParams& hp = hp_;
  const int64_t q_dim = hp.n_head * hp.head_dim, k_dim = hp.n_head_kv * hp.head_dim,
                v_dim = hp.n_head_kv * hp.head_dim_v;
  LC_ASSIGN_OR_RETURN(tok_embd_, matrix("token_embd.weight", hp.n_embd, hp.n_vocab, true));
  LC_ASSIGN_OR_RETURN(output_norm_, vec("output_norm.weight", hp.n_embd, true));
  LC_ASSIGN_OR_RETURN(output_, matrix("output.weight", hp.n_embd, hp.n_vocab, false));
  tied_ = !output_.valid();
  if (tied_) output_ = tok_embd_;
  if (const gguf::TensorInfo* rf = file_->find_tensor("rope_freqs.weight")) {
    if (rf->type != DType::F32 || rf->n_dims != 1 || rf->ne[0] != hp.n_rot / 2) {
      return make_error(fmt::format("{}: tensor 'rope_freqs.weight' must be f32 of shape [{}]",
                                    path, hp.n_rot / 2));
    }
    const float* p = reinterpret_cast<const float*>(rf->data);
    rope_freqs_.assign(p, p + hp.n_rot / 2);
  }
  const bool qkv_bias = hp.arch == Arch::kQwen2;
  const bool qk_norm = hp.arch == Arch::kQwen3;
  layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = layers_[static_cast<size_t>(il)];
    auto nm = [&](const char* s) { return fmt::format("blk.{}.{}", il, s); };
    LC_ASSIGN_OR_RETURN(L.attn_norm, vec(nm("attn_norm.weight"), hp.n_embd, true));
    LC_ASSIGN_OR_RETURN(L.wq, matrix(nm("attn_q.weight"), hp.n_embd, q_dim, true));
    LC_ASSIGN_OR_RETURN(L.wk, matrix(nm("attn_k.weight"), hp.n_embd, k_dim, true));
    LC_ASSIGN_OR_RETURN(L.wv, matrix(nm("attn_v.weight"), hp.n_embd, v_dim, true));
    LC_ASSIGN_OR_RETURN(L.wo, matrix(nm("attn_output.weight"), hp.n_head * hp.head_dim_v, hp.n_embd, true));
    // Biases are optional for llama (some finetunes have them) and required for qwen2.
    LC_ASSIGN_OR_RETURN(L.bq, vec(nm("attn_q.bias"), q_dim, qkv_bias));
    LC_ASSIGN_OR_RETURN(L.bk, vec(nm("attn_k.bias"), k_dim, qkv_bias));
    LC_ASSIGN_OR_RETURN(L.bv, vec(nm("attn_v.bias"), v_dim, qkv_bias));
    LC_ASSIGN_OR_RETURN(L.q_norm, vec(nm("attn_q_norm.weight"), hp.head_dim, qk_norm));
    LC_ASSIGN_OR_RETURN(L.k_norm, vec(nm("attn_k_norm.weight"), hp.head_dim, qk_norm));
    LC_ASSIGN_OR_RETURN(L.ffn_norm, vec(nm("ffn_norm.weight"), hp.n_embd, true));
    LC_ASSIGN_OR_RETURN(L.w_gate, matrix(nm("ffn_gate.weight"), hp.n_embd, hp.n_ff, true));
    LC_ASSIGN_OR_RETURN(L.w_up, matrix(nm("ffn_up.weight"), hp.n_embd, hp.n_ff, true));
    LC_ASSIGN_OR_RETURN(L.w_down, matrix(nm("ffn_down.weight"), hp.n_ff, hp.n_embd, true));
  }
  pack_matrices();
  return ok_status();
}

// matmul's row-interleaved copies (kernels::pack_matrix) of the Q8_0/Q4_x/Q5_x, Q4_K/Q5_K/Q6_K
// and F16/BF16 matrices. The mapped bytes of a packed matrix are given back: only the packed
// copy is read when multiplying, and a row lookup (qTTT widening a matrix, the token
// embedding's lookups) maps them again. The token embedding itself is not packed (rows are looked up); a tied output is
// packed as its own copy.
// LONGCTX_PACK=0 in the environment keeps every matrix unpacked (for A/B measurements).
void Model::pack_matrices() {
  const char* env = std::getenv("LONGCTX_PACK");
  if (env && std::string_view(env) == "0") return;
  auto pack = [&](TensorView& w, bool give_back) {
    const size_t n = kernels::packed_bytes(w);
    if (n == 0) return;
    packed_.emplace_back(n);
    kernels::pack_matrix(w, packed_.back().data());
    w.packed = packed_.back().data();
    if (give_back) file_->release(w.data, w.row_size() * static_cast<size_t>(w.n_rows()));
  };
  for (LayerWeights& L : layers_)
    for (TensorView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) pack(*w, true);
  pack(output_, true);
}

Expected<std::unique_ptr<Model>> Model::load(const std::string& path) {
  LC_ASSIGN_OR_RETURN(auto file, gguf::File::open(path));
  return from_file(std::move(file));
}

Expected<std::unique_ptr<Model>> Model::load_memory(const uint8_t* data, size_t size,
                                                    const std::string& name) {
  LC_ASSIGN_OR_RETURN(auto file, gguf::File::parse(data, size, name));
  return from_file(std::move(file));
}

Expected<std::unique_ptr<Model>> Model::from_file(std::unique_ptr<gguf::File> file) {
  auto m = std::unique_ptr<Model>(new Model());
  m->file_ = std::move(file);
  const std::string& path = m->file_->path();
  LC_ASSIGN_OR_RETURN(m->hp_, read_hparams(*m->file_));
  LC_ASSIGN_OR_RETURN(m->tok_, Tokenizer::from_gguf(*m->file_));
  m->hp_.n_vocab = m->tok_->n_vocab();
  if (const gguf::TensorInfo* te = m->file_->find_tensor("token_embd.weight")) {
    if (te->ne[1] != m->hp_.n_vocab) {
      return make_error(fmt::format("{}: token_embd.weight has {} rows but the tokenizer has {} tokens",
                                    path, te->ne[1], m->hp_.n_vocab));
    }
  }
  LC_TRY(m->bind(path));
  return m;
}

size_t Model::weight_bytes() const {
  size_t n = 0;
  for (const auto& t : file_->tensors()) n += t.n_bytes;
  return n;
}

}  // namespace lc
