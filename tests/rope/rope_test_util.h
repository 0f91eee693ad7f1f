// Helpers shared by the rope tests. Oracles here are written from the formulas, in double,
// without calling the implementation's helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "rope/rope_scaling.h"

namespace lc::rope_test {

inline RopeModelInfo model(int64_t n_rot, double base, int64_t n_ctx_train, bool neox = false) {
  RopeModelInfo info;
  info.gguf.n_rot = n_rot;
  info.gguf.neox = neox;
  info.gguf.base = static_cast<float>(base);
  info.gguf.orig_ctx = n_ctx_train;
  info.n_ctx_train = n_ctx_train;
  return info;
}

// θ_i = b^(-2i/d) in double.
inline std::vector<double> theta(int64_t d, double base) {
  std::vector<double> t(static_cast<size_t>(d / 2));
  for (size_t i = 0; i < t.size(); ++i) t[i] = std::pow(base, -2.0 * double(i) / double(d));
  return t;
}

inline RopeTable table_of(const std::string& spec, const RopeModelInfo& info, int64_t n_ctx = 0) {
  auto s = make_rope_scaling(spec, info);
  EXPECT_TRUE(s.has_value()) << spec << ": " << (s ? "" : s.error().message);
  if (!s) return {};
  return (*s)->table(n_ctx);
}

inline void expect_table(const RopeTable& t, const std::vector<double>& want, double mscale,
                         const std::string& what, double rel = 1e-6) {
  ASSERT_EQ(t.inv_freq.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(t.inv_freq[i], want[i], rel * std::abs(want[i])) << what << " pair " << i;
  EXPECT_NEAR(t.mscale, mscale, 1e-6 * mscale) << what;
}

}  // namespace lc::rope_test
