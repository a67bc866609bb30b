// Hugging Face tokenizer.json (byte-level BPE) read into a BpeTokenizer:
// the patterns, ignore_merges, added tokens, NFC, the GPT-2 form against
// Gpt2BpeTokenizer's files, and what is refused by name.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include <thread>

#include "support/temp_dir.h"
#include "triad/core/error.h"
#include "triad/data/tokenizer.h"

namespace triad::data {
namespace {

using Json = nlohmann::json;
using triad::testing::TempDir;

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {  // below 0x800 here
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// GPT-2's byte -> printable symbol map, as tokenizer.json's vocabularies
// spell bytes (" " is "Ġ", "\n" is "Ċ").
std::string symbol(unsigned char b) {
  int extra = 0;
  for (int c = 0; c < 256; ++c) {
    const bool printable =
        (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(c) : static_cast<uint32_t>(256 + extra++);
    if (c == b) return utf8(cp);
  }
  return "";
}

std::string symbols(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) out += symbol(b);
  return out;
}

// A tokenizer.json: every byte (ids 0-255 in byte order), then merged
// tokens, the merges in rank order, `pattern` one of the three regexes, and
// the given extras.
Json tokenizer_json(const std::string& regex, bool nfc, bool ignore_merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[symbol(static_cast<unsigned char>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {" ", "t"}, {" t", "h"}, {" th", "e"}, {"1", "2"}, {"12", "3"}, {"\xC3", "\xA9"}};
  Json m = Json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(Json::array({symbols(a), symbols(b)}));
    vocab[symbols(a + b)] = id++;
  }
  vocab[symbols(" xyz")] = id++;  // reachable only through ignore_merges
  Json j;
  j["version"] = "1.0";
  j["normalizer"] = nfc ? Json{{"type", "NFC"}} : Json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", Json::array({{{"type", "Split"},
                                                        {"pattern", {{"Regex", regex}}},
                                                        {"behavior", "Isolated"},
                                                        {"invert", false}},
                                                       {{"type", "ByteLevel"},
                                                        {"add_prefix_space", false},
                                                        {"trim_offsets", false},
                                                        {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["added_tokens"] = Json::array(
      {{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}, {"lstrip", false}},
       {{"id", 301}, {"content", "<|im_start|>"}, {"special", true}},
       {{"id", 302}, {"content", "<|im"}, {"special", false}}});
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},
                {"byte_fallback", false}, {"ignore_merges", ignore_merges},
                {"vocab", vocab},         {"merges", m}};
  return j;
}

const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::unique_ptr<BpeTokenizer> load(TempDir& dir, const Json& j, const std::string& name = "t") {
  const std::string path = dir.file(name + ".json");
  triad::testing::write_text(path, j.dump());
  std::unique_ptr<Tokenizer> tok = load_hf_tokenizer(path);
  auto* bpe = dynamic_cast<BpeTokenizer*>(tok.get());
  if (bpe == nullptr) throw std::runtime_error(path + " is not read as byte-level BPE");
  tok.release();
  return std::unique_ptr<BpeTokenizer>(bpe);
}

TEST(HfTokenizer, Llama3FormMergesIgnoresMergesAndMatchesAddedTokens) {
  TempDir dir;
  const auto tok = load(dir, tokenizer_json(kLlama3, false, true));
  EXPECT_EQ(tok->settings().pattern, PretokenizePattern::Llama3);
  EXPECT_TRUE(tok->settings().ignore_merges);
  EXPECT_FALSE(tok->settings().nfc);
  EXPECT_EQ(tok->vocab_size(), 303);  // the added tokens' ids past the vocabulary
  // " the" merges to one token (id 258); "1234" is one piece of 3 digits
  // ("123", id 260) and one of 1; " xyz" is a whole vocabulary entry.
  EXPECT_EQ(tok->encode("a the 1234 xyz"), (std::vector<int32_t>{'a', 258, ' ', 260, '4', 262}));
  // Added tokens are matched first, the longest at a position ("<|im_start|>"
  // over "<|im"), and decode to their text.
  const std::string text = "hi<|endoftext|>x<|im_start|><|im<|endoftext|>";
  const std::vector<int32_t> ids = tok->encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{'h', 'i', 300, 'x', 301, 302, 300}));
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(tok->added_token("<|endoftext|>"), 300);
  EXPECT_EQ(tok->added_token("<|nothing|>"), -1);
  // Every added token, each one of special_token's.
  const std::vector<std::string> special = tok->special_tokens();
  EXPECT_EQ(special.size(), 3u);
  for (const std::string& s : special) EXPECT_GE(tok->special_token(s), 300) << s;
  // Any text comes back from its ids.
  for (const std::string t : {"The café's 12345 apples\n\n  indented", "x'LL y'Re", "\t\r\n !?"}) {
    EXPECT_EQ(tok->decode(tok->encode(t)), t) << t;
  }
}

