#include "triad/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"

namespace triad::optim {

void check_lr_scale(const std::map<std::string, double>& lr_scale, const std::string& who) {
  for (const auto& [name, factor] : lr_scale) {
    if (!(factor > 0) || !std::isfinite(factor)) {
      throw ValueError(who + ": the learning-rate factor of '" + name + "' (" +
                       std::to_string(factor) + ") must be a finite number > 0");
    }
  }
}

void check_weight_decay(double weight_decay, const std::string& who) {
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay)) {
    throw ValueError(who + ": weight_decay (" + std::to_string(weight_decay) +
                     ") must be a finite number >= 0");
  }
}

void check_moment_dtype(DType dtype, const std::string& who) {
  if (dtype != DType::F32 && dtype != DType::BF16) {
    throw ValueError(who + ": moments of dtype " + dtype_name(dtype) +
                     " are not supported (f32 or bf16)");
  }
}

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> named_params, AdamWOptions options)
    : options_(options) {
  if (!(options.lr >= 0))
    throw ValueError("AdamW: lr " + std::to_string(options.lr) + " must be >= 0");
  if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1)) {
    throw ValueError("AdamW: betas (" + std::to_string(options.beta1) + ", " +
                     std::to_string(options.beta2) + ") must be in [0, 1)");
  }
  if (!(options.eps > 0)) throw ValueError("AdamW: eps must be > 0");
  check_weight_decay(options.weight_decay, "AdamW");
  check_lr_scale(options.lr_scale, "AdamW");
  check_moment_dtype(options.moment_dtype, "AdamW");
  for (auto& [name, p] : named_params) {
    if (!p.is_contiguous()) throw ValueError("AdamW: parameter '" + name + "' is not contiguous");
    const bool half = p.dtype() == DType::BF16 || p.dtype() == DType::F16;
    if (half) {
      Tensor master = empty(p.shape(), DType::F32, p.device());
      copy_(master, p);
      state_.push_back({name, p, zeros(p.shape(), options.moment_dtype, p.device()),
                        zeros(p.shape(), options.moment_dtype, p.device()), options.decays(name, p),
                        master, options.lr_factor(name)});
    } else {
      // Moments of the parameter's own type (f32, f64), or bf16 beside f32.
      const bool bf16 = options.moment_dtype == DType::BF16;
      if (bf16 && p.dtype() != DType::F32) {
        throw ValueError(
            "AdamW: bf16 moments need f32 parameters (or bf16/f16 ones with f32 "
            "masters); '" +
            name + "' is " + dtype_name(p.dtype()));
      }
      const DType moments = bf16 ? DType::BF16 : p.dtype();
      state_.push_back({name, p, zeros(p.shape(), moments, p.device()),
                        zeros(p.shape(), moments, p.device()), options.decays(name, p), Tensor(),
                        options.lr_factor(name)});
    }
  }
}

void AdamW::set_weight_decay(double weight_decay) {
  check_weight_decay(weight_decay, "AdamW");
  options_.weight_decay = weight_decay;
}

void AdamW::step(double lr, double grad_scale) {
  update(lr, grad_scale, nullptr, 0);
}

void AdamW::step_clipped(double lr, const Tensor& sum_sq, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw ValueError("AdamW::step_clipped: max_norm " + std::to_string(max_norm) +
                     " (expected a finite number > 0)");
  }
  check_clip_sum_sq(sum_sq, sum_sq.device());
  for (const State& s : state_) {
    if (s.param.grad().defined() && s.param.device() != sum_sq.device()) {
      throw ValueError("AdamW::step_clipped: parameter " + s.name + " is on " +
                       s.param.device().str() + ", the sum of squares on " + sum_sq.device().str() +
                       " (clipping on the device needs them together)");
    }
  }
  update(lr, 1.0, &sum_sq, max_norm);
}

void AdamW::update(double lr, double grad_scale, const Tensor* clip_sum_sq, double max_norm) {
  autograd::NoGradGuard no_grad;
  ++step_;
  AdamWStep hp;
  if (clip_sum_sq) {
    hp.clip_sum_sq = *clip_sum_sq;
    hp.clip_max_norm = max_norm;
  }
  hp.lr = lr;
  hp.beta1 = options_.beta1;
  hp.beta2 = options_.beta2;
  hp.eps = options_.eps;
  hp.step = step_;
  // One backend call per device and learning-rate factor for the whole step
  // (the CUDA backend's multi-tensor launches), entries in parameter order.
  struct Group {
    Device device;
    double lr_factor;
    std::vector<Backend::AdamWEntry> entries;
  };
  std::vector<Group> groups;
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    Backend::AdamWEntry e;
    e.param = s.param, e.m = s.m, e.v = s.v, e.master = s.master;
    // A half gradient (train.grad_precision: bf16) goes as it is: the
    // backends scale it in its own type, then widen it, as scaling it first
    // would.
    e.grad_scale = grad_scale;
    e.grad = g;
    e.weight_decay = s.decay ? options_.weight_decay : 0.0;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.device == s.param.device() && g.lr_factor == s.lr_factor;
    });
    if (it == groups.end()) {
      groups.push_back({s.param.device(), s.lr_factor, {}});
      it = groups.end() - 1;
    }
    it->entries.push_back(std::move(e));
  }
  for (Group& g : groups) {
    hp.lr = lr * g.lr_factor;
    backend_for(g.device.type).adamw_many(g.entries, hp);
  }
}

void AdamW::sync_params_from_masters() {
  autograd::NoGradGuard no_grad;
  for (auto& s : state_) {
    if (s.master.defined()) copy_(s.param, s.master);
  }
}

}  // namespace triad::optim
