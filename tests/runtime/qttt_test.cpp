// Query-only test-time training (runtime/qttt.h) on the small golden models. Oracles: a naive
// double-precision forward of each span token over the frozen cache, written here from the
// model's tensors (its central finite differences check the W_q gradient), the engine's own
// logits (the training forward at the model's W_q), and byte snapshots of the KV cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "model/context.h"
#include "model/model.h"
#include "runtime/qttt.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

std::vector<int32_t> prompt_ids() {
  std::ifstream in(kGolden + "cases/stories260K/case.json");
  const auto cj = nlohmann::json::parse(in);
  return cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();  // 256 tokens, twice the training window
}

std::unique_ptr<Model> load(const std::string& name) {
  auto m = Model::load(kGolden + "models/" + name + ".gguf");
  EXPECT_TRUE(m.has_value()) << name << ": " << (m ? "" : m.error().message);
  return m ? std::move(*m) : nullptr;
}

struct CtxOpts {
  std::string rope, attn = "dense", press;
  DType kv_type = DType::F32;
  int64_t kv_block = 16;
  int threads = 2;
};

std::unique_ptr<Context> make_ctx(const Model& m, const CtxOpts& o = {}) {
  ContextParams cp{512, 64, o.threads};
  cp.rope = o.rope;
  cp.attn = o.attn;
  cp.kv_press = o.press;
  cp.kv_block = o.kv_block;
  cp.kv_type_k = cp.kv_type_v = o.kv_type;
  auto c = Context::create(m, cp);
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

std::vector<double> widen(const TensorView& w) {
  std::vector<float> row(static_cast<size_t>(w.ne[0]));
  std::vector<double> out(static_cast<size_t>(w.n_elements()));
  for (int64_t r = 0; r < w.n_rows(); ++r) {
    kernels::dequantize_row(w.type, w.row(r), row.data(), w.ne[0]);
    for (int64_t c = 0; c < w.ne[0]; ++c) out[static_cast<size_t>(r * w.ne[0] + c)] = row[static_cast<size_t>(c)];
  }
  return out;
}

// The naive oracle: each span token's forward in double over the frozen cache, one token at a
// time (with K and V fixed, span tokens do not interact), and the mean next-token loss.
// With distance W > 0 it is attention `fixed`: a key more than W positions back is scored with
// the query rotated at W against the cached key rotated back to position 0.
class Oracle {
 public:
  explicit Oracle(const Context& ctx, int64_t W = 0) : ctx_(ctx), m_(ctx.model()), hp_(m_.hparams()), W_(W) {
    for (const LayerWeights& L : m_.layers()) {
      wq.push_back(widen(L.wq));
      wo_.push_back(widen(L.wo));
      wg_.push_back(widen(L.w_gate));
      wu_.push_back(widen(L.w_up));
      wd_.push_back(widen(L.w_down));
    }
    wout_ = widen(m_.output());
    embd_ = widen(m_.tok_embd());
    const KvCache& kv = ctx.kv();
    for (int64_t il = 0; il < kv.n_layer(); ++il)
      for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
        const int64_t n = kv.n_tokens(il, h);
        std::vector<float> k(static_cast<size_t>(n * kv.head_dim())), v(static_cast<size_t>(n * kv.head_dim_v()));
        kv.read_keys(il, h, 0, n, k.data());
        kv.read_values(il, h, 0, n, v.data());
        k_.emplace_back(k.begin(), k.end());
        v_.emplace_back(v.begin(), v.end());
        // The same keys at position 0: R(-p) undoes the rotation, and the stored key carries
        // mscale once (a rotation written here carries it again).
        std::vector<double>& k0 = k0_.emplace_back(k.begin(), k.end());
        const RopeTable& rt = kv.rope(il);
        for (int64_t j = 0; j < n; ++j) {
          rotate(k0.data() + j * kv.head_dim(), rt, -kv.positions(il, h)[j]);
          for (int64_t c = 0; c < kv.head_dim(); ++c) k0[static_cast<size_t>(j * kv.head_dim() + c)] /= rt.mscale;
        }
      }
  }
  std::vector<std::vector<double>> wq;  // [n_layer][q_dim * n_embd], perturbed by the test

  double loss(int64_t start, int64_t S) const { return loss_from(start, S, 0); }
  // Records every span token's residual stream entering each layer, so that loss_from(il)
  // (after a change to layers >= il only) starts there.
  void record(int64_t start, int64_t S) {
    rec_start_ = start;
    rec_.assign(static_cast<size_t>(S), {});
    for (int64_t t = 0; t < S; ++t) token_loss(start + t, 0, &rec_[static_cast<size_t>(t)]);
  }
  double loss_from(int64_t start, int64_t S, int64_t il) const {
    double sum = 0;
    for (int64_t t = 0; t + 1 < S; ++t) sum += token_loss(start + t, il, nullptr);
    return sum / static_cast<double>(S - 1);
  }

 private:
  static std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x, int64_t out) {
    const int64_t in = static_cast<int64_t>(x.size());
    std::vector<double> y(static_cast<size_t>(out), 0.0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) y[static_cast<size_t>(o)] += w[static_cast<size_t>(o * in + i)] * x[static_cast<size_t>(i)];
    return y;
  }
  std::vector<double> rmsnorm(const std::vector<double>& x, const float* w, size_t off = 0, size_t n = 0) const {
    if (n == 0) n = x.size();
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += x[off + i] * x[off + i];
    const double r = 1.0 / std::sqrt(s / static_cast<double>(n) + hp_.rms_eps);
    std::vector<double> y(n);
    for (size_t i = 0; i < n; ++i) y[i] = x[off + i] * r * w[i];
    return y;
  }
  // RoPE written out from the table's definition: pair i turns by pos * inv_freq[i], scaled by mscale.
  static void rotate(double* v, const RopeTable& rt, int32_t pos) {
    const int64_t half = rt.n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos) * rt.inv_freq[static_cast<size_t>(i)];
      const double c = std::cos(a) * rt.mscale, s = std::sin(a) * rt.mscale;
      const int64_t i0 = rt.neox ? i : 2 * i, i1 = rt.neox ? i + half : 2 * i + 1;
      const double x0 = v[i0], x1 = v[i1];
      v[i0] = x0 * c - x1 * s;
      v[i1] = x0 * s + x1 * c;
    }
  }
  // rec: the residual entering each layer is stored there; first > 0 starts from a recording.
  double token_loss(int64_t i, int64_t first, std::vector<std::vector<double>>* rec) const {
    const KvCache& kv = ctx_.kv();
    const int64_t E = hp_.n_embd, H = hp_.n_head, d = hp_.head_dim, dv = hp_.head_dim_v, g = hp_.n_gqa();
    const int32_t tok = ctx_.tokens()[static_cast<size_t>(i)];
    const int32_t pos = kv.positions(0, 0)[i];
    std::vector<double> x(embd_.begin() + tok * E, embd_.begin() + (tok + 1) * E);
    if (first > 0) x = rec_[static_cast<size_t>(i - rec_start_)][static_cast<size_t>(first)];
    for (int64_t il = first; il < hp_.n_layer; ++il) {
      if (rec) rec->push_back(x);
      const LayerWeights& L = m_.layers()[static_cast<size_t>(il)];
      const auto h = rmsnorm(x, L.attn_norm);
      auto q = matvec(wq[static_cast<size_t>(il)], h, H * d);
      if (L.bq)
        for (int64_t c = 0; c < H * d; ++c) q[static_cast<size_t>(c)] += L.bq[c];
      if (L.q_norm)
        for (int64_t hh = 0; hh < H; ++hh) {
          const auto n = rmsnorm(q, L.q_norm, static_cast<size_t>(hh * d), static_cast<size_t>(d));
          std::copy(n.begin(), n.end(), q.begin() + hh * d);
        }
      const double qs = ctx_.rope_plan().q_scale(pos);
      for (double& v : q) v *= qs;
      std::vector<double> qw = q;  // the query at the fixed distance
      for (int64_t hh = 0; hh < H; ++hh) {
        rotate(q.data() + hh * d, kv.rope(il), pos);
        rotate(qw.data() + hh * d, kv.rope(il), static_cast<int32_t>(W_));
      }
      std::vector<double> o(static_cast<size_t>(H * dv), 0.0);
      const int64_t n_keys = i + 1;  // the cached tokens up to and including this one
      for (int64_t hk = 0; hk < hp_.n_head_kv; ++hk) {
        const std::vector<double>& K = k_[static_cast<size_t>(il * hp_.n_head_kv + hk)];
        const std::vector<double>& K0 = k0_[static_cast<size_t>(il * hp_.n_head_kv + hk)];
        const std::vector<double>& Vv = v_[static_cast<size_t>(il * hp_.n_head_kv + hk)];
        const int32_t* kpos = kv.positions(il, hk);
        for (int64_t hh = hk * g; hh < (hk + 1) * g; ++hh) {
          std::vector<double> sc(static_cast<size_t>(n_keys));
          double mx = -1e300;
          for (int64_t j = 0; j < n_keys; ++j) {
            const bool far = W_ > 0 && pos - kpos[j] > W_;
            const std::vector<double>& qq = far ? qw : q;
            const std::vector<double>& KK = far ? K0 : K;
            double a = 0;
            for (int64_t c = 0; c < d; ++c) a += qq[static_cast<size_t>(hh * d + c)] * KK[static_cast<size_t>(j * d + c)];
            sc[static_cast<size_t>(j)] = a / std::sqrt(static_cast<double>(d));
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          double z = 0;
          for (double& s : sc) z += (s = std::exp(s - mx));
          for (int64_t j = 0; j < n_keys; ++j)
            for (int64_t c = 0; c < dv; ++c)
              o[static_cast<size_t>(hh * dv + c)] += sc[static_cast<size_t>(j)] / z * Vv[static_cast<size_t>(j * dv + c)];
        }
      }
      const auto ao = matvec(wo_[static_cast<size_t>(il)], o, E);
      for (int64_t c = 0; c < E; ++c) x[static_cast<size_t>(c)] += ao[static_cast<size_t>(c)];
      const auto h2 = rmsnorm(x, L.ffn_norm);
      auto ga = matvec(wg_[static_cast<size_t>(il)], h2, hp_.n_ff);
      const auto up = matvec(wu_[static_cast<size_t>(il)], h2, hp_.n_ff);
      for (int64_t c = 0; c < hp_.n_ff; ++c) {
        const double gv = ga[static_cast<size_t>(c)];
        ga[static_cast<size_t>(c)] = gv / (1.0 + std::exp(-gv)) * up[static_cast<size_t>(c)];
      }
      const auto dn = matvec(wd_[static_cast<size_t>(il)], ga, E);
      for (int64_t c = 0; c < E; ++c) x[static_cast<size_t>(c)] += dn[static_cast<size_t>(c)];
    }
    const auto hf = rmsnorm(x, m_.output_norm());
    const auto lg = matvec(wout_, hf, hp_.n_vocab);
    const double mx = *std::max_element(lg.begin(), lg.end());
    double z = 0;
    for (double v : lg) z += std::exp(v - mx);
    const int32_t target = ctx_.tokens()[static_cast<size_t>(i + 1)];
    return mx + std::log(z) - lg[static_cast<size_t>(target)];
  }

  const Context& ctx_;
  const Model& m_;
  const HParams& hp_;
  std::vector<std::vector<double>> wo_, wg_, wu_, wd_;
  std::vector<double> wout_, embd_;
  const int64_t W_;
  std::vector<std::vector<double>> k_, v_;  // [n_layer * n_head_kv][n_tokens * head_dim(_v)], as cached
  std::vector<std::vector<double>> k0_;     // the keys rotated back to position 0
  int64_t rec_start_ = 0;
  std::vector<std::vector<std::vector<double>>> rec_;  // [S][n_layer][n_embd]
};

