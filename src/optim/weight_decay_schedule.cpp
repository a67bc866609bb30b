#include "triad/optim/weight_decay_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "triad/core/error.h"

namespace triad::optim {

WeightDecayShape weight_decay_shape_from_string(const std::string& name) {
  if (name == "constant") return WeightDecayShape::Constant;
  if (name == "linear") return WeightDecayShape::Linear;
  if (name == "cosine") return WeightDecayShape::Cosine;
  throw ValueError("weight-decay schedule '" + name + "' must be constant, linear or cosine");
}

const char* weight_decay_shape_name(WeightDecayShape shape) {
  switch (shape) {
    case WeightDecayShape::Constant:
      return "constant";
    case WeightDecayShape::Linear:
      return "linear";
    case WeightDecayShape::Cosine:
      return "cosine";
  }
  return "unknown";
}

WeightDecaySchedule::WeightDecaySchedule(const WeightDecayScheduleOptions& o) : o_(o) {
  for (const auto& [what, value] : {std::pair{"end", o.end}, std::pair{"start", o.start}}) {
    if (!(std::isfinite(value) && value >= 0)) {
      std::ostringstream os;
      os << "weight decay's " << what << " value (" << value << ") must be finite and >= 0";
      throw ValueError(os.str());
    }
  }
  if (o.shape != WeightDecayShape::Constant && o.steps < 1) {
    throw ValueError(std::string("a ") + weight_decay_shape_name(o.shape) +
                     " weight-decay schedule needs steps >= 1 (got " + std::to_string(o.steps) +
                     ")");
  }
}

double WeightDecaySchedule::at(double step) const {
  if (o_.shape == WeightDecayShape::Constant) return o_.end;
  const double p = std::clamp(step / static_cast<double>(o_.steps), 0.0, 1.0);
  const double moved = o_.shape == WeightDecayShape::Linear ? p : 0.5 * (1.0 - std::cos(M_PI * p));
  return o_.start + (o_.end - o_.start) * moved;
}

}  // namespace triad::optim
