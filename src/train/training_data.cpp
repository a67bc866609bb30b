#include "triad/train/training_data.h"

#include <fmt/format.h>

#include <map>

#include "triad/core/error.h"

namespace triad::train {

std::vector<data::BlendedDataset::Component> training_parts(const Config& c) {
  std::vector<data::BlendedDataset::Component> parts;
  for (const auto& part : c.data_train) {
    parts.push_back({data::expand_data_paths(part.path), part.weight, part.path});
  }
  return parts;
}

data::DocumentPacking document_packing(const Config& c) {
  return {c.data_packing != "stream", c.model.eod_token,
          data::long_documents_from_string(c.data_long_documents), c.data_packing == "best_fit"};
}

std::unique_ptr<data::BlendedDataset> open_training_data(const Config& c, data::TokenCheck check) {
  std::unique_ptr<data::BlendedDataset> d;
  try {
    // data.val_split: each part's last share is validation data.
    d = std::make_unique<data::BlendedDataset>(training_parts(c), c.model.seq_len,
                                               c.model.vocab_size, document_packing(c), check,
                                               data::StreamSlice{0, 1 - c.data_val_split});
  } catch (const ValueError& e) {
    throw ConfigError(std::string("data.train: ") + e.what());
  }
  if (c.data_shuffle) d->shuffle(c.train.seed);
  return d;
}

std::string visible(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if ((b < 0x20 && ch != '\n' && ch != '\t') || b == 0x7f) {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += ch;
    }
  }
  return out;
}

std::vector<ValidationSource> open_validation_data(const Config& c, data::TokenCheck check) {
  std::vector<ValidationSource> out;
  const double held_out = c.data_val_split;
  if (held_out > 0) {
    std::string paths;
    for (const auto& part : c.data_train) paths += (paths.empty() ? "" : ", ") + part.path;
    ValidationSource v{"", fmt::format("the last {:g}% of {}", 100 * held_out, paths),
                       "data.val_split", nullptr};
    try {
      v.data = std::make_unique<data::BlendedDataset>(training_parts(c), c.model.seq_len,
                                                      c.model.vocab_size, document_packing(c),
                                                      check, data::StreamSlice{1 - held_out, 1});
    } catch (const ValueError& e) {
      throw ConfigError(v.key + ": " + e.what());
    } catch (const IoError& e) {
      throw IoError(fmt::format("{} ({:g}) holds out {}: {}", v.key, held_out, v.path, e.what()));
    }
    out.push_back(std::move(v));
  }
  for (const auto& set : c.data_val) {
    ValidationSource v{set.name, set.path, set.name.empty() ? "data.val" : "data.val." + set.name,
                       nullptr};
    try {
      v.data = std::make_unique<data::BlendedDataset>(
          std::vector<data::BlendedDataset::Component>{
              {data::expand_data_paths(set.path, v.key), 1.0, set.path}},
          c.model.seq_len, c.model.vocab_size, document_packing(c), check);
    } catch (const ValueError& e) {
      throw ConfigError(v.key + ": " + e.what());
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::string preview_data(const Config& c, const data::BlendedDataset& d, const std::string& what,
                         int64_t first, int64_t count, const data::Tokenizer& tokenizer) {
  if (first < 0 || count < 1) {
    throw ValueError("preview_data: sequences [" + std::to_string(first) + ", +" +
                     std::to_string(count) + ") are not a range of global sequences");
  }
  data::Batch batch = d.sequences(first, count);
  if (c.data_eod_mask_loss) batch = data::mask_loss_after_eod(batch, c.model.eod_token);
  const int64_t T = c.model.seq_len;
  const int64_t* tg = batch.targets.data<int64_t>();
  const bool rows = c.data_packing != "stream";
  std::string out = fmt::format(
      "sequences {} to {} of {} as {} reads them ({} tokens each); text between \u27e6 and "
      "\u27e7 is read but not scored\n",
      first, first + count - 1, what, what == "data.train" ? "training" : "evaluation", T + 1);
  // Special tokens by their text (SentencePiece decodes </s> to nothing).
  std::map<int32_t, std::string> special;
  for (const std::string& text : tokenizer.special_tokens()) {
    special[tokenizer.special_token(text)] = text;
  }
  for (int64_t j = 0; j < count; ++j) {
    // Its T + 1 tokens, and whether each is a target with loss (the first
    // never is: it only predicts).
    const auto [part, index] = d.locate(first + j);
    const data::TokenDataset& source = d.component(part);
    std::vector<int64_t> row(static_cast<size_t>(T + 1));
    source.read_sequence(index, row.data());
    const std::vector<int32_t> tokens(row.begin(), row.end());
    std::vector<bool> scored{false};
    int64_t with_loss = 0;
    for (int64_t t = 0; t < T; ++t) {
      scored.push_back(tg[j * T + t] != -100);
      with_loss += scored.back();
    }
    // A row's padding: its trailing unscored end-of-document tokens.
    size_t end = tokens.size();
    if (rows) {
      while (end > 1 && !scored[end - 1] && tokens[end - 1] == c.model.eod_token) --end;
    }
    out += fmt::format("-- sequence {} ({}, its row {}): {} of {} tokens are targets with loss",
                       first + j, d.name(part), source.sequence_of(index), with_loss, T + 1);
    out += end < tokens.size() ? fmt::format(", {} padding\n", tokens.size() - end) : "\n";
    // Tokens [i, k) as text: special tokens by name, the others decoded
    // after what comes before them (a SentencePiece piece's leading space
    // survives the cut).
    const auto at = [&](size_t n) { return tokens.begin() + static_cast<std::ptrdiff_t>(n); };
    auto decode = [&](size_t i, size_t k) {
      std::string text;
      for (size_t a = i; a < k;) {
        const auto name = special.find(tokens[a]);
        if (name != special.end()) {
          text += name->second;
          ++a;
          continue;
        }
        size_t b = a;
        while (b < k && !special.count(tokens[b])) ++b;
        text += data::continuation_text(tokenizer, std::vector<int32_t>(tokens.begin(), at(a)),
                                        std::vector<int32_t>(at(a), at(b)));
        a = b;
      }
      return text;
    };
    for (size_t i = 0; i < end;) {
      size_t k = i;
      while (k < end && scored[k] == scored[i]) ++k;
      const std::string text = decode(i, k);
      out += scored[i] ? visible(text) : "\u27e6" + visible(text) + "\u27e7";
      i = k;
    }
    out += "\n";
  }
  return out;
}

}  // namespace triad::train
