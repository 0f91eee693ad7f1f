// Page bounds of Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient
// Long-Context LLM Inference") for one KV head: per page of keys, the per-channel minimum m and
// maximum M, which bound any query's score on the page from above,
//     U(q, page) = sum_i max(q_i m_i, q_i M_i)  >=  q . k   for every key k of the page.
//
// The bounds are read for every decoded token, so their layout and size are made for that pass.
// Pages are stored in tiles of kTile pages. A tile holds, per channel i, a scale s_i and the
// kTile pages' m_i and M_i as 8-bit integers times s_i, rounded outward (m down, M up), so they
// still bound every key: a quarter of the bytes of f32 bounds and a little over half of f16
// (at 16-token pages and f16 keys, 1/14 of the K bytes instead of 1/8). The paper keeps f16
// bounds; the outward rounding only loosens each channel's bound by at most s_i, 1/127 of the
// tile's largest |bound| in that channel.
//
// A query's bounds on a whole tile are one multiply-add per channel on a vector of kTile pages,
// with no horizontal sum per page: for one query the sign of q_i picks m_i or M_i,
// q_i >= 0 ? q_i M_i : q_i m_i.
//
// Pages are set in increasing order. The exact bounds of the last tile that was set are kept,
// so its scales can grow as its pages fill without loosening the pages already stored.
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
  int64_t size() const { return n_pages_; }
  int64_t head_dim() const { return d_; }

  // The caller is about to recompute pages [p, ...): returns the first page it must set, p or
  // the first page of p's tile (when the exact bounds of that tile are not kept), and drops
  // the pages from there on. Then resize and set the pages in order.
  int64_t restart(int64_t p);
  // Holds pages [0, n); n >= size() (shrink with restart).
  void resize(int64_t n_pages);

  // Page p bounds rows [count, d]. Pages must be set in increasing order from restart(). A
  // key that is not finite makes the page "wide": its bound is +inf for every query, so it is
  // always a candidate. Returns false for a wide page.
  bool set_rows(int64_t p, const float* rows, int64_t count);
  // Page p from its per-channel minima and maxima.
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
  // A tile: float scale[d], then int8 q[2][d][kTile] (minima, then maxima).
  int64_t tile_bytes() const { return d_ * static_cast<int64_t>(sizeof(float)) + 2 * d_ * kTile; }
  const uint8_t* tile(int64_t t) const { return data_.data() + t * tile_bytes(); }
  uint8_t* tile(int64_t t) { return data_.data() + t * tile_bytes(); }
  // Re-encodes channel c of the open tile from its exact bounds with the given scale.
  void encode_channel(int64_t c, float scale);
  // out[s * kTile + j]: query s on page j of tile t; a point query s comes as lo[s] = its
  // positive part, neg[s] = its negative part, hi[s] = null.
  void tile_bounds(const float* const* lo, const float* const* hi, const float* const* neg, int64_t nq, int64_t t,
                   float* out) const;

  int64_t d_ = 0, n_pages_ = 0;
  std::vector<uint8_t> data_;   // [n_tiles] tiles
  std::vector<uint8_t> wide_;   // [n_pages]
  int64_t open_ = -1;           // the tile whose exact bounds are kept
  std::vector<float> exact_;    // [2][d][kTile] its pages' exact minima and maxima (0: not set)
  std::vector<float> absmax_;   // [d] the largest |bound| seen in each channel of the open tile
};

}  // namespace lc::attn