// The ids between the vocabulary and the added tokens are no token: named,
// so that a sampler never produces what decode() refuses.
TEST(HfTokenizer, NamesTheIdsThatAreNoToken) {
  TempDir dir;
  const auto tok = load(dir, tokenizer_json(kLlama3, false, true));
  const std::vector<int32_t> missing = tok->missing_ids();
  ASSERT_FALSE(missing.empty());
  EXPECT_EQ(missing.back(), 299);  // the last id before the added tokens
  for (const int32_t id : missing) {
    EXPECT_THROW(tok->decode({id}), ValueError) << id;
  }
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    if (std::find(missing.begin(), missing.end(), id) == missing.end()) {
      EXPECT_NO_THROW(tok->decode({id})) << id;
    }
  }
  EXPECT_TRUE(ByteTokenizer().missing_ids().empty());
}

TEST(HfTokenizer, WithoutIgnoreMergesAWholeEntryIsBuiltByMergesOnly) {
  TempDir dir;
  const auto tok = load(dir, tokenizer_json(kLlama3, false, false));
  // No merge builds " xyz": its bytes stay apart.
  EXPECT_EQ(tok->encode(" xyz"), (std::vector<int32_t>{' ', 'x', 'y', 'z'}));
}

// Each thread keeps the pieces it has encoded for the tokenizer it last
// served: two tokenizers used in turn, and the same text encoded again,
// give their own ids every time.
TEST(HfTokenizer, CachedPiecesBelongToTheirTokenizer) {
  TempDir dir;
  const auto whole = load(dir, tokenizer_json(kLlama3, false, true), "whole");
  const auto merged = load(dir, tokenizer_json(kLlama3, false, false), "merged");
  const std::vector<int32_t> a{'a', 262}, b{'a', ' ', 'x', 'y', 'z'};
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(whole->encode("a xyz"), a) << round;
    EXPECT_EQ(merged->encode("a xyz"), b) << round;
  }
  std::vector<int32_t> from_another_thread;
  std::thread([&] { from_another_thread = merged->encode("a xyz a xyz"); }).join();
  EXPECT_EQ(from_another_thread,
            (std::vector<int32_t>{'a', ' ', 'x', 'y', 'z', ' ', 'a', ' ', 'x', 'y', 'z'}));
}

TEST(HfTokenizer, Qwen2FormSplitsDigitsAndNormalisesToNfc) {
  TempDir dir;
  const auto tok = load(dir, tokenizer_json(kQwen2, true, false));
  EXPECT_EQ(tok->settings().pattern, PretokenizePattern::Qwen2);
  EXPECT_TRUE(tok->settings().nfc);
  // One digit a piece: "12" is never merged.
  EXPECT_EQ(tok->encode("123"), (std::vector<int32_t>{'1', '2', '3'}));
  // "e" + U+0301 becomes U+00E9 (bytes C3 A9, merged to id 261) first.
  EXPECT_EQ(tok->encode("e\xCC\x81"), (std::vector<int32_t>{261}));
  EXPECT_EQ(tok->encode("\xC3\xA9"), (std::vector<int32_t>{261}));
  const auto plain = load(dir, tokenizer_json(kQwen2, false, false), "plain");
  EXPECT_EQ(plain->encode("e\xCC\x81"), (std::vector<int32_t>{'e', 0xCC, 0x81}));
}

