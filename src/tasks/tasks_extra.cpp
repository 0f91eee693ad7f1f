// Passkey retrieval (Mohtashami & Jaggi, 2023), a BABILong-style family (Kuratov et al.,
// 2024: bAbI facts scattered in book text) and dense-context reasoning in the spirit of MMReD
// (the answer depends on every observation, so retrieving one needle is not enough).
#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "tasks/haystack.h"
#include "tasks/task_impl.h"
#include "tasks/text.h"

namespace lc::tasks::detail {

Expected<std::vector<Layout>> make_passkey(const PromptRenderer& /*r*/, const SampleSpec& spec, uint64_t seed) {
  Layout lay;
  lay.unit = "sentences";
  const int depth = spec.depth;
  lay.build = [seed, depth](int64_t units) -> Expected<Built> {
    Rng rng(seed);
    const std::string key = random_number(rng, 5);
    const std::vector<double> d = needle_depths(rng, depth, 1);
    Built b;
    b.context = assemble(noise_haystack(units), {{d[0], "The pass key is " + key + ". Remember it. " + key + " is the pass key."}},
                         " ", false, &b.needles);
    b.user = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
             "memorize it. I will quiz you about it afterwards.\n" + b.context + "\nWhat is the pass key?";
    b.answer_prefix = " The pass key is";
    b.answers = {key};
    return b;
  };
  return std::vector<Layout>{lay};
}

// ---- BABILong-style: a bAbI story simulated, its sentences scattered in the essay ----

namespace {

const std::array<const char*, 6> kPlaces = {"bathroom", "bedroom", "garden", "hallway", "kitchen", "office"};
const std::array<const char*, 4> kMoveVerbs = {"went to", "moved to", "travelled to", "journeyed to"};
const std::array<const char*, 3> kObjects = {"apple", "football", "milk"};

struct Story {
  std::vector<std::string> facts;
  std::string question, answer;
};

// One story with `n_events` events, or none when the random draw did not produce a question
// of the wanted kind (the caller draws again).
bool simulate(Rng& rng, int kind, int n_events, Story* out) {
  std::vector<std::string> actors;
  {
    auto idx = sample_without_replacement(rng, static_cast<int64_t>(first_names().size()), 3);
    for (int64_t i : idx) actors.emplace_back(first_names()[static_cast<size_t>(i)]);
  }
  std::map<std::string, std::string> where;       // actor -> place
  std::map<std::string, std::string> holder;      // object -> actor ("" when lying somewhere)
  std::map<std::string, std::string> lies;        // object -> place where it was dropped
  std::map<std::string, std::vector<std::string>> trail;  // object -> places it has been, in order
  std::map<std::string, int> picked_at;           // object -> event index of its last pick-up
  std::map<std::string, int> moved_after;         // object -> carrier moves after that pick-up
  Story s;
  auto obj_place = [&](const std::string& o) -> std::string {
    auto h = holder.find(o);
    if (h != holder.end() && !h->second.empty()) return where[h->second];
    auto l = lies.find(o);
    return l == lies.end() ? "" : l->second;
  };
  auto note = [&](const std::string& o) {
    const std::string p = obj_place(o);
    auto& t = trail[o];
    if (!p.empty() && (t.empty() || t.back() != p)) t.push_back(p);
  };
  for (int e = 0; e < n_events; ++e) {
    const std::string& a = actors[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(actors.size()) - 1))];
    const bool placed = where.count(a) > 0;
    const int64_t r = uniform(rng, 0, 9);
    if (kind >= 2 && placed && r < 3) {  // pick up something here or not held
      std::vector<std::string> can;
      for (const char* o : kObjects) {
        auto h = holder.find(o);
        if (h != holder.end() && !h->second.empty()) continue;
        auto l = lies.find(o);
        if (l != lies.end() && l->second != where[a]) continue;
        can.emplace_back(o);
      }
      if (!can.empty()) {
        const std::string o = can[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(can.size()) - 1))];
        holder[o] = a;
        lies.erase(o);
        picked_at[o] = e;
        moved_after[o] = 0;
        note(o);
        s.facts.push_back(a + (uniform(rng, 0, 1) ? " picked up the " : " got the ") + o + " there.");
        continue;
      }
    }
    if (kind >= 2 && placed && r == 3) {  // drop something held
      bool dropped = false;
      for (const char* o : kObjects) {
        if (holder[o] == a) {
          holder[o] = "";
          lies[o] = where[a];
          note(o);
          s.facts.push_back(a + (uniform(rng, 0, 1) ? " dropped the " : " put down the ") + o + ".");
          dropped = true;
          break;
        }
      }
      if (dropped) continue;
    }
    std::string p;
    do p = kPlaces[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(kPlaces.size()) - 1))];
    while (where.count(a) && where[a] == p);
    where[a] = p;
    for (const char* o : kObjects) {
      if (holder[o] == a) {
        ++moved_after[o];
        note(o);
      }
    }
    s.facts.push_back(a + " " + kMoveVerbs[static_cast<size_t>(uniform(rng, 0, 3))] + " the " + p + ".");
  }
  if (kind == 1) {
    // Ask about someone who moved more than once, so the latest move is what counts.
    std::vector<std::string> cand;
    for (const auto& a : actors) {
      int moves = 0;
      for (const auto& f : s.facts)
        if (f.rfind(a + " ", 0) == 0) ++moves;
      if (moves >= 2) cand.push_back(a);
    }
    if (cand.empty()) return false;
    const std::string a = cand[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(cand.size()) - 1))];
    s.question = "Where is " + a + "?";
    s.answer = where[a];
  } else if (kind == 2) {
    // An object that was carried somewhere after being picked up: needs the pick-up and the
    // move (two supporting facts).
    std::vector<std::string> cand;
    for (const char* o : kObjects)
      if (picked_at.count(o) && moved_after[o] > 0 && !obj_place(o).empty()) cand.emplace_back(o);
    if (cand.empty()) return false;
    const std::string o = cand[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(cand.size()) - 1))];
    s.question = "Where is the " + o + "?";
    s.answer = obj_place(o);
  } else {
    // An object that has been in two places at least, its last place only once.
    std::vector<std::string> cand;
    for (const char* o : kObjects) {
      const auto& t = trail[o];
      if (t.size() < 2) continue;
      if (std::count(t.begin(), t.end(), t.back()) != 1) continue;
      cand.emplace_back(o);
    }
    if (cand.empty()) return false;
    const std::string o = cand[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(cand.size()) - 1))];
    const auto& t = trail[o];
    s.question = "Where was the " + o + " before the " + t.back() + "?";
    s.answer = t[t.size() - 2];
  }
  *out = std::move(s);
  return true;
}

}  // namespace

