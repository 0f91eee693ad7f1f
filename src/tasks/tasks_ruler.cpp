// The RULER tasks (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your
// Long-Context Language Models?"). Templates, answer prefixes, the needle sentence, the noise
// haystack, the one-shot examples of vt and cwe, task settings and answer budgets are written
// byte for byte after RULER's scripts/data/synthetic/ (constants.py, niah.py,
// variable_tracking.py, common_words_extraction.py, freq_words_extraction.py, qa.py) and
// synthetic.yaml; the haystack fitting, depths, essay text and QA documents are ours
// (docs/benchmarks.md lists every difference).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tasks/haystack.h"
#include "tasks/needles.h"
#include "tasks/task_impl.h"
#include "tasks/text.h"

namespace lc::tasks::detail {

namespace {

std::string draw(Rng& rng, const std::string& kind) {
  if (kind == "numbers") return random_number(rng, 7);
  if (kind == "uuids") return random_uuid(rng);
  return random_key_word(rng);
}

struct NiahCfg {
  std::string haystack;  // noise, essay, needle
  std::string key_type, value_type;
  int nk = 1, nv = 1, nq = 1;
};

NiahCfg niah_cfg(const std::string& task) {
  // RULER synthetic.yaml.
  if (task == "niah_single_1") return {"noise", "words", "numbers", 1, 1, 1};
  if (task == "niah_single_2") return {"essay", "words", "numbers", 1, 1, 1};
  if (task == "niah_single_3") return {"essay", "words", "uuids", 1, 1, 1};
  if (task == "niah_multikey_1") return {"essay", "words", "numbers", 4, 1, 1};
  if (task == "niah_multikey_2") return {"needle", "words", "numbers", 1, 1, 1};
  if (task == "niah_multikey_3") return {"needle", "uuids", "uuids", 1, 1, 1};
  if (task == "niah_multivalue") return {"essay", "words", "numbers", 1, 4, 1};
  return {"essay", "words", "numbers", 4, 1, 4};  // niah_multiquery
}

}  // namespace
}  // namespace lc::tasks::detail

namespace lc::tasks {

std::string needle_sentence(const std::string& type, const std::string& key, const std::string& value) {
  return "One of the special magic " + type + " for " + key + " is: " + value + ".";
}

NiahWording niah_single_wording(const std::string& type, const std::string& query) {
  const std::string t = type.substr(0, type.size() - 1);
  return {"A special magic " + t + " is hidden within the following text. Make sure to memorize it. "
          "I will quiz you about the " + t + " afterwards.\n",
          "\nWhat is the special magic " + t + " for " + query + " mentioned in the provided text?",
          " The special magic " + t + " for " + query + " mentioned in the provided text is"};
}

}  // namespace lc::tasks

