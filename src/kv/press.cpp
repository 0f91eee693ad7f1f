// The press framework: spec parsing, group reduction, protection, top-k selection with
// deterministic ties, per-layer / head-wise budgets, compaction, chains and the registry.
#include "kv/press.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "kv/press_impl.h"

namespace lc {

Status KvPress::compress(const PressContext& c, int64_t il) {
  std::vector<std::vector<int32_t>> keep;
  LC_TRY(select(c, il, keep));
  for (size_t h = 0; h < keep.size(); ++h)
    if (static_cast<int64_t>(keep[h].size()) < c.kv->n_tokens(il, static_cast<int64_t>(h)))
      LC_TRY(c.kv->retain(il, static_cast<int64_t>(h), keep[h]));
  return ok_status();
}

namespace press {

// ---------------------------------------------------------------- Args

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += v[i];
  }
  return s;
}
std::string fmt_num(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  return fmt::format("{:g}", x);
}
}  // namespace

Expected<Args> Args::parse(std::string_view name, std::string_view params) {
  Args a;
  a.name_ = std::string(name);
  size_t i = 0;
  while (i < params.size()) {
    size_t j = params.find(',', i);
    if (j == std::string_view::npos) j = params.size();
    std::string_view part = params.substr(i, j - i);
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == part.size())
      return make_error(fmt::format("kv press {}: expected key=value, got \"{}\"", a.name_,
                                    part));
    std::string key(part.substr(0, eq));
    for (const auto& [k, v] : a.kv_)
      if (k == key) return make_error(fmt::format("kv press {}: key {} given twice", a.name_, key));
    a.kv_.emplace_back(std::move(key), std::string(part.substr(eq + 1)));
    i = j + 1;
  }
  a.used_.assign(a.kv_.size(), false);
  return a;
}

bool Args::has(std::string_view key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return true;
  return false;
}

void Args::accept(std::string_view key) {
  if (std::find(accepted_.begin(), accepted_.end(), key) == accepted_.end()) accepted_.emplace_back(key);
  for (size_t i = 0; i < kv_.size(); ++i)
    if (kv_[i].first == key) used_[i] = true;
}

const std::string* Args::find(std::string_view key) {
  accept(key);
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

Expected<double> Args::number(std::string_view key, double def, double lo, double hi, const char* help) {
  add_method_key(key_info_, {std::string(key), "real", def < 0 && lo >= 0 ? "" : method_number(def),
                             "[" + method_number(lo) + ", " + method_number(hi) + "]", help});
  const std::string* v = find(key);
  if (!v) return def;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi)
    return make_error(fmt::format("kv press {}: {}={}: expected a number in [{}, {}]", name_,
                                  key, *v, fmt_num(lo),
                                  fmt_num(hi)));
  return x;
}

Expected<int64_t> Args::integer(std::string_view key, int64_t def, int64_t lo, int64_t hi, const char* help) {
  add_method_key(key_info_, {std::string(key), "int", def < lo ? "" : method_integer(def),
                             "[" + method_integer(lo) + ", " + method_integer(hi) + "]", help});
  const std::string* v = find(key);
  if (!v) return def;
  int64_t x = 0;
  const auto r = std::from_chars(v->data(), v->data() + v->size(), x);
  if (v->empty() || r.ec != std::errc() || r.ptr != v->data() + v->size() || x < lo || x > hi)
    return make_error(fmt::format("kv press {}: {}={}: expected an integer in [{}, {}]", name_,
                                  key, *v, lo,
                                  hi));
  return x;
}

Expected<std::string> Args::choice(std::string_view key, std::string_view def,
                                   const std::vector<std::string>& options, const char* help) {
  std::string type;
  for (const auto& o : options) type += (type.empty() ? "" : "|") + o;
  add_method_key(key_info_, {std::string(key), type, std::string(def), "", help});
  const std::string* v = find(key);
  if (!v) return std::string(def);
  if (std::find(options.begin(), options.end(), *v) == options.end())
    return make_error(fmt::format("kv press {}: {}={}: expected one of {}", name_,
                                  key, *v, join(options)));
  return *v;
}

Expected<std::string> Args::text(std::string_view key, std::string_view def, const char* help) {
  add_method_key(key_info_, {std::string(key), "text", std::string(def), "", help});
  const std::string* v = find(key);
  return v ? *v : std::string(def);
}

Status Args::finish() const {
  for (size_t i = 0; i < kv_.size(); ++i)
    if (!used_[i])
      return make_error(fmt::format("kv press {}: unknown key \"{}\" (accepted: {})", name_,
                                    kv_[i].first, join(accepted_)));
  return ok_status();
}

// ---------------------------------------------------------------- helpers

void for_each_head(const PressContext& c, int64_t n, const std::function<void(int64_t)>& fn) {
  if (!c.pool || c.pool->size() <= 1 || n <= 1) {
    for (int64_t h = 0; h < n; ++h) fn(h);
    return;
  }
  c.pool->parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t h = b; h < e; ++h) fn(h);
  });
}

