// The observation window: the queries of the last W tokens of every layer, before RoPE, in
// the order the tokens came, whatever the chunking. Presses score the cache with it (SnapKV's
// window, TOVA's last query, SpecKV's lookahead queries); the draft of SpecPC votes with it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "core/status.h"
#include "model/forward_hooks.h"

namespace lc {

class QueryWindow {
 public:
  // Room for the last `width` queries of `n_layer` layers, `row` floats each (n_head * head_dim).
  // Forgets what it held.
  void resize(int64_t n_layer, int64_t row, int64_t width);
  int64_t width() const { return width_; }
  // Widens the window to `width` (no-op if not wider), keeping the queries it holds (SpecKV's
  // lookahead queries go on top of the prompt's).
  void grow(int64_t width);
  int64_t size() const { return n_; }  // queries held (at most width)
  void clear() { n_ = 0; }
  // Forgets the newest k queries (k <= size()): the ones before them become the newest.
  void drop_newest(int64_t k);
  // Layer il's queries of n new tokens at positions pos (the positions are taken with layer 0).
  void push(int64_t il, const float* q, const int32_t* pos, int64_t n);
  // The last m <= size() queries of layer il, oldest first: [m, row]; their positions: [m].
  const float* queries(int64_t il, int64_t m) const {
    return q_.data() + (il * width_ + (width_ - m)) * row_;
  }
  const int32_t* positions(int64_t m) const { return pos_.data() + (width_ - m); }

  void save(std::ostream& out) const;
  // Into a window of the same shape; false if the saved one differs or the stream is bad.
  bool load(std::istream& in);

 private:
  int64_t n_layer_ = 0, row_ = 0, width_ = 0, n_ = 0;
  std::vector<float> q_;      // [n_layer, width, row], right-aligned
  std::vector<int32_t> pos_;  // [width], right-aligned
};

// A hook that records the window of a context (SpecPC's draft, tests' oracles).
class QueryRecorder final : public ForwardHooks {
 public:
  QueryRecorder(int64_t n_layer, int64_t row, int64_t width) { w_.resize(n_layer, row, width); }
  const QueryWindow& window() const { return w_; }
  void on_queries(int64_t il, const float* q, const int32_t* pos, int64_t n) override { w_.push(il, q, pos, n); }
  void on_truncate(int64_t) override { w_.clear(); }

 private:
  QueryWindow w_;
};

}  // namespace lc
