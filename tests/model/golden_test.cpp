// The whole model against llama.cpp's outputs for the same GGUF files (tests/data/golden, see
// its README for how they were made and the tolerances).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/context.h"
#include "model/model.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

template <class T>
std::vector<T> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  in.seekg(0, std::ios::end);
  const auto n = static_cast<size_t>(in.tellg());
  in.seekg(0);
  std::vector<T> v(n / sizeof(T));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  return v;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

struct Diff {
  double max_abs = 0, rms = 0;
  int64_t rows = 0, top1_agree = 0;
};

Diff compare_logits(const float* ours, const float* ref, int64_t rows, int64_t n_vocab) {
  Diff d;
  double ss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t a = 0, b = 0;
    for (int64_t j = 0; j < n_vocab; ++j) {
      const double e = std::fabs(static_cast<double>(ours[r * n_vocab + j]) - ref[r * n_vocab + j]);
      d.max_abs = std::max(d.max_abs, std::isnan(e) ? INFINITY : e);
      ss += e * e;
      if (ours[r * n_vocab + j] > ours[r * n_vocab + a]) a = j;
      if (ref[r * n_vocab + j] > ref[r * n_vocab + b]) b = j;
    }
    d.top1_agree += a == b;
  }
  d.rows = rows;
  d.rms = std::sqrt(ss / static_cast<double>(rows * n_vocab));
  return d;
}

struct Tolerance {
  double max_abs, rms, top1;  // top1: minimum fraction of rows whose argmax agrees
};

// What a case is compared with and how closely (golden README, "Suggested tolerances").
struct GoldenCase {
  const char* model;
  const char* ref_dir;  // "" = llama.cpp-native, else an alt reference folder
  Tolerance tol;
  bool exact_greedy;
};

constexpr Tolerance kF32Tol{1e-3, 1e-3, 1.0};
constexpr Tolerance kQuantTol{0.5, 0.1, 0.95};

