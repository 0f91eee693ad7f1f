// Quest's page choice for one query head, from the paper's definition in double precision
// (quest_paper_test.cpp's header comment gives the rule and the tolerance): the oracle of
// `quest`, in one process and per shard under context parallelism.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "attention/backend.h"

namespace lc::test {

struct QuestChoice {
  bool dense = false;           // K >= n_pages: every page
  int64_t K = 0, n_pages = 0;
  std::vector<double> score;    // [n_pages] U
  std::vector<int32_t> pages;   // the K chosen, ascending
  double mag = 0;               // sum_c |q_c| max_p max(|m_c|, |M_c|): the scale of U's rounding
};

inline QuestChoice quest_oracle(const float* keys /*[L, d] as stored*/, int64_t L, int64_t d, const std::vector<double>& q,
                         int64_t budget, int64_t page) {
  QuestChoice oc;
  oc.n_pages = (L + page - 1) / page;
  oc.K = std::min(std::max<int64_t>(3, std::min(L, budget) / page), oc.n_pages);
  oc.dense = oc.K >= oc.n_pages;
  std::vector<double> absmax(static_cast<size_t>(d), 0.0);
  for (int64_t p = 0; p < oc.n_pages; ++p) {
    double u = 0;
    for (int64_t c = 0; c < d; ++c) {
      double m = INFINITY, M = -INFINITY;
      for (int64_t t = p * page; t < std::min(L, (p + 1) * page); ++t) {
        m = std::min(m, static_cast<double>(keys[t * d + c]));
        M = std::max(M, static_cast<double>(keys[t * d + c]));
      }
      u += std::max(q[static_cast<size_t>(c)] * m, q[static_cast<size_t>(c)] * M);
      absmax[static_cast<size_t>(c)] = std::max({absmax[static_cast<size_t>(c)], std::fabs(m), std::fabs(M)});
    }
    oc.score.push_back(u);
  }
  for (int64_t c = 0; c < d; ++c) oc.mag += std::fabs(q[static_cast<size_t>(c)]) * absmax[static_cast<size_t>(c)];
  std::vector<int32_t> order(static_cast<size_t>(oc.n_pages));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return oc.score[static_cast<size_t>(a)] > oc.score[static_cast<size_t>(b)];  // stable: lower index first
  });
  oc.pages.assign(order.begin(), order.begin() + oc.K);
  std::sort(oc.pages.begin(), oc.pages.end());
  return oc;
}

struct Tally {
  int64_t checked = 0, near_ties = 0, heads_differ = 0;
};

// The backend's recorded keys of one (token, head) against the oracle's pages: whole pages,
// exactly the oracle's set (strict), or differing only in pages within rounding of the K-th U.
inline void expect_choice(const std::vector<SelectedKey>& keys, const QuestChoice& oc, int64_t L, int64_t page, bool strict,
                   Tally& tally, const std::string& what) {
  ++tally.checked;
  std::vector<int64_t> count(static_cast<size_t>(oc.n_pages), 0);
  for (const auto& k : keys) {
    ASSERT_LT(k.seq_index, L) << what;
    ++count[static_cast<size_t>(k.seq_index / page)];
  }
  std::vector<int32_t> got;
  for (int64_t p = 0; p < oc.n_pages; ++p) {
    if (!count[static_cast<size_t>(p)]) continue;
    EXPECT_EQ(count[static_cast<size_t>(p)], std::min(page, L - p * page)) << what << " page " << p << " not whole";
    got.push_back(static_cast<int32_t>(p));
  }
  if (oc.dense) {
    EXPECT_EQ(static_cast<int64_t>(got.size()), oc.n_pages) << what << ": dense expected";
    return;
  }
  EXPECT_EQ(static_cast<int64_t>(got.size()), oc.K) << what;
  if (strict || got == oc.pages) {
    EXPECT_EQ(got, oc.pages) << what;
    return;
  }
  double thr = INFINITY;
  for (int32_t p : oc.pages) thr = std::min(thr, oc.score[static_cast<size_t>(p)]);
  const double tol = 4e-6 * oc.mag;
  std::vector<int32_t> diff;
  std::set_symmetric_difference(got.begin(), got.end(), oc.pages.begin(), oc.pages.end(), std::back_inserter(diff));
  for (int32_t p : diff)
    EXPECT_LE(std::fabs(oc.score[static_cast<size_t>(p)] - thr), tol)
        << what << ": page " << p << " U " << oc.score[static_cast<size_t>(p)] << " vs K-th " << thr;
  ++tally.near_ties;
}

}  // namespace lc::test
