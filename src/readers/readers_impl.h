// Internal to src/readers: the factories of the registry list and what the readers share.
#pragma once

#include <memory>

#include "core/method_spec.h"
#include "readers/reader.h"

namespace lc::readers {

#define LC_READER(name, help, paper) Expected<std::unique_ptr<Reader>> make_##name(MethodSpec& spec);
#include "readers/reader_list.h"

// The window a reader fits into: `window` when given, else the model's default; and the chunk
// and memory sizes in MemAgent's proportions to it (5,000 and 1,024 tokens of an 8K window).
struct Fit {
  int64_t window = 0, chunk = 0, memory = 0;
};
Fit fit_window(int64_t window_key, int64_t chunk_key, int64_t memory_key, int64_t model_window);

// Default cap on the model calls of one read: enough for 10M tokens in 600-token chunks.
inline constexpr int64_t kDefaultMaxCalls = 100000;

}  // namespace lc::readers
