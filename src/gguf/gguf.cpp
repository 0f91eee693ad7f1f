#include "gguf/gguf.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <limits>
#include <new>
#include <set>
#include <stdexcept>

namespace lc::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;
// Smallest possible encodings, used to bound counts by the bytes left before reserving memory:
// a kv is key length (8) + value type (4) + at least one value byte; a tensor info is name
// length (8) + n_dims (4) + one ne (8) + type (4) + offset (8).
constexpr size_t kMinKvBytes = 8 + 4 + 1;
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// Encoded size of a fixed-size value type; 0 for string/array (variable) and unknown types.
size_t fixed_size(uint32_t t) {
  switch (static_cast<ValueType>(t)) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    default: return 0;
  }
}

bool is_known_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kF64); }

bool is_int_type(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kU16: case ValueType::kI16:
    case ValueType::kU32: case ValueType::kI32: case ValueType::kU64: case ValueType::kI64:
      return true;
    default: return false;
  }
}
bool is_float_type(ValueType t) { return t == ValueType::kF32 || t == ValueType::kF64; }

// "a string", "an f32", "an array of u32": how getter errors describe what a key holds.
std::string type_phrase(const Value& v) {
  if (v.type == ValueType::kArray)
    return std::string("an array of ") + value_type_name(v.elem_type);
  const char* n = value_type_name(v.type);
  const bool vowel_sound = n[0] == 'a' || n[0] == 'i' || n[0] == 'f';  // "an f32", "an i8"
  return std::string(vowel_sound ? "an " : "a ") + n;
}

