// Activation quantisers shared by matmul and quantize_row (internal header). They write a
// structure-of-arrays layout (all int8 values of a row contiguous, scales apart) so that the
// dot-product kernels load activations with plain aligned-stride vector loads; the values are
// bit-identical to what ref::quantize_row_q8_0 / _q8_1 / _q8_k produce.
#pragma once

#include <cstdint>

namespace lc::kernels::detail {

// n a multiple of 32. qs: [n]; d: [n/32] (the f16-rounded scale, as a float);
// sum: [n/32] (sum of the block's q).
void quantize_q8_32(const float* x, int8_t* qs, float* d, int32_t* sum, int64_t n);
// Q8_1's s (d * sum) is formed by the caller from d and sum, in f32 (not rounded to f16 as in
// ggml's Q8_1 block), so the min term stays exact up to float rounding.
// n a multiple of 256. qs: [n]; d: [n/256]; bsums: [n/16].
void quantize_q8_k(const float* x, int8_t* qs, float* d, int16_t* bsums, int64_t n);

}  // namespace lc::kernels::detail
