// The shared engine of every fast backend (internal to src/attention): a work item is a tile
// of query rows (tokens x query heads of one GQA group, at most kMaxRows) against one KV head;
// a backend feeds it spans of that head's tokens (each inside one KV block) with the mask of
// rows that selected the span. Spans are the outer loop and rows the inner one, so every key
// and value block is loaded (and dequantised) once for all the rows of the group that use it
// (the loop order of Flash Sparse Attention). Softmax is online (Milakov & Gimelshein 2018;
// FlashAttention, Dao et al. 2022): no score matrix beyond one span.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "attention/backend.h"
#include "core/tensor.h"
#include "kv/kv_cache.h"
#include "rope/rope_table.h"

namespace lc::attn {

constexpr int64_t kMaxRows = 64;
constexpr int kMaxVariants = 3;

// A copy of the queries rotated at qpos[t] and multiplied by the score scale.
struct QueryVariant {
  const float* q = nullptr;       // [n, n_head, head_dim]
  const int32_t* qpos = nullptr;  // [n]
};

struct ExecCtx {
  const KvCache* kv = nullptr;
  int64_t il = 0, n = 0, n_head = 0, n_head_kv = 0, group = 1, d = 0, dv = 0;
  QueryVariant var[kMaxVariants];
  float* out = nullptr;       // [n, n_head, head_dim_v]
  Selection* sel = nullptr;   // non-null: record attended keys
  float* lse = nullptr;       // non-null: finish() writes each row's log-sum-exp, [n, n_head]
  // The queries are not in the cache (AttentionBackend::set_detached): each sees all of it.
  bool detached = false;
  // Tokens of a KV head holding n_head_tokens that query t sees: [0, visible).
  int64_t visible(int64_t n_head_tokens, int64_t t) const { return detached ? n_head_tokens : n_head_tokens - n + t + 1; }
};

// Tokens [t0, t0 + nt) x query heads [h0, h0 + g) of KV head hk; row r = (t - t0) * g + (h - h0).
struct Item {
  int64_t hk = 0, t0 = 0, nt = 0, h0 = 0, g = 0;
  int64_t rows() const { return nt * g; }
};

// Items covering all n tokens and heads; an item never crosses a multiple of `align` tokens
// (retrieval chunks) and holds at most max_tokens tokens (0: as many as kMaxRows allows).
std::vector<Item> make_items(const ExecCtx& c, int64_t align = 0, int64_t max_tokens = 0);

// dst = rope(q at qpos) * scale. q, dst: [n, n_head, head_dim].
void prepare_queries(const float* q, int64_t n, int64_t n_head, int64_t head_dim, const RopeTable& rt,
                     const int32_t* qpos, float scale, float* dst);

struct Span {
  int64_t first = 0;     // head token index
  int64_t count = 0;     // tokens; the span lies inside one KV block (or one thin block, Runner::cut)
  int var = 0;           // query variant
  bool unrotate = false; // use keys rotated back to position 0 (fixed-distance attention)
  uint64_t rows = ~uint64_t{0};  // bit r: row r attends the span (causality applied on top)
};

// Online-softmax state of one item; one per thread (thread_runner()).
class Runner {
 public:
  void begin(const ExecCtx& c, const Item& it);
  // lse: [rows] or null; if given, receives log(sum(exp(score))) of the span for each row that
  // attended it (-inf for the others).
  void run(const Span& s, float* lse = nullptr);
  // Splits [first, first + count) where the rows' storage breaks (block boundaries; on a head
  // with thin rows, the thin blocks' boundaries).
  void run_range(int64_t first, int64_t count, int var, bool unrotate, uint64_t rows);
  // The end of the run of stored rows that starts at `first`, at most `end`: the next block
  // boundary, or on thin rows (keys stored without dropped channels) the thin block's end. A
  // span [first, cut) is attended in one piece.
  int64_t cut(int64_t first, int64_t end) const;
  // Normalises and writes out the rows in the mask (after merging the open segment, flush()).
  void finish(uint64_t rows = ~uint64_t{0});
  // Split-K (flash-decoding): closes the segment of spans run since begin() or the last
  // flush() and merges its partial state (m, l, o) into the item's total, then starts a new
  // segment. Merging a partial exported by another thread (export_partial/merge_partial) is the
  // same operation, so a row split into segments computed in parallel and merged in order is
  // bit-identical to the same segments run one after another here.
  void flush();
  // Writes the open segment's state: per row [m, l, o[0..dv)] (partial_floats() each).
  void export_partial(float* dst) const;
  void merge_partial(const float* src);
  int64_t partial_floats() const;
  // log(sum(exp(score))) over everything the row attended so far (open segment; backends that
  // use it do not flush).
  float row_lse(int64_t r) const { return m_[r] + std::log(l_[r]); }
  // Runs [lower[t - t0], vis(r)) for every row (lower[]: per token of the item, var's queries),
  // cut where the lower bounds change so a span's rows all see all of it.
  void run_windows(const int64_t* lower, int var, uint64_t rows = ~uint64_t{0});

