#include "grad/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "kernels/kernels.h"

namespace lc::grad {
namespace {

// Rows r = ith, ith + nth, ...: balances loops whose cost grows with the row index (causal
// attention) and stays deterministic for a given thread count.
void strided_rows(ThreadPool& pool, int64_t n, const std::function<void(int64_t)>& fn) {
  const int nth = pool.size();
  pool.run([&](int ith) {
    for (int64_t r = ith; r < n; r += nth) fn(r);
  });
}

// We split GEMMs over our own pool; OpenBLAS threads would fight it for the cores.
void blas_single_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// C = beta * C: the product of an empty inner dimension (BLAS leaves K = 0 to the caller).
template <class T>
void scale_c(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
}

}  // namespace

void parallel_rows(ThreadPool& pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    if (b < e) fn(b, e);
  });
}

template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_c(M, N, beta, C, ldc);
  blas_single_thread();
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C,
                static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C,
                static_cast<int>(ldc));
  }
}

template <class T>
void linear_forward(const T* x, const T* w, T* y, int64_t n, int64_t in, int64_t out, ThreadPool& pool) {
  // Split over output features: each thread reads all of x and its own rows of w.
  parallel_rows(pool, out, [&](int64_t o0, int64_t o1) {
    gemm<T>(false, true, n, o1 - o0, in, T(1), x, in, w + o0 * in, in, T(0), y + o0, out);
  });
}

template <class T>
void linear_backward_dx(const T* dy, const T* w, T* dx, int64_t n, int64_t in, int64_t out, bool accumulate,
                        ThreadPool& pool) {
  // dx[n, in] = dy[n, out] w[out, in], split over tokens.
  parallel_rows(pool, n, [&](int64_t t0, int64_t t1) {
    gemm<T>(false, false, t1 - t0, in, out, T(1), dy + t0 * out, out, w, in, accumulate ? T(1) : T(0),
            dx + t0 * in, in);
  });
}

template <class T>
void linear_backward_dw(const T* dy, const T* x, T* dw, int64_t n, int64_t in, int64_t out, bool accumulate,
                        ThreadPool& pool) {
  // dw[out, in] = dy^T[out, n] x[n, in], split over output features.
  parallel_rows(pool, out, [&](int64_t o0, int64_t o1) {
    gemm<T>(true, false, o1 - o0, in, n, T(1), dy + o0, out, x, in, accumulate ? T(1) : T(0), dw + o0 * in, in);
  });
}

template <class T>
void linear_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, int64_t n, int64_t in,
                     int64_t out, bool accumulate_dx, ThreadPool& pool) {
  linear_backward_dx<T>(dy, w, dx, n, in, out, accumulate_dx, pool);
  linear_backward_dw<T>(dy, x, dw, n, in, out, true, pool);
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t dim, float eps, ThreadPool& pool) {
  parallel_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* xr = x + t * dim;
      if constexpr (std::is_same_v<T, float>) {
        // The inference kernel makes y; rstd is recomputed the same way (squares in float, sum
        // in double) for the backward pass.
        double s = 0;
        for (int64_t i = 0; i < dim; ++i) s += static_cast<double>(xr[i] * xr[i]);
        const float mean = static_cast<float>(s / static_cast<double>(dim));
        rstd[t] = 1.0f / std::sqrt(mean + eps);
        kernels::rmsnorm(xr, w, y + t * dim, dim, eps);
      } else {
        T s = 0;
        for (int64_t i = 0; i < dim; ++i) s += xr[i] * xr[i];
        const T r = T(1) / std::sqrt(s / static_cast<T>(dim) + static_cast<T>(eps));
        rstd[t] = r;
        for (int64_t i = 0; i < dim; ++i) y[t * dim + i] = xr[i] * r * w[i];
      }
    }
  });
}

