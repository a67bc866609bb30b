#include "triad/parallel/tensor/layers.h"

#include <cmath>
#include <limits>

#include "triad/autograd/grad_mode.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops.h"
#include "triad/parallel/tensor/mappings.h"

namespace triad::tp {

namespace {
void divisible(int64_t n, int64_t by, const std::string& what) {
  if (by <= 0 || n % by != 0) {
    throw ConfigError(what + " (" + std::to_string(n) + ") must be divisible by " +
                      std::to_string(by));
  }
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, dist::ProcessGroupPtr group,
                                           bool sequence_parallel, int groups, bool bias)
    : group_(std::move(group)), sp_(sequence_parallel) {
  divisible(out, static_cast<int64_t>(groups) * group_->size(), "column-parallel output features");
  weight_spec_ = ShardSpec::along(0, groups);
  bias_spec_ = ShardSpec::along(0, groups);
  weight_ = register_parameter("weight", zeros({out / group_->size(), in}));
  if (bias) bias_ = register_parameter("bias", zeros({out / group_->size()}));
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in, const std::vector<int64_t>& blocks,
                                           dist::ProcessGroupPtr group, bool sequence_parallel,
                                           bool bias, const std::vector<int64_t>& units)
    : group_(std::move(group)), sp_(sequence_parallel) {
  int64_t out = 0;
  for (int64_t b : blocks) out += b;
  weight_spec_ = ShardSpec::along_blocks(0, blocks, units);
  bias_spec_ = weight_spec_;
  weight_spec_.check_cut(out, group_->size(), {out, in});
  const int64_t local = weight_spec_.shard_shape({out, in}, group_->size())[0];
  weight_ = register_parameter("weight", zeros({local, in}));
  if (bias) bias_ = register_parameter("bias", zeros({local}));
}

// The region's entry is fused into the linear node, so the input
// gradient's collective overlaps the weight gradient's GEMM. With adapters
// the entry is an op of its own: the layer's and the adapters' input
// gradients add up before the one collective (the frozen weight has no
// weight-gradient GEMM to overlap anyway).
Tensor ColumnParallelLinear::forward(const Tensor& x, const nn::DropoutDraw& draw) const {
  if (has_lora()) {
    const Tensor in = group_->size() == 1 ? x
                      : sp_               ? gather_from_sequence_region(x, group_)
                                          : copy_to_region(x, group_);
    return add_lora(linear(in, weight_, bias_), in, draw);
  }
  const RegionInput in = enter_region(x, group_, sp_);
  return linear(in.input, weight_, bias_, in.comm);
}

LinearGelu ColumnParallelLinear::forward_gelu(const Tensor& x, const nn::DropoutDraw& draw) const {
  if (has_lora()) {
    const Tensor pre = forward(x, draw);
    return {pre, gelu(pre)};
  }
  const RegionInput in = enter_region(x, group_, sp_);
  return linear_gelu_parts(in.input, weight_, bias_, in.comm);
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, dist::ProcessGroupPtr group,
                                     bool sequence_parallel, bool bias)
    : group_(std::move(group)), sp_(sequence_parallel) {
  divisible(in, group_->size(), "row-parallel input features");
  weight_spec_ = ShardSpec::along(1);
  bias_spec_ = ShardSpec::replicated(sequence_parallel);
  weight_ = register_parameter("weight", zeros({out, in / group_->size()}));
  if (bias) bias_ = register_parameter("bias", zeros({out}));
  set_lora_input_shard(group_->rank() * (in / group_->size()), in);
}

Tensor RowParallelLinear::partial(const Tensor& x, const nn::DropoutDraw& draw) const {
  return add_lora(linear(x, weight_), x, draw);
}

Tensor RowParallelLinear::partial_after_gelu(const LinearGelu& in,
                                             const nn::DropoutDraw& draw) const {
  return add_lora(linear_after_gelu(in, weight_), in.act, draw);
}

// The partial products summed over the group (or reduce-scattered along T),
// then the replicated biases.
Tensor RowParallelLinear::reduce(const Tensor& partial, const RowParallelLinear* other) const {
  if (other && (other->group_ != group_ || other->sp_ != sp_))
    throw ValueError("RowParallelLinear::reduce: the other layer has another group or layout");
  Tensor y = sp_ ? reduce_scatter_to_sequence_region(partial, group_)
                 : reduce_from_region(partial, group_);
  if (bias_.defined()) y = add(y, bias_);
  if (other && other->bias_.defined()) y = add(y, other->bias_);
  return y;
}

Tensor RowParallelLinear::forward(const Tensor& x, const nn::DropoutDraw& draw) const {
  return reduce(partial(x, draw));
}

Tensor RowParallelLinear::forward_after_gelu(const LinearGelu& in,
                                             const nn::DropoutDraw& draw) const {
  return reduce(partial_after_gelu(in, draw));
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t vocab_size, int64_t dim,
                                               dist::ProcessGroupPtr group, bool sequence_parallel,
                                               bool bias)
    : group_(std::move(group)), sp_(sequence_parallel), vocab_(vocab_size) {
  const int64_t vp = padded_vocab(vocab_size, group_->size());
  const int64_t rows = vp / group_->size();
  start_ = group_->rank() * rows;
  valid_ = std::max<int64_t>(0, std::min(rows, vocab_size - start_));
  spec_ = ShardSpec::along(0, 1, vp);
  weight_ = register_parameter("weight", zeros({rows, dim}));
  if (bias) bias_ = register_parameter("bias", zeros({rows}));
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  if (group_->size() == 1) {
    // The whole table: a plain lookup (the embedding checks the ids, on the
    // device inside a CUDA graph's capture, where they cannot be read here).
    const Tensor lookup = embedding(weight_, ids);
    return sp_ ? reduce_scatter_to_sequence_region(lookup, group_)
               : reduce_from_region(lookup, group_);
  }
  // Ids outside this rank's range look up row 0 and are zeroed.
  Backend& be = backend_for(ids);
  if (be.capturing(ids.device())) {
    // Inside a CUDA graph's capture the ids cannot be read here: the local
    // ids and marks are formed on the device (the ids checked there, by
    // cuda::Graph::check), and the marks always multiply: by 1 where the
    // host would skip them, the same bits.
    Tensor local = empty(ids.shape(), DType::I64, ids.device());
    Shape mask_shape = ids.shape();
    mask_shape.push_back(1);
    Tensor keep = empty(mask_shape, weight_.dtype(), ids.device());
    be.vocab_shard_ids(ids, start_, valid_, vocab_, local, keep, "VocabParallelEmbedding");
    const Tensor masked = mul(embedding(weight_, local), keep);
    return sp_ ? reduce_scatter_to_sequence_region(masked, group_)
               : reduce_from_region(masked, group_);
  }
  std::vector<int64_t> local;
  std::vector<double> keep;
  bool all_mine = true;
  {
    auto v = to_double_vector(ids);
    local.reserve(v.size());
    keep.reserve(v.size());
    for (double d : v) {
      const int64_t i = static_cast<int64_t>(d) - start_;
      const bool mine = i >= 0 && i < valid_;
      local.push_back(mine ? i : 0);
      keep.push_back(mine ? 1.0 : 0.0);
      all_mine = all_mine && mine;
    }
  }
  Tensor lookup = embedding(weight_, from_vector(local, ids.shape(), DType::I64, ids.device()));
  // Every id in this rank's range (always without tensor parallelism): no
  // mask to multiply by, forward or backward.
  Tensor masked = lookup;
  if (!all_mine) {
    Shape mask_shape = ids.shape();
    mask_shape.push_back(1);
    masked = mul(lookup, from_vector(keep, mask_shape, weight_.dtype(), weight_.device()));
  }
  return sp_ ? reduce_scatter_to_sequence_region(masked, group_)
             : reduce_from_region(masked, group_);
}

namespace {

// The statistics the vocab-parallel cross entropy's backward needs (never
// the loss: a closure holding its own output would keep the graph alive).
struct VocabCrossEntropy {
  Tensor targets, gmax, sumexp;
  // The rows the mean is over: 1 for each, 0 for an ignored one ((N), the
  // statistics' dtype on the logits' device); undefined: every row. Their
  // count: `count` read on the host, or inside a CUDA graph's capture
  // `inv_count` (1 / count, one element on the device) counted there.
  Tensor counted, inv_count;
  int64_t count = 0;
  Tensor lse;  // (N) each row's log-sum-exp, when a z-loss was asked for
  int64_t vocab_start = 0, valid = 0;
  double softcap = 0.0;  // > 0: the logits are soft-capped (the gradient is the uncapped ones')
  // > 0: the z-loss joins the loss's gradient, each row's dlse (lse * dloss)
  // * z_scale (twice its coefficient); 0: from its own gradient, if any.
  double z_scale = 0.0;

