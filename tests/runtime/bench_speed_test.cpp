// bench fill / bench speed: the depth is what the cache holds, a fill extended to a depth
// equals a fill made to it at once, an evicting backend forces a refill, and the timed
// backend is the context's own again after a fill with another.
#include <gtest/gtest.h>

#include <cmath>

#include "model/context.h"
#include "model/model.h"
#include "runtime/measure.h"

namespace lc {
namespace {

const std::string kModel = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

std::vector<float> probe(Context& ctx) {
  const int32_t tok = 42;
  EXPECT_TRUE(ctx.decode(std::span<const int32_t>(&tok, 1), Logits::kLast).is_ok());
  const float* l = ctx.logits(0);
  return std::vector<float>(l, l + ctx.model().hparams().n_vocab);
}

bool all_heads_hold(const Context& ctx, int64_t n) {
  const KvCache& kv = ctx.kv();
  for (int64_t il = 0; il < kv.config().n_layer; ++il)
    for (int64_t h = 0; h < kv.config().n_head_kv; ++h)
      if (kv.n_tokens(il, h) != n) return false;
  return true;
}

TEST(BenchSpeed, ExtendedFillEqualsOneFill) {
  auto model = Model::load(kModel);
  ASSERT_TRUE(model.has_value()) << model.error().message;
  ContextParams cp;
  cp.n_ctx = 1024;
  cp.n_batch = 128;
  cp.n_threads = 2;
  auto a = Context::create(**model, cp);
  auto b = Context::create(**model, cp);
  ASSERT_TRUE(a.has_value() && b.has_value());
  ASSERT_TRUE(bench_fill(**a, 200, "", 7).is_ok());
  ASSERT_TRUE(bench_fill(**a, 600, "", 7).is_ok());
  ASSERT_TRUE(bench_fill(**b, 600, "", 7).is_ok());
  EXPECT_EQ((*a)->n_past(), 600);
  EXPECT_TRUE(all_heads_hold(**a, 600));
  const auto la = probe(**a), lb = probe(**b);
  double worst = 0;
  for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, double(std::abs(la[i] - lb[i])));
  EXPECT_LT(worst, 1e-4);
  // A shallower depth than the context holds starts over.
  ASSERT_TRUE(bench_fill(**a, 100, "", 7).is_ok());
  EXPECT_EQ((*a)->n_past(), 100);
}

TEST(BenchSpeed, FillAttnIsUndoneAndEvictionForcesARefill) {
  auto model = Model::load(kModel);
  ASSERT_TRUE(model.has_value()) << model.error().message;
  ContextParams cp;
  cp.n_ctx = 2048;
  cp.n_batch = 256;
  cp.n_threads = 2;
  cp.attn = "quest:budget=128,page=16,dense_layers=0";
  auto c = Context::create(**model, cp);
  ASSERT_TRUE(c.has_value());
  Context& ctx = **c;
  const std::string own = ctx.attention().spec();
  ASSERT_TRUE(bench_fill(ctx, 700, "infllm:sinks=4,local=64,topk=0", 3).is_ok());
  EXPECT_EQ(ctx.attention().spec(), own);
  EXPECT_TRUE(all_heads_hold(ctx, 700));
  auto pp = bench_speed(ctx, 64, 0, 2, true, 1);
  ASSERT_TRUE(pp.has_value()) << pp.error().message;
  EXPECT_EQ(pp->depth, 700);
  EXPECT_EQ(pp->tps.size(), 2u);
  EXPECT_EQ(ctx.n_past(), 700);  // truncated back after the runs
  EXPECT_TRUE(all_heads_hold(ctx, 700));
  EXPECT_FALSE(bench_speed(ctx, 2000, 0, 1, false, 1).has_value());  // 700 + 2000 > 2048

  ASSERT_TRUE(ctx.set_attention("streaming:sinks=4,window=100").is_ok());
  auto tg = bench_speed(ctx, 0, 4, 1, false, 1);
  ASSERT_TRUE(tg.has_value()) << tg.error().message;
  EXPECT_FALSE(all_heads_hold(ctx, 700));  // streaming evicted
  ASSERT_TRUE(bench_fill(ctx, 700, "infllm:sinks=4,local=64,topk=0", 3).is_ok());
  EXPECT_TRUE(all_heads_hold(ctx, 700));   // so the fill started over
  EXPECT_EQ(ctx.attention().spec(), "streaming:sinks=4,window=100");

  EXPECT_FALSE(ctx.set_attention("nosuch").is_ok());
  EXPECT_FALSE(bench_fill(ctx, 5000, "", 3).is_ok());  // beyond the context size
}


// The roofline bounds from the GGUF's tensor table (names and byte sizes), independently of the
// model's bound layer views: a quantised model (its matrices on the int8 peak) and a float one.
TEST(BenchSpeed, BoundsFollowTheTensorTable) {
  for (const char* name : {"llama_quant_q8_0.gguf", "llama_gqa_f32.gguf"}) {
    auto model = Model::load(std::string(LONGCTX_TEST_DATA) + "/golden/models/" + name);
    ASSERT_TRUE(model.has_value()) << model.error().message;
    const Model& m = **model;
    double layer_bytes = 0, layer_flops = 0, out_bytes = 0, out_flops = 0, embd_bytes = 0, embd_flops = 0;
    bool has_output = false, quant = false;
    for (const auto& t : m.file().tensors()) {
      if (t.n_dims != 2) continue;
      const double flops = 2.0 * static_cast<double>(t.ne[0] * t.ne[1]);
      if (t.name == "output.weight") {
        has_output = true, out_bytes = static_cast<double>(t.n_bytes), out_flops = flops;
      } else if (t.name == "token_embd.weight") {
        embd_bytes = static_cast<double>(t.n_bytes), embd_flops = flops;
      } else if (t.name.rfind("blk.", 0) == 0) {
        layer_bytes += static_cast<double>(t.n_bytes), layer_flops += flops;
        quant = quant || (t.type != DType::F32 && t.type != DType::F16);
      }
    }
    if (!has_output) out_bytes = embd_bytes, out_flops = embd_flops;  // tied
    const HParams& hp = m.hparams();
    const TokenCost c = token_cost(m);
    EXPECT_EQ(c.layer_bytes, layer_bytes) << name;
    EXPECT_EQ(c.output_bytes, out_bytes) << name;
    EXPECT_EQ(c.layer_flops_f32 + c.layer_flops_int8, layer_flops) << name;
    EXPECT_EQ(quant ? c.layer_flops_int8 : c.layer_flops_f32, layer_flops) << name;

    // Decode: 10 GB/s over the weights and 37.5 positions of 1000 bytes.
    const double want_tg = 10e9 / (layer_bytes + out_bytes + 1000 * 37.5);
    EXPECT_NEAR(decode_bound_tps(c, 1000, 37.5, 10), want_tg, want_tg * 1e-12) << name;

    // Prefill of 8 tokens after 100: sum over i of (100 + i + 1) keys, QK and PV of every head.
    kernels::PeakOps peak;
    peak.f32_gflops = 50, peak.int8_gops = 200;
    double keys = 0;
    for (int i = 0; i < 8; ++i) keys += 100 + i + 1;
    const double attn = keys * 2.0 * static_cast<double>(hp.n_layer * hp.n_head * (hp.head_dim + hp.head_dim_v));
    const double out_peak = (m.output().type == DType::F32 || m.output().type == DType::F16) ? 50e9 : 200e9;
    const double secs = 8 * layer_flops / (quant ? 200e9 : 50e9) + attn / 50e9 + out_flops / out_peak;
    EXPECT_NEAR(prefill_bound_tps(c, 8, 100, peak), 8 / secs, 8 / secs * 1e-12) << name;
    EXPECT_EQ(prefill_bound_tps(c, 8, 100, kernels::PeakOps{}), 0.0);  // not measured
  }
}

// BF16 weights multiplied with bf16 dot products run at the bf16 peak, the rest as before.
TEST(BenchSpeedBounds, Bf16DotProductsAtTheBf16Peak) {
  TokenCost c;
  c.layer_flops_f32 = 1e6, c.layer_flops_int8 = 2e6, c.layer_flops_bf16 = 3e6;
  c.output_flops = 4e6, c.output_bf16 = true, c.attn_flops_per_pos = 10;
  kernels::PeakOps peak;
  peak.f32_gflops = 50, peak.int8_gops = 200, peak.bf16_gflops = 100;
  const double secs = 4 * (1e6 / 50e9 + 2e6 / 200e9 + 3e6 / 100e9) + (5.0 + 6 + 7 + 8) * 10 / 50e9 + 4e6 / 100e9;
  EXPECT_NEAR(prefill_bound_tps(c, 4, 4, peak), 4 / secs, 4 / secs * 1e-12);
  peak.bf16_gflops = 0;  // bf16 work and no bf16 peak measured: no bound
  EXPECT_EQ(prefill_bound_tps(c, 4, 4, peak), 0.0);
}

}  // namespace
}  // namespace lc
