#include "triad/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/data/loss_mask.h"
#include "triad/data/token_dataset.h"
#include "triad/data/token_shard.h"
#include "triad/ops.h"

namespace triad::data {
namespace {

using triad::testing::expect_error;
using triad::testing::TempDir;

// Little-endian bytes, built field by field as Megatron's index writer lays
// them out (independently of write_indexed_dataset).
struct Bytes {
  std::vector<char> b;
  template <class T>
  Bytes& put(T v) {
    char c[sizeof(T)];
    std::memcpy(c, &v, sizeof(T));
    b.insert(b.end(), c, c + sizeof(T));
    return *this;
  }
  Bytes& text(const char* s, size_t n) {
    b.insert(b.end(), s, s + n);
    return *this;
  }
  void write(const std::string& path) const {
    std::ofstream(path, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
  }
};

// An index: dtype code, lengths, byte pointers, document indices.
Bytes index_bytes(uint8_t code, const std::vector<int32_t>& lengths,
                  const std::vector<int64_t>& pointers, const std::vector<int64_t>& docs) {
  Bytes x;
  x.text("MMIDIDX\0\0", 9).put<uint64_t>(1).put<uint8_t>(code);
  x.put<uint64_t>(lengths.size()).put<uint64_t>(docs.size());
  for (int32_t l : lengths) x.put(l);
  for (int64_t p : pointers) x.put(p);
  for (int64_t d : docs) x.put(d);
  return x;
}

std::vector<char> dataset_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(IndexedDataset, ReadsTheMegatronLayout) {
  TempDir dir;
  // Two documents: sequences 0-1 and 2; sequence 1 is empty; uint16 tokens.
  index_bytes(8, {3, 0, 2}, {0, 6, 6}, {0, 2, 3}).write(dir.file("m.idx"));
  Bytes bin;
  for (uint16_t t : {10, 11, 12, 13, 14}) bin.put(t);
  bin.write(dir.file("m.bin"));
  IndexedDataset ds(dir.file("m"));
  EXPECT_EQ(ds.dtype(), IndexedDType::U16);
  EXPECT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.num_tokens(), 5);
  EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{10, 11, 12}));
  EXPECT_TRUE(ds.sequence(1).empty());
  EXPECT_EQ(ds.sequence(2), (std::vector<int64_t>{13, 14}));
  EXPECT_EQ(ds.document(0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(ds.document(1), (std::pair<int64_t, int64_t>{2, 3}));
  EXPECT_THROW(ds.sequence(3), ValueError);
  EXPECT_THROW(ds.document(2), ValueError);
}

TEST(IndexedDataset, TheWriterProducesMegatronsBytes) {
  TempDir dir;
  write_indexed_dataset(dir.file("w"), {{7, -3}, {}, {1 << 20}}, IndexedDType::I32);
  EXPECT_EQ(dataset_file_bytes(dir.file("w.idx")),
            index_bytes(4, {2, 0, 1}, {0, 8, 8}, {0, 1, 2, 3}).b);
  Bytes bin;
  bin.put<int32_t>(7).put<int32_t>(-3).put<int32_t>(1 << 20);
  EXPECT_EQ(dataset_file_bytes(dir.file("w.bin")), bin.b);
  EXPECT_EQ(indexed_dtype_for_vocab(50257), IndexedDType::U16);
  EXPECT_EQ(indexed_dtype_for_vocab(128256), IndexedDType::I32);
}

// The streaming writer: documents added one by one give the same files;
// nothing is left behind by a writer dropped before finish().
TEST(IndexedDataset, TheStreamingWriterAddsDocumentsAsTheyCome) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir.file("s"), IndexedDType::I32);
    w.add({7, -3});
    w.add({});
    w.add({1 << 20});
    EXPECT_EQ(w.documents(), 3);
    EXPECT_EQ(w.tokens(), 3);
    w.finish();
    EXPECT_THROW(w.add({1}), ValueError);
  }
  EXPECT_EQ(dataset_file_bytes(dir.file("s.idx")),
            index_bytes(4, {2, 0, 1}, {0, 8, 8}, {0, 1, 2, 3}).b);
  {
    IndexedDatasetWriter w(dir.file("dropped"), IndexedDType::U16);
    w.add({1, 2});
    EXPECT_TRUE(std::filesystem::exists(dir.file("dropped.bin.tmp")));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.bin.tmp")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.idx")));
}

