#include "triad/parallel/data/grad_reducer.h"

#include <algorithm>

#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/ops.h"

namespace triad::dp {
namespace {

// The hooks outlive nothing: they reach the reducer through this holder,
// cleared when the reducer goes away.
struct HookTarget {
  GradientReducer* reducer = nullptr;
};

Tensor range(const Tensor& flat, int64_t begin, int64_t length) {
  return make_view(flat, {length}, {1}, flat.offset() + begin);
}

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace

GradientReducer::GradientReducer(std::vector<std::pair<std::string, Tensor>> params,
                                 dist::ProcessGroupPtr group, double bucket_bytes, bool zero1,
                                 std::set<std::string> late, OtherReplicas others)
    : params_(std::move(params)), group_(std::move(group)), zero1_(zero1) {
  autograd::NoGradGuard ng;
  const size_t n = params_.size();
  // Parameters share one dtype (f32, or bf16/f16 under mixed precision),
  // and so do their gradients: f32 (half parameters accumulate f32
  // gradients), or the half type itself for parameters marked so
  // (Tensor::set_half_grad; train.grad_precision bf16).
  const DType param_dtype = n ? params_.front().second.dtype() : DType::F32;
  const DType grad_dtype = n ? params_.front().second.grad_dtype() : DType::F32;
  const Device device = n ? params_.front().second.device() : Device::cpu();
  for (const auto& [name, p] : params_) {
    if (p.grad_dtype() != grad_dtype) {
      throw NotSupportedError("GradientReducer: parameter '" + name + "' keeps " +
                              dtype_name(p.grad_dtype()) + " gradients, the first parameter " +
                              dtype_name(grad_dtype) +
                              " ones: every gradient must be of one dtype");
    }
    if (p.dtype() != param_dtype || p.device() != device ||
        (p.dtype() != DType::F32 && p.dtype() != DType::BF16 && p.dtype() != DType::F16) ||
        !p.is_contiguous()) {
      throw NotSupportedError("GradientReducer: parameter '" + name + "' is " + p.str() +
                              "; every parameter must be a contiguous tensor of one dtype "
                              "(f32, bf16 or f16) on one device (here " +
                              dtype_name(param_dtype) + " on " + device.str() + ")");
    }
  }
  for (const std::string& name : others.names) {
    if (!others.group || !(others.divisor >= 1.0)) {
      throw ValueError("GradientReducer: parameters of other replicas ('" + name +
                       "') need their group and a divisor >= 1");
    }
  }
  const auto other = [&](size_t i) { return others.names.count(params_[i].first) > 0; };
  // Layout: reverse registration order (backward's order), late ones last.
  std::vector<size_t> order;
  for (size_t i = n; i-- > 0;) {
    if (!late.count(params_[i].first)) order.push_back(i);
  }
  for (size_t i = n; i-- > 0;) {
    if (late.count(params_[i].first)) order.push_back(i);
  }
  // Every parameter starts at a multiple of kAlign elements (the GEMMs that
  // write gradients into the buffer, and vectorised kernels, get aligned
  // addresses); under ZeRO-1 every bucket spans a multiple of kAlign * dp,
  // so its pieces are equal (NCCL's reduce-scatter and all-gather rather
  // than per-rank reduces and broadcasts) and aligned. The gaps hold zeros.
  // (A bucket holds parameters of one group of replicas.)
  offset_.assign(n, 0);
  bucket_of_.assign(n, 0);
  const int64_t cap = std::max<int64_t>(
      1, static_cast<int64_t>(bucket_bytes / static_cast<double>(dtype_size(grad_dtype))));
  int64_t total = 0;
  const auto close_last_bucket = [&] {
    if (buckets_.empty()) return;
    Bucket& last = buckets_.back();
    const int64_t bucket_multiple = zero1_ ? kAlign * last.group->size() : kAlign;
    last.end = last.begin + round_up(last.end - last.begin, bucket_multiple);
    total = last.end;
  };
  for (size_t i : order) {
    const bool is_late = late.count(params_[i].first) > 0;
    const dist::ProcessGroupPtr& replicas = other(i) ? others.group : group_;
    if (buckets_.empty() || buckets_.back().late != is_late || buckets_.back().group != replicas ||
        buckets_.back().end - buckets_.back().begin >= cap) {
      close_last_bucket();
      Bucket b;
      b.begin = b.end = total;
      b.late = is_late;
      b.group = replicas;
      b.scale = other(i) ? 1.0 / others.divisor : 1.0;
      buckets_.push_back(b);
    }
    Bucket& b = buckets_.back();
    offset_[i] = round_up(b.end, kAlign);
    b.params.push_back(i);
    b.end = offset_[i] + params_[i].second.numel();
    bucket_of_[i] = buckets_.size() - 1;
  }
  close_last_bucket();
  flat_grad_ = zeros({total}, grad_dtype, device);
  flat_param_ = zeros({total}, param_dtype, device);
  // Parameters and gradients become views into the flat buffers.
  for (size_t i = 0; i < n; ++i) {
    Tensor& p = params_[i].second;
    Tensor dst = range(flat_param_, offset_[i], p.numel());
    copy_(dst, reshape(p.detach(), {p.numel()}).detach());
    auto& impl = p.impl();
    impl.storage = flat_param_.storage();
    impl.offset = offset_[i];
    param_at_[offset_[i]] = i;
    impl.grad =
        make_view(flat_grad_, p.shape(), contiguous_strides(p.shape()), offset_[i]).impl_ptr();
  }
  expected_.assign(n, 0);
  seen_.assign(n, 0);
  auto target = std::make_shared<HookTarget>();
  target->reducer = this;
  hook_target_ = target;
  for (size_t i = 0; i < n; ++i) {
    params_[i].second.register_post_accumulate_hook([target, i](Tensor&) {
      if (target->reducer) target->reducer->on_ready(i);
    });
  }
  // ZeRO-1: this rank's piece of each bucket, as parameter segments.
  for (const Bucket& b : buckets_) {
    const int64_t lo = piece_begin(b), hi = lo + piece_length(b);
    for (size_t i : b.params) {
      const int64_t a = std::max(lo, offset_[i]),
                    z = std::min(hi, offset_[i] + params_[i].second.numel());
      if (a < z) shard_.push_back({i, a - offset_[i], a, z - a});
    }
  }
}

GradientReducer::~GradientReducer() {
  if (auto t = std::static_pointer_cast<HookTarget>(hook_target_)) t->reducer = nullptr;
  // No collective may outlive the buffers it writes into.
  try {
    wait_gathers();
  } catch (const std::exception&) {  // (a failed gather was reported by its first wait)
  }
}

std::vector<int64_t> GradientReducer::bucket_lengths() const {
  std::vector<int64_t> lengths;
  for (const Bucket& b : buckets_) lengths.push_back(b.end - b.begin);
  return lengths;
}

int64_t GradientReducer::piece_length(const Bucket& b) const {
  return (b.end - b.begin) / b.group->size();
}

int64_t GradientReducer::piece_begin(const Bucket& b) const {
  return b.begin + b.group->rank() * piece_length(b);
}

void GradientReducer::on_ready(size_t i) {
  ++seen_[i];
  if (!learned_) return;
  if (seen_[i] > expected_[i]) {
    throw Error("GradientReducer: parameter '" + params_[i].first + "' received " +
                std::to_string(seen_[i]) + " gradients this step, more than the " +
                std::to_string(expected_[i]) +
                " of the first step (the graph changed between steps)");
  }
  if (seen_[i] != expected_[i] || deferred_) return;
  Bucket& b = buckets_[bucket_of_[i]];
  if (--b.pending == 0 && !b.late && !b.work) {
    launch(b);
    ++launched_early_;
  }
}

void GradientReducer::launch(Bucket& b) {
  Tensor view = range(flat_grad_, b.begin, b.end - b.begin);
  if (b.scale != 1.0) scale_(view, b.scale);  // (the reduction is linear)
  if (!zero1_) {
    b.work = b.group->all_reduce(view, dist::ReduceOp::Avg);
    return;
  }
  // In place: this rank's averaged piece lands where the optimizer reads it
  // (the rest of the bucket is left undefined until the next zero_grad).
  Tensor mine = range(flat_grad_, piece_begin(b), piece_length(b));
  b.work = b.group->reduce_scatter(view, mine, dist::ReduceOp::Avg);
}

bool GradientReducer::captures_reductions() const {
  if (!flat_grad_.device().is_cuda()) return false;
  return std::all_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) {
    return b.group && b.group->captures_device_collectives();
  });
}

