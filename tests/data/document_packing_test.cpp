// data.packing: documents — rows of whole documents, padded.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "support/temp_dir.h"
#include "triad/core/error.h"
#include "triad/data/blended_dataset.h"
#include "triad/data/loss_mask.h"
#include "triad/data/token_dataset.h"
#include "triad/data/token_shard.h"
#include "triad/ops.h"

namespace triad::data {
namespace {

using triad::testing::TempDir;

// A Megatron dataset of int32 tokens whose documents are groups of
// sequences (`docs[d]` the lengths of document d's sequences), laid out by
// hand; token k of the stream is k + 10.
void write_grouped_dataset(const std::string& prefix,
                           const std::vector<std::vector<int32_t>>& docs) {
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_index{0};
  int64_t tokens = 0;
  for (const auto& d : docs) {
    for (int32_t l : d) {
      lengths.push_back(l);
      pointers.push_back(4 * tokens);
      tokens += l;
    }
    doc_index.push_back(static_cast<int64_t>(lengths.size()));
  }
  std::ofstream bin(prefix + ".bin", std::ios::binary);
  for (int32_t t = 0; t < tokens; ++t) {
    const int32_t v = t + 10;
    bin.write(reinterpret_cast<const char*>(&v), 4);
  }
  std::ofstream idx(prefix + ".idx", std::ios::binary);
  auto put = [&](auto v) { idx.write(reinterpret_cast<const char*>(&v), sizeof(v)); };
  idx.write("MMIDIDX\0\0", 9);
  put(uint64_t{1});
  put(uint8_t{4});
  put(static_cast<uint64_t>(lengths.size()));
  put(static_cast<uint64_t>(doc_index.size()));
  for (int32_t l : lengths) put(l);
  for (int64_t p : pointers) put(p);
  for (int64_t d : doc_index) put(d);
}

// Rows of seq_len + 1 = 6: documents of 3, 4, 2, 12 (two sequences, 7 and
// 5), 1 and 5 tokens pack into [0,3) | [3,9) | [9,15) [14,20) (the long
// one, each row starting at the last token of the one before) | [19,22)
// (its tail and the 1) | [22,27); every row's remainder is the pad token,
// never a target, and so is every token the loss mask clears.
TEST(DocumentPacking, RowsHoldWholeDocumentsAndPadTheRest) {
  TempDir dir;
  const std::string prefix = dir.file("docs");
  write_grouped_dataset(prefix, {{3}, {4}, {2}, {7, 5}, {1}, {5}});
  std::vector<uint8_t> keep;
  for (int k = 0; k < 27; ++k) keep.push_back(k % 4 != 0);
  write_loss_mask(loss_mask_path(prefix), keep);
  const int64_t pad = 1;
  TokenDataset ds({prefix}, 5, 50, {true, pad});
  const std::vector<std::pair<int64_t, int64_t>> rows{{0, 3},  {3, 6},  {9, 6},
                                                      {14, 6}, {19, 3}, {22, 5}};
  ASSERT_EQ(ds.num_sequences(), 6);
  EXPECT_EQ(ds.long_documents(), 1);
  EXPECT_EQ(ds.padding_tokens(), 6 * 6 - (3 + 6 + 6 + 6 + 3 + 5));
  const Batch b = ds.sequences(0, 6);
  const auto in = to_double_vector(b.inputs), tg = to_double_vector(b.targets);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto [start, length] = rows[r];
    for (int64_t t = 0; t < 6; ++t) {
      // Row token t is stream token start + t while t < length, a pad after.
      const bool real = t < length;
      const int64_t token = real ? start + t + 10 : pad;
      if (t < 5) {
        EXPECT_EQ(in[r * 5 + static_cast<size_t>(t)], token) << "row " << r << " input " << t;
      }
      if (t > 0) {
        const bool scored = real && keep[static_cast<size_t>(start + t)];
        EXPECT_EQ(tg[r * 5 + static_cast<size_t>(t - 1)], scored ? token : -100)
            << "row " << r << " target " << t - 1;
      }
    }
  }
  // The same rows through a mixture of the one dataset, and shuffled: each
  // row once per pass.
  BlendedDataset mixture({{{prefix}, 1.0, "docs"}}, 5, 50, {true, pad});
  EXPECT_EQ(to_double_vector(mixture.sequences(0, 6).targets), tg);
  ds.shuffle(7);
  const auto shuffled = to_double_vector(ds.sequences(6, 6).inputs);
  std::vector<double> first_tokens, want;
  for (size_t r = 0; r < 6; ++r) {
    first_tokens.push_back(shuffled[r * 5]);
    want.push_back(static_cast<double>(rows[r].first + 10));
  }
  std::sort(first_tokens.begin(), first_tokens.end());
  EXPECT_EQ(first_tokens, want);
  // A pad token outside the vocabulary.
  EXPECT_THROW(TokenDataset({prefix}, 5, 50, {true, 50}), ValueError);
  EXPECT_THROW(TokenDataset({prefix}, 5, 50, {true, -1}), ValueError);
}

// data.long_documents: the 12-token document of the layout above truncated
// to its first row, or dropped; either way the row being filled ends there
// and the documents after it pack on.
TEST(DocumentPacking, LongDocumentsAreTruncatedOrDroppedWhenAsked) {
  TempDir dir;
  const std::string prefix = dir.file("docs");
  write_grouped_dataset(prefix, {{3}, {4}, {2}, {7, 5}, {1}, {5}});
  // Each row as (its first stream token, its length).
  auto rows = [&](LongDocuments policy) {
    TokenDataset ds({prefix}, 5, 50, {true, 1, policy});
    EXPECT_EQ(ds.long_documents(), 1);
    const Batch b = ds.sequences(0, ds.num_sequences());
    const auto in = to_double_vector(b.inputs), tg = to_double_vector(b.targets);
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t r = 0; r < ds.num_sequences(); ++r) {
      int64_t targets = 0;
      for (int64_t t = 0; t < 5; ++t) targets += tg[static_cast<size_t>(r * 5 + t)] != -100;
      out.emplace_back(static_cast<int64_t>(in[static_cast<size_t>(r * 5)]) - 10, targets + 1);
    }
    return out;
  };
  using Rows = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(rows(LongDocuments::Truncate), (Rows{{0, 3}, {3, 6}, {9, 6}, {21, 6}}));
  EXPECT_EQ(rows(LongDocuments::Drop), (Rows{{0, 3}, {3, 6}, {21, 6}}));
  EXPECT_EQ(rows(LongDocuments::Split), (Rows{{0, 3}, {3, 6}, {9, 6}, {14, 6}, {19, 3}, {22, 5}}));
  EXPECT_EQ(long_documents_from_string("drop"), LongDocuments::Drop);
  EXPECT_THROW(long_documents_from_string("cut"), ValueError);
}