TEST(IndexedDataset, EveryTokenTypeRoundTripsItsExtremes) {
  TempDir dir;
  auto extremes = [](auto zero) {
    using T = decltype(zero);
    return std::vector<int64_t>{std::numeric_limits<T>::min(), 0, 1, std::numeric_limits<T>::max()};
  };
  const std::vector<std::pair<IndexedDType, std::vector<int64_t>>> cases{
      {IndexedDType::U8, extremes(uint8_t{})},  {IndexedDType::I8, extremes(int8_t{})},
      {IndexedDType::I16, extremes(int16_t{})}, {IndexedDType::U16, extremes(uint16_t{})},
      {IndexedDType::I32, extremes(int32_t{})}, {IndexedDType::I64, extremes(int64_t{})}};
  for (const auto& [dtype, tokens] : cases) {
    const std::string prefix = dir.file(indexed_dtype_name(dtype));
    write_indexed_dataset(prefix, {tokens, {5}}, dtype);
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), dtype);
    EXPECT_EQ(ds.sequence(0), tokens) << indexed_dtype_name(dtype);
    EXPECT_EQ(ds.sequence(1), std::vector<int64_t>{5});
    EXPECT_EQ(ds.num_tokens(), 5);
    if (dtype != IndexedDType::I64) {
      try {
        write_indexed_dataset(prefix + "_bad", {{1}, {2, tokens.back() + 1}}, dtype);
        FAIL() << "expected ValueError";
      } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("token " + std::to_string(tokens.back() + 1) +
                                             " (document 1, position 1) does not fit " +
                                             indexed_dtype_name(dtype)),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

void expect_open_error(const std::string& prefix, const std::string& fragment) {
  try {
    IndexedDataset ds(prefix);
    FAIL() << "expected IoError with '" << fragment << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(prefix), std::string::npos) << e.what();
  }
}

TEST(IndexedDataset, DamagedFilesAreErrorsNamingTheFileAndValue) {
  TempDir dir;
  const std::string p = dir.file("d");
  Bytes bin;
  for (uint16_t t : {1, 2, 3, 4}) bin.put(t);
  bin.write(p + ".bin");
  auto with_index = [&](const Bytes& idx, const std::string& fragment) {
    idx.write(p + ".idx");
    expect_open_error(p, fragment);
  };
  Bytes wrong_magic;
  wrong_magic.text("MMIDIDY\0\0", 9)
      .put<uint64_t>(1)
      .put<uint8_t>(8)
      .put<uint64_t>(0)
      .put<uint64_t>(1);
  wrong_magic.put<int64_t>(0);
  with_index(wrong_magic, "not a Megatron index");
  Bytes v2 = index_bytes(8, {4}, {0}, {0, 1});
  v2.b[9] = 2;
  with_index(v2, "index version 2, expected 1");
  with_index(index_bytes(7, {4}, {0}, {0, 1}), "dtype code 7 (floating point) holds no tokens");
  with_index(index_bytes(9, {4}, {0}, {0, 1}), "dtype code 9 is not one of Megatron's");
  Bytes truncated = index_bytes(8, {4}, {0}, {0, 1});
  truncated.b.pop_back();
  with_index(truncated, "1 sequences and 2 document indices make 62");
  Bytes modes = index_bytes(8, {4}, {0}, {0, 1});
  modes.put<int8_t>(0);
  with_index(modes, "multimodal index's modes");
  with_index(index_bytes(8, {3}, {4}, {0, 1}),
             "sequence 0 (3 uint16 tokens at byte 4) lies outside");
  with_index(index_bytes(8, {-1}, {0}, {0, 1}), "sequence 0 (-1 uint16 tokens");
  with_index(index_bytes(8, {2, 2}, {0, 4}, {1, 2}), "document index 0 is 1");
  with_index(index_bytes(8, {2, 2}, {0, 4}, {0, 1}), "document index 1 is 1");
  with_index(index_bytes(8, {2, 2}, {0, 4}, {0, 2, 1, 2}), "document index 2 is 1");
  Bytes huge;
  huge.text("MMIDIDX\0\0", 9).put<uint64_t>(1).put<uint8_t>(8).put<uint64_t>(uint64_t{1} << 62);
  huge.put<uint64_t>(1);
  with_index(huge, "cannot fit in");
  with_index(Bytes{}.text("MMIDIDX", 7), "shorter than the 34-byte header");
  std::filesystem::remove(p + ".bin");
  index_bytes(8, {4}, {0}, {0, 1}).write(p + ".idx");
  try {
    IndexedDataset ds(p);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(p + ".bin': cannot open"), std::string::npos) << e.what();
  }
}