// Bounds-checked cursor over the file image. Every read checks the bytes left first, so no
// value read from the file can move it outside [0, size].
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  Status need(size_t n, const std::string& what) const {
    if (n > left())
      return make_error(fmt::format("{}: truncated: {} at offset {} needs {} bytes, only {} left",
                                    name_, what, pos_, n, left()));
    return ok_status();
  }
  Status skip(size_t n, const std::string& what) {
    LC_TRY(need(n, what));
    pos_ += n;
    return ok_status();
  }
  template <class T>
  Expected<T> read(const std::string& what) {
    LC_TRY(need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // Fast path for long string arrays: no error text is built unless the read fails.
  // Returns false (cursor unchanged) if the length or the bytes are not all there.
  bool try_read_string(std::string& out) {
    if (left() < 8) return false;
    uint64_t len;
    std::memcpy(&len, data_ + pos_, 8);
    if (len > left() - 8) return false;
    out.assign(reinterpret_cast<const char*>(data_ + pos_ + 8), static_cast<size_t>(len));
    pos_ += 8 + static_cast<size_t>(len);
    return true;
  }
  Expected<std::string> read_string(const std::string& what) {
    std::string s;
    if (try_read_string(s)) return s;
    LC_ASSIGN_OR_RETURN(uint64_t len, read<uint64_t>(what + " length"));
    return make_error(fmt::format(
        "{}: {}: string length {} at offset {} extends past the end of the file "
        "({} bytes left)",
        name_, what, len, pos_ - 8, left()));
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
};

// Reads one fixed-size scalar of type t at the cursor into v.scalar.
Status read_scalar(Cursor& c, ValueType t, Value& v, const std::string& what,
                   const std::string& file) {
  switch (t) {
    case ValueType::kU8: { LC_ASSIGN_OR_RETURN(uint8_t x, c.read<uint8_t>(what)); v.scalar = uint64_t{x}; break; }
    case ValueType::kU16: { LC_ASSIGN_OR_RETURN(uint16_t x, c.read<uint16_t>(what)); v.scalar = uint64_t{x}; break; }
    case ValueType::kU32: { LC_ASSIGN_OR_RETURN(uint32_t x, c.read<uint32_t>(what)); v.scalar = uint64_t{x}; break; }
    case ValueType::kU64: { LC_ASSIGN_OR_RETURN(uint64_t x, c.read<uint64_t>(what)); v.scalar = x; break; }
    case ValueType::kI8: { LC_ASSIGN_OR_RETURN(int8_t x, c.read<int8_t>(what)); v.scalar = int64_t{x}; break; }
    case ValueType::kI16: { LC_ASSIGN_OR_RETURN(int16_t x, c.read<int16_t>(what)); v.scalar = int64_t{x}; break; }
    case ValueType::kI32: { LC_ASSIGN_OR_RETURN(int32_t x, c.read<int32_t>(what)); v.scalar = int64_t{x}; break; }
    case ValueType::kI64: { LC_ASSIGN_OR_RETURN(int64_t x, c.read<int64_t>(what)); v.scalar = x; break; }
    case ValueType::kF32: { LC_ASSIGN_OR_RETURN(float x, c.read<float>(what)); v.scalar = double{x}; break; }
    case ValueType::kF64: { LC_ASSIGN_OR_RETURN(double x, c.read<double>(what)); v.scalar = x; break; }
    case ValueType::kBool: {
      LC_ASSIGN_OR_RETURN(uint8_t x, c.read<uint8_t>(what));
      if (x > 1)
        return make_error(fmt::format("{}: {}: invalid bool byte {} (must be 0 or 1)",
                                      file, what, x));
      v.scalar = x != 0;
      break;
    }
    case ValueType::kString: { LC_ASSIGN_OR_RETURN(std::string s, c.read_string(what)); v.scalar = std::move(s); break; }
    default: LC_CHECK(false && "read_scalar: not a scalar type");
  }
  return ok_status();
}

// Element i of a fixed-size numeric array starting at p, as int64 and double. u64 values above
// INT64_MAX are stored in `ints` as their two's-complement bit pattern; get_i32_array knows.
void decode_elem(ValueType t, const uint8_t* p, int64_t& i, double& d, bool& is_int) {
  is_int = true;
  switch (t) {
    case ValueType::kU8: { uint8_t x; std::memcpy(&x, p, 1); i = x; d = x; break; }
    case ValueType::kI8: { int8_t x; std::memcpy(&x, p, 1); i = x; d = x; break; }
    case ValueType::kBool: { uint8_t x; std::memcpy(&x, p, 1); i = x != 0; d = i; break; }
    case ValueType::kU16: { uint16_t x; std::memcpy(&x, p, 2); i = x; d = x; break; }
    case ValueType::kI16: { int16_t x; std::memcpy(&x, p, 2); i = x; d = x; break; }
    case ValueType::kU32: { uint32_t x; std::memcpy(&x, p, 4); i = x; d = x; break; }
    case ValueType::kI32: { int32_t x; std::memcpy(&x, p, 4); i = x; d = x; break; }
    case ValueType::kU64: { uint64_t x; std::memcpy(&x, p, 8); i = static_cast<int64_t>(x); d = static_cast<double>(x); break; }
    case ValueType::kI64: { int64_t x; std::memcpy(&x, p, 8); i = x; d = static_cast<double>(x); break; }
    case ValueType::kF32: { float x; std::memcpy(&x, p, 4); d = x; is_int = false; break; }
    case ValueType::kF64: { double x; std::memcpy(&x, p, 8); d = x; is_int = false; break; }
    default: LC_CHECK(false && "decode_elem: not numeric");
  }
}

Status read_value(Cursor& c, const uint8_t* base, const std::string& file,
                  const std::string& key, uint32_t type_id, Value& v) {
  const std::string what = "value of metadata key '" + key + "'";
  if (!is_known_type(type_id))
    return make_error(fmt::format("{}: metadata key '{}' has unknown value type {}",
                                  file, key, type_id));
  v.type = static_cast<ValueType>(type_id);
  if (v.type != ValueType::kArray) return read_scalar(c, v.type, v, what, file);

  LC_ASSIGN_OR_RETURN(uint32_t elem, c.read<uint32_t>("array element type of key '" + key + "'"));
  if (!is_known_type(elem))
    return make_error(fmt::format("{}: metadata key '{}' is an array of unknown value type {}",
                                  file, key, elem));
  if (static_cast<ValueType>(elem) == ValueType::kArray)
    return make_error(fmt::format("{}: metadata key '{}' is a nested array (not supported)",
                                  file, key));
  v.elem_type = static_cast<ValueType>(elem);
  LC_ASSIGN_OR_RETURN(uint64_t count, c.read<uint64_t>("array length of key '" + key + "'"));
  // Each element takes at least `min` bytes, so a count the rest of the file cannot hold is
  // rejected here, before anything is reserved.
  const size_t min = v.elem_type == ValueType::kString ? 8 : fixed_size(elem);
  if (count > c.left() / min)
    return make_error(fmt::format(
        "{}: metadata key '{}': array of {} {} elements extends past the end of the "
        "file ({} bytes left)",
        file, key, count, value_type_name(v.elem_type), c.left()));
  const size_t n = static_cast<size_t>(count);
  if (v.elem_type == ValueType::kString) {
    v.strings.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      std::string& s = v.strings.emplace_back();
      if (!c.try_read_string(s))  // build the message only on failure
        return c.read_string(fmt::format("element {} of key '{}'", i, key)).error();
    }
    return ok_status();
  }
  const uint8_t* p = base + c.pos();
  LC_TRY(c.skip(n * min, what));  // cannot fail after the count check
  if (v.elem_type == ValueType::kBool) {
    for (size_t i = 0; i < n; ++i)
      if (p[i] > 1)
        return make_error(fmt::format("{}: metadata key '{}': element {} is an invalid bool byte {}",
                                      file, key, i, p[i]));
  }
  const bool ints = is_int_type(v.elem_type) || v.elem_type == ValueType::kBool;
  v.numbers.resize(n);
  if (ints) v.ints.resize(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t iv = 0;
    double dv = 0;
    bool is_int = false;
    decode_elem(v.elem_type, p + i * min, iv, dv, is_int);
    v.numbers[i] = dv;
    if (ints) v.ints[i] = iv;
  }
  return ok_status();
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kU8: return "u8";
    case ValueType::kI8: return "i8";
    case ValueType::kU16: return "u16";
    case ValueType::kI16: return "i16";
    case ValueType::kU32: return "u32";
    case ValueType::kI32: return "i32";
    case ValueType::kF32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kU64: return "u64";
    case ValueType::kI64: return "i64";
    case ValueType::kF64: return "f64";
  }
  return "unknown";
}

}  // namespace lc::gguf