template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t n,
                      int64_t dim, ThreadPool& pool, bool accumulate_dx) {
  // dx_j = r * (g_j - x_j * r^2 * mean(g * x)) with g = dy * w.
  parallel_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* dyr = dy + t * dim;
      const T* xr = x + t * dim;
      T* dxr = dx + t * dim;
      const T r = rstd[t];
      double c = 0;
      for (int64_t i = 0; i < dim; ++i) c += static_cast<double>(dyr[i] * w[i] * xr[i]);
      const T k = static_cast<T>(c / static_cast<double>(dim)) * r * r;
      // Element i reads dy[i] before dx[i] is written: dx may be dy when overwriting.
      if (accumulate_dx) {
        for (int64_t i = 0; i < dim; ++i) dxr[i] += r * (dyr[i] * w[i] - xr[i] * k);
      } else {
        for (int64_t i = 0; i < dim; ++i) dxr[i] = r * (dyr[i] * w[i] - xr[i] * k);
      }
    }
  });
  if (!dw) return;
  // dw_j += sum_t dy[t, j] * x[t, j] * r_t, split over features so no two threads share a sum.
  parallel_rows(pool, dim, [&](int64_t j0, int64_t j1) {
    for (int64_t t = 0; t < n; ++t) {
      const T r = rstd[t];
      for (int64_t j = j0; j < j1; ++j) dw[j] += dy[t * dim + j] * x[t * dim + j] * r;
    }
  });
}

RopeTable inverse_rope(const RopeTable& t) {
  RopeTable r = t;
  for (float& f : r.inv_freq) f = -f;
  return r;
}

template <class T>
void rope_rotate(T* x, int64_t n, int64_t n_head, int64_t head_dim, const int32_t* pos,
                 const RopeTable& table, ThreadPool& pool) {
  parallel_rows(pool, n, [&](int64_t t0, int64_t t1) {
    if constexpr (std::is_same_v<T, float>) {
      kernels::rope_apply(x + t0 * n_head * head_dim, t1 - t0, n_head, head_dim, table.n_rot,
                          pos + t0, table.inv_freq.data(), table.mscale, table.neox);
    } else {
      const int64_t half = table.n_rot / 2;
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          // The angle as the kernel forms it (in float), then exact trigonometry.
          const float angle = static_cast<float>(pos[t]) * table.inv_freq[static_cast<size_t>(i)];
          const T c = std::cos(static_cast<T>(angle)) * table.mscale;
          const T s = std::sin(static_cast<T>(angle)) * table.mscale;
          for (int64_t h = 0; h < n_head; ++h) {
            T* v = x + (t * n_head + h) * head_dim;
            T* a = table.neox ? v + i : v + 2 * i;
            T* b = table.neox ? v + i + half : v + 2 * i + 1;
            const T x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
          }
        }
      }
    }
  });
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* h, int64_t n, ThreadPool& pool) {
  parallel_rows(pool, n, [&](int64_t i0, int64_t i1) {
    if constexpr (std::is_same_v<T, float>) {
      kernels::swiglu(gate + i0, up + i0, h + i0, i1 - i0);
    } else {
      for (int64_t i = i0; i < i1; ++i) h[i] = gate[i] / (T(1) + std::exp(-gate[i])) * up[i];
    }
  });
}

template <class T>
void swiglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n, ThreadPool& pool) {
  parallel_rows(pool, n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T g = gate[i], d = dh[i];  // read first: dgate may be dh
      const T sg = T(1) / (T(1) + std::exp(-g));  // sigmoid
      const T silu = g * sg;
      dgate[i] = d * up[i] * sg * (T(1) + g * (T(1) - sg));
      dup[i] = d * silu;
    }
  });
}

template <class T>
double cross_entropy_forward(const T* logits, const int32_t* targets, T* lse, T* losses, int64_t n,
                             int64_t vocab, ThreadPool& pool) {
  parallel_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* l = logits + t * vocab;
      T mx = l[0];
      for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, l[i]);
      double s = 0;
      for (int64_t i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(l[i] - mx));
      lse[t] = mx + static_cast<T>(std::log(s));
      losses[t] = targets[t] < 0 ? T(0) : lse[t] - l[targets[t]];
    }
  });
  double total = 0;
  for (int64_t t = 0; t < n; ++t) total += static_cast<double>(losses[t]);
  return total;
}

template <class T>
void cross_entropy_backward(T* logits, const int32_t* targets, const T* lse, int64_t n, int64_t vocab,
                            T scale, ThreadPool& pool) {
  parallel_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      T* l = logits + t * vocab;
      if (targets[t] < 0) {  // an ignored position: no gradient
        std::fill(l, l + vocab, T(0));
        continue;
      }
      for (int64_t i = 0; i < vocab; ++i) l[i] = std::exp(l[i] - lse[t]) * scale;
      l[targets[t]] -= scale;
    }
  });
}

