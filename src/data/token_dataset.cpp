#include "triad/data/token_dataset.h"

#include "triad/data/token_shard.h"

namespace triad::data {

TokenDataset::TokenDataset(const std::vector<std::string>& shard_paths, int64_t seq_len,
                           int64_t vocab_size)
    : seq_len_(seq_len) {
  if (seq_len <= 0)
    throw ValueError("TokenDataset: seq_len (" + std::to_string(seq_len) + ") must be positive");
  for (const auto& p : shard_paths) {
    auto t = read_token_shard(p, vocab_size);
    tokens_.insert(tokens_.end(), t.begin(), t.end());
  }
  const int64_t n = static_cast<int64_t>(tokens_.size());
  num_sequences_ = n > seq_len ? (n - 1) / seq_len : 0;
  if (num_sequences_ == 0) {
    throw IoError(
        "token data has " + std::to_string(n) +
        " tokens, fewer than one sequence of seq_len + 1 = " + std::to_string(seq_len + 1));
  }
}

Batch TokenDataset::batch(int64_t step, int64_t global_batch, int64_t first, int64_t count) const {
  if (first < 0 || count <= 0 || first + count > global_batch) {
    throw ValueError("TokenDataset::batch: sequences [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + ") are outside the global batch of " +
                     std::to_string(global_batch));
  }
  const int64_t T = seq_len_;
  Tensor inputs = empty({count, T}, DType::I64), targets = empty({count, T}, DType::I64);
  int64_t* in = inputs.data<int64_t>();
  int64_t* tg = targets.data<int64_t>();
  for (int64_t j = 0; j < count; ++j) {
    const int64_t q = (step * global_batch + first + j) % num_sequences_;
    const uint16_t* src = tokens_.data() + q * T;
    for (int64_t t = 0; t < T; ++t) {
      in[j * T + t] = src[t];
      tg[j * T + t] = src[t + 1];
    }
  }
  return {inputs, targets};
}

}  // namespace triad::data
