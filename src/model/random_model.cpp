#include "model/random_model.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/kernels.h"

namespace lc {
namespace {

// xorshift64* + Box-Muller: fast and reproducible from the seed on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545F4914F6CDD1Dull;
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  float normal() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    const double u = uniform(), v = uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    spare_ = static_cast<float>(r * std::sin(2 * M_PI * v));
    have_ = true;
    return static_cast<float>(r * std::cos(2 * M_PI * v));
  }

 private:
  uint64_t s_;
  float spare_ = 0;
  bool have_ = false;
};

std::vector<uint8_t> make_matrix(Rng& rng, DType t, int64_t n_in, int64_t n_out, float std) {
  std::vector<uint8_t> out(row_bytes(t, n_in) * static_cast<size_t>(n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& x : row) x = rng.normal() * std;
    kernels::quantize_row(t, row.data(), out.data() + row_bytes(t, n_in) * static_cast<size_t>(r), n_in);
  }
  return out;
}

std::vector<uint8_t> make_norm(Rng& rng, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * 4);
  float* p = reinterpret_cast<float*>(out.data());
  for (int64_t i = 0; i < n; ++i) p[i] = 0.8f + 0.4f * static_cast<float>(rng.uniform());
  return out;
}

Status copy_tokenizer(const gguf::File& src, gguf::Writer& w) {
  using gguf::ValueType;
  for (const auto& [key, v] : src.metadata()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    if (v.type == ValueType::kString) {
      w.set_string(key, std::get<std::string>(v.scalar));
    } else if (v.type == ValueType::kBool) {
      w.set_bool(key, std::get<bool>(v.scalar));
    } else if (v.type == ValueType::kArray && v.elem_type == ValueType::kString) {
      w.set_string_array(key, v.strings);
    } else if (v.type == ValueType::kArray && v.elem_type == ValueType::kF32) {
      LC_ASSIGN_OR_RETURN(auto arr, src.get_f32_array(key));
      w.set_f32_array(key, arr);
    } else if (v.type == ValueType::kArray) {
      LC_ASSIGN_OR_RETURN(auto arr, src.get_i32_array(key));
      w.set_i32_array(key, arr);
    } else {
      LC_ASSIGN_OR_RETURN(uint32_t x, src.get_u32(key));
      w.set_u32(key, x);
    }
  }
  return ok_status();
}

}  // namespace

RandomModelSpec smollm2_135m_spec() { return RandomModelSpec{}; }

Status write_random_model(const RandomModelSpec& s, const std::string& out_path) {
  if (!kernels::can_quantize(s.weight_type))
    return make_error(fmt::format("cannot write weights of type {}", dtype_name(s.weight_type)));
  if (s.n_embd % traits(s.weight_type).block_size != 0 || s.n_ff % traits(s.weight_type).block_size != 0)
    return make_error("embedding and feed-forward sizes must be multiples of the weight type's block size");
  LC_ASSIGN_OR_RETURN(auto vocab, gguf::File::open(s.vocab_path));
  LC_ASSIGN_OR_RETURN(auto tokens, vocab->get_string_array("tokenizer.ggml.tokens"));
  const int64_t n_vocab = static_cast<int64_t>(tokens.size());
  const int64_t head_dim = s.n_embd / s.n_head;

  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", "longctx random model");
  w.set_u32("llama.block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32("llama.context_length", static_cast<uint32_t>(s.n_ctx_train));
  w.set_u32("llama.embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32("llama.feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32("llama.attention.head_count", static_cast<uint32_t>(s.n_head));
  w.set_u32("llama.attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.set_u32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.set_f32("llama.rope.freq_base", s.rope_base);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_u32("llama.vocab_size", static_cast<uint32_t>(n_vocab));
  LC_TRY(copy_tokenizer(*vocab, w));

  Rng rng(s.seed);
  const DType t = s.weight_type;
  const float sd = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  const int64_t E = s.n_embd;
  w.add_tensor("token_embd.weight", t, {E, n_vocab}, make_matrix(rng, t, E, n_vocab, s.tied ? 3 * sd : 1.0f));
  w.add_tensor("output_norm.weight", DType::F32, {E}, make_norm(rng, E));
  if (!s.tied) w.add_tensor("output.weight", t, {E, n_vocab}, make_matrix(rng, t, E, n_vocab, 3 * sd));
  for (int64_t il = 0; il < s.n_layer; ++il) {
    auto nm = [&](const char* x) { return fmt::format("blk.{}.{}", il, x); };
    w.add_tensor(nm("attn_norm.weight"), DType::F32, {E}, make_norm(rng, E));
    w.add_tensor(nm("attn_q.weight"), t, {E, s.n_head * head_dim}, make_matrix(rng, t, E, s.n_head * head_dim, 1.5f * sd));
    w.add_tensor(nm("attn_k.weight"), t, {E, s.n_head_kv * head_dim}, make_matrix(rng, t, E, s.n_head_kv * head_dim, 1.5f * sd));
    w.add_tensor(nm("attn_v.weight"), t, {E, s.n_head_kv * head_dim}, make_matrix(rng, t, E, s.n_head_kv * head_dim, sd));
    w.add_tensor(nm("attn_output.weight"), t, {s.n_head * head_dim, E}, make_matrix(rng, t, s.n_head * head_dim, E, sd));
    w.add_tensor(nm("ffn_norm.weight"), DType::F32, {E}, make_norm(rng, E));
    w.add_tensor(nm("ffn_gate.weight"), t, {E, s.n_ff}, make_matrix(rng, t, E, s.n_ff, sd));
    w.add_tensor(nm("ffn_up.weight"), t, {E, s.n_ff}, make_matrix(rng, t, E, s.n_ff, sd));
    w.add_tensor(nm("ffn_down.weight"), t, {s.n_ff, E}, make_matrix(rng, t, s.n_ff, E, 1.0f / std::sqrt(static_cast<float>(s.n_ff))));
  }
  return w.write(out_path);
}

}  // namespace lc
