#include "triad/data/loss_mask.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/core/error.h"
#include "triad/data/blended_dataset.h"
#include "triad/data/chat_template.h"
#include "triad/data/indexed_dataset.h"
#include "triad/data/token_dataset.h"
#include "triad/data/token_shard.h"
#include "triad/data/tokenizer.h"
#include "triad/ops.h"

namespace triad::data {
namespace {

using triad::testing::expect_error;
using triad::testing::TempDir;

std::vector<uint8_t> mask_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A mask file's bytes, laid out field by field (independently of the writer).
std::vector<uint8_t> mask_bytes(const char* magic, uint64_t version, uint64_t count,
                                const std::vector<uint8_t>& keep) {
  std::vector<uint8_t> b(24 + keep.size());
  std::memcpy(b.data(), magic, 8);
  std::memcpy(b.data() + 8, &version, 8);
  std::memcpy(b.data() + 16, &count, 8);
  for (size_t i = 0; i < keep.size(); ++i) b[24 + i] = keep[i];
  return b;
}

// The writer streams documents' bytes after a header whose count it fills
// in at the end; the reader counts the ones. A value other than 0 and 1 is
// named with its document and position, and a writer dropped before
// finish() leaves no file.
TEST(LossMask, TheWriterLaysOutTheFormatAndTheReaderCountsTheScoredTokens) {
  TempDir dir;
  const std::string path = dir.file("d.loss_mask");
  {
    LossMaskWriter w(path);
    w.add({0, 0, 1});
    w.add({});
    w.add({1, 1, 0, 1});
    EXPECT_FALSE(std::filesystem::exists(path)) << "written under a temporary name until finish()";
    w.finish();
    EXPECT_EQ(w.tokens(), 7);
  }
  EXPECT_EQ(mask_file_bytes(path), mask_bytes("TRIADLM", 1, 7, {0, 0, 1, 1, 1, 0, 1}));
  LossMask m(path, 7);
  EXPECT_EQ(m.size(), 7);
  EXPECT_EQ(m.kept(), 4);
  EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + 7),
            (std::vector<uint8_t>{0, 0, 1, 1, 1, 0, 1}));
  {
    LossMaskWriter w(dir.file("bad.loss_mask"));
    w.add({1});
    expect_error([&] { w.add({0, 1, 2}); }, {"value 2 (document 1, position 2) is not 0 or 1"});
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad.loss_mask")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad.loss_mask.tmp")));
  EXPECT_TRUE(is_loss_mask_path(path));
  EXPECT_FALSE(is_loss_mask_path(dir.file("d.bin")));
  EXPECT_EQ(loss_mask_path("data/sft"), "data/sft.loss_mask");
}

TEST(LossMask, DamagedFilesAreErrorsNamingTheFileAndTheValue) {
  TempDir dir;
  const std::string path = dir.file("m.loss_mask");
  auto opening = [&](const std::vector<uint8_t>& bytes, int64_t expected) {
    triad::testing::write_bytes(path, bytes);
    return [&path, expected] { LossMask m(path, expected); };
  };
  const std::vector<uint8_t> keep{1, 0, 1};
  expect_error(opening(mask_bytes("TRIADLX", 1, 3, keep), 3), {path, "not a loss mask"});
  expect_error(opening({}, 3), {path, "the file has 0 bytes"});
  expect_error(opening(mask_bytes("TRIADLM", 2, 3, keep), 3), {path, "version 2 (expected 1)"});
  expect_error(opening(mask_bytes("TRIADLM", 1, 4, keep), 4),
               {path, "the header counts 4 tokens but 3 bytes follow it"});
  expect_error(opening(mask_bytes("TRIADLM", 1, 3, keep), 5),
               {path, "covers 3 tokens, but its dataset holds 5"});
  expect_error(opening(mask_bytes("TRIADLM", 1, 3, {1, 1, 7}), 3),
               {path, "byte 7 at token 2 (expected 0: no loss, or 1: loss)"});
  expect_error([&] { LossMask m(dir.file("none.loss_mask"), 1); }, {"none.loss_mask"});
}

