#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"

namespace triad::train {

// Tensors that every rank of `group` holds alike: the same names in the same
// order on each, and the same bytes (a parameter's data-parallel copies, an
// expert's expert-data-parallel ones, a tied embedding's copy on the last
// pipeline stage). `kind` names them in messages ("data-parallel").
struct ReplicaSet {
  std::string kind;
  dist::ProcessGroupPtr group;
  std::vector<std::pair<std::string, Tensor>> tensors;
};

// This rank's words64 checksum (core/checksum.h) of each tensor's bytes, any
// device (a device tensor is copied to the host first).
std::vector<uint64_t> tensor_checksums(const std::vector<std::pair<std::string, Tensor>>& tensors);

// Compares every set's checksums over its group (one all-gather of 8 bytes a
// tensor per set; a group of one rank, or a set without tensors, is
// skipped): a line for each tensor whose replicas differ, naming it, the
// kind, and which world ranks hold which checksum. This rank's view: its
// groups' tensors alone. Collective over each set's group; every rank of a
// group must pass its sets in the same order.
std::vector<std::string> differing_replicas(const std::vector<ReplicaSet>& sets);

}  // namespace triad::train
