// criticalkv and critical_adakv inside the model's Context: the press runner hands the press the
// model's own W_o (PressContext::out_proj, dequantised from the GGUF tensor: f32, and Q4_K), and
// the kept sets equal an oracle computed here in double from the UNPRESSED model's cache and
// W_o read straight off the weights, as kvpress's CriticalKVPress / CriticalAdaKVPress with
// KnormPress as the inner scorer (kvpress/presses/criticalkv_press.py, knorm_press.py):
//   vwl1norm: Wo = o_proj.weight.T.view(n_heads, head_dim, hidden); ||v @ Wo[hq]||_1, group mean.
// qwen3_qknorm has n_head x head_dim = 256 != n_embd = 128 and GQA 4:2, so the W_o layout (rows
// are the n_embd outputs, a query head's columns hq * head_dim_v ...) and the group are both tested.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "model/context.h"
#include "model/model.h"

namespace lc {
namespace {

const std::string kModels = std::string(LONGCTX_TEST_DATA) + "/golden/models/";
constexpr double kMax = 1e300;

std::unique_ptr<Context> make_ctx(const Model& m, const std::string& press) {
  ContextParams cp{512, 64, 1};
  cp.kv_press = press;
  auto c = Context::create(m, cp);
  EXPECT_TRUE(c.has_value()) << press << ": " << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

double g_min_gap = INFINITY;
std::vector<int64_t> topk(const std::vector<double>& x, int64_t k) {
  std::vector<int64_t> o(x.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]; });
  if (k > 0 && k < static_cast<int64_t>(o.size())) {
    const double a = x[static_cast<size_t>(o[static_cast<size_t>(k - 1)])], b = x[static_cast<size_t>(o[static_cast<size_t>(k)])];
    if (std::fabs(a) < 1e250 && std::fabs(b) < 1e250)
      g_min_gap = std::min(g_min_gap, (a - b) / std::max({std::fabs(a), std::fabs(b), 1e-30}));
  }
  o.resize(static_cast<size_t>(std::clamp<int64_t>(k, 0, static_cast<int64_t>(o.size()))));
  return o;
}

using Rows = std::vector<std::vector<double>>;  // [KV head][token]

// Knorm scores and the W_o value norms of layer il, from the unpressed cache and the weights.
void scores_and_norms(const Model& m, const KvCache& kv, int64_t il, Rows& score, Rows& norm) {
  const HParams& hp = m.hparams();
  const int64_t H = hp.n_head, Hkv = hp.n_head_kv, d = hp.head_dim, dv = hp.head_dim_v, E = hp.n_embd, g = H / Hkv;
  const TensorView& wo = m.layers()[static_cast<size_t>(il)].wo;
  EXPECT_EQ(wo.ne[0], H * dv);
  EXPECT_EQ(wo.n_rows(), E);
  std::vector<float> W(static_cast<size_t>(E * H * dv));  // o_proj.weight [hidden, n_heads * head_dim]
  for (int64_t r = 0; r < E; ++r) kernels::dequantize_row(wo.type, wo.row(r), W.data() + r * H * dv, H * dv);
  const int64_t L = kv.n_tokens(il, 0);
  score.assign(static_cast<size_t>(Hkv), std::vector<double>(static_cast<size_t>(L)));
  norm.assign(static_cast<size_t>(Hkv), std::vector<double>(static_cast<size_t>(L), 0.0));
  std::vector<float> K(static_cast<size_t>(L * d)), V(static_cast<size_t>(L * dv));
  for (int64_t h = 0; h < Hkv; ++h) {
    kv.read_keys(il, h, 0, L, K.data());
    kv.read_values(il, h, 0, L, V.data());
    for (int64_t j = 0; j < L; ++j) {
      double n2 = 0;
      for (int64_t e = 0; e < d; ++e) n2 += static_cast<double>(K[static_cast<size_t>(j * d + e)]) * K[static_cast<size_t>(j * d + e)];
      score[static_cast<size_t>(h)][static_cast<size_t>(j)] = -std::sqrt(n2);
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
        double l1 = 0;
        for (int64_t r = 0; r < E; ++r) {
          double y = 0;  // (v @ Wo[hq])[r] = sum_e v[e] * o_proj.weight[r][hq * dv + e]
          for (int64_t e = 0; e < dv; ++e)
            y += static_cast<double>(V[static_cast<size_t>(j * dv + e)]) * W[static_cast<size_t>(r * H * dv + hq * dv + e)];
          l1 += std::fabs(y);
        }
        norm[static_cast<size_t>(h)][static_cast<size_t>(j)] += l1 / static_cast<double>(g);
      }
    }
  }
}

