// Compute kernels. Every kernel here has a scalar reference in ref/ that tests compare with.
// SIMD paths are chosen at compile time (AVX-512 when the build targets it, else AVX2+FMA+F16C,
// else scalar): the engine is built on the machine that runs it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace lc::kernels {

// Dequantise/widen n elements (a multiple of the type's block size) of type t to f32.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantise/narrow n f32 values to type t (f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q8_k, q4_k,
// q5_k, q6_k: the types the model writer needs; all but q4_0 and q8_k as ggml's reference
// quantisers, byte for byte); returns false if t cannot be produced.
bool quantize_row(DType t, const float* src, void* dst, int64_t n);
bool can_quantize(DType t);

// Types matmul accepts as weights.
bool matmul_supports(DType t);

// y[t, o] = sum_i W[o, i] * x[t, i].
// w: [n_out rows of n_in] (w.ne[0] = n_in, w.ne[1] = n_out), any type matmul_supports.
// x: [n_tokens, n_in] f32, y: [n_tokens, n_out] f32.
// Quantised weights multiply activations quantised the way ggml does it (Q8_0 blocks for
// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q8_K blocks for k-quants) with integer dot products, so results
// are the same whatever n_tokens is. F16/F32 weights multiply f32 activations; so do BF16
// weights, except packed ones on AVX512-BF16 builds, which multiply activations rounded to bf16
// (bf16_dot_products(), as llama.cpp), the same bits whatever n_tokens is.
void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);
// ys[i] = x ws[i]^T for matrices with the same input width (Q/K/V, gate/up): when they share a
// kernel path the activations are quantised once and all their rows go through one parallel
// loop, one synchronisation instead of one per matrix. Bit-identical to calling matmul per
// matrix (every output element takes the same operations in the same order).
void matmul_multi(std::span<const TensorView* const> ws, std::span<float* const> ys, const float* x,
                  int64_t n_tokens, ThreadPool& pool);
// One thread's part of a product, for a parallel region that does more than one step between
// synchronisations (ThreadPool::run and barrier): rows [rows[i].b, rows[i].e) of ys[i] = x ws[i]^T
// (clamped to the matrix), with the activations prepared in the calling thread's own scratch.
// Every output element takes the same operations as in matmul_multi, so the results are the
// same bits, provided each range starts at a multiple of matmul_grain(w, n_tokens) (a packed row
// group) or at a matrix's end.
struct RowRange {
  int64_t b = 0, e = 0;
};
void matmul_rows(std::span<const TensorView* const> ws, std::span<float* const> ys, const float* x,
                 int64_t n_tokens, std::span<const RowRange> rows);
// The row granularity matmul_multi splits w's rows at over the pool's threads.
int64_t matmul_grain(const TensorView& w, int64_t n_tokens);

// Row-interleaved weights: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matrices repacked
// in groups of kPackRows rows, each block (32 columns) or superblock (256 columns, k-quants)
// holding the group's kPackRows scales (and mins) and then the rows' codes four at a time
// across the rows, so that one vector of integer dot products advances kPackRows rows at once
// and the scales multiply a vector of rows (no per-row broadcast or horizontal sum). The packed
// copy takes the bytes the file's blocks take (Q4_K and Q5_K 4 more per row and superblock:
// their 6-bit scales and mins are stored as bytes). The layout is private to this build's
// kernels and never written to a file. A matrix of any row count packs its whole groups;
// matmul takes the remaining rows from `data` with the same arithmetic:
//  - 32-blocks: per row and block, (float)(exact integer dot) * (d_w * d_x) added to the row's
//    sum with one FMA (then m * d_x * sum(x codes) with a second for Q4_1/Q5_1), in block order
//    (ggml's scalar order; the min term's d_x * sum stays f32 where ggml's Q8_1 rounds it to f16);
//  - k-quants: per row and superblock, (float)(exact integer sum_j scale_j dot_j, Q6_K's -32
//    offset included) * (d * d_x) with one FMA, then for Q4_K/Q5_K -(float)(sum_j min_j
//    bsum_j) * (dmin * d_x) with a second, in superblock order.
// F16 and BF16 matrices are packed too, column by column (lane r of a vector = row r's element
// k; groups one cache line apart): every (row, token) output is one FMA chain over the columns
// in order, on every tile shape and in the tail rows, instead of OpenBLAS's sgemm (prefill) or
// the 8-partial-sum tiles.
// Results do not depend on n_tokens or on which rows were packed. (A matrix without a packed
// copy -- fewer than kPackRows rows -- goes through the 4x4 tiles, which keep partial sums per
// row and round differently.)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
inline constexpr int64_t kPackRows = 16;  // one 512-bit vector of 32-bit lanes
#else
inline constexpr int64_t kPackRows = 8;   // one 256-bit vector
#endif
bool can_pack(DType t);
// Bytes of w's packed copy (0 when its type cannot be packed or it has no whole group).
size_t packed_bytes(const TensorView& w);
// Writes w's packed copy to dst (packed_bytes(w) bytes, 32-byte aligned).
void pack_matrix(const TensorView& w, void* dst);

