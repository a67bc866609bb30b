// Unicode's canonical composition (NFC, UAX #15): full canonical
// decomposition, canonical ordering of combining marks, then canonical
// composition of each mark with the last starter it is not blocked from.
// The data are generated (unicode_nfc_tables.cpp); Hangul syllables are
// decomposed and composed by formula.
#include <algorithm>
#include <string>
#include <vector>

#include "triad/data/tokenizer.h"
#include "unicode_nfc_tables.h"
#include "utf8.h"

namespace triad::data {
namespace {

using namespace unicode;

// Hangul: syllable = SBase + (L index * VCount + V index) * TCount + T index.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CombiningClassRange* end = kCombiningClasses + kCombiningClassCount;
  const CombiningClassRange* it =
      std::upper_bound(kCombiningClasses, end, cp,
                       [](uint32_t c, const CombiningClassRange& r) { return c < r.first; });
  if (it == kCombiningClasses) return 0;
  --it;
  return cp <= it->last ? it->combining_class : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const Decomposition* end = kDecompositions + kDecompositionCount;
    const Decomposition* it =
        std::lower_bound(kDecompositions, end, cp,
                         [](const Decomposition& d, uint32_t c) { return d.code_point < c; });
    if (it != end && it->code_point == cp) {
      decompose(it->first, out);
      if (it->second != 0) decompose(it->second, out);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* end = kCompositions + kCompositionCount;
  const Composition* it =
      std::lower_bound(kCompositions, end, std::pair{a, b}, [](const Composition& c, auto key) {
        return c.first < key.first || (c.first == key.first && c.second < key.second);
      });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

// NFC of one run of well-formed code points, appended to `out` as UTF-8.
void normalize_run(const std::vector<uint32_t>& run, std::string& out) {
  std::vector<uint32_t> d;
  d.reserve(run.size() + 4);
  for (uint32_t cp : run) decompose(cp, d);
  // Canonical ordering: each run of non-starters stably sorted by class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(
        d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
        [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless a
  // character between them has a class of 0 or at least its own.
  std::vector<uint32_t> c;
  c.reserve(d.size());
  size_t starter = SIZE_MAX;
  int last_class = -1;  // of the last character kept after the starter
  for (uint32_t cp : d) {
    const int cls = combining_class(cp);
    if (starter != SIZE_MAX && (last_class < cls || (last_class == -1 && cls == 0))) {
      if (const uint32_t composite = compose(c[starter], cp)) {
        c[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = c.size();
      last_class = -1;
    } else {
      last_class = cls;
    }
    c.push_back(cp);
  }
  for (uint32_t cp : c) out += utf8(cp);
}

}  // namespace

std::string nfc(const std::string& text) {
  // ASCII, Latin-1 and the rest below U+0300 are their own NFC and compose
  // with nothing before them: the common case needs no work.
  bool simple = true;
  for (size_t i = 0; i < text.size() && simple;) {
    size_t len;
    simple = next_code_point(text, i, len) < 0x300;
    i += len;
  }
  if (simple) return text;
  std::string out;
  out.reserve(text.size());
  std::vector<uint32_t> run;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    const uint32_t cp = next_code_point(text, i, len);
    if (len == 1 && cp >= 0x80) {  // a malformed byte: kept as it is
      normalize_run(run, out);
      run.clear();
      out.push_back(text[i]);
    } else {
      run.push_back(cp);
    }
    i += len;
  }
  normalize_run(run, out);
  return out;
}

const char* nfc_unicode_version() {
  return kNfcUnicodeVersion;
}

}  // namespace triad::data
