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
//  - longrope (Phi-3's and Phi-3.5's long context): pair i turns
//    short_factor[i] times slower, or long_factor[i] times where the
//    positions a forward pass reaches go past original_seq_len (Hugging
//    Face's rule: the choice is the pass's, by its last position;
//    with_positions_up_to makes it), and q and k are scaled by
//    attention_factor (0: sqrt(1 + ln(factor) / ln(original_seq_len)), 1
//    for factor <= 1; factor is max_position_embeddings over the original).
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

// longrope's per-pair factors: heads of up to 2 * kMaxRopePairs dimensions.
inline constexpr int kMaxRopePairs = 256;

struct RopeScaling {
  enum class Kind : uint8_t { None, Llama3, Linear, Yarn, LongRope };
  Kind kind = Kind::None;
  double factor = 8.0;
  double low_freq_factor = 1.0;      // llama3
  double high_freq_factor = 4.0;     // llama3
  double original_seq_len = 8192.0;  // original_max_position_embeddings (llama3, yarn, longrope)
  double beta_fast = 32.0;           // yarn
  double beta_slow = 1.0;            // yarn
  double attention_factor = 0.0;     // yarn, longrope; 0: the kind's default
  // longrope: each pair's factors (`pairs` of them: the head's D / 2), and
  // whether this pass takes the long ones (with_positions_up_to).
  int pairs = 0;
  bool use_long = false;
  float short_factor[kMaxRopePairs] = {};
  float long_factor[kMaxRopePairs] = {};
  // A further factor on q's and k's pairs, whatever the kind: the fourth
  // root of the attention scores' rescaling (GptConfig::rope_of sets it
  // for model.query_pre_attn_scalar). Not a key of rope_scaling.
  double amplitude = 1.0;
  // The head's first rotary_dim dimensions turn, as pairs (i, i +
  // rotary_dim / 2), at the frequencies of a rotary_dim-wide head; the rest
  // pass through (Phi-4-mini's partial rotation); 0: the whole head.
  // Whatever the kind, like amplitude (GptConfig::rope_of sets it for
  // model.rope_dim). Not a key of rope_scaling.
  int64_t rotary_dim = 0;
  bool scaled() const { return kind != Kind::None; }
  // The dimensions that turn in a head of head_dim.
  TRIAD_ROPE_HD int64_t turned(int64_t head_dim) const {
    return rotary_dim > 0 ? rotary_dim : head_dim;
  }
  // This scaling for a forward pass whose last position is `end` - 1:
  // longrope takes its long factors when end > original_seq_len, its short
  // ones otherwise; the other kinds do not depend on it. A scaling that
  // takes them already keeps them: a caller that knows the row reaches
  // further than the positions at hand (context parallelism's chunks of a
  // row) says so first.
  RopeScaling with_positions_up_to(int64_t end) const {
    RopeScaling s = *this;
    s.use_long =
        use_long || (kind == Kind::LongRope && static_cast<double>(end) > original_seq_len);
    return s;
  }
};

TRIAD_ROPE_HD inline double rope_frequency(int64_t i, int64_t head_dim, double theta,
                                           const RopeScaling& s) {
  const int64_t D = s.turned(head_dim);
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
    case RopeScaling::Kind::LongRope:
      // (Hugging Face divides in f32: 1 / (factor * theta^(2i/D)).)
      return f / static_cast<double>(s.use_long ? s.long_factor[i] : s.short_factor[i]);
  }
  return f;
}

