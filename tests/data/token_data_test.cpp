#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "support/temp_dir.h"
#include "triad/data/token_dataset.h"
#include "triad/data/token_shard.h"
#include "triad/data/tokenizer.h"
#include "triad/ops.h"

namespace triad::data {
namespace {

using triad::testing::TempDir;

std::vector<uint8_t> shard_bytes(int32_t magic, int32_t version, int32_t count, size_t ntokens,
                                 uint16_t token = 7) {
  std::vector<uint8_t> b(kShardHeaderBytes + 2 * ntokens, 0);
  int32_t h[3] = {magic, version, count};
  std::memcpy(b.data(), h, sizeof(h));
  for (size_t i = 0; i < ntokens; ++i) std::memcpy(b.data() + kShardHeaderBytes + 2 * i, &token, 2);
  return b;
}

void expect_shard_error(const std::string& path, int64_t vocab, const std::string& fragment) {
  try {
    read_token_shard(path, vocab);
    FAIL() << "expected error with '" << fragment << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(TokenShard, RoundTripAndValidation) {
  TempDir dir;
  const std::string p = dir.file("a.bin");
  std::vector<uint16_t> tokens{1, 2, 3, 65535};
  write_token_shard(p, tokens);
  EXPECT_EQ(read_token_shard(p), tokens);
  // (An empty shard's copy passed memcpy a null pointer: UBSan's finding,
  // tests/fuzz/corpus/token_shard/seed-empty.)
  write_token_shard(p, {});
  EXPECT_TRUE(read_token_shard(p, 50257).empty());
  write_token_shard(p, tokens);
  expect_shard_error(p, 1000, "token 65535 at position 3");
  triad::testing::write_bytes(p, shard_bytes(123, 1, 2, 2));
  expect_shard_error(p, 0, "magic 123");
  triad::testing::write_bytes(p, shard_bytes(kShardMagic, 2, 2, 2));
  expect_shard_error(p, 0, "version 2");
  triad::testing::write_bytes(p, shard_bytes(kShardMagic, 1, 5, 2));
  expect_shard_error(p, 0, "header says 5 tokens");
  triad::testing::write_bytes(p, std::vector<uint8_t>(100, 0));
  expect_shard_error(p, 0, "shorter than the 1024-byte header");
  expect_shard_error(dir.file("missing.bin"), 0, "cannot open");
}

// The streaming writer: pieces added one by one make one shard whose header
// counts them all; ids that do not fit are named; a writer dropped before
// finish() leaves nothing.
TEST(TokenShard, TheStreamingWriterAppendsPiecesAndCountsThemAtTheEnd) {
  TempDir dir;
  {
    TokenShardWriter w(dir.file("s.bin"));
    w.add({1, 2});
    w.add({});
    w.add({3, 65535});
    EXPECT_EQ(w.tokens(), 4u);
    EXPECT_THROW(w.add({70000}), ValueError);
    EXPECT_THROW(w.add({-1}), ValueError);
    w.finish();
  }
  EXPECT_EQ(read_token_shard(dir.file("s.bin")), (std::vector<uint16_t>{1, 2, 3, 65535}));
  {
    TokenShardWriter w(dir.file("dropped.bin"));
    w.add({5});
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.bin.tmp")));
}

// Documents read a batch at a time are the documents of the whole text,
// in every division, whatever the batch size; a JSON error names its line
// in the whole stream.
TEST(Tokenizer, DocumentsReadInBatchesAreTheWholeTextsDocuments) {
  const std::string text = "first line\r\n\n  second\nthird\n \t\n\nfourth para\nlast line";
  const std::string jsonl = "{\"text\": \"a\"}\n\n{\"text\": \"bb\"}\n{\"text\": \"ccc\"}\n";
  for (DocumentSplit how : {DocumentSplit::Whole, DocumentSplit::Lines, DocumentSplit::Paragraphs,
                            DocumentSplit::JsonLines}) {
    const std::string& input = how == DocumentSplit::JsonLines ? jsonl : text;
    const std::vector<std::string> want = split_documents(input, how);
    ASSERT_FALSE(want.empty());
    for (size_t max_bytes : {size_t{1}, size_t{7}, size_t{20}, SIZE_MAX}) {
      std::istringstream in(input);
      DocumentReader reader(in, how);
      std::vector<std::string> got, batch;
      int batches = 0;
      while (reader.next(batch, max_bytes)) {
        got.insert(got.end(), batch.begin(), batch.end());
        batch.clear();
        ++batches;
      }
      EXPECT_EQ(got, want) << "split " << static_cast<int>(how) << ", batches of " << max_bytes;
      if (how == DocumentSplit::Lines && max_bytes == 1) {
        EXPECT_GE(batches, 5);
      }
    }
  }
  std::istringstream bad("{\"text\": \"a\"}\n{\"text\": \"b\"}\n\n{oops\n");
  DocumentReader reader(bad, DocumentSplit::JsonLines);
  std::vector<std::string> batch;
  EXPECT_TRUE(reader.next(batch, 1));
  try {
    while (reader.next(batch, 1)) {
    }
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()),
              "JSON line 4 does not parse at byte 2: syntax error while parsing object key - "
              "invalid literal; last read: '{o'; expected string literal");
  }
}

TEST(TokenShard, GlobExpandsSorted) {
  TempDir dir;
  write_token_shard(dir.file("train_01.bin"), {1});
  write_token_shard(dir.file("train_00.bin"), {2});
  auto paths = expand_shard_paths(dir.file("train_*.bin"));
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_NE(paths[0].find("train_00"), std::string::npos);
  EXPECT_THROW(expand_shard_paths(dir.file("nothing_*.bin")), IoError);
}

TEST(TokenDataset, SequenceJOfStepKFollowsTheLayoutFreeRule) {
  TempDir dir;
  std::vector<uint16_t> a, b;
  for (uint16_t i = 0; i < 50; ++i) a.push_back(i);
  for (uint16_t i = 50; i < 101; ++i) b.push_back(i);
  write_token_shard(dir.file("s0.bin"), a);
  write_token_shard(dir.file("s1.bin"), b);
  TokenDataset ds({dir.file("s0.bin"), dir.file("s1.bin")}, 4, 200);
  EXPECT_EQ(ds.num_tokens(), 101);
  EXPECT_EQ(ds.num_sequences(), 25);
  const int64_t G = 3, T = 4;
  // Sequence j of step k starts at (k*G + j)*T; crosses the shard boundary.
  Batch batch = ds.batch(4, G, 1, 2);
  auto in = to_double_vector(batch.inputs), tg = to_double_vector(batch.targets);
  for (int64_t j = 0; j < 2; ++j) {
    const int64_t start = (4 * G + 1 + j) * T;
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(in[j * T + t], start + t);
      EXPECT_EQ(tg[j * T + t], start + t + 1);
    }
  }
  // Any split of the global batch gives the same sequences.
  Batch whole = ds.batch(4, G, 0, 3);
  auto w = to_double_vector(whole.inputs);
  EXPECT_TRUE(std::equal(in.begin(), in.end(), w.begin() + T));
  EXPECT_THROW(ds.batch(0, 3, 2, 2), ValueError);
  // Wrap-around past the end of the stream.
  Batch wrapped = ds.batch(25, 1, 0, 1);
  EXPECT_EQ(to_double_vector(wrapped.inputs)[0], 0.0);
  EXPECT_THROW(TokenDataset({dir.file("s0.bin")}, 4, 40), IoError);  // token 49 >= vocab 40
}

TEST(TokenDataset, ShuffledIndexIsABijectionEveryPass) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    std::vector<std::vector<int64_t>> orders;
    for (auto [seed, epoch] : std::vector<std::pair<uint64_t, int64_t>>{{5, 0}, {5, 1}, {6, 0}}) {
      std::vector<int64_t> order;
      std::vector<bool> hit(static_cast<size_t>(n), false);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t q = shuffled_index(i, n, seed, epoch);
        ASSERT_GE(q, 0);
        ASSERT_LT(q, n);
        EXPECT_FALSE(hit[static_cast<size_t>(q)]) << "n " << n << ": " << q << " twice";
        hit[static_cast<size_t>(q)] = true;
        order.push_back(q);
        EXPECT_EQ(shuffled_index(i, n, seed, epoch), q);  // a pure function
      }
      orders.push_back(order);
    }
    if (n >= 7) {
      EXPECT_NE(orders[0], orders[1]) << "n " << n << ": a new order every pass";
      EXPECT_NE(orders[0], orders[2]) << "n " << n << ": the seed matters";
    }
    if (n == 1000) {
      int fixed = 0;
      for (int64_t i = 0; i < n; ++i) fixed += orders[0][static_cast<size_t>(i)] == i;
      EXPECT_LT(fixed, 10);  // about 1 expected for a random permutation
    }
  }
  EXPECT_THROW(shuffled_index(5, 5, 1, 0), ValueError);
}

