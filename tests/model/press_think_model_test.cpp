// think inside the model's Context: with the channels dropped from storage (store=drop, the
// default) the model computes what it computes with them zeroed in place (store=zero, kvpress's
// way): the same logits after the prompt and at every generated token up to the order of float
// additions, the same greedy tokens, f32 and f16 keys, while the cache holds fewer blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/context.h"
#include "model/model.h"

namespace lc {
namespace {

const std::string kModels = std::string(LONGCTX_TEST_DATA) + "/golden/models/";

std::unique_ptr<Context> make_ctx(const Model& m, const std::string& press, DType tk) {
  ContextParams cp{1024, 64, 1};
  cp.kv_press = press;
  cp.kv_block = 16;
  cp.kv_type_k = tk;
  cp.kv_type_v = DType::F16;
  auto c = Context::create(m, cp);
  EXPECT_TRUE(c.has_value()) << press << ": " << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

TEST(PressThinkModel, DroppedChannelsComputeWhatZeroedOnesDo) {
  auto mr = Model::load(kModels + "llama_gqa_f32.gguf");
  ASSERT_TRUE(mr.has_value());
  const Model& m = **mr;
  const int64_t nv = m.hparams().n_vocab;
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 300; ++t) prompt.push_back(3 + (t * 71) % 200);
  for (const DType tk : {DType::F32, DType::F16}) {
    SCOPED_TRACE(dtype_name(tk));
    auto zero = make_ctx(m, "think:channel_ratio=0.5,store=zero", tk);
    auto drop = make_ctx(m, "think:channel_ratio=0.5", tk);
    ASSERT_TRUE(zero && drop);
    ASSERT_TRUE(zero->decode(prompt, Logits::kLast).is_ok());
    ASSERT_TRUE(drop->decode(prompt, Logits::kLast).is_ok());
    const KvCache& kz = zero->kv();
    const KvCache& kd = drop->kv();
    for (int64_t il = 0; il < kd.n_layer(); ++il)
      for (int64_t h = 0; h < kd.n_head_kv(); ++h) {
        EXPECT_EQ(kd.n_thin(il, h), 300) << "layer " << il << " head " << h;
        EXPECT_EQ(kz.n_thin(il, h), 0);
      }
    EXPECT_LT(kd.memory().in_use_bytes, kz.memory().in_use_bytes);
    for (int step = 0; step < 8; ++step) {
      const float* a = zero->logits(0);
      const float* b = drop->logits(0);
      double diff = 0, scale = 0;
      for (int64_t i = 0; i < nv; ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
      }
      // Attention over thin rows computes q . k over the kept channels only (ThinK's pruned
      // product), the zeroed cache over every channel with zeros in the dropped ones: the same
      // sum, added in another order, so a few float32 roundings apart (measured: at most 2.4e-5
      // of logits about 10, f16 keys; 4e-6 with f32).
      ASSERT_LE(diff, 1e-5 * scale) << "logits differ at step " << step;
      ASSERT_EQ(std::max_element(b, b + nv) - b, std::max_element(a, a + nv) - a) << "step " << step;
      const int32_t id = static_cast<int32_t>(std::max_element(a, a + nv) - a);
      ASSERT_TRUE(zero->decode(std::span<const int32_t>(&id, 1), Logits::kLast).is_ok());
      ASSERT_TRUE(drop->decode(std::span<const int32_t>(&id, 1), Logits::kLast).is_ok());
    }
  }
}

}  // namespace
}  // namespace lc
