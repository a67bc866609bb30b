#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::optim {

// How Muon sizes an orthogonalised update O of a rows x cols matrix (whose
// singular values are all about 1).
enum class MuonScale {
  // 0.2 sqrt(max(rows, cols)): the update's RMS is about AdamW's (0.2 to
  // 0.4), so AdamW's learning rate and weight decay carry over (Moonlight,
  // Liu et al. 2025; PyTorch's adjust_lr_fn "match_rms_adamw").
  AdamWRms,
  // sqrt(max(1, rows / cols)): Keller Jordan's original, which wants a
  // learning rate of its own (about 0.02).
  Spectral,
};
MuonScale muon_scale_from_string(const std::string& s);  // adamw_rms | spectral
const char* to_string(MuonScale s);

struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  MuonScale scale = MuonScale::AdamWRms;
  double weight_decay = 0.1;    // decoupled, as AdamW's: p <- p (1 - lr wd)
  DType ns_dtype = DType::F32;  // the Newton-Schulz GEMMs' (orthogonalize's compute)
  // The momentum's storage: f32, or bf16 (advance_momentum: read into f32,
  // updated and used in f32, stored rounded).
  DType moment_dtype = DType::F32;
  // Matrices, by name, that take no weight decay (train.no_weight_decay).
  std::set<std::string> no_decay;
  double decay_of(const std::string& name) const {
    return no_decay.count(name) ? 0.0 : weight_decay;
  }
  // Matrices, by name, whose learning rate is the step's times a factor
  // (train.lr_scale, as AdamWOptions::lr_scale).
  std::map<std::string, double> lr_scale;
  double lr_factor(const std::string& name) const {
    const auto it = lr_scale.find(name);
    return it == lr_scale.end() ? 1.0 : it->second;
  }
};

// The Newton-Schulz iteration Muon uses (Jordan et al. 2024): X = G / |G|_F,
// then `steps` times X <- a X + (b A + c A^2) X with A = X X^T and (a, b,
// c) = (3.4445, -4.7750, 2.0315), on the wide orientation (a tall G is
// transposed there and back). It takes G's singular values to about 1
// (between 0.7 and 1.2) and keeps its singular vectors: about U V^T. Half
// matrices are taken in f32; f32 and f64 in their own type.
// `compute`: the dtype of the iteration's GEMMs: BF16 (Jordan's and
// Moonlight's; sixteen times f32's GEMM rate on A100 and H100) or F32 (f64
// matrices stay f64). The result is f32 (f64 for an f64 g).
Tensor orthogonalize(const Tensor& g, int steps = 5, DType compute = DType::F32);
double muon_update_scale(int64_t rows, int64_t cols, MuonScale s);

// Muon's update of a whole matrix from its momentum term u: each of
// `row_blocks` (empty: one) orthogonalised apart in options.ns_dtype and
// scaled by muon_update_scale. `name` is for errors.
Tensor muon_update(const Tensor& u, const std::vector<int64_t>& row_blocks,
                   const MuonOptions& options, const std::string& name);

// The step itself, in place on `target` (a parameter, its f32 master, or a
// piece of either with the matching piece of the update): decoupled weight
// decay, then target -= lr * update.
void apply_muon_update(Tensor& target, const Tensor& update, double lr, double weight_decay);

// The momentum's step, momentum <- mu momentum + g: in the momentum's own
// type, or for a bf16 momentum in f32 (g f32), stored rounded. Returns the
// new momentum as computed (unrounded), which the update then uses.
Tensor advance_momentum(Tensor& momentum, const Tensor& g, double mu);

// A matrix Muon updates.
struct MuonMatrix {
  std::string name;
  // The full matrix's rows cut into matrices orthogonalised apart (a fused
  // [q | k | v] weight: three; SwiGLU's [gate | value]: two); empty: one.
  std::vector<int64_t> row_blocks;
};

// How matrices held as shards (tensor parallelism) get their updates:
// given the matrices' names (the same list, in the same order, on every
// rank sharing them), `u(i)` this rank's shard of matrix i's momentum term
// and `apply(i, update)` taking this rank's shard of its update. Each
// matrix is orthogonalised whole (tp::ShardedMuon). Unset: the parameters
// are whole matrices, each updated where it is (muon_update).
using MuonUpdater = std::function<void(const std::vector<std::string>& names,
                                       const std::function<Tensor(size_t)>& u,
                                       const std::function<void(size_t, const Tensor&)>& apply)>;

// Muon (MomentUm Orthogonalized by Newton-Schulz; Jordan et al. 2024, at
// scale Liu et al. 2025) for a model's hidden matrices: per step, with g the
// gradient times grad_scale,
//   m <- mu m + g;  u = g + mu m (Nesterov) or m;
//   O = orthogonalize(u), block by block of the full matrix;
//   p <- p (1 - lr wd) - lr scale(rows, cols) O.
// Embeddings, the output head, norms, biases and routers are AdamW's
// (callers give Muon the matrices alone). Half parameters step through f32
// masters, as AdamW's do; the momentum is f32.
class Muon {
 public:
  Muon(std::vector<std::pair<MuonMatrix, Tensor>> matrices, MuonOptions options,
       MuonUpdater updater = {});

  // One update with learning rate `lr`. Parameters without a gradient are
  // skipped (every rank sharing a matrix must agree). The gradients are
  // taken times `grad_scale` and not modified.
  void step(double lr, double grad_scale = 1.0);
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  const MuonOptions& options() const { return options_; }
  // The weight decay of the steps after (options.no_decay's matrices still
  // take none).
  void set_weight_decay(double weight_decay);

  struct State {
    MuonMatrix matrix;
    Tensor param;
    Tensor momentum;  // options.moment_dtype (f32 for half parameters by default)
    Tensor master;    // f32 master weights of a half parameter; undefined otherwise
  };
  std::vector<State>& state() { return state_; }
  // After masters were loaded (checkpoints): rounds them into the parameters.
  void sync_params_from_masters();

 private:
  MuonOptions options_;
  MuonUpdater updater_;
  std::vector<State> state_;
  int64_t step_ = 0;
};

}  // namespace triad::optim