// Causal attention as GEMMs over blocks of kAttnBlock query rows of one head: block [t0, t1)
// only meets keys [0, t1), so the masked upper blocks are never computed. Entries s in (t, t1)
// of a row are zeroed (probabilities and score gradients), which the key pass relies on: it
// uses the same aligned blocks, so every entry it reads was written by this call.
constexpr int64_t kAttnBlock = 32;

namespace {

// The fixed-distance variant (AttnDims::fixed_distance = W): the queries rotated from pos[t]
// on to W - pos[t] more and the keys from pos[s] back to 0, so qf[t] . kf[s] = rope(q, W) .
// rope(k, 0) for the raw q and k; lim[t] = the first key the query at t sees at its real
// distance (keys s < lim[t] are further than W).
template <class T>
struct FarQk {
  std::vector<T> qf, kf;
  std::vector<int32_t> pq, pk;
  std::vector<int64_t> lim;
};

template <class T>
void far_qk(const AttnDims& d, const T* q, const T* k, FarQk<T>& f, ThreadPool& pool) {
  const int64_t T_ = d.n_tokens, W = d.fixed_distance;
  LC_CHECK(d.pos && d.rope && d.rope_inv);
  f.qf.assign(q, q + T_ * d.n_head * d.head_dim);
  f.kf.assign(k, k + T_ * d.n_head_kv * d.head_dim);
  f.pq.resize(static_cast<size_t>(T_));
  f.pk.resize(static_cast<size_t>(T_));
  f.lim.resize(static_cast<size_t>(T_));
  int64_t s = 0;
  for (int64_t t = 0; t < T_; ++t) {
    LC_CHECK(t == 0 || d.pos[t] > d.pos[t - 1]);
    f.pq[static_cast<size_t>(t)] = static_cast<int32_t>(W - d.pos[t]);
    f.pk[static_cast<size_t>(t)] = -d.pos[t];
    while (static_cast<int64_t>(d.pos[t]) - d.pos[s] > W) ++s;
    f.lim[static_cast<size_t>(t)] = s;
  }
  rope_rotate<T>(f.qf.data(), T_, d.n_head, d.head_dim, f.pq.data(), *d.rope, pool);
  rope_rotate<T>(f.kf.data(), T_, d.n_head_kv, d.head_dim, f.pk.data(), *d.rope, pool);
}

}  // namespace

template <class T>
void attention_forward(const AttnDims& d, const T* q, const T* k, const T* v, T* out, T* probs, ThreadPool& pool) {
  const int64_t T_ = d.n_tokens, H = d.n_head, hd = d.head_dim, group = d.n_head / d.n_head_kv;
  const int64_t qs = H * hd, ks = d.n_head_kv * hd;  // token strides
  const int64_t nb = (T_ + kAttnBlock - 1) / kAttnBlock;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  FarQk<T> far;
  if (d.fixed_distance > 0) far_qk<T>(d, q, k, far, pool);
  strided_rows(pool, H * nb, [&](int64_t task) {
    const int64_t h = task % H, kh = h / group;
    const int64_t t0 = (task / H) * kAttnBlock, t1 = std::min(T_, t0 + kAttnBlock);
    T* P = probs + h * T_ * T_;
    // S[t0:t1, 0:t1] = scale * Q_h[t0:t1] K_kh[0:t1]^T
    gemm<T>(false, true, t1 - t0, t1, hd, scale, q + t0 * qs + h * hd, qs, k + kh * hd, ks, T(0), P + t0 * T_, T_);
    if (d.fixed_distance > 0) {
      // Keys beyond the fixed distance: the same product with qf and kf.
      const int64_t cf = far.lim[static_cast<size_t>(t1 - 1)];
      if (cf > 0) {
        std::vector<T> F(static_cast<size_t>((t1 - t0) * cf));
        gemm<T>(false, true, t1 - t0, cf, hd, scale, far.qf.data() + t0 * qs + h * hd, qs, far.kf.data() + kh * hd,
                ks, T(0), F.data(), cf);
        for (int64_t t = t0; t < t1; ++t)
          std::copy_n(F.data() + (t - t0) * cf, far.lim[static_cast<size_t>(t)], P + t * T_);
      }
    }
    for (int64_t t = t0; t < t1; ++t) {
      T* p = P + t * T_;
      T mx = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) mx = std::max(mx, p[s]);
      T sum = 0;
      for (int64_t s = 0; s <= t; ++s) {
        p[s] = std::exp(p[s] - mx);
        sum += p[s];
      }
      const T inv = T(1) / sum;
      for (int64_t s = 0; s <= t; ++s) p[s] *= inv;
      for (int64_t s = t + 1; s < t1; ++s) p[s] = T(0);
    }
    // O_h[t0:t1] = P[t0:t1, 0:t1] V_kh[0:t1]
    gemm<T>(false, false, t1 - t0, hd, t1, T(1), P + t0 * T_, T_, v + kh * hd, ks, T(0), out + t0 * qs + h * hd, qs);
  });
}

