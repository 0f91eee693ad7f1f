// StreamingLLM — Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
// ICLR 2024. Keep the first n_sink tokens (attention sinks) and the most recent ones:
//   score(j) = j   (recency; the sinks are protected by the framework, n_sink = 4)
// Positions are re-assigned inside the cache (reposition=1, see ScoredPress::compress): the
// sinks are re-rotated to sit right before the recent window, as the paper does.
#include "kv/press_impl.h"

namespace lc::press {
namespace {

class StreamingLlm final : public PressScorer {
 public:
  std::string name() const override { return "streaming_llm"; }
  int64_t default_window() const override { return 0; }
  int64_t default_sinks() const override { return 4; }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      auto& r = out.by_kv_head[static_cast<size_t>(h)];
      const int32_t* idx = c.kv->seq_index(il, h);
      r.resize(static_cast<size_t>(c.kv->n_tokens(il, h)));
      // Sequence indices are exact in f32 up to 2^24 tokens.
      for (size_t j = 0; j < r.size(); ++j) r[j] = static_cast<float>(idx[j]);
    }
    return ok_status();
  }
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_streaming_llm(Args&, const PressShape&) {
  return std::unique_ptr<PressScorer>(std::make_unique<StreamingLlm>());
}

}  // namespace lc::press
