// Paged KV cache (as in vLLM's PagedAttention, Kwon et al. 2023): storage is a pool of
// fixed-size blocks of `block_tokens` tokens; every (layer, KV head) has its own block table,
// so heads hold different numbers of tokens for real (what per-head KV compression needs).
// Metadata (the position a key is rotated at, the token's index in the sequence, its sequence
// id) lives in per-head arrays apart from storage. Only this class mutates storage: presses and
// attention methods call retain()/truncate()/shift_positions(), never write blocks.
//
// Memory grows a block at a time with the context actually used. --kv-budget caps the RAM the
// blocks take; when the cap is reached the policy applies: spill cold blocks to a file
// (--kv-spill DIR), let the attention method evict (an evictor callback), or fail with an
// error that says how many tokens fit. Never an out-of-memory kill.
//
// KEY FORM: keys are stored POST-RoPE (rotated at the position recorded in positions()), with
// exact re-rotation support. Why:
//  * The hot loop of every backend is q.k over stored keys; pre-RoPE storage would rotate every
//    cached key on every forward (sin/cos or table loads + 2 extra FMAs per element, O(L*d) per
//    token per layer), which would make dense attention slower than the contiguous kernel.
//  * Re-assigning positions is exact without touching keys: RoPE scores depend only on
//    q_pos - k_pos, so a backend that relabels a contiguous run of keys (StreamingLLM) rotates
//    the *query* at the relabelled position instead (one rotation per query, no rounding of
//    stored keys). A press that really moves keys calls shift_positions(), which rotates the
//    stored keys by the position delta (a K-shift, as llama.cpp does): R(p+Δ) = R(Δ)R(p).
//  * Dynamic NTK (a table that depends on the current length): when the provider returns a
//    different table for the new length, every stored key of the layer is re-rotated from the
//    old table to the new one (angle p*(θ'_i - θ_i), scale m'/m), so no key drifts. The cost
//    is O(tokens * head_dim) per table change: a provider should change its table in steps,
//    not every token, especially with quantised K (each re-rotation rounds again).
//  * Methods that want a key without its rotation (InfLLM's fixed distance) un-rotate the few
//    keys they retrieve: R(-p) applied to a stored key gives mscale * k.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kv/block_pool.h"
#include "rope/rope_table.h"

namespace lc {

class KvCache;

// Tokens taken out of a KvCache by KvCache::extract() (Sculptor's "hide a fragment", see
// model/context.h), to be put back with KvCache::insert(). Per (layer, KV head) it holds the
// tokens of the range that head still held (a head that had evicted some holds fewer), their
// metadata, and their key and value rows exactly as stored (the raw bytes of type_k/type_v: an
// f16 or q8_0 cache round-trips bit-exactly; nothing is recomputed). Keys stay rotated with the
// table of their layer at extraction time (rope[il]); insert() re-rotates them if the layer's
// table has changed since (dynamic NTK), which is then exact up to the storage's rounding.
struct KvFragment {
  struct Head {
    std::vector<int32_t> pos, idx, seq;  // [n] position, sequence index (ascending), sequence id
    std::vector<uint8_t> k, v;           // [n * row bytes of type_k / type_v]
    int64_t n() const { return static_cast<int64_t>(idx.size()); }
  };
  // What insert() validates against the cache.
  int64_t n_layer = 0, n_head_kv = 0, head_dim = 0, head_dim_v = 0, block_tokens = 0;
  DType type_k = DType::F32, type_v = DType::F32;
  int64_t first_seq = 0, count = 0;  // the range of sequence indices extracted
  std::vector<RopeTable> rope;       // [n_layer] the table the keys are rotated with
  std::vector<Head> heads;           // [n_layer * n_head_kv]

