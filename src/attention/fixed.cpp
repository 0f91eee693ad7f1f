// Fixed-distance attention: exact attention over every cached key, where a key more than
// `distance` positions before its query is scored as if exactly `distance` away,
//     score = rope(q, W) . rope(k, 0)  for p_q - p_k > W,   rope(q, p_q) . rope(k, p_k) otherwise.
// This is the distance ceiling of LM-Infinite (Han et al. 2023, "LM-Infinite: Zero-Shot Extreme
// Length Generalization for Large Language Models") and of InfLLM's memory (Xiao et al. 2024),
// without their sinks and block retrieval: the model never sees a relative distance above W,
// however long the input. A model trained with the same ceiling (`longctx train
// --fixed-distance W`, which writes `longctx.attention.fixed_distance` into its GGUF) reads any
// length at trained distances, and this is its default attention.
//
// Keys are stored rotated at their positions; far keys are rotated back to position 0 as they
// are read (Span::unrotate), the queries rotated at W once per call (variant 1).
#include <algorithm>
#include <vector>

#include "attention/methods.h"

namespace lc {
namespace {

class FixedBackend final : public ExecBackend {
 public:
  FixedBackend(const AttnShape& s, int64_t distance, int64_t split) : ExecBackend(s), distance_(distance) {
    split_ = split;
  }

  std::string spec() const override {
    std::string s = strprintf("fixed:distance=%lld", (long long)distance_);
    if (split_ != kDefaultSplit) s += strprintf(",split=%lld", (long long)split_);
    return s;
  }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    wpos_.assign(static_cast<size_t>(n), static_cast<int32_t>(distance_));
    add_variant(1, q, wpos_.data(), kv, ctx);
    const int64_t B = kv.block_tokens();
    const std::vector<attn::Item> items = attn::make_items(ctx);
    spans_.resize(items.size());
    near_.resize(static_cast<size_t>(n));
    int64_t cached_hk = -1;
    for (size_t i = 0; i < items.size(); ++i) {
      const attn::Item& it = items[i];
      if (it.hk != cached_hk) {
        // near_[t]: the first key of this head that query t sees at its real distance. Keys are
        // in position order, so it is a binary search; beyond it every key is near.
        const int64_t N = kv.n_tokens(il, it.hk);
        const int32_t* kp = kv.positions(il, it.hk);
        for (int64_t t = 0; t < n; ++t) {
          const int64_t vis = N - n + t + 1;
          const int64_t lo_pos = static_cast<int64_t>(pos[t]) - distance_;
          near_[static_cast<size_t>(t)] =
              std::lower_bound(kp, kp + vis, lo_pos, [](int32_t a, int64_t b) { return a < b; }) - kp;
        }
        cached_hk = it.hk;
      }
      auto& sp = spans_[i];
      sp.clear();
      // Rows are (token, head) with tokens in order and near_ nondecreasing in the token, so the
      // keys below the first row's bound are far for every row and those from the last row's on
      // are near for every row; in between, row r is far up to its own bound.
      const int64_t a = near_[static_cast<size_t>(it.t0)], b = near_[static_cast<size_t>(it.t0 + it.nt - 1)];
      attn::add_spans(sp, 0, a, B, 1, true);
      for (int64_t t = it.t0; t < it.t0 + it.nt - 1; ++t) {
        const int64_t lo = near_[static_cast<size_t>(t)], hi = near_[static_cast<size_t>(t + 1)];
        if (hi <= lo) continue;
        // Keys [lo, hi): near for tokens <= t, far for tokens > t.
        uint64_t near_rows = 0;
        for (int64_t r = 0; r < it.rows(); ++r)
          if (it.t0 + r / it.g <= t) near_rows |= uint64_t{1} << r;
        const size_t first = sp.size();
        attn::add_spans(sp, lo, hi - lo, B, 0, false);
        attn::add_spans(sp, lo, hi - lo, B, 1, true);
        const size_t mid = first + (sp.size() - first) / 2;
        for (size_t j = first; j < sp.size(); ++j) sp[j].rows = j < mid ? near_rows : ~near_rows;
      }
      const int64_t vis_max = kv.n_tokens(il, it.hk) - n + it.t0 + it.nt;
      attn::add_spans(sp, b, vis_max - b, B, 0, false);
    }
    run_spans(ctx, items, spans_, pool);
    return Status::ok();
  }

 private:
  int64_t distance_;
  std::vector<int32_t> wpos_;                   // [n] the fixed distance
  std::vector<int64_t> near_;                   // [n] first near key of the current KV head
  std::vector<std::vector<attn::Span>> spans_;  // [items]
};

}  // namespace

Expected<BackendPtr> make_fixed(MethodSpec& spec, const AttnShape& s) {
  int64_t distance = s.fixed_distance;
  LC_TRY(spec.get_int("distance", &distance, 0, int64_t{1} << 30));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30));
  LC_TRY(spec.finish());
  if (distance < 1)
    return make_error("fixed: give distance=N (the model was not trained with a distance ceiling, so there is no "
                      "default: its GGUF has no longctx.attention.fixed_distance)");
  return BackendPtr(new FixedBackend(s, distance, split));
}

}  // namespace lc
