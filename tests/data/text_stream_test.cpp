// TextStream: a reply written while it is generated shows only what no
// later token can change (whole characters, nothing that may begin a stop
// string), and what it writes plus what finish() returns is the final
// reply.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "triad/data/text_stream.h"

namespace triad::data {
namespace {

// Feeds the text's prefixes (one per "token") and returns each update's
// piece; `final_text` goes to finish(), whose piece comes last.
std::vector<std::string> stream(TextStream& s, const std::vector<std::string>& texts,
                                const std::string& final_text) {
  std::vector<std::string> pieces;
  for (const auto& t : texts) pieces.push_back(s.update(t));
  pieces.push_back(s.finish(final_text));
  return pieces;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string all;
  for (const auto& p : pieces) all += p;
  return all;
}

TEST(TextStream, WritesEachTokensTextAsItComes) {
  TextStream s;
  const auto pieces = stream(s, {"Once", "Once upon", "Once upon a"}, "Once upon a");
  EXPECT_EQ(pieces, (std::vector<std::string>{"Once", " upon", " a", ""}));
}

TEST(TextStream, HoldsAnUnfinishedCharacterUntilItsLastByte) {
  // "é" is C3 A9, "€" E2 82 AC, "😀" F0 9F 98 80: each arriving a byte at a time.
  TextStream s;
  const auto pieces = stream(s,
                             {"caf\xC3", "caf\xC3\xA9", "caf\xC3\xA9 \xE2", "caf\xC3\xA9 \xE2\x82",
                              "caf\xC3\xA9 \xE2\x82\xAC", "caf\xC3\xA9 \xE2\x82\xAC\xF0\x9F\x98",
                              "caf\xC3\xA9 \xE2\x82\xAC\xF0\x9F\x98\x80"},
                             "caf\xC3\xA9 \xE2\x82\xAC\xF0\x9F\x98\x80");
  EXPECT_EQ(pieces, (std::vector<std::string>{"caf", "\xC3\xA9", " ", "", "\xE2\x82\xAC", "",
                                              "\xF0\x9F\x98\x80", ""}));
  // A byte that can never start a character is written as it is.
  TextStream bad;
  EXPECT_EQ(bad.update("a\xA9"), "a\xA9");
}

TEST(TextStream, HoldsReplacementCharactersThatMayBecomeACharacter) {
  // A SentencePiece byte piece decodes to U+FFFD until its character is whole.
  TextStream s;
  EXPECT_EQ(s.update("x\xEF\xBF\xBD"), "x");
  EXPECT_EQ(s.update("x\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(s.finish("x\xC3\xA9"), "");
  EXPECT_EQ(s.written(), "x\xC3\xA9");
}

TEST(TextStream, NeverShowsAStopStringOrWhatMayBeginOne) {
  TextStream s({"\nUser:", "###"});
  EXPECT_EQ(s.update("Hi"), "Hi");
  EXPECT_EQ(s.update("Hi\n"), "");        // may begin "\nUser:"
  EXPECT_EQ(s.update("Hi\nUs"), "");      // still may
  EXPECT_EQ(s.update("Hi\nUp"), "\nUp");  // cannot any more
  EXPECT_EQ(s.update("Hi\nUp #"), " ");
  EXPECT_EQ(s.update("Hi\nUp ##"), "");
  EXPECT_EQ(s.update("Hi\nUp ### and more"), "");  // the stop: nothing from it on
  EXPECT_EQ(s.update("Hi\nUp ### and more still"), "");
  EXPECT_EQ(s.finish("Hi\nUp "), "");
  EXPECT_EQ(s.written(), "Hi\nUp ");
}

TEST(TextStream, ATailThatCouldBeginAStopIsWrittenAtTheEnd) {
  TextStream s({"END"});
  const auto pieces = stream(s, {"the E", "the EN"}, "the EN");  // ran out of tokens
  EXPECT_EQ(joined(pieces), "the EN");
  EXPECT_EQ(pieces.front(), "the ");
}

TEST(TextStream, ATextThatRewritesWhatWasWrittenIsHeldUntilTheEnd) {
  TextStream s;
  EXPECT_EQ(s.update("abc"), "abc");
  EXPECT_EQ(s.update("abX def"), "");
  EXPECT_EQ(s.update("abX defg"), "");
  EXPECT_EQ(s.finish("abcdefg"), "defg");
}

// Over random texts split at random points and random stop strings, the
// written bytes always equal the final reply.
TEST(TextStream, WhatItWritesIsAlwaysTheFinalReply) {
  uint64_t state = 7;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state >> 33);
  };
  const std::vector<std::string> alphabet = {"a", "b", "\n", "\xC3\xA9", "\xE2\x82\xAC", " ", "#"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string full;
    for (int i = 0; i < 30; ++i) full += alphabet[next() % alphabet.size()];
    std::vector<std::string> stops;
    if (trial % 3 != 0) stops = {"#b", "\na"};
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, full.find(s));
    const std::string final_text = cut == std::string::npos ? full : full.substr(0, cut);
    TextStream s(stops);
    std::string written;
    for (size_t end = 1; end <= full.size(); end += 1 + next() % 3) {
      const std::string piece = s.update(full.substr(0, end));
      // Never a stop string, never more than the final reply.
      EXPECT_EQ(final_text.compare(0, written.size() + piece.size(), written + piece), 0);
      written += piece;
    }
    written += s.finish(final_text);
    EXPECT_EQ(written, final_text) << "trial " << trial;
  }
}

}  // namespace
}  // namespace triad::data