void GradientReducer::finish() {
  parts_last_step_ = waited_by_parts_;
  waited_by_parts_ = 0;
  wait_gathers();  // (a parameter the forward pass never read)
  if (!learned_) {
    expected_ = learned_counts_ = seen_;
    learned_micro_ = microbatches_;
    learned_ = true;
  }
  early_last_step_ = launched_early_;
  launched_early_ = 0;
  for (Bucket& b : buckets_) {
    if (!b.work) launch(b);
  }
  for (Bucket& b : buckets_) {
    b.work->wait();
    b.work.reset();
  }
  std::fill(seen_.begin(), seen_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = 0;
    for (size_t i : b.params) b.pending += expected_[i] > 0;
  }
}

void GradientReducer::set_microbatches(int64_t microbatches) {
  if (microbatches < 1) {
    throw ValueError("GradientReducer: microbatches (" + std::to_string(microbatches) +
                     ") must be positive");
  }
  microbatches_ = microbatches;
  if (!learned_) return;
  for (size_t i = 0; i < expected_.size(); ++i) {
    const int64_t scaled = learned_counts_[i] * microbatches;
    if (scaled % learned_micro_ != 0) {
      throw Error("GradientReducer: parameter '" + params_[i].first + "' received " +
                  std::to_string(learned_counts_[i]) + " gradients over the first step's " +
                  std::to_string(learned_micro_) +
                  " microbatches, not the same number per microbatch: a step of " +
                  std::to_string(microbatches) + " cannot be expected");
    }
    expected_[i] = scaled / learned_micro_;
  }
}

