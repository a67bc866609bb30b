#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "triad/data/token_dataset.h"

namespace triad::data {

// A training mixture: several token datasets, each drawn in proportion to
// its weight. Global sequence g goes to component c(g), which serves it as
// its own global sequence i(g) (wrapping around, and shuffled if asked,
// within the component). The assignment repeats every kPeriod sequences: a
// pattern built greedily so that every prefix of it holds each component
// within one sequence of its share (weight / total), and a component's
// sequences are numbered consecutively in order of appearance — so each
// component is read front to back at its rate. c and i depend on g only,
// never on the parallel layout. One component of any weight reads exactly
// as that TokenDataset alone.
class BlendedDataset {
 public:
  static constexpr int64_t kPeriod = 4096;
  struct Component {
    std::vector<std::string> sources;  // as expand_data_paths gives
    double weight = 1.0;
    std::string name;  // for messages (the configured path)
  };
  // Errors: no component, a weight that is not positive and finite, or so
  // small that it gets no sequence in a period (below total / 4096).
  // `packing`, `check` and `slice` apply to every component.
  BlendedDataset(const std::vector<Component>& components, int64_t seq_len, int64_t vocab_size,
                 DocumentPacking packing = {}, TokenCheck check = {}, StreamSlice slice = {});

  size_t num_components() const { return datasets_.size(); }
  const TokenDataset& component(size_t c) const { return *datasets_.at(c); }
  TokenDataset& component(size_t c) { return *datasets_.at(c); }
  // Component c's name (Component::name).
  const std::string& name(size_t c) const { return names_.at(c); }
  // Share of component c (its weight over the total).
  double share(size_t c) const { return shares_.at(c); }
  int64_t num_tokens() const;
  int64_t num_sequences() const;
  int64_t seq_len() const { return datasets_.front()->seq_len(); }
  // Shuffles every component, each with its own seed derived from `seed`.
  void shuffle(uint64_t seed);
  // (c(g), i(g)).
  std::pair<size_t, int64_t> locate(int64_t g) const;
  // Sequences [first, first + count) of step `step` with global batch G.
  Batch batch(int64_t step, int64_t global_batch, int64_t first, int64_t count) const;
  // Global sequences [first, first + count) (the trainer's data position
  // survives a change of global batch size across a resume).
  Batch sequences(int64_t first, int64_t count) const;

 private:
  std::vector<std::unique_ptr<TokenDataset>> datasets_;
  std::vector<double> shares_;
  std::vector<std::string> names_;
  std::vector<uint32_t> pattern_;    // component of each position in a period
  std::vector<int64_t> rank_;        // its index among that component's positions
  std::vector<int64_t> per_period_;  // sequences of each component per period
};

}  // namespace triad::data