void rotate_queries(const PressContext& c, int64_t il, const PressShape& s, std::vector<float>& out) {
  const int64_t n = c.n_obs * s.n_head * s.head_dim;
  out.assign(c.queries, c.queries + n);
  const RopeTable& rt = c.kv->rope(il);
  if (rt.n_rot > 0 && c.n_obs > 0) rt.apply(out.data(), c.n_obs, s.n_head, s.head_dim, c.query_pos);
}

void read_head_keys(const KvCache& kv, int64_t il, int64_t h, std::vector<float>& out) {
  const int64_t n = kv.n_tokens(il, h);
  out.resize(static_cast<size_t>(n * kv.head_dim()));
  if (n > 0) kv.read_keys(il, h, 0, n, out.data());
}

void window_probs(const PressContext& c, int64_t il, const PressShape& s, const float* qr, int64_t hq,
                  const float* keys, int64_t n, std::vector<float>& probs) {
  const int64_t d = s.head_dim, H = s.n_head, g = s.n_head / s.n_head_kv;
  const float scale = attn_scale(s);
  const int32_t* idx = c.kv->seq_index(il, hq / g);
  probs.assign(static_cast<size_t>(c.n_obs * n), 0.0f);
  for (int64_t t = 0; t < c.n_obs; ++t) {
    const float* q = qr + (t * H + hq) * d;
    const int64_t qs = obs_seq_index(c, il, t);
    // Keys are in ascending sequence order: the visible ones are a prefix.
    const int64_t vis = std::upper_bound(idx, idx + n, static_cast<int32_t>(qs)) - idx;
    if (vis == 0) continue;
    float* p = probs.data() + t * n;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < vis; ++j) {
      const float* k = keys + j * d;
      float a = 0;
      for (int64_t e = 0; e < d; ++e) a += q[e] * k[e];
      p[j] = a * scale;
      mx = std::max(mx, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < vis; ++j) sum += (p[j] = std::exp(p[j] - mx));
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < vis; ++j) p[j] *= inv;
  }
}

void score_heads_by_keys(const PressContext& c, int64_t il, const PressShape& s, PressScores& out,
                         const std::function<void(const float*, int64_t, int64_t, float*)>& fn) {
  out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
  for_each_head(c, s.n_head_kv, [&](int64_t h) {
    std::vector<float> K;
    read_head_keys(*c.kv, il, h, K);
    auto& r = out.by_kv_head[static_cast<size_t>(h)];
    const int64_t n = c.kv->n_tokens(il, h);
    r.assign(static_cast<size_t>(n), 0.0f);
    if (n > 0) fn(K.data(), n, s.head_dim, r.data());
  });
}

// ---------------------------------------------------------------- the scored press

namespace {

enum class Alloc { kUniform, kPyramid, kAdaptive };

struct Options {
  double ratio = -1;     // < 0: not given
  int64_t budget = -1;   // < 0: not given
  int64_t n_sink = 0, window = 0;
  bool reduce_max = false;
  bool reposition = false;
  PressSchedule schedule;
  Alloc alloc = Alloc::kUniform;
  double beta = 20, alpha = 0.2;
};

// Order of keep priority: higher score first, then lower index (deterministic ties).
struct Better {
  const float* s;
  bool operator()(int32_t a, int32_t b) const { return s[a] > s[b] || (s[a] == s[b] && a < b); }
};

class ScoredPress final : public KvPress {
 public:
  ScoredPress(std::string name, Options o, std::unique_ptr<PressScorer> sc, const PressShape& shape)
      : name_(std::move(name)), o_(o), scorer_(std::move(sc)), shape_(shape) {}

  std::string spec() const override {
    std::string s = name_ + ":";
    if (o_.budget >= 0) s += fmt::format("budget={},", o_.budget);
    else if (o_.ratio >= 0) s += "ratio=" + fmt_num(o_.ratio) + ",";
    s += fmt::format("n_sink={},window={},reduce={}", o_.n_sink, o_.window,
                     o_.reduce_max ? "max" : "mean");
    if (o_.schedule.per_chunk) s += ",chunk=1";
    if (o_.schedule.decode_interval > 0)
      s += fmt::format(",interval={},target={}", o_.schedule.decode_interval,
                       o_.schedule.decode_target);
    s += o_.schedule.query_aware ? ",query=aware" : ",query=agnostic";
    if (o_.reposition) s += ",reposition=1";
    if (o_.alloc == Alloc::kPyramid) s += ",beta=" + fmt_num(o_.beta);
    if (o_.alloc == Alloc::kAdaptive) s += ",inner=" + scorer_->name() + ",alpha=" + fmt_num(o_.alpha);
    const std::string p = scorer_->params();
    if (!p.empty()) s += "," + p;
    return s;
  }
  const PressSchedule& schedule() const override { return o_.schedule; }
  int64_t n_obs() const override { return scorer_->n_obs(); }
  AttentionObserver* observer() override { return scorer_->observer(); }
  int64_t lookahead() const override { return scorer_->lookahead(); }
  std::string prefill_attention(int64_t window) const override { return scorer_->prefill_attention(window); }
  Status check_backend(const AttentionCaps& attn) const override {
    // The observer recomputes DENSE attention over the held tokens at their stored positions:
    // exact for dense and naive, not for a backend that attends a subset (quest, infllm, dssa,
    // lychee) or scores at re-assigned positions (streaming).
    if (scorer_->observer() && !attn.exact)
      return make_error(fmt::format("kv press {}: it accumulates the attention of the forward pass as dense softmax, "
                                    "but --attn {} attends a subset of the tokens or re-assigns their positions "
                                    "(use --attn dense, or {}:source=window)",
                                    name_, attn.spec, name_));
    return ok_status();
  }

  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override;
  Status compress(const PressContext& c, int64_t il) override;