void GradientReducer::zero_grad() {
  backend_for(flat_grad_).fill(flat_grad_, 0.0);
}

void GradientReducer::gather_parameters() {
  start_gather();
  wait_gathers();
}

void GradientReducer::gather_gradients(const std::vector<size_t>& params) {
  if (!zero1_) throw Error("GradientReducer: gather_gradients needs zero1 (nothing is sharded)");
  autograd::NoGradGuard ng;
  std::set<size_t> buckets;
  for (size_t i : params) buckets.insert(bucket_of_.at(i));
  std::vector<dist::WorkPtr> works;
  for (size_t k : buckets) {
    Bucket& b = buckets_[k];
    Tensor mine = range(flat_grad_, piece_begin(b), piece_length(b));
    Tensor all = range(flat_grad_, b.begin, b.end - b.begin);
    works.push_back(b.group->all_gather(mine, all));
  }
  for (auto& w : works) w->wait();
}

void GradientReducer::start_gather() {
  if (!zero1_) throw Error("GradientReducer: start_gather needs zero1 (nothing is sharded)");
  autograd::NoGradGuard ng;
  wait_gathers();  // (one gather per bucket in flight at a time)
  // Every bucket's gather is issued before any is waited for, each in place
  // (this rank's piece is already where the gathered bucket keeps it), in
  // the order the forward pass reads them: buckets are laid out backward's
  // way, so the last holds the first layers. Late buckets (replicated norms
  // and biases, spread over every layer) go first.
  std::vector<size_t> order;
  for (size_t k = buckets_.size(); k-- > 0;) {
    if (buckets_[k].late) order.push_back(k);
  }
  for (size_t k = buckets_.size(); k-- > 0;) {
    if (!buckets_[k].late) order.push_back(k);
  }
  for (size_t k : order) {
    Bucket& b = buckets_[k];
    Tensor mine = range(flat_param_, piece_begin(b), piece_length(b));
    Tensor all = range(flat_param_, b.begin, b.end - b.begin);
    b.gather = b.group->all_gather(mine, all);
    ++pending_gathers_;
  }
}

void GradientReducer::wait_gather(Bucket& b) {
  if (!b.gather) return;
  dist::WorkPtr w = std::move(b.gather);
  b.gather.reset();
  --pending_gathers_;
  w->wait();
}

void GradientReducer::wait_gathered(const std::vector<Tensor>& params) {
  if (pending_gathers_ == 0) return;
  for (const Tensor& p : params) {
    if (!p.defined() || p.storage() != flat_param_.storage()) continue;
    auto it = param_at_.find(p.offset());
    if (it == param_at_.end()) continue;
    Bucket& b = buckets_[bucket_of_[it->second]];
    if (!b.gather) continue;
    wait_gather(b);
    ++waited_by_parts_;
  }
}