// data.packing: best_fit. Documents of 5, 2, 4, 3, 1, 6 and 3 tokens in
// rows of 6 take 5 rows in order (5 | 2 4 | 3 1 | 6 | 3: 6 pads); best fit
// decreasing places 6 | 5 1 | 4 2 | 3 3: 4 full rows, every document whole
// and its tokens in their order, each row's pieces longest first.
TEST(DocumentPacking, BestFitFillsRowsWithWholeDocumentsOutOfOrder) {
  TempDir dir;
  const std::string prefix = dir.file("docs");
  const std::vector<int32_t> lengths{5, 2, 4, 3, 1, 6, 3};
  std::vector<std::vector<int32_t>> docs;
  for (int32_t l : lengths) docs.push_back({l});
  write_grouped_dataset(prefix, docs);
  std::vector<uint8_t> keep;
  for (int k = 0; k < 24; ++k) keep.push_back(k % 3 != 1);
  write_loss_mask(loss_mask_path(prefix), keep);
  TokenDataset in_order({prefix}, 5, 50, {true, 1});
  EXPECT_EQ(in_order.num_sequences(), 5);
  EXPECT_EQ(in_order.padding_tokens(), 5 * 6 - 24);
  TokenDataset fit({prefix}, 5, 50, {true, 1, LongDocuments::Split, true});
  ASSERT_EQ(fit.num_sequences(), 4);
  EXPECT_EQ(fit.padding_tokens(), 0);
  // Document starts in the stream: 0, 5, 7, 11, 14, 15, 21. Rows:
  // [15..21) | [0..5) [14] | [7..11) [5..7) | [11..14) [21..24).
  const std::vector<std::vector<int64_t>> rows{
      {15, 16, 17, 18, 19, 20}, {0, 1, 2, 3, 4, 14}, {7, 8, 9, 10, 5, 6}, {11, 12, 13, 21, 22, 23}};
  const Batch b = fit.sequences(0, 4);
  const auto in = to_double_vector(b.inputs), tg = to_double_vector(b.targets);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t t = 0; t < 6; ++t) {
      const int64_t k = rows[r][t];
      if (t < 5) {
        EXPECT_EQ(in[r * 5 + t], k + 10) << "row " << r << " input " << t;
      }
      if (t > 0) {
        EXPECT_EQ(tg[r * 5 + t - 1], keep[static_cast<size_t>(k)] ? k + 10 : -100)
            << "row " << r << " target " << t - 1;
      }
    }
  }
  // A long document's rows come first, its tail packed with the rest.
  write_grouped_dataset(prefix, {{2}, {9}, {3}});
  std::filesystem::remove(loss_mask_path(prefix));
  TokenDataset split({prefix}, 5, 50, {true, 1, LongDocuments::Split, true});
  EXPECT_EQ(split.long_documents(), 1);
  // Rows: [2..8) | its tail [7..11) with document 0's [0..2) | [11..14).
  const auto first = to_double_vector(split.sequences(0, split.num_sequences()).inputs);
  ASSERT_EQ(split.num_sequences(), 3);
  EXPECT_EQ(first[0], 12);
  EXPECT_EQ(first[5], 17);
  EXPECT_EQ(first[9], 10);   // the tail's row ends with document 0
  EXPECT_EQ(first[10], 21);  // then the 3-token document
}

