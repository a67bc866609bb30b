#pragma once

// Rotary embeddings' frequencies, shared by the CPU backend and the CUDA
// kernels (host and device): pair i of a head of dimension D turns by
// position * rope_frequency(i, D, theta, scaling), and q's and k's rotated
// pairs are multiplied by rope_amplitude(scaling). Without scaling that is
// theta^(-2i/D) and 1. The scalings stretch a model trained on a shorter
// context (Hugging Face's rope_scaling kinds):
//  - llama3 (LLaMA 3.1's): wavelengths 2*pi/f longer than original_seq_len /
//    low_freq_factor turn `factor` times slower, those shorter than
//    original_seq_len / high_freq_factor keep their speed, and the ones
//    between are interpolated.
//  - linear (position interpolation): every frequency `factor` times slower.
//  - yarn (Peng et al. 2023; Qwen2.5's long context): the pairs that turn
//    more than beta_fast times over original_seq_len keep their speed, those
//    turning fewer than beta_slow times go `factor` times slower, a linear
//    ramp over the pair index between; and q and k are scaled by
//    attention_factor (0: Hugging Face's default 0.1 ln(factor) + 1), which
//    sharpens the attention logits by its square.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#define TRIAD_ROPE_HD __host__ __device__
#else
#define TRIAD_ROPE_HD
#endif

