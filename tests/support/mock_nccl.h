#pragma once

// Test controls of the CPU stand-in for NCCL (see mock_nccl.cpp).
namespace triad::testing::mock_nccl {

// The communicator this process created last reports `result` (an
// ncclResult_t) from ncclCommGetAsyncError from now on, until it is
// aborted, as NCCL does after a network failure: the process group's
// watchdog must abort it. Others are unaffected.
void fail_newest_communicator(int result);

// Point-to-point operations (ncclSend, ncclRecv) this process has issued on
// communicators of `size` ranks.
long p2p_operations_on_communicators_of(int size);

// Bytes this process has handed to ncclAllReduce and ncclReduceScatter (each
// call's send buffer), and how many of those calls reduced bf16 or f16.
long reduced_bytes();
long half_reductions();

}  // namespace triad::testing::mock_nccl
