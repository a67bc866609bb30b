#include "triad/optim/loss_scaler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "triad/core/error.h"
#include "triad/io/json_integer.h"

namespace triad::optim {
namespace {

std::string scaler_num(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& o)
    : options_(o), scale_(o.init_scale), hysteresis_left_(o.hysteresis) {
  if (!(o.growth_factor > 1.0))
    throw ConfigError("loss scaler growth_factor (" + scaler_num(o.growth_factor) +
                      ") must be > 1");
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
    throw ConfigError("loss scaler backoff_factor (" + scaler_num(o.backoff_factor) +
                      ") must be in (0, 1)");
  if (o.growth_interval < 1)
    throw ConfigError("loss scaler growth_interval (" + std::to_string(o.growth_interval) +
                      ") must be >= 1");
  if (o.hysteresis < 1)
    throw ConfigError("loss scaler hysteresis (" + std::to_string(o.hysteresis) + ") must be >= 1");
  if (!(o.min_scale > 0.0 && o.min_scale <= o.init_scale && o.init_scale <= o.max_scale &&
        std::isfinite(o.max_scale)))
    throw ConfigError("loss scaler scales must satisfy 0 < min_scale (" + scaler_num(o.min_scale) +
                      ") <= init_scale (" + scaler_num(o.init_scale) + ") <= max_scale (" +
                      scaler_num(o.max_scale) + ") < inf");
}

bool DynamicLossScaler::update(bool found_non_finite) {
  if (found_non_finite) {
    // Megatron-LM's rule: the allowance is spent, never refilled, by
    // overflows; once gone, each overflow backs off until the scale grows.
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
    } else {
      hysteresis_left_ = 1;
      scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    }
    streak_ = 0;
    ++skipped_;
    return false;
  }
  if (++streak_ >= options_.growth_interval) {
    scale_ = std::min(options_.max_scale, scale_ * options_.growth_factor);
    streak_ = 0;
    hysteresis_left_ = options_.hysteresis;
  }
  return true;
}

nlohmann::json DynamicLossScaler::state() const {
  return {{"scale", scale_},
          {"clean_streak", streak_},
          {"skipped_steps", skipped_},
          {"hysteresis_left", hysteresis_left_}};
}

void DynamicLossScaler::load_state(const nlohmann::json& s) {
  auto field = [&](const char* name) -> const nlohmann::json& {
    if (!s.is_object() || !s.contains(name) || !s.at(name).is_number())
      throw IoError(std::string("loss scaler state: missing or non-numeric '") + name + "' in " +
                    s.dump());
    return s.at(name);
  };
  const double scale = field("scale").get<double>();
  const int64_t streak =
      io::json_int<IoError>(field("clean_streak"), "loss scaler state: clean_streak");
  const int64_t skipped =
      io::json_int<IoError>(field("skipped_steps"), "loss scaler state: skipped_steps");
  if (!(scale >= options_.min_scale && scale <= options_.max_scale))
    throw IoError("loss scaler state: scale " + scaler_num(scale) + " is outside [" +
                  scaler_num(options_.min_scale) + ", " + scaler_num(options_.max_scale) + "]");
  if (streak < 0 || streak >= options_.growth_interval || skipped < 0)
    throw IoError("loss scaler state: clean_streak " + std::to_string(streak) + " must be in [0, " +
                  std::to_string(options_.growth_interval) + ") and skipped_steps " +
                  std::to_string(skipped) + " >= 0");
  int64_t left = options_.hysteresis;
  if (s.contains("hysteresis_left")) {
    left = io::json_int<IoError>(field("hysteresis_left"), "loss scaler state: hysteresis_left");
    if (left < 1)
      throw IoError("loss scaler state: hysteresis_left " + std::to_string(left) + " must be >= 1");
    left = std::min(left, options_.hysteresis);
  }
  scale_ = scale;
  streak_ = streak;
  skipped_ = skipped;
  hysteresis_left_ = left;
}

}  // namespace triad::optim