TEST(TokenDataset, ReadsMegatronDatasetsAndShardsAsOneStream) {
  TempDir dir;
  // Stream: shard a (0..9), then Megatron m (int32 tokens 10..29 in three
  // sequences, the last stored before the others: two runs in the .bin).
  std::vector<uint16_t> a;
  for (uint16_t i = 0; i < 10; ++i) a.push_back(i);
  write_token_shard(dir.file("a.bin"), a);
  Bytes bin;
  for (int32_t t = 25; t < 30; ++t) bin.put(t);  // sequence 2, at byte 0
  for (int32_t t = 10; t < 25; ++t) bin.put(t);  // sequences 0 and 1, at byte 20
  bin.write(dir.file("m.bin"));
  index_bytes(4, {7, 8, 5}, {20, 48, 0}, {0, 2, 3}).write(dir.file("m.idx"));
  // The glob names m twice (.bin and .idx) and a once; a prefix names m alone.
  EXPECT_EQ(expand_data_paths(dir.file("*")),
            (std::vector<std::string>{dir.file("a.bin"), dir.file("m")}));
  EXPECT_EQ(expand_data_paths(dir.file("m")), std::vector<std::string>{dir.file("m")});
  EXPECT_EQ(expand_data_paths(dir.file("m.idx")), std::vector<std::string>{dir.file("m")});
  try {
    expand_data_paths(dir.file("none_*"), "data.val");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("data.val '" + dir.file("none_*") + "' matches no file"),
              std::string::npos)
        << e.what();
  }
  TokenDataset ds(expand_data_paths(dir.file("*")), 4, 30);
  EXPECT_EQ(ds.num_tokens(), 30);
  EXPECT_EQ(ds.num_sequences(), 7);
  // Every sequence is the stream 0, 1, 2, ... cut at q*T, across every boundary.
  for (int64_t q = 0; q < 7; ++q) {
    Batch b = ds.batch(q, 1, 0, 1);
    auto in = to_double_vector(b.inputs), tg = to_double_vector(b.targets);
    for (int64_t t = 0; t < 4; ++t) {
      EXPECT_EQ(in[t], q * 4 + t) << "sequence " << q;
      EXPECT_EQ(tg[t], q * 4 + t + 1) << "sequence " << q;
    }
  }
  // Tokens outside [0, vocab) are found once, up front, in any run.
  try {
    TokenDataset small(expand_data_paths(dir.file("*")), 4, 28);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + dir.file("m.bin") +
                                         "': token 28 at position 3 is not in [0, vocab_size 28)"),
              std::string::npos)
        << e.what();
  }
  write_indexed_dataset(dir.file("neg"), {{1, 2, 3}, {4, -5}}, IndexedDType::I16);
  try {
    TokenDataset negative({dir.file("neg")}, 2, 100);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("token -5 at position 4"), std::string::npos) << e.what();
  }
}

