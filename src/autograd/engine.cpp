#include "triad/autograd/engine.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"

namespace triad::autograd {
namespace {

Tensor zeros_for(const OutputMeta& meta) {
  Tensor z = empty(meta.shape, meta.dtype, meta.device);
  backend_for(meta.device.type).fill(z, 0.0);
  return z;
}

// buffer += g without mutating either operand (both may be referenced elsewhere).
void accumulate_into(Tensor& buffer, const Tensor& g) {
  if (!buffer.defined()) {
    buffer = g;
    return;
  }
  Tensor sum = empty(buffer.shape(), buffer.dtype(), buffer.device());
  backend_for(buffer).binary(BinaryOp::Add, buffer, g, sum);
  buffer = sum;
}

// A gradient must match the tensor it is for: a backward that returns one
// of another dtype (say f32 for a bf16 activation) would otherwise surface
// later as a mixed-dtype kernel call far from its cause.
void check_gradient(const Node& from, const Node& to, int input_nr, const Tensor& g) {
  if (input_nr >= static_cast<int>(to.outputs.size())) return;
  const OutputMeta& meta = to.outputs[static_cast<size_t>(input_nr)];
  if (g.dtype() != meta.dtype || g.shape() != meta.shape) {
    throw Error("backward: " + from.name() + " produced a gradient " + g.str() + " for output " +
                std::to_string(input_nr) + " of " + to.name() + ", which is " +
                dtype_name(meta.dtype) + " " + shape_str(meta.shape));
  }
}

bool deferral_possible(const Node& node) {
  for (int i : node.deferrable_inputs()) {
    const Edge& e = node.next_edges.at(i);
    if (e.valid() && !e.node->is_accumulate_grad()) return false;
  }
  return !node.deferrable_inputs().empty();
}

// The store of the innermost backward running on this thread.
thread_local WeightGradStore* t_weight_grad_store = nullptr;

class CurrentStoreScope {
 public:
  explicit CurrentStoreScope(WeightGradStore* store) : previous_(t_weight_grad_store) {
    t_weight_grad_store = store;
  }
  ~CurrentStoreScope() { t_weight_grad_store = previous_; }
  CurrentStoreScope(const CurrentStoreScope&) = delete;
  CurrentStoreScope& operator=(const CurrentStoreScope&) = delete;

 private:
  WeightGradStore* previous_;
};

}  // namespace

WeightGradStore* current_weight_grad_store() {
  return t_weight_grad_store;
}

void backward(const TensorList& outputs, const TensorList& grad_outputs,
              const BackwardOptions& options) {
  const CurrentStoreScope store_scope(options.defer_weight_grads);
  if (!grad_outputs.empty() && grad_outputs.size() != outputs.size()) {
    throw ValueError("backward: " + std::to_string(outputs.size()) + " outputs but " +
                     std::to_string(grad_outputs.size()) + " gradients");
  }
  NoGradGuard no_grad;  // gradients themselves are not differentiated

  std::unordered_map<Node*, std::shared_ptr<Node>> alive;
  std::unordered_map<Node*, TensorList> buffers;
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> roots;

  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    Edge edge = gradient_edge(out);
    if (!edge.valid()) {
      throw ValueError("backward: output " + std::to_string(i) + " does not require grad");
    }
    Tensor seed;
    if (grad_outputs.empty()) {
      if (out.numel() != 1) {
        throw ShapeError("backward: implicit gradient needs a one-element output, got shape " +
                         shape_str(out.shape()) + " (pass grad_outputs)");
      }
      seed = empty(out.shape(), out.dtype(), out.device());
      backend_for(out).fill(seed, 1.0);
    } else {
      seed = grad_outputs[i];
      if (!seed.defined() || seed.shape() != out.shape()) {
        throw ShapeError("backward: gradient for output " + std::to_string(i) + " has shape " +
                         (seed.defined() ? shape_str(seed.shape()) : std::string("undefined")) +
                         ", expected " + shape_str(out.shape()));
      }
    }
    Node* n = edge.node.get();
    alive[n] = edge.node;
    auto& buf = buffers[n];
    buf.resize(std::max<size_t>(buf.size(), std::max<size_t>(n->outputs.size(), 1)));
    accumulate_into(buf[edge.input_nr], seed);
    // (Outputs of one node, or one output twice, make one root: its edges
    // are counted once.)
    if (std::find(roots.begin(), roots.end(), n) == roots.end()) roots.push_back(n);
  }

  // Count, for every reachable node, how many edges lead into it.
  {
    std::vector<Node*> stack(roots.begin(), roots.end());
    std::unordered_set<Node*> seen(roots.begin(), roots.end());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.valid()) continue;
        Node* c = e.node.get();
        ++dependencies[c];
        if (seen.insert(c).second) {
          alive[c] = e.node;
          stack.push_back(c);
        }
      }
    }
  }

  std::vector<Node*> ready;
  {
    std::unordered_set<Node*> queued;
    for (Node* r : roots) {
      if (dependencies[r] == 0 && queued.insert(r).second) ready.push_back(r);
    }
  }

  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    TensorList grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(std::max<size_t>({n->outputs.size(), grads.size(), size_t{1}}));
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      if (!grads[i].defined()) grads[i] = zeros_for(n->outputs[i]);
    }

    TensorList input_grads;
    if (options.defer_weight_grads && deferral_possible(*n)) {
      BackwardFn weight_fn;
      input_grads = n->apply_split(grads, weight_fn);
      if (weight_fn) {
        std::vector<Edge> edges = n->next_edges;
        options.defer_weight_grads->push([weight_fn, grads, edges]() {
          NoGradGuard guard;
          TensorList wg = weight_fn(grads);
          for (size_t i = 0; i < edges.size() && i < wg.size(); ++i) {
            if (!wg[i].defined() || !edges[i].valid()) continue;
            TensorList one;  // the only handle, so a leaf may take it as its gradient
            one.push_back(std::move(wg[i]));
            edges[i].node->apply(one);
          }
        });
      }
    } else {
      input_grads = n->apply(grads);
    }
    if (!options.retain_graph) n->release_saved();

    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.valid()) continue;
      Node* c = e.node.get();
      if (i < input_grads.size() && input_grads[i].defined()) {
        check_gradient(*n, *c, e.input_nr, input_grads[i]);
        auto& buf = buffers[c];
        buf.resize(std::max<size_t>(buf.size(), std::max<size_t>(c->outputs.size(), 1)));
        accumulate_into(buf[e.input_nr], input_grads[i]);
      }
      if (--dependencies[c] == 0) ready.push_back(c);
    }
  }
}

}  // namespace triad::autograd
