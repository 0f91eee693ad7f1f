// Little helpers for the binary state files (saved sessions): plain values and counted arrays
// in host byte order. Readers bound every count, so a corrupt file cannot ask for a huge
// allocation.
#pragma once

#include <cstdint>
#include <istream>
#include <ostream>
#include <vector>

namespace lc::bin {

template <class T>
void put(std::ostream& o, const T& v) {
  o.write(reinterpret_cast<const char*>(&v), sizeof v);
}
// A count, then the n elements at p.
template <class T>
void put_array(std::ostream& o, const T* p, size_t n) {
  put<uint64_t>(o, n);
  if (n) o.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(T)));
}
template <class T>
void put_vec(std::ostream& o, const std::vector<T>& v) {
  put_array(o, v.data(), v.size());
}
template <class T>
bool get(std::istream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof v));
}
// Reads a count (at most max_n) and that many elements into out (any container with resize()
// and data()).
template <class V>
bool get_array(std::istream& in, V& out, uint64_t max_n) {
  uint64_t n = 0;
  if (!get(in, n) || n > max_n) return false;
  out.resize(static_cast<size_t>(n));
  return n == 0 || static_cast<bool>(in.read(reinterpret_cast<char*>(out.data()),
                                             static_cast<std::streamsize>(n * sizeof(out.data()[0]))));
}

}  // namespace lc::bin