struct GradCase {
  const char* model;
  const char* rope;
  DType kv_type;
  int64_t fixed = 0;  // attention fixed:distance=W (0: dense)
};

class QtttGrad : public testing::TestWithParam<GradCase> {};

// (1) dL/dW_q of the trainer against central differences of the oracle's loss, several entries
// of every layer (random ones and the largest), at a span beyond the training window.
TEST_P(QtttGrad, WqGradientMatchesFiniteDifferences) {
  const GradCase gc = GetParam();
  auto model = load(gc.model);
  ASSERT_TRUE(model);
  CtxOpts o;
  o.rope = gc.rope;
  o.kv_type = gc.kv_type;
  if (gc.fixed > 0) o.attn = "fixed:distance=" + std::to_string(gc.fixed);
  auto ctx = make_ctx(*model, o);
  ASSERT_TRUE(ctx);
  const std::vector<int32_t> ids = prompt_ids();
  ASSERT_TRUE(ctx->decode(ids, Logits::kNone).is_ok());
  auto tr = QueryTrainer::create(*ctx);
  ASSERT_TRUE(tr.has_value()) << tr.error().message;
  const int64_t start = 170, S = 16;  // positions 170..185, past stories260K's n_ctx_train = 128
  auto l = (*tr)->loss(start, S, true);
  ASSERT_TRUE(l.has_value()) << l.error().message;

  Oracle oracle(*ctx, gc.fixed);
  const double l0 = oracle.loss(start, S);
  oracle.record(start, S);
  EXPECT_NEAR(*l, l0, 2e-5 * std::max(1.0, std::abs(l0))) << "trainer loss vs double oracle";

  const HParams& hp = model->hparams();
  const int64_t n = hp.n_head * hp.head_dim * hp.n_embd;
  std::mt19937 rng(7);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const float* gr = (*tr)->grad(il);
    double gmax = 0;
    std::vector<int64_t> idx;
    for (int64_t k = 0; k < n; ++k) gmax = std::max(gmax, std::abs(static_cast<double>(gr[k])));
    ASSERT_GT(gmax, 0.0) << "layer " << il << " got no gradient";
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) order[static_cast<size_t>(k)] = k;
    std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                      [&](int64_t a, int64_t b) { return std::abs(gr[a]) > std::abs(gr[b]); });
    idx.assign(order.begin(), order.begin() + 3);
    for (int k = 0; k < 4; ++k) idx.push_back(static_cast<int64_t>(rng() % static_cast<uint32_t>(n)));
    for (int64_t k : idx) {
      double& w = oracle.wq[static_cast<size_t>(il)][static_cast<size_t>(k)];
      const double w0 = w, h = 1e-4 * std::max(1.0, std::abs(w0));
      w = w0 + h;
      const double lp = oracle.loss_from(start, S, il);
      w = w0 - h;
      const double lm = oracle.loss_from(start, S, il);
      w = w0;
      const double fd = (lp - lm) / (2 * h);
      // Measured: |error| <= 1e-4 (|fd| + 0.01 max|g|) on every model here.
      EXPECT_NEAR(gr[k], fd, 1e-3 * (std::abs(fd) + 1e-2 * gmax))
          << gc.model << " layer " << il << " entry " << k << " (row " << k / hp.n_embd << ", col " << k % hp.n_embd
          << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, QtttGrad,
    testing::Values(GradCase{"stories260K", "", DType::F32}, GradCase{"stories260K", "logn", DType::F16},
                    GradCase{"llama_gqa_f32", "", DType::F16}, GradCase{"qwen2_bias_f32", "", DType::Q8_0},
                    GradCase{"qwen2_yarn_f32", "", DType::F32}, GradCase{"qwen3_qknorm_f32", "", DType::F32},
                    GradCase{"llama_quant_q8_0", "", DType::F32},
                    // The distance ceiling: spans at 170..185 see keys both near and far.
                    GradCase{"stories260K", "", DType::F32, 16}, GradCase{"stories260K", "logn", DType::F16, 48},
                    GradCase{"llama_gqa_f32", "", DType::F32, 24}),
    [](const testing::TestParamInfo<GradCase>& i) {
      std::string n = std::string(i.param.model) + (i.param.rope[0] ? "_logn" : "") + "_kv_" + dtype_name(i.param.kv_type);
      if (i.param.fixed > 0) n += "_fixed" + std::to_string(i.param.fixed);
      std::replace(n.begin(), n.end(), '.', '_');
      return n;
    });

