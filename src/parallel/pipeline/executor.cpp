#include "triad/parallel/pipeline/executor.h"

#include "triad/backend/backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <set>
#include <tuple>

#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/core/nvtx.h"
#include "triad/nn/documents.h"
#include "triad/nn/evaluate.h"
#include "triad/nn/moe.h"
#include "triad/ops.h"
#include "triad/optim/clip.h"
#include "triad/parallel/pipeline/stage_balance.h"

namespace triad::pipeline {

std::string chunk_category(ComputeKind kind, int chunk) {
  const char* k = kind == ComputeKind::Forward          ? "forward"
                  : kind == ComputeKind::BackwardWeight ? "weight-grad"
                                                        : "backward";
  return std::string(k) + " c" + std::to_string(chunk);
}

namespace {

// A payload between stages whole, or (scatter-gather) as this TP rank's
// 1/t of it, the receiving stage's TP ranks all-gathering the pieces.
class StageTransfer {
 public:
  StageTransfer(dist::ProcessGroupPtr tp, bool split) : tp_(std::move(tp)), split_(split) {}
  bool splits(const Shape& s) const { return split_ && numel(s) % tp_->size() == 0; }
  // What to send of a payload.
  Tensor outgoing(const Tensor& t) const {
    Tensor c = contiguous(t).detach();
    if (!splits(c.shape())) return c;
    const int64_t part = c.numel() / tp_->size();
    return contiguous(narrow(reshape(c, {c.numel()}), 0, tp_->rank() * part, part)).detach();
  }
  // Where to receive a payload of `shape`.
  Tensor incoming(const Shape& shape, DType dtype, Device device) const {
    return empty(splits(shape) ? Shape{numel(shape) / tp_->size()} : shape, dtype, device);
  }
  // The payload from what was received into incoming()'s buffer.
  Tensor whole(const Tensor& received, const Shape& shape) const {
    if (received.shape() == shape) return received;
    Tensor all = empty({numel(shape)}, received.dtype(), received.device());
    tp_->all_gather(received, all)->wait();
    return reshape(all, shape).detach();
  }

 private:
  dist::ProcessGroupPtr tp_;
  bool split_;
};

}  // namespace

std::vector<std::vector<int64_t>> split_layers(int64_t n_layer, int pp, int vpp) {
  if (pp < 1 || vpp < 1) throw ConfigError("parallel.pp and parallel.vpp must be >= 1");
  if (pp > n_layer) {
    throw ConfigError("parallel.pp (" + std::to_string(pp) + ") must not exceed model.n_layer (" +
                      std::to_string(n_layer) + ")");
  }
  const int64_t stages = static_cast<int64_t>(pp) * vpp;
  if (n_layer % stages != 0) {
    throw ConfigError("model.n_layer (" + std::to_string(n_layer) +
                      ") must be divisible by parallel.pp * parallel.vpp (" + std::to_string(pp) +
                      " * " + std::to_string(vpp) + " = " + std::to_string(stages) + ")");
  }
  std::vector<std::vector<int64_t>> out(stages);
  const int64_t per = n_layer / stages;
  for (int64_t s = 0; s < stages; ++s) {
    for (int64_t i = 0; i < per; ++i) out[s].push_back(s * per + i);
  }
  return out;
}

std::vector<std::vector<int64_t>> split_layers(int64_t n_layer, int pp, int vpp,
                                               const std::vector<int64_t>& counts) {
  if (counts.empty()) return split_layers(n_layer, pp, vpp);
  const int64_t stages = static_cast<int64_t>(pp) * vpp;
  check_stage_layers(counts, stages, n_layer);
  std::vector<std::vector<int64_t>> out(stages);
  int64_t next = 0;
  for (int64_t s = 0; s < stages; ++s) {
    for (int64_t i = 0; i < counts[s]; ++i) out[s].push_back(next++);
  }
  return out;
}

PipelineModel::PipelineModel(const nn::GptConfig& cfg, uint64_t seed, PipelineGroups groups,
                             bool sequence_parallel, int vpp, std::vector<int64_t> stage_layers,
                             Placement placement)
    : cfg_(cfg),
      groups_(std::move(groups)),
      p_(groups_.pp->size()),
      v_(vpp),
      rank_(groups_.pp->rank()),
      placement_(placement) {
  if (p_ < 2)
    throw ConfigError("a pipeline needs parallel.pp >= 2 (got " + std::to_string(p_) + ")");
  if (placement_ == Placement::V && v_ != 2) {
    throw ConfigError(
        "the V placement (parallel.schedule 'zb-v') holds two chunks per rank: "
        "parallel.vpp must be 2 (got " +
        std::to_string(v_) + ")");
  }
  layers_ = split_layers(cfg.n_layer, p_, v_, stage_layers);
  const auto& layers = layers_;
  for (int c = 0; c < v_; ++c) {
    const int stage = stage_of(c);
    tp::StagePlan plan;
    plan.layers = layers[stage];
    plan.embedding = stage == 0;
    plan.head = stage == num_stages() - 1;
    // The V placement's rank 0 holds the first stage (chunk 0, built
    // already) and the last: a tied head there is the embedding itself.
    const bool share = plan.head && !plan.embedding && cfg.head_reads_token_embedding() &&
                       rank_at(placement_, p_, 0) == rank_;
    chunks_.push_back(share ? std::make_shared<tp::TensorParallelGpt>(
                                  cfg, seed, groups_.tp, sequence_parallel, plan,
                                  chunks_.front()->token_embedding_module(), groups_.ep, groups_.cp,
                                  groups_.cp_exchange, groups_.cp_hierarchy)
                            : std::make_shared<tp::TensorParallelGpt>(
                                  cfg, seed, groups_.tp, sequence_parallel, plan, groups_.ep,
                                  groups_.cp, groups_.cp_exchange, groups_.cp_hierarchy));
  }
}

std::vector<std::pair<std::string, Tensor>> PipelineModel::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> seen;
  for (const auto& c : chunks_) {
    for (auto& np : c->named_parameters()) {
      if (seen.insert(np.first).second) out.push_back(np);
    }
  }
  return out;
}