namespace lc::gguf {

size_t Value::array_size() const {
  if (type != ValueType::kArray) return 0;
  return elem_type == ValueType::kString ? strings.size() : numbers.size();
}

TensorView TensorInfo::view() const {
  TensorView v;
  v.data = data;
  v.type = type;
  for (int i = 0; i < 4; ++i) v.ne[i] = ne[i];
  return v;
}

Expected<std::unique_ptr<File>> File::open(const std::string& path) {
  LC_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  std::unique_ptr<File> f(new File());
  f->map_ = std::move(map);
  f->data_ = f->map_.data();
  f->size_ = f->map_.size();
  f->name_ = path;
  LC_TRY(f->parse_all());
  return f;
}

Expected<std::unique_ptr<File>> File::parse(const uint8_t* data, size_t size, std::string name) {
  std::unique_ptr<File> f;
  try {
    f.reset(new File());
  } catch (const std::bad_alloc&) {
    return make_error(name + ": out of memory");
  }
  f->data_ = data;
  f->size_ = data ? size : 0;
  f->name_ = std::move(name);
  LC_TRY(f->parse_all());
  return f;
}

namespace {

// Everything after the mapping is set up. Separate from parse_all so that allocation failures
// (a hostile file can still ask for as much memory as its own size) become an Error.
struct Parser {
  const uint8_t* data;
  size_t size;
  const std::string& name;
  uint32_t& version;
  size_t& alignment;
  std::map<std::string, Value>& kv;
  std::vector<std::string>& key_order;
  std::vector<TensorInfo>& tensors;
  std::map<std::string, size_t, std::less<>>& tensor_index;

  Status run() {
    const char* f = name.c_str();
    Cursor c(data, size, name);
    if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) {
      if (size < 4)
        return make_error(fmt::format("{}: not a GGUF file (only {} bytes)", f, size));
      return make_error(fmt::format("{}: not a GGUF file (magic bytes {:02x} {:02x} {:02x} {:02x}, "
                                    "expected 47 47 55 46 \"GGUF\")",
                                    f, data[0], data[1], data[2], data[3]));
    }
    LC_TRY(c.skip(4, "magic"));
    LC_ASSIGN_OR_RETURN(version, c.read<uint32_t>("version"));
    if (version == 1)
      return make_error(fmt::format("{}: GGUF version 1 is not supported (only versions 2 and 3; "
                                    "re-convert the model with a current llama.cpp)", f));
    if (version != 2 && version != 3) {
      // A big-endian GGUF stores the version byte-swapped.
      const bool swapped = version == 0x02000000u || version == 0x03000000u;
      return make_error(fmt::format("{}: unsupported GGUF version {} (expected 2 or 3){}", f,
                                    version, swapped ? "; this looks like a big-endian file" : ""));
    }
    LC_ASSIGN_OR_RETURN(uint64_t n_tensors, c.read<uint64_t>("tensor count"));
    LC_ASSIGN_OR_RETURN(uint64_t n_kv, c.read<uint64_t>("metadata count"));
    // Bound both counts by the bytes left before reserving anything.
    if (n_kv > c.left() / kMinKvBytes)
      return make_error(fmt::format("{}: metadata count {} is impossible: the {} bytes "
                                    "left in the file hold at most {} entries (truncated or "
                                    "corrupt file)",
                                    f, n_kv, c.left(), c.left() / kMinKvBytes));
    // n_kv * kMinKvBytes <= left here, so the sum cannot overflow once n_tensors is bounded.
    if (n_tensors > c.left() / kMinTensorInfoBytes ||
        n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > c.left())
      return make_error(fmt::format("{}: tensor count {} is impossible: the {} bytes "
                                    "left in the file cannot hold that many tensor infos and {} "
                                    "metadata entries (truncated or corrupt file)",
                                    f, n_tensors, c.left(), n_kv));