// The training forward at the model's own W_q is the engine's forward: its loss is the
// cross-entropy of the logits decode() produces for the same tokens, with dense attention and
// with the distance ceiling of attention `fixed`.
class QtttForward : public testing::TestWithParam<const char*> {};

TEST_P(QtttForward, AtModelWeightsIsTheEnginesLoss) {
  auto model = load("stories260K");
  CtxOpts o;
  o.attn = GetParam();
  auto ctx = make_ctx(*model, o);
  const std::vector<int32_t> ids = prompt_ids();
  ASSERT_TRUE(ctx->decode(ids, Logits::kAll).is_ok());
  const int64_t start = 100, S = 40, V = model->hparams().n_vocab;
  double ref = 0;
  for (int64_t t = start; t < start + S - 1; ++t) {
    const float* lg = ctx->logits(t);
    const double mx = *std::max_element(lg, lg + V);
    double z = 0;
    for (int64_t c = 0; c < V; ++c) z += std::exp(lg[c] - mx);
    ref += mx + std::log(z) - lg[ids[static_cast<size_t>(t + 1)]];
  }
  ref /= static_cast<double>(S - 1);
  auto tr = QueryTrainer::create(*ctx);
  ASSERT_TRUE(tr.has_value());
  auto l = (*tr)->loss(start, S, false);
  ASSERT_TRUE(l.has_value());
  EXPECT_NEAR(*l, ref, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Attention, QtttForward, testing::Values("dense", "fixed:distance=16"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param).substr(0, std::string(i.param).find(':'));
                         });