std::vector<std::vector<int32_t>> critical_oracle(Rows s, const Rows& norm, int64_t n_kept, int64_t sel, double eps) {
  std::vector<std::vector<int32_t>> out;
  for (size_t h = 0; h < s.size(); ++h) {
    const auto top1 = topk(s[h], sel);
    for (size_t j = 0; j < s[h].size(); ++j) s[h][j] = (s[h][j] + eps) * norm[h][j];
    for (int64_t j : top1) s[h][static_cast<size_t>(j)] = kMax;
    auto k = topk(s[h], n_kept);
    std::sort(k.begin(), k.end());
    out.emplace_back(k.begin(), k.end());
  }
  return out;
}

std::vector<std::vector<int32_t>> critical_ada_oracle(Rows s, const Rows& norm, int64_t n_kept, double alpha, double fsr,
                                                      double eps) {
  const int64_t Hkv = static_cast<int64_t>(s.size()), L = static_cast<int64_t>(s[0].size());
  const auto n_safe = static_cast<int64_t>(static_cast<double>(n_kept) * alpha);
  for (auto& r : s)
    for (int64_t j : topk(r, n_safe)) r[static_cast<size_t>(j)] = kMax;
  std::vector<double> flat;
  for (const auto& r : s) flat.insert(flat.end(), r.begin(), r.end());
  std::vector<int64_t> B(static_cast<size_t>(Hkv), 0);
  for (int64_t i : topk(flat, n_kept * Hkv)) ++B[static_cast<size_t>(i / L)];
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(Hkv));
  for (int64_t h = 0; h < Hkv; ++h) {
    auto& r = s[static_cast<size_t>(h)];
    for (int64_t j : topk(r, static_cast<int64_t>(static_cast<double>(B[static_cast<size_t>(h)]) * fsr))) r[static_cast<size_t>(j)] = kMax;
    for (int64_t j = 0; j < L; ++j) r[static_cast<size_t>(j)] = (r[static_cast<size_t>(j)] + eps) * norm[static_cast<size_t>(h)][static_cast<size_t>(j)];
    auto k = topk(r, B[static_cast<size_t>(h)]);  // the top B_h of each head are what survives
    std::sort(k.begin(), k.end());
    out[static_cast<size_t>(h)].assign(k.begin(), k.end());
  }
  return out;
}

TEST(PressCriticalKvModel, KeptSetsWithTheModelsWo) {
  for (const char* file : {"qwen3_qknorm_f32.gguf", "llama_quant_q4_k.gguf"}) {
    auto mr = Model::load(kModels + file);
    ASSERT_TRUE(mr.has_value()) << file;
    const Model& m = **mr;
    std::vector<int32_t> prompt;
    for (int32_t t = 0; t < 90; ++t) prompt.push_back(3 + (t * 71) % 200);
    auto plain = make_ctx(m, "");
    ASSERT_TRUE(plain->decode(prompt, Logits::kLast).is_ok());
    for (bool ada : {false, true}) {
      const std::string spec = ada ? "critical_adakv:ratio=0.5,inner=knorm" : "criticalkv:ratio=0.5,inner=knorm";
      auto ctx = make_ctx(m, spec);
      ASSERT_TRUE(ctx->decode(prompt, Logits::kLast).is_ok()) << spec;
      g_min_gap = INFINITY;
      for (int64_t il = 0; il < m.hparams().n_layer; ++il) {
        Rows score, norm;
        scores_and_norms(m, plain->kv(), il, score, norm);
        const auto want = ada ? critical_ada_oracle(score, norm, 45, 0.2, 0.5, 1e-4) : critical_oracle(score, norm, 45, 22, 1e-4);
        for (int64_t h = 0; h < m.hparams().n_head_kv; ++h) {
          const int32_t* s = ctx->kv().seq_index(il, h);
          EXPECT_EQ(std::vector<int32_t>(s, s + ctx->kv().n_tokens(il, h)), want[static_cast<size_t>(h)])
              << file << " " << spec << " layer " << il << " head " << h;
        }
      }
      // qwen3's k_norm makes key norms close: a cut 2e-5 apart (relative) is still 10x the float error.
      EXPECT_GT(g_min_gap, 2e-5) << file << " " << spec << ": near-tie at a cut, pick another prompt";
      // Decoding goes on over the compressed cache.
      const int32_t next = 5;
      EXPECT_TRUE(ctx->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
    }
  }
}

}  // namespace
}  // namespace lc
