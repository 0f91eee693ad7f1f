// Internal to the press implementations: spec arguments, scorer factories, shared helpers.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/method_info.h"
#include "kv/press.h"

namespace lc::press {

// The key=value list of one press spec. Every lookup records the key as accepted, so that an
// unknown key's error lists exactly the keys this press reads. help: one line on what the key
// does, with its unit (tokens, fraction, layers), for `longctx methods` and docs/methods.md.
class Args {
 public:
  static Expected<Args> parse(std::string_view name, std::string_view params);
  const std::string& name() const { return name_; }
  bool has(std::string_view key) const;
  Expected<double> number(std::string_view key, double def, double lo, double hi, const char* help);
  Expected<int64_t> integer(std::string_view key, int64_t def, int64_t lo, int64_t hi, const char* help);
  Expected<std::string> choice(std::string_view key, std::string_view def,
                               const std::vector<std::string>& options, const char* help);
  Expected<std::string> text(std::string_view key, std::string_view def, const char* help);
  // Marks a key as accepted without reading it (keys handed on to an inner scorer).
  void accept(std::string_view key);
  // Error if a key was given that nobody read.
  Status finish() const;
  // Every key looked up or accepted so far, in that order (the press's keys, for --help).
  const std::vector<std::string>& accepted() const { return accepted_; }
  // The keys read so far with their type, default, range and help (kv_press_method_info).
  const std::vector<MethodKey>& key_info() const { return key_info_; }

 private:
  const std::string* find(std::string_view key);
  std::string name_;
  std::vector<std::pair<std::string, std::string>> kv_;
  std::vector<bool> used_;
  std::vector<std::string> accepted_;
  std::vector<MethodKey> key_info_;
};

using ScorerFactory = std::function<Expected<std::unique_ptr<PressScorer>>(Args&, const PressShape&)>;
// A scorer by name (adakv's inner=); nullptr if unknown.
const ScorerFactory* find_scorer(std::string_view name);

// make_<name> of every LC_PRESS_SCORER in the registry list (press_<name>.cpp).
#define LC_PRESS_SCORER(name, help, paper) \
  Expected<std::unique_ptr<PressScorer>> make_##name(Args& a, const PressShape& s);
#include "kv/press_list.h"
// make_press_<name> of every LC_PRESS_CUSTOM (press_<name>.cpp): the whole press.
#define LC_PRESS_CUSTOM(name, help, paper) \
  Expected<std::unique_ptr<KvPress>> make_press_##name(Args& a, const PressShape& s);
#include "kv/press_list.h"
// SpecPC's parameters from its spec (press_spec.cpp).
Expected<PromptCompression> parse_specpc(Args& a);
std::string specpc_spec(const PromptCompression& p, bool query_aware);

// ---- helpers shared by custom presses (LC_PRESS_CUSTOM) ----

// ratio= / budget= / query= read with the same names, ranges and help as the scored presses.
struct BudgetKeys {
  double ratio = -1;      // fraction removed (< 0: budget given)
  int64_t budget = -1;    // tokens kept per KV head (< 0: ratio given)
  bool query_aware = true;
  // Tokens kept of n seen: floor((1 - ratio) n) (kvpress), or min(budget, n).
  int64_t kept(int64_t n_seen) const;
  std::string spec() const;  // "ratio=0.5,query=aware" or "budget=B,query=..."
};
// default_ratio applies when neither key is given.
Expected<BudgetKeys> parse_budget_keys(Args& a, double default_ratio = 0.5);
// The k best of cand by score (higher first, ties to the lower index, as the scored presses),
// returned ascending. k >= cand.size() returns every candidate.
std::vector<int32_t> top_k(const float* score, std::vector<int32_t> cand, int64_t k);

// The wrapper presses' helpers (chunkkv, block, decoding; defined in press_chunkkv.cpp): inner=
// parsing with the inner scorer's n_sink/window/reduce, its group-reduced scores per KV head,
// the protected tokens of a head, and their scores raised to the layer's max + 1 (kvpress).
Expected<std::unique_ptr<PressScorer>> parse_inner_scorer(Args& a, const PressShape& s, const char* def,
                                                          const char* help, bool allow_lookahead, int64_t& n_sink,
                                                          int64_t& window, bool& reduce_max);
Status inner_kv_scores(PressScorer& inner, const PressContext& c, int64_t il, const PressShape& s, bool reduce_max,
                       std::vector<std::vector<float>>& out);
std::vector<uint8_t> protected_mask(const int32_t* seq, int64_t n, int64_t n_sink, int64_t window);
void raise_protected(std::vector<std::vector<float>>& sc, const std::vector<std::vector<uint8_t>>& prot);

// ---- helpers shared by scorers ----

inline float attn_scale(const PressShape& s) {
  return s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}
// Runs fn(h) for h in [0, n), on the context's pool when it has one.
void for_each_head(const PressContext& c, int64_t n, const std::function<void(int64_t)>& fn);
// The observation queries rotated with kv.rope(il): out [n_obs, n_head, head_dim].
void rotate_queries(const PressContext& c, int64_t il, const PressShape& s, std::vector<float>& out);
// out: [n_tokens(il, h), head_dim] post-RoPE keys of head (il, h).
void read_head_keys(const KvCache& kv, int64_t il, int64_t h, std::vector<float>& out);
// Scores every KV head of layer il from its keys alone (knorm, keydiff): fn(keys [n, head_dim]
// as stored, post-RoPE, n, head_dim, scores [n]) per head, over the pool.
void score_heads_by_keys(const PressContext& c, int64_t il, const PressShape& s, PressScores& out,
                         const std::function<void(const float* keys, int64_t n, int64_t d, float* scores)>& fn);
// Causal softmax of the observation queries of query head hq over KV head hq / group's held
// tokens: probs [n_obs, n] (a key after the query's sequence index gets 0).
// qr: rotated queries [n_obs, n_head, head_dim]; keys: [n, head_dim].
void window_probs(const PressContext& c, int64_t il, const PressShape& s, const float* qr, int64_t hq,
                  const float* keys, int64_t n, std::vector<float>& probs);
// Sequence index of observation query t of layer il.
inline int64_t obs_seq_index(const PressContext& c, int64_t il, int64_t t) {
  return c.query_seq ? c.query_seq[t] : c.kv->n_appended(il) - c.n_obs + t;
}

}  // namespace lc::press
