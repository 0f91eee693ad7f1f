// matmul against the scalar reference: every weight type, odd shapes, several token counts
// and thread counts; both float GEMM back ends.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/fp16.h"

#include "kernels/kernels.h"
#include "kernels/matmul_config.h"
#include "kernels/ref/ref.h"
#include "test_util.h"

namespace lc::kernels {
namespace {

struct Case {
  int64_t n_in, n_out, n_tokens;
};

struct Weights {
  std::vector<uint8_t> data;
  TensorView view;
};

Weights make_weights(std::mt19937& rng, DType t, int64_t n_in, int64_t n_out) {
  Weights w;
  for (int64_t o = 0; o < n_out; ++o) {
    auto row = test::random_row(rng, t, n_in);
    w.data.insert(w.data.end(), row.begin(), row.end());
  }
  w.view.data = w.data.data();
  w.view.type = t;
  w.view.ne[0] = n_in;
  w.view.ne[1] = n_out;
  return w;
}

int64_t block_of(DType t) { return traits(t).block_size == 1 ? 1 : traits(t).block_size; }

// Checks y against the reference: within 1e-5 of sum |w_i * xq_i| (the integer path is exact up
// to float rounding of block partial sums), and against the unquantised product within the
// Q8 rounding of the activations: sum |w_i| * (block amax / 254) (+ f16 rounding of d).
void check(DType t, const Case& c, ThreadPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto w = make_weights(rng, t, c.n_in, c.n_out);
  auto x = test::random_floats(rng, c.n_in * c.n_tokens, -2, 2);
  std::vector<float> y(static_cast<size_t>(c.n_out * c.n_tokens), NAN);
  matmul(w.view, x.data(), c.n_tokens, y.data(), pool);

  std::vector<float> wr(static_cast<size_t>(c.n_in)), xq(static_cast<size_t>(c.n_in));
  const DType at = ref::activation_type(t);
  const int64_t ab = at == DType::Q8_K ? 256 : 32;
  for (int64_t tk = 0; tk < c.n_tokens; ++tk) {
    const float* xt = x.data() + tk * c.n_in;
    ref::quantized_activations(t, xt, xq.data(), c.n_in);
    for (int64_t o = 0; o < c.n_out; ++o) {
      ref::dequantize_row(t, w.view.row(o), wr.data(), c.n_in);
      double want = 0, mag = 0, exact = 0, qerr = 0;
      for (int64_t i = 0; i < c.n_in; ++i) {
        want += static_cast<double>(wr[i]) * xq[i];
        mag += std::fabs(static_cast<double>(wr[i]) * xq[i]);
        exact += static_cast<double>(wr[i]) * xt[i];
      }
      if (at != DType::F32) {
        for (int64_t b0 = 0; b0 < c.n_in; b0 += ab) {
          float amax = 0;
          for (int64_t i = b0; i < b0 + ab; ++i) amax = std::max(amax, std::fabs(xt[i]));
          for (int64_t i = b0; i < b0 + ab; ++i) qerr += std::fabs(wr[i]) * (amax / 254.0 + amax * 1e-3);
        }
      }
      const float got = y[static_cast<size_t>(tk * c.n_out + o)];
      ASSERT_NEAR(got, want, 1e-5 * mag + 1e-30)
          << dtype_name(t) << " n_in=" << c.n_in << " n_out=" << c.n_out << " tok=" << tk << "/" << c.n_tokens
          << " row=" << o << " threads=" << pool.size();
      ASSERT_NEAR(got, exact, qerr + 1e-5 * mag + 1e-30) << dtype_name(t) << " (vs unquantised x)";
    }
  }
}

const Case kCases[] = {
    {32, 1, 1},   {64, 3, 2},    {96, 17, 3},  {256, 67, 5},  {512, 17, 16}, {768, 5, 33},
    {4096 + 256, 3, 2}, {256, 9, 1}, {512, 67, 1}, {768, 4, 4},   {256, 8, 9},   {1536, 13, 7},
};

class MatmulTypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTypes, MatchesReferenceOneThread) {
  const DType t = GetParam();
  ThreadPool pool(1);
  uint32_t seed = 10;
  for (const auto& c : kCases)
    if (c.n_in % block_of(t) == 0) check(t, c, pool, seed++);
}

TEST_P(MatmulTypes, MatchesReferenceThreeThreads) {
  const DType t = GetParam();
  ThreadPool pool(3);
  uint32_t seed = 100;
  for (const auto& c : kCases)
    if (c.n_in % block_of(t) == 0) check(t, c, pool, seed++);
}

// Quantised weights: a token's result does not depend on the batch it came in or on threads.
TEST_P(MatmulTypes, BatchAndThreadInvariant) {
  const DType t = GetParam();
  if (!traits(t).quantized) GTEST_SKIP() << "float GEMM may use another summation order";
  std::mt19937 rng(7);
  const int64_t n_in = 512, n_out = 37, nt = 11;
  const auto w = make_weights(rng, t, n_in, n_out);
  auto x = test::random_floats(rng, n_in * nt);
  ThreadPool p1(1), p2(2);
  std::vector<float> batch(static_cast<size_t>(n_out * nt)), batch2(batch.size()), single(batch.size());
  matmul(w.view, x.data(), nt, batch.data(), p1);
  matmul(w.view, x.data(), nt, batch2.data(), p2);
  for (int64_t tk = 0; tk < nt; ++tk) matmul(w.view, x.data() + tk * n_in, 1, single.data() + tk * n_out, p2);
  EXPECT_EQ(batch, single);
  EXPECT_EQ(batch, batch2);
}

// matmul_multi over three matrices against one matmul call per matrix: bit-identical.
void expect_multi_equals_single(const Weights (&w)[3], const std::vector<float>& x, int64_t nt, ThreadPool& pool,
                                const std::string& what) {
  std::vector<float> one[3], multi[3];
  const TensorView* ws[3];
  float* ys[3];
  for (int i = 0; i < 3; ++i) {
    one[i].assign(static_cast<size_t>(w[i].view.n_rows() * nt), NAN);
    multi[i].assign(one[i].size(), NAN);
    matmul(w[i].view, x.data(), nt, one[i].data(), pool);
    ws[i] = &w[i].view;
    ys[i] = multi[i].data();
  }
  matmul_multi(ws, ys, x.data(), nt, pool);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(one[i], multi[i]) << what << " matrix " << i << " nt=" << nt;
}

// matmul_multi (Q/K/V, gate/up in one loop) gives every matrix exactly what matmul gives it,
// whatever the thread count cuts across matrix boundaries.
TEST_P(MatmulTypes, MultiEqualsOneCallPerMatrix) {
  const DType t = GetParam();
  const int64_t n_in = 512;
  std::mt19937 rng(11);
  Weights w[3] = {make_weights(rng, t, n_in, 67), make_weights(rng, t, n_in, 13), make_weights(rng, t, n_in, 5)};
  for (int64_t nt : {1, 5}) {  // below the token count at which float weights go to sgemm
    auto x = test::random_floats(rng, n_in * nt);
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      expect_multi_equals_single(w, x, nt, pool, std::string(dtype_name(t)) + " threads=" + std::to_string(threads));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTypes, ::testing::ValuesIn(test::kAllWeightTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Matmul, FloatBackEndsAgree) {
  for (FloatGemm g : {FloatGemm::kOwn, FloatGemm::kBlas}) {
    set_float_gemm(g);
    ThreadPool pool(2);
    uint32_t seed = 500;
    for (DType t : {DType::F32, DType::F16, DType::BF16})
      for (const Case& c : {Case{576, 67, 16}, Case{100, 35, 33}, Case{33, 200, 9}, Case{1536, 130, 12}})
        check(t, c, pool, seed++);
  }
  set_float_gemm(FloatGemm::kAuto);
}

// Matrices of different types (a float Q view next to quantised K and V, as qTTT makes them)
// each get their own activations.
TEST(Matmul, MultiWithMixedTypes) {
  std::mt19937 rng(12);
  const int64_t n_in = 256, nt = 3;
  Weights w[3] = {make_weights(rng, DType::F32, n_in, 9), make_weights(rng, DType::Q8_0, n_in, 7),
                  make_weights(rng, DType::Q4_K, n_in, 4)};
  auto x = test::random_floats(rng, n_in * nt);
  ThreadPool pool(2);
  expect_multi_equals_single(w, x, nt, pool, "mixed");
}

TEST(Matmul, SupportsAndRejects) {
  for (DType t : test::kAllWeightTypes) EXPECT_TRUE(matmul_supports(t)) << dtype_name(t);
  EXPECT_FALSE(matmul_supports(DType::Q8_K));
  EXPECT_FALSE(matmul_supports(DType::I32));
}

// ---------------------------------------------------------------------------------------------
// Row-interleaved (packed) Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16 and BF16.

bool is_k(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }
// Packed BF16 multiplied by bf16-rounded activations with vdpbf16ps (AVX512-BF16 builds).
bool bf16_pairs(DType t) { return t == DType::BF16 && bf16_dot_products(); }

// x rounded to bf16 and back: what the bf16 dot products multiply.
std::vector<float> bf16_rounded(const float* x, int64_t n) {
  std::vector<float> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = bf16_to_fp32(fp32_to_bf16(x[i]));
  return r;
}

// Packed F16 / BF16: one FMA chain per row and token over the columns in order, from 0.
float scalar_order_half(DType t, const uint8_t* row, const float* x, int64_t n_in) {
  const auto* w = reinterpret_cast<const uint16_t*>(row);
  float acc = 0;
  for (int64_t k = 0; k < n_in; ++k)
    acc = std::fma(t == DType::F16 ? fp16_to_fp32(w[k]) : bf16_to_fp32(w[k]), x[k], acc);
  return acc;
}

struct Packed {
  Weights w;
  Buffer<uint8_t> pk;
};

Packed make_packed(std::mt19937& rng, DType t, int64_t n_in, int64_t n_out) {
  Packed p;
  p.w = make_weights(rng, t, n_in, n_out);
  const size_t n = packed_bytes(p.w.view);
  // Each group-block holds as many bytes as the rows' blocks in the file (34 per row for Q8_0,
  // 18 for Q4_0, 210 for Q6_K), Q4_K / Q5_K 4 more (scales and mins as bytes).
  const size_t per_row = traits(t).block_bytes + (t == DType::Q4_K || t == DType::Q5_K ? 4 : 0);
  // F16 / BF16 groups are one cache line (64 bytes) further apart.
  const size_t pad = t == DType::F16 || t == DType::BF16 ? 64 : 0;
  if (bf16_pairs(t)) {  // whole groups, the last one padded with zero rows; rows padded to even widths
    EXPECT_EQ(n, static_cast<size_t>((n_out + kPackRows - 1) / kPackRows) *
                     (static_cast<size_t>((n_in + 1) / 2 * 2 * kPackRows) * 2 + pad));
  } else {
    EXPECT_EQ(n, static_cast<size_t>(n_out / kPackRows) *
                     (static_cast<size_t>(n_in / traits(t).block_size * kPackRows) * per_row + pad));
  }
  if (n > 0) {
    p.pk.resize(n);
    pack_matrix(p.w.view, p.pk.data());
    p.w.view.packed = p.pk.data();
  }
  return p;
}

// ggml's scalar order, from the block definitions: per row and block, the exact integer dot of
// the weight codes (minus the symmetric types' offset: 8 for Q4_0, 16 for Q5_0) with the Q8_0
// activation codes, converted to float, times d_w * d_x, added with one FMA; Q4_1 / Q5_1 then
// add m * (d_x * the sum of the activation codes) with a second FMA; blocks in order.
float scalar_order(DType t, const uint8_t* row, const BlockQ8_0* xb, int64_t n_in) {
  float acc = 0;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    int q[32];
    int off = 0;
    float dw = 0, mw = 0;
    bool has_min = false;
    // Separate loops for the low and high nibbles: GCC 12 at -O2 -march=native (AVX-512)
    // miscompiles the one-loop form `i < 16 ? qs[i] & 15 : qs[i - 16] >> 4` (wrong sums).
    auto nibbles = [&](const uint8_t* qs) {
      for (int i = 0; i < 16; ++i) q[i] = qs[i] & 15;
      for (int i = 0; i < 16; ++i) q[16 + i] = qs[i] >> 4;
    };
    auto fifth = [&](const uint8_t* qh) {
      uint32_t h;
      std::memcpy(&h, qh, 4);
      for (int i = 0; i < 32; ++i) q[i] |= static_cast<int>((h >> i) & 1u) << 4;
    };
    if (t == DType::Q8_0) {
      const auto& w = reinterpret_cast<const BlockQ8_0*>(row)[b];
      for (int i = 0; i < 32; ++i) q[i] = w.qs[i];
      dw = fp16_to_fp32(w.d);
    } else if (t == DType::Q4_0) {
      const auto& w = reinterpret_cast<const BlockQ4_0*>(row)[b];
      nibbles(w.qs);
      off = 8, dw = fp16_to_fp32(w.d);
    } else if (t == DType::Q4_1) {
      const auto& w = reinterpret_cast<const BlockQ4_1*>(row)[b];
      nibbles(w.qs);
      dw = fp16_to_fp32(w.d), mw = fp16_to_fp32(w.m), has_min = true;
    } else if (t == DType::Q5_0) {
      const auto& w = reinterpret_cast<const BlockQ5_0*>(row)[b];
      nibbles(w.qs);
      fifth(w.qh);
      off = 16, dw = fp16_to_fp32(w.d);
    } else {
      const auto& w = reinterpret_cast<const BlockQ5_1*>(row)[b];
      nibbles(w.qs);
      fifth(w.qh);
      dw = fp16_to_fp32(w.d), mw = fp16_to_fp32(w.m), has_min = true;
    }
    int32_t s = 0, sx = 0;
    for (int i = 0; i < 32; ++i) s += (q[i] - off) * xb[b].qs[i], sx += xb[b].qs[i];
    const float dx = fp16_to_fp32(xb[b].d);
    acc = std::fma(static_cast<float>(s), dw * dx, acc);
    if (has_min) acc = std::fma(mw, dx * static_cast<float>(sx), acc);
  }
  return acc;
}

// The k-quants' scalar order, from the block definitions (quant_blocks.h): per row and
// superblock, the exact integer sum over groups of scale_g * dot(codes - offset, x codes) (offset
// 32 for Q6_K), converted to float, times d * d_x with one FMA; Q4_K / Q5_K then subtract
// (sum_g min_g * sum of group g's x codes) * (dmin * d_x) with a second; superblocks in order.
float scalar_order_k(DType t, const uint8_t* row, const BlockQ8_K* xb, int64_t n_in) {
  float acc = 0;
  for (int64_t b = 0; b < n_in / 256; ++b) {
    const BlockQ8_K& x = xb[b];
    int q[256], sc[16], mn[8];
    int group = 32, off = 0;
    float d = 0, dmin = 0;
    if (t == DType::Q6_K) {
      const auto& w = reinterpret_cast<const BlockQ6_K*>(row)[b];
      for (int h = 0; h < 2; ++h) {
        const uint8_t* L = w.ql + 64 * h;
        const uint8_t* H = w.qh + 32 * h;
        for (int l = 0; l < 32; ++l) q[128 * h + l] = (L[l] & 15) | (H[l] & 3) << 4;
        for (int l = 0; l < 32; ++l) q[128 * h + 32 + l] = (L[l + 32] & 15) | (H[l] >> 2 & 3) << 4;
        for (int l = 0; l < 32; ++l) q[128 * h + 64 + l] = (L[l] >> 4) | (H[l] >> 4 & 3) << 4;
        for (int l = 0; l < 32; ++l) q[128 * h + 96 + l] = (L[l + 32] >> 4) | (H[l] >> 6 & 3) << 4;
      }
      for (int g = 0; g < 16; ++g) sc[g] = w.scales[g];
      group = 16, off = 32, d = fp16_to_fp32(w.d);
    } else {
      const bool five = t == DType::Q5_K;
      const uint8_t* qs = five ? reinterpret_cast<const BlockQ5_K*>(row)[b].qs : reinterpret_cast<const BlockQ4_K*>(row)[b].qs;
      const uint8_t* scales = five ? reinterpret_cast<const BlockQ5_K*>(row)[b].scales : reinterpret_cast<const BlockQ4_K*>(row)[b].scales;
      const uint16_t dd = five ? reinterpret_cast<const BlockQ5_K*>(row)[b].d : reinterpret_cast<const BlockQ4_K*>(row)[b].d;
      const uint16_t dm = five ? reinterpret_cast<const BlockQ5_K*>(row)[b].dmin : reinterpret_cast<const BlockQ4_K*>(row)[b].dmin;
      for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 32; ++l) q[64 * c + l] = qs[32 * c + l] & 15;
        for (int l = 0; l < 32; ++l) q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
      }
      if (five) {
        const uint8_t* qh = reinterpret_cast<const BlockQ5_K*>(row)[b].qh;
        for (int c = 0; c < 4; ++c)
          for (int l = 0; l < 32; ++l) {
            q[64 * c + l] |= (qh[l] >> (2 * c) & 1) << 4;
            q[64 * c + 32 + l] |= (qh[l] >> (2 * c + 1) & 1) << 4;
          }
      }
      for (int g = 0; g < 8; ++g) k4_scale_min(scales, g, sc[g], mn[g]);
      d = fp16_to_fp32(dd), dmin = fp16_to_fp32(dm);
    }
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 256 / group; ++g) {
      int32_t dot = 0;
      for (int i = 0; i < group; ++i) dot += (q[group * g + i] - off) * x.qs[group * g + i];
      isum += sc[g] * dot;
      if (t != DType::Q6_K) msum += mn[g] * (x.bsums[2 * g] + x.bsums[2 * g + 1]);
    }
    acc = std::fma(static_cast<float>(isum), d * x.d, acc);
    if (t != DType::Q6_K) acc = std::fma(-static_cast<float>(msum), dmin * x.d, acc);
  }
  return acc;
}

