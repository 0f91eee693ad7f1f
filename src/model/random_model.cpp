#include "model/random_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
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

std::vector<uint8_t> make_bias(Rng& rng, int64_t n, float std) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * 4);
  float* p = reinterpret_cast<float*>(out.data());
  for (int64_t i = 0; i < n; ++i) p[i] = rng.normal() * std;
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

// ---- llama.cpp's k-quant mixtures ----
//
// What llama-quantize (src/llama-quant.cpp: llama_tensor_get_type, use_more_bits,
// tensor_type_fallback) picks for the tensors of a dense llama / qwen2 model like ours, without
// an importance matrix or overrides, for the file types Q4_K_M, Q5_K_M and Q6_K:
//   * the base type: Q4_K, Q5_K, Q6_K;
//   * the output matrix (output.weight, or token_embd when the embeddings are tied): Q8_0 when
//     its rows are not a multiple of the base type's 256, else Q6_K;
//   * token_embd when untied: the base type;
//   * Q4_K_M and Q5_K_M: attn_v and ffn_down get Q6_K in the layers use_more_bits picks (the
//     first and last eighth of the layers and every third one between; attn_v counted by its
//     own index, which is the layer's in a model with one attn_v per layer);
//   * every other matrix (attn_q, attn_k, attn_output, ffn_gate, ffn_up): the base type;
//   * then any matrix whose rows are not a multiple of its type's block falls back:
//     Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and to F16 if even that does not divide;
//   * 1-D tensors (norms, biases) stay f32.
// Not reproduced, because no shape we write has them: the rules for Falcon, for mixtures of
// experts (n_expert 8), for 70B llama models (attn_v Q5_K), for fused attn_qkv / attn_kv_b
// tensors, for imatrix-only types, and --pure / --tensor-type / --output-tensor-type overrides.
enum class Role { kTokenEmbd, kOutput, kAttnQ, kAttnK, kAttnV, kAttnOutput, kFfnGate, kFfnUp, kFfnDown };

bool use_more_bits(int64_t il, int64_t n_layer) {
  return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

DType mixture_type(WeightMix mix, bool tied, Role role, int64_t il, int64_t n_layer, int64_t row_len) {
  const DType base = mix == WeightMix::kQ4_K_M ? DType::Q4_K : mix == WeightMix::kQ5_K_M ? DType::Q5_K : DType::Q6_K;
  DType t = base;
  if (role == Role::kOutput || (tied && role == Role::kTokenEmbd)) {
    t = row_len % traits(base).block_size != 0 ? DType::Q8_0 : DType::Q6_K;
  } else if ((role == Role::kAttnV || role == Role::kFfnDown) && mix != WeightMix::kQ6_K &&
             use_more_bits(il, n_layer)) {
    t = DType::Q6_K;
  }
  if (row_len % traits(t).block_size == 0) return t;
  switch (t) {
    case DType::Q4_K: t = DType::Q5_0; break;
    case DType::Q5_K: t = DType::Q5_1; break;
    case DType::Q6_K: t = DType::Q8_0; break;
    default: break;
  }
  return row_len % traits(t).block_size == 0 ? t : DType::F16;
}

// llama.cpp's general.file_type of the mixtures (enum llama_ftype).
uint32_t file_type(WeightMix mix) {
  switch (mix) {
    case WeightMix::kQ4_K_M: return 15;
    case WeightMix::kQ5_K_M: return 17;
    case WeightMix::kQ6_K: return 18;
    case WeightMix::kUniform: break;
  }
  return 0;
}

struct MixName {
  const char* name;
  WeightMix mix;
};
constexpr MixName kMixes[] = {{"q4_k_m", WeightMix::kQ4_K_M}, {"q5_k_m", WeightMix::kQ5_K_M}, {"q6_k", WeightMix::kQ6_K}};

}  // namespace

RandomModelSpec smollm2_135m_spec() { return RandomModelSpec{}; }

RandomModelSpec qwen25_05b_spec() {
  RandomModelSpec s;
  s.arch = "qwen2";
  s.n_layer = 24, s.n_embd = 896, s.n_head = 14, s.n_head_kv = 2, s.n_ff = 4864;
  s.n_ctx_train = 32768;
  s.rope_base = 1000000.0f;
  s.rms_eps = 1e-6f;
  s.tied = true;
  s.qkv_bias = true;
  return s;
}

std::vector<std::string> model_shape_names() { return {"smollm2-135m", "qwen2.5-0.5b"}; }

Expected<RandomModelSpec> model_shape(const std::string& name) {
  if (name == "smollm2-135m") return smollm2_135m_spec();
  if (name == "qwen2.5-0.5b") return qwen25_05b_spec();
  return make_error(fmt::format("unknown shape '{}' (known: {})", name, fmt::join(model_shape_names(), ", ")));
}

Status set_weight_type(RandomModelSpec& spec, const std::string& name) {
  std::string lower = name;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& m : kMixes)
    if (lower == m.name) {
      spec.mix = m.mix;
      return ok_status();
    }
  const auto t = dtype_from_name(lower);
  if (t && kernels::can_quantize(*t) && *t != DType::Q8_K) {
    spec.mix = WeightMix::kUniform;
    spec.weight_type = *t;
    return ok_status();
  }
  return make_error(fmt::format("cannot write '{}' weights (one type for every matrix: f32, f16, bf16, q4_0, q5_0, "
                                "q5_1, q8_0, q4_k, q5_k; llama.cpp's mixtures: q4_k_m, q5_k_m, q6_k)",
                                name));
}

