#include "kernels/ref/ref.h"

#include <cmath>
#include <limits>
#include <cstring>

#include "core/fp16.h"
#include "core/status.h"

namespace lc::kernels::ref {

namespace {

template <class B>
const B& block_of(const void* row, int64_t i, int64_t qk) {
  return static_cast<const B*>(row)[i / qk];
}

float h(uint16_t v) { return fp16_to_fp32_ref(v); }

}  // namespace

float element(DType t, const void* row, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(row)[i];
    case DType::F16:
      return h(static_cast<const uint16_t*>(row)[i]);
    case DType::BF16:
      return fp32_from_bits(static_cast<uint32_t>(static_cast<const uint16_t*>(row)[i]) << 16);
    case DType::Q4_0: {
      const auto& b = block_of<BlockQ4_0>(row, i, 32);
      const int j = static_cast<int>(i % 32);
      const int q = j < 16 ? (b.qs[j] & 15) : (b.qs[j - 16] >> 4);
      return static_cast<float>(q - 8) * h(b.d);
    }
    case DType::Q4_1: {
      const auto& b = block_of<BlockQ4_1>(row, i, 32);
      const int j = static_cast<int>(i % 32);
      const int q = j < 16 ? (b.qs[j] & 15) : (b.qs[j - 16] >> 4);
      return static_cast<float>(q) * h(b.d) + h(b.m);
    }
    case DType::Q5_0: {
      const auto& b = block_of<BlockQ5_0>(row, i, 32);
      const int j = static_cast<int>(i % 32);
      uint32_t qh;
      std::memcpy(&qh, b.qh, 4);
      const int q = (j < 16 ? (b.qs[j] & 15) : (b.qs[j - 16] >> 4)) | ((qh >> j) & 1) << 4;
      return static_cast<float>(q - 16) * h(b.d);
    }
    case DType::Q5_1: {
      const auto& b = block_of<BlockQ5_1>(row, i, 32);
      const int j = static_cast<int>(i % 32);
      uint32_t qh;
      std::memcpy(&qh, b.qh, 4);
      const int q = (j < 16 ? (b.qs[j] & 15) : (b.qs[j - 16] >> 4)) | ((qh >> j) & 1) << 4;
      return static_cast<float>(q) * h(b.d) + h(b.m);
    }
    case DType::Q8_0: {
      const auto& b = block_of<BlockQ8_0>(row, i, 32);
      return static_cast<float>(b.qs[i % 32]) * h(b.d);
    }
    case DType::Q8_1: {
      const auto& b = block_of<BlockQ8_1>(row, i, 32);
      return static_cast<float>(b.qs[i % 32]) * h(b.d);
    }
    case DType::Q8_K: {
      const auto& b = block_of<BlockQ8_K>(row, i, 256);
      return static_cast<float>(b.qs[i % 256]) * b.d;
    }
    case DType::Q2_K: {
      const auto& b = block_of<BlockQ2_K>(row, i, 256);
      const int j = static_cast<int>(i % 256), g = j / 16;
      const int half = j / 128, k = (j % 128) / 32, l = j % 32;
      const int q = (b.qs[32 * half + l] >> (2 * k)) & 3;
      return h(b.d) * static_cast<float>(b.scales[g] & 15) * static_cast<float>(q) -
             h(b.dmin) * static_cast<float>(b.scales[g] >> 4);
    }
    case DType::Q3_K: {
      const auto& b = block_of<BlockQ3_K>(row, i, 256);
      const int j = static_cast<int>(i % 256), g = j / 16;
      const int half = j / 128, k = (j % 128) / 32, l = j % 32;
      const int lo = (b.qs[32 * half + l] >> (2 * k)) & 3;
      const int hbit = (b.hmask[l] >> (j / 32)) & 1;
      const int q = lo - (hbit ? 0 : 4);
      const int s_lo = g < 8 ? (b.scales[g] & 15) : (b.scales[g - 8] >> 4);
      const int s_hi = (b.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
      const int s = (s_lo | s_hi << 4) - 32;
      return h(b.d) * static_cast<float>(s) * static_cast<float>(q);
    }
    case DType::Q4_K: {
      const auto& b = block_of<BlockQ4_K>(row, i, 256);
      const int j = static_cast<int>(i % 256), g = j / 32, c = j / 64, l = j % 32;
      const int q = (g % 2 == 0) ? (b.qs[32 * c + l] & 15) : (b.qs[32 * c + l] >> 4);
      int sc, mn;
      k4_scale_min(b.scales, g, sc, mn);
      return h(b.d) * static_cast<float>(sc) * static_cast<float>(q) -
             h(b.dmin) * static_cast<float>(mn);
    }
    case DType::Q5_K: {
      const auto& b = block_of<BlockQ5_K>(row, i, 256);
      const int j = static_cast<int>(i % 256), g = j / 32, c = j / 64, l = j % 32;
      int q = (g % 2 == 0) ? (b.qs[32 * c + l] & 15) : (b.qs[32 * c + l] >> 4);
      q |= ((b.qh[l] >> g) & 1) << 4;  // bit 2c for the low half of the chunk, 2c+1 high
      int sc, mn;
      k4_scale_min(b.scales, g, sc, mn);
      return h(b.d) * static_cast<float>(sc) * static_cast<float>(q) -
             h(b.dmin) * static_cast<float>(mn);
    }
    case DType::Q6_K: {
      const auto& b = block_of<BlockQ6_K>(row, i, 256);
      const int j = static_cast<int>(i % 256), g = j / 16;
      const int half = j / 128, k = (j % 128) / 32, l = j % 32;
      const uint8_t* L = b.ql + 64 * half;
      const uint8_t* H = b.qh + 32 * half;
      const int lo = (k % 2 == 0 ? L[l] : L[l + 32]);
      const int nib = k < 2 ? (lo & 15) : (lo >> 4);
      const int q = nib | ((H[l] >> (2 * k)) & 3) << 4;
      return h(b.d) * static_cast<float>(b.scales[g]) * static_cast<float>(q - 32);
    }
    default:
      LC_CHECK(false && "ref::element: unsupported type");
  }
  return 0;
}

bool dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q4_1:
    case DType::Q5_0: case DType::Q5_1: case DType::Q8_0: case DType::Q8_1: case DType::Q8_K:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      break;
    default:
      return false;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = element(t, src, i);
  return true;
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16_ref(d);
    for (int j = 0; j < 32; ++j) y[b].qs[j] = static_cast<int8_t>(std::round(v[j] * id));
  }
}