namespace lc::tasks::detail {

Expected<std::vector<Layout>> make_niah(const PromptRenderer& /*r*/, const SampleSpec& spec, uint64_t seed) {
  const NiahCfg c = niah_cfg(spec.task);
  const std::vector<std::string>* words = nullptr;
  if (c.haystack == "essay") {
    LC_ASSIGN_OR_RETURN(words, essay_words());
  }
  Layout lay;
  lay.unit = c.haystack == "essay" ? "words" : c.haystack == "noise" ? "blocks" : "needles";
  lay.min_units = 0;
  const int depth = spec.depth;
  lay.build = [c, seed, depth, words](int64_t units) -> Expected<Built> {
    Rng rng(seed);
    const int nk = std::max(c.nk, c.nq);
    std::set<std::string> used;  // keys and values are unique in the whole context
    auto fresh = [&](const std::string& kind) {
      for (;;) {
        std::string v = draw(rng, kind);
        if (used.insert(v).second) return v;
      }
    };
    std::vector<std::string> keys;
    std::vector<std::vector<std::string>> values;
    for (int k = 0; k < nk; ++k) {
      keys.push_back(fresh(c.key_type));
      values.emplace_back();
      for (int v = 0; v < c.nv; ++v) values.back().push_back(fresh(c.value_type));
    }
    std::vector<int64_t> queried = sample_without_replacement(rng, nk, c.nq);
    // The queried needles come first, so that needles[0] is the one at the requested depth.
    std::vector<Insert> inserts;
    std::vector<std::string> answers;
    std::vector<bool> is_q(static_cast<size_t>(nk), false);
    for (int64_t q : queried) is_q[static_cast<size_t>(q)] = true;
    for (int64_t q : queried)
      for (const auto& v : values[static_cast<size_t>(q)]) {
        inserts.push_back({0, needle_sentence(c.value_type, keys[static_cast<size_t>(q)], v)});
        answers.push_back(v);
      }
    for (int k = 0; k < nk; ++k)
      if (!is_q[static_cast<size_t>(k)])
        for (const auto& v : values[static_cast<size_t>(k)])
          inserts.push_back({0, needle_sentence(c.value_type, keys[static_cast<size_t>(k)], v)});
    const std::vector<double> depths = needle_depths(rng, depth, inserts.size());
    for (size_t i = 0; i < inserts.size(); ++i) inserts[i].depth = depths[i];

    std::vector<std::string> hay;
    std::string sep = " ";
    bool own_line = false;
    if (c.haystack == "noise") {
      // RULER: [block] * n joined by new lines, each needle on a line of its own.
      hay.assign(static_cast<size_t>(units), noise_block());
      sep = "\n";
      own_line = true;
    } else if (c.haystack == "essay") {
      const size_t start = essay_sentence_start(*words, static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(words->size()) - 1)));
      hay = essay_sentences(*words, start, static_cast<size_t>(units));
    } else {
      // A haystack of needles: each line another key and value. A generator of its own keeps
      // the first n distractors the same whatever n is.
      Rng hr(mix64(seed ^ 0x6e6565646c6573ull));
      for (int64_t i = 0; i < units; ++i) {
        std::string k, v;
        do k = draw(hr, c.key_type); while (used.count(k));
        do v = draw(hr, c.value_type); while (used.count(v));
        hay.push_back(needle_sentence(c.value_type, k, v));
      }
      sep = "\n";
      own_line = true;
    }
    Built b;
    b.context = assemble(hay, inserts, sep, own_line, &b.needles);
    std::string query;
    for (size_t i = 0; i < queried.size(); ++i) {
      if (i) query += i + 1 == queried.size() ? ", and " : ", ";
      query += keys[static_cast<size_t>(queried[i])];
    }
    if (c.nq * c.nv == 1) {  // RULER's singular wording
      const NiahWording w = niah_single_wording(c.value_type, query);
      b.user = w.head + b.context + w.question;
      b.answer_prefix = w.answer_prefix;
    } else {
      const std::string& t = c.value_type;
      b.user = "Some special magic " + t + " are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the " + t + " afterwards.\n" + b.context +
               "\nWhat are all the special magic " + t + " for " + query + " mentioned in the provided text?";
      b.answer_prefix = " The special magic " + t + " for " + query + " mentioned in the provided text are";
    }
    b.answers = answers;
    b.info = {{"haystack", c.haystack}, {"keys", std::to_string(nk)}, {"query", query}};
    return b;
  };
  return std::vector<Layout>{lay};
}

}  // namespace lc::tasks::detail

namespace lc::tasks {

// RULER's variable-tracking template and answer prefix (constants.py, 'variable_tracking').
std::string vt_head() {
  return "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
}
std::string vt_question(const std::string& value) {
  return "\nQuestion: Find all variables that are assigned the value " + value + " in the text above.";
}
std::string vt_answer_prefix(size_t num_v, const std::string& value) {
  return " Answer: According to the chain(s) of variable assignment in the text above, " + std::to_string(num_v) +
         " variables are assigned the value " + value + ", they are: ";
}

// n distinct variable names of `letters` upper-case letters.
std::vector<std::string> vt_names(Rng& rng, size_t n, int letters, std::set<std::string>& used) {
  std::vector<std::string> vars;
  while (vars.size() < n) {
    std::string v;
    for (int i = 0; i < letters; ++i) v += static_cast<char>('A' + uniform(rng, 0, 25));
    if (used.insert(v).second) vars.push_back(v);
  }
  return vars;
}

// RULER's chain (generate_chains): the value, then each variable named after the one before,
// with the trailing space RULER's f-string leaves on every hop.
std::vector<std::string> vt_chain(const std::vector<std::string>& vars, const std::string& value) {
  std::vector<std::string> c = {"VAR " + vars[0] + " = " + value};
  for (size_t j = 1; j < vars.size(); ++j) c.push_back("VAR " + vars[j] + " = VAR " + vars[j - 1] + " ");
  return c;
}

}  // namespace lc::tasks