class MatmulPacked : public ::testing::TestWithParam<DType> {};

// Every output of a packed matrix, in whole groups and in the rows after them, for token counts
// around the tile widths and the 64-token panel, on 1-3 threads: the scalar order's bits.
TEST_P(MatmulPacked, EqualsScalarOrderBitForBit) {
  const DType t = GetParam();
  uint32_t seed = 900;
  // Row counts of whole groups and with rows after them (kPackRows is 16 with AVX512-VNNI, else 8).
  const std::vector<Case> cases32 = {Case{32, 16, 1},  Case{576, 67, 1},  Case{576, 32, 9}, Case{96, 29, 70},
                                     Case{1536, 23, 3}, Case{256, 40, 8}, Case{64, 24, 65}};
  const std::vector<Case> cases256 = {Case{256, 16, 1},  Case{512, 67, 1},  Case{768, 32, 9}, Case{256, 29, 70},
                                      Case{1536, 23, 3}, Case{256, 40, 8}, Case{512, 24, 65}};
  for (const Case& c : is_k(t) ? cases256 : cases32) {
    std::mt19937 rng(seed++);
    const Packed p = make_packed(rng, t, c.n_in, c.n_out);
    const auto x = test::random_floats(rng, c.n_in * c.n_tokens, -2, 2);
    if (bf16_pairs(t)) {
      // The lane arithmetic of vdpbf16ps (how the pair's products are rounded into the sum) is
      // the processor's: MatchesReference bounds its error, and here every split of the work
      // must give each output the same bits as one token at a time on one thread.
      ThreadPool one(1);
      std::vector<float> want(static_cast<size_t>(c.n_out * c.n_tokens), NAN);
      for (int64_t tk = 0; tk < c.n_tokens; ++tk)
        matmul(p.w.view, x.data() + tk * c.n_in, 1, want.data() + tk * c.n_out, one);
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y(want.size(), NAN);
        matmul(p.w.view, x.data(), c.n_tokens, y.data(), pool);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_EQ(y[i], want[i]) << "bf16 pairs n_in=" << c.n_in << " n_out=" << c.n_out << " nt=" << c.n_tokens
                                   << " out=" << i << " threads=" << threads;
      }
      continue;
    }
    std::vector<BlockQ8_0> xb(static_cast<size_t>(c.n_in / 32));
    std::vector<BlockQ8_K> xk(static_cast<size_t>(c.n_in / 256));
    std::vector<float> want(static_cast<size_t>(c.n_out * c.n_tokens));
    for (int64_t tk = 0; tk < c.n_tokens; ++tk) {
      if (is_k(t)) ref::quantize_row_q8_k(x.data() + tk * c.n_in, xk.data(), c.n_in);
      else ref::quantize_row_q8_0(x.data() + tk * c.n_in, xb.data(), c.n_in);
      for (int64_t o = 0; o < c.n_out; ++o)
        want[static_cast<size_t>(tk * c.n_out + o)] =
            is_half(t) ? scalar_order_half(t, p.w.view.row(o), x.data() + tk * c.n_in, c.n_in)
            : is_k(t)  ? scalar_order_k(t, p.w.view.row(o), xk.data(), c.n_in)
                       : scalar_order(t, p.w.view.row(o), xb.data(), c.n_in);
    }
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y(want.size(), NAN);
      matmul(p.w.view, x.data(), c.n_tokens, y.data(), pool);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(y[i], want[i]) << dtype_name(t) << " n_in=" << c.n_in << " n_out=" << c.n_out << " nt=" << c.n_tokens
                                 << " out=" << i << " threads=" << threads;
    }
  }
}