Expected<std::vector<Layout>> make_babilong(const PromptRenderer& /*r*/, const SampleSpec& spec, uint64_t seed) {
  const int kind = spec.task.back() - '0';
  LC_ASSIGN_OR_RETURN(const std::vector<std::string>* words, essay_words());
  Layout lay;
  lay.unit = "words";
  lay.build = [=](int64_t units) -> Expected<Built> {
    Rng rng(seed);
    Story st;
    const int n_events = kind == 1 ? 6 : kind == 2 ? 10 : 14;
    bool ok = false;
    for (int attempt = 0; attempt < 1000 && !ok; ++attempt) ok = simulate(rng, kind, n_events, &st);
    if (!ok) return make_error("babilong: could not draw a story (internal)");
    // Facts keep their order, at sorted random depths, as BABILong scatters them.
    std::vector<double> d;
    for (size_t i = 0; i < st.facts.size(); ++i) d.push_back(uniform01(rng) * 100.0);
    std::sort(d.begin(), d.end());
    std::vector<Insert> inserts;
    for (size_t i = 0; i < st.facts.size(); ++i) inserts.push_back({d[i], st.facts[i]});
    const size_t start = essay_sentence_start(*words, static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(words->size()) - 1)));
    Built b;
    b.context = assemble(essay_sentences(*words, start, static_cast<size_t>(units)), inserts, " ", false, &b.needles);
    b.user = "The text below is a passage of a book with a few short facts about people, places and objects "
             "mixed into it. Answer the question using only those facts. If a person or an object was in "
             "several places, the latest one counts.\n\n" + b.context + "\n\nQuestion: " + st.question +
             " Answer with one word.";
    b.answer_prefix = " Answer:";
    b.answers = {st.answer};
    b.info = {{"question", st.question}, {"facts", std::to_string(st.facts.size())}};
    return b;
  };
  return std::vector<Layout>{lay};
}

// ---- Dense reasoning (MMReD-like) ----