void quantize_row_q8_1(const float* x, BlockQ8_1* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16_ref(d);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::round(v[j] * id));
      sum += y[b].qs[j];
    }
    y[b].s = fp32_to_fp16_ref(static_cast<float>(sum) * d);
  }
}

void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* v = x + 256 * b;
    float amax = 0, mx = 0;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        mx = v[j];
      }
    }
    BlockQ8_K& o = y[b];
    if (amax == 0) {
      std::memset(&o, 0, sizeof(o));
      continue;
    }
    const float iscale = -127.0f / mx;
    for (int j = 0; j < 256; ++j) {
      const int q = static_cast<int>(std::nearbyint(iscale * v[j]));
      o.qs[j] = static_cast<int8_t>(std::min(127, q));
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += o.qs[16 * g + j];
      o.bsums[g] = static_cast<int16_t>(s);
    }
    o.d = 1.0f / iscale;
  }
}

DType activation_type(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0:
      return DType::Q8_0;
    case DType::Q4_1: case DType::Q5_1:
      return DType::Q8_1;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return DType::Q8_K;
    default:
      return DType::F32;
  }
}

void quantized_activations(DType weight_type, const float* x, float* out, int64_t n) {
  const DType a = activation_type(weight_type);
  if (a == DType::Q8_0) {
    std::vector<BlockQ8_0> q(static_cast<size_t>(n / 32));
    quantize_row_q8_0(x, q.data(), n);
    dequantize_row(a, q.data(), out, n);
  } else if (a == DType::Q8_1) {
    std::vector<BlockQ8_1> q(static_cast<size_t>(n / 32));
    quantize_row_q8_1(x, q.data(), n);
    dequantize_row(a, q.data(), out, n);
  } else if (a == DType::Q8_K) {
    std::vector<BlockQ8_K> q(static_cast<size_t>(n / 256));
    quantize_row_q8_k(x, q.data(), n);
    dequantize_row(a, q.data(), out, n);
  } else {
    std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
  }
}

