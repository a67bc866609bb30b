#include "triad/nn/module.h"

#include <algorithm>

#include "triad/ops/elementwise.h"

namespace triad::nn {

Tensor& Module::register_parameter(const std::string& name, Tensor value) {
  value.set_requires_grad(true);
  params_.emplace_back(name, std::move(value));
  return params_.back().second;
}

Tensor& Module::register_state(const std::string& name, Tensor value) {
  value.set_requires_grad(false);
  params_.emplace_back(name, std::move(value));
  states_.push_back(name);
  return params_.back().second;
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

const Tensor* Module::find_parameter(const std::string& name) const {
  for (const auto& [own, t] : params_) {
    if (own == name) return &t;
  }
  for (const auto& [child_name, child] : children_) {
    if (name.size() > child_name.size() && name.compare(0, child_name.size(), child_name) == 0 &&
        name[child_name.size()] == '.') {
      if (const Tensor* t = child->find_parameter(name.substr(child_name.size() + 1))) return t;
    }
  }
  return nullptr;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [name, t] : named_parameters()) out.emplace(name, t);
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  std::string missing, unexpected;
  auto params = named_parameters();
  for (auto& [name, t] : params) {
    auto it = state.find(name);
    if (it == state.end()) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    if (it->second.shape() != t.shape()) {
      throw ShapeError("load_state_dict: '" + name + "' has shape " +
                       shape_str(it->second.shape()) + ", the model expects " +
                       shape_str(t.shape()));
    }
  }
  if (strict) {
    for (auto& [name, t] : state) {
      bool known = false;
      for (auto& [pname, p] : params) known = known || pname == name;
      if (!known) unexpected += (unexpected.empty() ? "" : ", ") + name;
    }
    if (!missing.empty() || !unexpected.empty()) {
      throw ValueError("load_state_dict: missing [" + missing + "], unexpected [" + unexpected +
                       "]");
    }
  }
  for (auto& [name, t] : params) {
    auto it = state.find(name);
    if (it != state.end()) copy_(t, it->second);
  }
}

namespace {
// Points `param`'s implementation at `moved`'s storage and geometry, so every
// handle sharing the implementation follows.
void rebind(Tensor& param, const Tensor& moved) {
  TensorImpl& impl = param.impl();
  impl.storage = moved.storage();
  impl.shape = moved.shape();
  impl.strides = moved.strides();
  impl.offset = moved.offset();
  impl.dtype = moved.dtype();
  impl.grad.reset();
}
}  // namespace

void Module::to(Device device) {
  for (auto& [name, t] : named_parameters()) {
    if (t.device() == device) continue;
    Tensor moved = empty(t.shape(), t.dtype(), device);
    copy_(moved, t);
    rebind(t, moved);
  }
}

void Module::to(DType dtype) {
  if (!is_floating(dtype)) {
    throw ValueError(std::string("Module::to: parameters need a floating dtype, got ") +
                     dtype_name(dtype));
  }
  for (auto& [name, t] : params_) {
    if (t.dtype() == dtype || std::find(states_.begin(), states_.end(), name) != states_.end())
      continue;
    Tensor converted = empty(t.shape(), dtype, t.device());
    copy_(converted, t);
    rebind(t, converted);
  }
  for (auto& [name, child] : children_) child->to(dtype);
}

void Module::zero_grad() {
  for (auto& [name, t] : named_parameters()) t.impl().grad.reset();
}

}  // namespace triad::nn