// The up-front vocabulary check in every token type, with the bad token
// past the first block of 4096 that the check scans at once.
TEST(TokenDataset, TokensOutsideTheVocabularyAreFoundInEveryType) {
  TempDir dir;
  const std::pair<IndexedDType, int64_t> cases[] = {
      {IndexedDType::U8, 200},     {IndexedDType::I8, -3},
      {IndexedDType::U16, 60000},  {IndexedDType::I16, -30000},
      {IndexedDType::I32, 100000}, {IndexedDType::I64, int64_t{1} << 40}};
  for (const auto& [dtype, bad] : cases) {
    std::vector<int64_t> tokens(5000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i % 100);
    const std::string prefix = dir.file(std::string("bad_") + indexed_dtype_name(dtype));
    // The dataset without the bad token reads; with it, the error names it.
    write_indexed_dataset(prefix + "_ok", {tokens}, dtype);
    EXPECT_EQ(TokenDataset({prefix + "_ok"}, 16, 100).num_tokens(), 5000)
        << indexed_dtype_name(dtype);
    tokens[4500] = bad;
    write_indexed_dataset(prefix, {tokens}, dtype);
    try {
      TokenDataset ds({prefix}, 16, 100);
      ADD_FAILURE() << indexed_dtype_name(dtype) << ": the bad token was not found";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("token " + std::to_string(bad) + " at position 4500"),
                std::string::npos)
          << e.what();
    }
  }
}

