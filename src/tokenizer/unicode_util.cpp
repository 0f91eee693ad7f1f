#include "tokenizer/unicode_util.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/utf16.h>

#include <memory>

namespace lc::tok {

uint32_t decode_utf8(std::string_view s, size_t& pos) {
  // Lenient like llama.cpp's decoder (it accepts overlongs and surrogates) so that the
  // pre-tokeniser sees the same codepoints; only truncated/ill-formed sequences become U+FFFD.
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c0 = b(pos);
  if (c0 < 0x80) {
    pos += 1;
    return c0;
  }
  const auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xC0) == 0x80; };
  if ((c0 & 0xE0) == 0xC0 && cont(pos + 1)) {
    const uint32_t c = ((c0 & 0x1Fu) << 6) | (b(pos + 1) & 0x3Fu);
    pos += 2;
    return c;
  }
  if ((c0 & 0xF0) == 0xE0 && cont(pos + 1) && cont(pos + 2)) {
    const uint32_t c = ((c0 & 0x0Fu) << 12) | ((b(pos + 1) & 0x3Fu) << 6) | (b(pos + 2) & 0x3Fu);
    pos += 3;
    return c;
  }
  if ((c0 & 0xF8) == 0xF0 && cont(pos + 1) && cont(pos + 2) && cont(pos + 3)) {
    const uint32_t c = ((c0 & 0x07u) << 18) | ((b(pos + 1) & 0x3Fu) << 12) |
                       ((b(pos + 2) & 0x3Fu) << 6) | (b(pos + 3) & 0x3Fu);
    pos += 4;
    // Past U+10FFFF has no UTF-8 encoding to re-emit: treat it as malformed.
    return c <= 0x10FFFF ? c : 0xFFFD;
  }
  pos += 1;
  return 0xFFFD;
}

std::vector<uint32_t> decode_utf8_all(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) out.push_back(decode_utf8(s, pos));
  return out;
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

namespace {

uint8_t classify(uint32_t cpt) {
  uint8_t r = 0;
  if (u_isUWhiteSpace(static_cast<UChar32>(cpt))) r |= kSpace;
  switch (u_charType(static_cast<UChar32>(cpt))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      r |= kLetter;
      break;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      r |= kNumber;
      break;
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      r |= kPunct;
      break;
    case U_MATH_SYMBOL:
    case U_CURRENCY_SYMBOL:
    case U_MODIFIER_SYMBOL:
    case U_OTHER_SYMBOL:
      r |= kSymbol;
      break;
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      r |= kMark;
      break;
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_PRIVATE_USE_CHAR:
    case U_SURROGATE:
      r |= kControl;
      break;
    default:
      break;
  }
  return r;
}

// The BMP table is built once: ICU lookups are cheap but a byte load is cheaper, and million-
// token prompts classify every codepoint.
const uint8_t* bmp_table() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(0x10000);
    for (uint32_t c = 0; c < 0x10000; ++c) t[c] = classify(c);
    return t;
  }();
  return table.get();
}

}  // namespace

uint8_t cpt_class(uint32_t cpt) {
  if (cpt < 0x10000) return bmp_table()[cpt];
  return classify(cpt);
}

uint32_t cpt_tolower(uint32_t cpt) {
  return static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cpt)));
}

namespace {

uint32_t nfd_first_icu(uint32_t cpt) {
  if (cpt > 0x10FFFF) return cpt;
  static const UNormalizer2* const nfd = [] {
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2* n = unorm2_getNFDInstance(&err);
    return U_SUCCESS(err) ? n : nullptr;
  }();
  if (nfd == nullptr) return cpt;
  UChar buf[32];
  UErrorCode err = U_ZERO_ERROR;
  const int32_t n = unorm2_getDecomposition(nfd, static_cast<UChar32>(cpt), buf, 32, &err);
  if (U_FAILURE(err) || n <= 0) return cpt;  // no decomposition (n < 0) or none that fits
  UChar32 first = 0;
  U16_GET(buf, 0, 0, n, first);
  return static_cast<uint32_t>(first);
}

}  // namespace

uint32_t cpt_nfd_first(uint32_t cpt) {
  // BMP table built once, as for the classes: WordPiece looks up every codepoint of its input.
  static const std::unique_ptr<uint32_t[]> table = [] {
    auto t = std::make_unique<uint32_t[]>(0x10000);
    for (uint32_t c = 0; c < 0x10000; ++c) t[c] = nfd_first_icu(c);
    return t;
  }();
  return cpt < 0x10000 ? table[cpt] : nfd_first_icu(cpt);
}

const ByteUnicode& byte_unicode() {
  static const ByteUnicode table = [] {
    ByteUnicode t;
    t.cpt_to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the rest are moved to U+0100 upwards in
    // byte order, which is GPT-2's bytes_to_unicode.
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cpt = printable ? b : next++;
      append_utf8(t.byte_to_utf8[b], cpt);
      t.cpt_to_byte[cpt] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  while (i < s.size()) {
    const uint8_t c = b(i);
    size_t n = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    if (b(i + 1) < lo || b(i + 1) > hi) return false;
    for (size_t k = 2; k <= n; ++k)
      if ((b(i + k) & 0xC0) != 0x80) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace lc::tok
