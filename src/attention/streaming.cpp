// StreamingLLM (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"):
// a query attends the first n_sink tokens (attention sinks) and the `window` most recent
// tokens (itself included), with positions re-assigned inside the cache:
//     sinks at 0..S-1, window token i at S + i,   S = number of sinks held,
// so the model never sees a position beyond n_sink + window whatever the stream length.
// Tokens outside sinks + window are evicted from the cache.
//
// Re-assignment without touching keys: keys are stored rotated at their original positions.
// Window keys are contiguous, so relabelling them by a common offset leaves every q-k distance
// inside the window unchanged: the query rotated at its original position scores them exactly
// as at the re-assigned ones. Only the sink scores change, and for those the query is rotated
// at its re-assigned position S + (p_q - p_first_window) (a second copy of the queries). No
// key is re-rotated, so nothing is rounded again however long the stream runs.
//
// Eviction happens after the attention of a layer, a block at a time (when at least one KV
// block of tokens lies outside sinks + window - 1), so compaction costs O(window/block) row
// moves per token; tokens kept as slack are never attended.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "attention/methods.h"

namespace lc {
namespace {

class StreamingBackend final : public ExecBackend {
 public:
  StreamingBackend(const AttnShape& s, int64_t sinks, int64_t window)
      : ExecBackend(s), n_sink_(sinks), window_(window) {}

  std::string spec() const override {
    return fmt::format("streaming:sinks={},window={}", n_sink_, window_);
  }
  AttentionCaps caps() const override {
    AttentionCaps c{spec()};
    c.evicts = c.relabels_positions = true;
    return c;
  }

  Status attach(KvCache& kv) override {
    LC_TRY(AttentionBackend::attach(kv));
    // Over budget: evict every layer down to what the next chunk needs.
    kv.set_evictor([this](KvCache& c, int64_t, int64_t) -> Status {
      for (int64_t il = 0; il < c.n_layer(); ++il) LC_TRY(evict(c, il, 1));
      return ok_status();
    });
    return ok_status();
  }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    const int64_t N = kv.n_tokens(il, 0);
    const int32_t* kp = kv.positions(il, 0);
    for (int64_t h = 1; h < kv.n_head_kv(); ++h)
      if (kv.n_tokens(il, h) != N || kv.positions(il, h)[0] != kp[0] || kv.positions(il, h)[N - 1] != kp[N - 1])
        return make_error(fmt::format("streaming: the KV heads of layer {} hold different tokens; streaming "
                                      "needs the same tokens in every head", il));
    // Per query: window start ws[t] and re-assigned position for the sink scores.
    ws_.resize(static_cast<size_t>(n));
    sink_qpos_.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const int64_t vis = N - n + t + 1;
      const int64_t S = std::min(n_sink_, vis);
      const int64_t ws = std::max(S, vis - window_);
      ws_[static_cast<size_t>(t)] = ws;
      if (ws < vis) {
        if (kp[vis - 1] - kp[ws] != vis - 1 - ws)
          return make_error(fmt::format("streaming: positions of the window of layer {} are not contiguous "
                                        "({}..{} over {} tokens); StreamingLLM needs positions n_past + t",
                                        il, kp[ws], kp[vis - 1], vis - ws));
        sink_qpos_[static_cast<size_t>(t)] = static_cast<int32_t>(S + (pos[t] - kp[ws]));
      } else {
        sink_qpos_[static_cast<size_t>(t)] = pos[t];
      }
    }
    add_variant(1, q, sink_qpos_.data(), kv, ctx);

    const std::vector<attn::Item> items = attn::make_items(ctx);
    pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
      attn::Runner& run = attn::thread_runner();
      int64_t cuts[attn::kMaxRows + 2];
      for (int64_t i = b; i < e; ++i) {
        const attn::Item& it = items[static_cast<size_t>(i)];
        run.begin(ctx, it);
        // Sinks, seen by every row (causality clips rows that are themselves sinks).
        run.run_range(0, std::min<int64_t>(n_sink_, run.vis(run.rows() - 1)), 1, false, run.all_rows());
        // Window: each token has its own lower bound ws[t]; cut the range at every bound so
        // that a span's rows all see the whole span.
        int64_t nc = 0;
        for (int64_t t = it.t0; t < it.t0 + it.nt; ++t) cuts[nc++] = ws_[static_cast<size_t>(t)];
        const int64_t hi = run.vis(run.rows() - 1);
        cuts[nc++] = hi;
        std::sort(cuts, cuts + nc);
        nc = std::unique(cuts, cuts + nc) - cuts;
        for (int64_t c = 0; c + 1 < nc; ++c) {
          const int64_t lo = cuts[c], up = cuts[c + 1];
          if (up <= lo) continue;
          uint64_t mask = 0;
          for (int64_t r = 0; r < run.rows(); ++r)
            if (ws_[static_cast<size_t>(run.token_of(r))] <= lo) mask |= uint64_t{1} << r;
          run.run_range(lo, up - lo, 0, false, mask);
        }
        run.finish();
      }
    });
    return evict(kv, il, kv.block_tokens());
  }

 private:
  // Keeps sinks + the last window - 1 tokens of every head of layer il once at least
  // `min_evict` tokens lie outside them.
  Status evict(KvCache& kv, int64_t il, int64_t min_evict) {
    for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
      const int64_t N = kv.n_tokens(il, h);
      const int64_t S = std::min(n_sink_, N);
      const int64_t keep_from = std::max(S, N - (window_ - 1));
      if (keep_from - S < min_evict || keep_from <= S) continue;
      keep_.clear();
      for (int64_t j = 0; j < S; ++j) keep_.push_back(static_cast<int32_t>(j));
      for (int64_t j = keep_from; j < N; ++j) keep_.push_back(static_cast<int32_t>(j));
      LC_TRY(kv.retain(il, h, keep_));
    }
    return ok_status();
  }

  int64_t n_sink_, window_;
  std::vector<int64_t> ws_;         // [n]
  std::vector<int32_t> sink_qpos_;  // [n]
  std::vector<int32_t> keep_;
};

}  // namespace

Expected<BackendPtr> make_streaming(MethodSpec& spec, const AttnShape& s) {
  int64_t sinks = 4, window = 1024;
  LC_TRY(spec.get_int("sinks", &sinks, 0, int64_t{1} << 30,
                      "first tokens, always attended and kept (attention sinks), tokens"));
  LC_TRY(spec.get_int("window", &window, 1, int64_t{1} << 30,
                      "most recent tokens attended, the query's own included; older ones are evicted, tokens"));
  LC_TRY(spec.finish());
  return BackendPtr(new StreamingBackend(s, sinks, window));
}

}  // namespace lc