// Everything the cache holds: every block's bytes, and each head's metadata.
struct KvSnapshot {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<std::vector<int32_t>> meta;
  std::vector<uint64_t> epochs;
  explicit KvSnapshot(const KvCache& kv) {
    const BlockPool& p = kv.pool();
    for (int32_t id = 0; id < p.n_ids(); ++id) {
      const uint8_t* b = p.data(id);
      blocks.emplace_back(b, b + p.block_bytes());
    }
    for (int64_t il = 0; il < kv.n_layer(); ++il)
      for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
        const int64_t n = kv.n_tokens(il, h);
        std::vector<int32_t> m = {static_cast<int32_t>(n), static_cast<int32_t>(kv.n_blocks(il, h)),
                                  static_cast<int32_t>(kv.n_appended(il))};
        m.insert(m.end(), kv.positions(il, h), kv.positions(il, h) + n);
        m.insert(m.end(), kv.seq_index(il, h), kv.seq_index(il, h) + n);
        m.insert(m.end(), kv.seq_ids(il, h), kv.seq_ids(il, h) + n);
        meta.push_back(std::move(m));
        epochs.push_back(kv.epoch(il, h));
      }
  }
  bool operator==(const KvSnapshot& o) const { return blocks == o.blocks && meta == o.meta && epochs == o.epochs; }
};