// GPT-4o's o200k pattern (Phi-4-mini's tokenizer.json) and Mistral's
// Tekken (Mistral NeMo's): words split where small letters meet capitals,
// so a merge across "eT" happens under LLaMA 3's pattern only; o200k keeps
// numbers of 3 digits, Tekken splits them.
TEST(HfTokenizer, O200kAndTekkenFormsSplitWordsByCase) {
  const char* o200k =
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const char* tekken =
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  TempDir dir;
  struct Form {
    const char* regex;
    PretokenizePattern pattern;
    std::vector<int32_t> the_top, digits;
  };
  for (const Form& f :
       {Form{kLlama3, PretokenizePattern::Llama3, {'t', 'h', 400, 'o', 'p'}, {260}},
        Form{o200k, PretokenizePattern::O200k, {'t', 'h', 'e', 'T', 'o', 'p'}, {260}},
        Form{
            tekken, PretokenizePattern::Tekken, {'t', 'h', 'e', 'T', 'o', 'p'}, {'1', '2', '3'}}}) {
    SCOPED_TRACE(pretokenize_pattern_name(f.pattern));
    Json j = tokenizer_json(f.regex, false, false);
    j["model"]["merges"].push_back(Json::array({"e", "T"}));
    j["model"]["vocab"]["eT"] = 400;
    const auto tok = load(dir, j, pretokenize_pattern_name(f.pattern));
    EXPECT_EQ(tok->settings().pattern, f.pattern);
    EXPECT_EQ(tok->encode("theTop"), f.the_top);
    EXPECT_EQ(tok->encode("123"), f.digits);
    EXPECT_EQ(tok->decode(tok->encode("theTop 123")), "theTop 123");
  }
}

TEST(HfTokenizer, Gpt2FormEqualsTheVocabAndMergesFiles) {
  TempDir dir;
  Json j = tokenizer_json(kLlama3, false, false);
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["added_tokens"] = Json::array();
  // The older merges form: "left right" strings.
  Json merges = Json::array();
  std::string merges_txt = "#version: 0.2\n";
  for (const auto& m : j["model"]["merges"]) {
    merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    merges_txt += merges.back().get<std::string>() + "\n";
  }
  j["model"]["merges"] = merges;
  const auto tok = load(dir, j);
  EXPECT_EQ(tok->settings().pattern, PretokenizePattern::Gpt2);
  triad::testing::write_text(dir.file("vocab.json"), j["model"]["vocab"].dump());
  triad::testing::write_text(dir.file("merges.txt"), merges_txt);
  const Gpt2BpeTokenizer files(dir.file("vocab.json"), dir.file("merges.txt"));
  for (const std::string t : {"a the 1234 xyz", "café  the\n\nthe", "it's 123 the'll"}) {
    EXPECT_EQ(tok->encode(t), files.encode(t)) << t;
  }
  // A directory reads its tokenizer.json.
  triad::testing::write_text(dir.file("tokenizer.json"), j.dump());
  EXPECT_EQ(load_hf_tokenizer(dir.path())->encode("the the"), tok->encode("the the"));
}

// GPT-NeoX's (Pythia's) form: GPT-2's ByteLevel pre-tokeniser behind an NFC
// normaliser, and runs of spaces as added tokens that are not special
// (normalized, which NFC leaves as they are): a run takes the longest
// such token at its start, as Hugging Face's leftmost-longest match does;
// tens of thousands of runs in one text come out one per run.
TEST(HfTokenizer, GptNeoxFormMatchesRunsOfSpacesAsAddedTokens) {
  TempDir dir;
  Json j = tokenizer_json(kLlama3, true, false);
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  j["added_tokens"] = Json::array(
      {{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}}});
  for (int n = 2; n <= 4; ++n) {
    j["added_tokens"].push_back({{"id", 299 + n},
                                 {"content", std::string(static_cast<size_t>(n), ' ')},
                                 {"special", false},
                                 {"normalized", true}});
  }
  const auto tok = load(dir, j);
  EXPECT_EQ(tok->settings().pattern, PretokenizePattern::Gpt2);
  EXPECT_TRUE(tok->settings().nfc);
  // 4 spaces: one token (303); 5: 4 then the plain " the" (258); 3 then 2.
  EXPECT_EQ(tok->encode("a    b"), (std::vector<int32_t>{'a', 303, 'b'}));
  EXPECT_EQ(tok->encode("a     the"), (std::vector<int32_t>{'a', 303, 258}));
  EXPECT_EQ(tok->encode("x   <|endoftext|>  y"), (std::vector<int32_t>{'x', 302, 300, 301, 'y'}));
  std::string code;
  std::vector<int32_t> want;
  for (int i = 0; i < 20000; ++i) {
    code += i % 2 ? "x   " : "y  ";
    want.push_back(i % 2 ? 'x' : 'y');
    want.push_back(i % 2 ? 302 : 301);
  }
  EXPECT_EQ(tok->encode(code), want);
  EXPECT_EQ(tok->decode(want), code);
}

