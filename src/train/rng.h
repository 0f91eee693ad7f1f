// A small reproducible generator (xorshift64*, Box-Muller) whose whole state can be saved in a
// checkpoint, so that a resumed run draws the same numbers as an uninterrupted one.
#pragma once

#include <cmath>
#include <cstdint>

namespace lc::train {

struct RngState {
  uint64_t s = 0;
  float spare = 0;
  uint32_t have_spare = 0;
};

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { st_.s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull; }
  explicit Rng(const RngState& st) : st_(st) {}
  const RngState& state() const { return st_; }

  uint64_t next() {
    st_.s ^= st_.s >> 12;
    st_.s ^= st_.s << 25;
    st_.s ^= st_.s >> 27;
    return st_.s * 0x2545F4914F6CDD1Dull;
  }
  // Uniform in (0, 1).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n) (n > 0; the modulo bias is irrelevant at our ranges).
  uint64_t below(uint64_t n) { return next() % n; }
  float normal() {
    if (st_.have_spare) {
      st_.have_spare = 0;
      return st_.spare;
    }
    const double u = uniform(), v = uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    st_.spare = static_cast<float>(r * std::sin(2 * M_PI * v));
    st_.have_spare = 1;
    return static_cast<float>(r * std::cos(2 * M_PI * v));
  }

 private:
  RngState st_;
};

}  // namespace lc::train
