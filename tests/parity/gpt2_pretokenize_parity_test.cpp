// Triad's GPT-2 pre-tokenisation against OpenAI's pattern run by the Python
// regex module (CTest label "parity"): the reference file comes from
// gpt2_pretokenize_reference.py, run by CTest as a fixture before this. The
// pieces must be the same, text by text.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "triad/data/tokenizer.h"

namespace triad::data {
namespace {

// The text with every byte outside printable ASCII escaped, for messages.
std::string escaped(const std::string& s) {
  std::ostringstream o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F) {
      o << c;
    } else {
      static const char* hex = "0123456789abcdef";
      o << "\\x" << hex[c >> 4] << hex[c & 15];
    }
  }
  return o.str();
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    out += '[';
    out += escaped(p);
    out += ']';
  }
  return out;
}

TEST(Gpt2PretokenizeParity, PiecesMatchTheReferencePatternOnEveryText) {
  if (const char* why = std::getenv("TRIAD_PRETOKENIZE_UNAVAILABLE")) GTEST_SKIP() << why;
  const char* path = std::getenv("TRIAD_PRETOKENIZE_REFERENCE");
  ASSERT_NE(path, nullptr) << "TRIAD_PRETOKENIZE_REFERENCE is not set";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing " << path << " (the reference fixture did not run)";
  const auto cases = nlohmann::json::parse(in);
  ASSERT_GT(cases.size(), 1000u);
  int mismatches = 0;
  size_t pieces = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const auto want = c["pieces"].get<std::vector<std::string>>();
    const auto got = gpt2_pretokenize(text);
    pieces += want.size();
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "text \"" << escaped(text) << "\"\n  triad:     " << joined(got)
                    << "\n  reference: " << joined(want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " texts";
  EXPECT_GT(pieces, 10000u);  // the corpus is not trivially small
}

}  // namespace
}  // namespace triad::data
