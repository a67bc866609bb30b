#pragma once

#include <vector>

#include "triad/autograd/node.h"
#include "triad/autograd/weight_grad_store.h"

namespace triad::autograd {

struct BackwardOptions {
  // Keep saved tensors so the graph can be run again.
  bool retain_graph = false;
  // When set, nodes that support it compute input gradients now and push
  // their weight-gradient work here, to be run later by store.flush().
  WeightGradStore* defer_weight_grads = nullptr;
};

// Runs backward from `outputs`, seeding each with the matching entry of
// `grad_outputs` (which must have the output's shape). An empty grad_outputs
// list is allowed only for a single one-element output (seeded with 1).
// Iterative: a node runs once all its consumers have delivered gradients.
void backward(const TensorList& outputs, const TensorList& grad_outputs = {},
              const BackwardOptions& options = {});

// The weight-gradient store of the backward pass running on this thread
// (nullptr outside backward or when it does not defer). A node whose
// backward runs a nested backward (activation recomputation) passes it on,
// so deferred weight gradients stay deferred inside recomputed blocks.
WeightGradStore* current_weight_grad_store();

}  // namespace triad::autograd