TEST(TokenDataset, ShuffledPassesVisitEverySequenceOnceWhateverTheSplit) {
  TempDir dir;
  std::vector<uint16_t> a;
  for (uint16_t i = 0; i < 121; ++i) a.push_back(i);
  write_token_shard(dir.file("s.bin"), a);
  TokenDataset ds({dir.file("s.bin")}, 4, 200);  // 30 sequences
  ds.shuffle(42);
  const int64_t G = 6;  // 5 steps per pass
  for (int64_t pass = 0; pass < 2; ++pass) {
    std::vector<int64_t> starts;
    for (int64_t k = 5 * pass; k < 5 * pass + 5; ++k) {
      Batch whole = ds.batch(k, G, 0, G);
      auto w = to_double_vector(whole.inputs), t = to_double_vector(whole.targets);
      for (int64_t j = 0; j < G; ++j) {
        starts.push_back(static_cast<int64_t>(w[j * 4]));
        EXPECT_EQ(static_cast<int64_t>(w[j * 4]) % 4, 0);  // sequence boundaries stay put
        EXPECT_EQ(t[j * 4], w[j * 4] + 1);
        EXPECT_EQ(ds.sequence_of(k * G + j) * 4, static_cast<int64_t>(w[j * 4]));
      }
      // Two ranks' halves are the whole batch's halves.
      auto lo = to_double_vector(ds.batch(k, G, 0, 3).inputs);
      auto hi = to_double_vector(ds.batch(k, G, 3, 3).inputs);
      lo.insert(lo.end(), hi.begin(), hi.end());
      EXPECT_EQ(lo, w);
    }
    std::vector<int64_t> sorted = starts;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t q = 0; q < 30; ++q) EXPECT_EQ(sorted[static_cast<size_t>(q)], 4 * q);
    bool in_order = true;
    for (int64_t q = 0; q < 30; ++q) in_order &= starts[static_cast<size_t>(q)] == 4 * q;
    EXPECT_FALSE(in_order) << "pass " << pass;
  }
}