// The processes of a job each check their part of the stream (TokenCheck):
// a part reports the first bad token inside it and raises nothing, every
// token lies in exactly one part, so the least report over the parts is the
// stream's first bad token, and its error reads as one process's.
TEST(TokenDataset, EachProcessChecksItsPartAndTheLeastFindIsTheFirstBadToken) {
  TempDir dir;
  // The stream: shard a (40 tokens), Megatron dataset m (sequences of 30, 25
  // and 5) with a loss mask, shard b (50): 150 tokens, three above the
  // vocabulary of 50 and one mask byte that is not 0 or 1.
  std::vector<uint16_t> a(40), b(50);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i % 20);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(i % 20 + 1);
  std::vector<std::vector<int64_t>> m = {std::vector<int64_t>(30, 3), std::vector<int64_t>(25, 4),
                                         std::vector<int64_t>(5, 5)};
  a[7] = 90;
  m[1][4] = 95;  // stream 40 + 30 + 4, position 34 of m.bin
  b[33] = 99;    // stream 40 + 60 + 33
  write_token_shard(dir.file("a.bin"), a);
  write_indexed_dataset(dir.file("m"), m, IndexedDType::I32);
  write_token_shard(dir.file("b.bin"), b);
  std::vector<uint8_t> keep(60);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = i % 3 != 0;  // 40 of 60 scored
  auto write_mask = [&](const std::vector<uint8_t>& bytes) {
    Bytes f;
    f.text("TRIADLM", 8).put<uint64_t>(1).put<uint64_t>(bytes.size());
    for (const uint8_t x : bytes) f.put(x);
    f.write(dir.file("m.loss_mask"));
  };
  std::vector<uint8_t> broken = keep;
  broken[50] = 7;  // stream 40 + 50
  write_mask(broken);
  const std::vector<std::string> sources{dir.file("a.bin"), dir.file("m"), dir.file("b.bin")};
  const int64_t bad[] = {7, 74, 90, 133};
  std::string whole;
  try {
    TokenDataset one(sources, 4, 50);
    FAIL() << "one process checks every token";
  } catch (const IoError& e) {
    whole = e.what();
  }
  EXPECT_NE(whole.find("'" + dir.file("a.bin") + "': token 90 at position 7 is not in [0, " +
                       "vocab_size 50)"),
            std::string::npos)
      << whole;
  for (int64_t count = 2; count <= 9; ++count) {
    int64_t least = -1;
    for (int64_t index = 0; index < count; ++index) {
      TokenDataset part(sources, 4, 50, {}, {index, count});
      // The first bad position between this part's bounds, or none.
      const int64_t lo = 150 * index / count, hi = 150 * (index + 1) / count;
      int64_t expected = -1;
      for (const int64_t p : bad) {
        if (p >= lo && p < hi && expected < 0) expected = p;
      }
      const int64_t found = part.part_check().first_bad;
      EXPECT_EQ(found, expected) << "part " << index << " of " << count;
      if (found >= 0 && (least < 0 || found < least)) least = found;
    }
    EXPECT_EQ(least, 7) << count << " parts";
  }
  // Any process names any bad position as one process would.
  auto message = [&](int64_t position) {
    TokenDataset part(sources, 4, 50, {}, {1, 2});
    try {
      part.accept_check({position, 0});
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("(nothing raised)");
  };
  EXPECT_EQ(message(7), whole);
  EXPECT_NE(message(74).find("'" + dir.file("m.bin") + "': token 95 at position 34 is not"),
            std::string::npos)
      << message(74);
  EXPECT_NE(message(90).find("loss mask '" + dir.file("m.loss_mask") +
                             "': byte 7 at token 50 (expected 0: no loss, or 1: loss)"),
            std::string::npos)
      << message(90);
  EXPECT_NE(message(133).find("'" + dir.file("b.bin") + "': token 99 at position 33 is not"),
            std::string::npos)
      << message(133);
  {
    TokenDataset part(sources, 4, 50, {}, {1, 2});
    EXPECT_THROW(part.accept_check({150, 0}), ValueError);
    EXPECT_THROW(part.accept_check({8, 0}), ValueError);  // nothing wrong there
  }
  for (const TokenCheck wrong : {TokenCheck{2, 2}, TokenCheck{-1, 2}, TokenCheck{0, 0}}) {
    EXPECT_THROW(TokenDataset(sources, 4, 50, {}, wrong), ValueError);
  }
  // With the mask's bad byte alone, one process names it.
  try {
    TokenDataset one(sources, 4, 100);
    FAIL() << "one process checks every mask byte";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("byte 7 at token 50"), std::string::npos) << e.what();
  }
  // Whole-document rows read every token of a shard for its document ends,
  // and check them in that pass: every part finds shard a's bad token.
  for (int64_t index = 0; index < 3; ++index) {
    TokenDataset bad_rows(sources, 8, 50, {true, 0}, {index, 3});
    EXPECT_EQ(bad_rows.part_check().first_bad, 7) << "part " << index;
  }
  try {
    TokenDataset one_rows(sources, 8, 50, {true, 0});
    FAIL() << "one process checks every token of whole-document rows";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()), whole);
  }
  // Clean data: the parts' targets with loss add up to one process's count
  // (40 + 40 + 50), which accept_check makes every process's.
  write_mask(keep);
  EXPECT_EQ(TokenDataset(sources, 4, 100).loss_tokens(), 130);
  for (int64_t count = 2; count <= 9; ++count) {
    int64_t sum = 0;
    for (int64_t index = 0; index < count; ++index) {
      TokenDataset part(sources, 4, 100, {}, {index, count});
      EXPECT_EQ(part.part_check().first_bad, -1);
      sum += part.part_check().loss_tokens;
    }
    EXPECT_EQ(sum, 130) << count << " parts";
    TokenDataset part(sources, 4, 100, {}, {count - 1, count});
    part.accept_check({-1, sum});
    EXPECT_EQ(part.loss_tokens(), 130);
  }
}

// Every token (and mask byte) of a dataset, in stream order: with seq_len 1
// sequence q is tokens q and q + 1.
std::pair<std::vector<int64_t>, std::vector<uint8_t>> stream_of(const TokenDataset& d) {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> keep;
  int64_t pair[2];
  uint8_t mask[2];
  for (int64_t q = 0; q < d.num_sequences(); ++q) {
    d.read_sequence(q, pair, mask);
    tokens.push_back(pair[0]);
    keep.push_back(mask[0]);
  }
  tokens.push_back(pair[1]);
  keep.push_back(mask[1]);
  return {tokens, keep};
}