  // dlogits (the logits' layout; may be the logits) from the gradients of
  // the loss and (g[1], when there) of the z-loss.
  void backward(const autograd::TensorList& g, const Tensor& logits, Tensor& dlogits) const {
    const int64_t N = logits.size(0);
    const DType sd = stat_dtype(logits.dtype());
    // dloss_i = g / count for every row counted, 0 for the others, on the
    // device.
    Tensor dl = per_row(g[0], N, sd);
    // The z-loss's: its rows weigh as the loss's (ignored rows 0): grad_z *
    // 2 * lse_i / count.
    Tensor dlse;
    if (z_scale != 0.0) {
      dlse = joined_z_loss_dlse(lse, dl, z_scale);
    } else if (g.size() > 1 && g[1].defined()) {
      dlse = mul(per_row(g[1], N, sd), lse);
      backend_for(dlse).affine(dlse, 2.0, 0.0, dlse);
    }
    backend_for(logits).vocab_ce_backward(logits, targets, vocab_start, valid, gmax, sumexp, dl,
                                          dlse, dlogits, softcap);
  }

  // A scalar gradient g as each row's share of a mean over the counted
  // rows: g / count on those, 0 on the others ((N), dtype sd).
  Tensor per_row(const Tensor& g, int64_t N, DType sd) const {
    Tensor gl = cast(g, sd);
    Tensor d = empty({N}, sd, gl.device());
    Backend& be = backend_for(gl);
    be.copy(make_view(gl, {N}, {0}, gl.offset()), d);
    if (inv_count.defined()) {
      be.binary(BinaryOp::Mul, d, make_view(inv_count, {N}, {0}, inv_count.offset()), d);
    } else {
      be.affine(d, count ? 1.0 / static_cast<double>(count) : 0.0, 0.0, d);
    }
    if (counted.defined()) be.binary(BinaryOp::Mul, d, counted, d);
    return d;
  }