// (2) The cache is byte-identical before and after qTTT (f32, f16 and q8_0 storage).
TEST(Qttt, KvCacheIsUntouched) {
  struct Case {
    const char* model;
    DType t;
  };
  for (const Case& c : {Case{"stories260K", DType::F32}, Case{"stories260K", DType::F16},
                        Case{"qwen3_qknorm_f32", DType::Q8_0}}) {
    auto model = load(c.model);
    const DType t = c.t;
    CtxOpts o;
    o.kv_type = t;
    auto ctx = make_ctx(*model, o);
    const std::vector<int32_t> ids = prompt_ids();
    ASSERT_TRUE(ctx->decode(ids, Logits::kNone).is_ok());
    const KvSnapshot before(ctx->kv());
    QtttParams p;
    p.steps = 3, p.lr = 1e-2, p.span = 32;
    auto st = run_qttt(*ctx, p, 11);
    ASSERT_TRUE(st.has_value()) << st.error().message;
    EXPECT_TRUE(ctx->has_query_weights());
    EXPECT_TRUE(before == KvSnapshot(ctx->kv())) << dtype_name(t);
    ctx->clear_query_weights();
    EXPECT_TRUE(before == KvSnapshot(ctx->kv())) << dtype_name(t);
    EXPECT_EQ(ctx->n_past(), static_cast<int64_t>(ids.size()));
  }
}

