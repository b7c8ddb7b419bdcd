// Unicode character classes (utf8proc, Unicode 15) for the pre-tokenizer, and NFC.
#include "text/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <new>

#include "core/error.h"
#include "text/utf8.h"

namespace lily::unicode {

namespace {

uint8_t compute_class(char32_t cp) {
  const auto* property = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  uint8_t bits = 0;
  switch (property->category) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      bits |= kLetter;
      break;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
      bits |= kMark;
      break;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      bits |= kNumber;
      break;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      bits |= kSpace;
      break;
    default:
      break;
  }
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) bits |= kSpace;
  if (cp == 0x0A || cp == 0x0D) bits |= kCrLf;
  const bool canonical_decomposition =
      property->decomp_seqindex != UINT16_MAX && property->decomp_type == 0;
  // utf8proc marks characters that can be the second of a composition pair with
  // comb_index >= 0x8000 (see utf8proc_normalize_utf32).
  const bool composition_second =
      property->comb_index != UINT16_MAX && property->comb_index >= 0x8000;
  const bool hangul_jamo_vowel_or_trailer =
      (cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2);
  if (property->combining_class != 0 || canonical_decomposition || composition_second ||
      hangul_jamo_vowel_or_trailer || property->comp_exclusion) {
    bits |= kNfcTrigger;
  }
  return bits;
}

// Flat table for the Basic Multilingual Plane; other planes ask utf8proc each time.
struct BmpTable {
  std::array<uint8_t, 0x10000> bits{};
  BmpTable() {
    for (char32_t cp = 0; cp < 0x10000; ++cp) bits[cp] = compute_class(cp);
  }
};

const BmpTable& bmp_table() {
  static const BmpTable table;
  return table;
}

// Code points NFC can touch in Unicode 15.0 that Unicode 9.0 had not assigned.
struct Range {
  char32_t first;
  char32_t last;
};
constexpr Range kNewerThanUnicode9[] = {
#include "text/unicode9_nfc_table.inc"
};

void append_utf8proc_nfc(std::string_view text, std::string& out) {
  if (text.empty()) return;
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  if (length == UTF8PROC_ERROR_NOMEM) throw std::bad_alloc();
  if (length < 0) {
    // Callers validate UTF-8 first; anything else utf8proc reports is a bad input string.
    throw InputError(std::string("text cannot be NFC-normalised: ") + utf8proc_errmsg(length));
  }
  out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
}

}  // namespace

bool unknown_to_unicode9_nfc(char32_t cp) {
  size_t lo = 0;
  size_t hi = std::size(kNewerThanUnicode9);
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (cp < kNewerThanUnicode9[mid].first) {
      hi = mid;
    } else if (cp > kNewerThanUnicode9[mid].last) {
      lo = mid + 1;
    } else {
      return true;
    }
  }
  return false;
}

uint8_t char_class(char32_t cp) {
  if (cp < 0x10000) return bmp_table().bits[cp];
  if (cp > 0x10FFFF) return 0;
  return compute_class(cp);
}

bool is_assigned(char32_t cp) {
  if (cp > 0x10FFFF) return false;
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) != UTF8PROC_CATEGORY_CN;
}

bool nfc_quick_check(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const auto b = static_cast<uint8_t>(text[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const char32_t cp = utf8::decode(text, i);
    if ((char_class(cp) & kNfcTrigger) != 0) return false;
  }
  return true;
}

void append_nfc(std::string_view text, std::string& out) {
  if (nfc_quick_check(text)) {
    out.append(text);
    return;
  }
  // NFC(a u b) = NFC(a) u NFC(b) when u is an inert starter, which is what HF's Unicode
  // 9.0 tables make of characters assigned later: split there, keep them as they are.
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const size_t at = i;
    const char32_t cp = utf8::decode(text, i);
    if (cp < kNewerThanUnicode9[0].first || !unknown_to_unicode9_nfc(cp)) continue;
    append_utf8proc_nfc(text.substr(start, at - start), out);
    out.append(text.substr(at, i - at));
    start = i;
  }
  append_utf8proc_nfc(text.substr(start), out);
}

}  // namespace lily::unicode
