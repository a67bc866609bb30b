#pragma once

// NCCL process groups for CUDA tensors, and the device-routed group the 3D
// mesh hands out when training on GPUs: CUDA tensors travel through NCCL,
// host tensors (losses, norms, flags) through the MPI group of the same
// ranks. Available in builds with CUDA, MPI and NCCL; elsewhere
// nccl_available() is false and the factories throw NotSupportedError.
#include "triad/dist/process_group.h"

namespace triad::dist {

bool nccl_available();

// An NCCL communicator over the members of `bootstrap` (an MPI group): rank
// 0 creates the unique id, bootstrap broadcasts it, every rank joins on CUDA
// device `device`. The group has its own stream, ordered after the device's
// compute stream at each call. Collective over `bootstrap`.
//
// Its calls return at once, but they run one after another on that stream,
// and an NCCL send finishes only when the peer receives. So point-to-point
// exchanges must go out as one batch_isend_irecv: a send() followed by a
// recv() (fine on the MPI group, whose sends are buffered) deadlocks in a
// ring, every rank's send waiting for a receive queued behind its peer's
// send. The pipeline executor batches each action's sends and receives for
// this reason.
//
// Work::wait() makes the device's compute stream wait for the call, not
// the host: work queued on the compute stream afterwards (including copies
// back to the host) sees the result, and the host runs on. The group's
// watchdog thread enforces the timeout: on a timeout or an asynchronous NCCL
// error it aborts the communicator, and the next call or wait on the group
// raises TimeoutError or Error naming the group, the op, the peers and the
// sizes (a program that never makes one is ended with exit status 1).
// Work::wait_for() and is_completed() look from the host;
// TRIAD_NCCL_BLOCKING_WAIT=1 (read when a group is made) makes wait() block
// the host too.
struct NcclOptions {
  // Point-to-point calls with the previous and the next rank (mod size) go
  // over communicators of two, each with a stream of its own (as PyTorch's
  // NCCL group keeps one per pair of ranks): a send that waits for its
  // receiver holds up nothing to or from the other neighbour. A call with
  // both neighbours still is one NCCL group call. For groups of more than
  // two ranks (with two there is one neighbour); made collectively with the
  // group. The pipeline group takes it (DeviceMesh::use_cuda).
  bool p2p_streams_per_peer = false;
  // All-reduces and reduce-scatters of bf16/f16 tensors sum in their own
  // type on the wire (NCCL's bf16/f16 reductions: half the bytes, each
  // hop's sum rounded to the type) instead of through an f32 copy (the
  // default: one rounding at the end). The data-parallel groups take it
  // under train.grad_precision bf16 (DeviceMesh::use_cuda), as Megatron-LM
  // reduces bf16 gradients.
  bool reduce_half_natively = false;
};
ProcessGroupPtr make_nccl_group(const ProcessGroupPtr& bootstrap, int device,
                                const NcclOptions& options = {});

// Whether the pipeline group takes NcclOptions::p2p_streams_per_peer:
// TRIAD_NCCL_P2P_STREAMS=per-peer (the default) or one. Throws ConfigError
// naming any other value.
bool nccl_p2p_streams_per_peer();

// Routes each call by its tensors' device: CUDA to `nccl`, host to `host`.
// Both must have the same members in the same order.
ProcessGroupPtr make_device_routed_group(ProcessGroupPtr host, ProcessGroupPtr nccl);

}  // namespace triad::dist
