// One transformer block of the trainable model, shared by the whole-sequence model
// (transformer.cpp) and the chunk-recurrent one (chunked.cpp): everything but attention
// itself, which each supplies (dense over the sequence, or one chunk against the paged K/V of
// the chunks before it).
//   ln1 = rmsnorm(xin); q, k = rope(wq ln1, wk ln1); v = wv ln1; att = attention(q, k, v)
//   mid = xin + wo att; ln2 = rmsnorm(mid); xout = mid + down(silu(gate ln2) * up ln2)
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "grad/ops.h"
#include "rope/rope_scaling.h"
#include "rope/rope_table.h"
#include "train/config.h"

namespace lc::train {

// Offsets of one block's tensors in the flat parameter (and gradient) buffer.
struct BlockOffsets {
  size_t attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
};

// One block's activations over n rows, saved by block_forward for the backward pass.
template <class T>
struct BlockActs {
  const T* xin;     // [n, n_embd] input
  T* ln1;           // [n, n_embd] rmsnorm(xin)
  T* rstd1;         // [n] its 1/rms
  T* q;             // [n, q_dim] rotated queries
  T* k;             // [n, kv_dim] rotated keys
  T* v;             // [n, kv_dim] values
  T* att;           // [n, q_dim] attention output
  T* mid;           // [n, n_embd] xin + wo att
  T* ln2;           // [n, n_embd] rmsnorm(mid)
  T* rstd2;         // [n]
  T* gate, *up, *h; // [n, n_ff]
  T* xout;          // [n, n_embd] output
};

// Attention logit scaling (rope `logn`, trained in): q at 0-based position pos[t] times
// logn_scale(pos[t], logn_orig), the engine's factor; a no-op when logn_orig is 0. The same
// scaling is its own backward (the factor multiplies dq).
template <class T>
void scale_q_logn(const ModelConfig& c, T* q, int64_t n, const int32_t* pos) {
  if (c.logn_orig <= 0) return;
  const int64_t qd = c.q_dim();
  for (int64_t t = 0; t < n; ++t) {
    const T f = static_cast<T>(logn_scale(pos[t], c.logn_orig));
    if (f != T(1))
      for (int64_t i = 0; i < qd; ++i) q[t * qd + i] *= f;
  }
}

// Forward of the block; attend() fills a.att from a.q, a.k, a.v. tmp: [n, n_embd] scratch.
template <class T, class Attend>
void block_forward(const ModelConfig& c, const T* W, const BlockOffsets& L, const BlockActs<T>& a, int64_t n,
                   const int32_t* pos, const RopeTable& rope, T* tmp, ThreadPool& pool, Attend&& attend) {
  const int64_t E = c.n_embd, F = c.n_ff, qd = c.q_dim(), kd = c.kv_dim();
  grad::rmsnorm_forward<T>(a.xin, W + L.attn_norm, a.ln1, a.rstd1, n, E, c.rms_eps, pool);
  grad::linear_forward<T>(a.ln1, W + L.wq, a.q, n, E, qd, pool);
  grad::linear_forward<T>(a.ln1, W + L.wk, a.k, n, E, kd, pool);
  grad::linear_forward<T>(a.ln1, W + L.wv, a.v, n, E, kd, pool);
  grad::rope_rotate<T>(a.q, n, c.n_head, c.head_dim(), pos, rope, pool);
  grad::rope_rotate<T>(a.k, n, c.n_head_kv, c.head_dim(), pos, rope, pool);
  scale_q_logn<T>(c, a.q, n, pos);
  attend();
  grad::linear_forward<T>(a.att, W + L.wo, tmp, n, qd, E, pool);
  for (int64_t i = 0; i < n * E; ++i) a.mid[i] = a.xin[i] + tmp[i];

  grad::rmsnorm_forward<T>(a.mid, W + L.ffn_norm, a.ln2, a.rstd2, n, E, c.rms_eps, pool);
  grad::linear_forward<T>(a.ln2, W + L.w_gate, a.gate, n, E, F, pool);
  grad::linear_forward<T>(a.ln2, W + L.w_up, a.up, n, E, F, pool);
  grad::swiglu_forward<T>(a.gate, a.up, a.h, n * F, pool);
  grad::linear_forward<T>(a.h, W + L.w_down, tmp, n, F, E, pool);
  for (int64_t i = 0; i < n * E; ++i) a.xout[i] = a.mid[i] + tmp[i];
}

// Scratch of the block's backward pass.
template <class T>
struct BlockGradScratch {
  T* dln;               // [n, n_embd]
  T* datt;              // [n, q_dim]
  T* dh, *dgate, *dup;  // [n, n_ff]
};

// Backward from xout to att: dresid holds d(xout) on entry and d(mid) on return; s.datt
// receives d(att). Weight gradients are added into G.
template <class T>
void block_backward_to_att(const ModelConfig& c, const T* W, T* G, const BlockOffsets& L, const BlockActs<T>& a,
                           int64_t n, T* dresid, const BlockGradScratch<T>& s, ThreadPool& pool) {
  const int64_t E = c.n_embd, F = c.n_ff, qd = c.q_dim();
  grad::linear_backward<T>(dresid, a.h, W + L.w_down, s.dh, G + L.w_down, n, F, E, false, pool);
  grad::swiglu_backward<T>(s.dh, a.gate, a.up, s.dgate, s.dup, n * F, pool);
  grad::linear_backward<T>(s.dgate, a.ln2, W + L.w_gate, s.dln, G + L.w_gate, n, E, F, false, pool);
  grad::linear_backward<T>(s.dup, a.ln2, W + L.w_up, s.dln, G + L.w_up, n, E, F, true, pool);
  grad::rmsnorm_backward<T>(s.dln, a.mid, W + L.ffn_norm, a.rstd2, dresid, G + L.ffn_norm, n, E, pool);
  grad::linear_backward<T>(dresid, a.att, W + L.wo, s.datt, G + L.wo, n, qd, E, false, pool);
}

// Backward from the rotated q, k and from v to xin, after the attention's own backward: dq
// and dk are d(rotated q, k) and are rotated back in place (rope_inv: grad::inverse_rope(rope));
// dresid holds d(mid) on entry and d(xin) on return.
template <class T>
void block_backward_from_qkv(const ModelConfig& c, const T* W, T* G, const BlockOffsets& L, const BlockActs<T>& a,
                             int64_t n, T* dq, T* dk, const T* dv, const int32_t* pos, const RopeTable& rope_inv,
                             T* dresid, const BlockGradScratch<T>& s, ThreadPool& pool) {
  const int64_t E = c.n_embd, qd = c.q_dim(), kd = c.kv_dim();
  scale_q_logn<T>(c, dq, n, pos);
  grad::rope_rotate<T>(dq, n, c.n_head, c.head_dim(), pos, rope_inv, pool);
  grad::rope_rotate<T>(dk, n, c.n_head_kv, c.head_dim(), pos, rope_inv, pool);
  grad::linear_backward<T>(dq, a.ln1, W + L.wq, s.dln, G + L.wq, n, E, qd, false, pool);
  grad::linear_backward<T>(dk, a.ln1, W + L.wk, s.dln, G + L.wk, n, E, kd, true, pool);
  grad::linear_backward<T>(dv, a.ln1, W + L.wv, s.dln, G + L.wv, n, E, kd, true, pool);
  grad::rmsnorm_backward<T>(s.dln, a.xin, W + L.attn_norm, a.rstd1, dresid, G + L.attn_norm, n, E, pool);
}

}  // namespace lc::train