 private:
  int64_t layer_target(const PressContext& c, int64_t il) const;

  std::string name_;
  Options o_;
  std::unique_ptr<PressScorer> scorer_;
  PressShape shape_;
};

int64_t ScoredPress::layer_target(const PressContext& c, int64_t il) const {
  const int64_t seen = c.kv->n_appended(il);
  int64_t target;
  if (c.phase == PressPhase::kDecode) target = o_.schedule.decode_target;
  else if (o_.budget >= 0) target = o_.budget;
  else if (o_.ratio >= 0) target = static_cast<int64_t>(std::floor((1.0 - o_.ratio) * static_cast<double>(seen) + 1e-9));
  else return -1;
  if (o_.alloc == Alloc::kPyramid && shape_.n_layer > 1 && target < seen) {
    // PyramidKV (Cai et al. 2024), with the budget schedule of kvpress's PyramidKVPress
    // (NVIDIA/kvpress, kvpress/presses/pyramidkv_press.py, get_layer_budget, itself from the
    // authors' KVCache-Factory pyramidkv_utils.py), reproduced operation for operation in double:
    //   w = n_sink + window (kvpress: window_size; n_sink = 0 there),  q = tokens present,
    //   K = q_seen * (1 - ratio) (unfloored; budget=B / target=T: K = B / T),
    //   min_num = K / beta,  max_num = 2K - min_num;
    //   if max_num >= q - w:  max_num = q - w,  min_num = 2K - max_num   (the clamp: the first
    //     layers cannot keep more than is there, so the last ones keep more and the mean stays K);
    //   if not (q >= max_num >= min_num >= w):  kept = round(K) in every layer (SnapKV);
    //   else kept(il) = round(max_num - il * (max_num - min_num) / (n_layer - 1)).
    // kept(il) counts every token of a head, protected ones included; round() is Python's
    // (half to even: std::nearbyint). Sum over layers = n_layer * K up to the rounding.
    const double w = static_cast<double>(o_.n_sink + o_.window);
    int64_t present = 0;
    for (int64_t h = 0; h < c.kv->n_head_kv(); ++h) present = std::max(present, c.kv->n_tokens(il, h));
    const double q_len = static_cast<double>(present);
    const double kept = c.phase != PressPhase::kDecode && o_.budget < 0
                            ? static_cast<double>(seen) * (1.0 - o_.ratio)
                            : static_cast<double>(target);
    const double max_capacity_prompt = w + kept;
    double min_num = (max_capacity_prompt - w) / o_.beta;
    double max_num = (max_capacity_prompt - w) * 2 - min_num;
    if (max_num >= q_len - w) {
      max_num = q_len - w;
      min_num = (max_capacity_prompt - w) * 2 - max_num;
    }
    if (!(q_len >= max_num && max_num >= min_num && min_num >= w))
      return static_cast<int64_t>(std::nearbyint(kept));
    const double steps = (max_num - min_num) / static_cast<double>(shape_.n_layer - 1);
    // Two roundings, as Python: no fused multiply-add (GCC contracts across statements).
    volatile double drop = static_cast<double>(il) * steps;
    target = static_cast<int64_t>(std::nearbyint(max_num - drop));
  }
  return target;
}

Status ScoredPress::select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) {
  keep.clear();
  if (!o_.schedule.covers(c.phase)) return ok_status();
  KvCache& kv = *c.kv;
  if (il < 0 || il >= kv.n_layer())
    return make_error(fmt::format("kv press {}: layer {} out of range", name_, il));
  if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
    return make_error(fmt::format("kv press {}: the cache has {} KV heads of dim {}, the press was made for {} of dim {}",
                                  name_, kv.n_head_kv(), kv.head_dim(),
                                  shape_.n_head_kv, shape_.head_dim));
  if (scorer_->n_obs() > 0 && c.n_obs > 0 && (!c.queries || !c.query_pos))
    return make_error(fmt::format("kv press {}: n_obs={} but no queries given", name_, c.n_obs));
  const int64_t target = layer_target(c, il);
  if (target < 0) return ok_status();
  const int64_t Hkv = kv.n_head_kv();

  // Protected tokens and whether any head has anything to evict (scoring costs O(L) or more).
  std::vector<std::vector<uint8_t>> prot(static_cast<size_t>(Hkv));
  std::vector<int64_t> n_prot(static_cast<size_t>(Hkv), 0);
  bool any = false;
  for (int64_t h = 0; h < Hkv; ++h) {
    const int64_t n = kv.n_tokens(il, h);
    const int32_t* idx = kv.seq_index(il, h);
    auto& p = prot[static_cast<size_t>(h)];
    p.assign(static_cast<size_t>(n), 0);
    for (int64_t j = 0; j < n && idx[j] < o_.n_sink; ++j) p[static_cast<size_t>(j)] = 1;
    for (int64_t j = std::max<int64_t>(0, n - o_.window); j < n; ++j) p[static_cast<size_t>(j)] = 1;
    int64_t np = 0;
    for (uint8_t b : p) np += b;
    n_prot[static_cast<size_t>(h)] = np;
    // Fall back to no compression when the head holds no more than n_sink + window tokens.
    if (n > o_.n_sink + o_.window && n > std::max(target, np)) any = true;
  }
  if (!any) return ok_status();

  PressScores sc;
  LC_TRY(scorer_->score(c, il, shape_, sc));
  const int64_t g = shape_.n_head / shape_.n_head_kv;
  if (sc.by_kv_head.empty()) {
    if (static_cast<int64_t>(sc.by_query_head.size()) != shape_.n_head)
      return make_error(fmt::format("kv press {}: the scorer returned no scores", name_));
    sc.by_kv_head.resize(static_cast<size_t>(Hkv));
    for (int64_t h = 0; h < Hkv; ++h) {
      auto& r = sc.by_kv_head[static_cast<size_t>(h)];
      r = sc.by_query_head[static_cast<size_t>(h * g)];
      for (int64_t q = 1; q < g; ++q) {
        const auto& x = sc.by_query_head[static_cast<size_t>(h * g + q)];
        for (size_t j = 0; j < r.size(); ++j) r[j] = o_.reduce_max ? std::max(r[j], x[j]) : r[j] + x[j];
      }
      if (!o_.reduce_max && g > 1)
        for (float& v : r) v /= static_cast<float>(g);
    }
  }
  for (int64_t h = 0; h < Hkv; ++h) {
    auto& r = sc.by_kv_head[static_cast<size_t>(h)];
    LC_CHECK(static_cast<int64_t>(r.size()) == kv.n_tokens(il, h));
    for (float& v : r)
      if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();  // NaN would break the order
  }

  keep.assign(static_cast<size_t>(Hkv), {});
  // Candidates per head: unprotected, best first.
  std::vector<std::vector<int32_t>> cand(static_cast<size_t>(Hkv));
  std::vector<int64_t> take(static_cast<size_t>(Hkv), 0);
  for (int64_t h = 0; h < Hkv; ++h) {
    const int64_t n = kv.n_tokens(il, h);
    auto& cd = cand[static_cast<size_t>(h)];
    for (int64_t j = 0; j < n; ++j)
      if (!prot[static_cast<size_t>(h)][static_cast<size_t>(j)]) cd.push_back(static_cast<int32_t>(j));
    const int64_t np = n_prot[static_cast<size_t>(h)];
    if (n <= o_.n_sink + o_.window) take[static_cast<size_t>(h)] = static_cast<int64_t>(cd.size());
    else take[static_cast<size_t>(h)] = std::clamp<int64_t>(target - np, 0, static_cast<int64_t>(cd.size()));
  }

  if (o_.alloc == Alloc::kAdaptive) {
    // AdaKV (Feng et al. 2024): each head keeps its alpha share of its budget (a safeguard),
    // the rest of the layer's budget goes to the globally best remaining entries, so heads
    // end with different budgets. Scores must be comparable across heads (attention weights).
    int64_t pool_left = 0;
    struct Entry { float s; int32_t h, j; };
    std::vector<Entry> rest;
    std::vector<int64_t> safe(static_cast<size_t>(Hkv));
    for (int64_t h = 0; h < Hkv; ++h) {
      auto& cd = cand[static_cast<size_t>(h)];
      const int64_t t = take[static_cast<size_t>(h)];
      const int64_t n_safe = std::min<int64_t>(t, static_cast<int64_t>(std::floor(o_.alpha * static_cast<double>(t))));
      std::sort(cd.begin(), cd.end(), Better{sc.by_kv_head[static_cast<size_t>(h)].data()});
      safe[static_cast<size_t>(h)] = n_safe;
      pool_left += t - n_safe;
      for (size_t i = static_cast<size_t>(n_safe); i < cd.size(); ++i)
        rest.push_back({sc.by_kv_head[static_cast<size_t>(h)][static_cast<size_t>(cd[i])], static_cast<int32_t>(h), cd[i]});
    }
    auto better = [](const Entry& a, const Entry& b) {
      if (a.s != b.s) return a.s > b.s;
      if (a.h != b.h) return a.h < b.h;
      return a.j < b.j;
    };
    const size_t m = static_cast<size_t>(std::min<int64_t>(pool_left, static_cast<int64_t>(rest.size())));
    std::nth_element(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(m), rest.end(), better);
    for (int64_t h = 0; h < Hkv; ++h) {
      auto& cd = cand[static_cast<size_t>(h)];
      keep[static_cast<size_t>(h)].assign(cd.begin(), cd.begin() + safe[static_cast<size_t>(h)]);
    }
    for (size_t i = 0; i < m; ++i) keep[static_cast<size_t>(rest[i].h)].push_back(rest[i].j);
  } else {
    for (int64_t h = 0; h < Hkv; ++h) {
      auto& cd = cand[static_cast<size_t>(h)];
      const auto t = static_cast<std::ptrdiff_t>(take[static_cast<size_t>(h)]);
      if (t < static_cast<std::ptrdiff_t>(cd.size()))
        std::nth_element(cd.begin(), cd.begin() + t, cd.end(), Better{sc.by_kv_head[static_cast<size_t>(h)].data()});
      keep[static_cast<size_t>(h)].assign(cd.begin(), cd.begin() + t);
    }
  }
  for (int64_t h = 0; h < Hkv; ++h) {
    auto& k = keep[static_cast<size_t>(h)];
    const auto& p = prot[static_cast<size_t>(h)];
    for (size_t j = 0; j < p.size(); ++j)
      if (p[j]) k.push_back(static_cast<int32_t>(j));
    std::sort(k.begin(), k.end());
  }
  return ok_status();
}