// In an llm.c shard a document ends with the end-of-document (pad) token;
// the shard's last one may run to its end without one. Documents never
// straddle rows, though the stream rule would cut them.
TEST(DocumentPacking, ShardDocumentsEndWithTheirEndToken) {
  TempDir dir;
  const uint16_t eod = 0;
  // Documents 5 6 0 | 7 8 9 0 | 3 0 | 4 4 (no end).
  write_token_shard(dir.file("s.bin"), {5, 6, eod, 7, 8, 9, eod, 3, eod, 4, 4});
  TokenDataset ds({dir.file("s.bin")}, 4, 16, {true, eod});
  // Rows of 5: [5 6 0] (the next 4 tokens do not fit) | [7 8 9 0] | [3 0 4 4].
  ASSERT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(ds.padding_tokens(), 2 + 1 + 1);
  const auto in = to_double_vector(ds.sequences(0, 3).inputs);
  EXPECT_EQ(in, (std::vector<double>{5, 6, 0, 0, 7, 8, 9, 0, 3, 0, 4, 4}));
  const auto tg = to_double_vector(ds.sequences(0, 3).targets);
  EXPECT_EQ(tg, (std::vector<double>{6, 0, -100, -100, 8, 9, 0, -100, 0, 4, 4, -100}));
  // The stream rule cuts the second document across its first two rows.
  TokenDataset stream({dir.file("s.bin")}, 4, 16);
  EXPECT_EQ(to_double_vector(stream.sequences(0, 1).inputs), (std::vector<double>{5, 6, 0, 7}));
}

}  // namespace
}  // namespace triad::data