void GradientReducer::wait_gathers() {
  for (Bucket& b : buckets_) wait_gather(b);
}

ZeroAdamW::ZeroAdamW(GradientReducer& reducer, optim::AdamWOptions options,
                     std::map<std::string, optim::MuonMatrix> muon, optim::MuonOptions muon_options,
                     optim::MuonUpdater updater)
    : reducer_(reducer),
      options_(options),
      muon_options_(muon_options),
      updater_(std::move(updater)) {
  optim::check_weight_decay(options.weight_decay, "ZeroAdamW");
  optim::check_weight_decay(muon_options.weight_decay, "ZeroAdamW (Muon)");
  optim::check_lr_scale(options.lr_scale, "ZeroAdamW");
  optim::check_lr_scale(muon_options.lr_scale, "ZeroAdamW (Muon)");
  for (size_t i = 0; i < reducer_.params().size(); ++i) {
    const auto& [name, p] = reducer_.params()[i];
    auto it = muon.find(name);
    if (it == muon.end()) continue;
    if (p.dim() != 2) {
      throw ShapeError("ZeroAdamW: Muon's parameter '" + name + "' is " + p.str() +
                       ", not a matrix");
    }
    muon_[i] = std::move(it->second);
    muon.erase(it);
  }
  if (!muon.empty()) {
    throw ValueError("ZeroAdamW: Muon's matrix '" + muon.begin()->first +
                     "' is not one of the reducer's parameters");
  }
  optim::check_moment_dtype(options.moment_dtype, "ZeroAdamW");
  if (!muon_.empty() && muon_options.moment_dtype != options.moment_dtype) {
    throw ValueError(std::string("ZeroAdamW: Muon's momentum (") +
                     dtype_name(muon_options.moment_dtype) + ") and AdamW's moments (" +
                     dtype_name(options.moment_dtype) + ") share one buffer: give them one dtype");
  }
  int64_t n = 0, nv = 0;
  for (const auto& s : reducer_.shard_segments()) {
    const bool orthogonal = muon_.count(s.param) > 0;
    places_.push_back({n, orthogonal ? -1 : nv});
    n += s.length;
    if (!orthogonal) nv += s.length;
  }
  const Device device = reducer_.flat_params().device();
  m_ = zeros({n}, options.moment_dtype, device);
  v_ = zeros({nv}, options.moment_dtype, device);
  if (reducer_.flat_params().dtype() != DType::F32) {
    // Mixed precision: f32 masters of this rank's pieces.
    master_ = empty({n}, DType::F32, device);
    int64_t at = 0;
    for (const auto& s : reducer_.shard_segments()) {
      Tensor w = range(master_, at, s.length);
      copy_(w, range(reducer_.flat_params(), s.flat_offset, s.length));
      at += s.length;
    }
  }
}

void ZeroAdamW::sync_params_from_masters() {
  if (!master_.defined()) return;
  autograd::NoGradGuard ng;
  int64_t at = 0;
  for (const auto& s : reducer_.shard_segments()) {
    Tensor p = range(reducer_.flat_params(), s.flat_offset, s.length);
    copy_(p, range(master_, at, s.length));
    at += s.length;
  }
  reducer_.gather_parameters();
}

void ZeroAdamW::set_weight_decay(double weight_decay) {
  optim::check_weight_decay(weight_decay, "ZeroAdamW");
  options_.weight_decay = muon_options_.weight_decay = weight_decay;
}