    key_order.reserve(static_cast<size_t>(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
      LC_ASSIGN_OR_RETURN(std::string key, c.read_string(fmt::format("key of metadata entry {}", i)));
      LC_ASSIGN_OR_RETURN(uint32_t type, c.read<uint32_t>("value type of metadata key '" + key + "'"));
      Value v;
      LC_TRY(read_value(c, data, name, key, type, v));
      if (kv.count(key))
        return make_error(fmt::format("{}: duplicate metadata key '{}'", f, key));
      key_order.push_back(key);
      kv.emplace(std::move(key), std::move(v));
    }

    if (auto it = kv.find("general.alignment"); it != kv.end()) {
      const Value& v = it->second;
      if (!is_int_type(v.type))
        return make_error(fmt::format("{}: metadata key 'general.alignment' is {}, expected an "
                                      "integer", f, type_phrase(v)));
      // Signed types are accepted like the getters do; a negative value is simply invalid.
      const auto* u = std::get_if<uint64_t>(&v.scalar);
      const int64_t sv = u ? 0 : std::get<int64_t>(v.scalar);
      const uint64_t a = u ? *u : (sv > 0 ? static_cast<uint64_t>(sv) : 0);
      if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
        return make_error(fmt::format("{}: bad general.alignment {} (must be a non-zero power of "
                                      "two, at most 2^30)",
                                      f, u ? std::to_string(*u) : std::to_string(sv)));
      alignment = static_cast<size_t>(a);
    }

    if (n_tensors > c.left() / kMinTensorInfoBytes)
      return make_error(fmt::format("{}: tensor count {} is impossible: the {} bytes "
                                    "left in the file cannot hold that many tensor infos (truncated or corrupt "
                                    "file)",
                                    f, n_tensors, c.left()));
    tensors.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
      TensorInfo t;
      LC_ASSIGN_OR_RETURN(t.name, c.read_string(fmt::format("name of tensor {}", i)));
      const std::string tn = "'" + t.name + "'";
      const char* tc = tn.c_str();
      LC_ASSIGN_OR_RETURN(uint32_t n_dims, c.read<uint32_t>("n_dims of tensor " + tn));
      if (n_dims < 1 || n_dims > kMaxDims)
        return make_error(fmt::format("{}: tensor {} has {} dimensions (must be 1 to {})", f, tc,
                                      n_dims, kMaxDims));
      t.n_dims = static_cast<int>(n_dims);
      int64_t n_elems = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        LC_ASSIGN_OR_RETURN(uint64_t ne, c.read<uint64_t>("shape of tensor " + tn));
        if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return make_error(fmt::format("{}: tensor {} has a negative dimension ne[{}] = {}",
                                        f, tc, d, static_cast<int64_t>(ne)));
        t.ne[d] = static_cast<int64_t>(ne);
        if (__builtin_mul_overflow(n_elems, t.ne[d], &n_elems))
          return make_error(fmt::format("{}: tensor {}: element count overflows (shape too large)",
                                        f, tc));
      }
      LC_ASSIGN_OR_RETURN(uint32_t type, c.read<uint32_t>("type of tensor " + tn));
      const auto tr = dtype_traits(type);
      if (!tr)
        return make_error(fmt::format("{}: tensor {} has unknown or unsupported ggml type {}", f,
                                      tc, type));
      t.type = static_cast<DType>(type);
      if (t.ne[0] % tr->block_size != 0)
        return make_error(fmt::format("{}: tensor {}: row length ne[0] = {} is not a "
                                      "multiple of the {} block size {}",
                                      f, tc, t.ne[0], tr->name, tr->block_size));
      // n_elems fits int64 and ne[0] divides by the block size, so the block count is exact.
      const uint64_t n_blocks = static_cast<uint64_t>(n_elems / tr->block_size);
      uint64_t n_bytes = 0;
      if (__builtin_mul_overflow(n_blocks, static_cast<uint64_t>(tr->block_bytes), &n_bytes) ||
          n_bytes > std::numeric_limits<size_t>::max())
        return make_error(fmt::format("{}: tensor {}: byte size overflows (shape too large)", f, tc));
      t.n_bytes = static_cast<size_t>(n_bytes);
      LC_ASSIGN_OR_RETURN(t.offset, c.read<uint64_t>("data offset of tensor " + tn));
      if (tensor_index.count(t.name))
        return make_error(fmt::format("{}: duplicate tensor name {}", f, tc));
      tensor_index.emplace(t.name, tensors.size());
      tensors.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment. A file without tensors
    // may end before it (no padding written).
    const size_t info_end = c.pos();
    const size_t data_start = info_end + (alignment - info_end % alignment) % alignment;
    const size_t data_size = data_start <= size ? size - data_start : 0;
    const uint8_t* section = data + std::min(data_start, size);
    for (auto& t : tensors) {
      const char* tc = t.name.c_str();
      if (t.offset % alignment != 0)
        return make_error(fmt::format("{}: tensor '{}' data offset {} is not a multiple "
                                      "of the alignment {}", f, tc, t.offset, alignment));
      if (t.offset > data_size || t.n_bytes > data_size - t.offset)
        return make_error(fmt::format("{}: tensor '{}' data [offset {}, {} bytes] "
                                      "extends past the end of the file (size {}, data section "
                                      "at {} holds {} bytes)",
                                      f, tc, t.offset, t.n_bytes, size, data_start, data_size));
      t.data = section + t.offset;
    }
    return ok_status();
  }
};

}  // namespace

