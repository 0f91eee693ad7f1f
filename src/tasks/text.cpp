#include "tasks/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

namespace lc::tasks {

uint64_t fnv1a(std::string_view s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t fnv1a_ids(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(id) >> (8 * b));
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t sample_seed(uint64_t base, std::string_view task, int64_t length, int depth, int64_t index) {
  uint64_t h = mix64(base);
  h = mix64(h ^ fnv1a(task));
  h = mix64(h ^ static_cast<uint64_t>(length));
  h = mix64(h ^ static_cast<uint64_t>(static_cast<int64_t>(depth) + 1000));
  h = mix64(h ^ static_cast<uint64_t>(index));
  return h;
}

int64_t uniform(Rng& rng, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  // Rejection sampling removes the modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t r;
  do r = rng(); while (r >= limit);
  return lo + static_cast<int64_t>(r % span);
}

double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); }

std::vector<int64_t> sample_without_replacement(Rng& rng, int64_t n, int64_t k) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  k = std::min(k, n);
  for (int64_t i = 0; i < k; ++i) std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(uniform(rng, i, n - 1))]);
  all.resize(static_cast<size_t>(k));
  return all;
}

std::string random_number(Rng& rng, int digits) {
  std::string s;
  s += static_cast<char>('1' + uniform(rng, 0, 8));
  for (int i = 1; i < digits; ++i) s += static_cast<char>('0' + uniform(rng, 0, 9));
  return s;
}

std::string random_uuid(Rng& rng) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    int v = static_cast<int>(uniform(rng, 0, 15));
    if (i == 12) v = 4;                 // version
    if (i == 16) v = 8 + (v & 3);       // variant
    s += hex[v];
    if (i == 7 || i == 11 || i == 15 || i == 19) s += '-';
  }
  return s;
}

std::string random_key_word(Rng& rng) {
  const auto& a = adjectives();
  const auto& n = nouns();
  std::string s(a[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(a.size()) - 1))]);
  s += '-';
  s += n[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(n.size()) - 1))];
  return s;
}

std::string pseudo_word(Rng& rng, int syllables) {
  static const char* onset[] = {"b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r",
                                "s", "t", "v", "w", "z", "br", "cl", "dr", "fl", "gr", "pl",
                                "pr", "sk", "st", "tr", "th", "sh"};
  static const char* vowel[] = {"a", "e", "i", "o", "u", "ai", "ea", "oo", "ou", "ie"};
  static const char* coda[] = {"", "", "", "n", "r", "l", "s", "t", "m", "nd", "st", "ck"};
  std::string s;
  for (int i = 0; i < syllables; ++i) {
    s += onset[uniform(rng, 0, 29)];
    s += vowel[uniform(rng, 0, 9)];
    s += coda[uniform(rng, 0, 11)];
  }
  return s;
}

std::string coded_word(Rng& rng, int letters) {
  std::string s;
  for (int i = 0; i < letters; ++i) s += static_cast<char>('a' + uniform(rng, 0, 25));
  return s;
}

const std::vector<std::string_view>& adjectives() {
  static const std::vector<std::string_view> v = {
      "able", "ancient", "angry", "anxious", "autumn", "awful", "bare", "basic", "bitter", "black",
      "blue", "bold", "brave", "brief", "bright", "broad", "broken", "busy", "calm", "careful",
      "cheap", "cheerful", "chilly", "clean", "clever", "cloudy", "coarse", "cold", "common", "cool",
      "crazy", "crisp", "crooked", "curious", "damp", "dark", "dear", "deep", "dense", "dizzy",
      "dry", "dull", "dusty", "eager", "early", "easy", "elegant", "empty", "equal", "faint",
      "fair", "famous", "fancy", "fast", "fierce", "flat", "fluffy", "foolish", "fragile", "free",
      "fresh", "friendly", "frozen", "funny", "gentle", "giant", "glad", "gloomy", "golden", "grand",
      "gray", "great", "green", "grumpy", "hairy", "handsome", "happy", "hard", "harsh", "heavy",
      "hidden", "hollow", "honest", "huge", "humble", "hungry", "icy", "idle", "jolly", "keen",
      "kind", "large", "late", "lazy", "light", "little", "lively", "lonely", "long", "loose",
      "loud", "lucky", "mad", "magic", "merry", "mighty", "mild", "misty", "modern", "muddy",
      "narrow", "neat", "nervous", "new", "noisy", "odd", "old", "orange", "pale", "patient",
      "plain", "pleasant", "polite", "poor", "proud", "purple", "quick", "quiet", "rapid", "rare",
      "red", "rich", "rough", "round", "royal", "rusty", "sad", "salty", "scarce", "sharp",
      "shiny", "short", "shy", "silent", "silly", "simple", "sleepy", "slim", "slow", "small",
      "smooth", "soft", "solid", "sour", "spicy", "steep", "sticky", "stiff", "strange", "strict",
      "strong", "sudden", "sunny", "sweet", "swift", "tall", "tame", "tender", "thick", "thin",
      "tidy", "tiny", "tired", "tough", "vast", "violet", "warm", "weak", "wet", "white",
      "wide", "wild", "windy", "wise", "wooden", "young", "yellow", "zealous"};
  return v;
}

