// Page bounds of Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient
// Long-Context LLM Inference") for one KV head: per page of keys, the per-channel minimum m and
// maximum M, which bound any query's score on the page from above,
//     U(q, page) = sum_i max(q_i m_i, q_i M_i)  >=  q . k   for every key k of the page.
//
// The bounds are read for every decoded token (a sixteenth of the f16 K/V bytes at page 16), so
// their layout is made for that pass. Pages are stored in tiles of kTile: a tile holds, channel
// by channel, the kTile pages' minima and then their maxima, as f16 rounded outward (minimum
// down, maximum up, so they still bound every key). A query's bounds on a whole tile are then
// one multiply-add per channel on a vector of kTile pages, with no horizontal sum per page; for
// one query the sign of q_i picks m_i or M_i:  q_i >= 0 ? q_i M_i : q_i m_i.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lc::attn {

class PageBounds {
 public:
  static constexpr int64_t kTile = 16;

  // Empty, for keys of head_dim d.
  void reset(int64_t d);
  // Keeps pages [0, n) (new pages are unbounded until set).
  void resize(int64_t n_pages);
  int64_t size() const { return n_pages_; }
  int64_t head_dim() const { return d_; }

  // Page p bounds rows [count, d]. A key beyond the f16 range makes the stored bound infinite
  // and the page's bound meaningless (0 x inf): such a page is "wide", its bound is +inf for
  // every query, so it is always a candidate. Returns false for a wide page.
  bool set_rows(int64_t p, const float* rows, int64_t count);
  // Page p from its per-channel minima and maxima (rounded outward here).
  bool set(int64_t p, const float* mn, const float* mx);
  bool wide(int64_t p) const { return wide_[static_cast<size_t>(p)] != 0; }
  // The stored (rounded) bounds, for tests.
  float min(int64_t p, int64_t c) const;
  float max(int64_t p, int64_t c) const;

  // Bounds of pages [p0, p1) for nq queries: query s is lo[s] when hi[s] is null (Quest's bound)
  // or the box [lo[s], hi[s]] otherwise, bounded by sum_i max(lo_i m_i, lo_i M_i, hi_i m_i,
  // hi_i M_i) over every query of the box (the same value as the point form when lo == hi).
  // out[(p - p0) * nq + s], or with max_of_queries out[p - p0] = the largest over s (a NaN, from
  // a NaN query, propagates). Wide pages give +inf. Each query's value does not depend on the
  // other queries of the call.
  void bounds(const float* const* lo, const float* const* hi, int64_t nq, int64_t p0, int64_t p1, float* out,
              bool max_of_queries) const;

 private:
  const uint16_t* tile(int64_t t) const { return data_.data() + t * 2 * d_ * kTile; }
  // out[s * kTile + j]: query s on page j of tile t; a point query s comes as lo[s] = its
  // positive part, neg[s] = its negative part, hi[s] = null.
  void tile_bounds(const float* const* lo, const float* const* hi, const float* const* neg, int64_t nq, int64_t t,
                   float* out) const;

  int64_t d_ = 0, n_pages_ = 0;
  std::vector<uint16_t> data_;  // [n_tiles][2][d][kTile] f16: minima, then maxima
  std::vector<uint8_t> wide_;   // [n_pages]
};

}  // namespace lc::attn
