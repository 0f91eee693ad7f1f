// What an attention backend does with the KV cache, as the other methods need to know it
// (presses that recompute attention, qTTT's gradient, the runtime): typed fields each backend
// declares, so that nothing parses a spec string to find out.
#pragma once

#include <cstdint>
#include <string>

namespace lc {

struct AttentionCaps {
  std::string spec;                 // the backend's full spec, for messages
  bool exact = false;               // an exact softmax over every visible key at its stored position
                                    // (dense, naive)
  bool reads_all_keys = false;      // every visible key is read (exact ones, fixed without a budget)
  int64_t fixed_distance = 0;       // keys further back than this are scored at this distance (fixed)
  bool evicts = false;              // drops tokens from the cache (streaming)
  bool relabels_positions = false;  // scores keys at positions other than the stored ones (streaming)
  bool unrotates_keys = false;      // rotates stored keys back to position 0 with the cache's table
                                    // (fixed, infllm)
};

}  // namespace lc
