#include "core/dtype.h"

#include <cctype>
#include <string>

#include "core/status.h"

namespace lc {
namespace {

struct Entry {
  uint32_t id;
  DTypeTraits tr;
};

// Block sizes and byte counts follow the GGUF specification's block layouts.
constexpr Entry kTypes[] = {
    {0, {"f32", 1, 4, false}},     {1, {"f16", 1, 2, false}},
    {2, {"q4_0", 32, 18, true}},   {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},   {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},   {9, {"q8_1", 32, 36, true}},
    {10, {"q2_k", 256, 84, true}}, {11, {"q3_k", 256, 110, true}},
    {12, {"q4_k", 256, 144, true}}, {13, {"q5_k", 256, 176, true}},
    {14, {"q6_k", 256, 210, true}}, {15, {"q8_k", 256, 292, true}},
    {24, {"i8", 1, 1, false}},     {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},    {30, {"bf16", 1, 2, false}},
};

}  // namespace

std::optional<DTypeTraits> dtype_traits(uint32_t ggml_type) {
  for (const auto& e : kTypes)
    if (e.id == ggml_type) return e.tr;
  return std::nullopt;
}

const DTypeTraits& traits(DType t) {
  for (const auto& e : kTypes)
    if (e.id == static_cast<uint32_t>(t)) return e.tr;
  LC_CHECK(false && "unknown dtype");
  __builtin_unreachable();
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string lower(name);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& e : kTypes)
    if (lower == e.tr.name) return static_cast<DType>(e.id);
  return std::nullopt;
}

}  // namespace lc
