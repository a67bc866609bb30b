#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "triad/dist/process_group.h"
#include "triad/optim/adamw.h"
#include "triad/optim/muon.h"

namespace triad::dp {

// Data-parallel gradient reduction over contiguous flat buffers.
//
// Every parameter's .grad is a view into one flat buffer, laid out in the
// reverse of registration order (the order backward produces gradients) and
// cut into buckets of about bucket_bytes. A gradient-ready hook counts the
// accumulations into each parameter; once every parameter of a bucket has
// received all of its step's gradients (the counts are learned on the first
// step, so microbatches, tied weights and deferred weight gradients all work),
// the bucket's reduction starts asynchronously while backward continues.
// finish() waits for them all. No communication happens while earlier
// microbatches accumulate.
//
// `late` parameters are reduced in finish() only: those whose gradient is
// still changed after backward (tied embeddings summed across stages,
// sequence-parallel partial sums).
//
// With zero1, gradients are reduce-scattered instead: each rank receives the
// average of its 1/dp piece of each bucket, updates that piece of the
// parameters (ZeroAdamW) and all-gathers them. With overlap_param_gather the
// all-gathers are started and left running: the next forward pass waits for
// each bucket just before it reads the bucket's parameters (wait_gathered,
// through the model's parameter fence), so the gathers of later layers'
// parameters overlap the earlier layers' forward work.
//
// Each parameter starts at a multiple of kAlign elements, and under zero1
// each bucket spans a multiple of kAlign * dp, so every rank's piece has the
// same length (equal collectives) and an aligned start; the gaps are zeros
// that belong to no parameter.
// Parameters whose replicas are another group's ranks: a mixture's experts
// under expert parallelism, held by the expert-data-parallel group (dp / ep
// ranks). GradientReducer reduces their buckets over it (and, with zero1,
// shards them over it), their average divided by `divisor` more: each
// rank's gradient of an expert already sums the tokens of `divisor` ranks.
struct OtherReplicas {
  dist::ProcessGroupPtr group;
  std::set<std::string> names;
  double divisor = 1.0;
};

class GradientReducer {
 public:
  static constexpr int64_t kAlign = 16;  // elements: 64 bytes of f32 gradient