Status File::parse_all() {
  try {
    Parser p{data_, size_, name_, version_, alignment_, kv_, key_order_, tensors_, tensor_index_};
    return p.run();
  } catch (const std::bad_alloc&) {
    return make_error(name_ + ": out of memory while reading the metadata");
  } catch (const std::length_error&) {
    return make_error(name_ + ": metadata too large");
  }
}

const Value* File::find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// Getters. Each error names the file, the key and expected vs actual type.
Expected<const Value*> File::lookup(std::string_view key) const {
  const Value* v = find(key);
  if (!v)
    return make_error(fmt::format("{}: missing metadata key '{}'", name_,
                                  key));
  return v;
}

Error File::type_error(std::string_view key, const Value& v, const char* expected) const {
  return make_error(fmt::format("{}: metadata key '{}' is {}, expected {}", name_,
                                key, type_phrase(v),
                                expected));
}

Error File::range_error(std::string_view key, const std::string& value, const char* target) const {
  return make_error(fmt::format("{}: metadata key '{}' value {} does not fit in {}",
                                name_, key,
                                value, target));
}

Expected<std::string> File::get_string(std::string_view key) const {
  LC_ASSIGN_OR_RETURN(const Value* v, lookup(key));
  if (v->type != ValueType::kString) return type_error(key, *v, "a string");
  return std::get<std::string>(v->scalar);
}

Expected<uint32_t> File::get_u32(std::string_view key) const {
  LC_ASSIGN_OR_RETURN(int64_t x, get_i64_impl(key, "an integer", true));
  if (x < 0 || x > static_cast<int64_t>(std::numeric_limits<uint32_t>::max()))
    return range_error(key, std::to_string(x), "u32");
  return static_cast<uint32_t>(x);
}

Expected<int64_t> File::get_i64(std::string_view key) const {
  return get_i64_impl(key, "an integer", false);
}

// Shared by get_u32/get_i64: the integer value as int64. A u64 above INT64_MAX is a range
// error for both callers (for u32 as well, so `for_u32` only picks the message's target).
Expected<int64_t> File::get_i64_impl(std::string_view key, const char* expected,
                                     bool for_u32) const {
  LC_ASSIGN_OR_RETURN(const Value* v, lookup(key));
  if (!is_int_type(v->type)) return type_error(key, *v, expected);
  if (const auto* u = std::get_if<uint64_t>(&v->scalar)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return range_error(key, std::to_string(*u), for_u32 ? "u32" : "i64");
    return static_cast<int64_t>(*u);
  }
  return std::get<int64_t>(v->scalar);
}

