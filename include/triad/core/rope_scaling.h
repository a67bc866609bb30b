#pragma once

// Rotary embeddings' frequencies, shared by the CPU backend and the CUDA
// kernels (host and device): pair i of a head of dimension D turns by
// position * rope_frequency(i, D, theta, scaling). Without scaling that is
// theta^(-2i/D); LLaMA 3.1's scaling ("llama3") stretches a model trained on
// original_seq_len tokens to longer contexts by slowing the low frequencies:
// wavelengths 2*pi/f longer than original_seq_len / low_freq_factor turn
// `factor` times slower, those shorter than original_seq_len /
// high_freq_factor keep their speed, and the ones between are interpolated.
#include <cmath>
#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#define TRIAD_ROPE_HD __host__ __device__
#else
#define TRIAD_ROPE_HD
#endif

namespace triad {

struct RopeScaling {
  enum class Kind : uint8_t { None, Llama3 };
  Kind kind = Kind::None;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_seq_len = 8192.0;  // original_max_position_embeddings
  bool scaled() const { return kind != Kind::None; }
};

TRIAD_ROPE_HD inline double rope_frequency(int64_t i, int64_t D, double theta,
                                           const RopeScaling& s) {
  const double f = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  if (s.kind == RopeScaling::Kind::None) return f;
  const double wavelength = 6.283185307179586 / f;
  if (wavelength < s.original_seq_len / s.high_freq_factor) return f;
  if (wavelength > s.original_seq_len / s.low_freq_factor) return f / s.factor;
  const double smooth = (s.original_seq_len / wavelength - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

// Why `s` cannot scale (naming each value), or "" when it can: llama3
// needs factor >= 1, 0 < low_freq_factor < high_freq_factor and an original
// context > 0. (Host only.)
inline std::string rope_scaling_problem(const RopeScaling& s) {
  if (s.kind == RopeScaling::Kind::None) return "";
  if (s.factor >= 1.0 && s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor &&
      s.original_seq_len > 0.0)
    return "";
  return "llama3 scaling needs factor >= 1 (got " + std::to_string(s.factor) +
         "), 0 < low_freq_factor (" + std::to_string(s.low_freq_factor) + ") < high_freq_factor (" +
         std::to_string(s.high_freq_factor) + ") and original_max_position_embeddings > 0 (" +
         std::to_string(s.original_seq_len) + ")";
}

}  // namespace triad

#undef TRIAD_ROPE_HD
