#pragma once

#include <cstdint>

namespace triad {

// A 64-bit checksum of `length` bytes at `data`: their 64-bit words in four
// independent multiply-xor lanes (the tail zero-padded to whole words),
// mixed with the length, so hashing runs at memory speed and any one
// changed word (any one bit) changes it. Checkpoint files' "words64"
// checksum (io/checkpoint.h) and the replica check's
// (parallel.check_replicas_interval).
uint64_t words64_checksum(const void* data, uint64_t length);

}  // namespace triad
