#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <map>

namespace lc::tok {

SpecialAutomaton::SpecialAutomaton(std::vector<SpecialPattern> patterns) {
  for (auto& p : patterns)
    if (!p.text.empty()) patterns_.push_back(std::move(p));
  nodes_.emplace_back();
  for (size_t pi = 0; pi < patterns_.size(); ++pi) {
    int32_t cur = 0;
    for (char ch : patterns_[pi].text) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t nxt = child(cur, b);
      if (nxt < 0) {
        nxt = static_cast<int32_t>(nodes_.size());
        Node n;
        n.depth = nodes_[static_cast<size_t>(cur)].depth + 1;
        nodes_.push_back(std::move(n));
        auto& edges = nodes_[static_cast<size_t>(cur)].next;
        edges.insert(std::lower_bound(edges.begin(), edges.end(), std::make_pair(b, int32_t{-1})),
                     {b, nxt});
      }
      cur = nxt;
    }
    // Token texts are unique; keep the first (highest precedence) all the same.
    if (nodes_[static_cast<size_t>(cur)].out < 0)
      nodes_[static_cast<size_t>(cur)].out = static_cast<int32_t>(pi);
  }
  // Breadth-first failure links.
  root_next_.fill(0);
  std::deque<int32_t> queue;
  for (const auto& [b, c] : nodes_[0].next) {
    root_next_[b] = c;
    queue.push_back(c);
  }
  while (!queue.empty()) {
    const int32_t u = queue.front();
    queue.pop_front();
    for (const auto& [b, c] : nodes_[static_cast<size_t>(u)].next) {
      const int32_t f = step(nodes_[static_cast<size_t>(u)].fail, b);
      Node& cn = nodes_[static_cast<size_t>(c)];
      cn.fail = f;
      const Node& fn = nodes_[static_cast<size_t>(f)];
      cn.dict = fn.out >= 0 ? f : fn.dict;
      queue.push_back(c);
    }
  }
}

int32_t SpecialAutomaton::child(int32_t node, uint8_t b) const {
  const auto& edges = nodes_[static_cast<size_t>(node)].next;
  auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(b, int32_t{-1}));
  return it != edges.end() && it->first == b ? it->second : -1;
}

int32_t SpecialAutomaton::step(int32_t state, uint8_t b) const {
  while (state != 0) {
    const int32_t c = child(state, b);
    if (c >= 0) return c;
    state = nodes_[static_cast<size_t>(state)].fail;
  }
  return root_next_[b];
}

std::vector<SpecialMatch> SpecialAutomaton::find(std::string_view text) const {
  std::vector<SpecialMatch> accepted;
  if (patterns_.empty()) return accepted;
  // Every occurrence as (pattern index, begin).
  std::vector<std::pair<int32_t, size_t>> occ;
  int32_t state = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    state = step(state, static_cast<uint8_t>(text[i]));
    const Node& n = nodes_[static_cast<size_t>(state)];
    for (int32_t m = n.out >= 0 ? state : n.dict; m >= 0; m = nodes_[static_cast<size_t>(m)].dict) {
      const Node& mn = nodes_[static_cast<size_t>(m)];
      occ.emplace_back(mn.out, i + 1 - static_cast<size_t>(mn.depth));
    }
  }
  if (occ.empty()) return accepted;
  std::sort(occ.begin(), occ.end());

  // Precedence order: a pattern claims its leftmost non-overlapping occurrences that do not
  // straddle text already claimed by an earlier pattern (in llama.cpp such an occurrence spans
  // two fragments and is never seen).
  std::map<size_t, std::pair<size_t, int32_t>> taken;  // begin -> (end, pattern)
  size_t i = 0;
  while (i < occ.size()) {
    const int32_t pi = occ[i].first;
    const size_t len = patterns_[static_cast<size_t>(pi)].text.size();
    size_t last_end = 0;
    for (; i < occ.size() && occ[i].first == pi; ++i) {
      const size_t b = occ[i].second, e = b + len;
      if (b < last_end) continue;
      auto it = taken.lower_bound(b);
      if (it != taken.end() && it->first < e) continue;
      if (it != taken.begin() && std::prev(it)->second.first > b) continue;
      taken.emplace(b, std::make_pair(e, pi));
      last_end = e;
    }
  }
  accepted.reserve(taken.size());
  for (const auto& [b, v] : taken) {
    const SpecialPattern& p = patterns_[static_cast<size_t>(v.second)];
    accepted.push_back(SpecialMatch{b, v.first, p.id, p.lstrip, p.rstrip});
  }
  return accepted;
}

}  // namespace lc::tok