const std::vector<std::string_view>& nouns() {
  static const std::vector<std::string_view> v = {
      "acorn", "actor", "airport", "anchor", "angle", "ankle", "apple", "apron", "arch", "arrow",
      "artist", "attic", "badge", "bakery", "balloon", "banana", "banjo", "barn", "basket", "beach",
      "beard", "beetle", "bell", "bench", "berry", "bicycle", "blanket", "boat", "bone", "book",
      "bottle", "branch", "bread", "brick", "bridge", "broom", "bubble", "bucket", "button", "cabin",
      "cable", "camel", "camera", "candle", "canoe", "canyon", "carpet", "castle", "cat", "cattle",
      "cave", "cellar", "chair", "chalk", "cherry", "chimney", "circle", "clock", "cloud", "coast",
      "coat", "coffee", "coin", "comet", "copper", "corner", "cottage", "cotton", "crayon", "creek",
      "crow", "crown", "cup", "curtain", "cushion", "dagger", "desert", "desk", "diamond", "dinner",
      "doctor", "dog", "dolphin", "donkey", "door", "dragon", "drawer", "drum", "eagle", "engine",
      "falcon", "feather", "fence", "ferry", "field", "finger", "flag", "flame", "flower", "flute",
      "forest", "fork", "fossil", "fountain", "fox", "frog", "garden", "gate", "giraffe", "glacier",
      "glove", "goat", "grape", "guitar", "hammer", "harbor", "harp", "hat", "hawk", "helmet",
      "hill", "honey", "horse", "island", "jacket", "jar", "jewel", "kettle", "key", "kitchen",
      "kite", "ladder", "lake", "lamp", "lantern", "leaf", "lemon", "letter", "library", "lion",
      "lizard", "lobster", "magnet", "mango", "map", "marble", "market", "meadow", "mirror", "monkey",
      "moon", "mountain", "mouse", "mug", "needle", "nest", "novel", "oak", "ocean", "onion",
      "orchard", "otter", "owl", "paddle", "palace", "panda", "paper", "parrot", "peach", "pearl",
      "pebble", "pencil", "penguin", "pepper", "piano", "pillow", "pine", "pirate", "planet", "plum",
      "pocket", "pond", "potato", "puppet", "pyramid", "quilt", "rabbit", "radio", "raft", "rainbow",
      "raven", "ribbon", "river", "robot", "rocket", "roof", "rope", "rose", "saddle", "sail",
      "salmon", "sandal", "scarf", "school", "shark", "sheep", "shell", "ship", "shovel", "silver",
      "skate", "sled", "snail", "soap", "sock", "spider", "spoon", "squirrel", "stable", "stamp",
      "star", "statue", "stone", "storm", "stove", "straw", "stream", "sugar", "summit", "swan",
      "sword", "table", "teapot", "temple", "tent", "thimble", "tiger", "timber", "toast", "tomato",
      "tower", "tractor", "train", "tree", "trumpet", "tulip", "tunnel", "turtle", "umbrella", "valley",
      "vase", "violin", "wagon", "wallet", "walnut", "whale", "wheel", "whistle", "window", "wolf",
      "wool", "yacht", "zebra"};
  return v;
}

const std::vector<std::string_view>& first_names() {
  static const std::vector<std::string_view> v = {
      "Ada", "Alan", "Alice", "Amos", "Anna", "Arthur", "Beatrice", "Bernard", "Clara", "Cyril",
      "Daniel", "Dora", "Edgar", "Edith", "Elena", "Felix", "Flora", "Frank", "Grace", "Harold",
      "Helen", "Hugo", "Ida", "Isaac", "Ivy", "Jack", "Julia", "Karl", "Laura", "Leon",
      "Lucy", "Marcus", "Maria", "Martin", "Mina", "Nora", "Oscar", "Otto", "Paula", "Peter",
      "Rosa", "Rufus", "Ruth", "Samuel", "Sara", "Simon", "Sofia", "Thomas", "Tilda", "Victor",
      "Vera", "Walter", "Wendy", "Xavier", "Yara", "Zoe"};
  return v;
}

std::vector<std::string> word_pool(Rng& rng, size_t n) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (auto w : nouns()) {
    if (seen.insert(std::string(w)).second) out.emplace_back(w);
  }
  for (auto w : adjectives()) {
    if (seen.insert(std::string(w)).second) out.emplace_back(w);
  }
  shuffle(out, rng);
  if (out.size() > n) out.resize(n);
  while (out.size() < n) {
    std::string w = pseudo_word(rng, 2 + static_cast<int>(uniform(rng, 0, 1)));
    if (seen.insert(w).second) out.push_back(std::move(w));
  }
  return out;
}

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) out.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> split_sentences(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  for (const std::string& w : split_words(text)) {
    if (!cur.empty()) cur += ' ';
    cur += w;
    const char last = w.back();
    if (last == '.' || last == '!' || last == '?') {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) s += sep;
    s += parts[i];
  }
  return s;
}

std::string to_lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool icontains(std::string_view haystack, std::string_view needle) {
  return to_lower(haystack).find(to_lower(needle)) != std::string::npos;
}

size_t count_occurrences(std::string_view haystack, std::string_view needle) {
  if (needle.empty()) return 0;
  size_t n = 0;
  for (size_t p = haystack.find(needle); p != std::string_view::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

int64_t parse_length(std::string_view s) {
  if (s.empty()) return -1;
  int64_t mult = 1;
  const char last = static_cast<char>(std::tolower(static_cast<unsigned char>(s.back())));
  if (last == 'k') mult = 1024;
  if (last == 'm') mult = 1024 * 1024;
  if (mult != 1) s.remove_suffix(1);
  if (s.empty() || s.size() > 12) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v * mult;
}

}  // namespace lc::tasks
