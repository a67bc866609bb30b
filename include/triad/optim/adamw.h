#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::optim {

struct AdamWOptions {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // The moments' storage: f32, or bf16 (DeepSeek-V3's, Megatron-LM's
  // --exp-avg-dtype/--exp-avg-sq-dtype bf16): each step reads them into f32,
  // updates and uses them in f32, and stores them rounded, so they take half
  // the memory. Masters stay f32.
  DType moment_dtype = DType::F32;
  // Parameters, by name, that take no weight decay although they have 2+
  // dimensions (train.no_weight_decay: OLMo 2's embeddings, say).
  std::set<std::string> no_decay;
  // The rule: parameters of 2+ dimensions but the no_decay names (AdamW's
  // and ZeRO-1's pieces alike).
  bool decays(const std::string& name, const Tensor& p) const {
    return p.dim() >= 2 && !no_decay.count(name);
  }
  // Parameters, by name, whose learning rate is the step's times a factor
  // (train.lr_scale); the others take the step's.
  std::map<std::string, double> lr_scale;
  double lr_factor(const std::string& name) const {
    const auto it = lr_scale.find(name);
    return it == lr_scale.end() ? 1.0 : it->second;
  }
};

// Throws a ValueError naming `who` and the parameter unless every factor
// of `lr_scale` is finite and > 0.
void check_lr_scale(const std::map<std::string, double>& lr_scale, const std::string& who);

// Throws a ValueError naming `who` and the value unless `weight_decay` is
// finite and >= 0.
void check_weight_decay(double weight_decay, const std::string& who);

// Throws a ValueError naming `who` unless `dtype` is a moment storage the
// optimizers hold: f32 or bf16.
void check_moment_dtype(DType dtype, const std::string& who);

// AdamW with PyTorch's semantics (decoupled weight decay, bias correction).
// Weight decay applies to parameters of 2+ dimensions (linear weights,
// embeddings) but those options.no_decay names, never to biases or
// LayerNorm parameters.
//
// options.lr_scale's parameters step with lr times their factor (their
// weight decay, lr * weight_decay, with it).
//
// Mixed precision: for a bf16/f16 parameter the optimizer keeps an f32
// master copy and moments of options.moment_dtype; the update runs on the
// master with the f32 gradient (half parameters accumulate f32 gradients)
// and the parameter receives the master rounded once. f32 parameters are
// updated in place.
class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, Tensor>> named_params, AdamWOptions options);

  // One update with learning rate `lr` (the schedule's value for this step).
  // Parameters without a gradient are skipped. The gradients are taken
  // times `grad_scale` (gradient clipping's coefficient), exactly as if they
  // had been scaled first, without a pass over them; they are not modified.
  void step(double lr, double grad_scale = 1.0);
  // One update as step(lr, coef) with gradient clipping's coefficient
  // decided where the gradients are, so that a loop can queue step after
  // step without waiting for the device: `sum_sq` (one f64 element on the
  // parameters' device, as sum_of_squares_device of their gradients gives
  // it) makes coef = min(1, max_norm / (sqrt(sum_sq) + 1e-6)), the bits
  // step() would take from global_grad_norm, and a sum that is not finite
  // leaves every parameter, master and moment as it is (the step still
  // counts for the bias correction). On a GPU the multi-tensor launches
  // read it on the device. Throws ValueError unless max_norm > 0 and every
  // parameter with a gradient is on sum_sq's device, ShapeError unless
  // sum_sq is one f64 element.
  void step_clipped(double lr, const Tensor& sum_sq, double max_norm);
  int64_t step_count() const { return step_; }
  const AdamWOptions& options() const { return options_; }
  // The weight decay of the steps after (a weight-decay schedule's value);
  // the parameters that take none still take none.
  void set_weight_decay(double weight_decay);

  struct State {
    std::string name;
    Tensor param;
    Tensor m, v;  // first and second moments (options.moment_dtype)
    bool decay;
    Tensor master;           // f32 master weights of a half parameter; undefined otherwise
    double lr_factor = 1.0;  // options.lr_scale's
  };
  std::vector<State>& state() { return state_; }
  void set_step_count(int64_t step) { step_ = step; }
  // After masters were loaded (checkpoints): rounds them into the parameters.
  void sync_params_from_masters();

 private:
  // step()'s and step_clipped()'s update: clip_sum_sq, when not null,
  // AdamWStep::clip_sum_sq.
  void update(double lr, double grad_scale, const Tensor* clip_sum_sq, double max_norm);
  AdamWOptions options_;
  std::vector<State> state_;
  int64_t step_ = 0;
};

}  // namespace triad::optim