std::vector<float> next_logits(Context& ctx, int32_t tok) {
  EXPECT_TRUE(ctx.decode(std::span<const int32_t>(&tok, 1), Logits::kLast).is_ok());
  const int64_t V = ctx.model().hparams().n_vocab;
  return std::vector<float>(ctx.logits(0), ctx.logits(0) + V);
}

// (3) After restore, the logits of a next token are those of a context that never ran qTTT,
// bit for bit; with the trained W_q installed they differ.
TEST(Qttt, RestoreGivesBitIdenticalLogits) {
  auto model = load("stories260K");
  const std::vector<int32_t> ids = prompt_ids();
  const int32_t next = 42;
  auto ref_ctx = make_ctx(*model);
  ASSERT_TRUE(ref_ctx->decode(ids, Logits::kNone).is_ok());
  const std::vector<float> ref = next_logits(*ref_ctx, next);

  auto ctx = make_ctx(*model);
  ASSERT_TRUE(ctx->decode(ids, Logits::kNone).is_ok());
  QtttParams p;
  p.steps = 4, p.lr = 1e-2, p.span = 48;
  auto st = run_qttt(*ctx, p, 3);
  ASSERT_TRUE(st.has_value()) << st.error().message;
  const std::vector<float> trained = next_logits(*ctx, next);
  EXPECT_NE(std::memcmp(trained.data(), ref.data(), ref.size() * sizeof(float)), 0) << "qTTT changed nothing";
  ctx->truncate(static_cast<int64_t>(ids.size()));
  ctx->clear_query_weights();
  const std::vector<float> restored = next_logits(*ctx, next);
  EXPECT_EQ(std::memcmp(restored.data(), ref.data(), ref.size() * sizeof(float)), 0);
}

// (4) steps=0 is the identity: nothing installed, the same logits; and installing the
// untrained W_q (the hook alone) changes no bit on an f32 model.
TEST(Qttt, ZeroStepsIsTheIdentity) {
  auto model = load("stories260K");
  const std::vector<int32_t> ids = prompt_ids();
  auto ref_ctx = make_ctx(*model);
  ASSERT_TRUE(ref_ctx->decode(ids, Logits::kNone).is_ok());
  const std::vector<float> ref = next_logits(*ref_ctx, 7);

  auto ctx = make_ctx(*model);
  ASSERT_TRUE(ctx->decode(ids, Logits::kNone).is_ok());
  auto p = parse_qttt("steps=0,lr=0.1,span=16");
  ASSERT_TRUE(p.has_value());
  auto st = run_qttt(*ctx, *p, 1);
  ASSERT_TRUE(st.has_value());
  EXPECT_FALSE(ctx->has_query_weights());
  EXPECT_EQ(st->step_loss.size(), 0u);
  EXPECT_EQ(std::memcmp(next_logits(*ctx, 7).data(), ref.data(), ref.size() * sizeof(float)), 0);

  ctx->truncate(static_cast<int64_t>(ids.size()));
  auto tr = QueryTrainer::create(*ctx);
  ASSERT_TRUE(tr.has_value());
  (*tr)->install();
  EXPECT_TRUE(ctx->has_query_weights());
  EXPECT_EQ(std::memcmp(next_logits(*ctx, 7).data(), ref.data(), ref.size() * sizeof(float)), 0);
}