namespace triad {

struct RopeScaling {
  enum class Kind : uint8_t { None, Llama3, Linear, Yarn };
  Kind kind = Kind::None;
  double factor = 8.0;
  double low_freq_factor = 1.0;      // llama3
  double high_freq_factor = 4.0;     // llama3
  double original_seq_len = 8192.0;  // original_max_position_embeddings (llama3, yarn)
  double beta_fast = 32.0;           // yarn
  double beta_slow = 1.0;            // yarn
  double attention_factor = 0.0;     // yarn; 0: 0.1 ln(factor) + 1
  // A further factor on q's and k's pairs, whatever the kind: the fourth
  // root of the attention scores' rescaling (GptConfig::rope_of sets it
  // for model.query_pre_attn_scalar). Not a key of rope_scaling.
  double amplitude = 1.0;
  bool scaled() const { return kind != Kind::None; }
};

TRIAD_ROPE_HD inline double rope_frequency(int64_t i, int64_t D, double theta,
                                           const RopeScaling& s) {
  const double f = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  switch (s.kind) {
    case RopeScaling::Kind::None:
      return f;
    case RopeScaling::Kind::Linear:
      return f / s.factor;
    case RopeScaling::Kind::Llama3: {
      const double wavelength = 6.283185307179586 / f;
      if (wavelength < s.original_seq_len / s.high_freq_factor) return f;
      if (wavelength > s.original_seq_len / s.low_freq_factor) return f / s.factor;
      const double smooth = (s.original_seq_len / wavelength - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      return (1.0 - smooth) * f / s.factor + smooth * f;
    }
    case RopeScaling::Kind::Yarn: {
      // The pair index at which a pair turns `rotations` times over the
      // original context; the ramp runs from beta_fast's (floored) to
      // beta_slow's (ceiled), within [0, D - 1].
      const double dims = static_cast<double>(D), two_ln_theta = 2.0 * log(theta);
      double low =
          floor(dims * log(s.original_seq_len / (s.beta_fast * 6.283185307179586)) / two_ln_theta);
      double high =
          ceil(dims * log(s.original_seq_len / (s.beta_slow * 6.283185307179586)) / two_ln_theta);
      low = fmax(low, 0.0);
      high = fmin(high, dims - 1.0);
      if (low == high) high += 0.001;
      const double ramp = fmin(fmax((static_cast<double>(i) - low) / (high - low), 0.0), 1.0);
      return f / s.factor * ramp + f * (1.0 - ramp);
    }
  }
  return f;
}

// The factor q's and k's rotated pairs are multiplied by: yarn's attention
// factor (1 for the other kinds), times `amplitude`.
TRIAD_ROPE_HD inline double rope_amplitude(const RopeScaling& s) {
  if (s.kind != RopeScaling::Kind::Yarn) return s.amplitude;
  if (s.attention_factor > 0.0) return s.attention_factor * s.amplitude;
  return (s.factor <= 1.0 ? 1.0 : 0.1 * log(s.factor) + 1.0) * s.amplitude;
}

// "none", "llama3", "linear" or "yarn" (the config's and Hugging Face's
// names); rope_scaling_kind reads one back (false for another name).
inline const char* rope_scaling_name(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::Kind::None:
      return "none";
    case RopeScaling::Kind::Llama3:
      return "llama3";
    case RopeScaling::Kind::Linear:
      return "linear";
    case RopeScaling::Kind::Yarn:
      return "yarn";
  }
  return "?";
}
inline bool rope_scaling_kind(const std::string& name, RopeScaling::Kind* kind) {
  for (auto k : {RopeScaling::Kind::None, RopeScaling::Kind::Llama3, RopeScaling::Kind::Linear,
                 RopeScaling::Kind::Yarn}) {
    if (name == rope_scaling_name(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

// A kind's keys besides its type, as Hugging Face's rope_scaling object and
// the config name them, and the fields they set: what the config and
// config.json readers accept and their writers write (host only).
using RopeScalingField = double RopeScaling::*;
struct RopeScalingKey {
  const char* name;
  RopeScalingField field;
};
inline std::vector<RopeScalingKey> rope_scaling_keys(RopeScaling::Kind k) {
  using R = RopeScaling;
  switch (k) {
    case R::Kind::None:
      return {};
    case R::Kind::Linear:
      return {{"factor", &R::factor}};
    case R::Kind::Llama3:
      return {{"factor", &R::factor},
              {"low_freq_factor", &R::low_freq_factor},
              {"high_freq_factor", &R::high_freq_factor},
              {"original_max_position_embeddings", &R::original_seq_len}};
    case R::Kind::Yarn:
      return {{"factor", &R::factor},
              {"original_max_position_embeddings", &R::original_seq_len},
              {"beta_fast", &R::beta_fast},
              {"beta_slow", &R::beta_slow},
              {"attention_factor", &R::attention_factor}};
  }
  return {};
}

// Why `s` cannot scale (naming each value), or "" when it can: every kind
// needs factor >= 1; llama3 0 < low_freq_factor < high_freq_factor; llama3
// and yarn an original context > 0; yarn beta_fast > beta_slow > 0 and
// attention_factor >= 0. (Host only.)
inline std::string rope_scaling_problem(const RopeScaling& s) {
  if (s.kind == RopeScaling::Kind::None) return "";
  const std::string name = rope_scaling_name(s.kind);
  if (!(s.factor >= 1.0) || !std::isfinite(s.factor))
    return name + " scaling needs factor >= 1 (got " + std::to_string(s.factor) + ")";
  if (s.kind == RopeScaling::Kind::Llama3 &&
      !(s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor &&
        s.original_seq_len > 0.0)) {
    return "llama3 scaling needs factor >= 1 (got " + std::to_string(s.factor) +
           "), 0 < low_freq_factor (" + std::to_string(s.low_freq_factor) +
           ") < high_freq_factor (" + std::to_string(s.high_freq_factor) +
           ") and original_max_position_embeddings > 0 (" + std::to_string(s.original_seq_len) +
           ")";
  }
  if (s.kind == RopeScaling::Kind::Yarn &&
      !(s.original_seq_len > 0.0 && s.beta_slow > 0.0 && s.beta_fast > s.beta_slow &&
        s.attention_factor >= 0.0 && std::isfinite(s.attention_factor))) {
    return "yarn scaling needs original_max_position_embeddings > 0 (got " +
           std::to_string(s.original_seq_len) + "), beta_fast (" + std::to_string(s.beta_fast) +
           ") > beta_slow (" + std::to_string(s.beta_slow) + ") > 0 and attention_factor >= 0 (" +
           std::to_string(s.attention_factor) + ")";
  }
  return "";
}

}  // namespace triad

#undef TRIAD_ROPE_HD