template <class T>
void attention_backward(const AttnDims& d, const T* q, const T* k, const T* v, const T* probs,
                        const T* dout, T* dq, T* dk, T* dv, T* scratch, ThreadPool& pool) {
  const int64_t T_ = d.n_tokens, H = d.n_head, hd = d.head_dim, group = d.n_head / d.n_head_kv;
  const int64_t qs = H * hd, ks = d.n_head_kv * hd;
  const int64_t nb = (T_ + kAttnBlock - 1) / kAttnBlock;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  const bool fixed = d.fixed_distance > 0;
  // With a fixed distance, dS splits into its near part (gradient of the rotated q and k) and
  // its far part (gradient of qf and kf, rotated back at the end).
  FarQk<T> far;
  std::vector<T> dqf, dkf;
  if (fixed) {
    far_qk<T>(d, q, k, far, pool);
    dqf.assign(static_cast<size_t>(T_ * qs), T(0));
    dkf.assign(static_cast<size_t>(T_ * ks), T(0));
  }
  auto lim = [&](int64_t t) { return fixed ? far.lim[static_cast<size_t>(t)] : int64_t{0}; };
  // Query blocks: dP = dO V^T; dS = P * (dP - rowsum(P * dP)) (softmax backward);
  // dQ = scale * dS K. dS goes to scratch for the key pass.
  strided_rows(pool, H * nb, [&](int64_t task) {
    const int64_t h = task % H, kh = h / group;
    const int64_t t0 = (task / H) * kAttnBlock, t1 = std::min(T_, t0 + kAttnBlock);
    const T* P = probs + h * T_ * T_;
    T* dS = scratch + h * T_ * T_;
    gemm<T>(false, true, t1 - t0, t1, hd, T(1), dout + t0 * qs + h * hd, qs, v + kh * hd, ks, T(0), dS + t0 * T_, T_);
    for (int64_t t = t0; t < t1; ++t) {
      const T* p = P + t * T_;
      T* ds = dS + t * T_;
      T dsum = 0;
      for (int64_t s = 0; s <= t; ++s) dsum += p[s] * ds[s];
      for (int64_t s = 0; s <= t; ++s) ds[s] = p[s] * (ds[s] - dsum);
      for (int64_t s = t + 1; s < t1; ++s) ds[s] = T(0);
    }
    if (!fixed) {
      gemm<T>(false, false, t1 - t0, hd, t1, scale, dS + t0 * T_, T_, k + kh * hd, ks, T(0), dq + t0 * qs + h * hd, qs);
      return;
    }
    const int64_t nt = t1 - t0, cf = lim(t1 - 1);
    std::vector<T> near(static_cast<size_t>(nt * t1)), farp(static_cast<size_t>(nt * cf), T(0));
    for (int64_t t = t0; t < t1; ++t) {
      const T* ds = dS + t * T_;
      T* nr = near.data() + (t - t0) * t1;
      std::copy_n(ds, t1, nr);
      std::fill_n(nr, lim(t), T(0));
      std::copy_n(ds, lim(t), farp.data() + (t - t0) * cf);
    }
    gemm<T>(false, false, nt, hd, t1, scale, near.data(), t1, k + kh * hd, ks, T(0), dq + t0 * qs + h * hd, qs);
    gemm<T>(false, false, nt, hd, cf, scale, farp.data(), cf, far.kf.data() + kh * hd, ks, T(0),
            dqf.data() + t0 * qs + h * hd, qs);
  });
  // Key blocks [s0, s1) of KV head kh: only queries t >= s0 see them. Summing over the group's
  // query heads inside one task keeps each row of dk and dv with one thread.
  strided_rows(pool, d.n_head_kv * nb, [&](int64_t task) {
    const int64_t kh = task % d.n_head_kv;
    const int64_t s0 = (task / d.n_head_kv) * kAttnBlock, s1 = std::min(T_, s0 + kAttnBlock);
    const int64_t ns = s1 - s0, nr = T_ - s0;
    std::vector<T> near, farp;
    if (fixed) near.resize(static_cast<size_t>(nr * ns)), farp.resize(static_cast<size_t>(nr * ns));
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      const T beta = h == kh * group ? T(0) : T(1);
      const T* P = probs + h * T_ * T_;
      const T* dS = scratch + h * T_ * T_;
      // dK[s0:s1] (+)= scale * dS[s0:T, s0:s1]^T Q_h[s0:T]; dV[s0:s1] (+)= P[s0:T, s0:s1]^T dO_h[s0:T]
      if (!fixed) {
        gemm<T>(true, false, ns, hd, nr, scale, dS + s0 * T_ + s0, T_, q + s0 * qs + h * hd, qs, beta,
                dk + s0 * ks + kh * hd, ks);
      } else {
        for (int64_t t = s0; t < T_; ++t)
          for (int64_t s = s0; s < s1; ++s) {
            const T x = dS[t * T_ + s];
            const bool is_far = s < lim(t);
            near[static_cast<size_t>((t - s0) * ns + (s - s0))] = is_far ? T(0) : x;
            farp[static_cast<size_t>((t - s0) * ns + (s - s0))] = is_far ? x : T(0);
          }
        gemm<T>(true, false, ns, hd, nr, scale, near.data(), ns, q + s0 * qs + h * hd, qs, beta,
                dk + s0 * ks + kh * hd, ks);
        gemm<T>(true, false, ns, hd, nr, scale, farp.data(), ns, far.qf.data() + s0 * qs + h * hd, qs, beta,
                dkf.data() + s0 * ks + kh * hd, ks);
      }
      gemm<T>(true, false, ns, hd, nr, T(1), P + s0 * T_ + s0, T_, dout + s0 * qs + h * hd, qs, beta,
              dv + s0 * ks + kh * hd, ks);
    }
  });
  if (!fixed) return;
  // qf = R(W - pos) q and kf = R(-pos) k: their gradients go back through the inverse rotations.
  rope_rotate<T>(dqf.data(), T_, H, hd, far.pq.data(), *d.rope_inv, pool);
  rope_rotate<T>(dkf.data(), T_, d.n_head_kv, hd, far.pk.data(), *d.rope_inv, pool);
  for (int64_t i = 0; i < T_ * qs; ++i) dq[i] += dqf[static_cast<size_t>(i)];
  for (int64_t i = 0; i < T_ * ks; ++i) dk[i] += dkf[static_cast<size_t>(i)];
}

