// GGUF v2/v3 reader (memory-mapped, every offset, size and count validated against the file)
// and writer. Spec: ggml's docs/gguf.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace lc::gguf {

enum class ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* value_type_name(ValueType t);

// A metadata value. Integers of any width are kept as int64/uint64, floats as double; arrays
// keep their element type and hold numbers or strings.
struct Value {
  ValueType type = ValueType::kU8;
  ValueType elem_type = ValueType::kU8;  // for arrays
  std::variant<std::monostate, uint64_t, int64_t, double, bool, std::string> scalar;
  std::vector<std::string> strings;  // string arrays
  std::vector<double> numbers;       // numeric arrays (exact for |ints| < 2^53)
  std::vector<int64_t> ints;         // integer arrays (exact)
  size_t array_size() const;
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] = row length
  uint64_t offset = 0;           // relative to the data section
  const uint8_t* data = nullptr; // inside the mapping
  size_t n_bytes = 0;
  TensorView view() const;
};

class File {
 public:
  // Maps and validates the file. Errors name the file and the problem.
  static Expected<std::unique_ptr<File>> open(const std::string& path);
  // Parses an in-memory buffer (fuzzing, tests); the buffer must outlive the File.
  static Expected<std::unique_ptr<File>> parse(const uint8_t* data, size_t size,
                                               std::string name = "<memory>");

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }

  const std::map<std::string, Value>& metadata() const { return kv_; }
  // Metadata keys in file order (metadata() is sorted); lets a file be re-written as it was.
  const std::vector<std::string>& keys() const { return key_order_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters; an error names the key, the file and what was expected. Any integer type
  // converts if the value fits; float getters accept any numeric type.
  Expected<std::string> get_string(std::string_view key) const;
  Expected<uint32_t> get_u32(std::string_view key) const;
  Expected<int64_t> get_i64(std::string_view key) const;
  Expected<float> get_f32(std::string_view key) const;
  Expected<bool> get_bool(std::string_view key) const;
  Expected<std::vector<std::string>> get_string_array(std::string_view key) const;
  Expected<std::vector<float>> get_f32_array(std::string_view key) const;
  Expected<std::vector<int32_t>> get_i32_array(std::string_view key) const;
  // Defaults when the key is absent (a present key of the wrong type is still an error).
  Expected<uint32_t> get_u32_or(std::string_view key, uint32_t dflt) const;
  Expected<float> get_f32_or(std::string_view key, float dflt) const;
  Expected<bool> get_bool_or(std::string_view key, bool dflt) const;
  Expected<std::string> get_string_or(std::string_view key, std::string dflt) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Gives back the memory of mapped tensor bytes the caller has copied elsewhere (a read
  // afterwards maps them from the file again); a no-op for an in-memory buffer.
  void release(const void* p, size_t n) const { map_.release(p, n); }

 private:
  File() = default;
  Status parse_all();
  Expected<const Value*> lookup(std::string_view key) const;
  Expected<int64_t> get_i64_impl(std::string_view key, const char* expected, bool for_u32) const;
  Error type_error(std::string_view key, const Value& v, const char* expected) const;
  Error range_error(std::string_view key, const std::string& value, const char* target) const;

  MappedFile map_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, Value> kv_;
  std::vector<std::string> key_order_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF v3 file. Keys are written in the order first set (setting a key again replaces
// its value); tensors in the order added, each aligned to general.alignment (default 32).
// Invalid input (bad shape, data size, duplicate tensor, bad alignment) is recorded: status()
// and write() return the first such error, to_bytes() must not be called then.
class Writer {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // Any value as read by File, with its exact type (copying metadata from another file).
  void set_value(const std::string& key, const Value& v);
  // ne[0] is the row length; `data` holds row_bytes(type, ne[0]) * rows bytes.
  void add_tensor(const std::string& name, DType type, std::vector<int64_t> ne,
                  std::vector<uint8_t> data);
  Status status() const;
  // Writes to a temporary file next to `path`, then renames it into place.
  Status write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;

 private:
  struct Kv {
    std::string key;
    std::vector<uint8_t> encoded;  // type + value, already serialised
  };
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  void put(const std::string& key, std::vector<uint8_t> encoded);
  void fail(std::string message);
  std::vector<Kv> kv_;
  std::vector<Tensor> tensors_;
  size_t alignment_ = 32;
  std::string error_;
};

}  // namespace lc::gguf
