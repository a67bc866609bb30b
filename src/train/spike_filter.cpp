#include "triad/train/spike_filter.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "triad/core/error.h"

namespace triad::train {

SpikeFilter::SpikeFilter(double sigma, int64_t window) : sigma_(sigma), window_(window) {
  if (!(sigma > 0) || !std::isfinite(sigma)) {
    throw ConfigError(fmt::format("train.spike_sigma ({}) must be a finite number > 0", sigma));
  }
  if (window < 2) {
    throw ConfigError(fmt::format("train.spike_window ({}) must be at least 2 steps", window));
  }
}

namespace {
// Mean and standard deviation (n - 1 in the denominator) of `v`, summed in
// order.
std::pair<double, double> mean_std(const std::deque<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(v.size() - 1))};
}
}  // namespace

std::string SpikeFilter::spike(double loss, double grad_norm) const {
  if (!enabled() || !std::isfinite(loss) || !std::isfinite(grad_norm)) return "";
  if (known() < std::max<int64_t>(2, window_ / 2)) return "";
  for (const auto& [name, value, window] :
       {std::tuple{"loss", loss, &losses_}, std::tuple{"gradient norm", grad_norm, &norms_}}) {
    const auto [mean, std] = mean_std(*window);
    if (value > mean + sigma_ * std) {
      return fmt::format(
          "{} {:.6g} > {:.6g} + {:g} x {:.3g} (mean + sigma x std of the last {} steps)", name,
          value, mean, sigma_, std, window->size());
    }
  }
  return "";
}

void SpikeFilter::record(double loss, double grad_norm) {
  if (!enabled() || !std::isfinite(loss) || !std::isfinite(grad_norm)) return;
  losses_.push_back(loss);
  norms_.push_back(grad_norm);
  while (known() > window_) {
    losses_.pop_front();
    norms_.pop_front();
  }
}

std::string SpikeFilter::state() const {
  nlohmann::json j;
  j["losses"] = std::vector<double>(losses_.begin(), losses_.end());
  j["grad_norms"] = std::vector<double>(norms_.begin(), norms_.end());
  return j.dump();
}

void SpikeFilter::load(const std::string& text) {
  std::vector<double> losses, norms;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    losses = j.at("losses").get<std::vector<double>>();
    norms = j.at("grad_norms").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    throw IoError(std::string("spike window: ") + e.what());
  }
  if (losses.size() != norms.size()) {
    throw IoError(
        fmt::format("spike window: {} losses but {} gradient norms", losses.size(), norms.size()));
  }
  losses_.clear();
  norms_.clear();
  for (size_t i = 0; i < losses.size(); ++i) record(losses[i], norms[i]);
}

}  // namespace triad::train