TEST(Tokenizer, TextSplitsIntoDocumentsByLineParagraphOrJsonLine) {
  const std::string text = "first line\r\nsecond\n\n  \nthird\nstill third\n\n\nfourth";
  EXPECT_EQ(split_documents(text, DocumentSplit::Whole), std::vector<std::string>{text});
  EXPECT_EQ(
      split_documents(text, DocumentSplit::Lines),
      (std::vector<std::string>{"first line", "second", "  ", "third", "still third", "fourth"}));
  EXPECT_EQ(split_documents(text, DocumentSplit::Paragraphs),
            (std::vector<std::string>{"first line\r\nsecond", "third\nstill third", "fourth"}));
  EXPECT_EQ(document_split_from_string("paragraphs"), DocumentSplit::Paragraphs);
  const std::string jsonl =
      "{\"text\": \"one\\ntwo\", \"id\": 1}\n\n{\"id\": 2, \"text\": \"caf\u00e9\"}\r\n";
  EXPECT_EQ(split_documents(jsonl, DocumentSplit::JsonLines),
            (std::vector<std::string>{"one\ntwo", "caf\u00e9"}));
  auto json_error = [](const std::string& text, const std::string& key) {
    try {
      split_documents(text, DocumentSplit::JsonLines, key);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(json_error("{\"text\": \"a\"}\n{\"text\": 3}\n", "text"),
            "JSON line 2 has no string \"text\" (--json-key names the field)");
  EXPECT_EQ(json_error("{\"body\": \"a\"}\n", "text"),
            "JSON line 1 has no string \"text\" (--json-key names the field)");
  EXPECT_EQ(
      json_error("\n\n{\"text\": \"a\"\n", "text").rfind("JSON line 3 does not parse at byte", 0),
      0u);
  EXPECT_EQ(json_error("[1]\n", "text"), "JSON line 1 is not an object");
  EXPECT_EQ(json_error("{\"n\": 1e999}\n", "text").rfind("JSON line 1 does not parse", 0), 0u);
  EXPECT_EQ(split_documents("{\"body\": \"b\"}", DocumentSplit::JsonLines, "body"),
            std::vector<std::string>{"b"});
  EXPECT_THROW(document_split_from_string("pages"), ValueError);
  ByteTokenizer tok;
  const auto docs = tokenize_documents(tok, {"ab", "c"}, 0);
  EXPECT_EQ(docs, (std::vector<std::vector<int64_t>>{{97, 98, 0}, {99, 0}}));
  EXPECT_EQ(tokenize_documents(tok, {"ab"}, -1), (std::vector<std::vector<int64_t>>{{97, 98}}));
  // A beginning-of-document token goes first (LLaMA 2's <s>).
  EXPECT_EQ(tokenize_documents(tok, {"ab", ""}, 0, 1, 0, 7),
            (std::vector<std::vector<int64_t>>{{7, 97, 98, 0}, {7, 0}}));
  EXPECT_THROW(tokenize_documents(tok, {"ab"}, 0, 1, 0, 256), ValueError);
  // Any number of workers gives the same documents in the same order.
  std::vector<std::string> many;
  for (int i = 0; i < 50; ++i)
    many.push_back(std::string(static_cast<size_t>(i % 7 + 1), 'a' + i % 26));
  const auto one = tokenize_documents(tok, many, 0, 1);
  EXPECT_EQ(one.size(), 50u);
  EXPECT_EQ(one[3], (std::vector<int64_t>{'d', 'd', 'd', 'd', 0}));
  for (int workers : {0, 2, 7, 64}) EXPECT_EQ(tokenize_documents(tok, many, 0, workers), one);
  EXPECT_THROW(tokenize_documents(tok, many, 0, -1), ValueError);
  try {
    tokenize_documents(tok, {"ab"}, 256);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(
        std::string(e.what()).find("token 256 is outside the tokenizer's vocabulary [0, 256)"),
        std::string::npos)
        << e.what();
  }
}

TEST(Tokenizer, ByteLevelRoundTrips) {
  ByteTokenizer tok;
  const std::string s = "héllo\n\t!";
  auto ids = tok.encode(s);
  EXPECT_EQ(ids.size(), s.size());
  EXPECT_EQ(tok.decode(ids), s);
  EXPECT_THROW(tok.decode({300}), ValueError);
}

TEST(Tokenizer, Gpt2PretokenizationSplitsLikeTheReferencePattern) {
  auto p = gpt2_pretokenize("Hello world's  end!! 123abc\n\nok ");
  // "\s+(?!\S)" leaves the last newline of a run that precedes text.
  std::vector<std::string> expect{"Hello", " world", "'s", " ",  " end", "!!",
                                  " 123",  "abc",    "\n", "\n", "ok",   " "};
  EXPECT_EQ(p, expect);
}

// Unicode's classes, as OpenAI's pattern (the regex module) gives them:
// curly quotes, dashes, marks, superscripts and symbols are not letters;
// Arabic-Indic digits and vulgar fractions are numbers; NBSP and the
// ideographic space are whitespace. (The parity label checks 2000 texts.)
TEST(Tokenizer, Gpt2PretokenizationUsesUnicodeClasses) {
  EXPECT_EQ(gpt2_pretokenize("It\u2019s \u201Cquoted\u201D \u2014 na\u00EFve caf\u00E9 \u00BD "
                             "\u0663\u0664 x\u00B2 \U0001F600\U0001F680 "
                             "\u65E5\u672C\u8A9E\u30C6\u30AD\u30B9\u30C8 e\u0301 they're "
                             "we'll I'VE"),
            (std::vector<std::string>{"It",
                                      "\u2019",
                                      "s",
                                      " \u201C",
                                      "quoted",
                                      "\u201D",
                                      " \u2014",
                                      " na\u00EFve",
                                      " caf\u00E9",
                                      " \u00BD",
                                      " \u0663\u0664",
                                      " x",
                                      "\u00B2",
                                      " \U0001F600\U0001F680",
                                      " \u65E5\u672C\u8A9E\u30C6\u30AD\u30B9\u30C8",
                                      " e",
                                      "\u0301",
                                      " they",
                                      "'re",
                                      " we",
                                      "'ll",
                                      " I",
                                      "'",
                                      "VE"}));
  EXPECT_EQ(gpt2_pretokenize("\u00DCn\u00EFc\u00F6d\u00E9\u00A0text\u3000\u5168\u89D2 "
                             "\u03A9\u2248\u00E7\u221A \u2211 \u20AC5 \u21167 \u216B"),
            (std::vector<std::string>{"\u00DCn\u00EFc\u00F6d\u00E9", "\u00A0", "text", "\u3000",
                                      "\u5168\u89D2", " \u03A9", "\u2248", "\u00E7", "\u221A",
                                      " \u2211", " \u20AC", "5", " \u2116", "7", " \u216B"}));
}

TEST(Tokenizer, Gpt2BpeAppliesMergesByRank) {
  TempDir dir;
  // A toy vocabulary in GPT-2's format: "Ġ" encodes the space byte.
  triad::testing::write_text(
      dir.file("vocab.json"),
      R"({"h":0,"e":1,"l":2,"o":3,"Ġ":4,"he":5,"ll":6,"hell":7,"hello":8,"Ġh":9,"w":10})");
  triad::testing::write_text(dir.file("merges.txt"),
                             "#version: 0.2\nh e\nl l\nhe ll\nhell o\nĠ h\n");
  Gpt2BpeTokenizer tok(dir.file("vocab.json"), dir.file("merges.txt"));
  EXPECT_EQ(tok.vocab_size(), 11);
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{8}));
  // " hello": merges by rank give Ġ|he|l|l|o -> Ġ|he|ll|o -> Ġ|hell|o -> Ġ|hello
  // ("Ġ h" ranks last and never applies).
  EXPECT_EQ(tok.encode("hello hello"), (std::vector<int32_t>{8, 4, 8}));
  EXPECT_EQ(tok.decode({8, 9, 1, 6, 3}), "hello hello");
  EXPECT_THROW(tok.encode("z"), ValueError);
  // Among documents encoded by several workers, the first that fails is
  // named, whichever worker met it.
  try {
    tokenize_documents(tok, {"hello", "hello", "z", "hello", "zz"}, -1, 3);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("document 2: tokenizer: symbol 'z'"), std::string::npos)
        << e.what();
  }
  triad::testing::write_text(dir.file("bad.txt"), "nospace\n");
  EXPECT_THROW(Gpt2BpeTokenizer(dir.file("vocab.json"), dir.file("bad.txt")), IoError);
}

}  // namespace
}  // namespace triad::data