// A stream of an llm.c shard with a mask, a Megatron dataset with a mask
// whose sequences lie out of order in its .bin, and a shard without one:
// every target is its token, or -100 where the token's mask byte is 0,
// across every boundary; a mixture of the dataset alone reads the same.
TEST(LossMask, TheDatasetIgnoresExactlyTheTargetsItsMasksClear) {
  TempDir dir;
  std::vector<uint16_t> a;
  std::vector<uint8_t> a_keep;
  for (uint16_t i = 0; i < 10; ++i) {
    a.push_back(i);
    a_keep.push_back(i % 3 != 0);
  }
  write_token_shard(dir.file("a.bin"), a);
  write_loss_mask(loss_mask_path(dir.file("a.bin")), a_keep);
  // m: tokens 10..29 in index order, as three sequences; sequence 2 is
  // stored first in the .bin (two runs). Its mask is in index order.
  {
    std::ofstream bin(dir.file("m.bin"), std::ios::binary);
    auto put = [&](int32_t t) { bin.write(reinterpret_cast<const char*>(&t), 4); };
    for (int32_t t = 25; t < 30; ++t) put(t);
    for (int32_t t = 10; t < 25; ++t) put(t);
  }
  {
    // The index, as indexed_dataset_test.cpp lays it out: int32 lengths
    // 7, 8, 5 at byte pointers 20, 48, 0; documents 0, 2, 3.
    std::ofstream idx(dir.file("m.idx"), std::ios::binary);
    auto put = [&](auto v) { idx.write(reinterpret_cast<const char*>(&v), sizeof(v)); };
    idx.write("MMIDIDX\0\0", 9);
    put(uint64_t{1});
    put(uint8_t{4});
    put(uint64_t{3});
    put(uint64_t{3});
    for (int32_t l : {7, 8, 5}) put(l);
    for (int64_t p : {20, 48, 0}) put(p);
    for (int64_t d : {0, 2, 3}) put(d);
  }
  std::vector<uint8_t> m_keep;
  for (int t = 10; t < 30; ++t) m_keep.push_back(t % 4 != 1);
  write_loss_mask(loss_mask_path(dir.file("m")), m_keep);
  std::vector<uint16_t> z;
  for (uint16_t i = 30; i < 38; ++i) z.push_back(i);
  write_token_shard(dir.file("z.bin"), z);
  auto keeps = [&](int64_t token) {
    if (token < 10) return token % 3 != 0;
    if (token < 30) return token % 4 != 1;
    return true;
  };
  // The glob matches the masks too; they are not token data.
  const auto sources = expand_data_paths(dir.file("*"));
  ASSERT_EQ(sources,
            (std::vector<std::string>{dir.file("a.bin"), dir.file("m"), dir.file("z.bin")}));
  TokenDataset ds(sources, 4, 40);
  EXPECT_EQ(ds.masked_sources(), 2);
  int64_t scored = 0;
  for (int64_t t = 0; t < 38; ++t) scored += keeps(t);
  EXPECT_EQ(ds.loss_tokens(), scored);
  ASSERT_EQ(ds.num_sequences(), 9);
  Batch all = ds.sequences(0, 9);
  auto in = to_double_vector(all.inputs), tg = to_double_vector(all.targets);
  int64_t ignored = 0;
  for (int64_t q = 0; q < 9; ++q) {
    for (int64_t t = 0; t < 4; ++t) {
      const int64_t next = q * 4 + t + 1;
      EXPECT_EQ(in[static_cast<size_t>(q * 4 + t)], q * 4 + t);
      EXPECT_EQ(tg[static_cast<size_t>(q * 4 + t)], keeps(next) ? next : -100)
          << "sequence " << q << " target " << t;
      ignored += !keeps(next);
    }
  }
  EXPECT_GT(ignored, 5);
  std::vector<int64_t> tokens(5);
  std::vector<uint8_t> keep(5);
  ds.read_sequence(2, tokens.data(), keep.data());  // tokens 8..12, across a and m
  EXPECT_EQ(keep, (std::vector<uint8_t>{1, 0, 1, 1, 1}));
  BlendedDataset mixture({{sources, 1.0, "all"}}, 4, 40);
  Batch same = mixture.sequences(0, 9);
  EXPECT_EQ(to_double_vector(same.targets), tg);
  // A mask of other data (one token short) is refused by name.
  write_loss_mask(loss_mask_path(dir.file("a.bin")), std::vector<uint8_t>(9, 1));
  expect_error([&] { TokenDataset bad(sources, 4, 40); },
               {"a.bin.loss_mask' covers 9 tokens, but its dataset holds 10"});
  // Naming a mask as data.
  const std::string named = dir.file("m.loss_mask");
  std::string dataset = dir.file("m");
  dataset += "' for '";
  expect_error([&] { expand_data_paths(named, "data.val"); },
               {named + "' matches only loss masks", dataset + named});
}