// The packed path against the double-precision reference, as every type is checked.
TEST_P(MatmulPacked, MatchesReference) {
  const DType t = GetParam();
  std::mt19937 rng(77);
  std::vector<Case> cases = {Case{512, 67, 5}, Case{is_k(t) ? 768 : 576, 16, 1}, Case{1536, 13, 7}};
  if (is_half(t)) cases.push_back(Case{101, 21, 3});  // an odd width (bf16 pairs end in a zero)
  for (const Case& c : cases) {
    const Packed p = make_packed(rng, t, c.n_in, c.n_out);
    const auto x = test::random_floats(rng, c.n_in * c.n_tokens, -2, 2);
    std::vector<float> y(static_cast<size_t>(c.n_out * c.n_tokens));
    ThreadPool pool(2);
    matmul(p.w.view, x.data(), c.n_tokens, y.data(), pool);
    std::vector<float> wr(static_cast<size_t>(c.n_in)), xq(static_cast<size_t>(c.n_in));
    for (int64_t tk = 0; tk < c.n_tokens; ++tk) {
      ref::quantized_activations(t, x.data() + tk * c.n_in, xq.data(), c.n_in);
      if (bf16_pairs(t)) xq = bf16_rounded(x.data() + tk * c.n_in, c.n_in);
      for (int64_t o = 0; o < c.n_out; ++o) {
        ref::dequantize_row(t, p.w.view.row(o), wr.data(), c.n_in);
        double want = 0, mag = 0;
        for (int64_t i = 0; i < c.n_in; ++i) {
          want += static_cast<double>(wr[i]) * xq[i];
          mag += std::fabs(static_cast<double>(wr[i]) * xq[i]);
        }
        ASSERT_NEAR(y[static_cast<size_t>(tk * c.n_out + o)], want, 1e-5 * mag + 1e-30) << dtype_name(t) << " " << o;
      }
    }
  }
}