DType PipelineModel::dtype() const {
  const auto params = chunks_.front()->named_parameters();
  return params.empty() ? DType::F32 : params.front().second.dtype();
}

Device PipelineModel::device() const {
  const auto params = chunks_.front()->named_parameters();
  return params.empty() ? Device::cpu() : params.front().second.device();
}

void PipelineModel::to(DType dtype) {
  for (const auto& c : chunks_) c->to(dtype);
}

void PipelineModel::to(Device device) {
  for (const auto& c : chunks_) c->to(device);
}

void PipelineModel::zero_grad() const {
  for (const auto& c : chunks_) c->zero_grad();
  head_grad_.reset();
}

bool PipelineModel::head_shares_token_embedding(int chunk) const {
  const tp::TensorParallelGpt& c = *chunks_.at(static_cast<size_t>(chunk));
  return chunk > 0 && c.plan().head && c.holds_token_embedding() &&
         chunks_.front()->holds_token_embedding() &&
         &c.token_embedding().impl() == &chunks_.front()->token_embedding().impl();
}

void PipelineModel::swap_head_grad() const {
  std::swap(chunks_.front()->token_embedding().impl().grad, head_grad_);
}

void PipelineModel::join_head_grad() const {
  if (!head_grad_) return;
  TensorImpl& w = chunks_.front()->token_embedding().impl();
  if (!w.grad) {
    w.grad = std::move(head_grad_);
  } else {
    autograd::NoGradGuard ng;
    Tensor total(w.grad);
    backend_for(total).accumulate(Tensor(head_grad_), total);
  }
  head_grad_.reset();
}

bool PipelineModel::ties_embedding_across_ranks() const {
  // (An untied head without prediction modules: nothing shared.)
  return cfg_.head_reads_token_embedding() &&
         rank_at(placement_, p_, 0) != rank_at(placement_, p_, num_stages() - 1);
}

void PipelineModel::reduce_tied_embedding_grads() const {
  if (!groups_.embedding || !ties_embedding_across_ranks()) return;
  for (const auto& c : chunks_) {
    if (!c->plan().embedding && !c->plan().head) continue;
    if (!c->token_embedding().requires_grad()) continue;  // frozen (train.freeze) on every stage
    Tensor g = c->token_embedding().grad();
    if (!g.defined()) {
      g = zeros(c->token_embedding().shape(), c->token_embedding().grad_dtype(),
                c->token_embedding().device());
      Tensor w = c->token_embedding();
      w.set_grad(g);
    }
    groups_.embedding->all_reduce(g, dist::ReduceOp::Sum)->wait();
  }
}

double PipelineModel::clip_grad_norm(double max_norm) const {
  const double norm = grad_norm();
  const double coef = optim::clip_coefficient(norm, max_norm);
  if (coef < 1.0) {
    autograd::NoGradGuard ng;
    for (const auto& [name, p] : named_parameters()) {  // a shared tensor once
      Tensor g = p.grad();
      if (g.defined()) scale_(g, coef);
    }
  }
  return norm;
}

double PipelineModel::grad_norm() const {
  return norm(/*of_grads=*/true);
}

double PipelineModel::param_norm() const {
  return norm(/*of_grads=*/false);
}

double PipelineModel::norm(bool of_grads) const {
  return std::sqrt(item(norm_squares(of_grads, nullptr)));
}

Tensor PipelineModel::grad_norm_squared() const {
  return norm_squares(/*of_grads=*/true, nullptr);
}

Tensor PipelineModel::norm_squares(bool of_grads, const optim::NormGroups* groups) const {
  // Summed on the device over chunks and stages (its callers read it once).
  Tensor t;
  for (const auto& c : chunks_) {
    const bool count_embedding = !c->plan().head || c->plan().embedding;
    Tensor sq = groups     ? c->norm_squares(*groups, of_grads, count_embedding)
                : of_grads ? c->grad_norm_squared(count_embedding)
                           : c->param_norm_squared(count_embedding);
    t = t.defined() ? add(t, sq).detach() : sq;
  }
  groups_.pp->all_reduce(t, dist::ReduceOp::Sum)->wait();
  return t;
}

