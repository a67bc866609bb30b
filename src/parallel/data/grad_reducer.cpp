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

}  // namespace

GradientReducer::GradientReducer(std::vector<std::pair<std::string, Tensor>> params,
                                 dist::ProcessGroupPtr group, double bucket_bytes, bool zero1,
                                 std::set<std::string> late)
    : params_(std::move(params)), group_(std::move(group)), zero1_(zero1) {
  autograd::NoGradGuard ng;
  const size_t n = params_.size();
  // Parameters share one dtype (f32, or bf16/f16 under mixed precision);
  // gradients are always f32 (half parameters accumulate f32 gradients).
  const DType param_dtype = n ? params_.front().second.dtype() : DType::F32;
  const Device device = n ? params_.front().second.device() : Device::cpu();
  for (const auto& [name, p] : params_) {
    if (p.dtype() != param_dtype || p.device() != device ||
        (p.dtype() != DType::F32 && p.dtype() != DType::BF16 && p.dtype() != DType::F16) ||
        !p.is_contiguous()) {
      throw NotSupportedError("GradientReducer: parameter '" + name + "' is " + p.str() +
                              "; every parameter must be a contiguous tensor of one dtype "
                              "(f32, bf16 or f16) on one device (here " +
                              dtype_name(param_dtype) + " on " + device.str() + ")");
    }
  }
  // Layout: reverse registration order (backward's order), late ones last.
  std::vector<size_t> order;
  for (size_t i = n; i-- > 0;) {
    if (!late.count(params_[i].first)) order.push_back(i);
  }
  for (size_t i = n; i-- > 0;) {
    if (late.count(params_[i].first)) order.push_back(i);
  }
  offset_.assign(n, 0);
  bucket_of_.assign(n, 0);
  int64_t total = 0;
  for (size_t i : order) {
    offset_[i] = total;
    total += params_[i].second.numel();
  }
  flat_grad_ = zeros({total}, DType::F32, device);
  flat_param_ = empty({total}, param_dtype, device);
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / 4));
  for (size_t i : order) {
    const bool is_late = late.count(params_[i].first) > 0;
    if (buckets_.empty() || buckets_.back().late != is_late ||
        buckets_.back().end - buckets_.back().begin >= cap) {
      Bucket b;
      b.begin = b.end = offset_[i];
      b.late = is_late;
      buckets_.push_back(b);
    }
    Bucket& b = buckets_.back();
    b.params.push_back(i);
    b.end = offset_[i] + params_[i].second.numel();
    bucket_of_[i] = buckets_.size() - 1;
  }
  // Parameters and gradients become views into the flat buffers.
  for (size_t i = 0; i < n; ++i) {
    Tensor& p = params_[i].second;
    Tensor dst = range(flat_param_, offset_[i], p.numel());
    copy_(dst, reshape(p.detach(), {p.numel()}).detach());
    auto& impl = p.impl();
    impl.storage = flat_param_.storage();
    impl.offset = offset_[i];
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
  const int r = group_->rank(), size = group_->size();
  for (const Bucket& b : buckets_) {
    const auto sizes = dist::split_sizes(b.end - b.begin, size);
    int64_t lo = b.begin;
    for (int q = 0; q < r; ++q) lo += sizes[q];
    const int64_t hi = lo + sizes[r];
    for (size_t i : b.params) {
      const int64_t a = std::max(lo, offset_[i]),
                    z = std::min(hi, offset_[i] + params_[i].second.numel());
      if (a < z) shard_.push_back({i, a - offset_[i], a, z - a});
    }
  }
}

GradientReducer::~GradientReducer() {
  if (auto t = std::static_pointer_cast<HookTarget>(hook_target_)) t->reducer = nullptr;
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
  if (seen_[i] != expected_[i]) return;
  Bucket& b = buckets_[bucket_of_[i]];
  if (--b.pending == 0 && !b.late && !b.work) {
    launch(b);
    ++launched_early_;
  }
}

void GradientReducer::launch(Bucket& b) {
  Tensor view = range(flat_grad_, b.begin, b.end - b.begin);
  if (!zero1_) {
    b.work = group_->all_reduce(view, dist::ReduceOp::Avg);
    return;
  }
  const auto sizes = dist::split_sizes(b.end - b.begin, group_->size());
  b.piece = empty({sizes[group_->rank()]}, DType::F32, flat_grad_.device());
  b.work = group_->reduce_scatter(view, b.piece, dist::ReduceOp::Avg);
}

void GradientReducer::finish() {
  if (!learned_) {
    expected_ = seen_;
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
    if (zero1_) {
      // Put the averaged piece back where the optimizer reads it.
      const auto sizes = dist::split_sizes(b.end - b.begin, group_->size());
      int64_t lo = b.begin;
      for (int q = 0; q < group_->rank(); ++q) lo += sizes[q];
      Tensor dst = range(flat_grad_, lo, sizes[group_->rank()]);
      copy_(dst, b.piece);
    }
  }
  std::fill(seen_.begin(), seen_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = 0;
    for (size_t i : b.params) b.pending += expected_[i] > 0;
  }
}

void GradientReducer::zero_grad() {
  backend_for(flat_grad_).fill(flat_grad_, 0.0);
}

void GradientReducer::gather_parameters() {
  autograd::NoGradGuard ng;
  for (const Bucket& b : buckets_) {
    const auto sizes = dist::split_sizes(b.end - b.begin, group_->size());
    int64_t lo = b.begin;
    for (int q = 0; q < group_->rank(); ++q) lo += sizes[q];
    Tensor mine = clone(range(flat_param_, lo, sizes[group_->rank()])).detach();
    Tensor all = range(flat_param_, b.begin, b.end - b.begin);
    group_->all_gather_uneven(mine, all, sizes)->wait();
  }
}

ZeroAdamW::ZeroAdamW(GradientReducer& reducer, optim::AdamWOptions options)
    : reducer_(reducer), options_(options) {
  int64_t n = 0;
  for (const auto& s : reducer_.shard_segments()) n += s.length;
  const Device device = reducer_.flat_params().device();
  m_ = zeros({n}, DType::F32, device);
  v_ = zeros({n}, DType::F32, device);
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

void ZeroAdamW::step(double lr) {
  autograd::NoGradGuard ng;
  ++step_;
  int64_t at = 0;
  Backend& be = backend_for(reducer_.flat_params());
  for (const auto& s : reducer_.shard_segments()) {
    Tensor p = range(reducer_.flat_params(), s.flat_offset, s.length);
    Tensor g = range(reducer_.flat_grads(), s.flat_offset, s.length);
    Tensor m = range(m_, at, s.length), v = range(v_, at, s.length);
    AdamWStep hp;
    hp.lr = lr;
    hp.beta1 = options_.beta1;
    hp.beta2 = options_.beta2;
    hp.eps = options_.eps;
    hp.weight_decay = reducer_.params()[s.param].second.dim() >= 2 ? options_.weight_decay : 0.0;
    hp.step = step_;
    if (master_.defined()) {
      Tensor w = range(master_, at, s.length);
      be.adamw(w, g, m, v, hp);
      copy_(p, w);
    } else {
      be.adamw(p, g, m, v, hp);
    }
    at += s.length;
  }
  reducer_.gather_parameters();
}

}  // namespace triad::dp
