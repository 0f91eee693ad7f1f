// Random-weight models (make-model): the qwen2.5-0.5b shape loads with its hyper-parameters and
// biases; the llama.cpp mixtures have the per-tensor types llama-quantize picks (tables written
// here from its rules); every mixture decodes; and the quantisers the mixtures use write the
// bytes llama-quantize wrote for the golden models.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/context.h"
#include "model/model.h"
#include "model/random_model.h"

namespace lc {
namespace {

const std::string kData = std::string(LONGCTX_TEST_DATA);
// A 512-token vocabulary keeps the embedding small; the shapes' own vocabularies are the CLI's.
const std::string kSmallVocab = kData + "/golden/models/stories260K.gguf";

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/random_model_" + name + ".gguf"; }

TEST(RandomModel, Shapes) {
  const RandomModelSpec q = qwen25_05b_spec();
  EXPECT_EQ(q.arch, "qwen2");
  EXPECT_EQ(q.n_layer, 24);
  EXPECT_EQ(q.n_embd, 896);
  EXPECT_EQ(q.n_head, 14);
  EXPECT_EQ(q.n_head_kv, 2);
  EXPECT_EQ(q.n_ff, 4864);
  EXPECT_EQ(q.n_ctx_train, 32768);
  EXPECT_EQ(q.rope_base, 1000000.0f);
  EXPECT_EQ(q.rms_eps, 1e-6f);
  EXPECT_TRUE(q.tied);
  EXPECT_TRUE(q.qkv_bias);
  const RandomModelSpec s = smollm2_135m_spec();
  EXPECT_EQ(s.arch, "llama");
  EXPECT_EQ(s.n_layer, 30);
  EXPECT_EQ(s.n_embd, 576);
  EXPECT_FALSE(s.qkv_bias);

  ASSERT_TRUE(model_shape("qwen2.5-0.5b").has_value());
  ASSERT_TRUE(model_shape("smollm2-135m").has_value());
  auto bad = model_shape("llama-7b");
  ASSERT_FALSE(bad.has_value());
  for (const char* s : {"llama-7b", "smollm2-135m", "qwen2.5-0.5b"})
    EXPECT_NE(bad.error().message.find(s), std::string::npos) << bad.error().message;

  RandomModelSpec t;
  EXPECT_TRUE(set_weight_type(t, "Q4_K_M").is_ok());
  EXPECT_EQ(t.mix, WeightMix::kQ4_K_M);
  EXPECT_TRUE(set_weight_type(t, "q5_0").is_ok());
  EXPECT_EQ(t.mix, WeightMix::kUniform);
  EXPECT_EQ(t.weight_type, DType::Q5_0);
  const Status st = set_weight_type(t, "q3_k_m");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("q3_k_m"), std::string::npos);
  EXPECT_NE(st.message().find("q4_k_m"), std::string::npos);
  EXPECT_FALSE(set_weight_type(t, "q8_k").is_ok());  // an activation type, not a weight type
}

// A few greedy tokens; the logits stay finite. Returns the last logits.
std::vector<float> greedy(const Model& m, int n_gen) {
  ContextParams p;
  p.n_ctx = 64;
  p.n_batch = 16;
  p.n_threads = 2;
  auto c = Context::create(m, p);
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
  if (!c) return {};
  const int64_t nv = m.hparams().n_vocab;
  std::vector<int32_t> prompt = {1, 17, 200, 33};
  EXPECT_TRUE((*c)->decode(prompt).is_ok());
  std::vector<float> first((*c)->logits(0), (*c)->logits(0) + nv);
  for (int i = 0; i < n_gen; ++i) {
    const float* lg = (*c)->logits(0);
    for (int64_t j = 0; j < nv; ++j) EXPECT_TRUE(std::isfinite(lg[j])) << j;
    const int32_t id = static_cast<int32_t>(std::max_element(lg, lg + nv) - lg);
    EXPECT_TRUE((*c)->decode(std::span<const int32_t>(&id, 1)).is_ok());
  }
  return first;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
}

TEST(RandomModel, QwenShapeLoadsWithHParamsAndBiases) {
  RandomModelSpec s = qwen25_05b_spec();
  s.n_layer = 2;
  s.vocab_path = kSmallVocab;
  ASSERT_TRUE(set_weight_type(s, "q8_0").is_ok());
  const std::string path = temp_path("qwen_q8_0");
  ASSERT_TRUE(write_random_model(s, path).is_ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.arch, Arch::kQwen2);
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_embd, 896);
  EXPECT_EQ(hp.n_head, 14);
  EXPECT_EQ(hp.n_head_kv, 2);
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_EQ(hp.n_rot, 64);
  EXPECT_EQ(hp.n_ff, 4864);
  EXPECT_EQ(hp.n_ctx_train, 32768);
  EXPECT_EQ(hp.rope_base, 1000000.0f);
  EXPECT_EQ(hp.rms_eps, 1e-6f);
  EXPECT_EQ(hp.rope_kind, RopeKind::kNeox);
  EXPECT_EQ(hp.n_vocab, 512);
  const gguf::File& f = (*m)->file();
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied
  for (int il = 0; il < 2; ++il)
    for (auto [name, n] : {std::pair{"attn_q.bias", 896}, {"attn_k.bias", 128}, {"attn_v.bias", 128}}) {
      const gguf::TensorInfo* t = f.find_tensor(fmt::format("blk.{}.{}", il, name));
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->type, DType::F32);
      EXPECT_EQ(t->n_dims, 1);
      EXPECT_EQ(t->ne[0], n);
      const float* v = reinterpret_cast<const float*>(t->data);
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += double(v[i]) * v[i];
      const double rms = std::sqrt(ss / n);
      EXPECT_GT(rms, 0.01) << name;  // small, but there
      EXPECT_LT(rms, 0.2) << name;
    }
  greedy(**m, 3);
  std::filesystem::remove(path);
}