// triad-tokenize --prompt-key: JSON lines as prompt/response pairs, encoded
// apart and joined, the prompt (and bos) unscored, the response and eod
// scored.
TEST(LossMask, PromptResponsePairsAreDocumentsWithTheirPromptsMasked) {
  std::istringstream in(
      "{\"q\": \"ab\", \"a\": \"c\"}\n\n{\"a\": \"\", \"q\": \"d\"}\n{\"q\": \"e\", \"a\": "
      "\"fg\"}\n");
  DocumentReader reader(in, DocumentSplit::JsonLines, "a", {"q", std::nullopt});
  std::vector<SegmentedDocument> docs_in;
  EXPECT_TRUE(reader.next(docs_in, 1));
  EXPECT_EQ(docs_in.size(), 1u) << "a batch ends once max_bytes of text are read";
  while (reader.next(docs_in, 1 << 20)) {
  }
  ASSERT_EQ(docs_in.size(), 3u);
  EXPECT_EQ(docs_in[1][0].text, "d");
  EXPECT_FALSE(docs_in[1][0].scored);
  EXPECT_EQ(docs_in[1][1].text, "");
  EXPECT_TRUE(docs_in[1][1].scored);
  const auto tok = make_tokenizer("", "", "");  // bytes
  const MaskedDocuments docs = tokenize_segmented(*tok, docs_in, 0, true, 2, 0, 1);
  ASSERT_EQ(docs.tokens.size(), 3u);
  EXPECT_EQ(docs.tokens[0], (std::vector<int64_t>{1, 'a', 'b', 'c', 0}));
  EXPECT_EQ(docs.keep[0], (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(docs.tokens[1], (std::vector<int64_t>{1, 'd', 0}));
  EXPECT_EQ(docs.keep[1], (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(docs.keep[2], (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  // An unscored end token; a special piece the byte tokenizer lacks.
  EXPECT_EQ(tokenize_segmented(*tok, {docs_in[0]}, 0, false).keep[0],
            (std::vector<uint8_t>{0, 0, 1, 0}));
  expect_error(
      [&] {
        tokenize_segmented(*tok, {{{"<|im_end|>", true, true}}}, -1, false, 1, 7);
      },
      {"document 7: '<|im_end|>' is not a special token of the tokenizer"});
  // A line without its prompt, a prompt key without JSON lines, one key
  // for both, and asking for the other kind of document.
  std::istringstream missing("{\"a\": \"x\", \"q\": \"y\"}\n{\"a\": \"x\"}\n");
  DocumentReader r2(missing, DocumentSplit::JsonLines, "a", {"q", std::nullopt});
  expect_error([&] { r2.next(docs_in, 1 << 20); },
               {"JSON line 2 has no string \"q\" (--prompt-key names the field)"});
  std::istringstream text("x\n");
  expect_error(
      [&] {
        DocumentReader r(text, DocumentSplit::Lines, "a", {"q", std::nullopt});
      },
      {"a prompt key ('q') needs JSON lines"});
  expect_error(
      [&] {
        DocumentReader r(text, DocumentSplit::JsonLines, "q", {"q", std::nullopt});
      },
      {"the prompt key and the response's key are both 'q'"});
  expect_error(
      [&] {
        DocumentReader r(text, DocumentSplit::JsonLines, "a", {"q", ChatTemplate::ChatML});
      },
      {"not both"});
  DocumentReader r3(text, DocumentSplit::JsonLines, "a", {"q", std::nullopt});
  std::vector<std::string> plain;
  expect_error([&] { r3.next(plain, 1); }, {"this reader labels its documents"});
  DocumentReader r4(text, DocumentSplit::Lines);
  expect_error([&] { r4.next(docs_in, 1); }, {"this reader has no labels"});
}

}  // namespace
}  // namespace triad::data
