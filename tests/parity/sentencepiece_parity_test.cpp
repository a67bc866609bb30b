// Triad's SentencePiece tokenizer against Google's library (CTest label
// "parity"): sentencepiece_reference.py, run by CTest as a fixture before
// this, trains small BPE and unigram models (byte fallback or unknown
// pieces; the identity, NFKC and case-folding NFKC normalisers;
// user-defined and control pieces) and records how python3-sentencepiece
// encodes texts and decodes id sequences with them. Triad reads the same
// model files and must give the same ids and the same text, case by case.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/escaped_text.h"
#include "triad/data/sentencepiece.h"
#include "triad/data/tokenizer.h"

namespace triad::data {
namespace {

using triad::testing::escaped;

std::string pieces_of(const SentencePieceTokenizer& sp, const std::vector<int32_t>& ids) {
  std::string out;
  for (const int32_t id : ids) {
    out += '[';
    out += id >= 0 && id < sp.vocab_size() ? escaped(sp.pieces()[static_cast<size_t>(id)].text)
                                           : std::to_string(id);
    out += ']';
  }
  return out;
}

class SentencePieceParity : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("TRIAD_SENTENCEPIECE_REFERENCE");
    if (const char* why = std::getenv("TRIAD_SENTENCEPIECE_UNAVAILABLE"); why && *why)
      GTEST_SKIP() << why;
    ASSERT_NE(dir, nullptr) << "TRIAD_SENTENCEPIECE_REFERENCE is not set";
    dir_ = dir;
    std::ifstream in(dir_ + "/cases.json");
    ASSERT_TRUE(in) << "missing " << dir_ << "/cases.json (the reference fixture did not run)";
    reference_ = nlohmann::json::parse(in);
  }
  std::string dir_;
  nlohmann::json reference_;
};

TEST_F(SentencePieceParity, EncodeAndDecodeMatchGooglesLibrary) {
  const auto& models = reference_.at("models");
  ASSERT_EQ(models.size(), 4u);
  for (const auto& m : models) {
    const std::string name = m.at("name");
    SCOPED_TRACE(name);
    const auto sp = load_sentencepiece(dir_ + "/" + name + ".model");
    EXPECT_EQ(sp->vocab_size(), m.at("vocab_size").get<int64_t>());
    int encode_mismatches = 0, decode_mismatches = 0;
    size_t tokens = 0;
    for (const auto& c : m.at("cases")) {
      const std::string text = c.at("text");
      const auto want = c.at("ids").get<std::vector<int32_t>>();
      const auto got = sp->encode(text);
      tokens += want.size();
      if (got != want && ++encode_mismatches <= 3)
        ADD_FAILURE() << "encode '" << escaped(text) << "'\n  normalised '"
                      << escaped(sp->normalize(text)) << "'\n  triad     " << pieces_of(*sp, got)
                      << "\n  reference " << pieces_of(*sp, want);
      const std::string decoded = sp->decode(want);
      if (decoded != c.at("decoded").get<std::string>() && ++decode_mismatches <= 3)
        ADD_FAILURE() << "decode " << pieces_of(*sp, want) << "\n  triad     '" << escaped(decoded)
                      << "'\n  reference '" << escaped(c.at("decoded").get<std::string>()) << "'";
    }
    for (const auto& c : m.at("decodes")) {
      const auto ids = c.at("ids").get<std::vector<int32_t>>();
      const std::string got = sp->decode(ids);
      if (got != c.at("text").get<std::string>() && ++decode_mismatches <= 6)
        ADD_FAILURE() << "decode " << pieces_of(*sp, ids) << "\n  triad     '" << escaped(got)
                      << "'\n  reference '" << escaped(c.at("text").get<std::string>()) << "'";
    }
    EXPECT_EQ(encode_mismatches, 0) << "of " << m.at("cases").size() << " texts";
    EXPECT_EQ(decode_mismatches, 0);
    EXPECT_GT(tokens, 5000u);  // the cases are not trivially short
  }
}

// The same model as transformers converts it to a tokenizer.json (LLaMA 2's
// kind, both forms), read by Triad as Hugging Face's tokenizers runs it:
// Google's ids for every text without an added token's text in it (which
// Hugging Face matches in the raw text and SentencePiece does not), and for
// the Metaspace form (no ▁ before a text that already begins with a space)
// every text that does not begin with one; each decodes to SentencePiece's
// text.
TEST_F(SentencePieceParity, ConvertedTokenizerJsonMatchesGooglesLibrary) {
  int forms = 0;
  for (const auto& m : reference_.at("models")) {
    if (!m.contains("tokenizer_json")) continue;
    const std::string name = m.at("name");
    const auto sp = load_sentencepiece(dir_ + "/" + name + ".model");
    for (const auto& form : m.at("tokenizer_json")) {
      SCOPED_TRACE(name + " " + form.get<std::string>());
      ++forms;
      const auto tok =
          load_hf_tokenizer(dir_ + "/" + name + "." + form.get<std::string>() + ".tokenizer.json");
      ASSERT_NE(dynamic_cast<const MetaspaceBpeTokenizer*>(tok.get()), nullptr);
      EXPECT_EQ(tok->vocab_size(), sp->vocab_size());
      const bool first_only = form == "metaspace";
      int compared = 0, encode_mismatches = 0, decode_mismatches = 0;
      for (const auto& c : m.at("cases")) {
        const std::string text = c.at("text");
        bool skip = first_only && (text.starts_with(" ") || text.starts_with("\u2581"));
        for (const std::string& special : tok->special_tokens())
          skip = skip || text.find(special) != std::string::npos;
        if (skip) continue;
        ++compared;
        const auto want = c.at("ids").get<std::vector<int32_t>>();
        const auto got = tok->encode(text);
        if (got != want && ++encode_mismatches <= 3)
          ADD_FAILURE() << "encode '" << escaped(text) << "'\n  triad     " << pieces_of(*sp, got)
                        << "\n  reference " << pieces_of(*sp, want);
        const std::string decoded = tok->decode(want);
        if (decoded != c.at("decoded").get<std::string>() && ++decode_mismatches <= 3)
          ADD_FAILURE() << "decode " << pieces_of(*sp, want) << "\n  triad     '"
                        << escaped(decoded) << "'\n  reference '"
                        << escaped(c.at("decoded").get<std::string>()) << "'";
      }
      EXPECT_EQ(encode_mismatches, 0) << "of " << compared << " texts";
      EXPECT_EQ(decode_mismatches, 0);
      EXPECT_GT(compared, 500);
    }
  }
  EXPECT_EQ(forms, 2);
}

}  // namespace
}  // namespace triad::data
