#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::data {

// Inputs and next-token targets of some sequences, each (n, T) i64.
struct Batch {
  Tensor inputs;
  Tensor targets;
};

// The token stream of one or more shards read in order, cut into training
// sequences by a rule that no parallel layout changes: with global batch G
// and sequence length T, sequence j of step k is the T+1 tokens starting at
// (k*G + j)*T (inputs the first T, targets the last T). Global sequence q
// wraps around to q mod num_sequences() when the stream is exhausted.
class TokenDataset {
 public:
  TokenDataset(const std::vector<std::string>& shard_paths, int64_t seq_len, int64_t vocab_size);
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // Number of distinct sequences (start positions q*T with q*T + T + 1 <= tokens).
  int64_t num_sequences() const { return num_sequences_; }
  int64_t seq_len() const { return seq_len_; }

  // Sequences [first, first + count) of step `step` with global batch G.
  Batch batch(int64_t step, int64_t global_batch, int64_t first, int64_t count) const;

 private:
  std::vector<uint16_t> tokens_;
  int64_t seq_len_;
  int64_t num_sequences_;
};

}  // namespace triad::data