Status ScoredPress::compress(const PressContext& c, int64_t il) {
  LC_TRY(KvPress::compress(c, il));
  if (!o_.reposition || !o_.schedule.covers(c.phase)) return ok_status();
  // StreamingLLM assigns positions inside the cache: the kept tokens become contiguous,
  // ending at the last held position, so the gap left by evicted tokens disappears (the
  // sinks move forward; the recent window keeps its positions, so queries keep theirs).
  KvCache& kv = *c.kv;
  for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
    const int64_t n = kv.n_tokens(il, h);
    if (n == 0) continue;
    const int32_t* pos = kv.positions(il, h);
    const int32_t last = pos[n - 1];
    int64_t j = 0;
    while (j < n) {
      const int32_t delta = static_cast<int32_t>(last - (n - 1 - j) - pos[j]);
      int64_t e = j + 1;
      while (e < n && static_cast<int32_t>(last - (n - 1 - e) - pos[e]) == delta) ++e;
      if (delta != 0) LC_TRY(kv.shift_positions(il, h, j, e - j, delta));
      pos = kv.positions(il, h);
      j = e;
    }
  }
  return ok_status();
}

class ChainPress final : public KvPress {
 public:
  explicit ChainPress(std::vector<std::unique_ptr<KvPress>> p) : parts_(std::move(p)) {
    sched_ = parts_[0]->schedule();
    for (const auto& q : parts_) {
      const PressSchedule& s = q->schedule();
      sched_.after_prefill |= s.after_prefill;
      sched_.per_chunk |= s.per_chunk;
      sched_.query_aware &= s.query_aware;
      if (s.decode_interval > 0 && (sched_.decode_interval == 0 || s.decode_interval < sched_.decode_interval)) {
        sched_.decode_interval = s.decode_interval;
        sched_.decode_target = s.decode_target;
      }
    }
  }
  std::string spec() const override {
    std::string s;
    for (const auto& q : parts_) {
      if (!s.empty()) s += '+';
      s += q->spec();
    }
    return s;
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override {
    int64_t m = 0;
    for (const auto& q : parts_) m = std::max(m, q->n_obs());
    return m;
  }
  AttentionObserver* observer() override {
    fan_.parts.clear();
    for (const auto& q : parts_)
      if (AttentionObserver* o = q->observer()) fan_.parts.push_back(o);
    return fan_.parts.empty() ? nullptr : fan_.parts.size() == 1 ? fan_.parts[0] : &fan_;
  }
  int64_t lookahead() const override {
    int64_t m = 0;
    for (const auto& q : parts_) {
      if (q->lookahead() == kLookaheadAnswer) return kLookaheadAnswer;
      m = std::max(m, q->lookahead());
    }
    return m;
  }
  const PromptCompression* prompt_compression() const override {
    for (const auto& q : parts_)
      if (const PromptCompression* p = q->prompt_compression()) return p;
    return nullptr;
  }
  Status check_backend(const AttentionCaps& attn) const override {
    for (const auto& q : parts_) LC_TRY(q->check_backend(attn));
    return ok_status();
  }
  Status select(const PressContext&, int64_t, std::vector<std::vector<int32_t>>&) override {
    return make_error("kv press chain: a chain applies its presses in turn; call compress(), not select()");
  }
  Status compress(const PressContext& c, int64_t il) override {
    for (const auto& q : parts_) {
      PressContext ci = c;
      // Each part sees the queries it asked for: the last n_obs() of the prompt's queries, and
      // the draft's lookahead queries and keys (which come after them) only if it looks ahead.
      const int64_t la = q->lookahead() != 0 ? c.n_lookahead : 0;
      const int64_t n_prompt = c.n_obs - c.n_lookahead;
      const int64_t take = std::min(n_prompt, q->n_obs());
      const int64_t skip = n_prompt - take;
      ci.n_obs = take + la;
      ci.n_lookahead = la;
      if (la == 0) ci.lookahead_keys = nullptr;
      if (skip > 0) {
        ci.queries = c.queries ? c.queries + skip * q_stride_ : nullptr;
        ci.query_pos = c.query_pos ? c.query_pos + skip : nullptr;
        ci.query_seq = c.query_seq ? c.query_seq + skip : nullptr;
      }
      LC_TRY(q->compress(ci, il));
    }
    return ok_status();
  }
  void set_q_stride(int64_t s) { q_stride_ = s; }

 private:
  struct FanOut final : AttentionObserver {
    std::vector<AttentionObserver*> parts;
    void observe(const KvCache& kv, int64_t il, const float* q, const int32_t* q_pos, const int32_t* q_seq, int64_t n,
                 ThreadPool* pool, const float* row_lse) override {
      for (auto* o : parts) o->observe(kv, il, q, q_pos, q_seq, n, pool, row_lse);
    }
    void truncate(int64_t n_seq) override {
      for (auto* o : parts) o->truncate(n_seq);
    }
  };
  std::vector<std::unique_ptr<KvPress>> parts_;
  PressSchedule sched_;
  FanOut fan_;
  int64_t q_stride_ = 0;  // floats per query row: n_head * head_dim
};

// SpecPC compresses the prompt before prefill; the cache is never touched by it afterwards.
class SpecPcPress final : public KvPress {
 public:
  SpecPcPress(PromptCompression p, bool aware) : p_(p) {
    sched_.after_prefill = false;
    sched_.query_aware = aware;
  }
  std::string spec() const override { return specpc_spec(p_, sched_.query_aware); }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override { return 0; }
  const PromptCompression* prompt_compression() const override { return &p_; }
  Status select(const PressContext&, int64_t, std::vector<std::vector<int32_t>>& keep) override {
    keep.clear();
    return ok_status();
  }