namespace lc::tasks::detail {

namespace {

// Block positions of the chain's statements: RULER's sorted(random.sample(range(n), k)), and
// statement j goes right before block p_j. Fewer than k blocks (lengths RULER does not run):
// positions may repeat.
std::vector<int64_t> vt_positions(Rng& rng, int64_t n_blocks, size_t k) {
  std::vector<int64_t> pos;
  if (n_blocks >= static_cast<int64_t>(k)) {
    pos = sample_without_replacement(rng, n_blocks, static_cast<int64_t>(k));
  } else {
    for (size_t j = 0; j < k; ++j) pos.push_back(n_blocks > 0 ? uniform(rng, 0, n_blocks - 1) : 0);
  }
  std::sort(pos.begin(), pos.end());
  return pos;
}

// RULER's noise context of variable tracking: the noise block n times, the statements at their
// positions, one a line ("\n".join). Records where each statement landed.
std::string vt_context(int64_t n_blocks, const std::vector<std::string>& chain, const std::vector<int64_t>& pos,
                       std::vector<Needle>* needles) {
  std::string out;
  if (needles) needles->clear();
  size_t j = 0;
  auto put = [&](const std::string& line, bool statement) {
    if (!out.empty()) out += '\n';
    if (statement && needles) needles->push_back({line, out.size(), 0.0});
    out += line;
  };
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (; j < chain.size() && pos[j] == b; ++j) put(chain[j], true);
    put(noise_block(), false);
  }
  for (; j < chain.size(); ++j) put(chain[j], true);
  if (needles)
    for (Needle& nd : *needles) nd.depth = static_cast<double>(nd.pos) / static_cast<double>(out.size());
  return out;
}

constexpr size_t kVtHops = 4;                 // synthetic.yaml: 1 chain of 4 hops
constexpr int64_t kVtExampleTokens = 500;     // variable_tracking.py: the example's max_seq_length
constexpr const char* kVtExampleValue = "12345";      // the example's value before randomize_icl

}  // namespace

// RULER's one-shot example (variable_tracking.py, main and randomize_icl): once per run, a chain
// of 3-letter variables with the value 12345 in as many noise blocks as keep the example's
// prompt (template and answer prefix, no answer) within 500 tokens of the model's tokenizer;
// then, per sample, new variable names of the same length and a new value. It is prepended as
// prompt + " " + the answer + "\n", then a new line, then the task's own prompt.
namespace {
uint64_t vt_example_seed(uint64_t run_seed) { return mix64(run_seed ^ 0x7674206578616d70ull); }

// The example's prompt (no answer) in n blocks; the statements' positions depend on the run
// and n only.
std::string vt_example_prompt(uint64_t run_seed, int64_t n, const std::vector<std::string>& vars,
                              const std::string& value) {
  Rng pr(mix64(vt_example_seed(run_seed) + static_cast<uint64_t>(n)));
  const std::vector<std::string> chain = vt_chain(vars, value);
  return vt_head() + vt_context(n, chain, vt_positions(pr, n, chain.size()), nullptr) + vt_question(value) +
         vt_answer_prefix(vars.size(), value);
}
}  // namespace
}  // namespace lc::tasks::detail