#define LC_GRAD_INSTANTIATE(T)                                                                      \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*,  \
                        int64_t);                                                                   \
  template void linear_forward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, ThreadPool&);   \
  template void linear_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,  \
                                   bool, ThreadPool&);                                              \
  template void linear_backward_dx<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool,       \
                                      ThreadPool&);                                                 \
  template void linear_backward_dw<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool,       \
                                      ThreadPool&);                                                 \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, float, ThreadPool&); \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t, \
                                    ThreadPool&, bool);                                             \
  template void rope_rotate<T>(T*, int64_t, int64_t, int64_t, const int32_t*, const RopeTable&,      \
                               ThreadPool&);                                                        \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t, ThreadPool&);                    \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, ThreadPool&);     \
  template double cross_entropy_forward<T>(const T*, const int32_t*, T*, T*, int64_t, int64_t,       \
                                           ThreadPool&);                                            \
  template void cross_entropy_backward<T>(T*, const int32_t*, const T*, int64_t, int64_t, T,         \
                                          ThreadPool&);                                             \
  template void attention_forward<T>(const AttnDims&, const T*, const T*, const T*, T*, T*,          \
                                     ThreadPool&);                                                  \
  template void attention_backward<T>(const AttnDims&, const T*, const T*, const T*, const T*,       \
                                      const T*, T*, T*, T*, T*, ThreadPool&);

LC_GRAD_INSTANTIATE(float)
LC_GRAD_INSTANTIATE(double)

}  // namespace lc::grad
