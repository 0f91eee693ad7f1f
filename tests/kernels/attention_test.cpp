// The tiled online-softmax attention against the materialising double-precision oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention.h"

namespace lc::kernels {
namespace {

TEST(Attention, TiledMatchesNaiveOverGrid) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  for (int64_t group : {1, 2, 4, 8}) {
    for (int64_t hd : {64, 128}) {
      for (int64_t n_kv_total : {1, 2, 63, 64, 65, 300, 1100}) {
        AttnShape s;
        s.n_head_kv = 2;
        s.n_head = 2 * group;
        s.head_dim = hd;
        s.head_dim_v = hd;
        s.n_tokens = std::min<int64_t>(n_kv_total, 5);
        s.n_past = n_kv_total - s.n_tokens;
        s.kv_stride = n_kv_total + 3;  // capacity larger than use: unused slots hold NaN
        s.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<float> q(static_cast<size_t>(s.n_tokens * s.n_head * hd));
        std::vector<float> k(static_cast<size_t>(s.n_head_kv * s.kv_stride * hd), NAN);
        std::vector<float> v(k.size(), NAN);
        for (auto& x : q) x = nd(rng) * 2.0f;
        for (int64_t h = 0; h < s.n_head_kv; ++h)
          for (int64_t j = 0; j < n_kv_total; ++j)
            for (int64_t c = 0; c < hd; ++c) {
              k[static_cast<size_t>((h * s.kv_stride + j) * hd + c)] = nd(rng);
              v[static_cast<size_t>((h * s.kv_stride + j) * hd + c)] = nd(rng);
            }
        std::vector<float> out(static_cast<size_t>(s.n_tokens * s.n_head * hd)), ref(out.size());
        attention_causal(s, q.data(), k.data(), v.data(), out.data(), pool);
        ref::attention_causal(s, q.data(), k.data(), v.data(), ref.data());
        double max_d = 0;
        for (size_t i = 0; i < out.size(); ++i) max_d = std::max(max_d, std::fabs(double(out[i]) - ref[i]));
        EXPECT_LE(max_d, 2e-5) << "group " << group << " hd " << hd << " n_kv " << n_kv_total;
      }
    }
  }
}

}  // namespace
}  // namespace lc::kernels