  using OtherReplicas = dp::OtherReplicas;
  GradientReducer(std::vector<std::pair<std::string, Tensor>> params, dist::ProcessGroupPtr group,
                  double bucket_bytes, bool zero1, std::set<std::string> late = {},
                  OtherReplicas others = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Waits for (and, for late or not-yet-learned buckets, starts) every
  // bucket's reduction. After this, gradients are averaged over the group
  // (zero1: this rank's pieces are).
  void finish();
  // Zeroes the flat gradient buffer (use instead of Module::zero_grad).
  void zero_grad();
  // Whether every reduction waits for finish() (default false): the hooks
  // still count each parameter's gradients but start no bucket. A backward
  // captured as a CUDA graph (train.cuda_graph) runs its hooks at the
  // capture only: where its groups' collectives cannot join the capture
  // (captures_reductions() false), its buckets are all reduced after each
  // replay, without overlapping the backward.
  void set_deferred(bool on) { deferred_ = on; }
  bool deferred() const { return deferred_; }
  // Whether every bucket's group captures collectives on device tensors
  // (ProcessGroup::captures_device_collectives: NCCL's). Then a captured
  // backward, with finish() inside the capture, is a graph whose every
  // replay reduces the buckets as the hooks started them, overlapping the
  // backward, and waits for them all.
  bool captures_reductions() const;
  // The microbatches of the next step (1 until set). The counts learned on
  // the first step are per its microbatches, so a step with another count
  // (a batch-size ramp) expects them scaled to its own.
  void set_microbatches(int64_t microbatches);
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Each bucket's span in the flat buffers, gaps included.
  std::vector<int64_t> bucket_lengths() const;
  // Buckets whose reduction the hooks started during backward, in the last
  // finished step (the others started in finish()).
  int launched_early_last_step() const { return early_last_step_; }
  bool zero1() const { return zero1_; }
  const dist::ProcessGroupPtr& group() const { return group_; }

  struct Segment {  // a parameter's elements inside this rank's piece of a bucket
    size_t param;
    int64_t param_offset;  // first element within the parameter
    int64_t flat_offset;   // first element in the flat buffers
    int64_t length;
  };
  // This rank's pieces (zero1) as segments of parameters.
  const std::vector<Segment>& shard_segments() const { return shard_; }
  const std::vector<std::pair<std::string, Tensor>>& params() const { return params_; }
  Tensor& flat_grads() { return flat_grad_; }
  Tensor& flat_params() { return flat_param_; }
  // zero1: all-gathers every bucket's updated pieces into the parameters.
  void gather_parameters();
  // zero1: all-gathers the flat gradient buffer's pieces of the buckets
  // holding parameters `params` (indices into params()) and waits: each
  // rank's piece (what it wrote there after the reduce-scatter) reaches
  // every rank, whose views then hold the whole tensors (ZeroAdamW's Muon
  // updates).
  void gather_gradients(const std::vector<size_t>& params);
  // zero1: starts every bucket's all-gather, the buckets holding the
  // first-registered parameters (the forward pass's first layers) first,
  // and returns. Each is waited for by wait_gathered or wait_gathers.
  void start_gather();
  // Waits for the all-gathers of the buckets holding `params` (tensors that
  // are not this reducer's parameters are ignored). Cheap when none is
  // pending.
  void wait_gathered(const std::vector<Tensor>& params);
  // Waits for every pending all-gather: before anything reads all the
  // parameters (a checkpoint, an export) and before the optimizer writes
  // them. finish() and the destructor call it.
  void wait_gathers();
  // Buckets whose all-gather was started and not yet waited for.
  int pending_gathers() const { return pending_gathers_; }
  // Buckets whose all-gather wait_gathered waited for (a forward pass
  // reaching their parameters) before the last finish(); the rest were
  // waited for there.
  int gathers_waited_by_parts_last_step() const { return parts_last_step_; }
  // Whether ZeroAdamW::step leaves its all-gathers running (start_gather)
  // instead of waiting for them (gather_parameters). Default false.
  void set_overlap_param_gather(bool on) { overlap_gather_ = on; }
  bool overlap_param_gather() const { return overlap_gather_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element range in the flat buffers
    std::vector<size_t> params;
    bool late = false;
    int pending = 0;              // parameters still waiting for gradients this step
    dist::ProcessGroupPtr group;  // the replicas it reduces over
    double scale = 1.0;           // the gradients' factor before the reduction
    dist::WorkPtr work;
    dist::WorkPtr gather;  // zero1: the parameters' all-gather, until waited for
  };
  void wait_gather(Bucket& b);
  void on_ready(size_t param);
  void launch(Bucket& b);
  int64_t piece_length(const Bucket& b) const;  // zero1: each rank's, equal
  int64_t piece_begin(const Bucket& b) const;   // zero1: this rank's

  std::vector<std::pair<std::string, Tensor>> params_;
  dist::ProcessGroupPtr group_;
  bool zero1_;
  Tensor flat_grad_, flat_param_;
  std::vector<int64_t> offset_;  // per parameter, in the flat buffers
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> expected_, seen_;  // accumulations per step
  std::vector<int64_t> learned_counts_;   // on the first step, of learned_micro_ microbatches
  int64_t microbatches_ = 1, learned_micro_ = 1;
  bool learned_ = false;
  int launched_early_ = 0;
  int early_last_step_ = 0;
  std::vector<Segment> shard_;
  std::shared_ptr<void> hook_target_;
  std::unordered_map<int64_t, size_t> param_at_;  // offset in the flat buffers -> parameter
  int pending_gathers_ = 0;
  int waited_by_parts_ = 0, parts_last_step_ = 0;
  bool overlap_gather_ = false;
  bool deferred_ = false;
};

// AdamW over this rank's ZeRO-1 pieces: moments exist only for those
// elements (optimizer memory / dp), weight decay per parameter as in AdamW.
//
// With Muon's matrices (`muon`, by parameter name; train.optimizer muon),
// those parameters' pieces keep Muon's momentum instead of AdamW's two
// moments. A step updates every rank's momentum pieces, all-gathers the
// resulting Nesterov updates over the data-parallel ranks (one all-gather of
// the buckets holding matrices, as large as the parameters' own), and each
// rank orthogonalises only the matrices its pieces touch (about 1/dp of
// them), then updates its pieces.
class ZeroAdamW {
 public:
  // `updater`: how shards of matrices get their updates (optim::MuonUpdater;
  // tensor parallelism), called with the matrices this rank's pieces touch.
  ZeroAdamW(GradientReducer& reducer, optim::AdamWOptions options,
            std::map<std::string, optim::MuonMatrix> muon = {},
            optim::MuonOptions muon_options = {}, optim::MuonUpdater updater = {});
  // grad_scale multiplies each gradient (gradient clipping's coefficient)
  // as AdamW::step's does. Muon's matrices step with `muon_lr` (< 0: lr).
  void step(double lr, double grad_scale = 1.0, double muon_lr = -1);
  // The weight decay of the steps after, AdamW's and Muon's (the
  // parameters that take none still take none).
  void set_weight_decay(double weight_decay);
  int64_t state_elements() const { return m_.defined() ? m_.numel() : 0; }
  // For checkpoints: the moments over this rank's pieces and the step count.
  // m() covers every piece (Muon's momentum on a matrix's), v() AdamW's
  // pieces alone, in order; both of options.moment_dtype (f32 or bf16,
  // Muon's momentum alike).
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  // Where each of shard_segments() lies in m() (and master()) and in v()
  // (-1: a Muon matrix's piece, none).
  struct Place {
    int64_t m_at = 0, v_at = -1;
  };
  const std::vector<Place>& places() const { return places_; }
  bool is_muon(size_t param) const { return muon_.count(param) > 0; }
  // f32 master weights of this rank's pieces under mixed precision
  // (undefined for f32 parameters).
  Tensor& master() { return master_; }
  // After masters were loaded: rounds them into the parameters and gathers.
  void sync_params_from_masters();
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }

 private:
  void muon_step(double lr, double grad_scale);

  GradientReducer& reducer_;
  optim::AdamWOptions options_;
  std::map<size_t, optim::MuonMatrix> muon_;  // by parameter index
  optim::MuonOptions muon_options_;
  optim::MuonUpdater updater_;
  Tensor m_, v_;  // over the concatenated shard segments (v_: AdamW's alone)
  Tensor master_;
  std::vector<Place> places_;
  int64_t step_ = 0;
};

}  // namespace triad::dp