// Element-wise and row kernels (contiguous f32).
void rmsnorm(const float* x, const float* weight, float* y, int64_t n, float eps);
void softmax_inplace(float* x, int64_t n);
// x[i] = exp(x[i] - m) for i < n; returns the sum (online-softmax tiles).
float exp_sub_sum(float* x, int64_t n, float m);
// Pooling along the sequence with zero padding, as SnapKV's and SpecKV's scoring (and MInference's
// vertical choice) pool a window's attention: out[j] = scale x (the max of a[i], or their sum
// divided by `kernel`) over i in [j - kernel/2, j + kernel/2] within [0, n). a must be >= 0 for
// max pooling (0 is then the identity, as the zero padding).
void pool_seq(const float* a, int64_t n, int64_t kernel, bool max_pool, float scale, float* out);
void swiglu(const float* gate, const float* up, float* out, int64_t n);  // silu(gate) * up
float dot_f32(const float* a, const float* b, int64_t n);
// out[j] = q . k[j] for j < nk; k: [nk, d] contiguous rows. Four rows at a time share each
// load of q and one horizontal reduction (scores of one query against a block of keys).
void dot_rows_f32(const float* q, const float* k, int64_t nk, int64_t d, float* out);
// The same with keys stored as f16 (raw bits), widened as they are read: widening is exact and
// the arithmetic and its order are those of dot_rows_f32, so f16 keys give the bits their f32
// copies would. d at most kMaxRowWidth.
void dot_rows_f16(const float* q, const uint16_t* k, int64_t nk, int64_t d, float* out);
// o[c] += sum_j p[j] * v[j, c] for c < dv; v: [nk, dv] rows of f32, or of f16 widened as they
// are read (same bits as their f32 copies). The attention's value accumulation over a span.
void accumulate_rows_f32(float* o, const float* p, const float* v, int64_t nk, int64_t dv);
void accumulate_rows_f16(float* o, const float* p, const uint16_t* v, int64_t nk, int64_t dv);
inline constexpr int64_t kMaxRowWidth = 512;
// Quest's page bounds over a tile of kBoundTile pages stored as 8-bit codes, channel-major
// (attention/page_bounds.h): channel c of page j has bounds m = scale[c] * mn[c * kBoundTile + j]
// and M = scale[c] * mx[c * kBoundTile + j]. For query s, out[s * kBoundTile + j] is
//   point queries (pos = max(q, 0), neg = min(q, 0)):  sum_c fma(neg m, fma(pos M, acc))
//   box queries [lo, hi]:  sum_c max(max(lo m, lo M), max(hi m, hi M))
// with max as the vector instruction takes it (the second operand when either is NaN). Four
// queries at a time share each widened channel.
inline constexpr int64_t kBoundTile = 16;
void bound_tile_points(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* pos,
                       const float* const* neg, int64_t nq, float* out);
void bound_tile_boxes(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* lo,
                      const float* const* hi, int64_t nq, float* out);
// out[j] = wide[j] ? +inf : the largest of rows[s * kBoundTile + j] over s < nq, a NaN taken
// over any number (selection treats it as +inf); j < kBoundTile, nq >= 1.
void max_bound_rows(const float* rows, int64_t nq, const uint8_t* wide, float* out);
void axpy(float a, const float* x, float* y, int64_t n);  // y += a * x
void add_inplace(float* y, const float* x, int64_t n);    // y += x
void scale_inplace(float* y, float a, int64_t n);

// Rotates the first n_rot dims of every head in place.
// x: [n_tokens, n_head, head_dim] f32; pos: [n_tokens]; inv_freq: [n_rot/2], the angle of pair
// i at position p is p * inv_freq[i]; cos and sin are multiplied by mscale (YaRN).
// neox=false rotates adjacent pairs (x[2i], x[2i+1]); neox=true rotates (x[i], x[i+n_rot/2]).
void rope_apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot,
                const int32_t* pos, const float* inv_freq, float mscale, bool neox);

}  // namespace lc::kernels