Expected<float> File::get_f32(std::string_view key) const {
  LC_ASSIGN_OR_RETURN(const Value* v, lookup(key));
  if (const auto* d = std::get_if<double>(&v->scalar)) return static_cast<float>(*d);
  if (const auto* u = std::get_if<uint64_t>(&v->scalar)) return static_cast<float>(*u);
  if (const auto* s = std::get_if<int64_t>(&v->scalar)) return static_cast<float>(*s);
  return type_error(key, *v, "a number");
}

Expected<bool> File::get_bool(std::string_view key) const {
  LC_ASSIGN_OR_RETURN(const Value* v, lookup(key));
  if (v->type != ValueType::kBool) return type_error(key, *v, "a bool");
  return std::get<bool>(v->scalar);
}

Expected<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  LC_ASSIGN_OR_RETURN(const Value* v, lookup(key));
  if (v->type != ValueType::kArray || v->elem_type != ValueType::kString)
    return type_error(key, *v, "an array of strings");
  return v->strings;
}

Expected<std::vector<float>> File::get_f32_array(std::string_view key) const {
  LC_ASSIGN_OR_RETURN(const Value* v, lookup(key));
  if (v->type != ValueType::kArray ||
      !(is_int_type(v->elem_type) || is_float_type(v->elem_type)))
    return type_error(key, *v, "a numeric array");
  return std::vector<float>(v->numbers.begin(), v->numbers.end());
}

Expected<std::vector<int32_t>> File::get_i32_array(std::string_view key) const {
  LC_ASSIGN_OR_RETURN(const Value* v, lookup(key));
  if (v->type != ValueType::kArray || !is_int_type(v->elem_type))
    return type_error(key, *v, "an integer array");
  std::vector<int32_t> out(v->ints.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = v->ints[i];
    // u64 elements above INT64_MAX are stored wrapped (negative): out of range too.
    const bool wrapped = v->elem_type == ValueType::kU64 && x < 0;
    if (wrapped || x < std::numeric_limits<int32_t>::min() ||
        x > std::numeric_limits<int32_t>::max())
      return range_error(key, fmt::format("{} at index {}",
                                          wrapped ? std::to_string(static_cast<uint64_t>(x))
                                                  : std::to_string(x), i),
                         "i32");
    out[i] = static_cast<int32_t>(x);
  }
  return out;
}

Expected<uint32_t> File::get_u32_or(std::string_view key, uint32_t dflt) const {
  return has(key) ? get_u32(key) : Expected<uint32_t>(dflt);
}
Expected<float> File::get_f32_or(std::string_view key, float dflt) const {
  return has(key) ? get_f32(key) : Expected<float>(dflt);
}
Expected<bool> File::get_bool_or(std::string_view key, bool dflt) const {
  return has(key) ? get_bool(key) : Expected<bool>(dflt);
}
Expected<std::string> File::get_string_or(std::string_view key, std::string dflt) const {
  return has(key) ? get_string(key) : Expected<std::string>(std::move(dflt));
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

template <class T>
void put_raw(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}
void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put_raw<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}
void put_type(std::vector<uint8_t>& out, ValueType t) {
  put_raw<uint32_t>(out, static_cast<uint32_t>(t));
}
void pad_to(std::vector<uint8_t>& out, size_t alignment) {
  out.resize(out.size() + (alignment - out.size() % alignment) % alignment, 0);
}

// Appends a scalar of type t taken from a double/int64/uint64 source (exact for in-range values).
template <class Src>
void put_number(std::vector<uint8_t>& out, ValueType t, Src x) {
  switch (t) {
    case ValueType::kU8: put_raw<uint8_t>(out, static_cast<uint8_t>(x)); break;
    case ValueType::kI8: put_raw<int8_t>(out, static_cast<int8_t>(x)); break;
    case ValueType::kU16: put_raw<uint16_t>(out, static_cast<uint16_t>(x)); break;
    case ValueType::kI16: put_raw<int16_t>(out, static_cast<int16_t>(x)); break;
    case ValueType::kU32: put_raw<uint32_t>(out, static_cast<uint32_t>(x)); break;
    case ValueType::kI32: put_raw<int32_t>(out, static_cast<int32_t>(x)); break;
    case ValueType::kU64: put_raw<uint64_t>(out, static_cast<uint64_t>(x)); break;
    case ValueType::kI64: put_raw<int64_t>(out, static_cast<int64_t>(x)); break;
    case ValueType::kF32: put_raw<float>(out, static_cast<float>(x)); break;
    case ValueType::kF64: put_raw<double>(out, static_cast<double>(x)); break;
    case ValueType::kBool: put_raw<uint8_t>(out, x != 0 ? 1 : 0); break;
    default: LC_CHECK(false && "put_number: not numeric");
  }
}

}  // namespace