// The expected type of every tensor, written from llama-quantize's rules (src/llama-quant.cpp)
// for 8 layers: use_more_bits picks layer 0 (the first eighth), 7 (the last eighth) and 3, 6
// (every third between). SmolLM2's rows of 576 are not a multiple of 256, so every matrix
// reading the embedding falls back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), and the tied
// output (token_embd) is Q8_0; ffn_down's rows of 1536 keep the k-quant.
struct MixCase {
  const char* type;
  DType base_fallback, ffn_down, ffn_down_more, attn_v_more;
  uint32_t file_type;
};

void PrintTo(const MixCase& c, std::ostream* os) { *os << c.type; }

class Mixture : public ::testing::TestWithParam<MixCase> {};

TEST_P(Mixture, SmolLM2TypesFollowLlamaQuantize) {
  const MixCase mc = GetParam();
  const std::set<int> more_bits = {0, 3, 6, 7};
  std::map<std::string, DType> want;
  want["token_embd.weight"] = DType::Q8_0;
  want["output_norm.weight"] = DType::F32;
  for (int il = 0; il < 8; ++il) {
    auto nm = [&](const char* x) { return fmt::format("blk.{}.{}", il, x); };
    const bool more = more_bits.count(il) != 0;
    want[nm("attn_norm.weight")] = DType::F32;
    want[nm("ffn_norm.weight")] = DType::F32;
    for (const char* x : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"})
      want[nm(x)] = mc.base_fallback;
    want[nm("attn_v.weight")] = more ? mc.attn_v_more : mc.base_fallback;
    want[nm("ffn_down.weight")] = more ? mc.ffn_down_more : mc.ffn_down;
  }

  RandomModelSpec s = smollm2_135m_spec();
  s.n_layer = 8;
  s.vocab_path = kSmallVocab;
  ASSERT_TRUE(set_weight_type(s, mc.type).is_ok());
  const std::string path = temp_path(mc.type);
  ASSERT_TRUE(write_random_model(s, path).is_ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const gguf::File& f = (*m)->file();
  EXPECT_EQ(f.tensors().size(), want.size());
  for (const auto& [name, type] : want) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(dtype_name(t->type), std::string(dtype_name(type))) << mc.type << " " << name;
  }
  auto ft = f.get_u32("general.file_type");
  ASSERT_TRUE(ft.has_value());
  EXPECT_EQ(*ft, mc.file_type);

  // It decodes, and since the floats are those of the f16 file with the same seed, its logits
  // are close to that file's.
  const std::vector<float> mixed = greedy(**m, 4);
  ASSERT_TRUE(set_weight_type(s, "f16").is_ok());
  const std::string f16_path = temp_path(std::string(mc.type) + "_f16");
  ASSERT_TRUE(write_random_model(s, f16_path).is_ok());
  auto ref = Model::load(f16_path);
  ASSERT_TRUE(ref.has_value()) << ref.error().message;
  const std::vector<float> full = greedy(**ref, 0);
  EXPECT_GT(cosine(mixed, full), 0.97) << mc.type;  // measured: 0.988, 0.990, 0.999; a wrong tensor: far less
  std::filesystem::remove(path);
  std::filesystem::remove(f16_path);
}

INSTANTIATE_TEST_SUITE_P(
    LlamaCpp, Mixture,
    ::testing::Values(MixCase{"q4_k_m", DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::Q8_0, 15},
                      MixCase{"q5_k_m", DType::Q5_1, DType::Q5_K, DType::Q6_K, DType::Q8_0, 17},
                      MixCase{"q6_k", DType::Q8_0, DType::Q6_K, DType::Q6_K, DType::Q8_0, 18}),
    [](const auto& info) { return std::string(info.param.type); });

// Qwen2.5-0.5B at q4_k_m with 2 layers: use_more_bits picks layer 1 (the last eighth) only.
// Rows of 896 fall back; ffn_down's 4864 = 19 * 256 keeps Q4_K / Q6_K; biases stay f32.
TEST(RandomModel, QwenQ4KMTypes) {
  RandomModelSpec s = qwen25_05b_spec();
  s.n_layer = 2;
  s.vocab_path = kSmallVocab;
  ASSERT_TRUE(set_weight_type(s, "q4_k_m").is_ok());
  const std::string path = temp_path("qwen_q4_k_m");
  ASSERT_TRUE(write_random_model(s, path).is_ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const gguf::File& f = (*m)->file();
  auto type = [&](const std::string& name) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    return t ? std::string(dtype_name(t->type)) : "missing";
  };
  EXPECT_EQ(type("token_embd.weight"), "q8_0");
  for (int il = 0; il < 2; ++il) {
    auto nm = [&](const char* x) { return fmt::format("blk.{}.{}", il, x); };
    for (const char* x : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"})
      EXPECT_EQ(type(nm(x)), "q5_0") << nm(x);
    EXPECT_EQ(type(nm("attn_v.weight")), il == 1 ? "q8_0" : "q5_0");
    EXPECT_EQ(type(nm("ffn_down.weight")), il == 1 ? "q6_k" : "q4_k");
    for (const char* x : {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_norm.weight", "ffn_norm.weight"})
      EXPECT_EQ(type(nm(x)), "f32") << nm(x);
  }
  greedy(**m, 3);
  std::filesystem::remove(path);
}

// A plain k-quant on rows it cannot hold is a clear error that points at the mixtures.
TEST(RandomModel, BadInputIsAnError) {
  RandomModelSpec s = smollm2_135m_spec();
  s.n_layer = 1;
  s.vocab_path = kSmallVocab;
  ASSERT_TRUE(set_weight_type(s, "q4_k").is_ok());
  Status st = write_random_model(s, temp_path("bad"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("576"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("q4_k_m"), std::string::npos) << st.message();
  s = smollm2_135m_spec();
  s.vocab_path = kSmallVocab;
  s.arch = "gpt2";
  st = write_random_model(s, temp_path("bad"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("gpt2"), std::string::npos) << st.message();
  s = smollm2_135m_spec();
  s.vocab_path = kSmallVocab;
  s.n_head = 7;  // 576 / 7 is not whole
  EXPECT_FALSE(write_random_model(s, temp_path("bad")).is_ok());
  s = smollm2_135m_spec();
  s.vocab_path = kData + "/no_such_vocab.gguf";
  st = write_random_model(s, temp_path("bad"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("no_such_vocab.gguf"), std::string::npos) << st.message();
}

// The quantisers of the mixture types give, for the f32 source of the golden models, the bytes
// llama-quantize wrote (tests/data/golden/models: llama_quant_*.gguf from llama_quant_src_f32):
// every Q4_K, Q5_K, Q6_K and Q8_0 tensor there. (Q5_0 and Q5_1 follow ggml's references too but
// no golden file has them; Q4_0 rounds values halfway between two levels differently from ggml,
// which changes a few rows of one tensor.)
TEST(RandomModel, QuantisersWriteLlamaQuantizeBytes) {
  auto src = gguf::File::open(kData + "/golden/models/llama_quant_src_f32.gguf");
  ASSERT_TRUE(src.has_value()) << src.error().message;
  std::map<DType, int> checked;
  for (const char* file : {"llama_quant_q4_0.gguf", "llama_quant_q4_k.gguf", "llama_quant_q4_k_s.gguf",
                           "llama_quant_q6_k.gguf", "llama_quant_q8_0.gguf"}) {
    auto q = gguf::File::open(kData + "/golden/models/" + file);
    ASSERT_TRUE(q.has_value()) << q.error().message;
    for (const gguf::TensorInfo& t : (*q)->tensors()) {
      if (t.type != DType::Q4_K && t.type != DType::Q5_K && t.type != DType::Q6_K && t.type != DType::Q8_0) continue;
      const gguf::TensorInfo* s = (*src)->find_tensor(t.name);
      ASSERT_NE(s, nullptr) << t.name;
      ASSERT_EQ(s->type, DType::F32);
      const int64_t n_in = t.ne[0], rows = t.ne[1];
      const size_t rb = row_bytes(t.type, n_in);
      std::vector<uint8_t> mine(rb);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(kernels::quantize_row(t.type, reinterpret_cast<const float*>(s->data) + r * n_in, mine.data(), n_in));
        ASSERT_EQ(0, std::memcmp(mine.data(), t.data + r * rb, rb)) << file << " " << t.name << " row " << r;
      }
      ++checked[t.type];
    }
  }
  EXPECT_EQ(checked[DType::Q4_K], 26);  // the Q4_K and Q4_K_S files' matrices
  EXPECT_EQ(checked[DType::Q5_K], 2);   // Q4_K_S's attn_v in the first 4 layers: both
  EXPECT_EQ(checked[DType::Q6_K], 21);  // the Q6_K file, and the outputs and ffn_down of the others
  EXPECT_EQ(checked[DType::Q8_0], 16);  // every matrix of the Q8_0 file
}

}  // namespace
}  // namespace lc
