// Element types of tensors, numbered as GGUF numbers them (ggml_type), so that a tensor's
// type read from a file maps to this enum without a table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lc {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct DTypeTraits {
  const char* name;
  int64_t block_size;   // elements per block (1 for plain types)
  size_t block_bytes;   // bytes per block
  bool quantized;
};

// Traits of a type this engine knows the layout of; nullopt for ids GGUF defines but we do not
// (or that are not valid ggml types at all).
std::optional<DTypeTraits> dtype_traits(uint32_t ggml_type);
const DTypeTraits& traits(DType t);  // t must be known
inline const char* dtype_name(DType t) { return traits(t).name; }
// Parse "f32", "q8_0", ... (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of one row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(DType t, int64_t n) {
  const auto& tr = traits(t);
  return static_cast<size_t>(n / tr.block_size) * tr.block_bytes;
}

}  // namespace lc