 private:
  PromptCompression p_;
  PressSchedule sched_;
};

// The registry's entries in the list's order (kv/press_list.h).
struct RegistryEntry {
  const char* name;
  const char* help;
  const char* paper;
  bool scorer;
};
const std::vector<RegistryEntry>& registry() {
  static const std::vector<RegistryEntry> kEntries = {
#define LC_PRESS_SCORER(name, help, paper) {#name, help, paper, true},
#define LC_PRESS_FRAME(name, help, paper) {#name, help, paper, false},
#define LC_PRESS_CUSTOM(name, help, paper) {#name, help, paper, false},
#include "kv/press_list.h"
  };
  return kEntries;
}

// The help of query=, read by the scored presses and by specpc.
constexpr const char* kQueryHelp =
    "aware: compress with the whole prompt in; agnostic: after the context, before the question is read "
    "(run --question, bench run)";

// keys: when non-null, receives every key the spec's parser read (kv_press_method_info).
Expected<std::unique_ptr<KvPress>> make_one(std::string_view spec, const PressShape& shape,
                                            std::vector<std::string>* keys = nullptr,
                                            std::vector<MethodKey>* key_info = nullptr) {
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  const std::string_view params = colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  std::string sname(name);
  {
    using CustomFactory = Expected<std::unique_ptr<KvPress>> (*)(Args&, const PressShape&);
    static const std::vector<std::pair<std::string, CustomFactory>> kCustom = {
#define LC_PRESS_CUSTOM(name, help, paper) {#name, make_press_##name},
#include "kv/press_list.h"
    };
    for (const auto& [n, f] : kCustom) {
      if (n != sname) continue;
      LC_ASSIGN_OR_RETURN(Args a, Args::parse(name, params));
      LC_ASSIGN_OR_RETURN(std::unique_ptr<KvPress> p, f(a, shape));
      if (keys) *keys = a.accepted();
      if (key_info) *key_info = a.key_info();
      LC_TRY(a.finish());
      return p;
    }
  }
  if (sname == "specpc") {
    LC_ASSIGN_OR_RETURN(Args a, Args::parse(name, params));
    LC_ASSIGN_OR_RETURN(PromptCompression pc, parse_specpc(a));
    LC_ASSIGN_OR_RETURN(std::string q, a.choice("query", "aware", {"aware", "agnostic"}, kQueryHelp));
    if (keys) *keys = a.accepted();
    if (key_info) *key_info = a.key_info();
    LC_TRY(a.finish());
    return std::unique_ptr<KvPress>(std::make_unique<SpecPcPress>(pc, q == "aware"));
  }
  Alloc alloc = Alloc::kUniform;
  std::string scorer_name = sname;
  if (sname == "pyramidkv") alloc = Alloc::kPyramid, scorer_name = "snapkv";
  if (sname == "adakv") alloc = Alloc::kAdaptive;
  LC_ASSIGN_OR_RETURN(Args a, Args::parse(name, params));

  if (alloc == Alloc::kAdaptive) {
    LC_ASSIGN_OR_RETURN(scorer_name, a.text("inner", "expected_attention",
                                            "the scorer whose scores get head-wise budgets (any scorer press; "
                                            "its keys are accepted here)"));
    // Only LC_PRESS_SCORER entries are in the scorer table: adakv, pyramidkv, specpc are not.
    if (!find_scorer(scorer_name)) {
      std::vector<std::string> scorers;
      for (const RegistryEntry& e : registry())
        if (e.scorer) scorers.emplace_back(e.name);
      return make_error(fmt::format("kv press adakv: inner={}: expected a scorer ({})", scorer_name,
                                    join(scorers)));
    }
  }
  const ScorerFactory* f = find_scorer(scorer_name);
  if (!f) {
    std::string names;
    for (const auto& [n, help] : kv_press_methods()) {
      if (!names.empty()) names += ", ";
      names += n;
    }
    return make_error(fmt::format("kv press \"{}\": unknown press (accepted: {})", sname, names));
  }
  LC_ASSIGN_OR_RETURN(std::unique_ptr<PressScorer> scorer, (*f)(a, shape));

  Options o;
  o.alloc = alloc;
  if (a.has("ratio") && a.has("budget"))
    return make_error(fmt::format("kv press {}: give ratio= or budget=, not both", sname));
  LC_ASSIGN_OR_RETURN(o.budget, a.integer("budget", -1, 1, INT32_MAX,
                                          "tokens kept per KV head of each layer (pyramidkv, adakv: on average), "
                                          "at least n_sink + window; not with ratio="));
  LC_ASSIGN_OR_RETURN(o.ratio, a.number("ratio", -1, 0, 1,
                                        "fraction of a layer's tokens removed, keeping floor((1 - ratio) x n); "
                                        "0.5 when none of ratio=, budget=, interval= is given"));
  LC_ASSIGN_OR_RETURN(o.n_sink, a.integer("n_sink", scorer->default_sinks(), 0, INT32_MAX,
                                          "first tokens of the sequence, never evicted (attention sinks), tokens"));
  LC_ASSIGN_OR_RETURN(o.window, a.integer("window", scorer->default_window(), 0, INT32_MAX,
                                          "most recent tokens, never evicted, tokens"));
  LC_ASSIGN_OR_RETURN(std::string red, a.choice("reduce", scorer->default_reduce_max() ? "max" : "mean", {"mean", "max"},
                                                "how the per-query-head scores of a GQA group become one per KV "
                                                "head"));
  o.reduce_max = red == "max";
  LC_ASSIGN_OR_RETURN(int64_t chunk, a.integer("chunk", 0, 0, 1,
                                               "1: compress after every prefill chunk as well, so memory stays "
                                               "near the budget + one chunk (needs ratio= or budget=)"));
  o.schedule.per_chunk = chunk == 1;
  LC_ASSIGN_OR_RETURN(o.schedule.decode_interval, a.integer("interval", 0, 0, INT32_MAX,
                                                            "while decoding, compress every N generated tokens "
                                                            "(with target=; 0: never), tokens"));
  LC_ASSIGN_OR_RETURN(o.schedule.decode_target, a.integer("target", 0, 0, INT32_MAX,
                                                          "tokens per KV head the decoding compression keeps (with "
                                                          "interval=), at least n_sink + window"));
  if ((o.schedule.decode_interval > 0) != (o.schedule.decode_target > 0))
    return make_error(fmt::format("kv press {}: decoding compression needs both interval= and target=", sname));
  LC_ASSIGN_OR_RETURN(std::string q, a.choice("query", "aware", {"aware", "agnostic"}, kQueryHelp));
  o.schedule.query_aware = q == "aware";
  LC_ASSIGN_OR_RETURN(int64_t rep, a.integer("reposition", sname == "streaming_llm" ? 1 : 0, 0, 1,
                                             "1: after compressing, make the kept tokens' positions contiguous "
                                             "(re-rotating moved keys), as StreamingLLM"));
  o.reposition = rep == 1;
  if (alloc == Alloc::kPyramid) {
    LC_ASSIGN_OR_RETURN(o.beta, a.number("beta", 20, 1, 1e6,
                                         "layer budgets fall linearly from 2K - K/beta (first layer) to K/beta "
                                         "(last), K the mean budget, the first layers clamped to the tokens present "
                                         "(kvpress's schedule)"));
  }
  if (alloc == Alloc::kAdaptive) {
    LC_ASSIGN_OR_RETURN(o.alpha, a.number("alpha", 0.2, 0, 1,
                                          "fraction of each head's budget it keeps by its own scores; the rest "
                                          "goes to the layer's best scores across heads"));
  }
  if (keys) *keys = a.accepted();
  if (key_info) *key_info = a.key_info();
  LC_TRY(a.finish());
  // A press given no budget compresses by half after prefill, unless it only compresses
  // while decoding.
  if (o.ratio < 0 && o.budget < 0 && o.schedule.decode_interval == 0) o.ratio = 0.5;
  o.schedule.after_prefill = o.ratio >= 0 || o.budget >= 0;
  if (o.schedule.per_chunk && !o.schedule.after_prefill)
    return make_error(fmt::format("kv press {}: chunk=1 needs ratio= or budget=", sname));
  if (scorer->lookahead() != 0 && (o.schedule.per_chunk || o.schedule.decode_interval > 0 || !o.schedule.after_prefill))
    return make_error(fmt::format("kv press {}: the draft looks ahead once, after the prompt: chunk= and interval= are "
                                  "not supported", sname));
  if (o.schedule.decode_interval > 0 && o.schedule.decode_target < o.n_sink + o.window)
    return make_error(fmt::format("kv press {}: target={} is below n_sink + window = {}", sname,
                                  o.schedule.decode_target, o.n_sink + o.window));
  if (o.budget >= 0 && o.budget < o.n_sink + o.window)
    return make_error(fmt::format("kv press {}: budget={} is below n_sink + window = {}", sname,
                                  o.budget, o.n_sink + o.window));
  return std::unique_ptr<KvPress>(std::make_unique<ScoredPress>(sname, o, std::move(scorer), shape));
}

}  // namespace