  const Head& head(int64_t il, int64_t h) const { return heads[static_cast<size_t>(il * n_head_kv + h)]; }
  Head& head(int64_t il, int64_t h) { return heads[static_cast<size_t>(il * n_head_kv + h)]; }
  int64_t n_tokens() const;  // over every layer and head
  size_t bytes() const;      // rows and metadata held
  // Forgets the tokens whose sequence index is >= n_seq (the sequence was truncated into the
  // range); count shrinks to match.
  void drop_from(int64_t n_seq);
};

// Gives the rope table for a context of n_ctx tokens (dynamic NTK); nullptr: the fixed table.
using RopeProvider = std::function<RopeTable(int64_t n_ctx)>;
// Called when an append needs `blocks_needed` more blocks than the budget allows, for layer
// il; it may free blocks through the cache's own API (retain/truncate). The append fails
// with the budget error if not enough room results.
using KvEvictor = std::function<Status(KvCache& kv, int64_t il, int64_t blocks_needed)>;

enum class KvBudgetPolicy {
  kError,  // fail with the number of tokens that fit
  kSpill,  // cold blocks to the spill file (needs spill_dir)
  kEvict,  // ask the evictor (the attention backend), then fail if still no room
};

struct KvCacheConfig {
  int64_t n_layer = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;      // of keys
  int64_t head_dim_v = 0;    // of values
  int64_t block_tokens = 16; // --kv-block
  DType type_k = DType::F32; // --kv-type-k: f32, f16, bf16, q8_0
  DType type_v = DType::F32; // --kv-type-v
  int64_t budget_bytes = 0;  // --kv-budget, RAM for blocks; 0: no cap
  bool budget_is_default = false;  // the cap was not given but derived from free memory (-c 0)
  std::string spill_dir;     // --kv-spill; required by kSpill
  KvBudgetPolicy policy = KvBudgetPolicy::kError;  // kSpill is chosen when spill_dir is set
  RopeTable rope;            // the table keys are rotated with
  RopeProvider rope_provider;  // optional: table per current length (dynamic NTK)
  // With a provider: true re-rotates held keys to each new table; false leaves them with the
  // table they were appended with (mixed_rope() then says whether tables differ).
  bool rope_rerotate = true;
  // A pool shared with other caches of the same shape and types (the server's slots): its
  // budget and spill tier are then the caches' together, and budget_bytes / spill_dir are
  // ignored. Only one thread at a time may use the caches that share a pool.
  std::shared_ptr<BlockPool> pool;
};

struct KvMemory {
  size_t resident_bytes = 0;   // RAM committed to blocks (in use or free in the pool)
  size_t in_use_bytes = 0;     // blocks holding tokens, RAM + spilled
  size_t spilled_bytes = 0;    // blocks in the spill file
  size_t metadata_bytes = 0;   // positions, indices, sequence ids, block tables
  size_t bytes_per_token = 0;  // K + V storage of one token over all layers and KV heads
  int64_t blocks_in_use = 0, blocks_free = 0, blocks_spilled = 0;
  int64_t blocks_shared = 0;  // held blocks another cache also holds (adopt_prefix)
  // With a pool of its own the figures are the pool's; with a shared pool (KvCacheConfig::pool)
  // they are this cache's blocks (a shared block counts in each cache that holds it), and the
  // pool's totals are read from the pool.
};

class KvCache {
 public:
  static Expected<std::unique_ptr<KvCache>> create(const KvCacheConfig& cfg);
  // Gives every block back to the pool (which may be shared and outlive the cache).
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Appends n tokens to every KV head of layer il. Keys are rotated here at pos[t] (they
  // arrive pre-RoPE) and stored in type_k; values in type_v.
  // k: [n, n_head_kv, head_dim] pre-RoPE; v: [n, n_head_kv, head_dim_v]; pos: [n].
  // On error (budget) the cache is unchanged.
  Status append(int64_t il, int64_t n, const float* k, const float* v, const int32_t* pos,
                int32_t seq_id = 0);

  // Keeps the tokens keep[] (ascending, unique indices into head (il, h)'s tokens), in order,
  // and returns the blocks no longer needed to the pool.
  Status retain(int64_t il, int64_t h, std::span<const int32_t> keep);
  // Drops every token whose sequence index is >= n_seq, in all layers and heads.
  void truncate(int64_t n_seq);
  void clear() { truncate(0); }
  // Adds delta to the positions of tokens [first, first + count) of head (il, h), re-rotating
  // their stored keys (a K-shift).
  Status shift_positions(int64_t il, int64_t h, int64_t first, int64_t count, int32_t delta);
  // Sets key channels `channels` (each in [0, head_dim)) of every held token of head (il, h) to
  // zero (ThinK's channel pruning): each row is dequantised, zeroed and stored again in type_k.
  Status zero_key_channels(int64_t il, int64_t h, std::span<const int32_t> channels);
  // ThinK's channel pruning with the channels dropped from storage: every token head (il, h)
  // holds is stored again without key channels `channels`, in blocks of the same pool that hold
  // more tokens each ("thin" blocks), and the head's old blocks go back to the pool. Every read
  // (keys_f32, read_keys, attention) gives the dropped channels as zeros, so for f32, f16 and
  // bf16 keys the values read are bit for bit those of zero_key_channels. q8_0 keys are
  // quantised again over the kept channels, in groups of 32 (zero-padded). Tokens appended later
  // keep every channel (they go into ordinary blocks after the thin ones). Returns how many
  // blocks the head gave back (0: nothing was dropped from storage; the channels were zeroed
  // in place instead). That happens when storing without them saves no block (a q8_0 head that
  // keeps more than head_dim - 32 channels), when the layer's keys follow a dynamic rope table
  // (re-rotation needs every channel), when the budget has no room for the new blocks while
  // the old ones are still held, or when blocks are shared with another cache. Operations that
  // rewrite keys through every channel (shift_positions, extract/insert, a second drop) first
  // store the head's keys with every channel again (zeros in the dropped ones); write_state
  // saves them so.
  Expected<int64_t> drop_key_channels(int64_t il, int64_t h, std::span<const int32_t> channels);
  // Tokens of head (il, h) stored without their dropped key channels (0: none).
  int64_t n_thin(int64_t il, int64_t h) const { return head(il, h).n_thin; }
  // The channels a thin row stores, ascending (then zero padding up to its k_dim).
  std::span<const int32_t> kept_channels(int64_t il, int64_t h) const { return head(il, h).kept; }
  // The most rows one stored_rows() run of head (il, h) holds: a thin block's token count where
  // it has thin rows and that is larger, block_tokens() otherwise.
  int64_t max_run_tokens(int64_t il, int64_t h) const {
    const Head& hd = head(il, h);
    return hd.n_thin > 0 ? std::max(cfg_.block_tokens, hd.thin_tokens) : cfg_.block_tokens;
  }
  // Rows as stored: the longest run of rows [first, first + count), count <= max_count, that
  // lie one after another in one block. Keys are rows of k_dim channels of type_k (on a thin run
  // the kept channels, zero-padded to the type's block; head_dim otherwise), values rows of
  // head_dim_v of type_v. For attention over thin rows without expanding them.
  struct StoredRows {
    int64_t count = 0;
    bool thin = false;
    int64_t k_dim = 0;
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;
  };
  StoredRows stored_rows(int64_t il, int64_t h, int64_t first, int64_t max_count) const;
  // The length a rope provider is asked for is at least this (the length the current decode
  // call reaches, so a prompt evaluated in chunks gets its whole length's table).
  void set_rope_length_hint(int64_t n) { rope_length_hint_ = n; }
  // Held keys were rotated with different tables (a provider without re-rotation): operations
  // that rotate stored keys back or on with one table are refused.
  bool mixed_rope() const { return mixed_rope_; }
  // Re-rotates every stored key of layer il to `table` (a rope change, e.g. dynamic NTK).
  void set_rope(int64_t il, const RopeTable& table);
  void set_evictor(KvEvictor e) { evictor_ = std::move(e); }

  // ---- hiding and restoring a fragment (Sculptor: model/context.h Context::hide) ----
  // Takes out of every layer and head the tokens whose sequence index is in
  // [first_seq, first_seq + count) and returns them (rows as stored, metadata). The tokens that
  // remain keep their order; blocks no longer needed go back to the pool; the epoch of every
  // head that lost a token moves on (backends rebuild their summaries). n_appended() does not
  // change: sequence indices are never reused. Error (cache unchanged) for an empty range or
  // one beyond the tokens appended to some layer.
  Expected<KvFragment> extract(int64_t first_seq, int64_t count);
  // Puts a fragment back: each head's rows are merged into its tokens in sequence-index order
  // (tokens appended after the extraction stay after it). The epoch of every head that got a
  // token moves on. Errors, with the cache unchanged: the fragment's shape, block size or
  // storage types differ from the cache's; it is malformed; one of its sequence indices is
  // already held by the head (inserted twice) or lies at or beyond n_appended() (the sequence
  // was truncated since); the budget cannot take the blocks it needs (the evictor is not
  // asked: a restore must not make the cache drop other tokens behind the caller's back).
  Status insert(const KvFragment& frag);

  // ---- sharing a prefix between caches (the server's slots) ----
  // Takes the full blocks of the first n_seq tokens of `src` by reference (no copy): every
  // head gets src's first floor(n_seq / block_tokens) blocks, their metadata, and the count of
  // tokens appended becomes that many tokens. Returns the tokens taken (0 when n_seq is below
  // one block). A shared block is never written: whichever cache changes it first (eviction,
  // a K-shift, hiding, a write into a block a truncation left partly filled) copies it first.
  // Errors, with this cache unchanged: not the same pool, shape, block size or types; this
  // cache is not empty; a dynamic rope table on either; a head of src that does not hold those
  // tokens as sequence indices 0.. (a method evicted some).
  Expected<int64_t> adopt_prefix(const KvCache& src, int64_t n_seq);

  // ---- read access (attention backends) ----
  const KvCacheConfig& config() const { return cfg_; }
  int64_t n_layer() const { return cfg_.n_layer; }
  int64_t n_head_kv() const { return cfg_.n_head_kv; }
  int64_t head_dim() const { return cfg_.head_dim; }
  int64_t head_dim_v() const { return cfg_.head_dim_v; }
  int64_t block_tokens() const { return cfg_.block_tokens; }
  DType type_k() const { return cfg_.type_k; }
  DType type_v() const { return cfg_.type_v; }
  const RopeTable& rope(int64_t il) const { return rope_[static_cast<size_t>(il)]; }
  // Tokens appended to layer il so far (its sequence length), evicted ones included.
  int64_t n_appended(int64_t il) const { return n_appended_[static_cast<size_t>(il)]; }

  // Tokens held by head (il, h), in sequence order.
  int64_t n_tokens(int64_t il, int64_t h) const { return head(il, h).n; }
  int64_t n_blocks(int64_t il, int64_t h) const {
    return static_cast<int64_t>(head(il, h).blocks.size());
  }
  // [n_tokens] the position each stored key is rotated at.
  const int32_t* positions(int64_t il, int64_t h) const { return head(il, h).pos.data(); }
  // [n_tokens] the token's index in the sequence (append order; strictly increasing).
  const int32_t* seq_index(int64_t il, int64_t h) const { return head(il, h).idx.data(); }
  // [n_tokens] sequence ids.
  const int32_t* seq_ids(int64_t il, int64_t h) const { return head(il, h).seq.data(); }
  // Changes whenever tokens already held by (il, h) change (retain, shift, rope change):
  // backends that keep summaries of the keys (Quest bounds, kernel means) rebuild.
  uint64_t epoch(int64_t il, int64_t h) const { return head(il, h).epoch; }
  // Truncation only drops a tail, so it does not change the epoch: summaries of the tokens
  // that remain stay valid. The lowest token count truncate() left on (il, h) since the last
  // call (INT64_MAX: none) tells a backend from where to rebuild; reading it resets it. One
  // consumer per cache: the attached attention backend.
  int64_t low_water(int64_t il, int64_t h) const { return head(il, h).low_water; }  // without resetting
  int64_t take_low_water(int64_t il, int64_t h) {
    Head& hd = head(il, h);
    const int64_t lw = hd.low_water;
    hd.low_water = INT64_MAX;
    return lw;
  }

  // Rows [first, first + count) of head (il, h) as f32; they must lie in one block.
  // Returns a pointer into storage (f32, no copy) or into scratch, dequantised.
  // keys: [count, head_dim], post-RoPE; values: [count, head_dim_v].
  // scratch: [count * head_dim] (keys) / [count * head_dim_v] (values).
  const float* keys_f32(int64_t il, int64_t h, int64_t first, int64_t count, float* scratch) const;
  const float* values_f32(int64_t il, int64_t h, int64_t first, int64_t count, float* scratch) const;
  // The same rows in storage when it holds f16 ([count, head_dim(_v)] half floats, contiguous
  // within a block), for kernels that convert as they read; nullptr for any other type.
  const uint16_t* keys_f16(int64_t il, int64_t h, int64_t first) const;
  const uint16_t* values_f16(int64_t il, int64_t h, int64_t first) const;
  // Asks for the key and value bytes of rows [first, first + count) (inside one block) to be
  // brought into cache ahead of use. A hint only: it changes no result and never faults.
  void prefetch(int64_t il, int64_t h, int64_t first, int64_t count) const;
  // Any rows, any blocks, copied out as f32 (tests, summaries). out: [count, head_dim(_v)].
  void read_keys(int64_t il, int64_t h, int64_t first, int64_t count, float* out) const;
  void read_values(int64_t il, int64_t h, int64_t first, int64_t count, float* out) const;

  // ---- saving and restoring (runtime::Session) ----
  // Writes what the cache holds: per layer its rope table and tokens appended, per (layer,
  // head) the token metadata and the key and value rows exactly as stored (no conversion).
  Status write_state(std::ostream& out) const;
  // Reads write_state()'s output into this cache, which must have the same shape, block size
  // and storage types; what it held before is dropped. Summaries built over the old content
  // are invalidated (epochs move on). A malformed or truncated stream gives an error and an
  // empty cache.
  Status read_state(std::istream& in);

  // ---- accounting ----
  KvMemory memory() const;
  const BlockPool& pool() const { return *pool_; }
  // Tokens per head that fit in the budget (uniform over layers and heads); -1 if no cap.
  int64_t tokens_that_fit() const;

  // Tests: writes NaN bytes into every slot that holds no token (the unused tail of each
  // head's last block and every free block).
  void poison_unused();

 private:
  struct Head {
    std::vector<int32_t> blocks;  // block ids in token order
    int64_t n = 0;
    std::vector<int32_t> pos, idx, seq;  // [n]
    uint64_t epoch = 0;
    int64_t low_water = INT64_MAX;  // see take_low_water()
    // drop_key_channels: tokens [0, n_thin) are stored in the first thin_blocks blocks, thin_tokens
    // a block, key rows of thin_k_bytes (the kept channels `kept`, zero-padded to the key type's
    // block: thin_k_dim channels), value rows from byte thin_v_offset. Tokens from n_thin on start a fresh ordinary
    // block. n_thin == 0: every block is ordinary.
    int64_t n_thin = 0, thin_blocks = 0, thin_tokens = 0, thin_k_dim = 0;
    size_t thin_k_bytes = 0, thin_v_offset = 0;
    std::vector<int32_t> kept;
  };
  explicit KvCache(const KvCacheConfig& cfg) : cfg_(cfg) {}
  Head& head(int64_t il, int64_t h) { return heads_[static_cast<size_t>(il * cfg_.n_head_kv + h)]; }
  const Head& head(int64_t il, int64_t h) const {
    return heads_[static_cast<size_t>(il * cfg_.n_head_kv + h)];
  }
  uint8_t* k_row(const Head& hd, int64_t i);
  uint8_t* v_row(const Head& hd, int64_t i);
  const uint8_t* k_row(const Head& hd, int64_t i) const;
  const uint8_t* v_row(const Head& hd, int64_t i) const;
  // Row i of hd with its thin region of n_thin tokens in thin_blocks blocks (retain moves rows
  // between two such layouts).
  uint8_t* k_row_in(const Head& hd, int64_t i, int64_t n_thin, int64_t thin_blocks) const;
  uint8_t* v_row_in(const Head& hd, int64_t i, int64_t n_thin, int64_t thin_blocks) const;
  // Blocks that n tokens of hd take.
  int64_t blocks_for(const Head& hd, int64_t n) const;
  // Row i's key as f32 [head_dim], dropped channels as zeros.
  void key_row_f32(const Head& hd, int64_t i, float* out) const;
  // Stores every token of hd with every key channel again (the dropped ones as zeros).
  Status unthin(Head& hd, const char* why);
  void free_tail_blocks(Head& hd);
  // Copy-on-write: replaces every block of hd that another cache shares (own_blocks) or only
  // the last one when a write goes into it (own_last) by a copy of its own.
  Status own_blocks(Head& hd);
  // n blocks from the pool, all or none: on a failure those taken go back and the pool's error
  // is returned.
  Expected<std::vector<int32_t>> take_blocks(int64_t n);
  Status own_last(Head& hd);
  Status own_block(Head& hd, size_t b);
  Status ensure_room(int64_t il, int64_t blocks_needed);
  // Rotates stored keys [first, first+count) of hd: dequantise, fn(row f32, i), quantise.
  template <class Fn>
  void rewrite_keys(Head& hd, int64_t first, int64_t count, Fn&& fn);

  KvCacheConfig cfg_;
  size_t k_row_bytes_ = 0, v_row_bytes_ = 0, v_offset_ = 0;
  std::shared_ptr<BlockPool> pool_;
  std::vector<Head> heads_;            // [n_layer * n_head_kv]
  std::vector<int64_t> n_appended_;    // [n_layer]
  std::vector<RopeTable> rope_;        // [n_layer] the table layer il's keys are rotated with
  int64_t rope_length_hint_ = 0;
  bool mixed_rope_ = false;
  KvEvictor evictor_;
  // Append scratch, grown to the largest chunk seen (never per token).
  Buffer<float> krot_;                 // [n, n_head_kv, head_dim]
  Buffer<float> row_;                  // [max(head_dim, head_dim_v)]
};

// Parses "f32", "f16", "bf16", "q8_0" for --kv-type-k/--kv-type-v.
Expected<DType> parse_kv_type(std::string_view name);

}  // namespace lc