// Q/K/V in one loop with packed matrices (row counts that are and are not multiples of 8):
// each matrix gets what its own call gives it, however the threads cut the joint rows.
TEST_P(MatmulPacked, MultiEqualsOneCallPerMatrix) {
  const DType t = GetParam();
  std::mt19937 rng(31);
  const int64_t n_in = is_k(t) ? 512 : 576;
  // 40: with 3 threads a range starts inside the second matrix, 29 rows in (mid-group).
  Packed p[3] = {make_packed(rng, t, n_in, 67), make_packed(rng, t, n_in, 40), make_packed(rng, t, n_in, 24)};
  const Weights w[3] = {p[0].w, p[1].w, p[2].w};
  for (int64_t nt : {1, 6}) {
    const auto x = test::random_floats(rng, n_in * nt);
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      expect_multi_equals_single(w, x, nt, pool, std::string(dtype_name(t)) + " packed threads=" + std::to_string(threads));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PackableTypes, MatmulPacked,
                         ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(MatmulPacked, ThePackableTypes) {
  for (DType t : test::kAllWeightTypes) {
    EXPECT_EQ(can_pack(t), t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 ||
                               t == DType::Q5_1 || is_k(t) || is_half(t))
        << dtype_name(t);
    std::mt19937 rng(1);
    const Weights w = make_weights(rng, t, 256, 16);
    EXPECT_EQ(packed_bytes(w.view) > 0, can_pack(t)) << dtype_name(t);
  }
  std::mt19937 rng(2);
  EXPECT_EQ(packed_bytes(make_weights(rng, DType::Q8_0, 256, 7).view), 0u);  // no whole group
}

}  // namespace
}  // namespace lc::kernels
