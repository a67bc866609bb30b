#pragma once

// Philox-4x32-10 as one header that compiles for both host and device, so the
// CPU backend and the CUDA kernels draw every random number (initialisation,
// dropout masks) from the very same function.
#include <cstdint>

#include "triad/core/host_device.h"

namespace triad::philox {

struct Words {
  uint32_t w[4];
};

// The four 32-bit words of counter (counter_hi, counter_lo) under `key`.
TRIAD_HOST_DEVICE inline Words block(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0, k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from 32 random bits (24-bit mantissa, never 1.0).
TRIAD_HOST_DEVICE inline float unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// Element `index` of stream (seed, stream): four outputs per counter, element
// i uses word i % 4 of counter i / 4.
TRIAD_HOST_DEVICE inline float uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return unit_float(block(seed, stream, index >> 2).w[index & 3]);
}

// Which draws of a stream a tensor's elements take (dropout's masks): element
// i (flat, row-major) takes draw offset + (i / row_length) * row_stride +
// i % row_length, rows of row_length draws row_stride apart, so that a piece
// of a larger tensor (a rank's chunk of each sequence) takes that tensor's
// draws. row_length 0: one run, offset + i.
//
// per_call: the draws one call (a micro-batch of a step) moves the offset by,
// for dropout whose call count is read from device memory (a CUDA graph's
// replay): given a count d there, every draw moves by d * per_call, modulo
// 2^64 as every offset is, so a graph captured at call c0 and replayed with
// d = c - c0 (negative too) draws call c's mask. Unused without a count.
struct Counters {
  uint64_t offset = 0;
  uint64_t row_length = 0;
  uint64_t row_stride = 0;
  uint64_t per_call = 0;

  // These counters with the offset moved by `calls` calls.
  TRIAD_HOST_DEVICE Counters after_calls(uint64_t calls) const {
    return {offset + calls * per_call, row_length, row_stride, per_call};
  }

  TRIAD_HOST_DEVICE uint64_t at(uint64_t i) const {
    if (row_length == 0) return offset + i;
    return offset + (i / row_length) * row_stride + i % row_length;
  }
  // Column c of a row keyed `key` (dropout's keys: rows of a larger tensor
  // in any order, each naming its row there): offset + key * row_stride + c.
  TRIAD_HOST_DEVICE uint64_t keyed(uint64_t key, uint64_t c) const {
    return offset + key * row_stride + c;
  }
};

}  // namespace triad::philox
