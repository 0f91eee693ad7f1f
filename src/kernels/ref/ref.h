// Scalar reference kernels: the oracles the tests hold the fast kernels to. They are written
// straight from the definitions (block layouts element by element, sums in double) and make no
// attempt at speed. Nothing in the engine calls them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/quant_blocks.h"

namespace lc::kernels::ref {

// Element i of a row of type t (any type dequantize_row accepts), decoded from the layout.
float element(DType t, const void* row, int64_t i);
// dst[0..n) = element(t, src, i); false if t is unknown to the reference.
bool dequantize_row(DType t, const void* src, float* dst, int64_t n);

// The activation quantisers of the integer dot products, as ggml defines them:
// Q8_0/Q8_1: d = amax / 127 (stored as f16), q = round-half-away(x / d);
// Q8_1 adds s = d * sum(q) (f16). Q8_K: scale -127 / (signed value of largest magnitude),
// q = round-half-even, d = 1 / scale (f32), bsums = sums of 16.
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);  // x: [n]
void quantize_row_q8_1(const float* x, BlockQ8_1* y, int64_t n);  // x: [n]
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n);  // x: [n]

// The activation type matmul pairs with weight type t (Q8_0, Q8_1, Q8_K), or F32 when the
// activations stay float.
DType activation_type(DType t);
// dequant(quantize(x)) for the activation type of weight type t: exactly the values the
// integer dot product multiplies. x, out: [n].
void quantized_activations(DType weight_type, const float* x, float* out, int64_t n);

// sum_i dequant(w)[i] * dequant(quantize_act(x))[i] in double: what matmul computes up to
// float rounding. w_row: one row of n elements of type t; x: [n].
double vec_dot_q(DType t, const void* w_row, const float* x, int64_t n);
// Same with the activations unquantised (the looser, "true" product).
double vec_dot_exact(DType t, const void* w_row, const float* x, int64_t n);

// y[t, o] = vec_dot_q(w row o, x[t]) (quantised types) or the exact dot (float types).
// x: [n_tokens, n_in], y: [n_tokens, n_out].
void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y);

void rmsnorm(const float* x, const float* weight, float* y, int64_t n, float eps);
void softmax_inplace(float* x, int64_t n);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
double dot_f32(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);
// kernels::bound_tile_points / bound_tile_boxes / max_bound_rows one page and channel at a time,
// in the order of operations the vector forms take (so the results are the same bits).
void bound_tile_points(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* pos,
                       const float* const* neg, int64_t nq, float* out);
void bound_tile_boxes(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* lo,
                      const float* const* hi, int64_t nq, float* out);
void max_bound_rows(const float* rows, int64_t nq, const uint8_t* wide, float* out);
// o[c] += sum_j p[j] * v[j, c], summed in double. v: [nk, dv].
void accumulate_rows(float* o, const float* p, const float* v, int64_t nk, int64_t dv);
void add_inplace(float* y, const float* x, int64_t n);
void scale_inplace(float* y, float a, int64_t n);
// x: [n_tokens, n_head, head_dim]; pos: [n_tokens]; inv_freq: [n_rot / 2].
void rope_apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot,
                const int32_t* pos, const float* inv_freq, float mscale, bool neox);

}  // namespace lc::kernels::ref
