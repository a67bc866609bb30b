#pragma once

// Autograd nodes that more than one op records (ops/*.cpp only).
#include <vector>

#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/core/tensor.h"
#include "triad/ops/linalg.h"

namespace triad::detail {

// The column sums of a linear layer's output gradient that the op consuming
// that output made in its own backward pass (the next layer's
// GELU-derivative product, the add-norm's backward), left for the layer's
// bias: of `grad` (the gradient as that op made it), in f32 or grad's
// dtype. The layer's backward takes them only if the gradient it receives
// is that very tensor (the engine never changes a gradient in place:
// another use of the output would have made a new sum), and clears them.
// The layer's node holds it (Node::output_grad_sums).
struct FusedBiasSums {
  Tensor grad;
  Tensor sums;
  Tensor take(const Tensor& g) {
    Tensor out;
    if (sums.defined() && grad.defined() && g.device() == grad.device() &&
        g.dtype() == grad.dtype() && g.numel() == grad.numel() && g.raw_data() == grad.raw_data()) {
      out = sums;
    }
    grad = Tensor();
    sums = Tensor();
    return out;
  }
};
// Where `t`'s gradient sums may be left: its producer's slot, if t is a
// linear layer's output whose bias trains (else null).
std::shared_ptr<FusedBiasSums> output_grad_sums_of(const Tensor& t);

// `comm` if it has a start (else null), after checking that x, the input
// the layer computes on, needs no gradient other than comm.source's.
const InputGradComm* checked_comm(const char* op, const Tensor& x, const InputGradComm& comm);

// A layer's weight half: the gradients of its deferrable inputs (one entry
// per input, the others undefined) from the input it computed on (`saved`,
// as record_layer was given it) and its output's gradients.
using WeightGradFn =
    std::function<autograd::TensorList(const Tensor& saved, const autograd::TensorList& grads)>;

// Records a layer whose backward splits into an input half (`input_grad`:
// gradients of the inputs not in `deferrable`, one entry per input) and a
// weight half (`weight_grad` of `saved`, the input as the layer computed
// on it). With a `comm` start, input 0's gradient goes through it and
// inputs[0] must be comm->source: the unsplit backward overlaps the
// collective with the weight half; with comm->regather, `saved` is not kept
// but gathered again (InputGradComm). Returns the node, or null when
// nothing needs grad.
std::shared_ptr<autograd::FunctionNode> record_layer(
    const char* op, const autograd::TensorList& inputs, const autograd::TensorList& outputs,
    std::vector<int> deferrable, autograd::BackwardFn input_grad, WeightGradFn weight_grad,
    const Tensor& saved, const InputGradComm* comm);

// GELU's node from `x` to `y` = gelu(x) in `form`; `saved` is x,
// contiguous, kept for the backward (gelu() and linear_gelu() record the
// same node).
void record_gelu(const Tensor& x, const Tensor& saved, const Tensor& y, GeluForm form);

}  // namespace triad::detail