nn::StateDict PipelineModel::full_state_dict() const {
  autograd::NoGradGuard ng;
  // Every rank gathers its TP shards, then each pipeline rank broadcasts its
  // tensors to the others in stage order (names and shapes are known to all).
  nn::StateDict local;
  for (const auto& c : chunks_) {
    for (auto& [name, t] : c->full_state_dict()) local[name] = t;
  }
  nn::StateDict out;
  for (int stage = 0; stage < num_stages(); ++stage) {
    const int owner = rank_at(placement_, p_, stage);
    // The last stage's copy of the tied wte is the first stage's (an untied
    // head's lm_head is the last stage's own).
    const auto names = nn::gpt_parameter_shapes(cfg_, layers_[stage], stage == 0, stage == 0,
                                                stage == num_stages() - 1);
    for (const auto& [name, shape] : names) {
      // Every rank's buffer on the model's device, so a device-routed group
      // sends all of them the same way.
      Tensor t = owner == rank_ ? contiguous(local.at(name)).detach()
                                : empty(shape, tensor_dtype(name), device());
      groups_.pp->broadcast(t, owner)->wait();
      out[name] = t;
    }
  }
  return out;
}

DType PipelineModel::tensor_dtype(const std::string& name) const {
  return nn::is_moe_state(name) ? DType::F32 : dtype();
}

std::vector<std::pair<std::string, Shape>> PipelineModel::gather_order() const {
  std::vector<std::pair<std::string, Shape>> out;
  for (int stage = 0; stage < num_stages(); ++stage) {
    // The tied wte is the first stage's (as in full_state_dict).
    for (auto& entry : nn::gpt_parameter_shapes(cfg_, layers_[stage], stage == 0, stage == 0,
                                                stage == num_stages() - 1)) {
      out.emplace_back(entry);
    }
  }
  return out;
}

