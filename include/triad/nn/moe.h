#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "triad/nn/gpt.h"
#include "triad/nn/linear.h"
#include "triad/nn/module.h"

namespace triad::nn {

// Top-k routing of N tokens among E experts, from the router's scores
// (N, E): where each token goes, and the rows of the experts' batch that
// carry it there. route_top_k decides it on the host; route_chosen builds it
// from choices a backend made where the scores are (Backend::route_top_k).
struct Routing {
  int64_t tokens = 0, experts = 0, top_k = 0;
  // (N, k) row-major: token n's j-th expert, most probable first (equal
  // probabilities: the lower index first).
  std::vector<int64_t> choice;
  // The experts' batch, one entry per row: rows grouped by expert (expert
  // 0's first), each group in token order. Row r computes token token[r]'s
  // output for assignment assignment[r] (n * k + j). An expert no token
  // chose gets one padding row instead, token 0 with assignment N * k, whose
  // gate is 0: every expert's weights then take a gradient (zeros) on every
  // micro-batch, which the data-parallel reducer counts on.
  std::vector<int64_t> token, assignment;
  std::vector<int64_t> rows;  // (E) each expert's rows in the batch, >= 1
  std::vector<int64_t> load;  // (E) assignments each expert received (dropped ones too)
  int64_t dropped = 0;        // assignments over their expert's capacity, without a row
};
// What shapes a token's choice besides its scores (GptConfig::Moe): a bias
// per expert added to the scores for choosing only (expert_bias; empty:
// none), and group-limited routing, the token's top_k taken among the
// experts of its top_groups best groups of `groups` equal, contiguous ones,
// a group scored by the sum of its group_best best biased scores. Equal
// scores: the lower index first.
struct ExpertChoice {
  std::vector<double> bias;
  int64_t groups = 1, top_groups = 1;
  // How many of a group's best choosing scores make its score (summed): 2
  // (DeepSeek-V3's), or 1 (its best, DeepSeek-V2's); at most the group's
  // size.
  int64_t group_best = 2;
};
// With a capacity (> 0), an expert keeps at most that many of its
// assignments (`policy`: the most probable, equal ones the earlier token's,
// or the earliest tokens'), in token order; the others get no row, and
// their gates weigh nothing. 0: dropless.
// Throws ValueError naming the values unless probs holds tokens * experts
// finite numbers, 1 <= top_k <= experts, capacity >= 0 and `choice` holds
// no bias or experts finite ones, and groups that divide the experts, of
// which top_groups hold at least top_k experts, scored by group_best >= 1.
Routing route_top_k(const std::vector<double>& probs, int64_t tokens, int64_t experts,
                    int64_t top_k, int64_t capacity = 0,
                    GptConfig::Moe::DropPolicy policy = GptConfig::Moe::DropPolicy::Probs,
                    const ExpertChoice& choice = {});
// The routing of N tokens whose choice (N * k: each token's experts, best
// first) was made elsewhere (Backend::route_top_k, on the scores' device):
// route_top_k's for the same choice. Under a capacity that drops the least
// probable, `chosen` (N * k, as choice) holds each choice's score, which
// ranks an expert's assignments. Throws ValueError unless each choice is
// one of the experts, capacity >= 0 and `chosen` is there when needed.
Routing route_chosen(std::vector<int64_t> choice, int64_t tokens, int64_t experts, int64_t top_k,
                     int64_t capacity = 0,
                     GptConfig::Moe::DropPolicy policy = GptConfig::Moe::DropPolicy::Probs,
                     const std::vector<double>& chosen = {});
// `r` with only the assignments `keep` flags (N * k of them, indexed n * k +
// j) given rows: a capacity decided elsewhere (context parallelism's whole
// micro-batch). The others count as dropped; an expert left without a row
// gets the padding row.
Routing keep_assignments(const Routing& r, const std::vector<char>& keep, int64_t tokens,
                         int64_t top_k);
// An expert's capacity for `tokens` tokens under a capacity factor:
// ceil(factor * tokens * top_k / experts), at least 1; 0 (dropless) for a
// factor of 0.
int64_t expert_capacity(double factor, int64_t tokens, int64_t experts, int64_t top_k);

// The load-balancing loss of one layer's routing, E * sum_e f_e P_e: f_e
// the share of the N * k assignments that expert e received, P_e the mean
// of the router's probability for e over the N tokens (probs (N, E) on the
// host). 1 when perfectly balanced, E / k when every token goes to the same
// k experts with certainty. With `sequence` > 0 (a divisor of N), the mean
// of that loss over each run of `sequence` tokens (GptConfig::Moe::
// BalanceScope::Sequence).
double balance_loss(const Routing& routing, const std::vector<double>& probs, int64_t sequence = 0);
// The same from each sequence's summed probabilities instead: sums (S, E)
// row-major, sums[s * E + e] expert e's probabilities summed over
// sequence s's tokens (the whole micro-batch's with `sequence` 0).
double balance_loss_of_sums(const Routing& routing, const std::vector<double>& sums,
                            int64_t sequence = 0);
// The same from each sequence's assignment counts instead of a routing:
// counts (S, E) row-major, counts[s * E + e] the assignments expert e
// received from sequence s's `sequence` tokens (each choosing top_k) of
// E = experts, and sums as above. balance_loss_of_sums adds in this order.
double balance_loss_of_counts(const std::vector<double>& counts, const std::vector<double>& sums,
                              int64_t sequence, int64_t top_k, int64_t experts);

// Auxiliary-loss-free balancing's step for one layer (GptConfig::Moe::
// expert_bias): each of its E biases moves by `rate` towards balance, up
// where load[e] is under the mean of the E loads, down where over, and
// stays where equal (Wang et al., 2024: b_e += rate * sign(mean - load_e)).
// `bias` (E) is updated in place on its device; throws ValueError unless
// load holds E finite counts.
void update_expert_bias(Tensor& bias, const std::vector<double>& load, double rate);

// Whether `name` is a mixture's state rather than a weight: its expert
// biases ("h.3.mlp.expert_bias", a prediction module's likewise), f32
// under any precision and never trained by the optimizer.
bool is_moe_state(const std::string& name);

// What the mixture-of-experts layers of a model report while training (a
// trainer passes one through nn::ForwardContext::moe_stats and reads it
// after the step): per layer and micro-batch, the load-balancing loss, the
// busiest expert's load and the share of assignments dropped.
struct MoeStats {
  double balance_sum = 0;  // the records' balance_loss, summed
  // The largest expert load over the records, as a multiple of the
  // balanced one (E times its share of the assignments; 1: balanced).
  double max_load = 0;
  double dropped_sum = 0;  // the records' dropped shares of their assignments, summed
  double z_loss_sum = 0;   // the records' router z-losses, summed (model.moe.z_loss_coef)
  int64_t records = 0;
  // Per MoE layer (by its index in the model), the assignments each expert
  // received, summed over the records (what update_expert_bias reads once
  // the step's are summed over every rank).
  std::map<int64_t, std::vector<double>> loads;
  void record(double balance, double load, double dropped = 0, double z_loss = 0);
  void add_loads(int64_t layer, const std::vector<int64_t>& load);
  // A layer's routing counted where it ran (model.moe.pad_to_capacity):
  // counts (S, E) of `sequence` tokens each choosing top_k, the summed
  // probabilities (S, E) and the z-loss (0 without one), recorded as the
  // layer records a routing it read; capacity 0: dropless.
  void record_counts(int64_t layer, const std::vector<double>& counts,
                     const std::vector<double>& sums, double z_loss, int64_t sequence,
                     int64_t top_k, int64_t experts, int64_t capacity);
  // The same left on the device, where a CUDA graph's replays write it
  // (model.moe.pad_to_capacity inside train.cuda_graph, or in a step under
  // a cuda::DeviceChecks): counts (S, E) i64, sums (S, E) and z (one
  // element; undefined without a z-loss). settle() reads them all in one
  // copy and records them; a reader of the fields above calls it first.
  // In two halves, for a caller that reads them with its own values in one
  // wait: pending_values() gives them as one f64 tensor on their device
  // (undefined when nothing is pending), settle(values) takes that
  // tensor's values, read. Either throws ValueError naming the layer when
  // some of its tokens chose no expert (a router's scores not finite, which
  // the host's routing reports as it reads them), and ValueError unless
  // `values` are pending_values()' count.
  struct Pending {
    int64_t layer = 0, sequence = 1, top_k = 1, capacity = 1;
    Tensor counts, sums, z;
  };
  std::vector<Pending> pending;
  Tensor pending_values() const;
  void settle(const std::vector<double>& values);
  void settle();
  double mean_balance() const { return records ? balance_sum / static_cast<double>(records) : 0; }
  double mean_dropped() const { return records ? dropped_sum / static_cast<double>(records) : 0; }
  double mean_z_loss() const { return records ? z_loss_sum / static_cast<double>(records) : 0; }
};

// Where a mixture's experts run: all on this rank (no placement), or
// spread over the ranks of an expert-parallel group, each holding a
// contiguous block of them (parallel/expert/dispatch.h moves each expert's
// rows to its rank and the outputs back).
class ExpertPlacement {
 public:
  virtual ~ExpertPlacement() = default;
  // The experts this rank holds: [first(), first() + count()).
  virtual int64_t first() const = 0;
  virtual int64_t count() const = 0;
  // The outputs for `rows` (M, C), grouped by expert (per_expert[e] rows
  // for each of the E experts, in order; each at least 1), in their order.
  // `expert(i, x, keys)` runs this rank's i-th expert on the rows x it is
  // given (this rank's rows for it and, over a group, the other ranks'),
  // `keys` theirs of `keys` (i64 (M), each row's assignment_key, which go
  // where their rows go) or undefined without them. Every rank of a group
  // passes keys, or none does. `padded` (model.moe.pad_to_capacity): every
  // rank of the group passes the same per_expert (each expert's capacity),
  // which then needs no exchange, so nothing waits for the host and the
  // call can be captured in a CUDA graph (keys too).
  using RunExpert = std::function<Tensor(int64_t, const Tensor&, const Tensor&)>;
  virtual Tensor run(const Tensor& rows, const std::vector<int64_t>& per_expert, const Tensor& keys,
                     const RunExpert& expert, bool padded) const = 0;
};

// A mixture-of-experts MLP (GptConfig::Moe): router.weight (E, C) and
// with model.moe.expert_bias expert_bias (E, f32, state: see
// Module::register_state), experts.<e>.c_fc.weight (fc, C),
// experts.<e>.c_proj.weight (C, F), each
// expert an MLP of the model's activation without biases, stored (out,
// in); a shared expert's shared.c_fc.weight and shared.c_proj.weight, and
// its gate's shared_gate.weight (1, C). Each token's output is the sum over its top_k experts of
// gate * expert(x), the gates the router's scores (f32; renormalised over the k chosen with
// normalize_top_k, times routed_scaling_factor). The experts are chosen by
// the scores plus the expert biases, within the top groups
// (route_top_k's ExpertChoice). While training, the layer's load-balancing loss (balance_loss,
// differentiable through P) joins the objective with weight aux_loss_coef * ctx.loss_grad
// (attach_loss), as does the router z-loss (mean over the tokens of
// logsumexp(logits)^2) with weight z_loss_coef * ctx.loss_grad; its routing
// is reported to ctx.moe_stats.
//
// Under tensor parallelism each of `shards` ranks holds 1/shards of every
// expert's hidden units (c_fc's rows, by gate and up half when gated, and
// c_proj's columns) and the whole router: experts() then returns this
// rank's partial sum, which the caller reduces over the group. Under expert
// parallelism (`placement`) the rank holds only its block of the experts
// (under their global names) and runs them on every rank's rows for them.
//
// Where the routing runs: on the scores' device, the host reading back the
// choices once a layer (the rows' counts size the experts' products);
// inside a CUDA graph's capture or a cuda::DeviceChecks (the trainer's
// uncaptured steps on a GPU), nothing is read: a mixture padded to its
// capacity fills fixed slots (Backend::capacity_slots), a dropless one
// groups its rows on the device (Backend::dropless_rows) and sizes its
// experts' products there (grouped_linear's offsets), its statistics left
// in MoeStats::pending (under context parallelism its counts added over the
// group there, Chunks::gather_rows). The dropless one needs every expert
// here and experts whose adapters drop nothing out (each expert draws its
// own masks); inside a capture, without them, experts() throws
// NotSupportedError naming what it has.
//
// LoRA (model.lora.targets mlp.c_fc, mlp.c_proj; GptConfig::lora_modules):
// each expert's layers and the shared expert's carry adapters of their own,
// split with them over the `shards` ranks (c_fc's B by rows, c_proj's A by
// columns; this rank holds shard `shard`), c_proj's dropout masks drawn by
// feature so that the shards draw the whole layer's.
class MoeMlp : public Module {
 public:
  MoeMlp(const GptConfig& cfg, int64_t layer, int64_t shards = 1,
         std::shared_ptr<const ExpertPlacement> placement = nullptr, int64_t shard = 0);
  // Every expert of the layer (E), held here or not.
  int64_t num_experts() const { return experts_total_; }
  // What decides where x's tokens go and how much each part counts: the
  // router's scores for the experts (N, E), softmax (or, with model.moe.score
  // sigmoid, the sigmoid) of x @ router^T, and with a gated shared expert
  // its gate (N, 1), sigmoid of x @ shared_gate^T; in f32 (f64 for f64 x).
  struct Scores {
    Tensor probs;        // the scores: probabilities under a softmax
    Tensor shared_gate;  // undefined without model.moe.shared_gate
    Tensor logits;       // the router's (N, E), for the z-loss; undefined without one
  };
  // For x (..., C) as N tokens.
  Scores route(const Tensor& x) const;
  // Applied to the gates (the N * k + 1 values, the padding's 0 last, (N * k
  // + 1, 1), and the shared expert's gate) before they weigh the experts'
  // outputs: tensor parallelism all-reduces their gradient there, of which
  // each rank's partial outputs give only a part.
  using GateHook = std::function<Tensor(const Tensor&)>;
  // The experts' weighted outputs for tokens x (..., C), N of them, routed
  // by `scores` (route's, of these tokens), plus the shared expert's: x's
  // shape.
  Tensor experts(const Tensor& x, const Scores& scores, const ForwardContext& ctx,
                 const GateHook& gate = {}) const;
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const {
    return experts(x, route(x), ctx);
  }
  // Context parallelism: each of `parts` ranks routes its chunk of every
  // sequence, and `sum` adds a host vector over them in place (every rank
  // calls it alike). The load-balancing loss then counts the assignment
  // shares f over the whole micro-batch (each sequence's whole, per
  // sequence), and each rank's part of the loss holds its own tokens'
  // probabilities: E/S sum f * (its chunk's mean probabilities), whose mean
  // over the ranks is the whole loss, the data-parallel mean taking it.
  // The balance reported is the whole micro-batch's.
  // An expert capacity (model.moe.capacity_factor) chooses among the whole
  // micro-batch's assignments, as one process's does: every rank gathers
  // every chunk's choices and their scores (`gather`: each rank's
  // equal-length host vector, concatenated in rank order), routes the
  // micro-batch's tokens in the sequences' order under the micro-batch's
  // capacity, and keeps the surviving assignments of its own chunk (rank
  // `rank` of `parts`).
  struct Chunks {
    int64_t parts = 1;
    std::function<void(std::vector<double>&)> sum;
    int64_t rank = 0;
    std::function<std::vector<double>(const std::vector<double>&)> gather = {};
    // Which tokens of a row of T rank r holds, as runs (first position,
    // count) in the order it holds them (context parallelism's layout,
    // cp::chunk_runs: the balanced one's half-chunks r and 2P - 1 - r, the
    // hierarchical one's); unset: its P-th r.
    std::function<std::vector<std::pair<int64_t, int64_t>>(int64_t T, int64_t r)> runs = {};
    // model.moe.pad_to_capacity: every rank's (A, B, W) tensor gathered
    // along dim 1 in rank order, (A, P B, W), its gradient summed back
    // over the ranks (each takes its own part): the micro-batch's tokens and
    // probabilities, which every rank routes whole, and the experts' outputs,
    // each rank running a P-th of every expert's slots. Unset: padding under
    // context parallelism is refused.
    std::function<Tensor(const Tensor&)> gather_rows = {};
    // gather_rows' (A, P B, W) of the ranks' tokens (B each of a row of P B)
    // -> the rows in their sequences' order (cp::to_sequence_order).
    std::function<Tensor(const Tensor&)> sequence_order = {};
  };
  void set_chunks(Chunks chunks) { chunks_ = std::move(chunks); }

