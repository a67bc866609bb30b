// The training data as the trainer opens it, and its text view
// (triad-train --show-data).
#include "triad/train/training_data.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "support/temp_dir.h"
#include "triad/data/indexed_dataset.h"
#include "triad/data/loss_mask.h"
#include "triad/data/tokenizer.h"

namespace triad::train {
namespace {

using triad::testing::TempDir;

// Prompt/response pairs of bytes, each document "p<i>?" (not scored) then
// "r<i>.\n" (scored), '\n' ending each: rows of 16 tokens hold two
// documents and two padding '\n's.
TEST(TrainingData, ThePreviewMarksWhatIsReadButNotScored) {
  TempDir dir;
  const std::string prefix = dir.file("sft");
  {
    data::IndexedDatasetWriter tokens(prefix, data::IndexedDType::U16);
    data::LossMaskWriter mask(data::loss_mask_path(prefix));
    for (int i = 0; i < 6; ++i) {
      const std::string prompt = "p" + std::to_string(i) + "?";
      const std::string response = "r" + std::to_string(i) + ".\n";
      std::vector<int64_t> doc;
      std::vector<uint8_t> keep;
      for (char ch : prompt + response) doc.push_back(static_cast<unsigned char>(ch));
      keep.assign(prompt.size(), 0);
      keep.resize(doc.size(), 1);
      tokens.add(doc);
      mask.add(keep);
    }
    tokens.finish();
    mask.finish();
  }
  const Config c = parse_config(
      "model: {n_layer: 1, n_head: 1, d_model: 8, vocab_size: 256, seq_len: 15}\n"
      "train: {steps: 1, global_batch_size: 2, micro_batch_size: 2}\n"
      "data: {train: " +
      prefix + ", packing: documents, eod_token: 10}\n");
  const auto d = open_training_data(c);
  EXPECT_EQ(d->num_sequences(), 3);
  const auto bytes = data::make_tokenizer("", "", "");
  EXPECT_EQ(preview_data(c, *d, "data.train", 1, 2, *bytes),
            "sequences 1 to 2 of data.train as training reads them (16 tokens each); text "
            "between \u27e6 and \u27e7 is read but not scored\n"
            "-- sequence 1 (" +
                prefix +
                ", its row 1): 8 of 16 tokens are targets with loss, 2 padding\n"
                "\u27e6p2?\u27e7r2.\n\u27e6p3?\u27e7r3.\n\n"
                "-- sequence 2 (" +
                prefix +
                ", its row 2): 8 of 16 tokens are targets with loss, 2 padding\n"
                "\u27e6p4?\u27e7r4.\n\u27e6p5?\u27e7r5.\n\n");
  // data.val_split leaves the last document out of training.
  const Config split = parse_config(to_yaml(c), {"data.val_split=0.2"});
  EXPECT_EQ(open_training_data(split)->num_tokens(), 35);
  EXPECT_THROW(preview_data(c, *d, "data.train", -1, 1, *bytes), ValueError);
}

// A SentencePiece model's control tokens decode to nothing; the preview
// names them, and a piece's leading space survives the cut between runs.
TEST(TrainingData, ThePreviewNamesSpecialTokens) {
  TempDir dir;
  const auto spm = data::load_tokenizer(std::string(TRIAD_SOURCE_DIR) +
                                        "/tests/data/fixtures/sentencepiece_bpe.model");
  const int32_t bos = spm->special_token("<s>"), eos = spm->special_token("</s>");
  ASSERT_GE(bos, 0);
  ASSERT_GE(eos, 0);
  std::vector<int64_t> doc{bos};
  const std::vector<int32_t> prompt = spm->encode("the cat"), answer = spm->encode("sat down");
  doc.insert(doc.end(), prompt.begin(), prompt.end());
  const size_t scored_from = doc.size();
  doc.insert(doc.end(), answer.begin(), answer.end());
  doc.push_back(eos);
  {
    data::IndexedDatasetWriter tokens(dir.file("d"), data::IndexedDType::U16);
    data::LossMaskWriter mask(data::loss_mask_path(dir.file("d")));
    std::vector<uint8_t> keep(doc.size(), 1);
    std::fill(keep.begin(), keep.begin() + static_cast<std::ptrdiff_t>(scored_from), 0);
    tokens.add(doc);
    mask.add(keep);
    tokens.finish();
    mask.finish();
  }
  const Config c =
      parse_config("model: {n_layer: 1, n_head: 1, d_model: 8, vocab_size: 1024, seq_len: " +
                   std::to_string(doc.size() - 1) +
                   "}\n"
                   "train: {steps: 1, global_batch_size: 1, micro_batch_size: 1}\n"
                   "data: {train: " +
                   dir.file("d") + "}\n");
  const std::string text = preview_data(c, *open_training_data(c), "data.train", 0, 1, *spm);
  EXPECT_NE(text.find("\n\u27e6<s>the cat\u27e7 sat down</s>\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace triad::train
