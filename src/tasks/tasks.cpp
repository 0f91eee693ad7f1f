#include "tasks/tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tasks/haystack.h"
#include "tasks/needles.h"
#include "tasks/task_impl.h"
#include "tasks/text.h"

namespace lc::tasks {

const char* metric_name(Metric m) {
  switch (m) {
    case Metric::kMatchAll: return "string_match_all";
    case Metric::kMatchPart: return "string_match_part";
    case Metric::kFirstNumber: return "first_number";
  }
  return "?";
}

namespace {

struct TaskEntry {
  TaskInfo info;
  detail::MakeLayouts make;
};

const std::vector<TaskEntry>& entries() {
  using M = Metric;
  // Answer budgets are RULER's tokens_to_generate (synthetic.yaml / constants.py).
  static const std::vector<TaskEntry> v = {
      {{"niah_single_1", "ruler", "one needle (word key, number value) in the noise haystack", M::kMatchAll, 128, true}, detail::make_niah},
      {{"niah_single_2", "ruler", "one needle (word key, number value) in the essay haystack", M::kMatchAll, 128, true}, detail::make_niah},
      {{"niah_single_3", "ruler", "one needle (word key, UUID value) in the essay haystack", M::kMatchAll, 128, true}, detail::make_niah},
      {{"niah_multikey_1", "ruler", "the queried needle among 3 distractor needles, essay haystack", M::kMatchAll, 128, true}, detail::make_niah},
      {{"niah_multikey_2", "ruler", "one needle in a haystack made of needles (word keys, numbers)", M::kMatchAll, 128, true}, detail::make_niah},
      {{"niah_multikey_3", "ruler", "one needle in a haystack made of needles (UUID keys and values)", M::kMatchAll, 128, true}, detail::make_niah},
      {{"niah_multivalue", "ruler", "all 4 values of one key, essay haystack", M::kMatchAll, 128, true}, detail::make_niah},
      {{"niah_multiquery", "ruler", "the values of 4 keys asked at once, essay haystack", M::kMatchAll, 128, true}, detail::make_niah},
      {{"vt", "ruler", "variable tracking: every variable of a 4-hop assignment chain", M::kMatchAll, 30, false}, detail::make_vt},
      {{"cwe", "ruler", "common-words extraction: the 10 words repeated most in a list", M::kMatchAll, 120, false}, detail::make_cwe},
      {{"fwe", "ruler", "frequent-words extraction: the 3 most frequent coded words (Zipf, a=2)", M::kMatchAll, 50, false}, detail::make_fwe},
      {{"qa_1", "ruler", "single-hop QA over synthetic documents (substitute for SQuAD)", M::kMatchPart, 32, true}, detail::make_qa},
      {{"qa_2", "ruler", "two-hop QA over synthetic documents (substitute for HotpotQA)", M::kMatchPart, 32, true}, detail::make_qa},
      {{"passkey", "passkey", "a 5-digit pass key hidden in the noise haystack", M::kMatchAll, 16, true}, detail::make_passkey},
      {{"babilong_1", "babilong", "bAbI, 1 supporting fact (where is X?) scattered in book text", M::kMatchAll, 16, false}, detail::make_babilong},
      {{"babilong_2", "babilong", "bAbI, 2 supporting facts (where is the object?) in book text", M::kMatchAll, 16, false}, detail::make_babilong},
      {{"babilong_3", "babilong", "bAbI, 3 supporting facts (where was the object before?) in book text", M::kMatchAll, 16, false}, detail::make_babilong},
      {{"dense_count", "dense", "count one kind of event over every observation", M::kFirstNumber, 16, false}, detail::make_dense},
      {{"dense_state", "dense", "final position of a ball after every swap of boxes", M::kMatchAll, 16, false}, detail::make_dense},
      {{"dense_majority", "dense", "the value observed most often over all observations", M::kMatchAll, 16, false}, detail::make_dense},
  };
  return v;
}

const TaskEntry* find_entry(std::string_view name) {
  for (const auto& e : entries())
    if (e.info.name == name) return &e;
  return nullptr;
}

}  // namespace

const std::vector<TaskInfo>& task_list() {
  static const std::vector<TaskInfo> v = [] {
    std::vector<TaskInfo> r;
    for (const auto& e : entries()) r.push_back(e.info);
    return r;
  }();
  return v;
}

const TaskInfo* find_task(std::string_view name) {
  const TaskEntry* e = find_entry(name);
  return e ? &e->info : nullptr;
}

Expected<std::vector<std::string>> expand_task_names(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto add = [&](const std::string& n) {
    if (seen.insert(n).second) out.push_back(n);
  };
  for (const std::string& n : names) {
    if (n.empty()) continue;
    if (n == "all") {
      for (const auto& t : task_list()) add(t.name);
      continue;
    }
    bool group = false;
    for (const auto& t : task_list()) {
      if (t.family == n) {
        add(t.name);
        group = true;
      }
    }
    if (group) continue;
    if (!find_task(n)) {
      std::string known;
      for (const auto& t : task_list()) known += " " + t.name;
      return make_error(fmt::format("unknown task '{}' (groups: all ruler passkey babilong dense; tasks:{})",
                                    n, known));
    }
    add(n);
  }
  if (out.empty()) return make_error("no task selected");
  return out;
}

const std::vector<int>& ruler_depths() {
  static const std::vector<int> v = [] {
    std::vector<int> d;
    for (int i = 0; i < 40; ++i) d.push_back(static_cast<int>(std::lround(i * 100.0 / 39.0)));
    return d;
  }();
  return v;
}

std::string PromptRenderer::text(const std::string& user, const std::string& answer_prefix) const {
  // A prompt never ends in a space (RULER's variable-tracking prefix does): the space would be
  // a lone token that sub-word models hardly ever see before a word, because they learn the
  // space as part of the next word's token. The answer then starts with its space.
  std::string_view prefix = answer_prefix;
  while (!prefix.empty() && prefix.back() == ' ') prefix.remove_suffix(1);
  if (tmpl_ == ChatTemplate::kNone) return user + std::string(prefix);
  // The prefix opens the assistant's turn, where a leading space would be out of place.
  while (!prefix.empty() && prefix.front() == ' ') prefix.remove_prefix(1);
  return apply_chat_template(tmpl_, {{"user", user}}, true) + std::string(prefix);
}

std::vector<int32_t> PromptRenderer::tokens(const std::string& user, const std::string& answer_prefix) const {
  // Special-token text is parsed only in the template's own markup (tokenize_chat): a haystack
  // that happened to contain "<s>" or "<|im_end|>" stays text, with or without a template.
  if (tmpl_ == ChatTemplate::kNone) return tok_.encode(text(user, answer_prefix), true, false);
  const std::string full = text(user, answer_prefix);
  const std::string rendered = apply_chat_template(tmpl_, {{"user", user}}, true);
  const std::vector<ChatPart> chat = chat_template_parts(tmpl_, {{"user", user}}, true);
  std::vector<Tokenizer::TextPart> parts;
  for (const ChatPart& p : chat) parts.push_back({p.text, !p.is_content});
  parts.push_back({std::string_view(full).substr(rendered.size()), false});  // the answer prefix
  return tok_.encode_parts(parts, true);
}

namespace detail {

std::vector<std::string> noise_haystack(int64_t n) {
  const auto& s = noise_sentences();
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(s[static_cast<size_t>(i) % s.size()]);
  return out;
}

}  // namespace detail

std::vector<double> needle_depths(Rng& rng, int depth, size_t k) {
  const auto& grid = ruler_depths();
  std::vector<double> out;
  std::vector<int> pool;
  for (int d : grid)
    if (d != depth) pool.push_back(d);
  if (depth >= 0) out.push_back(depth);
  const auto pick = sample_without_replacement(rng, static_cast<int64_t>(pool.size()),
                                               static_cast<int64_t>(k - out.size()));
  for (int64_t i : pick) out.push_back(pool[static_cast<size_t>(i)]);
  while (out.size() < k) out.push_back(grid[static_cast<size_t>(uniform(rng, 0, 39))]);  // k > 40
  return out;
}

std::string assemble(const std::vector<std::string>& hay, const std::vector<Insert>& inserts,
                     const std::string& sep, bool own_line, std::vector<Needle>* needles) {
  const size_t n = hay.size();
  // Boundary b sits before sentence b; its depth is the share of haystack text before it.
  // Sentences differ in length (the essay's run to a hundred words), so a depth picks the
  // boundary nearest in text, not in sentence count.
  std::vector<double> cum(n + 1, 0.0);
  for (size_t b = 0; b < n; ++b) cum[b + 1] = cum[b] + static_cast<double>(hay[b].size() + sep.size());
  const double total = cum[n] > 0 ? cum[n] : 1.0;
  const bool partial_tail = n > 0 && !hay[n - 1].empty() && std::string(".!?").find(hay[n - 1].back()) == std::string::npos;
  // (boundary, insert index), stable: equal boundaries keep the inserts' order.
  std::vector<std::pair<size_t, size_t>> at;
  for (size_t i = 0; i < inserts.size(); ++i) {
    const double d = std::clamp(inserts[i].depth, 0.0, 100.0) / 100.0;
    const size_t hi = static_cast<size_t>(std::lower_bound(cum.begin(), cum.end(), d * total) - cum.begin());
    size_t b = std::min(hi, n);
    if (b > 0 && d * total - cum[b - 1] <= cum[b] - d * total) --b;
    // An essay haystack is cut at a word, so its last sentence may be unfinished: nothing goes
    // after it, so that every insert sits at a true sentence boundary.
    if (b == n && partial_tail) --b;
    at.emplace_back(b, i);
  }
  std::stable_sort(at.begin(), at.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  std::vector<size_t> pos(inserts.size(), 0);
  size_t k = 0;
  bool line_start = true;  // the next piece starts a line (or the text)
  auto put = [&](const std::string& s, bool is_insert, size_t idx) {
    if (!out.empty()) {
      if (own_line && (is_insert || line_start)) {
        out += '\n';
      } else {
        out += sep;
      }
    }
    if (is_insert) pos[idx] = out.size();
    out += s;
    line_start = is_insert && own_line;
  };
  for (size_t b = 0; b <= n; ++b) {
    while (k < at.size() && at[k].first == b) {
      put(inserts[at[k].second].text, true, at[k].second);
      ++k;
    }
    if (b < n) put(hay[b], false, 0);
  }
  if (needles) {
    needles->clear();
    for (size_t i = 0; i < inserts.size(); ++i) {
      Needle nd;
      nd.text = inserts[i].text;
      nd.pos = pos[i];
      nd.depth = out.empty() ? 0.0 : static_cast<double>(pos[i]) / static_cast<double>(out.size());
      needles->push_back(std::move(nd));
    }
  }
  return out;
}

namespace {

// The search: the largest haystack whose prompt leaves the answer budget free.
struct Fit {
  detail::Built built;
  std::vector<int32_t> tokens;
  int64_t units = 0;
};

Expected<Fit> fit_layout(const PromptRenderer& r, const detail::Layout& lay, int64_t budget,
                         int64_t* min_tokens) {
  auto eval = [&](int64_t u, Fit& f) -> Expected<bool> {
    LC_ASSIGN_OR_RETURN(f.built, lay.build(u));
    f.tokens = r.tokens(f.built.user, f.built.answer_prefix);
    f.units = u;
    return static_cast<int64_t>(f.tokens.size()) <= budget;
  };
  Fit lo_fit;
  LC_ASSIGN_OR_RETURN(bool ok0, eval(lay.min_units, lo_fit));
  if (!ok0) {
    *min_tokens = static_cast<int64_t>(lo_fit.tokens.size());
    return make_error(ErrorCode::kTooShort, "does not fit");
  }
  int64_t lo = lay.min_units;
  const int64_t n_lo = static_cast<int64_t>(lo_fit.tokens.size());
  // Tokens per unit from a small probe, to aim the first guess close to the answer.
  Fit probe;
  LC_ASSIGN_OR_RETURN(bool ok1, eval(lo + 8, probe));
  double per = std::max(0.25, static_cast<double>(static_cast<int64_t>(probe.tokens.size()) - n_lo) / 8.0);
  int64_t hi = -1;  // smallest size known not to fit
  if (ok1) {
    lo = probe.units;
    lo_fit = std::move(probe);
  } else {
    hi = lo + 8;
  }
  Fit f;
  if (hi < 0) {
    // Gallop from the estimate until a size does not fit.
    int64_t u = lo + std::max<int64_t>(1, static_cast<int64_t>((budget - static_cast<int64_t>(lo_fit.tokens.size())) / per));
    for (;;) {
      LC_ASSIGN_OR_RETURN(bool ok, eval(u, f));
      if (!ok) {
        hi = u;
        break;
      }
      lo = u;
      lo_fit = std::move(f);
      u = lo + std::max<int64_t>(1, static_cast<int64_t>((budget - static_cast<int64_t>(lo_fit.tokens.size())) / per)) +
          (lo - lay.min_units) / 16 + 1;
    }
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    LC_ASSIGN_OR_RETURN(bool ok, eval(mid, f));
    if (ok) {
      lo = mid;
      lo_fit = std::move(f);
    } else {
      hi = mid;
    }
  }
  return lo_fit;
}

}  // namespace

Expected<Sample> make_sample(const PromptRenderer& r, const SampleSpec& spec) {
  const TaskEntry* e = find_entry(spec.task);
  if (!e) return make_error(fmt::format("unknown task '{}'", spec.task));
  if (spec.length < 16)
    return make_error(ErrorCode::kTooShort, fmt::format("{}: length {} is too short", spec.task, spec.length));
  if (spec.depth > 100) return make_error(fmt::format("{}: depth {} is not a percentage", spec.task, spec.depth));
  Sample s;
  s.spec = spec;
  if (!e->info.uses_depth) s.spec.depth = -1;  // one cell, whatever depth was asked
  s.seed = sample_seed(spec.seed, spec.task, spec.length, s.spec.depth, spec.index);
  s.budget_new_tokens = e->info.new_tokens;
  if (spec.opts.max_new_tokens > 0) s.budget_new_tokens = std::min(s.budget_new_tokens, spec.opts.max_new_tokens);
  const int64_t budget = spec.length - s.budget_new_tokens;
  LC_ASSIGN_OR_RETURN(std::vector<detail::Layout> layouts, e->make(r, s.spec, s.seed));
  int64_t need = INT64_MAX;
  for (const auto& lay : layouts) {
    int64_t min_tokens = 0;
    auto f = fit_layout(r, lay, budget, &min_tokens);
    if (!f) {
      if (f.error().code != ErrorCode::kTooShort) return f.error();
      need = std::min(need, min_tokens + s.budget_new_tokens);
      continue;
    }
    s.context = std::move(f->built.context);
    s.user = std::move(f->built.user);
    s.answer_prefix = std::move(f->built.answer_prefix);
    s.answers = std::move(f->built.answers);
    s.needles = std::move(f->built.needles);
    s.info = std::move(f->built.info);
    s.tokens = std::move(f->tokens);
    s.size_units = f->units;
    s.unit = lay.unit;
    s.n_prompt = static_cast<int64_t>(s.tokens.size());
    s.n_context_tokens = s.n_prompt - 1;  // fallback: all but the last token
    {
      // Every task's user message is instructions + context + question: the context ends where
      // the question starts. Its byte offset in the rendered prompt, then the token prefix.
      const std::string full = r.text(s.user, s.answer_prefix);
      const size_t cpos = s.context.empty() ? std::string::npos : s.user.rfind(s.context);
      const size_t upos = full.find(s.user);
      if (cpos != std::string::npos && upos != std::string::npos) {
        const std::string head = full.substr(0, upos + cpos + s.context.size());
        // The template's markup before the message parsed for special tokens, the message not.
        const std::vector<int32_t> ht = r.tokenizer().encode_parts(
            {{std::string_view(head).substr(0, upos), r.chat_template() != ChatTemplate::kNone},
             {std::string_view(head).substr(upos), false}},
            true);
        size_t i = 0;
        while (i < ht.size() && i < s.tokens.size() && ht[i] == s.tokens[i]) ++i;
        s.n_context_tokens = std::min<int64_t>(static_cast<int64_t>(i), s.n_prompt - 1);
      }
    }
    s.max_new_tokens = spec.length - s.n_prompt;
    s.input_hash = hex64(fnv1a_ids(s.tokens));
    return s;
  }
  return make_error(ErrorCode::kTooShort, fmt::format("{}: length {} is too short: the smallest prompt plus a {}-token answer "
                              "needs {} tokens",
                              spec.task, spec.length, s.budget_new_tokens,
                              need));
}

}  // namespace lc::tasks