// The factor q's and k's rotated pairs are multiplied by: yarn's and
// longrope's attention factor (1 for the other kinds), times `amplitude`.
TRIAD_ROPE_HD inline double rope_amplitude(const RopeScaling& s) {
  if (s.kind != RopeScaling::Kind::Yarn && s.kind != RopeScaling::Kind::LongRope)
    return s.amplitude;
  if (s.attention_factor > 0.0) return s.attention_factor * s.amplitude;
  if (s.factor <= 1.0) return s.amplitude;
  if (s.kind == RopeScaling::Kind::LongRope)
    return sqrt(1.0 + log(s.factor) / log(s.original_seq_len)) * s.amplitude;
  return (0.1 * log(s.factor) + 1.0) * s.amplitude;
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
    case RopeScaling::Kind::LongRope:
      return "longrope";
  }
  return "?";
}
inline bool rope_scaling_kind(const std::string& name, RopeScaling::Kind* kind) {
  for (auto k : {RopeScaling::Kind::None, RopeScaling::Kind::Llama3, RopeScaling::Kind::Linear,
                 RopeScaling::Kind::Yarn, RopeScaling::Kind::LongRope}) {
    if (name == rope_scaling_name(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

// A kind's number keys besides its type, as Hugging Face's rope_scaling
// object and the config name them, and the fields they set: what the
// config and config.json readers accept and their writers write (host
// only). longrope's lists (short_factor, long_factor) are read apart.
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
    case R::Kind::LongRope:
      return {{"factor", &R::factor},
              {"original_max_position_embeddings", &R::original_seq_len},
              {"attention_factor", &R::attention_factor}};
  }
  return {};
}

// longrope's factor lists from `values`: a ValueError-style reason, or ""
// when they fit (1 to kMaxRopePairs positive finite numbers each).
inline std::string set_rope_factors(RopeScaling& s, const std::vector<double>& short_factor,
                                    const std::vector<double>& long_factor) {
  if (short_factor.empty() || short_factor.size() != long_factor.size() ||
      short_factor.size() > static_cast<size_t>(kMaxRopePairs)) {
    return "short_factor and long_factor need the same number of values, 1 to " +
           std::to_string(kMaxRopePairs) + " (got " + std::to_string(short_factor.size()) +
           " and " + std::to_string(long_factor.size()) + ")";
  }
  for (const auto* list : {&short_factor, &long_factor}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const double v = (*list)[i];
      if (!(v > 0.0) || !std::isfinite(v)) {
        return std::string(list == &short_factor ? "short_factor" : "long_factor") + "[" +
               std::to_string(i) + "] (" + std::to_string(v) + ") must be a positive number";
      }
    }
  }
  s.pairs = static_cast<int>(short_factor.size());
  for (size_t i = 0; i < short_factor.size(); ++i) {
    s.short_factor[i] = static_cast<float>(short_factor[i]);
    s.long_factor[i] = static_cast<float>(long_factor[i]);
  }
  return "";
}
inline std::vector<double> rope_factors(const RopeScaling& s, bool long_ones) {
  const float* f = long_ones ? s.long_factor : s.short_factor;
  return std::vector<double>(f, f + s.pairs);
}

// Why `s` cannot scale a head of `head_dim` dimensions (naming each value),
// or "" when it can: every kind needs factor >= 1 (longrope > 0: its
// factor only sets the attention factor); llama3 0 < low_freq_factor <
// high_freq_factor; llama3, yarn and longrope an original context > 0;
// yarn beta_fast > beta_slow > 0; yarn and longrope attention_factor >= 0;
// longrope a factor per pair of the head. (Host only.)
inline std::string rope_scaling_problem(const RopeScaling& s, int64_t head_dim) {
  if (s.kind == RopeScaling::Kind::None) return "";
  const std::string name = rope_scaling_name(s.kind);
  if (s.kind == RopeScaling::Kind::LongRope) {
    if (!(s.factor > 0.0) || !std::isfinite(s.factor) || !(s.original_seq_len > 1.0) ||
        !(s.attention_factor >= 0.0) || !std::isfinite(s.attention_factor)) {
      return "longrope scaling needs factor > 0 (got " + std::to_string(s.factor) +
             "), original_max_position_embeddings > 1 (" + std::to_string(s.original_seq_len) +
             ") and attention_factor >= 0 (" + std::to_string(s.attention_factor) + ")";
    }
    if (2 * static_cast<int64_t>(s.pairs) != s.turned(head_dim)) {
      return "longrope scaling has " + std::to_string(s.pairs) +
             " short_factor and long_factor values, but a head turning " +
             std::to_string(s.turned(head_dim)) + " dimensions has " +
             std::to_string(s.turned(head_dim) / 2) + " pairs";
    }
    return "";
  }
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
