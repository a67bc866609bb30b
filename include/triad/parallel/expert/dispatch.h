#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"
#include "triad/nn/moe.h"

namespace triad::ep {

// Expert parallelism (Lepikhin et al., 2020, GShard; Megatron-LM's
// expert-parallel MoE): a mixture's experts spread over the ranks of an
// expert-parallel group, tokens moved to the rank of each expert they are
// routed to and the outputs moved back, by all-to-all exchanges.

// An all-to-all of rows as a differentiable op: this rank sends
// send_counts[r] rows of x (dim 0, the pieces in rank order) to rank r and
// gets back the rows the group's ranks send it, recv_counts[r] from rank r
// in rank order (dist::ProcessGroup::all_to_all). Backward sends each row's
// gradient back to where the row came from.
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& recv_counts, const dist::ProcessGroupPtr& group);

// Experts [rank * E/G, (rank + 1) * E/G) of E on each of a group's G ranks.
// run() tells every rank how many rows this one sends each expert (an
// all-gather of the per-expert counts, read on the host), sends each
// expert's rows to its rank (all_to_all_rows), runs this rank's experts on
// the rows every rank sent them (grouped by expert), and sends the outputs
// back in the rows' order (the rows' keys, if any, travel with them: one
// more all-to-all of M integers, regrouped on their device by the same
// runs as the rows). Every rank of the group runs it together
// (a collective, once per MoE layer and micro-batch). Padded, the counts
// are every rank's own and the regrouping's indices the same each call:
// made on the host outside a CUDA graph's capture, and inside one read
// from the device copies the first call outside it left.
class ExpertParallel final : public nn::ExpertPlacement {
 public:
  // ConfigError unless the group's size divides `experts`.
  ExpertParallel(int64_t experts, dist::ProcessGroupPtr group);
  int64_t first() const override { return first_; }
  int64_t count() const override { return count_; }
  Tensor run(const Tensor& rows, const std::vector<int64_t>& per_expert, const Tensor& keys,
             const RunExpert& expert, bool padded) const override;
  const dist::ProcessGroupPtr& group() const { return group_; }

 private:
  int64_t experts_, first_, count_;
  dist::ProcessGroupPtr group_;
  // Padded: the regrouping's indices (to expert order, and back) on the
  // rows' device, by the per-expert counts they are for.
  mutable std::map<std::vector<int64_t>, std::pair<Tensor, Tensor>> padded_indices_;
};

}  // namespace triad::ep
