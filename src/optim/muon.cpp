#include "triad/optim/muon.h"

#include <algorithm>
#include <cmath>

#include "triad/autograd/grad_mode.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/linalg.h"
#include "triad/ops/reduce.h"
#include "triad/ops/shape_ops.h"
#include "triad/optim/adamw.h"

namespace triad::optim {

MuonScale muon_scale_from_string(const std::string& s) {
  if (s == "adamw_rms") return MuonScale::AdamWRms;
  if (s == "spectral") return MuonScale::Spectral;
  throw ValueError("Muon update scale '" + s + "' must be adamw_rms or spectral");
}

const char* to_string(MuonScale s) {
  return s == MuonScale::AdamWRms ? "adamw_rms" : "spectral";
}

Tensor orthogonalize(const Tensor& g, int steps, DType compute) {
  if (g.dim() != 2) {
    throw ShapeError("orthogonalize: expected a matrix, got " + g.str());
  }
  if (compute != DType::F32 && compute != DType::BF16) {
    throw ValueError(std::string("orthogonalize: compute dtype ") + dtype_name(compute) +
                     " must be f32 or bf16");
  }
  autograd::NoGradGuard no_grad;
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = g.size(0) > g.size(1);
  const DType result = g.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor x = g.dtype() == result ? g : cast(g, result);
  if (tall) x = transpose(x, 0, 1);
  x = contiguous(x);
  // The norm in the wide type, the iteration in `compute`.
  const double norm = std::sqrt(item(sum(mul(x, x))));
  x = scale(x, 1.0 / (norm + 1e-7));
  if (compute == DType::BF16) x = cast(x, DType::BF16);
  for (int i = 0; i < steps; ++i) {
    const Tensor s = linear(x, x);  // X X^T, symmetric
    const Tensor poly = add(scale(s, b), scale(matmul(s, s), c));
    x = add(scale(x, a), matmul(poly, x));
  }
  if (x.dtype() != result) x = cast(x, result);
  return tall ? contiguous(transpose(x, 0, 1)) : x;
}

double muon_update_scale(int64_t rows, int64_t cols, MuonScale s) {
  const auto r = static_cast<double>(rows), k = static_cast<double>(cols);
  return s == MuonScale::AdamWRms ? 0.2 * std::sqrt(std::max(r, k))
                                  : std::sqrt(std::max(1.0, r / k));
}

void apply_muon_update(Tensor& target, const Tensor& update, double lr, double weight_decay) {
  if (weight_decay > 0) scale_(target, 1.0 - lr * weight_decay);
  add_(target, scale(update, -lr));
}

Tensor muon_update(const Tensor& u, const std::vector<int64_t>& row_blocks,
                   const MuonOptions& options, const std::string& name) {
  const int64_t rows = u.size(0), cols = u.size(1);
  std::vector<int64_t> blocks = row_blocks;
  if (blocks.empty()) blocks = {rows};
  int64_t total = 0;
  for (int64_t r : blocks) total += r;
  if (total != rows) {
    throw ShapeError("Muon: '" + name + "' has " + std::to_string(rows) +
                     " rows, its blocks add up to " + std::to_string(total));
  }
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (int64_t r : blocks) {
    parts.push_back(scale(orthogonalize(narrow(u, 0, at, r), options.ns_steps, options.ns_dtype),
                          muon_update_scale(r, cols, options.scale)));
    at += r;
  }
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

Tensor advance_momentum(Tensor& momentum, const Tensor& g, double mu) {
  const DType compute = momentum.dtype() == DType::BF16 ? DType::F32 : momentum.dtype();
  const Tensor grad = g.dtype() == compute ? g : cast(g, compute);
  if (momentum.dtype() != DType::BF16) {
    scale_(momentum, mu);
    add_(momentum, grad);
    return momentum;
  }
  Tensor m = cast(momentum, DType::F32);
  scale_(m, mu);
  add_(m, grad);
  copy_(momentum, m);
  return m;
}

Muon::Muon(std::vector<std::pair<MuonMatrix, Tensor>> matrices, MuonOptions options,
           MuonUpdater updater)
    : options_(options), updater_(std::move(updater)) {
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    throw ValueError("Muon: momentum " + std::to_string(options.momentum) + " must be in [0, 1)");
  }
  if (options.ns_steps < 1) {
    throw ValueError("Muon: ns_steps " + std::to_string(options.ns_steps) + " must be >= 1");
  }
  check_weight_decay(options.weight_decay, "Muon");
  check_moment_dtype(options.moment_dtype, "Muon");
  check_lr_scale(options.lr_scale, "Muon");
  const bool bf16 = options.moment_dtype == DType::BF16;
  for (auto& [matrix, p] : matrices) {
    if (p.dim() != 2) {
      throw ShapeError("Muon: parameter '" + matrix.name + "' is " + p.str() +
                       "; Muon updates matrices (give the others to AdamW)");
    }
    if (!p.is_contiguous())
      throw ValueError("Muon: parameter '" + matrix.name + "' is not contiguous");
    const bool half = p.dtype() == DType::BF16 || p.dtype() == DType::F16;
    Tensor master;
    if (half) {
      master = empty(p.shape(), DType::F32, p.device());
      copy_(master, p);
    }
    if (bf16 && !half && p.dtype() != DType::F32) {
      throw ValueError(
          "Muon: a bf16 momentum needs f32 parameters (or bf16/f16 ones with f32 "
          "masters); '" +
          matrix.name + "' is " + dtype_name(p.dtype()));
    }
    const DType momentum = bf16 ? DType::BF16 : half ? DType::F32 : p.dtype();
    state_.push_back({std::move(matrix), p, zeros(p.shape(), momentum, p.device()), master});
  }
}

void Muon::set_weight_decay(double weight_decay) {
  check_weight_decay(weight_decay, "Muon");
  options_.weight_decay = weight_decay;
}

void Muon::step(double lr, double grad_scale) {
  autograd::NoGradGuard no_grad;
  ++step_;
  const double mu = options_.momentum;
  std::vector<State*> stepping;  // (those with a gradient)
  std::vector<std::string> names;
  for (auto& s : state_) {
    if (!s.param.grad().defined()) continue;
    stepping.push_back(&s);
    names.push_back(s.matrix.name);
  }
  // Matrix i's momentum, then its u (made as it is asked for).
  const auto u = [&](size_t i) {
    State& s = *stepping.at(i);
    // A half gradient is scaled in its own type, then widened (as AdamW's).
    const Tensor grad = s.param.grad();
    Tensor g = grad_scale != 1.0 ? scale(grad, grad_scale) : grad;
    const DType compute = s.momentum.dtype() == DType::BF16 ? DType::F32 : s.momentum.dtype();
    if (g.dtype() != compute) g = cast(g, compute);
    const Tensor m = advance_momentum(s.momentum, g, mu);
    const Tensor term = options_.nesterov ? add(g, scale(m, mu)) : m;
    // Half gradients (train.grad_precision bf16): the term is held in their
    // type, as ZeRO-1 holds it in the gradient buffer it gathers.
    return is_half(grad.dtype()) ? cast(term, grad.dtype()) : term;
  };
  const auto apply = [&](size_t i, const Tensor& update) {
    State& s = *stepping.at(i);
    if (update.shape() != s.param.shape()) {
      throw ShapeError("Muon: the update of '" + s.matrix.name + "' is " + update.str() +
                       ", its parameter " + s.param.str());
    }
    Tensor& target = s.master.defined() ? s.master : s.param;
    apply_muon_update(target, update, lr * options_.lr_factor(s.matrix.name),
                      options_.decay_of(s.matrix.name));
    if (s.master.defined()) copy_(s.param, s.master);
  };
  if (updater_) {
    updater_(names, u, apply);
    return;
  }
  for (size_t i = 0; i < stepping.size(); ++i)
    apply(i, muon_update(u(i), stepping[i]->matrix.row_blocks, options_, names[i]));
}

void Muon::sync_params_from_masters() {
  autograd::NoGradGuard no_grad;
  for (auto& s : state_) {
    if (s.master.defined()) copy_(s.param, s.master);
  }
}

}  // namespace triad::optim
