#pragma once

#include <cstdint>
#include <functional>

#include "triad/data/token_dataset.h"

namespace triad::data {

// Global sequences [first, first + count) as inputs and targets:
// `read(g, out)` writes the seq_len + 1 tokens of global sequence g. `who`
// names the caller in the error for a negative range.
Batch read_sequences(int64_t first, int64_t count, int64_t seq_len,
                     const std::function<void(int64_t, int64_t*)>& read, const char* who);

// Global sequences [step*G + first, step*G + first + count): the error for a
// range outside the batch names `who`.
Batch sequence_batch(int64_t step, int64_t global_batch, int64_t first, int64_t count,
                     int64_t seq_len, const std::function<void(int64_t, int64_t*)>& read,
                     const char* who);

}  // namespace triad::data
