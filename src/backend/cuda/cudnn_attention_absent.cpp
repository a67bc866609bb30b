// cuDNN attention in a CUDA build without cuDNN (no cudnn.h or libcudnn
// found at configure time): never available, and says why.
#include "cudnn_attention.h"
#include "triad/core/error.h"

namespace triad::detail {
namespace {
const char* const kAbsent =
    "this build has no cuDNN (configure with cudnn.h and libcudnn under CUDNN_ROOT or "
    "/usr/local/cuda)";
}  // namespace

bool cudnn_attention_compiled() {
  return false;
}

std::string cudnn_attention_unavailable(const cudnn_graph::AttentionProblem&, int) {
  return kAbsent;
}

size_t cudnn_attention_workspace(int, const cudnn_graph::AttentionProblem&, bool, bool) {
  throw NotSupportedError(std::string("cudnn attention: ") + kAbsent);
}

void cudnn_attention_forward(int, cudaStream_t, const cudnn_graph::AttentionProblem&, const void*,
                             void*, float*, void*) {
  throw NotSupportedError(std::string("cudnn attention: ") + kAbsent);
}

void cudnn_attention_backward(int, cudaStream_t, const cudnn_graph::AttentionProblem&, const void*,
                              const void*, const float*, const void*, void*, void*, bool) {
  throw NotSupportedError(std::string("cudnn attention: ") + kAbsent);
}

}  // namespace triad::detail