void ZeroAdamW::step(double lr, double grad_scale, double muon_lr) {
  autograd::NoGradGuard ng;
  reducer_.wait_gathers();  // (this rank's pieces are what the gathers read)
  ++step_;
  // One multi-tensor update over every piece (on a GPU a few launches, not
  // one or two per parameter); clipping's coefficient rides in grad_scale.
  std::vector<std::pair<double, std::vector<Backend::AdamWEntry>>> groups;
  const auto& segments = reducer_.shard_segments();
  for (size_t k = 0; k < segments.size(); ++k) {
    const auto& s = segments[k];
    const Place& at = places_[k];
    if (at.v_at < 0) continue;  // (Muon's)
    Backend::AdamWEntry e;
    e.param = range(reducer_.flat_params(), s.flat_offset, s.length);
    e.grad = range(reducer_.flat_grads(), s.flat_offset, s.length);
    e.m = range(m_, at.m_at, s.length);
    e.v = range(v_, at.v_at, s.length);
    if (master_.defined()) e.master = range(master_, at.m_at, s.length);
    const auto& [name, param] = reducer_.params()[s.param];
    e.weight_decay = options_.decays(name, param) ? options_.weight_decay : 0.0;
    e.grad_scale = grad_scale;
    // One launch per learning-rate factor (train.lr_scale), pieces in order.
    const double factor = options_.lr_factor(name);
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& g) { return g.first == factor; });
    if (group == groups.end()) {
      groups.push_back({factor, {}});
      group = groups.end() - 1;
    }
    group->second.push_back(std::move(e));
  }
  AdamWStep hp;
  hp.beta1 = options_.beta1;
  hp.beta2 = options_.beta2;
  hp.eps = options_.eps;
  hp.step = step_;
  for (auto& [factor, entries] : groups) {
    hp.lr = lr * factor;
    backend_for(reducer_.flat_params()).adamw_many(entries, hp);
  }
  if (!muon_.empty()) muon_step(muon_lr < 0 ? lr : muon_lr, grad_scale);
  reducer_.start_gather();
  if (!reducer_.overlap_param_gather()) reducer_.wait_gathers();
}

void ZeroAdamW::muon_step(double lr, double grad_scale) {
  const auto& segments = reducer_.shard_segments();
  const double mu = muon_options_.momentum;
  // This rank's pieces: the momentum, then the update u written over the
  // piece's (reduced, already counted) gradient.
  std::vector<size_t> touched;              // matrices with a piece here, in order
  std::vector<std::vector<size_t>> pieces;  // each one's segments here
  for (size_t k = 0; k < segments.size(); ++k) {
    const auto& s = segments[k];
    if (places_[k].v_at >= 0) continue;
    Tensor g = range(reducer_.flat_grads(), s.flat_offset, s.length);
    Tensor m = range(m_, places_[k].m_at, s.length);
    if (grad_scale != 1.0) scale_(g, grad_scale);
    const Tensor now = optim::advance_momentum(m, g, mu);
    if (muon_options_.nesterov) {
      // (A bf16 gradient buffer holds the term rounded, as Muon's does.)
      copy_(g, add(g.dtype() == now.dtype() ? g : cast(g, now.dtype()), scale(now, mu)));
    } else {
      copy_(g, now);
    }
    if (touched.empty() || touched.back() != s.param) {
      touched.push_back(s.param);
      pieces.emplace_back();
    }
    pieces.back().push_back(k);
  }
  // Every rank's u: each matrix whole (this rank's tensor-parallel shard of
  // it) in its gradient's view. Every rank gathers the same buckets.
  std::vector<size_t> all;
  for (const auto& [i, m] : muon_) all.push_back(i);
  reducer_.gather_gradients(all);
  // The matrices this rank's pieces touch, each orthogonalised once (with
  // its tensor-parallel peers, which hold pieces of the same matrices),
  // their updates applied to this rank's pieces.
  std::vector<std::string> names;
  for (size_t i : touched) names.push_back(reducer_.params()[i].first);
  const auto u = [&](size_t j) { return reducer_.params()[touched.at(j)].second.grad(); };
  const auto apply = [&](size_t j, const Tensor& update) {
    const Tensor flat = reshape(contiguous(update), {update.numel()});
    for (const size_t k : pieces.at(j)) {
      const auto& s = segments[k];
      Tensor target = master_.defined() ? range(master_, places_[k].m_at, s.length)
                                        : range(reducer_.flat_params(), s.flat_offset, s.length);
      optim::apply_muon_update(target, narrow(flat, 0, s.param_offset, s.length),
                               lr * muon_options_.lr_factor(names.at(j)),
                               muon_options_.decay_of(names.at(j)));
      if (master_.defined()) {
        Tensor p = range(reducer_.flat_params(), s.flat_offset, s.length);
        copy_(p, target);
      }
    }
  };
  if (updater_) {
    updater_(names, u, apply);
    return;
  }
  for (size_t j = 0; j < touched.size(); ++j)
    apply(j, optim::muon_update(u(j), muon_.at(touched[j]).row_blocks, muon_options_, names[j]));
}

}  // namespace triad::dp
