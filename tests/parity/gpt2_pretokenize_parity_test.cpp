// Triad's pre-tokenisation against the patterns run by the Python regex
// module (GPT-2's as OpenAI wrote it, LLaMA 3's, Qwen2's, o200k's and Tekken's as
// their tokenizer.json files write them), and its NFC against Python's
// unicodedata (CTest label "parity"): the reference file comes from
// gpt2_pretokenize_reference.py, run by CTest as a fixture before this. The
// pieces and the normalised text must be the same, text by text.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/escaped_text.h"
#include "triad/data/tokenizer.h"

namespace triad::data {
namespace {

using triad::testing::escaped;

std::string joined(const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    out += '[';
    out += escaped(p);
    out += ']';
  }
  return out;
}

nlohmann::json reference_cases() {
  const char* path = std::getenv("TRIAD_PRETOKENIZE_REFERENCE");
  if (path == nullptr) {
    ADD_FAILURE() << "TRIAD_PRETOKENIZE_REFERENCE is not set";
    return nlohmann::json::array();
  }
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing " << path << " (the reference fixture did not run)";
    return nlohmann::json::array();
  }
  return nlohmann::json::parse(in);
}

// Each text's pieces under `pattern` against the reference's under `key`.
void expect_pieces_match(PretokenizePattern pattern, const std::string& key) {
  const auto cases = reference_cases();
  ASSERT_GT(cases.size(), 1000u);
  int mismatches = 0;
  size_t pieces = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const auto want = c[key].get<std::vector<std::string>>();
    const auto got = pretokenize(text, pattern);
    pieces += want.size();
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << key << " text \"" << escaped(text) << "\"\n  triad:     " << joined(got)
                    << "\n  reference: " << joined(want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " texts";
  EXPECT_GT(pieces, 10000u);  // the corpus is not trivially small
}

TEST(PretokenizeParity, Gpt2PiecesMatchTheReferencePatternOnEveryText) {
  if (const char* why = std::getenv("TRIAD_PRETOKENIZE_UNAVAILABLE")) GTEST_SKIP() << why;
  expect_pieces_match(PretokenizePattern::Gpt2, "pieces");
  // gpt2_pretokenize is the same pattern.
  EXPECT_EQ(gpt2_pretokenize("Hello world's  end!! 123abc\n\nok "),
            pretokenize("Hello world's  end!! 123abc\n\nok ", PretokenizePattern::Gpt2));
}

TEST(PretokenizeParity, Llama3PiecesMatchTheReferencePatternOnEveryText) {
  if (const char* why = std::getenv("TRIAD_PRETOKENIZE_UNAVAILABLE")) GTEST_SKIP() << why;
  expect_pieces_match(PretokenizePattern::Llama3, "llama3");
}

TEST(PretokenizeParity, Qwen2PiecesMatchTheReferencePatternOnEveryText) {
  if (const char* why = std::getenv("TRIAD_PRETOKENIZE_UNAVAILABLE")) GTEST_SKIP() << why;
  expect_pieces_match(PretokenizePattern::Qwen2, "qwen2");
}

TEST(PretokenizeParity, O200kPiecesMatchTheReferencePatternOnEveryText) {
  if (const char* why = std::getenv("TRIAD_PRETOKENIZE_UNAVAILABLE")) GTEST_SKIP() << why;
  expect_pieces_match(PretokenizePattern::O200k, "o200k");
}

TEST(PretokenizeParity, TekkenPiecesMatchTheReferencePatternOnEveryText) {
  if (const char* why = std::getenv("TRIAD_PRETOKENIZE_UNAVAILABLE")) GTEST_SKIP() << why;
  expect_pieces_match(PretokenizePattern::Tekken, "tekken");
}

// NFC against Python's unicodedata, on the same texts (a fifth of which
// change: combining marks after letters, Hangul jamo, singletons).
TEST(PretokenizeParity, NfcMatchesPythonsUnicodedataOnEveryText) {
  if (const char* why = std::getenv("TRIAD_PRETOKENIZE_UNAVAILABLE")) GTEST_SKIP() << why;
  const auto cases = reference_cases();
  ASSERT_GT(cases.size(), 1000u);
  int mismatches = 0, changed = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"], want = c["nfc"];
    const std::string got = nfc(text);
    changed += want != text;
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "text \"" << escaped(text) << "\"\n  triad:     \"" << escaped(got)
                    << "\"\n  reference: \"" << escaped(want) << "\"";
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " texts";
  EXPECT_GT(changed, 100);  // the corpus exercises composition
}

}  // namespace
}  // namespace triad::data
