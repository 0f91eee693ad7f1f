// Non-owning typed views of tensors and a small owning, aligned buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "core/dtype.h"

namespace lc {

// ne[0] is the row length (contiguous), as in GGUF; ne[1] rows, ne[2..3] batches.
struct TensorView {
  const void* data = nullptr;
  DType type = DType::F32;
  int64_t ne[4] = {1, 1, 1, 1};
  // The same matrix in kernels::pack_matrix's row-interleaved layout, when the owner made one:
  // matmul reads it instead of `data` (same results, bit for bit). Everything else reads `data`.
  const void* packed = nullptr;

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_size() const { return lc::row_bytes(type, ne[0]); }
  const uint8_t* row(int64_t i) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(i) * row_size();
  }
  bool valid() const { return data != nullptr; }
};

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// Owning, 64-byte aligned, zero-initialised storage of `n` values of T.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) { resize(n); }
  void resize(size_t n) {
    if (n == n_) return;
    n_ = n;
    if (n == 0) {
      p_.reset();
      return;
    }
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    p_.reset(p);
  }
  T* data() { return static_cast<T*>(p_.get()); }
  const T* data() const { return static_cast<const T*>(p_.get()); }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

 private:
  std::unique_ptr<void, AlignedFree> p_;
  size_t n_ = 0;
};

}  // namespace lc