int64_t BudgetKeys::kept(int64_t n_seen) const {
  if (budget >= 0) return std::min(budget, n_seen);
  return static_cast<int64_t>(std::floor((1.0 - ratio) * static_cast<double>(n_seen) + 1e-9));
}

std::string BudgetKeys::spec() const {
  std::string s = budget >= 0 ? fmt::format("budget={}", budget) : "ratio=" + fmt_num(ratio);
  return s + (query_aware ? ",query=aware" : ",query=agnostic");
}

Expected<BudgetKeys> parse_budget_keys(Args& a, double default_ratio) {
  BudgetKeys b;
  if (a.has("ratio") && a.has("budget"))
    return make_error(fmt::format("kv press {}: give ratio= or budget=, not both", a.name()));
  LC_ASSIGN_OR_RETURN(b.budget, a.integer("budget", -1, 1, INT32_MAX, "tokens kept per KV head of each layer; not with ratio="));
  LC_ASSIGN_OR_RETURN(b.ratio, a.number("ratio", -1, 0, 1,
                                        fmt::format("fraction of a layer's tokens removed, keeping floor((1 - ratio) x n); "
                                                    "{} when budget= is not given", fmt_num(default_ratio)).c_str()));
  if (b.ratio < 0 && b.budget < 0) b.ratio = default_ratio;
  LC_ASSIGN_OR_RETURN(std::string q, a.choice("query", "aware", {"aware", "agnostic"}, kQueryHelp));
  b.query_aware = q == "aware";
  return b;
}