namespace {

const std::array<const char*, 5> kAnimals = {"fox", "heron", "badger", "deer", "otter"};
const std::array<const char*, 4> kSpots = {"meadow", "river bank", "orchard", "old mill"};
const std::array<const char*, 4> kColours = {"red", "blue", "green", "yellow"};

struct Dense {
  std::vector<std::string> obs;
  std::string intro, question, answer;
};

Dense dense_story(Rng& rng, const std::string& task, int64_t n) {
  Dense d;
  if (task == "dense_count") {
    const std::string target = kAnimals[static_cast<size_t>(uniform(rng, 0, 4))];
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::string a = kAnimals[static_cast<size_t>(uniform(rng, 0, 4))];
      if (i == n - 1 && count == 0) a = target;  // at least one
      count += a == target;
      d.obs.push_back("Observation " + std::to_string(i + 1) + ": a " + a + " was seen near the " +
                      kSpots[static_cast<size_t>(uniform(rng, 0, 3))] + ".");
    }
    d.intro = "Below is a field log of wildlife observations.";
    d.question = "How many observations in the log report a " + target + "? Answer with a number.";
    d.answer = std::to_string(count);
  } else if (task == "dense_state") {
    size_t ball = static_cast<size_t>(uniform(rng, 0, 3));
    d.intro = std::string("Four boxes, coloured red, blue, green and yellow, stand in a row. A ball starts in the ") +
              kColours[ball] + " box. Below is every move that was made.";
    for (int64_t i = 0; i < n; ++i) {
      const auto pair = sample_without_replacement(rng, 4, 2);
      const size_t x = static_cast<size_t>(pair[0]), y = static_cast<size_t>(pair[1]);
      if (ball == x) ball = y; else if (ball == y) ball = x;
      d.obs.push_back("Move " + std::to_string(i + 1) + ": the contents of the " + kColours[x] + " box and the " +
                      kColours[y] + " box are exchanged.");
    }
    d.question = "Which box holds the ball after the last move? Answer with its colour.";
    d.answer = kColours[ball];
  } else {  // dense_majority
    std::vector<size_t> v;
    std::array<int64_t, 4> c{};
    for (int64_t i = 0; i < n; ++i) {
      v.push_back(static_cast<size_t>(uniform(rng, 0, 3)));
      ++c[v.back()];
    }
    // A unique winner: if the top count is shared, the last reading of a tied colour becomes
    // the first tied colour.
    const int64_t top = *std::max_element(c.begin(), c.end());
    size_t win = 0;
    while (c[win] != top) ++win;
    for (size_t k = win + 1; k < 4; ++k) {
      if (c[k] == top) {
        for (size_t i = v.size(); i-- > 0;)
          if (v[i] == k) {
            v[i] = win;
            --c[k];
            ++c[win];
            break;
          }
      }
    }
    for (int64_t i = 0; i < n; ++i)
      d.obs.push_back("Reading " + std::to_string(i + 1) + ": the signal lamp showed " + kColours[v[static_cast<size_t>(i)]] + ".");
    d.intro = "Below is a log of readings of a signal lamp.";
    d.question = "Which colour did the signal lamp show most often? Answer with the colour.";
    d.answer = kColours[win];
  }
  return d;
}

}  // namespace

Expected<std::vector<Layout>> make_dense(const PromptRenderer& /*r*/, const SampleSpec& spec, uint64_t seed) {
  const std::string task = spec.task;
  const int64_t fixed = spec.opts.observations;
  Layout lay;
  const std::vector<std::string>* words = nullptr;
  if (fixed > 0) {
    LC_ASSIGN_OR_RETURN(words, essay_words());
    lay.unit = "words";  // a fixed number of observations spread through book text
  } else {
    lay.unit = "observations";
    lay.min_units = 2;
  }
  lay.build = [=](int64_t units) -> Expected<Built> {
    Rng rng(seed);
    const int64_t n = fixed > 0 ? fixed : units;
    Dense d = dense_story(rng, task, n);
    Built b;
    if (fixed > 0) {
      std::vector<Insert> ins;
      for (int64_t i = 0; i < n; ++i)
        ins.push_back({n == 1 ? 50.0 : 100.0 * static_cast<double>(i) / static_cast<double>(n - 1), d.obs[static_cast<size_t>(i)]});
      const size_t start = essay_sentence_start(*words, static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(words->size()) - 1)));
      b.context = assemble(essay_sentences(*words, start, static_cast<size_t>(units)), ins, " ", true, &b.needles);
    } else {
      b.context = join(d.obs, "\n");
      size_t pos = 0;
      for (const auto& o : d.obs) {
        b.needles.push_back({o, pos, static_cast<double>(pos) / static_cast<double>(std::max<size_t>(1, b.context.size()))});
        pos += o.size() + 1;
      }
    }
    b.user = d.intro + " The question needs all of them.\n\n" + b.context + "\n\nQuestion: " + d.question;
    b.answer_prefix = " Answer:";
    b.answers = {d.answer};
    b.info = {{"observations", std::to_string(n)}};
    return b;
  };
  return std::vector<Layout>{lay};
}

}  // namespace lc::tasks::detail
