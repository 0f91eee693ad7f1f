#include "model/query_window.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/binary_io.h"

namespace lc {

void QueryWindow::resize(int64_t n_layer, int64_t row, int64_t width) {
  n_layer_ = n_layer;
  row_ = row;
  width_ = width;
  n_ = 0;
  q_.assign(static_cast<size_t>(n_layer * width * row), 0.0f);
  pos_.assign(static_cast<size_t>(width), 0);
}

void QueryWindow::grow(int64_t width) {
  if (width <= width_) return;
  const int64_t add = width - width_;
  std::vector<float> q(static_cast<size_t>(n_layer_ * width * row_), 0.0f);
  std::vector<int32_t> pos(static_cast<size_t>(width), 0);
  for (int64_t il = 0; il < n_layer_; ++il)
    std::copy_n(q_.data() + il * width_ * row_, width_ * row_, q.data() + (il * width + add) * row_);
  std::copy_n(pos_.data(), width_, pos.data() + add);
  q_ = std::move(q);
  pos_ = std::move(pos);
  width_ = width;
}

void QueryWindow::drop_newest(int64_t k) {
  k = std::min(k, n_);
  if (k <= 0) return;
  for (int64_t il = 0; il < n_layer_; ++il) {
    float* buf = q_.data() + il * width_ * row_;
    std::memmove(buf + k * row_, buf, static_cast<size_t>((width_ - k) * row_) * sizeof(float));
  }
  std::memmove(pos_.data() + k, pos_.data(), static_cast<size_t>(width_ - k) * sizeof(int32_t));
  n_ -= k;
}

// Right-aligned: the newest query is always last, so the press reads the latest tokens
// whatever the chunking.
void QueryWindow::push(int64_t il, const float* q, const int32_t* pos, int64_t n) {
  if (width_ == 0) return;
  const int64_t w = width_, take = std::min(n, w);
  float* buf = q_.data() + il * w * row_;
  std::memmove(buf, buf + take * row_, static_cast<size_t>((w - take) * row_) * sizeof(float));
  std::memcpy(buf + (w - take) * row_, q + (n - take) * row_, static_cast<size_t>(take * row_) * sizeof(float));
  if (il == 0) {
    std::memmove(pos_.data(), pos_.data() + take, static_cast<size_t>(w - take) * sizeof(int32_t));
    std::memcpy(pos_.data() + (w - take), pos + (n - take), static_cast<size_t>(take) * sizeof(int32_t));
    n_ = std::min(w, n_ + n);
  }
}

void QueryWindow::save(std::ostream& out) const {
  bin::put<int64_t>(out, width_);
  bin::put<int64_t>(out, n_);
  bin::put_vec(out, q_);
  bin::put_vec(out, pos_);
}

bool QueryWindow::load(std::istream& in) {
  int64_t width = 0, n = 0;
  if (!bin::get(in, width) || !bin::get(in, n) || width != width_ || n < 0 || n > width_) return false;
  std::vector<float> q;
  std::vector<int32_t> pos;
  if (!bin::get_array(in, q, q_.size()) || q.size() != q_.size() || !bin::get_array(in, pos, pos_.size()) ||
      pos.size() != pos_.size())
    return false;
  q_ = std::move(q);
  pos_ = std::move(pos);
  n_ = n;
  return true;
}

}  // namespace lc