void Writer::put(const std::string& key, std::vector<uint8_t> encoded) {
  for (auto& kv : kv_) {
    if (kv.key == key) {  // a later set replaces the value and keeps the first position
      kv.encoded = std::move(encoded);
      return;
    }
  }
  kv_.push_back(Kv{key, std::move(encoded)});
}

void Writer::set_u32(const std::string& key, uint32_t v) {
  if (key == "general.alignment") {
    if (v == 0 || (v & (v - 1)) != 0 || v > (1u << 30)) {
      fail(fmt::format("bad general.alignment {} (must be a non-zero power of two)", v));
      return;
    }
    alignment_ = v;
  }
  std::vector<uint8_t> e;
  put_type(e, ValueType::kU32);
  put_raw(e, v);
  put(key, std::move(e));
}
void Writer::set_i32(const std::string& key, int32_t v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kI32);
  put_raw(e, v);
  put(key, std::move(e));
}
void Writer::set_u64(const std::string& key, uint64_t v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kU64);
  put_raw(e, v);
  put(key, std::move(e));
}
void Writer::set_f32(const std::string& key, float v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kF32);
  put_raw(e, v);
  put(key, std::move(e));
}
void Writer::set_bool(const std::string& key, bool v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kBool);
  put_raw<uint8_t>(e, v ? 1 : 0);
  put(key, std::move(e));
}
void Writer::set_string(const std::string& key, const std::string& v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kString);
  put_string(e, v);
  put(key, std::move(e));
}
void Writer::set_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kArray);
  put_type(e, ValueType::kString);
  put_raw<uint64_t>(e, v.size());
  for (const auto& s : v) put_string(e, s);
  put(key, std::move(e));
}
void Writer::set_f32_array(const std::string& key, const std::vector<float>& v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kArray);
  put_type(e, ValueType::kF32);
  put_raw<uint64_t>(e, v.size());
  for (float x : v) put_raw(e, x);
  put(key, std::move(e));
}
void Writer::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::vector<uint8_t> e;
  put_type(e, ValueType::kArray);
  put_type(e, ValueType::kI32);
  put_raw<uint64_t>(e, v.size());
  for (int32_t x : v) put_raw(e, x);
  put(key, std::move(e));
}

void Writer::set_value(const std::string& key, const Value& v) {
  std::vector<uint8_t> e;
  put_type(e, v.type);
  if (v.type == ValueType::kArray) {
    put_type(e, v.elem_type);
    if (v.elem_type == ValueType::kString) {
      put_raw<uint64_t>(e, v.strings.size());
      for (const auto& s : v.strings) put_string(e, s);
    } else if (fixed_size(static_cast<uint32_t>(v.elem_type)) != 0) {
      const bool use_ints = !is_float_type(v.elem_type) && v.ints.size() == v.numbers.size();
      put_raw<uint64_t>(e, v.numbers.size());
      for (size_t i = 0; i < v.numbers.size(); ++i) {
        if (use_ints) put_number(e, v.elem_type, v.ints[i]);
        else put_number(e, v.elem_type, v.numbers[i]);
      }
    } else {
      fail(fmt::format("metadata key '{}': cannot write an array of {}", key,
                       value_type_name(v.elem_type)));
      return;
    }
  } else if (v.type == ValueType::kString) {
    const auto* s = std::get_if<std::string>(&v.scalar);
    if (!s) {
      fail(fmt::format("metadata key '{}': string value holds no string", key));
      return;
    }
    put_string(e, *s);
  } else if (fixed_size(static_cast<uint32_t>(v.type)) != 0) {
    if (const auto* u = std::get_if<uint64_t>(&v.scalar)) put_number(e, v.type, *u);
    else if (const auto* i = std::get_if<int64_t>(&v.scalar)) put_number(e, v.type, *i);
    else if (const auto* d = std::get_if<double>(&v.scalar)) put_number(e, v.type, *d);
    else if (const auto* b = std::get_if<bool>(&v.scalar)) put_number(e, v.type, uint64_t{*b});
    else {
      fail(fmt::format("metadata key '{}': {} value holds no number", key,
                       value_type_name(v.type)));
      return;
    }
  } else {
    fail(fmt::format("metadata key '{}': unknown value type {}", key,
                     static_cast<uint32_t>(v.type)));
    return;
  }
  if (key == "general.alignment") {
    const auto* u = std::get_if<uint64_t>(&v.scalar);
    if (!u || *u == 0 || (*u & (*u - 1)) != 0 || *u > (1u << 30)) {
      fail("bad general.alignment (must be a non-zero power of two integer)");
      return;
    }
    alignment_ = static_cast<size_t>(*u);
  }
  put(key, std::move(e));
}

