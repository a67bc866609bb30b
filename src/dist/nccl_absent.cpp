// triad::dist's NCCL entry points in a build without CUDA, MPI or NCCL.
#include "triad/dist/nccl.h"

namespace triad::dist {

bool nccl_available() {
  return false;
}

ProcessGroupPtr make_nccl_group(const ProcessGroupPtr&, int, const NcclOptions&) {
  throw NotSupportedError(
      "make_nccl_group: this build has no NCCL process group (it needs TRIAD_WITH_CUDA, "
      "TRIAD_WITH_MPI and NCCL)");
}

ProcessGroupPtr make_device_routed_group(ProcessGroupPtr, ProcessGroupPtr) {
  throw NotSupportedError(
      "make_device_routed_group: this build has no NCCL process group (it needs "
      "TRIAD_WITH_CUDA, TRIAD_WITH_MPI and NCCL)");
}

}  // namespace triad::dist