namespace lc::tasks {

using detail::kVtExampleTokens;
using detail::kVtExampleValue;
using detail::kVtHops;
using detail::vt_example_prompt;
using detail::vt_example_seed;

int64_t vt_example_blocks(const Tokenizer& tok, uint64_t run_seed) {
  std::vector<std::string> ex_vars;
  {
    Rng er(vt_example_seed(run_seed));
    std::set<std::string> used;
    ex_vars = vt_names(er, kVtHops + 1, 3, used);
  }
  auto ex_tokens = [&](int64_t n) {
    return static_cast<int64_t>(tok.encode(vt_example_prompt(run_seed, n, ex_vars, kVtExampleValue), false, false).size());
  };
  // RULER's search starts at 5 blocks and keeps 5 when nothing fits.
  int64_t lo = 5, hi = 10;
  if (ex_tokens(lo) <= kVtExampleTokens) {
    while (ex_tokens(hi) <= kVtExampleTokens) {
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (ex_tokens(mid) <= kVtExampleTokens) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
  }
  return lo;
}

std::string vt_example(uint64_t run_seed, int64_t blocks, Rng& rng, std::set<std::string>& used) {
  const std::vector<std::string> xv = vt_names(rng, kVtHops + 1, 3, used);
  const std::string xval = std::to_string(uniform(rng, 10000, 99998));
  return vt_example_prompt(run_seed, blocks, xv, xval) + " " + join(xv, " ") + "\n" + "\n";
}

}  // namespace lc::tasks

namespace lc::tasks::detail {

Expected<std::vector<Layout>> make_vt(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed) {
  const int64_t ex_blocks = vt_example_blocks(r.tokenizer(), spec.seed);

  std::vector<Layout> out;
  for (const bool with_example : {true, false}) {
    Layout lay;
    lay.unit = "blocks";
    lay.build = [=](int64_t units) -> Expected<Built> {
      Rng rng(seed);
      std::set<std::string> used;
      const std::vector<std::string> vars = vt_names(rng, kVtHops + 1, 5, used);
      const std::string value = std::to_string(uniform(rng, 10000, 99998));  // np.random.randint(10000, 99999)
      const std::vector<std::string> chain = vt_chain(vars, value);
      const std::vector<int64_t> pos = vt_positions(rng, units, chain.size());
      Built b;
      b.context = vt_context(units, chain, pos, &b.needles);
      std::string example;
      if (with_example) {
        Rng xr(mix64(seed ^ 0x72616e645f69636cull));
        example = vt_example(spec.seed, ex_blocks, xr, used);
      }
      b.user = example + vt_head() + b.context + vt_question(value);
      b.answer_prefix = vt_answer_prefix(vars.size(), value);
      b.answers = vars;
      b.info = {{"value", value}, {"hops", std::to_string(kVtHops)}, {"example", with_example ? "yes" : "no"}};
      return b;
    };
    out.push_back(std::move(lay));
  }
  return out;
}

namespace {

// A numbered word list: `common` words `freq_cw` times each and `n_uncommon` other words
// `freq_ucw` times each, shuffled.
std::string cwe_list(Rng& rng, int64_t n_uncommon, int num_cw, int freq_cw, int freq_ucw,
                     std::vector<std::string>* common) {
  std::vector<std::string> pool = word_pool(rng, static_cast<size_t>(num_cw + n_uncommon));
  std::vector<std::string> list;
  for (int i = 0; i < num_cw; ++i)
    for (int r = 0; r < freq_cw; ++r) list.push_back(pool[static_cast<size_t>(i)]);
  for (size_t i = static_cast<size_t>(num_cw); i < pool.size(); ++i)
    for (int r = 0; r < freq_ucw; ++r) list.push_back(pool[i]);
  shuffle(list, rng);
  std::string s;
  for (size_t i = 0; i < list.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(i + 1) + ". " + list[i];
  }
  common->assign(pool.begin(), pool.begin() + num_cw);
  return s;
}

const char* kCweHead = "Below is a numbered list of words. In these words, some appear more often than others. "
                       "Memorize the ones that appear most often.\n";
const char* kCweQuestion = "\nQuestion: What are the 10 most common words in the above list?";
const char* kCwePrefix = " Answer: The top 10 words that appear most often in the list are:";

}  // namespace

Expected<std::vector<Layout>> make_cwe(const PromptRenderer& /*r*/, const SampleSpec& spec, uint64_t seed) {
  // RULER: at >= 4K a worked example of 40 words (common x10, others x3) and the list with
  // common words x30, others x3; below 4K an example of 20 words (x3 / x1) and x6 / x1.
  // Shorter still, we drop the example and then lower the repetition, keeping the common
  // words strictly more frequent than the rest.
  struct Cfg {
    int ex_words, ex_cw, ex_ucw;  // ex_words 0: no example
    int freq_cw, freq_ucw;
  };
  std::vector<Cfg> cfgs;
  if (spec.length >= 4096) cfgs.push_back({40, 10, 3, 30, 3});
  cfgs.push_back({20, 3, 1, 6, 1});
  cfgs.push_back({0, 0, 0, 6, 1});
  cfgs.push_back({0, 0, 0, 3, 1});
  cfgs.push_back({0, 0, 0, 2, 1});
  std::vector<Layout> out;
  for (const Cfg c : cfgs) {
    Layout lay;
    lay.unit = "words";
    lay.min_units = 0;
    lay.build = [c, seed](int64_t units) -> Expected<Built> {
      Rng rng(seed);
      const int num_cw = 10;
      Built b;
      std::string example;
      if (c.ex_words > 0) {
        std::vector<std::string> ex_common;
        Rng er(mix64(seed ^ 0x6578616d706c65ull));
        const std::string ex = cwe_list(er, c.ex_words - num_cw, num_cw, c.ex_cw, c.ex_ucw, &ex_common);
        example = std::string(kCweHead) + ex + kCweQuestion + kCwePrefix;
        for (int i = 0; i < num_cw; ++i) example += " " + std::to_string(i + 1) + ". " + ex_common[static_cast<size_t>(i)];
        example += "\n";
      }
      b.context = cwe_list(rng, units, num_cw, c.freq_cw, c.freq_ucw, &b.answers);
      b.user = example + kCweHead + b.context + kCweQuestion;
      b.answer_prefix = kCwePrefix;
      b.info = {{"freq_common", std::to_string(c.freq_cw)}, {"freq_other", std::to_string(c.freq_ucw)},
                {"example", c.ex_words > 0 ? "yes" : "no"}};
      return b;
    };
    out.push_back(std::move(lay));
  }
  return out;
}

Expected<std::vector<Layout>> make_fwe(const PromptRenderer& /*r*/, const SampleSpec& spec, uint64_t seed) {
  const double alpha = 2.0;
  double zeta = 0;  // zeta(2) by direct summation, as RULER uses scipy's zeta
  for (int k = 1; k < 100000; ++k) zeta += std::pow(static_cast<double>(k), -alpha);
  // RULER: (max_seq_length - tokens_to_generate) // 50, the answer budget being 50.
  const int64_t vocab_size = std::max<int64_t>(16, (spec.length - 50) / 50);
  auto counts = [=](int64_t n) {
    std::vector<int64_t> c;
    for (int64_t k = 1; k <= vocab_size; ++k)
      c.push_back(static_cast<int64_t>(static_cast<double>(n) * std::pow(static_cast<double>(k), -alpha) / zeta));
    return c;
  };
  // The answer (ranks 2-4; rank 1 is the dots) must be strictly more frequent than the rest.
  int64_t min_units = 10;
  for (;; ++min_units) {
    const auto c = counts(min_units);
    if (c[3] > c[4] && c[4] >= 0 && c[2] > c[3] && c[1] > c[2]) break;
  }
  Layout lay;
  lay.unit = "words";
  lay.min_units = min_units;
  lay.build = [=](int64_t units) -> Expected<Built> {
    Rng rng(seed);
    std::set<std::string> seen;
    std::vector<std::string> vocab;
    vocab.push_back("...");
    while (static_cast<int64_t>(vocab.size()) < vocab_size) {
      std::string w = coded_word(rng, 6);
      if (seen.insert(w).second) vocab.push_back(std::move(w));
    }
    const auto c = counts(units);
    std::vector<std::string> words;
    for (size_t k = 0; k < vocab.size(); ++k)
      for (int64_t r = 0; r < c[k]; ++r) words.push_back(vocab[k]);
    shuffle(words, rng);
    Built b;
    b.context = join(words, " ");
    b.user = "Read the following coded text and track the frequency of each coded word. Find the three most "
             "frequently appeared coded words. " + b.context +
             "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
             "frequently appeared words in the above coded text?";
    b.answer_prefix = " Answer: According to the coded text above, the three most frequently appeared words are:";
    b.answers = {vocab[1], vocab[2], vocab[3]};
    b.info = {{"vocab", std::to_string(vocab_size)}, {"alpha", "2"}};
    return b;
  };
  return std::vector<Layout>{lay};
}

// ---- QA: synthetic documents ----
//
// RULER's qa_1 / qa_2 hide SQuAD / HotpotQA paragraphs among distractor paragraphs. Those
// data sets are not available here, so the documents are generated: short encyclopedia-style
// entries about fictional people and institutions, each with facts that a question can ask.
// qa_1 asks one fact of one person; qa_2 needs two documents (an institution names its
// founder, the founder's entry gives the fact). Distractors are entries of the same kinds.

namespace {

const char* kOccupations[] = {"painter", "engineer", "botanist", "composer", "cartographer", "physician",
                              "astronomer", "architect", "novelist", "chemist", "sculptor", "historian"};
const char* kSubjects[] = {"mathematics", "medicine", "law", "music", "geology", "philosophy",
                           "chemistry", "architecture", "botany", "astronomy", "economics", "languages"};
const char* kInstKinds[] = {"library", "observatory", "museum", "trading company", "school of music",
                            "shipyard", "printing house", "botanical garden", "hospital", "bank"};
const char* kTownSuffix[] = {"ford", "by", "wick", "ham", "ton", "field", "mouth", "stead", "bury", "dale"};

std::string cap(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

struct Person {
  std::string first, last, occupation, town, subject, city, institution_joined, year_born, year_joined;
  std::string name() const { return first + " " + last; }
};
struct Institution {
  std::string name, kind, town, year, founder;
};

class World {
 public:
  explicit World(Rng& rng) : rng_(rng) {}
  std::string town() { return unique([&] { return cap(pseudo_word(rng_, 2)) + kTownSuffix[uniform(rng_, 0, 9)]; }); }
  std::string surname() { return unique([&] { return cap(pseudo_word(rng_, 2)); }); }
  std::string institution_name() {
    return unique([&] {
      return "the " + cap(std::string(adjectives()[static_cast<size_t>(uniform(rng_, 0, static_cast<int64_t>(adjectives().size()) - 1))])) +
             " " + cap(std::string(nouns()[static_cast<size_t>(uniform(rng_, 0, static_cast<int64_t>(nouns().size()) - 1))])) +
             " " + std::string(kInstKinds[uniform(rng_, 0, 9)]);
    });
  }
  Person person() {
    Person p;
    p.first = std::string(first_names()[static_cast<size_t>(uniform(rng_, 0, static_cast<int64_t>(first_names().size()) - 1))]);
    p.last = surname();
    p.occupation = kOccupations[uniform(rng_, 0, 11)];
    p.town = town();
    p.subject = kSubjects[uniform(rng_, 0, 11)];
    p.city = town();
    p.year_born = std::to_string(uniform(rng_, 1700, 1890));
    p.year_joined = std::to_string(std::stoi(p.year_born) + uniform(rng_, 20, 45));
    p.institution_joined = institution_name();
    return p;
  }
  Institution institution(const std::string& founder) {
    Institution i;
    i.name = institution_name();
    i.kind = "";
    i.town = town();
    i.year = std::to_string(uniform(rng_, 1750, 1930));
    i.founder = founder;
    return i;
  }

 private:
  template <class F>
  std::string unique(F f) {
    for (;;) {
      std::string s = f();
      if (used_.insert(s).second) return s;
    }
  }
  Rng& rng_;
  std::set<std::string> used_;
};

std::string person_doc(const Person& p) {
  const bool vowel = std::string("aeiou").find(p.occupation[0]) != std::string::npos;
  return p.name() + (vowel ? " was an " : " was a ") + p.occupation + " born in " + p.town + " in " + p.year_born + ". " + p.last +
         " studied " + p.subject + " and spent most of a long working life in " + p.city + ". In " +
         p.year_joined + ", " + p.last + " joined " + p.institution_joined +
         ", where the work of a lifetime was done. Friends remembered " + p.last +
         " as patient, exact and generous with time.";
}

std::string institution_doc(const Institution& i) {
  return cap(i.name) + " was established in " + i.town + " in " + i.year + ". It was founded by " + i.founder +
         ", who led it for many years. " + cap(i.name) +
         " kept careful records of its work, and its old building still stands near the centre of " + i.town + ".";
}

}  // namespace

Expected<std::vector<Layout>> make_qa(const PromptRenderer& /*r*/, const SampleSpec& spec, uint64_t seed) {
  const bool two_hop = spec.task == "qa_2";
  const int depth = spec.depth;
  Layout lay;
  lay.unit = "words";
  lay.build = [=](int64_t units) -> Expected<Built> {
    Rng rng(seed);
    World w(rng);
    std::vector<std::string> gold;  // gold documents, the first at the requested depth
    std::string question;
    std::vector<std::string> answers;
    const Person p = w.person();
    std::vector<std::string> forbidden = {p.last};  // names only the gold documents may hold
    if (!two_hop) {
      switch (uniform(rng, 0, 3)) {
        case 0: question = "In which town was " + p.name() + " born?"; answers = {p.town}; break;
        case 1: question = "What did " + p.name() + " study?"; answers = {p.subject}; break;
        case 2: question = "In which year did " + p.name() + " join " + p.institution_joined + "?"; answers = {p.year_joined}; break;
        default: question = "In which city did " + p.name() + " spend most of a working life?"; answers = {p.city}; break;
      }
      gold.push_back(person_doc(p));
    } else {
      const Institution inst = w.institution(p.name());
      forbidden.push_back(inst.name.substr(4));  // without "the "
      if (uniform(rng, 0, 1) == 0) {
        question = "In which town was the founder of " + inst.name + " born?";
        answers = {p.town};
      } else {
        question = "What did the founder of " + inst.name + " study?";
        answers = {p.subject};
      }
      gold.push_back(institution_doc(inst));
      gold.push_back(person_doc(p));
    }
    const std::vector<double> depths = needle_depths(rng, depth, gold.size());
    // Distractors: entries of both kinds about other people and institutions, drawn from a
    // generator of their own so that the first n are the same whatever n is.
    Rng dr(mix64(seed ^ 0x64697374726163ull));
    World dw(dr);
    std::vector<std::string> docs;
    int64_t words = 0;
    while (words < units) {
      std::string d;
      const Person q = dw.person();
      if (two_hop && uniform(dr, 0, 1) == 0) {
        d = institution_doc(dw.institution(q.name()));
      } else {
        d = person_doc(q);
      }
      // No second entry about the people or institutions the question is about.
      bool clash = false;
      for (const auto& f : forbidden) clash = clash || d.find(f) != std::string::npos;
      if (clash) continue;
      std::vector<std::string> ws = split_words(d);
      const int64_t take = std::min<int64_t>(static_cast<int64_t>(ws.size()), units - words);
      ws.resize(static_cast<size_t>(take));
      docs.push_back(join(ws, " "));
      words += take;
    }
    // Gold documents go between distractors at the boundary nearest their depth.
    std::vector<std::pair<size_t, size_t>> at;  // (boundary, gold index)
    for (size_t g = 0; g < gold.size(); ++g)
      at.emplace_back(static_cast<size_t>(std::lround(depths[g] / 100.0 * static_cast<double>(docs.size()))), g);
    std::stable_sort(at.begin(), at.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::pair<std::string, int>> all;  // (text, gold index or -1)
    size_t k = 0;
    for (size_t b = 0; b <= docs.size(); ++b) {
      while (k < at.size() && at[k].first == b) {
        all.emplace_back(gold[at[k].second], static_cast<int>(at[k].second));
        ++k;
      }
      if (b < docs.size()) all.emplace_back(docs[b], -1);
    }
    Built b;
    std::vector<size_t> gold_pos(gold.size(), 0);
    for (size_t i = 0; i < all.size(); ++i) {
      if (i) b.context += "\n\n";
      b.context += "Document " + std::to_string(i + 1) + ":\n";
      if (all[i].second >= 0) gold_pos[static_cast<size_t>(all[i].second)] = b.context.size();
      b.context += all[i].first;
    }
    for (size_t g = 0; g < gold.size(); ++g)
      b.needles.push_back({gold[g], gold_pos[g], static_cast<double>(gold_pos[g]) / static_cast<double>(b.context.size())});
    const std::string instr = "Answer the question based on the given documents. Only give me the answer and do not output any other words.";
    b.user = instr + "\n\nThe following are given documents.\n\n" + b.context + "\n\n" + instr + "\n\nQuestion: " + question;
    b.answer_prefix = " Answer:";
    b.answers = answers;
    b.info = {{"question", question}, {"documents", std::to_string(all.size())}};
    return b;
  };
  return std::vector<Layout>{lay};
}

}  // namespace lc::tasks::detail
