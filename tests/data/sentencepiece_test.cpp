// SentencePiece tokenizers without Python: a model file trained by
// python3-sentencepiece (tests/data/fixtures/sentencepiece_bpe.model, the
// reference script's bpe_bytes model: LLaMA's kind, 700 pieces, byte
// fallback, <|im_start|> and <|im_end|> user-defined) whose expected ids are
// the library's; models written here piece by piece for the rules the
// trainer cannot be made to produce (unused pieces); and every malformed or
// unsupported file refused by name. Parity over thousands of texts and four
// model kinds is tests/parity/sentencepiece_parity_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <filesystem>
#include <functional>

#include "support/temp_dir.h"
#include "triad/core/error.h"
#include "triad/data/sentencepiece.h"
#include "triad/data/tokenizer.h"

namespace triad::data {
namespace {

using triad::testing::TempDir;
using Type = SentencePieceTokenizer::PieceType;

const std::string kFixture =
    std::string(TRIAD_SOURCE_DIR) + "/tests/data/fixtures/sentencepiece_bpe.model";

// Protocol Buffers' wire format, enough to write ModelProto files.
std::string varint(uint64_t v) {
  std::string out;
  do {
    out.push_back(static_cast<char>((v & 0x7F) | (v > 0x7F ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return out;
}
std::string bytes_field(int number, const std::string& value) {
  return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(value.size()) + value;
}
std::string varint_field(int number, uint64_t value) {
  return varint(static_cast<uint64_t>(number) << 3) + varint(value);
}
std::string float_field(int number, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  std::string out = varint(static_cast<uint64_t>(number) << 3 | 5);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(bits >> (8 * i)));
  return out;
}
std::string piece(const std::string& text, float score, Type type = Type::Normal) {
  return bytes_field(1, bytes_field(1, text) + float_field(2, score) +
                            varint_field(3, static_cast<uint64_t>(type)));
}
// A BPE model (model_type 2) with the identity normaliser, no dummy prefix.
std::string bpe_model(const std::string& pieces, const std::string& trainer_extra = "") {
  return pieces + bytes_field(2, varint_field(3, 2) + trainer_extra) +
         bytes_field(3, bytes_field(1, "identity") + varint_field(3, 0));
}

std::string write_text(const TempDir& dir, const std::string& name, const std::string& data) {
  const std::string path = dir.file(name);
  triad::testing::write_text(path, data);
  return path;
}

template <class E>
std::string sp_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SentencePiece, FixtureEncodesAsGooglesLibrary) {
  const auto sp = load_sentencepiece(kFixture);
  EXPECT_EQ(sp->vocab_size(), 700);
  EXPECT_EQ(sp->settings().algorithm, SentencePieceTokenizer::Algorithm::Bpe);
  EXPECT_TRUE(sp->settings().byte_fallback);
  EXPECT_FALSE(sp->settings().remove_extra_whitespaces);
  // The library's ids for these texts (python3-sentencepiece 0.1.97).
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world, the model is training.", {373, 575, 670, 273, 309, 316, 456, 669}},
      {"<|im_start|>user 42<|im_end|>", {647, 3, 667, 657, 269, 647, 677, 668, 4}},
      {"na\xc3\xafve \xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac",  // naive ete, then two CJK
       {424, 647, 665, 649, 665, 647, 235, 156, 170, 235, 161, 177}},
      {"  two  spaces ", {458, 433, 647, 578, 647}},
      {"", {}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(sp->encode(text), ids) << text;
    EXPECT_EQ(sp->decode(ids), text);
  }
  EXPECT_EQ(sp->normalize("a b"),
            "\xe2\x96\x81"
            "a\xe2\x96\x81"
            "b");
}

TEST(SentencePiece, SpecialTokensByText) {
  const auto sp = load_sentencepiece(kFixture);
  EXPECT_EQ(sp->special_token("</s>"), 2);  // control
  EXPECT_EQ(sp->special_token("<s>"), 1);
  EXPECT_EQ(sp->special_token("<|im_start|>"), 3);  // user-defined
  EXPECT_EQ(sp->special_token("<unk>"), 0);
  EXPECT_EQ(sp->special_token("\xe2\x96\x81Hello"), -1);  // a normal piece
  EXPECT_EQ(sp->special_token("<0x41>"), -1);             // a byte piece
  EXPECT_EQ(sp->special_token("nothing"), -1);
  // The control, user-defined and unknown pieces, each by its text.
  const std::vector<std::string> special = sp->special_tokens();
  for (const char* s : {"</s>", "<s>", "<|im_start|>", "<unk>"}) {
    EXPECT_NE(std::find(special.begin(), special.end(), s), special.end()) << s;
  }
  for (const std::string& s : special) EXPECT_GE(sp->special_token(s), 0) << s;
  // Control pieces decode to nothing and are never matched in text.
  EXPECT_EQ(sp->decode({1, 373, 2}), "Hello");
  EXPECT_NE(sp->encode("</s>"), std::vector<int32_t>{2});
}

TEST(SentencePiece, ContinuationKeepsTheLeadingSpace) {
  const auto sp = load_sentencepiece(kFixture);
  const std::vector<int32_t> prompt = sp->encode("Hello");  // [▁Hello]
  ASSERT_EQ(prompt, std::vector<int32_t>{373});
  // "▁world" decoded alone loses its space, as the first piece of a text.
  EXPECT_EQ(sp->decode({575}), "world");
  EXPECT_EQ(continuation_text(*sp, prompt, {575, 670}), " world,");
  // After <s>, too (a control piece decodes to nothing).
  EXPECT_EQ(continuation_text(*sp, {1}, {575}), "world");
  EXPECT_EQ(continuation_text(*sp, {1, 373}, {575}), " world");
}

TEST(SentencePiece, LoadTokenizerTellsFilesApartByContent) {
  TempDir dir;
  // A directory holding only tokenizer.model.
  std::filesystem::copy_file(kFixture, dir.file("tokenizer.model"));
  const auto from_dir = load_tokenizer(dir.path().string());
  EXPECT_NE(dynamic_cast<const SentencePieceTokenizer*>(from_dir.get()), nullptr);
  EXPECT_EQ(from_dir->encode("the model"), (std::vector<int32_t>{273, 309}));
  // The same file under another name; make_tokenizer's --tokenizer path.
  const auto by_file = make_tokenizer("", "", kFixture);
  EXPECT_EQ(by_file->vocab_size(), 700);
  // tokenizer.json wins in a directory that has both.
  std::filesystem::copy_file(std::string(TRIAD_SOURCE_DIR) + "/tests/data/fixtures/tokenizer.json",
                             dir.file("tokenizer.json"));
  EXPECT_NE(dynamic_cast<const BpeTokenizer*>(load_tokenizer(dir.path().string()).get()), nullptr);
  // ... unless it is of a kind Triad does not build (a Unigram model's,
  // T5's).
  triad::testing::write_text(dir.file("tokenizer.json"),
                             R"({"model": {"type": "Unigram", "vocab": []}})");
  EXPECT_THROW(load_hf_tokenizer(dir.file("tokenizer.json")), NotSupportedError);
  EXPECT_NE(dynamic_cast<const SentencePieceTokenizer*>(load_tokenizer(dir.path().string()).get()),
            nullptr);
  std::filesystem::remove(dir.file("tokenizer.model"));
  EXPECT_THROW(load_tokenizer(dir.path().string()), NotSupportedError);
  TempDir empty;
  EXPECT_NE(sp_error_of<IoError>([&] {
              load_tokenizer(empty.path().string());
            }).find("holds neither tokenizer.json nor tokenizer.model"),
            std::string::npos);
  EXPECT_NE(sp_error_of<IoError>([&] {
              load_tokenizer(empty.file("missing.model"));
            }).find("cannot open tokenizer"),
            std::string::npos);
}

TEST(SentencePiece, BpeMergesHighestScoreFirstAndUndoesUnusedPieces) {
  TempDir dir;
  // "ab" is unused: a+b merges (it scores highest) but is spelled a, b in
  // the output; "abc" is reached through it.
  const std::string pieces = piece("<unk>", 0, Type::Unknown) + piece("a", -5) + piece("b", -5) +
                             piece("c", -5) + piece("ab", -1, Type::Unused) + piece("bc", -2) +
                             piece("abc", -3);
  const auto sp = load_sentencepiece(write_text(dir, "m.model", bpe_model(pieces)));
  EXPECT_EQ(sp->encode("ab"), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(sp->encode("abc"), (std::vector<int32_t>{6}));
  // Without "ab" or "abc", only b+c merges: a, bc.
  const std::string no_ab = piece("<unk>", 0, Type::Unknown) + piece("a", -5) + piece("b", -5) +
                            piece("c", -5) + piece("bc", -2);
  const auto sp2 = load_sentencepiece(write_text(dir, "m2.model", bpe_model(no_ab)));
  EXPECT_EQ(sp2->encode("abc"), (std::vector<int32_t>{1, 4}));
  // Equal scores: the leftmost pair first. "aa" then "a" from "aaa".
  const std::string tie = piece("<unk>", 0, Type::Unknown) + piece("a", -5) + piece("aa", -1);
  const auto sp3 = load_sentencepiece(write_text(dir, "m3.model", bpe_model(tie)));
  EXPECT_EQ(sp3->encode("aaa"), (std::vector<int32_t>{2, 1}));
  // A run of unknown characters is one unknown piece.
  EXPECT_EQ(sp3->encode("xyaz"), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(sp3->decode({0, 1}), " \xe2\x81\x87 a");
}

TEST(SentencePiece, UnigramTakesTheMostProbableSegmentation) {
  TempDir dir;
  const std::string pieces = piece("<unk>", 0, Type::Unknown) + piece("a", -1) + piece("b", -1) +
                             piece("ab", -3) + piece("abab", -2.5f);
  const std::string model =
      pieces + bytes_field(2, varint_field(3, 1)) + bytes_field(3, varint_field(3, 0));
  const auto sp = load_sentencepiece(write_text(dir, "u.model", model));
  EXPECT_EQ(sp->settings().algorithm, SentencePieceTokenizer::Algorithm::Unigram);
  EXPECT_EQ(sp->encode("ab"), (std::vector<int32_t>{1, 2}));  // -2 beats -3
  EXPECT_EQ(sp->encode("abab"), (std::vector<int32_t>{4}));   // -2.5 beats -4
  EXPECT_EQ(sp->encode("abxab"), (std::vector<int32_t>{1, 2, 0, 1, 2}));
}

TEST(SentencePiece, ByteFallbackSpellsUnknownCharactersAsUtf8) {
  TempDir dir;
  std::string pieces = piece("<unk>", 0, Type::Unknown);
  for (int b = 0; b < 256; ++b) {
    static const char* hex = "0123456789ABCDEF";
    pieces += piece(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 0, Type::Byte);
  }
  pieces += piece("a", -1);
  const auto sp =
      load_sentencepiece(write_text(dir, "b.model", bpe_model(pieces, varint_field(35, 1))));
  // "é" (C3 A9) is not a piece: bytes 0xC3 and 0xA9 are ids 1 + 0xC3, 1 + 0xA9.
  EXPECT_EQ(sp->encode("a\xc3\xa9"), (std::vector<int32_t>{257, 1 + 0xC3, 1 + 0xA9}));
  EXPECT_EQ(sp->decode({257, 1 + 0xC3, 1 + 0xA9}), "a\xc3\xa9");
  // A byte run that is not UTF-8 decodes each stray byte as U+FFFD.
  EXPECT_EQ(sp->decode({1 + 0xC3, 257}),
            "\xef\xbf\xbd"
            "a");
  // Without all 256 byte pieces, byte fallback is refused.
  const std::string few = piece("<unk>", 0, Type::Unknown) + piece("<0x00>", 0, Type::Byte);
  EXPECT_NE(sp_error_of<IoError>([&] {
              load_sentencepiece(write_text(dir, "few.model", bpe_model(few, varint_field(35, 1))));
            }).find("byte_fallback without the piece <0x01>"),
            std::string::npos);
}

TEST(SentencePiece, WhitespaceRulesOfTheNormaliser) {
  TempDir dir;
  const std::string pieces = piece("<unk>", 0, Type::Unknown) + piece("a", -1);
  // Defaults: dummy prefix, extra spaces removed, spaces escaped.
  const auto sp = load_sentencepiece(
      write_text(dir, "w.model", pieces + bytes_field(2, varint_field(3, 2)) + bytes_field(3, "")));
  EXPECT_EQ(sp->normalize("  a   b  "),
            "\xe2\x96\x81"
            "a\xe2\x96\x81"
            "b");
  EXPECT_EQ(sp->normalize("   "), "");
  // Malformed UTF-8 becomes U+FFFD, a byte at a time.
  EXPECT_EQ(sp->normalize("a\xff"),
            "\xe2\x96\x81"
            "a\xef\xbf\xbd");
  // All three off.
  const auto raw = load_sentencepiece(
      write_text(dir, "raw.model",
                 pieces + bytes_field(2, varint_field(3, 2)) +
                     bytes_field(3, varint_field(3, 0) + varint_field(4, 0) + varint_field(5, 0))));
  EXPECT_EQ(raw->normalize("  a  "), "  a  ");
}

TEST(SentencePiece, MalformedAndUnsupportedFilesAreRefusedByName) {
  TempDir dir;
  const std::string unk = piece("<unk>", 0, Type::Unknown);
  auto io = [&](const std::string& data) {
    return sp_error_of<IoError>([&] { load_sentencepiece(write_text(dir, "bad.model", data)); });
  };
  auto unsupported = [&](const std::string& data) {
    return sp_error_of<NotSupportedError>(
        [&] { load_sentencepiece(write_text(dir, "bad.model", data)); });
  };
  const std::string good = bpe_model(unk + piece("a", -1));
  EXPECT_NE(io(good.substr(0, good.size() - 3)).find("not a protocol buffer message at byte"),
            std::string::npos);
  EXPECT_NE(io("").find("an empty file is not a SentencePiece model"), std::string::npos);
  EXPECT_NE(io("\x0b\x01").find("wire type 3"), std::string::npos);
  EXPECT_NE(io(bpe_model(piece("a", -1))).find("no unknown piece"), std::string::npos);
  EXPECT_NE(io(bpe_model(unk + piece("a", -1) + piece("a", -2))).find("repeats piece 1"),
            std::string::npos);
  EXPECT_NE(io(bpe_model(unk + bytes_field(1, bytes_field(1, "z") + varint_field(3, 9))))
                .find("has type 9; expected 1 to 6"),
            std::string::npos);
  EXPECT_NE(io(bpe_model(unk + piece("", -1))).find("piece 1 is empty"), std::string::npos);
  EXPECT_NE(unsupported(unk + bytes_field(2, varint_field(3, 3))).find("model_type 3 (word)"),
            std::string::npos);
  EXPECT_NE(unsupported(bpe_model(unk, varint_field(24, 1))).find("treat_whitespace_as_suffix"),
            std::string::npos);
  EXPECT_NE(unsupported(bpe_model(unk) + bytes_field(5, bytes_field(2, "rules")))
                .find("denormalizer_spec.precompiled_charsmap"),
            std::string::npos);
  // A charsmap whose trie size runs past its end.
  EXPECT_NE(io(unk + bytes_field(2, varint_field(3, 2)) +
               bytes_field(3, bytes_field(2, std::string("\x40\0\0\0abcd", 8))))
                .find("names a trie of 64 bytes"),
            std::string::npos);
  // Decoding an id outside the vocabulary.
  const auto sp = load_sentencepiece(write_text(dir, "ok.model", good));
  EXPECT_NE(sp_error_of<ValueError>([&] {
              sp->decode({0, 7});
            }).find("id 7 is outside the vocabulary of 2"),
            std::string::npos);
}

}  // namespace
}  // namespace triad::data