TEST(HfTokenizer, WhatTriadDoesNotBuildIsNamed) {
  TempDir dir;
  auto message = [&](const Json& j) {
    try {
      load(dir, j, "bad");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto expect = [&](const Json& j, const std::string& want) {
    EXPECT_NE(message(j).find(want), std::string::npos) << message(j);
  };
  const Json good = tokenizer_json(kLlama3, false, false);
  Json j = good;
  j["model"]["type"] = "WordPiece";
  expect(j, "'model.type' (\"WordPiece\"): only BPE (byte-level");
  j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  expect(j, "'pre_tokenizer.pretokenizers[0].pattern' ({\"Regex\":\"\\\\w+\"}): not one of");
  j = good;
  j["normalizer"] = {{"type", "Lowercase"}};
  expect(j, "'normalizer' ({\"type\":\"Lowercase\"}): only NFC");
  j = good;
  j["added_tokens"][0]["lstrip"] = true;
  expect(j, "'added_tokens[0].lstrip' (true)");
  j = good;
  j["model"]["byte_fallback"] = true;  // the SentencePiece kind, with a byte-level pre-tokeniser
  expect(j, "only Metaspace, a literal Split or none is implemented");
  j = good;
  j["model"]["merges"][2] = "abc";
  expect(j, "'model.merges[2]' (\"abc\") is not 'left right'");
  j = good;
  j["model"]["vocab"]["!"] = -4;
  expect(j, "'model.vocab' entry '!' has the id -4");
  j = good;
  j["added_tokens"][0]["id"] = 65;  // "A"'s id
  expect(j, "added token '<|endoftext|>' takes id 65, the vocabulary's 'A'");
  // An id past an int32 (once cut to its low 32 bits: 2^32 + 65 read as 65).
  j = good;
  j["added_tokens"][0]["id"] = (int64_t{1} << 32) + 65;
  expect(j, "'added_tokens[0].id' (4294967361) must be an id in [0, 2^31)");
  // Two tokens with one id (decoding it would give one for the other).
  j = good;
  j["model"]["vocab"]["!"] = 65;
  expect(j, "tokenizer: 'A' and '!' share the id 65");
  j = good;
  j["pre_tokenizer"] = {{"type", "Metaspace"}};  // the SentencePiece kind, a byte-level decoder
  expect(j, "'decoder' ({\"type\":\"ByteLevel\"}): with a SentencePiece-style model only");
  triad::testing::write_text(dir.file("broken.json"), "{\"model\": ");
  EXPECT_THROW(load_hf_tokenizer(dir.file("broken.json")), IoError);
  EXPECT_THROW(load_hf_tokenizer(dir.file("absent.json")), IoError);
}

// NFC's three steps by hand (the parity test runs 2000 texts against
// Python's unicodedata): composition, canonical reordering of marks, Hangul
// by formula, singletons, blocked marks, and malformed bytes kept.
TEST(Nfc, ComposesReordersAndKeepsWhatItCannotRead) {
  EXPECT_EQ(nfc("plain ASCII and caf\xC3\xA9"), "plain ASCII and caf\xC3\xA9");
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");              // e + acute -> é
  EXPECT_EQ(nfc("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");  // a + circumflex + dot below -> ậ
  EXPECT_EQ(nfc("a\xCC\xA3\xCC\x82"), "\xE1\xBA\xAD");  // the other order too
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");           // Angstrom sign -> Å
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(nfc("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");              // 가 + final -> 각
  EXPECT_EQ(nfc("\xCC\x81"
                "e"),
            "\xCC\x81"
            "e");                                    // a leading mark stays
  EXPECT_EQ(nfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");  // a malformed byte blocks
  EXPECT_STRNE(nfc_unicode_version(), "");
}

}  // namespace
}  // namespace triad::data

namespace triad::data {
namespace {

// The SentencePiece kind (LLaMA 2's tokenizer.json): ▁ for spaces, 256
// byte tokens, merges by rank. `legacy`: the Prepend and Replace
// normalisers; else a Metaspace pre-tokeniser (`scheme`, `split`).
Json metaspace_json(bool legacy, const std::string& scheme = "first", bool split = false) {
  const std::string sp = "\xE2\x96\x81";
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int id = 259;
  for (const std::string& t :
       {sp, std::string("a"), std::string("b"), std::string("c"), sp + "a", std::string("ab"),
        sp + "ab", std::string("h"), std::string("i"), std::string("hi"), sp + "hi"})
    vocab[t] =
        id++;  // ▁ 259, a 260, b 261, c 262, ▁a 263, ab 264, ▁ab 265, h 266, i 267, hi 268, ▁hi 269
  Json j;
  j["model"] = {{"type", "BPE"},
                {"unk_token", "<unk>"},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"vocab", vocab},
                {"merges", Json::array({Json::array({"a", "b"}), Json::array({sp, "a"}),
                                        Json::array({sp + "a", "b"}), Json::array({sp, "ab"}),
                                        Json::array({"h", "i"}), Json::array({sp, "hi"})})}};
  j["added_tokens"] = Json::array();
  for (const auto& [content, i] :
       {std::pair<std::string, int>{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}})
    j["added_tokens"].push_back(
        {{"id", i}, {"content", content}, {"normalized", false}, {"special", true}});
  if (legacy) {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "Prepend"}, {"prepend", sp}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}};
    j["pre_tokenizer"] = nullptr;
  } else {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", scheme}, {"split", split}};
  }
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  return j;
}

std::unique_ptr<Tokenizer> load_any(TempDir& dir, const Json& j) {
  const std::string path = dir.file("metaspace.json");
  triad::testing::write_text(path, j.dump());
  return load_hf_tokenizer(path);
}

using Ids = std::vector<int32_t>;

// LLaMA 2's legacy form: ▁ before each piece between added tokens, the
// whole piece one word merged by rank (the heap's order: "ab" first, then
// "▁ab"; "hi" then "▁hi"), unknown characters as their bytes.
TEST(HfMetaspaceTokenizer, LegacyFormMergesByRankAndFallsBackToBytes) {
  TempDir dir;
  const auto tok = load_any(dir, metaspace_json(true));
  ASSERT_NE(dynamic_cast<const MetaspaceBpeTokenizer*>(tok.get()), nullptr);
  EXPECT_EQ(tok->vocab_size(), 270);
  EXPECT_EQ(tok->encode("ab"), (Ids{265}));
  EXPECT_EQ(tok->encode("hi ab"), (Ids{269, 265}));
  EXPECT_EQ(tok->encode(" ab"), (Ids{259, 265}));  // the Prepend normaliser adds one regardless
  EXPECT_EQ(tok->encode(""), (Ids{}));
  EXPECT_EQ(tok->encode("\xC3\xA9"), (Ids{259, 3 + 0xC3, 3 + 0xA9}));  // é: its two bytes
  // Added tokens first; each piece after one gets its own ▁.
  EXPECT_EQ(tok->encode("hi<s>ab"), (Ids{269, 1, 265}));
  EXPECT_EQ(tok->special_token("</s>"), 2);
  // Decoding: ▁ as spaces, byte runs as text, the first space stripped.
  EXPECT_EQ(tok->decode({265, 259, 265}), "ab  ab");
  EXPECT_EQ(tok->decode({259, 3 + 0xC3, 3 + 0xA9, 269}), "\xC3\xA9 hi");
  // A byte run that is not UTF-8: U+FFFD for each of its bytes.
  EXPECT_EQ(tok->decode({263, 3 + 0xC3, 3 + 0xA9, 3 + 0xC3}),
            "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode({1, 265}), "<s> ab");  // an added token goes through the steps too
  for (const std::string text : {"ab hi", "  hi", "a\xC3\xA9\xE2\x82\xAC b\n"})
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
  EXPECT_THROW(tok->decode({270}), ValueError);
}

// The Metaspace form: ▁ prepended to the text's first piece only (not
// after an added token, not before a leading space); always: to each.
TEST(HfMetaspaceTokenizer, MetaspacePrependSchemesAndSplit) {
  TempDir dir;
  auto tok = load_any(dir, metaspace_json(false, "first"));
  EXPECT_EQ(tok->encode("ab"), (Ids{265}));
  EXPECT_EQ(tok->encode(" ab"), (Ids{265}));
  EXPECT_EQ(tok->encode("<s>ab"), (Ids{1, 264}));
  EXPECT_EQ(tok->encode("ab<s> ab"), (Ids{265, 1, 265}));
  tok = load_any(dir, metaspace_json(false, "always"));
  EXPECT_EQ(tok->encode("<s>ab"), (Ids{1, 265}));
  tok = load_any(dir, metaspace_json(false, "never"));
  EXPECT_EQ(tok->encode("ab"), (Ids{264}));
  // split: each ▁ begins a word, so "b▁a" never merges across words.
  auto* ms = dynamic_cast<const MetaspaceBpeTokenizer*>(
      (tok = load_any(dir, metaspace_json(false, "always", true))).get());
  ASSERT_NE(ms, nullptr);
  const std::string sp = "\xE2\x96\x81";
  EXPECT_EQ(ms->words("ab  ab", true), (std::vector<std::string>{sp + "ab", sp, sp + "ab"}));
  EXPECT_EQ(ms->words("ab ", false), (std::vector<std::string>{sp + "ab", sp}));
  EXPECT_EQ(tok->encode("ab  ab"), (Ids{265, 259, 265}));
  // The older form's add_prefix_space is prepend_scheme always or never.
  Json j = metaspace_json(false);
  j["pre_tokenizer"].erase("prepend_scheme");
  j["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(load_any(dir, j)->encode("ab"), (Ids{264}));
}

// Unknown characters without byte fallback: the unknown token, one per
// run with fuse_unk; with no unknown token, an error naming the character.
TEST(HfMetaspaceTokenizer, UnknownCharactersAndDecoderSteps) {
  TempDir dir;
  Json j = metaspace_json(true);
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(load_any(dir, j)->encode("a\xC3\xA9\xC3\xA9"
                                     "b"),
            (Ids{263, 0, 261}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(load_any(dir, j)->encode("a\xC3\xA9\xC3\xA9"), (Ids{263, 0, 0}));
  j["model"]["unk_token"] = nullptr;
  try {
    load_any(dir, j)->encode("a\xC3\xA9");
    ADD_FAILURE() << "no error for a character outside the vocabulary";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("the character '\xC3\xA9' (U+00E9) is not in the "
                                         "vocabulary, and the tokenizer has no unknown token"),
              std::string::npos)
        << e.what();
  }
  // Gemma's kind of decoder (no Strip) keeps the leading space; the
  // Metaspace decoder drops ▁ in the first token; no decoder joins tokens
  // with spaces, as Hugging Face's tokenizers does.
  j = metaspace_json(true);
  j["decoder"]["decoders"].erase(3);
  EXPECT_EQ(load_any(dir, j)->decode({265, 269}), " ab hi");
  j["decoder"] = {
      {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  EXPECT_EQ(load_any(dir, j)->decode({265, 269}), "ab hi");
  j["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(load_any(dir, j)->decode({265, 269}), " ab hi");
  j["decoder"] = nullptr;
  EXPECT_EQ(load_any(dir, j)->decode({264, 260}), "ab a");
}

// Gemma's form: a Replace normaliser alone (no ▁ prepended), and newer
// files' Split on " " after it (nothing left to split). A literal Split's
// behaviours cut text as Hugging Face's do.
TEST(HfMetaspaceTokenizer, GemmaFormAndLiteralSplits) {
  TempDir dir;
  Json j = metaspace_json(true);
  j["normalizer"] = j["normalizer"]["normalizers"][1];
  EXPECT_EQ(load_any(dir, j)->encode("ab"), (Ids{264}));
  EXPECT_EQ(load_any(dir, j)->encode("hi ab"), (Ids{268, 265}));
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"String", " "}}},
                        {"behavior", "MergedWithPrevious"},
                        {"invert", false}};
  EXPECT_EQ(load_any(dir, j)->encode("hi ab"), (Ids{268, 265}));
  j["normalizer"] = nullptr;
  using Words = std::vector<std::string>;
  for (const auto& [behavior, want] :
       std::vector<std::pair<std::string, Words>>{{"Removed", {"a", "b", "c"}},
                                                  {"Isolated", {"a", " ", " ", "b", " ", "c"}},
                                                  {"Contiguous", {"a", "  ", "b", " ", "c"}},
                                                  {"MergedWithPrevious", {"a ", " ", "b ", "c"}},
                                                  {"MergedWithNext", {"a", " ", " b", " c"}}}) {
    j["pre_tokenizer"]["behavior"] = behavior;
    const auto tok = load_any(dir, j);
    const auto* ms = dynamic_cast<const MetaspaceBpeTokenizer*>(tok.get());
    ASSERT_NE(ms, nullptr);
    EXPECT_EQ(ms->words("a  b c", true), want) << behavior;
    EXPECT_EQ(ms->words("", true), Words{}) << behavior;
  }
  j["pre_tokenizer"]["behavior"] = "MergedWithNext";
  const auto next = load_any(dir, j);
  EXPECT_EQ(dynamic_cast<const MetaspaceBpeTokenizer&>(*next).words(" a ", true),
            (Words{" a", " "}));
  j["pre_tokenizer"]["behavior"] = "Sideways";
  try {
    load_any(dir, j);
    ADD_FAILURE() << "no error for an unknown behavior";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'pre_tokenizer.behavior' (\"Sideways\")"),
              std::string::npos);
  }
}

TEST(HfMetaspaceTokenizer, WhatTriadDoesNotBuildIsNamed) {
  TempDir dir;
  const auto message = [&](const Json& j) {
    try {
      load_any(dir, j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto expect = [&](const Json& j, const std::string& want) {
    EXPECT_NE(message(j).find(want), std::string::npos) << message(j);
  };
  Json j = metaspace_json(true);
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
  expect(j, "'normalizer.normalizers[1].pattern' ({\"Regex\":\" +\"}): only a literal");
  j = metaspace_json(true);
  j["normalizer"] = {{"type", "Precompiled"}};
  expect(j, "'normalizer' ({\"type\":\"Precompiled\"}): of the normalisers only Prepend");
  j = metaspace_json(true);
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}};
  expect(j, "'pre_tokenizer.pattern' ({\"Regex\":\"\\\\s\"}): only a literal");
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect(j, "'pre_tokenizer' ({\"type\":\"Whitespace\"}): with a SentencePiece-style model");
  j = metaspace_json(true);
  j["decoder"]["decoders"][1] = {{"type", "CTC"}};
  expect(j, "'decoder.decoders[1]' ({\"type\":\"CTC\"}): with a SentencePiece-style model only");
  j = metaspace_json(false);
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  expect(j, "'pre_tokenizer.prepend_scheme' (\"sometimes\") must be");
  // An added token matched in normalised text the normaliser changes.
  j = metaspace_json(true);
  j["added_tokens"][1]["normalized"] = true;
  expect(j, "'added_tokens[1].normalized' (true): an added token matched in normalised text");
  j = metaspace_json(true);
  j["model"]["vocab"]["c"] = j["model"]["vocab"]["b"];
  expect(j, "share the id 261");
  j = metaspace_json(true);
  j["model"]["unk_token"] = "<oov>";
  expect(j, "'model.unk_token' ('<oov>') is not in the vocabulary");
  j = metaspace_json(true);
  j["model"]["merges"].push_back(Json::array({"c", "c"}));
  expect(j, "merge 6 ('c' 'c') needs 'cc', which is not in the vocabulary");
  // Ids far past the vocabulary's size (a table of them would not fit).
  j = metaspace_json(true);
  j["added_tokens"][2]["id"] = 2000000000;
  expect(j, "the largest id is 2000000000 for 273 tokens");
  // A flag of the wrong type is an error naming the file.
  j = metaspace_json(false);
  j["pre_tokenizer"]["split"] = "yes";
  expect(j, "metaspace.json: [json.exception.type_error");
  // Without a normaliser a normalized token is matched as it is.
  j = metaspace_json(false);
  j["added_tokens"][1]["normalized"] = true;
  EXPECT_EQ(load_any(dir, j)->encode("<s>ab"), (Ids{1, 264}));
}

}  // namespace
}  // namespace triad::data
