#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::nn {

// Parameters (or buffers) by dotted name, e.g. "h.0.attn.c_attn.weight".
using StateDict = std::map<std::string, Tensor>;

// Base of every layer: owns named parameters and child modules, so that a
// model's parameters have stable dotted names (GPT-2's) for state dicts,
// optimizers and layout-independent initialisation. Modules know nothing
// about communication; data parallelism attaches through gradient hooks.
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its children, depth first, in
  // registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // One parameter by its dotted name ("h.3.attn.c_attn.weight"), found by
  // walking the children its prefixes name (no list of every parameter is
  // built); nullptr when there is none.
  const Tensor* find_parameter(const std::string& name) const;
  int64_t num_parameters() const;
  StateDict state_dict() const;
  // Copies values into the existing parameters (converting dtype). With
  // `strict`, missing and unexpected names are errors that list them.
  void load_state_dict(const StateDict& state, bool strict = true);
  // Drops every parameter's .grad.
  void zero_grad();
  // Moves every parameter to `device` and/or converts it to `dtype`, in
  // place: handles held elsewhere (optimizers, hooks) see the new storage.
  // Gradients are dropped. Call before building an optimizer. A state
  // parameter (register_state) keeps its dtype.
  void to(Device device);
  void to(DType dtype);

 protected:
  Tensor& register_parameter(const std::string& name, Tensor value);
  // A parameter that is state, not weights: saved, loaded and moved as the
  // others are, but never given a gradient (requires_grad false, so no
  // optimizer, reducer or norm sees it) and kept in its own dtype whatever
  // to(DType) says; its owner updates it (an MoE layer's expert biases).
  Tensor& register_state(const std::string& name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::string> states_;  // params_' names that register_state added
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// An ordered list of modules named "0", "1", ... (GPT-2's "h.N").
class ModuleList : public Module {
 public:
  void append(std::shared_ptr<Module> module) {
    register_module(std::to_string(size_++), std::move(module));
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

}  // namespace triad::nn