 private:
  struct Expert {
    std::shared_ptr<Linear> c_fc, c_proj;
  };
  Tensor expert_forward(const Expert& e, const Tensor& x, const DropoutDraw& draw) const;
  // Whether this rank's experts run as two grouped products
  // (grouped_linear) over their rows: without adapters or biases, and an
  // activation other than GPT-2's GELU (whose products fuse it in).
  bool grouped_experts() const;
  // Whether every expert of this rank is its two weights alone (no
  // adapters, no biases): what grouped products need.
  bool groupable() const;
  // Whether this rank's experts run as grouped products sized on the
  // device (a dropless mixture's there): no biases, and adapters only
  // where they drop nothing out (their dropout, drawn by expert, is not
  // grouped), as while `training` they would.
  bool device_groupable(bool training) const;
  // The routing of the N tokens whose scores are probs (N, E) under
  // `capacity` (0: dropless): chosen on probs' device (the expert biases
  // and groups as configured), the host reading only the choices (and,
  // under a capacity, their scores), and with them (in the same read) each
  // of `also`'s values into *also_host, in order. Under context parallelism
  // a capacity is the whole micro-batch's (x's rows hold `chunk` tokens of
  // each sequence; route_chunk_under_capacity).
  Routing route_on_device(const Tensor& probs, int64_t capacity, int64_t chunk,
                          const std::vector<Tensor>& also = {},
                          std::vector<std::vector<double>>* also_host = nullptr) const;
  // The same keys formed on the device from each slot's assignment
  // (slot_assignment, i64 on the device; a padded mixture's, which holds
  // every token in order: no pieces), the padding's assignment N k keyed
  // as N k - 1 as the host keys it. With draw.calls (inside a capture) the
  // call is draw.call plus the count there, each replay's own.
  Tensor device_assignment_keys(const Tensor& slot_assignment, int64_t N,
                                const DropoutDraw& draw) const;
  // The rows' keys (nn::assignment_key) of `routing` of N tokens, held as
  // draw.pieces of the micro-batch's sequences or all of them in order: i64
  // (rows) on `device`.
  Tensor assignment_keys(const Routing& routing, int64_t N, const DropoutDraw& draw,
                         Device device) const;
  // Context parallelism with a capacity: this rank's chunk's routing (the
  // choices of its N tokens, `chunk` of each sequence, and their scores,
  // empty when the drop policy ranks by token) under the whole
  // micro-batch's `capacity` (Chunks).
  Routing route_chunk_under_capacity(std::vector<int64_t> choice, const std::vector<double>& chosen,
                                     int64_t chunk, int64_t capacity) const;
  std::shared_ptr<Linear> router_;
  Tensor expert_bias_;                   // (E) f32, model.moe.expert_bias; undefined without
  std::vector<Expert> experts_;          // this rank's, from placement_->first()
  std::optional<Expert> shared_;         // model.moe.shared_ffn_hidden_size
  std::shared_ptr<Linear> shared_gate_;  // model.moe.shared_gate
  std::shared_ptr<const ExpertPlacement> placement_;
  int64_t experts_total_;
  int64_t top_k_;
  bool normalize_;
  double aux_coef_;
  double z_coef_;
  double capacity_factor_;
  GptConfig::Moe::DropPolicy drop_policy_;
  GptConfig::Moe::Score score_;
  double routed_scale_;
  int64_t groups_, top_groups_, group_best_;  // group_best_: ExpertChoice::group_best
  GptConfig::Moe::BalanceScope balance_scope_;
  int64_t layer_;
  Activation activation_;
  bool keyed_dropout_ = false;  // the routed experts' adapters drop their input out
  bool pad_ = false;            // model.moe.pad_to_capacity
  Chunks chunks_;
};

}  // namespace triad::nn
