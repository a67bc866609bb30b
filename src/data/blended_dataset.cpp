#include "triad/data/blended_dataset.h"

#include <cmath>

#include "data/sequence_batch.h"
#include "triad/core/rng.h"

namespace triad::data {

BlendedDataset::BlendedDataset(const std::vector<Component>& components, int64_t seq_len,
                               int64_t vocab_size, DocumentPacking packing, TokenCheck check,
                               StreamSlice slice) {
  if (components.empty()) throw ValueError("blended dataset: no components");
  double total = 0;
  for (const auto& c : components) {
    if (!(c.weight > 0) || !std::isfinite(c.weight)) {
      throw ValueError("blended dataset: the weight of '" + c.name + "' (" +
                       std::to_string(c.weight) + ") must be positive");
    }
    total += c.weight;
  }
  for (const auto& c : components) {
    try {
      datasets_.push_back(
          std::make_unique<TokenDataset>(c.sources, seq_len, vocab_size, packing, check, slice));
    } catch (const IoError& e) {
      // Of several parts, the one that failed.
      if (components.size() == 1) throw;
      throw IoError("part '" + c.name + "': " + e.what());
    }
    shares_.push_back(c.weight / total);
    names_.push_back(c.name);
  }
  // The greedy pattern: position i goes to the component furthest behind
  // its share of i + 1 positions (the lowest index on a tie).
  const size_t n = components.size();
  std::vector<int64_t> taken(n, 0);
  pattern_.resize(kPeriod);
  rank_.resize(kPeriod);
  for (int64_t i = 0; i < kPeriod; ++i) {
    size_t best = 0;
    double behind = -1e300;
    for (size_t c = 0; c < n; ++c) {
      const double d = shares_[c] * static_cast<double>(i + 1) - static_cast<double>(taken[c]);
      if (d > behind) behind = d, best = c;
    }
    pattern_[i] = static_cast<uint32_t>(best);
    rank_[i] = taken[best]++;
  }
  per_period_ = taken;
  for (size_t c = 0; c < n; ++c) {
    if (per_period_[c] == 0) {
      throw ValueError("blended dataset: the weight of '" + components[c].name + "' (" +
                       std::to_string(components[c].weight) + ", a share of " +
                       std::to_string(shares_[c]) + ") is too small: below 1/" +
                       std::to_string(kPeriod) + " of the total it is never drawn");
    }
  }
}

int64_t BlendedDataset::num_tokens() const {
  int64_t n = 0;
  for (const auto& d : datasets_) n += d->num_tokens();
  return n;
}

int64_t BlendedDataset::num_sequences() const {
  int64_t n = 0;
  for (const auto& d : datasets_) n += d->num_sequences();
  return n;
}

void BlendedDataset::shuffle(uint64_t seed) {
  for (size_t c = 0; c < datasets_.size(); ++c) {
    datasets_[c]->shuffle(c == 0 ? seed : stable_hash("blend." + std::to_string(c)) ^ seed);
  }
}

std::pair<size_t, int64_t> BlendedDataset::locate(int64_t g) const {
  if (g < 0) throw ValueError("blended dataset: global sequence " + std::to_string(g) + " < 0");
  const int64_t period = g / kPeriod, at = g % kPeriod;
  const size_t c = pattern_[static_cast<size_t>(at)];
  return {c, period * per_period_[c] + rank_[static_cast<size_t>(at)]};
}

Batch BlendedDataset::sequences(int64_t first, int64_t count) const {
  return read_sequences(
      first, count, seq_len(),
      [this](int64_t g, int64_t* out, uint8_t* keep) {
        const auto [c, i] = locate(g);
        datasets_[c]->read_sequence(i, out, keep);
      },
      "BlendedDataset");
}

Batch BlendedDataset::batch(int64_t step, int64_t global_batch, int64_t first,
                            int64_t count) const {
  return sequences(batch_start(step, global_batch, first, count, "BlendedDataset"), count);
}

}  // namespace triad::data