void Writer::add_tensor(const std::string& name, DType type, std::vector<int64_t> ne,
                        std::vector<uint8_t> data) {
  const auto tr = dtype_traits(static_cast<uint32_t>(type));
  if (!tr) return fail(fmt::format("tensor '{}': unknown type {}", name,
                                   static_cast<uint32_t>(type)));
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims))
    return fail(fmt::format("tensor '{}': {} dimensions (must be 1 to 4)", name, ne.size()));
  int64_t n = 1;
  for (int64_t d : ne)
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      return fail(fmt::format("tensor '{}': bad shape", name));
  if (ne[0] % tr->block_size != 0)
    return fail(fmt::format("tensor '{}': ne[0] = {} is not a multiple of the {} block "
                            "size {}", name, ne[0], tr->name, tr->block_size));
  const size_t expect = static_cast<size_t>(n / tr->block_size) * tr->block_bytes;
  if (data.size() != expect)
    return fail(fmt::format("tensor '{}': {} data bytes, the shape needs {}", name,
                            data.size(), expect));
  for (const auto& t : tensors_)
    if (t.name == name) return fail(fmt::format("duplicate tensor name '{}'", name));
  tensors_.push_back(Tensor{name, type, std::move(ne), std::move(data)});
}

void Writer::fail(std::string message) {
  if (error_.empty()) error_ = std::move(message);
}

Status Writer::status() const {
  if (!error_.empty()) return make_error(error_);
  return ok_status();
}

std::vector<uint8_t> Writer::to_bytes() const {
  LC_CHECK(error_.empty() && "gguf::Writer used after an invalid set/add (see status())");
  std::vector<uint8_t> out;
  put_raw<uint32_t>(out, kMagic);
  put_raw<uint32_t>(out, 3);
  put_raw<uint64_t>(out, tensors_.size());
  put_raw<uint64_t>(out, kv_.size());
  for (const auto& kv : kv_) {
    put_string(out, kv.key);
    out.insert(out.end(), kv.encoded.begin(), kv.encoded.end());
  }
  // Offsets are relative to the data section; each tensor starts aligned, as llama.cpp's
  // and gguf-py's writers lay them out.
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(out, t.name);
    put_raw<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put_raw<uint64_t>(out, static_cast<uint64_t>(d));
    put_raw<uint32_t>(out, static_cast<uint32_t>(t.type));
    put_raw<uint64_t>(out, offset);
    offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  pad_to(out, alignment_);
  out.reserve(out.size() + offset);
  for (const auto& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    pad_to(out, alignment_);
  }
  return out;
}

Status Writer::write(const std::string& path) const {
  LC_TRY(status());
  std::vector<uint8_t> bytes;
  try {
    bytes = to_bytes();
  } catch (const std::bad_alloc&) {
    return make_error(path + ": out of memory while building the GGUF image");
  }
  // Write a temporary file next to the target and rename it, so a reader never sees a
  // half-written model and a failed write leaves any previous file intact.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return make_error(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return make_error(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
    }
    done += static_cast<size_t>(w);
  }
  int rc = ::fsync(fd);
  int e = errno;
  if (::close(fd) != 0 && rc == 0) {
    rc = -1;
    e = errno;
  }
  if (rc != 0) {
    ::unlink(tmp.c_str());
    return make_error(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return make_error(fmt::format("{}: cannot rename {} into place: {}", path,
                                  tmp, std::strerror(e)));
  }
  return ok_status();
}

}  // namespace lc::gguf
