#include "tokenizer/pretokenize.h"

#include <algorithm>
#include <iterator>

#include "tokenizer/unicode_util.h"

namespace lc::tok {
namespace {

// The text being split: codepoints and their classes, shared by every stage.
struct Text {
  const uint32_t* cpt;
  const uint8_t* cls;
};

constexpr uint32_t kOutside = 0xFFFFFFFF;

// Codepoint / class at `i`, or "nothing" outside the piece [b, e): the regexes never look
// across piece boundaries.
struct Piece {
  const Text& t;
  size_t b, e;
  uint32_t cpt(size_t i) const { return i >= b && i < e ? t.cpt[i] : kOutside; }
  uint8_t cls(size_t i) const { return i >= b && i < e ? t.cls[i] : 0; }
  bool in(size_t i) const { return i >= b && i < e; }
  bool letter(size_t i) const { return cls(i) & kLetter; }
  bool number(size_t i) const { return cls(i) & kNumber; }
  bool space(size_t i) const { return cls(i) & kSpace; }
};

enum class Fold { kNone, kAscii, kUnicode };

// 's|'t|'re|'ve|'m|'ll|'d at i, case-folded as `fold` says: the match length or 0.
size_t contraction(const Piece& p, size_t i, Fold fold) {
  if (p.cpt(i) != '\'' || !p.in(i + 1)) return 0;
  const auto low = [&](size_t k) {
    const uint32_t c = p.cpt(k);
    if (c == kOutside || fold == Fold::kNone) return c;
    if (c < 0x80) return static_cast<uint32_t>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return fold == Fold::kUnicode ? cpt_tolower(c) : c;
  };
  const uint32_t c1 = low(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (!p.in(i + 2)) return 0;
  const uint32_t c2 = low(i + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// Whitespace tail shared by both families: "\s+(?!\S)" then "\s+". Returns the end.
size_t space_run_end(const Piece& p, size_t i) {
  size_t n = 0;
  while (p.space(i + n)) ++n;
  if (n > 1 && p.in(i + n)) return i + n - 1;  // leave one space to prefix the next word
  return i + n;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
void split_gpt2(const Piece& p, std::vector<size_t>& out) {
  size_t i = p.b;
  while (i < p.e) {
    const size_t start = i;
    if (size_t n = contraction(p, i, Fold::kNone)) {
      out.push_back(n);
      i += n;
      continue;
    }
    const bool sp = p.cpt(i) == ' ';
    const size_t j = sp ? i + 1 : i;  // where the class run would start
    const uint8_t c = p.cls(j);
    if (c & kLetter) {
      i = j;
      while (p.letter(i)) ++i;
    } else if (c & kNumber) {
      i = j;
      while (p.number(i)) ++i;
    } else if (p.in(j) && !(c & (kSpace | kLetter | kNumber))) {
      i = j;
      while (p.in(i) && !(p.cls(i) & (kSpace | kLetter | kNumber))) ++i;
    } else {
      const size_t end = space_run_end(p, i);
      i = end > i ? end : i + 1;
    }
    out.push_back(i - start);
  }
}

// Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const Piece& p, size_t max_digits, bool unicode_fold, std::vector<size_t>& out) {
  size_t i = p.b;
  const auto crlf = [&](size_t k) { return p.cpt(k) == '\r' || p.cpt(k) == '\n'; };
  while (i < p.e) {
    const size_t start = i;
    // Qwen2's regex folds ASCII only ('[sS]'); llama.cpp's llama3 splitter folds Unicode.
    if (size_t n = contraction(p, i, unicode_fold ? Fold::kUnicode : Fold::kAscii)) {
      out.push_back(n);
      i += n;
      continue;
    }
    const uint8_t c = p.cls(i);
    if (!crlf(i) && !(c & kNumber) && ((c & kLetter) || p.letter(i + 1))) {
      ++i;
      while (p.letter(i)) ++i;
      out.push_back(i - start);
      continue;
    }
    if (c & kNumber) {
      size_t n = 0;
      while (p.number(i) && n < max_digits) {
        ++i;
        ++n;
      }
      out.push_back(i - start);
      continue;
    }
    const bool sp = p.cpt(i) == ' ';
    const size_t j = sp ? i + 1 : i;
    if (p.in(j) && !(p.cls(j) & (kSpace | kLetter | kNumber))) {
      i = j;
      while (p.in(i) && !(p.cls(i) & (kSpace | kLetter | kNumber))) ++i;
      while (crlf(i)) ++i;
      out.push_back(i - start);
      continue;
    }
    // Whitespace: \s*[\r\n]+ ends at the last newline of the run.
    size_t n = 0, last_nl = 0;
    while (p.space(i + n)) {
      if (crlf(i + n)) last_nl = i + n + 1;
      ++n;
    }
    if (last_nl > 0) {
      i = last_nl;
    } else {
      const size_t end = space_run_end(p, i);
      i = end > i ? end : i + 1;
    }
    out.push_back(i - start);
  }
}

// A regex of the form `\s?[class]{min,max}` (max 0 = unbounded), matched leftmost like
// std::regex_iterator; unmatched gaps become pieces of their own.
struct ClassRun {
  bool (*pred)(uint32_t cpt, uint8_t cls);
  bool ws_prefix;
  size_t min_len, max_len;
};

size_t match_run(const Piece& p, size_t i, const ClassRun& r) {
  const auto ok = [&](size_t k) { return p.in(k) && r.pred(p.cpt(k), p.cls(k)); };
  size_t j = i;
  if (r.ws_prefix && p.space(i) && ok(i + 1)) j = i + 1;
  size_t n = 0;
  while (ok(j + n) && (r.max_len == 0 || n < r.max_len)) ++n;
  if (n < r.min_len || n == 0) return 0;
  return j + n - i;
}

void split_run(const Piece& p, const ClassRun& r, std::vector<size_t>& out) {
  size_t gap = p.b, i = p.b;
  while (i < p.e) {
    const size_t n = match_run(p, i, r);
    if (n == 0) {
      ++i;
      continue;
    }
    if (i > gap) out.push_back(i - gap);
    out.push_back(n);
    i += n;
    gap = i;
  }
  if (p.e > gap) out.push_back(p.e - gap);
}

// \s+$ : the whitespace run that ends the piece.
void split_trailing_space(const Piece& p, std::vector<size_t>& out) {
  size_t k = p.e;
  while (k > p.b && p.space(k - 1)) --k;
  if (k > p.b) out.push_back(k - p.b);
  if (p.e > k) out.push_back(p.e - k);
}

// In llama.cpp the literal-class regexes run on text where non-ASCII whitespace has been
// replaced by U+000B, so such codepoints never match a literal class.
bool literal_ok(uint32_t c, uint8_t cls) { return c < 0x80 || !(cls & kSpace); }

bool in_ranges(uint32_t c, const uint32_t (*ranges)[2], size_t n) {
  const auto* end = ranges + n;
  const auto* it = std::upper_bound(ranges, end, c,
                                    [](uint32_t v, const uint32_t(&r)[2]) { return v < r[0]; });
  return it != ranges && c <= (*(it - 1))[1];
}

// deepseek-llm's letter class (cased letters), from its tokenizer.json regex.
constexpr uint32_t kDeepseekLetters[][2] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// [!-/:-~！-／：-～‘-‟　-。]
constexpr uint32_t kDeepseekPunct[][2] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E},
};
// [一-龥ࠀ-一가-퟿]
constexpr uint32_t kDeepseekCjk[][2] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

bool p_number(uint32_t, uint8_t cls) { return cls & kNumber; }
bool p_letter(uint32_t, uint8_t cls) { return cls & kLetter; }
bool p_punct(uint32_t, uint8_t cls) { return cls & kPunct; }
bool p_ascii_digit(uint32_t c, uint8_t) { return c >= '0' && c <= '9'; }
bool p_crlf(uint32_t c, uint8_t) { return c == '\r' || c == '\n'; }
bool p_punct_default(uint32_t c, uint8_t cls) {
  return (cls & kPunct) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
         c == '~' || c == '|';
}
bool p_punct_falcon(uint32_t c, uint8_t cls) { return p_punct_default(c, cls) || c == '`'; }
bool p_ds_letter(uint32_t c, uint8_t cls) {
  return literal_ok(c, cls) && in_ranges(c, kDeepseekLetters, std::size(kDeepseekLetters));
}
bool p_ds_punct(uint32_t c, uint8_t cls) {
  return literal_ok(c, cls) && in_ranges(c, kDeepseekPunct, std::size(kDeepseekPunct));
}
bool p_ds_cjk(uint32_t c, uint8_t cls) {
  return literal_ok(c, cls) && in_ranges(c, kDeepseekCjk, std::size(kDeepseekCjk));
}

// One stage of a cascade.
struct Stage {
  enum Kind { kGpt2, kLlama3, kQwen2, kRun, kTrailingSpace } kind;
  ClassRun run{};
};

std::vector<Stage> stages_for(PreType t) {
  const Stage gpt2{Stage::kGpt2};
  const auto run = [](bool (*pred)(uint32_t, uint8_t), bool ws, size_t mn, size_t mx) {
    return Stage{Stage::kRun, ClassRun{pred, ws, mn, mx}};
  };
  switch (t) {
    case PreType::kLlama3:
      return {Stage{Stage::kLlama3}};
    case PreType::kQwen2:
      return {Stage{Stage::kQwen2}};
    case PreType::kGpt2:
      return {gpt2};
    case PreType::kStarcoder:
      return {run(p_number, false, 1, 1), gpt2};
    case PreType::kFalcon:
      return {run(p_punct_falcon, false, 1, 0), gpt2, run(p_ascii_digit, false, 3, 3)};
    case PreType::kDeepseekLlm:
      return {run(p_crlf, false, 1, 1),        run(p_ds_letter, true, 1, 0),
              run(p_ds_punct, true, 1, 0),     Stage{Stage::kTrailingSpace},
              run(p_ds_cjk, false, 1, 0),      run(p_number, false, 1, 0)};
    case PreType::kDeepseekCoder:
      return {run(p_crlf, false, 1, 1), run(p_letter, true, 1, 0), run(p_punct, true, 1, 0),
              run(p_ds_cjk, false, 1, 0), run(p_number, false, 1, 1)};
    case PreType::kDefault:
      break;
  }
  return {run(p_punct_default, false, 1, 0), gpt2, run(p_number, false, 1, 0),
          run(p_ascii_digit, false, 3, 3)};
}

}  // namespace

std::vector<size_t> PreTokenizer::split(const std::vector<uint32_t>& cpts) const {
  std::vector<uint8_t> cls(cpts.size());
  for (size_t i = 0; i < cpts.size(); ++i) cls[i] = cpt_class(cpts[i]);
  const Text text{cpts.data(), cls.data()};

  std::vector<size_t> pieces;
  if (!cpts.empty()) pieces.push_back(cpts.size());
  std::vector<size_t> next;
  for (const Stage& st : stages_for(type_)) {
    next.clear();
    next.reserve(pieces.size() * 2);
    size_t b = 0;
    for (size_t len : pieces) {
      const Piece p{text, b, b + len};
      switch (st.kind) {
        case Stage::kGpt2:
          split_gpt2(p, next);
          break;
        case Stage::kLlama3:
          split_llama3(p, 3, true, next);
          break;
        case Stage::kQwen2:
          split_llama3(p, 1, false, next);
          break;
        case Stage::kRun:
          split_run(p, st.run, next);
          break;
        case Stage::kTrailingSpace:
          split_trailing_space(p, next);
          break;
      }
      b += len;
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace lc::tok