Status write_random_model(const RandomModelSpec& s, const std::string& out_path) {
  if (s.arch != "llama" && s.arch != "qwen2")
    return make_error(fmt::format("cannot write architecture '{}' (llama, qwen2)", s.arch));
  if (s.n_layer < 1 || s.n_embd < 1 || s.n_ff < 1 || s.n_head < 1 || s.n_head_kv < 1 || s.n_ctx_train < 1)
    return make_error("layers, sizes, heads and context length must be positive");
  if (s.n_embd % s.n_head != 0 || s.n_head % s.n_head_kv != 0 || (s.n_embd / s.n_head) % 2 != 0)
    return make_error(fmt::format("{} heads of {} KV heads do not divide an embedding of {} into even head sizes",
                                  s.n_head, s.n_head_kv, s.n_embd));
  if (s.mix == WeightMix::kUniform) {
    if (!kernels::can_quantize(s.weight_type))
      return make_error(fmt::format("cannot write weights of type {}", dtype_name(s.weight_type)));
    const int64_t bs = traits(s.weight_type).block_size;
    std::vector<std::string> bad;
    if (s.n_embd % bs != 0) bad.push_back(fmt::format("the embedding size {}", s.n_embd));
    if (s.n_ff % bs != 0) bad.push_back(fmt::format("the feed-forward size {}", s.n_ff));
    if (!bad.empty())
      return make_error(fmt::format("{} needs rows that are multiples of {}, and {} {} not (llama.cpp's mixtures "
                                    "q4_k_m, q5_k_m and q6_k fall back to other types there)",
                                    dtype_name(s.weight_type), bs, fmt::join(bad, " and "), bad.size() > 1 ? "are" : "is"));
  }
  LC_ASSIGN_OR_RETURN(auto vocab, gguf::File::open(s.vocab_path));
  LC_ASSIGN_OR_RETURN(auto tokens, vocab->get_string_array("tokenizer.ggml.tokens"));
  const int64_t n_vocab = static_cast<int64_t>(tokens.size());
  const int64_t head_dim = s.n_embd / s.n_head;
  const bool llama = s.arch == "llama";

  gguf::Writer w;
  const std::string a = s.arch + ".";
  w.set_string("general.architecture", s.arch);
  w.set_string("general.name", "longctx random model");
  w.set_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx_train));
  w.set_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  // llama.cpp's converter writes these two for llama models and not for qwen2 ones.
  if (llama) w.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.set_f32(a + "rope.freq_base", s.rope_base);
  w.set_f32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  if (llama) w.set_u32(a + "vocab_size", static_cast<uint32_t>(n_vocab));
  if (s.mix != WeightMix::kUniform) {  // as llama-quantize records them
    w.set_u32("general.quantization_version", 2);
    w.set_u32("general.file_type", file_type(s.mix));
  }
  LC_TRY(copy_tokenizer(*vocab, w));

  // The random draws are in the order the tensors are written, the same for every weight type.
  Rng rng(s.seed);
  auto type_of = [&](Role role, int64_t il, int64_t row_len) {
    return s.mix == WeightMix::kUniform ? s.weight_type : mixture_type(s.mix, s.tied, role, il, s.n_layer, row_len);
  };
  auto matrix = [&](const std::string& name, Role role, int64_t il, int64_t n_in, int64_t n_out, float sd) {
    const DType t = type_of(role, il, n_in);
    w.add_tensor(name, t, {n_in, n_out}, make_matrix(rng, t, n_in, n_out, sd));
  };
  const float sd = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  const int64_t E = s.n_embd, q_dim = s.n_head * head_dim, kv_dim = s.n_head_kv * head_dim;
  matrix("token_embd.weight", Role::kTokenEmbd, 0, E, n_vocab, s.tied ? 3 * sd : 1.0f);
  w.add_tensor("output_norm.weight", DType::F32, {E}, make_norm(rng, E));
  if (!s.tied) matrix("output.weight", Role::kOutput, 0, E, n_vocab, 3 * sd);
  for (int64_t il = 0; il < s.n_layer; ++il) {
    auto nm = [&](const char* x) { return fmt::format("blk.{}.{}", il, x); };
    w.add_tensor(nm("attn_norm.weight"), DType::F32, {E}, make_norm(rng, E));
    matrix(nm("attn_q.weight"), Role::kAttnQ, il, E, q_dim, 1.5f * sd);
    matrix(nm("attn_k.weight"), Role::kAttnK, il, E, kv_dim, 1.5f * sd);
    matrix(nm("attn_v.weight"), Role::kAttnV, il, E, kv_dim, sd);
    if (s.qkv_bias) {
      w.add_tensor(nm("attn_q.bias"), DType::F32, {q_dim}, make_bias(rng, q_dim, 0.05f));
      w.add_tensor(nm("attn_k.bias"), DType::F32, {kv_dim}, make_bias(rng, kv_dim, 0.05f));
      w.add_tensor(nm("attn_v.bias"), DType::F32, {kv_dim}, make_bias(rng, kv_dim, 0.05f));
    }
    matrix(nm("attn_output.weight"), Role::kAttnOutput, il, q_dim, E, sd);
    w.add_tensor(nm("ffn_norm.weight"), DType::F32, {E}, make_norm(rng, E));
    matrix(nm("ffn_gate.weight"), Role::kFfnGate, il, E, s.n_ff, sd);
    matrix(nm("ffn_up.weight"), Role::kFfnUp, il, E, s.n_ff, sd);
    matrix(nm("ffn_down.weight"), Role::kFfnDown, il, s.n_ff, E, 1.0f / std::sqrt(static_cast<float>(s.n_ff)));
  }
  return w.write(out_path);
}

}  // namespace lc
