// KVzip's context reconstruction — Kim et al., "KVzip: Query-Agnostic KV Cache Compression with
// Context Reconstruction", arXiv 2505.23416, 2025 (as kvpress implements it:
// kvpress/presses/kvzip_press.py). The interface between the press (press_kvzip.cpp: the scores
// and the selection) and the runtime (model/press_runner.cpp), which runs the reconstruction
// prompts through the model after the context is in.
//
// The runtime's part, per compression:
//   if (!r.needed(kv)) return;                  // nothing would be removed (ratio=0, budget above)
//   r.begin(kv, ctx_seq);                       // the context = every token the cache holds
//   for each chunk c of r.chunks(n):
//     ids = prompt (first chunk: kKvzipFirstPrompt; later: kKvzipNextPrompt + the previous
//           chunk's last postfix() tokens) + kKvzipSuffix + the chunk's tokens;
//     r.begin_chunk(kv, c, n_past);             // ids go at sequence indices n_past, n_past + 1, ...
//     run ids through the model; after each layer's attention: r.observe(kv, il, q, ...);
//     take them out of the cache again (every chunk sees the context and its own ids only);
//   r.finish(kv);                               // the keep lists of every layer
//   press.compress(c, il) for every layer       // applies them (kv.retain)
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"

namespace lc {

// The reconstruction prompts of kvpress's KVzipPress.prepare(), as text (the runtime encodes
// them with the model's tokenizer, no BOS, special tokens not parsed). The suffix is kvpress's
// for a tokenizer without a chat template: the project's runtimes give the document without one.
inline constexpr const char* kKvzipFirstPrompt = "\n\nRepeat the previous context exactly.";
inline constexpr const char* kKvzipNextPrompt = "\n\nRepeat the part of the previous context exactly, starting with";
inline constexpr const char* kKvzipSuffix = "\n";

// Context tokens [first, end) (indices into the context, not sequence indices).
struct KvzipChunk {
  int64_t first = 0, end = 0;
};

class KvzipReconstruction {
 public:
  virtual ~KvzipReconstruction() = default;
  // The chunks of a context of n tokens (kvpress _chunk_fn): chunk_size tokens each, the last
  // one shorter; one chunk when n <= chunk_size or chunk_size = 0.
  virtual std::vector<KvzipChunk> chunks(int64_t n) const = 0;
  // Tokens of the previous chunk repeated after the later chunks' prompt (prev_postfix_size).
  virtual int64_t postfix() const = 0;
  // Whether compressing this cache would remove anything; if not, no reconstruction runs (kvpress
  // runs none at compression_ratio = 0).
  virtual bool needed(const KvCache& kv) const = 0;
  // Starts a scoring run over the context: ctx_seq [n] the sequence index of each context token,
  // ascending (the tokens of every head at this point are scored; sink = the first n_sink).
  virtual Status begin(const KvCache& kv, std::vector<int32_t> ctx_seq) = 0;
  // The reconstruction of chunk c: its tokens are appended from sequence index rep_seq0 on,
  // after the context (the cache holds the context alone when this is called).
  virtual Status begin_chunk(const KvCache& kv, const KvzipChunk& c, int64_t rep_seq0) = 0;
  // After layer il's attention over n reconstruction tokens: their queries q [n, n_head *
  // head_dim] (before RoPE, as ForwardHooks::on_queries gives them), positions pos and sequence
  // indices seq (consecutive); kv holds their keys, and those of the chunk's earlier
  // reconstruction tokens, as the newest of every head.
  virtual Status observe(const KvCache& kv, int64_t il, const float* q, const int32_t* pos, const int32_t* seq,
                         int64_t n, ThreadPool* pool) = 0;
  // After the last chunk: computes the keep lists of every layer, which select() hands out.
  virtual Status finish(const KvCache& kv) = 0;
  // Forgets a run (scores and keep lists).
  virtual void reset() = 0;
};

}  // namespace lc