// F16 weights are widened to f32 here, so the exact-math reference (deq_f32) applies. Quantised
// weights multiply Q8-quantised activations as ggml does; Q4_0 and Q4_K use the portable
// (non-repacked) ggml kernels' reference.
const GoldenCase kCases[] = {
    {"stories260K", "", kF32Tol, true},
    {"llama_gqa_f32", "", kF32Tol, true},
    {"qwen2_bias_f32", "", kF32Tol, true},
    {"qwen3_qknorm_f32", "", kF32Tol, true},
    {"llama_quant_src_f32", "", kF32Tol, true},
    {"qwen2_yarn_f32", "", kF32Tol, true},
    {"llama_ropefreqs_f32", "", kF32Tol, true},
    {"llama_gqa_f16", "deq_f32/", kF32Tol, true},
    {"llama_quant_q8_0", "", kQuantTol, false},
    {"llama_quant_q4_0", "norepack/", kQuantTol, false},
    {"llama_quant_q4_k", "norepack/", kQuantTol, false},
    {"llama_quant_q4_k_s", "norepack/", kQuantTol, false},
    {"llama_quant_q6_k", "", kQuantTol, false},
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

void check_prompts(const GoldenCase& gc, int n_threads, int64_t n_batch) {
  auto model = Model::load(kGolden + "models/" + gc.model + ".gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  const auto cj = read_json(kGolden + "cases/" + gc.model + "/case.json");
  const int64_t n_vocab = (*model)->hparams().n_vocab;
  ASSERT_EQ(n_vocab, 512);
  for (const char* p : {"p1", "p2", "p3"}) {
    const std::vector<int32_t> ids = cj["prompts"][p]["ids"].get<std::vector<int32_t>>();
    auto ctx = Context::create(**model, {512, n_batch, n_threads});
    ASSERT_TRUE(ctx.has_value()) << ctx.error().message;
    Status s = (*ctx)->decode(ids, Logits::kAll);
    ASSERT_TRUE(s.is_ok()) << s.message();
    const auto ref = read_raw<float>(kGolden + "cases/" + gc.model + "/" + gc.ref_dir + "logits_" + p + ".f32");
    ASSERT_EQ(ref.size(), ids.size() * static_cast<size_t>(n_vocab));
    const Diff d = compare_logits((*ctx)->logits(0), ref.data(), static_cast<int64_t>(ids.size()), n_vocab);
    SCOPED_TRACE(testing::Message() << gc.model << " " << p << " threads=" << n_threads << " batch=" << n_batch
                                    << " max|d|=" << d.max_abs << " rms=" << d.rms << " top1=" << d.top1_agree
                                    << "/" << d.rows);
    EXPECT_LE(d.max_abs, gc.tol.max_abs);
    EXPECT_LE(d.rms, gc.tol.rms);
    EXPECT_GE(static_cast<double>(d.top1_agree), gc.tol.top1 * static_cast<double>(d.rows));
  }
}

TEST_P(GoldenTest, PromptLogits) { check_prompts(GetParam(), 1, 512); }

// Results must not depend on the prefill chunk size or the thread count.
TEST_P(GoldenTest, PromptLogitsChunkedTwoThreads) { check_prompts(GetParam(), 2, 7); }

// Chunks of at most 8 rows take the decode path (each half of a layer one parallel region, with
// the norms, residual adds and SwiGLU inside it); larger chunks the prefill path. For quantised
// and F16 weights, whose products give the same bits whatever the token count, both paths must
// give the same bits, for every thread count (3 threads: uneven shares of the rows). F32 weights
// go through OpenBLAS from 8 tokens on, so there the reference is one token at a time on one
// thread, against chunks of 3 on 2 and 3 threads.
TEST_P(GoldenTest, DecodeSizedChunksGiveThePrefillBits) {
  const GoldenCase& gc = GetParam();
  auto model = Model::load(kGolden + "models/" + gc.model + ".gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  const bool f32 = (*model)->layers()[0].wq.type == DType::F32;
  const auto cj = read_json(kGolden + "cases/" + gc.model + "/case.json");
  const std::vector<int32_t> ids = cj["prompts"]["p2"]["ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 40));
  const size_t n = prompt.size() * static_cast<size_t>((*model)->hparams().n_vocab);
  auto ref = Context::create(**model, {512, f32 ? 1 : 512, 1});
  ASSERT_TRUE(ref.has_value());
  ASSERT_TRUE((*ref)->decode(prompt, Logits::kAll).is_ok());
  for (int threads : {1, 2, 3})
    for (int64_t batch : {1, 3, 8}) {
      if (f32 && (batch == 8 || (threads == 1 && batch == 1))) continue;
      auto ctx = Context::create(**model, {512, batch, threads});
      ASSERT_TRUE(ctx.has_value());
      ASSERT_TRUE((*ctx)->decode(prompt, Logits::kAll).is_ok());
      EXPECT_EQ(0, std::memcmp((*ctx)->logits(0), (*ref)->logits(0), n * sizeof(float)))
          << gc.model << " threads=" << threads << " batch=" << batch;
    }
}

TEST_P(GoldenTest, Greedy) {
  const GoldenCase& gc = GetParam();
  auto model = Model::load(kGolden + "models/" + gc.model + ".gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  const auto cj = read_json(kGolden + "cases/" + gc.model + "/case.json");
  const std::vector<int32_t> prompt = cj["prompts"]["p1"]["ids"].get<std::vector<int32_t>>();
  const auto& greedy = gc.ref_dir[0] ? cj["alt_references"][std::string(gc.ref_dir).substr(0, std::strlen(gc.ref_dir) - 1)]["greedy"]
                                     : cj["greedy"];
  const std::vector<int32_t> gold = greedy["ids"].get<std::vector<int32_t>>();
  const std::vector<double> margin = greedy["top1_minus_top2"].get<std::vector<double>>();
  const auto gen_logits = read_raw<float>(kGolden + "cases/" + gc.model + "/" + gc.ref_dir + "gen_logits.f32");
  ASSERT_EQ(gen_logits.size(), gold.size() * 512);

  auto ctx = Context::create(**model, {512, 512, 1});
  ASSERT_TRUE(ctx.has_value());
  ASSERT_TRUE((*ctx)->decode(prompt, Logits::kLast).is_ok());
  // Free-running greedy until the first step whose golden top-2 margin is within our logit
  // tolerance (there, either choice is correct); from then on teacher-forced.
  bool free_running = gc.exact_greedy;
  int64_t matched = 0, agree = 0;
  double max_d = 0;
  for (size_t k = 0; k < gold.size(); ++k) {
    const float* lg = (*ctx)->logits(0);
    int32_t best = 0;
    for (int32_t j = 1; j < 512; ++j)
      if (lg[j] > lg[best]) best = j;
    const Diff d = compare_logits(lg, gen_logits.data() + k * 512, 1, 512);
    max_d = std::max(max_d, d.max_abs);
    agree += d.top1_agree;
    if (free_running && margin[k] <= 2 * gc.tol.max_abs) free_running = false;
    if (free_running) {
      EXPECT_EQ(best, gold[k]) << gc.model << " greedy step " << k;
      ++matched;
    }
    const int32_t next = gold[k];  // identical to `best` while free-running
    ASSERT_TRUE((*ctx)->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
  }
  SCOPED_TRACE(testing::Message() << gc.model << " matched " << matched << " free-running steps, max|d|=" << max_d);
  EXPECT_LE(max_d, gc.tol.max_abs);
  EXPECT_GE(static_cast<double>(agree), gc.tol.top1 * static_cast<double>(gold.size()));
  if (gc.exact_greedy) {
    EXPECT_GT(matched, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, ::testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<GoldenCase>& i) { return std::string(i.param.model); });

// stories260K greedy text from "Once upon a time...Lily." matches llama.cpp's output exactly.
TEST(GoldenStories, GreedyText) {
  auto model = Model::load(kGolden + "models/stories260K.gguf");
  ASSERT_TRUE(model.has_value());
  const auto cj = read_json(kGolden + "cases/stories260K/case.json");
  std::vector<int32_t> ids = (*model)->tokenizer().encode("Once upon a time, there was a little girl named Lily.", true, false);
  EXPECT_EQ(ids, cj["prompts"]["p1"]["ids"].get<std::vector<int32_t>>());
  auto ctx = Context::create(**model, {512, 512, 2});
  ASSERT_TRUE(ctx.has_value());
  ASSERT_TRUE((*ctx)->decode(ids, Logits::kLast).is_ok());
  std::vector<int32_t> out;
  for (int k = 0; k < 64; ++k) {
    const float* lg = (*ctx)->logits(0);
    int32_t best = 0;
    for (int32_t j = 1; j < 512; ++j)
      if (lg[j] > lg[best]) best = j;
    out.push_back(best);
    ASSERT_TRUE((*ctx)->decode(std::span<const int32_t>(&best, 1), Logits::kLast).is_ok());
  }
  // The golden text is the byte concatenation of the pieces.
  std::string text;
  for (int32_t id : out) text += (*model)->tokenizer().token_to_piece(id);
  EXPECT_EQ(text, cj["greedy"]["text"].get<std::string>());
}

}  // namespace
}  // namespace lc

namespace lc {
namespace {

// A --rope override that restates what the GGUF says must reproduce llama.cpp's logits:
// the override path (rope module registry) computes the same tables as the metadata path.
void check_rope_override(const char* model_name, const std::string& spec) {
  auto model = Model::load(kGolden + "models/" + model_name + ".gguf");
  ASSERT_TRUE(model.has_value());
  const auto cj = read_json(kGolden + "cases/" + model_name + "/case.json");
  const std::vector<int32_t> ids = cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();
  ContextParams cp{512, 64, 2};
  cp.rope = spec;
  auto ctx = Context::create(**model, cp);
  ASSERT_TRUE(ctx.has_value()) << ctx.error().message;
  ASSERT_TRUE((*ctx)->decode(ids, Logits::kAll).is_ok());
  const auto ref = read_raw<float>(kGolden + "cases/" + model_name + "/logits_p3.f32");
  const Diff d = compare_logits((*ctx)->logits(0), ref.data(), static_cast<int64_t>(ids.size()), 512);
  EXPECT_LE(d.max_abs, 1e-3) << model_name << " --rope " << spec;
}

TEST(GoldenRope, YarnOverrideEqualsMetadata) {
  // qwen2_yarn_f32: yarn, factor 4, original context 64, base 1e6 (golden README).
  check_rope_override("qwen2_yarn_f32", "yarn:factor=4,orig=64");
}

TEST(GoldenRope, NoneOverrideEqualsUnscaledModel) {
  check_rope_override("stories260K", "none");
  check_rope_override("qwen2_bias_f32", "none");
}

TEST(GoldenRope, OverrideChangesScaledModel) {
  // Dropping YaRN from the YaRN model must move the logits (README: by up to 12.3).
  auto model = Model::load(kGolden + "models/qwen2_yarn_f32.gguf");
  ASSERT_TRUE(model.has_value());
  const auto cj = read_json(kGolden + "cases/qwen2_yarn_f32/case.json");
  const std::vector<int32_t> ids = cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();
  ContextParams cp{512, 512, 1};
  cp.rope = "none";
  auto ctx = Context::create(**model, cp);
  ASSERT_TRUE(ctx.has_value());
  ASSERT_TRUE((*ctx)->decode(ids, Logits::kAll).is_ok());
  const auto ref = read_raw<float>(kGolden + "cases/qwen2_yarn_f32/logits_p3.f32");
  EXPECT_GT(compare_logits((*ctx)->logits(0), ref.data(), static_cast<int64_t>(ids.size()), 512).max_abs, 1.0);
}

}  // namespace
}  // namespace lc

namespace lc {
namespace {

struct BackendCase {
  const char* model;
  const char* attn;
  int64_t kv_block;
  DType kv_type;
  double tol;
};

// Whole-model runs through every attention backend and KV layout, against llama.cpp's logits:
// sparse backends whose budget covers the whole prompt (P3, 256 tokens) must be exact; K/V
// rounded to f16 is within the README's F16-cache tolerance (5e-2).
class GoldenBackendTest : public ::testing::TestWithParam<BackendCase> {};

TEST_P(GoldenBackendTest, PromptLogits) {
  const BackendCase& bc = GetParam();
  auto model = Model::load(kGolden + "models/" + bc.model + ".gguf");
  ASSERT_TRUE(model.has_value());
  const auto cj = read_json(kGolden + "cases/" + bc.model + "/case.json");
  const std::vector<int32_t> ids = cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();
  ContextParams cp{512, 48, 2};
  cp.attn = bc.attn;
  cp.kv_block = bc.kv_block;
  cp.kv_type_k = cp.kv_type_v = bc.kv_type;
  auto ctx = Context::create(**model, cp);
  ASSERT_TRUE(ctx.has_value()) << ctx.error().message;
  ASSERT_TRUE((*ctx)->decode(ids, Logits::kAll).is_ok());
  const auto ref = read_raw<float>(kGolden + "cases/" + bc.model + "/logits_p3.f32");
  const Diff d = compare_logits((*ctx)->logits(0), ref.data(), static_cast<int64_t>(ids.size()), 512);
  EXPECT_LE(d.max_abs, bc.tol) << bc.model << " --attn " << bc.attn << " --kv-block " << bc.kv_block;
}

const BackendCase kBackendCases[] = {
    {"llama_gqa_f32", "dense", 1, DType::F32, 1e-3},
    {"llama_gqa_f32", "dense", 7, DType::F32, 1e-3},
    {"llama_gqa_f32", "dense", 256, DType::F32, 1e-3},
    {"llama_gqa_f32", "naive", 16, DType::F32, 1e-3},
    {"qwen2_yarn_f32", "quest:budget=4096,page=16,dense_layers=0", 16, DType::F32, 1e-3},
    {"llama_gqa_f32", "infllm:sinks=4,local=4096,block=16,reps=4,topk=64,chunk=32", 16, DType::F32, 1e-3},
    {"qwen3_qknorm_f32", "dssa:switch=100000", 64, DType::F32, 1e-3},
    {"llama_gqa_f32", "lychee:budget=4096,block=16,sinks=4,local=512,retrieval=1", 16, DType::F32, 1e-3},
    {"llama_gqa_f32", "streaming:sinks=4,window=1024", 16, DType::F32, 1e-3},
    {"stories260K", "dense", 64, DType::F16, 5e-2},
    {"llama_gqa_f32", "dense", 64, DType::BF16, 0.2},
};

INSTANTIATE_TEST_SUITE_P(Golden, GoldenBackendTest, ::testing::ValuesIn(kBackendCases),
                         [](const testing::TestParamInfo<BackendCase>& i) {
                           std::string s = std::string(i.param.model) + "_" + i.param.attn + "_b" +
                                           std::to_string(i.param.kv_block) + "_" + dtype_name(i.param.kv_type);
                           for (auto& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
}  // namespace lc

namespace lc {
namespace {

// A press at ratio 0 keeps everything: the whole model still matches llama.cpp.
TEST(GoldenPress, RatioZeroIsIdentity) {
  auto model = Model::load(kGolden + "models/llama_gqa_f32.gguf");
  ASSERT_TRUE(model.has_value());
  const auto cj = read_json(kGolden + "cases/llama_gqa_f32/case.json");
  const std::vector<int32_t> ids = cj["prompts"]["p2"]["ids"].get<std::vector<int32_t>>();
  const auto ref = read_raw<float>(kGolden + "cases/llama_gqa_f32/logits_p2.f32");
  for (const char* spec : {"snapkv:ratio=0", "knorm:ratio=0", "streaming_llm:ratio=0", "h2o:ratio=0",
                           "tova:ratio=0", "expected_attention:ratio=0", "random:ratio=0"}) {
    ContextParams cp{512, 64, 2};
    cp.kv_press = spec;
    auto ctx = Context::create(**model, cp);
    ASSERT_TRUE(ctx.has_value()) << spec << ": " << ctx.error().message;
    // The prompt in two calls: the press runs after the first, the second sees its result.
    const size_t half = ids.size() / 2;
    ASSERT_TRUE((*ctx)->decode(std::span<const int32_t>(ids.data(), half), Logits::kNone).is_ok());
    ASSERT_TRUE((*ctx)->decode(std::span<const int32_t>(ids.data() + half, ids.size() - half), Logits::kAll).is_ok());
    const Diff d = compare_logits((*ctx)->logits(0), ref.data() + half * 512, static_cast<int64_t>(ids.size() - half), 512);
    EXPECT_LE(d.max_abs, 1e-3) << spec;
  }
}

// A press that removes tokens really frees cache memory and changes the result.
TEST(GoldenPress, CompressionFreesMemory) {
  auto model = Model::load(kGolden + "models/llama_gqa_f32.gguf");
  ASSERT_TRUE(model.has_value());
  const auto cj = read_json(kGolden + "cases/llama_gqa_f32/case.json");
  const std::vector<int32_t> ids = cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();
  ContextParams base{512, 64, 1};
  base.kv_block = 16;
  ContextParams pressed = base;
  pressed.kv_press = "snapkv:ratio=0.75,window=16,n_sink=4";
  auto a = Context::create(**model, base);
  auto b = Context::create(**model, pressed);
  ASSERT_TRUE(a.has_value() && b.has_value()) << (b ? "" : b.error().message);
  ASSERT_TRUE((*a)->decode(ids, Logits::kLast).is_ok());
  ASSERT_TRUE((*b)->decode(ids, Logits::kLast).is_ok());
  EXPECT_LT((*b)->kv().memory().in_use_bytes * 2, (*a)->kv().memory().in_use_bytes);
  for (int64_t h = 0; h < 2; ++h) EXPECT_EQ((*b)->kv().n_tokens(0, h), 64);  // 25% of 256 kept
}

}  // namespace
}  // namespace lc