double vec_dot_q(DType t, const void* w_row, const float* x, int64_t n) {
  std::vector<float> xa(static_cast<size_t>(n));
  quantized_activations(t, x, xa.data(), n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(element(t, w_row, i)) * xa[i];
  return s;
}

double vec_dot_exact(DType t, const void* w_row, const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(element(t, w_row, i)) * x[i];
  return s;
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  const int64_t n_in = w.ne[0], n_out = w.ne[1];
  std::vector<float> wr(static_cast<size_t>(n_in)), xa(static_cast<size_t>(n_in));
  for (int64_t t = 0; t < n_tokens; ++t) {
    quantized_activations(w.type, x + t * n_in, xa.data(), n_in);
    for (int64_t o = 0; o < n_out; ++o) {
      dequantize_row(w.type, w.row(o), wr.data(), n_in);
      double s = 0;
      for (int64_t i = 0; i < n_in; ++i) s += static_cast<double>(wr[i]) * xa[i];
      y[t * n_out + o] = static_cast<float>(s);
    }
  }
}

void rmsnorm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * scale * weight[i]);
}

void softmax_inplace(float* x, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  std::vector<double> e(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sum += e[i] = std::exp(x[i] - mx);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(e[i] / sum);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

double dot_f32(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

void accumulate_rows(float* o, const float* p, const float* v, int64_t nk, int64_t dv) {
  for (int64_t c = 0; c < dv; ++c) {
    double a = o[c];
    for (int64_t j = 0; j < nk; ++j) a += static_cast<double>(p[j]) * v[j * dv + c];
    o[c] = static_cast<float>(a);
  }
}

namespace {
constexpr int64_t kTile = 16;
float vmax(float x, float y) { return x > y ? x : y; }  // _mm256_max_ps: y when either is NaN
}  // namespace

void bound_tile_points(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* pos,
                       const float* const* neg, int64_t nq, float* out) {
  for (int64_t s = 0; s < nq; ++s)
    for (int64_t j = 0; j < kTile; ++j) {
      float acc = 0.0f;
      for (int64_t c = 0; c < d; ++c) {
        const float m = scale[c] * static_cast<float>(mn[c * kTile + j]);
        const float M = scale[c] * static_cast<float>(mx[c * kTile + j]);
        acc = std::fma(neg[s][c], m, std::fma(pos[s][c], M, acc));
      }
      out[s * kTile + j] = acc;
    }
}

void bound_tile_boxes(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* lo,
                      const float* const* hi, int64_t nq, float* out) {
  for (int64_t s = 0; s < nq; ++s)
    for (int64_t j = 0; j < kTile; ++j) {
      float acc = 0.0f;
      for (int64_t c = 0; c < d; ++c) {
        const float m = scale[c] * static_cast<float>(mn[c * kTile + j]);
        const float M = scale[c] * static_cast<float>(mx[c * kTile + j]);
        const float l = lo[s][c], h = hi[s][c];
        acc += vmax(vmax(l * m, l * M), vmax(h * m, h * M));
      }
      out[s * kTile + j] = acc;
    }
}

void max_bound_rows(const float* rows, int64_t nq, const uint8_t* wide, float* out) {
  for (int64_t j = 0; j < kTile; ++j) {
    float m = rows[j];
    for (int64_t s = 1; s < nq; ++s) {
      const float v = rows[s * kTile + j];
      m = v > m || v != v ? v : m;
    }
    out[j] = wide[j] ? std::numeric_limits<float>::infinity() : m;
  }
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
void scale_inplace(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void rope_apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot,
                const int32_t* pos, const float* inv_freq, float mscale, bool neox) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t hd = 0; hd < n_head; ++hd) {
      float* v = x + (t * n_head + hd) * head_dim;
      for (int64_t i = 0; i < n_rot / 2; ++i) {
        const float angle = static_cast<float>(pos[t]) * inv_freq[i];
        const double c = std::cos(static_cast<double>(angle)) * mscale;
        const double s = std::sin(static_cast<double>(angle)) * mscale;
        const int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = static_cast<float>(x0 * c - x1 * s);
        v[b] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace lc::kernels::ref