// (5) The loss on the sampled spans falls over a few steps (fixed seed).
TEST(Qttt, LossFallsOnTheSampledSpans) {
  auto model = load("stories260K");
  auto ctx = make_ctx(*model);
  const std::vector<int32_t> ids = prompt_ids();
  ASSERT_TRUE(ctx->decode(ids, Logits::kNone).is_ok());
  auto tr = QueryTrainer::create(*ctx);
  ASSERT_TRUE(tr.has_value());
  std::mt19937_64 rng(5);
  const int64_t S = 48;
  std::vector<int64_t> starts;
  for (int i = 0; i < 6; ++i) starts.push_back(static_cast<int64_t>(rng() % (ids.size() - S + 1)));
  auto mean_loss = [&] {
    double s = 0;
    for (int64_t st : starts) s += *(*tr)->loss(st, S, false);
    return s / static_cast<double>(starts.size());
  };
  const double before = mean_loss();
  for (int64_t st : starts) {
    ASSERT_TRUE((*tr)->loss(st, S, true).has_value());
    (*tr)->adam_step(1e-2);
  }
  const double after = mean_loss();
  EXPECT_LT(after, before - 0.01) << before << " -> " << after;

  QtttParams p;
  p.steps = 6, p.lr = 1e-2, p.span = S;
  auto st = run_qttt(*ctx, p, 5);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step_loss.size(), 6u);
  EXPECT_LT(st->loss_after, st->loss_before);
  EXPECT_GT(st->tokens_per_second(), 0.0);
  EXPECT_GT(st->extra_bytes, 0u);
  // The same seed draws the same spans and gives the same losses.
  ctx->clear_query_weights();
  auto st2 = run_qttt(*ctx, p, 5);
  ASSERT_TRUE(st2.has_value());
  EXPECT_EQ(st->starts, st2->starts);
  EXPECT_EQ(st->step_loss, st2->step_loss);
}

// (6) Spec parsing and the combinations qTTT refuses.
TEST(Qttt, SpecErrorsNameTheFlagAndValue) {
  auto ok = parse_qttt("steps=3,lr=0.05,span=64");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->steps, 3);
  EXPECT_DOUBLE_EQ(ok->lr, 0.05);
  EXPECT_EQ(ok->span, 64);
  EXPECT_EQ(parse_qttt(ok->spec())->span, 64);
  auto partial = parse_qttt("steps=2");
  ASSERT_TRUE(partial.has_value());
  EXPECT_EQ(partial->span, QtttParams{}.span);
  EXPECT_FALSE(parse_qttt("none")->enabled());
  EXPECT_FALSE(parse_qttt("")->enabled());
  struct Bad {
    const char* spec;
    const char* says;
  };
  for (const Bad& b : {Bad{"steps=-1", "steps=-1"}, Bad{"lr=0", "lr=0 must be > 0"}, Bad{"lr=-0.1", "lr=-0.1"},
                       Bad{"span=1", "span=1 must be at least 2"}, Bad{"steps=x", "'x'"}, Bad{"lr=abc", "'abc'"},
                       Bad{"foo=1", "unknown key 'foo'"}, Bad{"steps", "not key=value"},
                       Bad{"steps=1,steps=2", "given twice"}, Bad{"steps=2,,span=4", "not key=value"}}) {
    auto r = parse_qttt(b.spec);
    ASSERT_FALSE(r.has_value()) << b.spec;
    EXPECT_NE(r.error().message.find("--qttt"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(b.says), std::string::npos) << r.error().message;
  }

  auto model = load("stories260K");
  const std::vector<int32_t> ids = prompt_ids();
  auto ctx = make_ctx(*model);
  ASSERT_TRUE(ctx->decode(std::span<const int32_t>(ids.data(), 20), Logits::kNone).is_ok());
  QtttParams p;
  p.steps = 1, p.span = 21;
  auto r = run_qttt(*ctx, p, 1);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("--qttt span=21 is longer than the context (20 tokens)"), std::string::npos)
      << r.error().message;

  CtxOpts press;
  press.press = "snapkv:ratio=0.5";
  auto pc = make_ctx(*model, press);
  ASSERT_TRUE(pc);
  Status s = check_qttt_context(*pc);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("--kv-press"), std::string::npos) << s.message();
  CtxOpts sparse;
  sparse.attn = "streaming:sinks=4,window=64";
  auto sc = make_ctx(*model, sparse);
  ASSERT_TRUE(sc);
  s = check_qttt_context(*sc);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("--attn"), std::string::npos) << s.message();
  CtxOpts naive;
  naive.attn = "naive";
  EXPECT_TRUE(check_qttt_context(*make_ctx(*model, naive)).is_ok());
}

}  // namespace
}  // namespace lc
