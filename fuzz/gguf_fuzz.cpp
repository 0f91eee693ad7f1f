// libFuzzer target for the GGUF reader: any byte string must parse or fail with an Error,
// never crash, hang or allocate without bound. On success every tensor's data range and every
// metadata value is read, so an out-of-range pointer or bad bookkeeping shows up under ASan.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <variant>

#include "gguf/gguf.h"

namespace {

volatile uint64_t g_sink;  // keeps the reads below from being optimised away

uint64_t touch(const lc::gguf::Value& v) {
  uint64_t h = static_cast<uint64_t>(v.type) + v.array_size();
  if (const auto* s = std::get_if<std::string>(&v.scalar)) h += s->size() ? uint8_t((*s)[0]) : 0;
  if (const auto* u = std::get_if<uint64_t>(&v.scalar)) h += *u;
  if (const auto* i = std::get_if<int64_t>(&v.scalar)) h += static_cast<uint64_t>(*i);
  if (const auto* d = std::get_if<double>(&v.scalar)) h += *d == 0.0;
  if (const auto* b = std::get_if<bool>(&v.scalar)) h += *b;
  for (const auto& s : v.strings) h += s.size();
  for (double d : v.numbers) h += d > 0;
  for (int64_t i : v.ints) h += static_cast<uint64_t>(i);
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = lc::gguf::File::parse(data, size, "fuzz.gguf");
  if (!f) {
    // Errors must name the file.
    if (f.error().message.rfind("fuzz.gguf: ", 0) != 0) __builtin_trap();
    return 0;
  }
  const lc::gguf::File& file = **f;
  uint64_t h = file.alignment() + file.version();
  for (const auto& [key, v] : file.metadata()) {
    h += key.size() + touch(v);
    // The typed getters must never fail in any way other than returning an Error.
    h += file.get_u32(key).has_value() + file.get_i64(key).has_value() +
         file.get_f32(key).has_value() + file.get_bool(key).has_value() +
         file.get_string(key).has_value() + file.get_string_array(key).has_value() +
         file.get_f32_array(key).has_value() + file.get_i32_array(key).has_value();
  }
  if (file.keys().size() != file.metadata().size()) __builtin_trap();
  for (const auto& t : file.tensors()) {
    if (t.n_bytes > 0) {
      // The whole range must lie inside the input buffer.
      if (t.data < data || t.data + t.n_bytes > data + size) __builtin_trap();
      h += t.data[0] + t.data[t.n_bytes - 1];
      for (size_t i = 0; i < t.n_bytes; i += 4096) h += t.data[i];
    }
    const lc::TensorView v = t.view();
    if (v.n_elements() > 0 && v.row_size() * static_cast<size_t>(v.n_rows()) != t.n_bytes)
      __builtin_trap();
    if (file.find_tensor(t.name) != &t) __builtin_trap();
  }
  g_sink = h;
  return 0;
}
