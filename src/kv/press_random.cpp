// Random press — the control every press paper compares with (kvpress RandomPress):
//   score(l, h, j) = U[0, 1), a hash of (seed, layer, KV head, sequence index)
// A hash rather than a generator stream: the score of a token does not depend on the order
// heads are scored in, on threads, or on what was evicted before, so runs are reproducible.
#include "kv/press_impl.h"

#include <fmt/format.h>

namespace lc::press {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class RandomScorer final : public PressScorer {
 public:
  explicit RandomScorer(uint64_t seed) : seed_(seed) {}
  std::string name() const override { return "random"; }
  std::string params() const override { return fmt::format("seed={}", seed_); }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      auto& r = out.by_kv_head[static_cast<size_t>(h)];
      const int32_t* idx = c.kv->seq_index(il, h);
      r.resize(static_cast<size_t>(c.kv->n_tokens(il, h)));
      const uint64_t base = mix(seed_ ^ mix(static_cast<uint64_t>(il) << 32 | static_cast<uint64_t>(h)));
      for (size_t j = 0; j < r.size(); ++j)
        r[j] = static_cast<float>(mix(base ^ static_cast<uint64_t>(idx[j])) >> 40) * (1.0f / 16777216.0f);
    }
    return ok_status();
  }

 private:
  uint64_t seed_;
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_random(Args& a, const PressShape&) {
  LC_ASSIGN_OR_RETURN(int64_t seed, a.integer("seed", 0, 0, INT64_MAX,
                                              "seed of the random scores (hashed with layer, head and token)"));
  return std::unique_ptr<PressScorer>(std::make_unique<RandomScorer>(static_cast<uint64_t>(seed)));
}

}  // namespace lc::press
