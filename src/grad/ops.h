// Forward and backward passes of the operations of a Llama block, written out by hand, shared by
// the trainer (src/train) and query-only test-time training (src/runtime/qttt.cpp). Every op
// is a template over the scalar type: the trainer and qTTT run in float (sharing the inference
// kernels where the math is the same, so that an exported model reproduces the trainer's
// logits and qTTT's forward is the engine's), and the tests instantiate double to check each
// backward against finite differences at tight tolerances. Backward functions say whether they
// overwrite or accumulate (+=) their outputs.
#pragma once

#include <cstdint>
#include <functional>

#include "core/thread_pool.h"
#include "rope/rope_table.h"

namespace lc::grad {

// Row-major GEMM: C[M, N] = alpha * op(A) op(B) + beta * C (cblas_sgemm / cblas_dgemm, one
// OpenBLAS thread: callers split the work over the ThreadPool). K <= 0 gives C = beta * C.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// y = x W^T.  x: [n, in], w: [out, in] (GGUF layout: ne[0] = in), y: [n, out] (overwritten).
template <class T>
void linear_forward(const T* x, const T* w, T* y, int64_t n, int64_t in, int64_t out, ThreadPool& pool);
// dy: [n, out], x: [n, in], w: [out, in].
// dx: [n, in] overwritten (accumulate_dx = false) or += (true); dw: [out, in] +=.
template <class T>
void linear_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, int64_t n, int64_t in,
                     int64_t out, bool accumulate_dx, ThreadPool& pool);
// The two halves of linear_backward, for a caller that needs one of them (a frozen weight has
// no dw; the input of a first layer needs no dx). dx: [n, in] = dy w (split over tokens);
// dw: [out, in] = dy^T x (split over output features); accumulate: += instead.
template <class T>
void linear_backward_dx(const T* dy, const T* w, T* dx, int64_t n, int64_t in, int64_t out, bool accumulate,
                        ThreadPool& pool);
template <class T>
void linear_backward_dw(const T* dy, const T* x, T* dw, int64_t n, int64_t in, int64_t out, bool accumulate,
                        ThreadPool& pool);

// y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps), row by row.
// x, y: [n, dim]; w: [dim]; rstd: [n] (saved for the backward pass).
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t dim, float eps, ThreadPool& pool);
// dy, x: [n, dim]; w: [dim]; rstd: [n]. dx: [n, dim] += (accumulate_dx, the default) or
// overwritten; dw: [dim] +=, or not computed when null (a frozen norm weight). With
// accumulate_dx false and no dw, dx may be dy (the gradient replaced in place).
template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t n,
                      int64_t dim, ThreadPool& pool, bool accumulate_dx = true);

// Rotates x: [n, n_head, head_dim] in place, token t at position pos[t], with the inference
// engine's table (the float path calls the inference kernel). The backward pass of a rotation
// is the rotation by -theta: rotate with inverse_rope(table).
template <class T>
void rope_rotate(T* x, int64_t n, int64_t n_head, int64_t head_dim, const int32_t* pos,
                 const RopeTable& table, ThreadPool& pool);
// The table whose angles are the negated angles of `t` (same mscale; the trainer uses 1).
RopeTable inverse_rope(const RopeTable& t);

// h = silu(gate) * up.  gate, up, h: [n] (n = tokens * n_ff).
template <class T>
void swiglu_forward(const T* gate, const T* up, T* h, int64_t n, ThreadPool& pool);
// dh, gate, up: [n]; dgate, dup: [n] overwritten (dgate may be dh).
template <class T>
void swiglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n, ThreadPool& pool);

// Cross-entropy of logits: [n, vocab] against targets: [n]. lse: [n] gets each row's
// log-sum-exp; losses: [n] gets -log p(target). Returns the sum of the losses (in double).
template <class T>
double cross_entropy_forward(const T* logits, const int32_t* targets, T* lse, T* losses, int64_t n,
                             int64_t vocab, ThreadPool& pool);
// logits: [n, vocab] is replaced by dloss/dlogits = scale * (softmax - onehot(target)).
template <class T>
void cross_entropy_backward(T* logits, const int32_t* targets, const T* lse, int64_t n, int64_t vocab,
                            T scale, ThreadPool& pool);

// Causal multi-head attention with grouped KV heads, materialising the [T, T] probabilities of
// every head (fine at training lengths up to ~1K; a chunked version can replace this pair
// behind the same arguments).
struct AttnDims {
  int64_t n_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  // > 0: a key more than `fixed_distance` positions before its query is attended as if exactly
  // that far, rope(q, W) . rope(k, 0): the distance ceiling of LM-Infinite (Han et al. 2023)
  // and InfLLM (Xiao et al. 2024), trained in so that the model reads any length with the
  // relative positions it was trained on. Needs pos (increasing), rope and rope_inv (the
  // tables q and k were rotated with, and inverse_rope of it).
  int64_t fixed_distance = 0;
  const int32_t* pos = nullptr;
  const RopeTable* rope = nullptr;
  const RopeTable* rope_inv = nullptr;
};
// q: [T, n_head, hd], k, v: [T, n_head_kv, hd] (already rotated). out: [T, n_head, hd];
// probs: [n_head, T, T] (row t holds p(t, s) for s <= t; saved for the backward pass).
template <class T>
void attention_forward(const AttnDims& d, const T* q, const T* k, const T* v, T* out, T* probs, ThreadPool& pool);
// dout: [T, n_head, hd]. dq: [T, n_head, hd], dk, dv: [T, n_head_kv, hd] overwritten.
// scratch: [n_head, T, T].
template <class T>
void attention_backward(const AttnDims& d, const T* q, const T* k, const T* v, const T* probs,
                        const T* dout, T* dq, T* dk, T* dv, T* scratch, ThreadPool& pool);

// Splits [0, n) into one contiguous range per thread (deterministic for a given thread count).
void parallel_rows(ThreadPool& pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace lc::grad
