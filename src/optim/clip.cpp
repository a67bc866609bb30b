#include "triad/optim/clip.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/core/error.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/reduce.h"
#include "triad/ops/shape_ops.h"

namespace triad::optim {

double sum_of_squares(const Tensor& t) {
  const Tensor s = sum_of_squares_device({t});
  return s.defined() ? item(s) : 0.0;
}

Tensor sum_of_squares_device(const std::vector<Tensor>& tensors) {
  autograd::NoGradGuard no_grad;
  // One backend call per device (the CUDA backend reads every tensor once,
  // in a few launches), then the devices' sums added in order.
  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto it = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& e) { return e.first == t.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {t.device(), {}});
    it->second.push_back(t.is_contiguous() ? t : contiguous(t));
  }
  Tensor total;
  for (auto& [device, list] : by_device) {
    Tensor s = empty({1}, DType::F64, device);
    backend_for(device.type).sum_of_squares(list, s);
    total = total.defined() ? add(total, to_device(s, total.device())) : s;
  }
  return total;
}

NormGroups::NormGroups(const std::vector<std::string>& parameters,
                       const std::function<std::string(const std::string&)>& key) {
  std::map<std::string, std::vector<std::string>> members;
  for (const auto& name : parameters) members[key(name)].push_back(name);
  for (const auto& [group, names] : members) {
    for (const auto& name : names) of_[name] = names_.size();
    names_.push_back(group);
  }
}

size_t NormGroups::of(const std::string& parameter) const {
  const auto it = of_.find(parameter);
  if (it == of_.end()) {
    throw ValueError("norm groups: no group holds parameter '" + parameter + "' (" +
                     std::to_string(of_.size()) + " parameters in " +
                     std::to_string(names_.size()) + " groups)");
  }
  return it->second;
}

Tensor grouped_sum_of_squares(const std::vector<std::vector<Tensor>>& groups, Device device) {
  autograd::NoGradGuard no_grad;
  if (groups.size() == 1) {  // (the plain global norm: no concatenation)
    const Tensor s = sum_of_squares_device(groups[0]);
    return s.defined() ? to_device(s, device) : s;
  }
  std::vector<Tensor> sums;
  bool any = false;
  for (const auto& g : groups) {
    Tensor s = sum_of_squares_device(g);
    any = any || s.defined();
    sums.push_back(s.defined() ? to_device(s, device) : zeros({1}, DType::F64, device));
  }
  return any ? concat(sums, 0) : Tensor();
}

double global_grad_norm(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  Tensor total = sum_of_squares_device(grads);
  return total.defined() ? std::sqrt(item(total)) : 0.0;
}

double global_param_norm(const std::vector<Tensor>& params) {
  std::vector<Tensor> trained;
  for (const auto& p : params) {
    if (p.requires_grad()) trained.push_back(p.detach());
  }
  Tensor total = sum_of_squares_device(trained);
  return total.defined() ? std::sqrt(item(total)) : 0.0;
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  // std::min keeps its first argument when the other is NaN.
  return std::min(1.0, max_norm / (norm + 1e-6));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) {
    for (const auto& p : params) {
      Tensor g = p.grad();
      if (g.defined()) scale_(g, coef);
    }
  }
  return norm;
}

}  // namespace triad::optim