  int64_t rows() const { return item_.rows(); }
  uint64_t all_rows() const { return rows() == 64 ? ~uint64_t{0} : (uint64_t{1} << rows()) - 1; }
  int64_t token_of(int64_t r) const { return item_.t0 + r / item_.g; }
  int64_t head_of(int64_t r) const { return item_.h0 + r % item_.g; }
  // Tokens of the KV head row r may see: [0, vis).
  int64_t vis(int64_t r) const { return c_->visible(n_head_tokens_, token_of(r)); }
  int64_t n_head_tokens() const { return n_head_tokens_; }
  const Item& item() const { return item_; }
  const ExecCtx& ctx() const { return *c_; }

 private:
  const ExecCtx* c_ = nullptr;
  Item item_;
  int64_t n_head_tokens_ = 0;
  float m_[kMaxRows], l_[kMaxRows];  // the open segment
  float tm_[kMaxRows], tl_[kMaxRows]; // the merged segments
  Buffer<float> o_;    // [kMaxRows, dv] open segment
  Buffer<float> to_;   // [kMaxRows, dv] merged segments
  void merge_row(int64_t r, float m, float l, const float* o);
  Buffer<float> kbuf_; // [block_tokens, d]
  Buffer<float> vbuf_; // [block_tokens, dv]
  Buffer<float> sc_;   // [block_tokens]
  Buffer<float> qg_;   // [kMaxRows, d] the rows' queries reduced to a thin head's kept channels
  // A run of rows stored in one block of a head with thin rows (KvCache::stored_rows).
  void run_stored(const Span& s, uint64_t mask, const KvCache::StoredRows& p);
  // The rows' scores over K (kd channels: f32 rows, or f16 rows Kh), the online softmax and the
  // values V (or f16 Vh). thin: the queries reduced to the kept channels (qg_) are used.
  void rows_loop(const Span& s, uint64_t mask, const float* K, const uint16_t* Kh, int64_t kd, bool thin,
                 const float* V, const uint16_t* Vh, float* lse);
};

Runner& thread_runner();

// Runs spans[0..n) of the open item in order, prefetching the start of each next span.
void run_prefetched(Runner& run, const Span* spans, size_t n);
// Appends [first, first + count) to out as spans cut at KV block boundaries (all rows).
void add_spans(std::vector<Span>& out, int64_t first, int64_t count, int64_t block_tokens, int var = 0,
               bool unrotate = false);

// Grain of a parallel loop over split-K units: units of one tile append to the same rows'
// selection records, so while recording (tests, diagnostics) one thread runs them all, in the
// same order with the same merge, which changes no result.
inline int64_t unit_grain(const ExecCtx& c, int64_t n_units) { return c.sel && n_units > 1 ? n_units : 1; }

// Scores helpers shared with the selection logic of sparse backends.
float dot(const float* a, const float* b, int64_t n);
// The k-th largest of v[0, n) (1 <= k <= n; no NaN; +-inf allowed), as std::nth_element with
// std::greater would find it, in about three passes over v: values are counted into buckets
// spread evenly between the smallest and the largest finite value, and only the bucket that
// holds the k-th largest is sorted. (Quest chooses ~128 of 4,096 pages per KV head and layer
// for every decoded token at 64K.)
float kth_largest(const float* v, int64_t n, int64_t k);
// Rotates rows x: [count, head_dim] by -pos[j] (no mscale): stored keys back to position 0.
// Runs of consecutive positions use the angle-addition recurrence (one sin/cos per pair per
// run instead of per row).
void unrotate_rows(float* x, int64_t count, int64_t head_dim, const int32_t* pos, const RopeTable& rt);

}  // namespace lc::attn
