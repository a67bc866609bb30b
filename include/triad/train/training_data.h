#pragma once

// The data a config trains on, opened as the trainer opens it, and a text
// view of it: what each training sequence holds after packing, mixing,
// data.val_split and the loss masks, decoded (triad-train --show-data).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "triad/data/blended_dataset.h"
#include "triad/data/token_dataset.h"
#include "triad/data/tokenizer.h"
#include "triad/train/config.h"

namespace triad::train {

// data.train's parts, each path expanded (globs, Megatron prefixes).
std::vector<data::BlendedDataset::Component> training_parts(const Config& c);
// data.packing, data.long_documents and data.eod_token as the datasets take
// them.
data::DocumentPacking document_packing(const Config& c);
// data.train as training reads it: the parts mixed by weight, each less
// data.val_split's tail, shuffled with train.seed when data.shuffle is on.
// A ValueError of the data becomes a ConfigError naming data.train.
std::unique_ptr<data::BlendedDataset> open_training_data(const Config& c,
                                                         data::TokenCheck check = {});

// A validation set as the trainer evaluates it: a data.val set (one part),
// or data.val_split's held-out tails of the data.train parts mixed with
// their weights. `key` names it in messages: data.val, data.val.<name> or
// data.val_split. Errors name the key.
struct ValidationSource {
  std::string name, path, key;
  std::unique_ptr<data::BlendedDataset> data;
};
std::vector<ValidationSource> open_validation_data(const Config& c, data::TokenCheck check = {});

// Text for a terminal: control bytes other than newline and tab (an
// end-of-document byte 0, say) written as \xNN.
std::string visible(const std::string& text);

// Global sequences [first, first + count) of `d` (`what`: data.train, or a
// validation set's key) as the trainer reads them (data.eod_mask_loss
// applied), as text: for each, a line naming it (its part and its row
// there, its tokens and how many are targets with loss), then its tokens
// decoded, each run of tokens that are read but not
// scored (the first token, masked prompts, tokens after an end of document
// under data.eod_mask_loss) between ⟦ and ⟧, control bytes other than
// newline and tab as \xNN, and a row's trailing padding (data.packing:
// documents or best_fit) counted instead of written.
std::string preview_data(const Config& c, const data::BlendedDataset& d, const std::string& what,
                         int64_t first, int64_t count, const data::Tokenizer& tokenizer);

}  // namespace triad::train