void PipelineModel::gather_each(
    bool group_saves, bool pipeline_saves,
    const std::function<void(const std::string&, const Tensor&)>& take) const {
  autograd::NoGradGuard ng;
  if (!group_saves) return;
  constexpr int kRoot = 0;
  // An error of `take` waits until the other ranks' sends are received.
  std::exception_ptr error;
  auto give = [&](const std::string& name, const Tensor& t) {
    if (error) return;
    try {
      take(name, t);
    } catch (...) {
      error = std::current_exception();
    }
  };
  for (int stage = 0; stage < num_stages(); ++stage) {
    const int owner = rank_at(placement_, p_, stage);
    if (owner != rank_ && (!pipeline_saves || rank_ != kRoot)) continue;
    const tp::TensorParallelGpt* chunk = nullptr;
    for (int c = 0; c < v_; ++c) {
      if (stage_of(c) == stage) chunk = chunks_[static_cast<size_t>(c)].get();
    }
    const auto names = nn::gpt_parameter_shapes(cfg_, layers_[stage], stage == 0, stage == 0,
                                                stage == num_stages() - 1);
    for (const auto& [name, shape] : names) {
      if (owner == rank_) {
        // Collective over the TP group, whose ranks all own this stage.
        const Tensor t = chunk->full_tensor(name, /*on_host=*/true);
        if (!pipeline_saves) continue;
        if (rank_ == kRoot) {
          give(name, t);
        } else {
          // Through the model's device, as a device-routed group sends.
          groups_.pp->send(to_device(t, device()), kRoot)->wait();
        }
      } else {
        Tensor t = empty(shape, tensor_dtype(name), device());
        groups_.pp->recv(t, owner)->wait();
        give(name, to_device(t, Device::cpu()).detach());
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

nn::StateDict PipelineModel::gather_state_dict(bool group_saves, bool pipeline_saves) const {
  nn::StateDict out;
  gather_each(group_saves, pipeline_saves,
              [&](const std::string& name, const Tensor& t) { out[name] = t; });
  return out;
}

std::set<int64_t> PipelineModel::local_layers() const {
  std::set<int64_t> out;
  for (int c = 0; c < v_; ++c) {
    for (int64_t layer : layers_[stage_of(c)]) out.insert(layer);
  }
  return out;
}

void PipelineModel::load_full_state_dict(const nn::StateDict& full) {
  for (const auto& c : chunks_) {
    for (auto& [name, shape] : c->full_shapes()) {
      if (!full.count(name)) throw ValueError("pipeline load: missing '" + name + "'");
    }
  }
  load_full_tensors(full);
}

void PipelineModel::load_full_tensors(const nn::StateDict& part) {
  for (const auto& c : chunks_) {
    nn::StateDict mine;
    for (const auto& [name, t] : part) {
      if (c->shard_specs().count(name)) mine.emplace(name, t);
    }
    c->load_full_tensors(mine);
  }
}

PipelineExecutor::PipelineExecutor(PipelineModel& model, Schedule schedule)
    : model_(model), schedule_(std::move(schedule)) {
  if (schedule_.placement() != model_.placement()) {
    auto name = [](Placement pl) { return pl == Placement::V ? "the V" : "the loop"; };
    throw ConfigError(std::string("schedule ") + schedule_name(schedule_.kind) + " needs " +
                      name(schedule_.placement()) + " placement of stages, but the pipeline has " +
                      name(model_.placement()) + " placement");
  }
  if (schedule_.p != model_.p() || schedule_.v != model_.v()) {
    throw ConfigError("schedule (p=" + std::to_string(schedule_.p) +
                      ", v=" + std::to_string(schedule_.v) + ") does not match the pipeline (pp=" +
                      std::to_string(model_.p()) + ", vpp=" + std::to_string(model_.v()) + ")");
  }
}

PipelineStepResult PipelineExecutor::run(const std::vector<data::Batch>& micro,
                                         const nn::ForwardContext& ctx, double loss_scale,
                                         const DeviceLossWeights* weights) {
  const int m = schedule_.m, S = schedule_.num_stages(), r = model_.rank();
  if (static_cast<int>(micro.size()) != m) {
    throw ValueError("pipeline step: " + std::to_string(micro.size()) +
                     " microbatches for a schedule of m = " + std::to_string(m));
  }
  if (weights && (static_cast<int>(weights->seeds.size()) != m ||
                  static_cast<int>(weights->factors.size()) != m)) {
    throw ValueError("pipeline step: " + std::to_string(weights->seeds.size()) + " seeds and " +
                     std::to_string(weights->factors.size()) +
                     " factors of the loss weights for m = " + std::to_string(m) +
                     " microbatches (one each expected)");
  }
  const auto& cfg = model_.config();
  const auto& tpg = model_.groups().tp;
  const bool sp = model_.chunk(0).sequence_parallel();
  const DType act_dtype = model_.dtype();
  const Device act_device = model_.device();
  using Key = std::pair<int, int>;  // (chunk, microbatch)
  std::map<Key, Tensor> inputs, outputs, losses, grad_in, grad_out;
  std::map<Key, autograd::WeightGradStore> stores;
  // Each microbatch's packed documents, found once from its ids for all of
  // this rank's chunks (every stage sees the batch's ids).
  std::map<int, nn::ForwardContext> documents;
  PipelineStepResult res;
  res.chunks.resize(static_cast<size_t>(model_.v()));
  // Batches with sends still in flight, in the order they were posted.
  struct Pending {
    uint64_t batch;  // its place in the posting order
    int peer;        // its link's peer, or -1: the group's own stream
    dist::WorkPtr work;
  };
  std::vector<Pending> pending_sends;
  uint64_t batches_posted = 0;
  const StageTransfer transfer(tpg, scatter_gather_ && !sp && tpg->size() > 1);
  // Payloads on their way here: their batch, and their whole shape. The
  // action that consumes one waits for it (a receive posted before a W, say,
  // lets the W run meanwhile; on a GPU the compute stream is not made to
  // wait for it earlier).
  struct Arriving {
    dist::WorkPtr work;  // null: waited for already
    Shape shape;
    uint64_t batch = 0;  // its batch's place in the posting order
    int peer = -1;       // its call's link's peer, or -1: the group's own stream
  };
  std::map<Key, Arriving> arriving_inputs, arriving_grads;
  // A host-side (MPI) group moves transfers on only inside its calls.
  const bool poll = act_device.is_cpu();
  // On GPUs the NCCL pipeline group talks to each neighbour on a link of
  // its own (dist::NcclOptions::p2p_streams_per_peer), so a batch goes out
  // as one call per linked peer: each receive's Work then waits only for
  // its own link, not for a send to the other neighbour that waits for its
  // receiver. (Split on one stream, a batch's calls could deadlock: its
  // operations with both neighbours must pair up together.)
  const dist::ProcessGroupPtr& pp = model_.groups().pp;
  // (Trace and NVTX names: F3, B3, W3 for microbatch 3; " c1" on chunk 1.)
  auto action_name = [&](const Action& a) {
    const bool f = a.compute == ComputeKind::Forward, w = a.compute == ComputeKind::BackwardWeight;
    return std::string(f   ? "F"
                       : w ? "W"
                           : "B") +
           std::to_string(a.microbatch) + (schedule_.v > 1 ? " c" + std::to_string(a.chunk) : "");
  };
  // (Traced as "wait F3": what the payload is waited for to run.)
  auto arrived = [&](std::map<Key, Arriving>& arriving, std::map<Key, Tensor>& into, const Key& k,
                     const Action& consumer) {
    auto it = arriving.find(k);
    if (it == arriving.end()) return;
    if (it->second.work) {
      const auto t0 = Clock::now();
      const nvtx::Range range("wait");
      const DeviceTimer::Mark m0 = timer_ ? timer_->mark() : 0;
      it->second.work->wait();
      if (timer_) {
        const DeviceTimer::Mark m1 = timer_->mark();
        timer_->add("p2p", m0, m1);
        if (timer_->tracing()) timer_->trace("wait " + action_name(consumer), "p2p", m0, m1);
      }
      if (sink_) sink_("wait " + action_name(consumer), "p2p", t0, Clock::now());
      // On a GPU the group's calls run in posting order on each stream (the
      // group's one, or each neighbour's), so the compute stream, now
      // ordered after this call, is after every earlier one on its stream
      // too: their waits cost nothing more and let go of what they sent
      // (which would otherwise be held until the step ends).
      if (!poll) {
        const uint64_t upto = it->second.batch;
        const int peer = it->second.peer;
        auto earlier = [&](const Pending& q) { return q.batch <= upto && q.peer == peer; };
        for (const Pending& q : pending_sends) {
          if (earlier(q)) q.work->wait();
        }
        pending_sends.erase(std::remove_if(pending_sends.begin(), pending_sends.end(), earlier),
                            pending_sends.end());
      }
    }
    into[k] = transfer.whole(into.at(k), it->second.shape);
    arriving.erase(it);
  };
  int live = 0;
  // The last stage sums its micro-batches' losses on their device and reads
  // the sum once (a read per micro-batch would make the host wait each time).
  Tensor loss_sum;
  // A payload whose consumer is on this rank (the V placement's turn from
  // stage p-1 to p) is handed over as a message would be: a new leaf in the
  // activation dtype, the graph cut between the two stages.
  auto local_payload = [&](const Tensor& t) {
    return (t.dtype() != act_dtype ? cast(t, act_dtype) : contiguous(t)).detach();
  };
  const int64_t cp = model_.groups().cp ? model_.groups().cp->size() : 1;
  auto activation_shape = [&](int mb) {
    // (This rank's chunk of the sequence under context parallelism.)
    const int64_t b = micro[mb].inputs.size(0), T = micro[mb].inputs.size(1) / cp;
    return Shape{b, sp ? T / tpg->size() : T, cfg.d_model};
  };
  auto timed = [&](const Action& a, auto&& fn) {
    const char* category = a.compute == ComputeKind::Forward          ? "forward"
                           : a.compute == ComputeKind::BackwardWeight ? "weight-grad"
                                                                      : "backward";
    const auto t0 = Clock::now();
    const DeviceTimer::Mark m0 = timer_ ? timer_->mark() : 0;
    {
      const nvtx::Range range([&] { return action_name(a); });
      fn();
    }
    if (timer_) {
      const DeviceTimer::Mark m1 = timer_->mark();
      timer_->add(category, m0, m1);
      if (chunk_timing_) timer_->add(chunk_category(a.compute, a.chunk), m0, m1);
      if (timer_->tracing()) timer_->trace(action_name(a), category, m0, m1);
    }
    const auto t1 = Clock::now();
    const double seconds = std::chrono::duration<double>(t1 - t0).count();
    res.compute_seconds += seconds;
    PipelineStepResult::ChunkTimes& mine = res.chunks[static_cast<size_t>(a.chunk)];
    switch (a.compute) {
      case ComputeKind::Forward:
        res.forward_seconds += seconds;
        ++res.forwards;
        mine.forward_seconds += seconds;
        ++mine.forwards;
        break;
      case ComputeKind::Backward:
      case ComputeKind::BackwardInput:
        res.backward_seconds += seconds;
        ++res.backwards;
        mine.backward_seconds += seconds;
        ++mine.backwards;
        break;
      case ComputeKind::BackwardWeight:
        res.weight_seconds += seconds;
        ++res.weight_passes;
        mine.weight_seconds += seconds;
        ++mine.weight_passes;
        break;
    }
    if (sink_) sink_(action_name(a), category, t0, t1);
  };
  // The V's last stage on its first rank adds the head's gradient for the
  // shared token embedding into a buffer of its own (see
  // PipelineModel::head_shares_token_embedding).
  std::vector<bool> own_head_grad;
  for (int c = 0; c < model_.v(); ++c)
    own_head_grad.push_back(model_.head_shares_token_embedding(c));
  auto timed_backward = [&](const Action& a, auto&& fn) {
    struct Swapped {
      const PipelineModel* model;
      explicit Swapped(const PipelineModel* m) : model(m) {
        if (model) model->swap_head_grad();
      }
      ~Swapped() {
        if (model) model->swap_head_grad();
      }
      Swapped(const Swapped&) = delete;
      Swapped& operator=(const Swapped&) = delete;
    } swapped(own_head_grad[static_cast<size_t>(a.chunk)] ? &model_ : nullptr);
    timed(a, fn);
  };
  for (const Action& a : schedule_.ranks[r]) {
    if (!a.is_compute()) {
      // What goes out in one call: the whole batch, or one linked peer's
      // share of it (peer -1: the group's own stream).
      struct Call {
        int peer = -1;
        std::vector<dist::P2POp> ops;
        // Payloads to receive: where each is announced, and its whole shape.
        std::vector<std::tuple<std::map<Key, Arriving>*, Key, Shape>> received;
      };
      std::vector<Call> calls;
      auto call_for = [&](int peer) -> Call& {
        if (poll || !pp->has_p2p_link(peer)) peer = -1;
        for (Call& c : calls) {
          if (c.peer == peer) return c;
        }
        calls.push_back({peer, {}, {}});
        return calls.back();
      };
      std::vector<Key> sent_outputs;
      for (const P2POp& o : a.ops) {
        const int chunk_src = schedule_.chunk_of(o.stage);
        if (o.is_send) {
          const Key k{chunk_src, o.microbatch};
          Tensor t = o.payload == Payload::Activation ? outputs.at(k) : grad_in.at(k);
          // Gradients travel in the activation dtype (half leaves hold f32 gradients).
          if (t.dtype() != act_dtype) t = cast(t, act_dtype);
          Tensor out = transfer.outgoing(t);
          res.p2p_bytes_sent += static_cast<int64_t>(out.nbytes());
          call_for(o.peer).ops.push_back({true, out, o.peer, 0});
          if (o.payload == Payload::Activation) sent_outputs.push_back(k);
        } else {
          // The consumer is the next stage (activation) or the previous one (gradient).
          const int consumer = o.payload == Payload::Activation ? o.stage + 1 : o.stage - 1;
          const Key k{schedule_.chunk_of(consumer), o.microbatch};
          const Shape shape = activation_shape(o.microbatch);
          Tensor buf = transfer.incoming(shape, act_dtype, act_device);
          const bool activation = o.payload == Payload::Activation;
          (activation ? inputs : grad_out)[k] = buf;
          Call& call = call_for(o.peer);
          call.received.emplace_back(activation ? &arriving_inputs : &arriving_grads, k, shape);
          call.ops.push_back({false, buf, o.peer, 0});
        }
      }
      // An action's sends and receives go out as one batch: in 1F1B's steady
      // state both neighbours send and receive in the same action, and with
      // NCCL two batches would run in order on the group's stream, each
      // rank's send waiting for a receive the peer queued behind its own
      // send (a deadlock MPI's eager sends hide). One batch lets them pair
      // up (with links, one call per neighbour, on that neighbour's link,
      // where its sends and receives pair up the same way). A batch that
      // only receives is waited for by the action that consumes its
      // payload, so the rank computes meanwhile (ZB-H1's order posts
      // receives before W passes). On the host one that also sends is
      // waited for at once: an MPI group moves a rendezvous send on only
      // inside MPI calls, and the peer is waiting for it. On a GPU it is
      // deferred to its consumer too (the NCCL group moves the sends on by
      // itself; the simulator's P2PSemantics::StreamPerPeer, or
      // StreamOrdered on one stream). Sends stay in flight until they are
      // done or the step ends.
      // Traced apart: posting (the rank's own time: packing, the group's
      // calls) as "p2p", waiting for a peer as "wait".
      auto t0 = Clock::now();
      const nvtx::Range range("p2p");
      const DeviceTimer::Mark m0 = timer_ ? timer_->mark() : 0;
      DeviceTimer::Mark m_trace = m0;  // where the traced posting began
      for (Call& call : calls) {
        dist::WorkPtr w = pp->batch_isend_irecv(call.ops);
        const uint64_t batch = batches_posted++;
        if (call.received.size() < call.ops.size()) {
          if (call.received.empty() || !poll) {
            pending_sends.push_back({batch, call.peer, w});
          } else {
            const auto posted = Clock::now();
            const DeviceTimer::Mark m_posted = timer_ ? timer_->mark() : 0;
            if (sink_) sink_("p2p", "p2p", t0, posted);
            if (timer_) timer_->trace("p2p", "p2p", m_trace, m_posted);
            const nvtx::Range waiting("wait");
            w->wait();
            w = nullptr;
            t0 = Clock::now();
            if (sink_) sink_("wait", "p2p", posted, t0);
            if (timer_) {
              m_trace = timer_->mark();
              timer_->trace("wait", "p2p", m_posted, m_trace);
            }
          }
        }
        for (auto& [arriving, k, shape] : call.received)
          (*arriving)[k] = {w, shape, batch, call.peer};
      }
      if (sink_) sink_("p2p", "p2p", t0, Clock::now());
      if (timer_) {
        const DeviceTimer::Mark m1 = timer_->mark();
        timer_->add("p2p", m0, m1);
        timer_->trace("p2p", "p2p", m_trace, m1);
      }
      // Sent activations: only their place in the graph is still needed.
      for (const Key& k : sent_outputs) {
        outputs.at(k).impl().storage = std::make_shared<Storage>(0, cpu_allocator());
      }
      for (const P2POp& o : a.ops) {
        if (o.is_send && o.payload == Payload::Gradient)
          grad_in.erase({schedule_.chunk_of(o.stage), o.microbatch});
      }
      continue;
    }
    const int c = a.chunk, mb = a.microbatch, stage = schedule_.stage_of(r, c);
    const Key k{c, mb};
    tp::TensorParallelGpt& chunk = model_.chunk(c);
    nn::ForwardContext cctx = ctx;
    cctx.call = ctx.call + static_cast<uint64_t>(mb);  // distinct per microbatch
    if (a.compute == ComputeKind::Forward) {
      auto found = documents.find(mb);
      if (found == documents.end())
        found = documents.emplace(mb, chunk.with_documents(micro[mb].inputs, cctx)).first;
      cctx = found->second;
      // What this microbatch's backward starts from (below): losses inside
      // the model (MoE load balancing) take their gradient times it.
      const double w = micro[mb].loss_weight;
      cctx.loss_grad = w >= 0 ? loss_scale * w : loss_scale / m;
      if (weights) {
        // (Read on the device; multi-token prediction weighs by the seed,
        // and the head's gradient waits for it in the backward pass.)
        cctx.loss_grad = 0.0;
        cctx.loss_grad_seed = weights->seeds[static_cast<size_t>(mb)];
      }
    }
    // On the host, sends done by now let go of what they sent (and, asked,
    // the MPI group moves the others on). A GPU's are never polled: their
    // waits are stream-ordered, and each receive waited for lets go of the
    // sends posted before it (above).
    if (poll) {
      pending_sends.erase(std::remove_if(pending_sends.begin(), pending_sends.end(),
                                         [](const Pending& q) { return q.work->is_completed(); }),
                          pending_sends.end());
    }
    if (a.compute == ComputeKind::Forward) {
      arrived(arriving_inputs, inputs, k, a);
    } else if (a.compute != ComputeKind::BackwardWeight) {
      arrived(arriving_grads, grad_out, k, a);
    }
    switch (a.compute) {
      case ComputeKind::Forward:
        timed(a, [&] {
          Tensor x;
          if (stage == 0) {
            x = chunk.embed(micro[mb].inputs, cctx);  // host ids: see Trainer
          } else {
            x = inputs.at(k);
            x.set_requires_grad(true);
          }
          x = chunk.blocks(chunk.plan().layers, x, cctx);
          if (stage == S - 1) {
            losses[k] = chunk.head_objective(x, micro[mb].inputs, micro[mb].targets, cctx);
          } else {
            outputs[k] = x;
            if (schedule_.rank_of(stage + 1) == r)
              inputs[{schedule_.chunk_of(stage + 1), mb}] = local_payload(x);
          }
        });
        res.peak_live_outputs = std::max(res.peak_live_outputs, ++live);
        break;
      case ComputeKind::Backward:
      case ComputeKind::BackwardInput:
        timed_backward(a, [&] {
          autograd::BackwardOptions opts;
          if (a.compute == ComputeKind::BackwardInput) opts.defer_weight_grads = &stores[k];
          if (stage == S - 1) {
            Tensor l = losses.at(k);
            // The step loss is the mean over microbatches of their mean
            // losses, or their sum weighted by each one's share of the tokens.
            const double w = micro[mb].loss_weight;
            Tensor part = cast(l.detach(), DType::F64);
            Tensor seed;
            if (weights) {
              part = mul(part, weights->factors[static_cast<size_t>(mb)]);
              seed = weights->seeds[static_cast<size_t>(mb)];
              if (seed.dtype() != l.dtype()) seed = cast(seed, l.dtype());
            } else {
              if (w >= 0) part = scale(part, w * m);
              seed = full({}, w >= 0 ? loss_scale * w : loss_scale / m, l.dtype(), l.device());
            }
            loss_sum = loss_sum.defined() ? add(loss_sum, part) : part;
            autograd::backward({l}, {seed}, opts);
            losses.erase(k);
          } else {
            // (A stage whose parameters are all frozen, with none before it
            // to train, has an output that needs no gradient: nothing to do.)
            if (outputs.at(k).requires_grad())
              autograd::backward({outputs.at(k)}, {grad_out.at(k)}, opts);
            outputs.erase(k);
            grad_out.erase(k);
          }
          if (stage > 0) {
            if (schedule_.rank_of(stage - 1) == r) {
              grad_out[{schedule_.chunk_of(stage - 1), mb}] = local_payload(inputs.at(k).grad());
            } else {
              grad_in[k] = inputs.at(k).grad();
            }
            inputs.erase(k);
          }
        });
        --live;
        break;
      case ComputeKind::BackwardWeight:
        timed_backward(a, [&] {
          stores.at(k).flush();
          stores.erase(k);
        });
        break;
    }
  }
  for (auto& q : pending_sends) q.work->wait();
  model_.join_head_grad();
  for (int c = 0; c < model_.v(); ++c) model_.chunk(c).reduce_partial_grads();
  model_.reduce_tied_embedding_grads();
  // Every pipeline rank reports the loss, read only if asked (a trainer
  // reads it with the norm).
  res.loss_sum = summed_over_pipeline(loss_sum);
  res.loss = read_loss_ ? item(res.loss_sum) / m : std::numeric_limits<double>::quiet_NaN();
  return res;
}

void PipelineExecutor::forward_only(
    const std::vector<data::Batch>& micro,
    const std::function<nn::ForwardContext(const data::Batch&)>& ctx_of,
    const std::function<void(tp::TensorParallelGpt&, const Tensor&, const data::Batch&)>& at_head) {
  autograd::InferenceGuard inference;
  const int S = model_.num_stages(), r = model_.rank();
  const auto& pp = model_.groups().pp;
  const int64_t tp = model_.groups().tp->size();
  const bool sp = model_.chunk(0).sequence_parallel();
  const StageTransfer transfer(model_.groups().tp, scatter_gather_ && !sp && tp > 1);
  // Sends stay in flight for one microbatch (the next stage takes them when
  // it gets there), so at most two microbatches' activations are held.
  std::vector<dist::WorkPtr> previous, current;
  const int64_t cp = model_.groups().cp ? model_.groups().cp->size() : 1;
  for (const data::Batch& batch : micro) {
    const int64_t b = batch.inputs.size(0), T = batch.inputs.size(1) / cp;
    const nn::ForwardContext ctx = ctx_of(batch);
    // This rank's stages in increasing order; an output whose next stage
    // is on this rank too (the V's turn) goes straight on.
    Tensor carried;
    for (int c = 0; c < model_.v(); ++c) {
      const int stage = schedule_.stage_of(r, c);
      tp::TensorParallelGpt& chunk = model_.chunk(c);
      Tensor x;
      if (stage == 0) {
        x = chunk.embed(batch.inputs, ctx);
      } else if (schedule_.rank_of(stage - 1) == r) {
        x = carried;
      } else {
        const Shape shape{b, sp ? T / tp : T, model_.config().d_model};
        x = transfer.incoming(shape, model_.dtype(), model_.device());
        pp->batch_isend_irecv({{false, x, schedule_.rank_of(stage - 1), 0}})->wait();
        x = transfer.whole(x, shape);
      }
      x = chunk.blocks(chunk.plan().layers, x, ctx);
      if (stage == S - 1) {
        at_head(chunk, x, batch);
      } else if (schedule_.rank_of(stage + 1) == r) {
        carried = x;
      } else {
        current.push_back(
            pp->batch_isend_irecv({{true, transfer.outgoing(x), schedule_.rank_of(stage + 1), 0}}));
      }
    }
    for (auto& w : previous) w->wait();
    previous = std::move(current);
    current.clear();
  }
  for (auto& w : previous) w->wait();
}

double PipelineExecutor::evaluate(const std::vector<data::Batch>& micro) {
  if (micro.empty()) throw ValueError("pipeline evaluate: no microbatches");
  const nn::ForwardContext no_dropout{false, 0, 0};
  Tensor loss_sum;
  forward_only(
      micro,
      [&](const data::Batch& b) { return model_.chunk(0).with_documents(b.inputs, no_dropout); },
      [&](tp::TensorParallelGpt& chunk, const Tensor& x, const data::Batch& batch) {
        Tensor part = cast(chunk.head_loss(x, batch.targets), DType::F64);
        if (batch.loss_weight >= 0)
          part = scale(part, batch.loss_weight * static_cast<double>(micro.size()));
        loss_sum = loss_sum.defined() ? add(loss_sum, part) : part;
      });
  return item(summed_over_pipeline(loss_sum)) / static_cast<double>(micro.size());
}

Tensor PipelineExecutor::summed_over_pipeline(const Tensor& last_stage_sum) const {
  // The last stage knows the loss; the others add zeros, on the device (a
  // GPU's host does not wait for the sum, only for its read).
  Tensor share = last_stage_sum.defined() ? reshape(contiguous(last_stage_sum), {1})
                                          : zeros({1}, DType::F64, model_.device());
  model_.groups().pp->all_reduce(share, dist::ReduceOp::Sum)->wait();
  return share;
}

std::vector<double> PipelineExecutor::row_losses(const std::vector<data::Batch>& micro,
                                                 std::vector<bool>* greedy) {
  if (micro.empty()) throw ValueError("pipeline row_losses: no microbatches");
  const int64_t cp = model_.groups().cp ? model_.groups().cp->size() : 1;
  int64_t rows = 0;
  for (const auto& b : micro) rows += b.inputs.size(0);
  const nn::ForwardContext no_dropout{false, 0, 0};
  std::vector<Tensor> losses;
  std::vector<double> matches;  // 1 or 0 per row, with `greedy`
  forward_only(
      micro,
      [&](const data::Batch& b) {
        // Each row one document; a sliding window still applies.
        return model_.chunk(0).chunked(
            b.inputs,
            nn::with_one_document(model_.config(), b.inputs, no_dropout, model_.device()));
      },
      [&](tp::TensorParallelGpt& chunk, const Tensor& x, const data::Batch& batch) {
        for (int64_t i = 0; i < batch.inputs.size(0); ++i) {
          losses.push_back(reshape(
              cast(chunk.head_loss(narrow(x, 0, i, 1), narrow(batch.targets, 0, i, 1)), DType::F64),
              {1}));
        }
        if (greedy) {
          for (const bool g :
               nn::rows_argmax_match(batch.targets, [&](int64_t i, int64_t at, int64_t n) {
                 return chunk.head_logits(narrow(x, 0, i, 1), at, n);
               })) {
            matches.push_back(g ? 1.0 : 0.0);
          }
        }
      });
  // The last stage's values, read once, then to every rank of the pipeline
  // (the losses, then with `greedy` the matches).
  const int64_t width = greedy ? 2 * rows : rows;
  Tensor all = zeros({width}, DType::F64);
  if (!losses.empty()) {
    Tensor l = to_device(concat(losses, 0), Device::cpu());
    all = greedy ? concat({l, from_vector(matches, {rows}, DType::F64)}, 0) : l;
  }
  model_.groups().pp->broadcast(all, schedule_.rank_of(model_.num_stages() - 1))->wait();
  if (cp > 1) {
    // Each context-parallel rank's row loss is its chunk's share times cp
    // (the greedy matches, from whole logits, agree).
    Tensor head = contiguous(narrow(all, 0, 0, rows));
    model_.groups().cp->all_reduce(head, dist::ReduceOp::Sum)->wait();
    all = greedy ? concat({scale(head, 1.0 / cp), narrow(all, 0, rows, rows)}, 0)
                 : scale(head, 1.0 / cp);
  }
  std::vector<double> values = to_double_vector(all);
  if (greedy) {
    greedy->clear();
    for (int64_t k = rows; k < width; ++k) greedy->push_back(values[static_cast<size_t>(k)] != 0);
    values.resize(static_cast<size_t>(rows));
  }
  return values;
}

}  // namespace triad::pipeline
