#pragma once

// Packed documents' layout on the device (documents.cu): for rows of token
// ids (B, T), where each token's document starts and its position in it,
// the values nn::document_layout and nn::sliding_window_starts form on the
// host, made where the ids are (inside a CUDA graph's capture they cannot
// be read on the host).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

// ids (B, T) contiguous, i64 (ids64) or i32. A token equal to `eod` ends
// its document: the next one starts a new one (an eod no id equals, such
// as -1, keeps each row one document). starts (B, T) i32: the first key
// token t of a row attends to, its document's start d(t), or with
// window > 0 max(d(t), t - window + 1). positions (B, T) i64, when not null:
// t - d(t), the token's position in its document (never windowed).
void document_starts(const void* ids, bool ids64, int64_t B, int64_t T, int64_t eod, int64_t window,
                     int32_t* starts, int64_t* positions, cudaStream_t stream);

}  // namespace triad::kernels
