#include "triad/parallel/expert/dispatch.h"

#include <map>
#include <numeric>
#include <string>

#include "triad/autograd/grad_mode.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops.h"

namespace triad::ep {

namespace {

// The rows `counts` says this rank receives, exchanged without a graph.
Tensor exchange(const Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                const dist::ProcessGroupPtr& group) {
  autograd::NoGradGuard ng;
  const Tensor in = contiguous(x).detach();
  Shape shape = in.shape();
  shape[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  Tensor out = empty(shape, in.dtype(), in.device());
  group->all_to_all(in, send, out, recv)->wait();
  return out;
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& recv_counts,
                       const dist::ProcessGroupPtr& group) {
  Tensor y = exchange(x, send_counts, recv_counts, group);
  autograd::record("ep_all_to_all", {x}, {y},
                   [send_counts, recv_counts, group](const autograd::TensorList& g) {
                     return autograd::TensorList{exchange(g[0], recv_counts, send_counts, group)};
                   });
  return y;
}

ExpertParallel::ExpertParallel(int64_t experts, dist::ProcessGroupPtr group)
    : experts_(experts), group_(std::move(group)) {
  const int64_t G = group_->size();
  if (experts < 1 || experts % G != 0) {
    throw ConfigError("model.moe.experts (" + std::to_string(experts) +
                      ") must be divisible by parallel.ep (" + std::to_string(G) +
                      "): each expert-parallel rank holds an equal block of the experts");
  }
  count_ = experts / G;
  first_ = group_->rank() * count_;
}

Tensor ExpertParallel::run(const Tensor& rows, const std::vector<int64_t>& per_expert,
                           const Tensor& keys, const RunExpert& expert, bool padded) const {
  const int64_t E = experts_, G = group_->size(), L = count_;
  if (static_cast<int64_t>(per_expert.size()) != E ||
      std::accumulate(per_expert.begin(), per_expert.end(), int64_t{0}) != rows.size(0)) {
    throw ShapeError("ExpertParallel::run: " + std::to_string(per_expert.size()) +
                     " expert counts for rows " + shape_str(rows.shape()) + " and " +
                     std::to_string(E) + " experts (expected one per expert, summing to the rows)");
  }
  if (keys.defined() &&
      (keys.dtype() != DType::I64 || keys.dim() != 1 || keys.numel() != rows.size(0))) {
    throw ShapeError("ExpertParallel::run: keys " + shape_str(keys.shape()) + " " +
                     dtype_name(keys.dtype()) + " for rows " + shape_str(rows.shape()) +
                     " (expected i64, one per row)");
  }
  // Every rank's rows for every expert: counts[s * E + e] (padded, every
  // rank's are this one's).
  std::vector<int64_t> counts(static_cast<size_t>(G * E));
  const bool capturing = backend_for(rows).capturing(rows.device());
  if (capturing && !padded) {
    throw NotSupportedError(
        "ExpertParallel::run inside a CUDA graph's capture: needs rows padded to each expert's "
        "capacity (model.moe.pad_to_capacity)");
  }
  if (padded) {
    for (int64_t s = 0; s < G; ++s)
      std::copy(per_expert.begin(), per_expert.end(), counts.begin() + s * E);
  } else {
    autograd::NoGradGuard ng;
    const Tensor mine = to_device(from_vector(per_expert, {E}, DType::I64), rows.device());
    Tensor all = empty({G * E}, DType::I64, rows.device());
    group_->all_gather(mine, all)->wait();
    const std::vector<double> host = to_double_vector(all);  // (the host waits here)
    for (size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<int64_t>(host[i]);
  }
  auto count = [&](int64_t s, int64_t e) { return counts[static_cast<size_t>(s * E + e)]; };
  const int64_t me = group_->rank();
  std::vector<int64_t> send(static_cast<size_t>(G), 0), recv(static_cast<size_t>(G), 0);
  for (int64_t r = 0; r < G; ++r) {
    for (int64_t l = 0; l < L; ++l) {
      send[static_cast<size_t>(r)] += count(me, r * L + l);
      recv[static_cast<size_t>(r)] += count(r, first_ + l);
    }
  }
  // Rows arrive by source rank, each source's by expert: regroup them by
  // expert (each expert's rows by source) and back.
  const Tensor arrived = all_to_all_rows(rows, send, recv, group_);
  std::vector<int64_t> start(static_cast<size_t>(G), 0);  // each source's first row
  for (int64_t s = 1; s < G; ++s) start[static_cast<size_t>(s)] = start[s - 1] + recv[s - 1];
  // Each local expert's rows are a run of each source's: (first, count).
  std::vector<std::pair<int64_t, int64_t>> runs;
  std::vector<int64_t> by_expert, sizes;
  for (int64_t l = 0; l < L; ++l) {
    int64_t n = 0;
    for (int64_t s = 0; s < G; ++s) {
      int64_t at = start[static_cast<size_t>(s)];
      for (int64_t k = 0; k < l; ++k) at += count(s, first_ + k);
      runs.emplace_back(at, count(s, first_ + l));
      for (int64_t i = 0; i < count(s, first_ + l); ++i) by_expert.push_back(at + i);
      n += count(s, first_ + l);
    }
    sizes.push_back(n);
  }
  std::vector<int64_t> back(by_expert.size());
  for (size_t i = 0; i < by_expert.size(); ++i)
    back[static_cast<size_t>(by_expert[i])] = static_cast<int64_t>(i);
  auto index = [](const std::vector<int64_t>& v) {
    return from_vector(v, {static_cast<int64_t>(v.size())}, DType::I64, Device::cpu());
  };
  // The host's indices (their uploads queued, no wait); inside a capture,
  // which cannot upload, the device copies a padded call outside it left.
  Tensor to_expert = index(by_expert), to_source = index(back);
  if (padded && rows.device().is_cuda()) {
    auto& [forward, backward] = padded_indices_[per_expert];
    if (!forward.defined() || !(forward.device() == rows.device())) {
      if (capturing) {
        throw NotSupportedError(
            "ExpertParallel::run: a padded exchange's first call is inside a CUDA graph's "
            "capture (run one step uncaptured first, as train.cuda_graph does)");
      }
      forward = to_device(to_expert, rows.device());
      backward = to_device(to_source, rows.device());
    }
    if (capturing) {
      to_expert = forward;
      to_source = backward;
    }
  }
  const Tensor grouped = embedding(arrived, to_expert);
  // The keys likewise (integers; no gradient), regrouped by the same runs
  // where they are: nothing read on the host, so a capture holds it.
  Tensor grouped_keys;
  if (keys.defined()) {
    autograd::NoGradGuard ng;
    const Tensor got = exchange(reshape(keys, {keys.numel(), 1}), send, recv, group_);
    std::vector<Tensor> pieces;
    for (const auto& [first, n] : runs)
      if (n > 0) pieces.push_back(narrow(got, 0, first, n));
    grouped_keys = pieces.empty()
                       ? empty({0}, DType::I64, keys.device())
                       : reshape(concat(pieces, 0), {static_cast<int64_t>(by_expert.size())});
  }
  // (Split as one op: the rows' gradient is the experts' side by side.)
  std::vector<Tensor> outputs = split(grouped, sizes, 0);
  int64_t at = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t n = sizes[static_cast<size_t>(l)];
    Tensor& part = outputs[static_cast<size_t>(l)];
    part = expert(l, part, keys.defined() ? narrow(grouped_keys, 0, at, n) : Tensor{});
    at += n;
  }
  const Tensor done = embedding(concat(outputs, 0), to_source);  // by source again
  return all_to_all_rows(done, recv, send, group_);
}

}  // namespace triad::ep