std::vector<int32_t> top_k(const float* score, std::vector<int32_t> cand, int64_t k) {
  const auto t = static_cast<std::ptrdiff_t>(std::clamp<int64_t>(k, 0, static_cast<int64_t>(cand.size())));
  if (t < static_cast<std::ptrdiff_t>(cand.size()))
    std::nth_element(cand.begin(), cand.begin() + t, cand.end(), Better{score});
  cand.resize(static_cast<size_t>(t));
  std::sort(cand.begin(), cand.end());
  return cand;
}

const ScorerFactory* find_scorer(std::string_view name) {
  static const std::vector<std::pair<std::string, ScorerFactory>> kScorers = {
#define LC_PRESS_SCORER(name, help, paper) {#name, make_##name},
#include "kv/press_list.h"
  };
  for (const auto& [n, f] : kScorers)
    if (n == name) return &f;
  return nullptr;
}

}  // namespace press

std::vector<std::pair<std::string, std::string>> kv_press_methods() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const press::RegistryEntry& e : press::registry()) out.emplace_back(e.name, e.help);
  return out;
}

std::vector<PressMethodInfo> kv_press_method_info() {
  // The keys come from parsing the bare name for a small valid shape: every press parses with
  // its defaults alone, and the parser records each key it reads.
  const PressShape shape{1, 1, 1, 8, 8, 0.0f};
  std::vector<PressMethodInfo> out;
  for (const press::RegistryEntry& e : press::registry()) {
    PressMethodInfo m{e.name, e.help, e.paper, e.scorer, {}, {}};
    auto p = press::make_one(e.name, shape, &m.keys, &m.key_info);
    LC_CHECK(p.has_value());  // a registry entry that does not parse with its defaults is a bug
    out.push_back(std::move(m));
  }
  return out;
}

Expected<std::unique_ptr<KvPress>> make_kv_press(std::string_view spec, const PressShape& shape) {
  if (shape.n_head <= 0 || shape.n_head_kv <= 0 || shape.n_head % shape.n_head_kv != 0 || shape.head_dim <= 0)
    return make_error(fmt::format("kv press: bad shape (n_head {}, n_head_kv {}, head_dim {})",
                                  shape.n_head, shape.n_head_kv, shape.head_dim));
  if (spec.empty()) return make_error("kv press: empty spec (expected NAME[:key=value,...][+NAME...])");
  std::vector<std::unique_ptr<KvPress>> parts;
  size_t i = 0;
  while (i <= spec.size()) {
    size_t j = spec.find('+', i);
    if (j == std::string_view::npos) j = spec.size();
    LC_ASSIGN_OR_RETURN(auto p, press::make_one(spec.substr(i, j - i), shape));
    parts.push_back(std::move(p));
    i = j + 1;
  }
  if (parts.size() == 1) return std::move(parts[0]);
  auto chain = std::make_unique<press::ChainPress>(std::move(parts));
  chain->set_q_stride(shape.n_head * shape.head_dim);
  return std::unique_ptr<KvPress>(std::move(chain));
}

}  // namespace lc