  // sum_i counted_i * x_i / count: the mean of x (N) over the counted rows,
  // formed alike whether the count is the host's or the device's.
  Tensor counted_mean(const Tensor& x) const {
    const int64_t N = x.numel();
    Backend& be = backend_for(x);
    Tensor total = empty({}, x.dtype(), x.device());
    be.reduce(ReduceOp::Sum, counted.defined() ? mul(x, counted) : x, 1, N, 1, total, nullptr);
    if (inv_count.defined()) return mul(total, inv_count).detach();
    return cast(scale(total, count ? 1.0 / static_cast<double>(count) : 0.0), x.dtype()).detach();
  }
};

constexpr int64_t kIgnoreIndex = -100;

// The rows a mean is over when some targets are `ignore_index` (nn's
// cross_entropy convention: they add nothing, and the mean is over the
// others) into r.counted and their count: read on the host, or inside a
// CUDA graph's capture (which cannot read them) marked and counted on the
// device (targets there), the marks then always formed.
void count_targets(VocabCrossEntropy& r, int64_t ignore_index, DType sd, const Device& device,
                   const char* op) {
  const int64_t N = r.targets.numel();
  Backend& be = backend_for(device.type);
  if (be.capturing(device)) {
    if (r.targets.device() != device) {
      throw NotSupportedError(std::string(op) + ": targets on " + r.targets.device().str() +
                              " inside a CUDA graph's capture (expected them on the logits' " +
                              "device " + device.str() + ", refilled before each replay)");
    }
    // (The targets' range is the caller's: a shard does not know the whole
    // vocabulary. TensorParallelGpt checks it.)
    r.inv_count = empty({}, sd, device);
    be.inverse_target_count(r.targets, ignore_index, std::numeric_limits<int64_t>::max(),
                            r.inv_count, op);
    r.counted = empty({N}, sd, device);
    be.binary(BinaryOp::Eq, cast(r.targets, sd),
              full({N}, static_cast<double>(ignore_index), sd, device), r.counted);
    be.affine(r.counted, -1.0, 1.0, r.counted);
    return;
  }
  const Tensor host = contiguous(cast(to_device(r.targets, Device::cpu()), DType::I64));
  const int64_t* p = host.data<int64_t>();
  std::vector<double> keep(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    keep[static_cast<size_t>(i)] = p[i] != ignore_index;
    r.count += p[i] != ignore_index;
  }
  if (r.count < N) r.counted = from_vector(keep, {N}, sd, device);
}

// The forward over logits (N, Vl) (contiguous or row-strided): the mean
// loss into *loss and, when z_loss is not null, the mean over the same rows
// of the squared log-sum-exp into *z_loss.
VocabCrossEntropy vocab_cross_entropy(const Tensor& lc, const Tensor& targets, int64_t vocab_start,
                                      int64_t valid, const dist::ProcessGroupPtr& group,
                                      Tensor* loss, Tensor* z_loss) {
  const int64_t N = lc.size(0);
  const DType sd = stat_dtype(lc.dtype());
  VocabCrossEntropy r;
  r.vocab_start = vocab_start;
  r.valid = valid;
  r.targets = reshape(contiguous(targets).detach(), {N}).detach();
  count_targets(r, kIgnoreIndex, sd, lc.device(), "vocab_parallel_cross_entropy");
  if (r.targets.device().is_cpu() && !lc.device().is_cpu()) {
    r.targets = to_device(r.targets, lc.device()).detach();
  }
  Backend& be = backend_for(lc);
  // One pass over this shard's logits: each row's max over the shard, its
  // sum of exponentials against that max, and the target's logit where the
  // shard holds it. The rows' max over every shard, M, is all-reduced; each
  // shard's sum times exp(its max - M) is its sum against M (the factor 1
  // exactly on the shard holding the max), and those go into one sum over
  // the shards with the target's logit: two collectives and one read of
  // the logits (three and two, with the max taken first and the
  // exponentials summed in a second pass against it).
  Tensor shard_max = empty({N}, sd, lc.device());
  Tensor sums = empty({2, N}, sd, lc.device());  // the target's logit, then the sum against M
  Tensor tlogit = make_view(sums, {N}, {1}, 0);
  r.sumexp = make_view(sums, {N}, {1}, N);
  be.vocab_ce_shard_sums(lc, r.targets, vocab_start, valid, shard_max, r.sumexp, tlogit);
  r.gmax = clone(shard_max).detach();
  group->all_reduce(r.gmax, dist::ReduceOp::Max)->wait();
  // (exp(shard max - M) as the sum of exponentials of an (N, 1) row.)
  Tensor factor = empty({N}, sd, lc.device());
  be.vocab_ce_sumexp(reshape(shard_max, {N, 1}), r.gmax, 1, factor);
  be.binary(BinaryOp::Mul, r.sumexp, factor, r.sumexp);
  group->all_reduce(sums, dist::ReduceOp::Sum)->wait();
  // loss_i = log(sum exp(z - max)) + max - z_target, and their mean, on the
  // logits' device (reading them here would make the host wait for it).
  Tensor losses = empty({N}, sd, lc.device());
  be.vocab_ce_loss(r.gmax, tlogit, r.sumexp, losses);
  *loss = r.counted_mean(losses);  // (f32 for half logits)
  if (z_loss) {
    // lse_i = log(sumexp_i) + max_i: the loss of a target logit 0.
    r.lse = empty({N}, sd, lc.device());
    be.vocab_ce_loss(r.gmax, zeros({N}, sd, lc.device()), r.sumexp, r.lse);
    *z_loss = r.counted_mean(mul(r.lse, r.lse));
  }
  return r;
}

void check_vocab_targets(const char* op, const Tensor& targets, int64_t rows, const Tensor& input) {
  if (targets.numel() != rows) {
    throw ShapeError(std::string(op) + ": " + std::to_string(targets.numel()) + " targets for " +
                     std::to_string(rows) + " rows of " + shape_str(input.shape()));
  }
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, int64_t valid,
                                    const dist::ProcessGroupPtr& group, Tensor* z_loss) {
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  check_vocab_targets("vocab_parallel_cross_entropy", targets, N, logits);
  Tensor lc = reshape(contiguous(logits).detach(), {N, V}).detach();
  Tensor loss;
  const VocabCrossEntropy ce =
      vocab_cross_entropy(lc, targets, vocab_start, valid, group, &loss, z_loss);
  const Shape ls = logits.shape();
  autograd::TensorList outputs{loss};
  if (z_loss) outputs.push_back(*z_loss);
  autograd::record("vocab_parallel_cross_entropy", {logits}, outputs,
                   [lc, ce, ls](const autograd::TensorList& g) -> autograd::TensorList {
                     Tensor d = empty_like(lc);
                     ce.backward(g, lc, d);
                     return {reshape(d, ls)};
                   });
  if (z_loss) *z_loss = outputs[1];
  return outputs[0];
}

Tensor vocab_parallel_linear_cross_entropy(const Tensor& x, const Tensor& weight,
                                           const Tensor& targets, int64_t vocab_start,
                                           int64_t valid, const dist::ProcessGroupPtr& group,
                                           double softcap, const InputGradComm& comm,
                                           const Tensor& bias, Tensor* z_loss, double expected_grad,
                                           double z_loss_coef) {
  const char* op = "vocab_parallel_linear_cross_entropy";
  const int64_t C = x.dim() ? x.size(-1) : 0;
  check_vocab_targets(op, targets, C ? x.numel() / C : 0, x);
  check_z_loss_coef(op, z_loss_coef);
  const bool z_joins = z_loss && z_loss_coef > 0;
  // A group of one rank holds the whole vocabulary (every run without
  // tensor parallelism): nothing to reduce between the loss's passes, so
  // it is one process's cross entropy over the valid columns, its gradient
  // written with it where expected_grad allows (one read of the logits
  // where the shard's statistics, the loss and the backward take two and
  // two collectives). The padding columns get no gradient, as below.
  const bool whole = group->size() == 1 && vocab_start == 0;
  const double ahead = whole ? head_grad_ahead(x, weight, bias, expected_grad) : 0.0;
  const autograd::TensorList out = linear_head_loss(
      op, x, weight, bias,
      [&](const Tensor& logits) {
        if (whole) {
          const int64_t V = logits.size(1);
          if (valid < 1 || valid > V) {
            throw ValueError(std::string(op) + ": " + std::to_string(valid) +
                             " valid classes of a shard of " + std::to_string(V) +
                             " (expected 1 to " + std::to_string(V) + ")");
          }
          HeadLoss head = cross_entropy_head(op, narrow(logits, 1, 0, valid), targets, kIgnoreIndex,
                                             softcap, z_loss, ahead, z_loss_coef);
          return HeadLoss{
              head.loss, head.z_loss,
              [backward = std::move(head.backward), valid, V](const autograd::TensorList& g,
                                                              Tensor& dlogits) {
                Tensor kept = narrow(dlogits, 1, 0, valid);
                backward(g, kept);
                if (valid == V) return;
                Tensor padding = narrow(dlogits, 1, valid, V - valid);
                const Tensor zero = zeros({1}, dlogits.dtype(), dlogits.device());
                backend_for(dlogits).copy(make_view(zero, padding.shape(), {0, 0}, 0), padding);
              }};
        }
        Tensor loss, z;
        VocabCrossEntropy ce = vocab_cross_entropy(logits, targets, vocab_start, valid, group,
                                                   &loss, z_loss ? &z : nullptr);
        ce.softcap = softcap;
        if (z_joins) {  // (a value beside the loss, not a second output)
          ce.z_scale = 2.0 * z_loss_coef;
          *z_loss = z;
          z = Tensor();
        }
        return HeadLoss{loss, z,
                        [ce = std::move(ce)](const autograd::TensorList& g, Tensor& dlogits) {
                          ce.backward(g, dlogits, dlogits);
                        }};
      },
      softcap, comm);
  if (z_loss && !z_joins) *z_loss = out[1];
  return out[0];
}

}  // namespace triad::tp