// data.val_split's two slices of a stream: training reads the first
// floor(f · N) tokens, validation the rest, with their mask bytes; with
// whole documents the cut moves to the next document start. Each slice's
// check sees its own tokens only, in its own positions.
TEST(TokenDataset, TwoSlicesSplitTheStreamWithoutSharingATokenOrADocument) {
  TempDir dir;
  // a: 40 tokens, end-of-document 0 at 0 and 20; m: documents of 30, 25 and
  // 5 tokens with a mask; b: one document of 50 tokens, 99 at its 33rd.
  std::vector<uint16_t> a(40), b(50);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i % 20);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(i % 20 + 1);
  b[33] = 99;
  write_token_shard(dir.file("a.bin"), a);
  write_indexed_dataset(
      dir.file("m"),
      {std::vector<int64_t>(30, 3), std::vector<int64_t>(25, 4), std::vector<int64_t>(5, 5)},
      IndexedDType::I32);
  write_token_shard(dir.file("b.bin"), b);
  {
    LossMaskWriter w(loss_mask_path(dir.file("m")));
    std::vector<uint8_t> keep(60);
    for (size_t i = 0; i < keep.size(); ++i) keep[i] = i % 3 != 0;
    w.add(keep);
    w.finish();
  }
  const std::vector<std::string> sources{dir.file("a.bin"), dir.file("m"), dir.file("b.bin")};
  const TokenDataset whole(sources, 1, 100);
  const TokenDataset train(sources, 1, 100, {}, {}, {0, 0.7});
  const TokenDataset val(sources, 1, 100, {}, {}, {0.7, 1});
  EXPECT_EQ(train.num_tokens(), 105);
  EXPECT_EQ(val.num_tokens(), 45);
  EXPECT_EQ(train.loss_tokens() + val.loss_tokens(), whole.loss_tokens());
  auto [all, all_keep] = stream_of(whole);
  auto [first, first_keep] = stream_of(train);
  auto [rest, rest_keep] = stream_of(val);
  first.insert(first.end(), rest.begin(), rest.end());
  first_keep.insert(first_keep.end(), rest_keep.begin(), rest_keep.end());
  EXPECT_EQ(first, all);
  EXPECT_EQ(first_keep, all_keep);
  // b's 99 lies in the validation slice: only its check finds it, at its
  // own position 133 - 105 and b's position 33.
  EXPECT_NO_THROW(TokenDataset(sources, 1, 50, {}, {}, {0, 0.7}));
  expect_error(
      [&] {
        TokenDataset(sources, 1, 50, {}, {}, {0.7, 1});
      },
      {"'" + dir.file("b.bin") + "': token 99 at position 33 is not in [0, vocab_size 50)"});
  int64_t least = -1;
  for (int64_t index = 0; index < 3; ++index) {
    const int64_t found =
        TokenDataset(sources, 1, 50, {}, {index, 3}, {0.7, 1}).part_check().first_bad;
    if (found >= 0) least = least < 0 ? found : std::min(least, found);
  }
  EXPECT_EQ(least, 28);
  // Whole documents (rows of 64): the documents start at 0, 1, 21, 40, 70,
  // 95 and 100, so the cut at 75 moves to 95.
  const TokenDataset doc_train(sources, 63, 100, {true, 0}, {}, {0, 0.5});
  const TokenDataset doc_val(sources, 63, 100, {true, 0}, {}, {0.5, 1});
  EXPECT_EQ(doc_train.num_tokens(), 95);
  EXPECT_EQ(doc_val.num_tokens(), 55);
  int64_t row[64];
  doc_val.read_sequence(0, row);
  EXPECT_EQ(row[0], 5);  // m's last document
  EXPECT_EQ(row[5], 1);  // then b's
  EXPECT_EQ(row[5 + 33], 99);
  for (const StreamSlice wrong : {StreamSlice{0.5, 0.5}, StreamSlice{-0.1, 1}, StreamSlice{0, 1.5}})
    EXPECT_THROW(TokenDataset(sources, 1, 100, {}, {}, wrong), ValueError);
}

}  // namespace
}  // namespace triad::data
