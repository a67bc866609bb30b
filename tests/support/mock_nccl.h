#pragma once

// Test controls of the CPU stand-in for NCCL (see mock_nccl.cpp).
namespace triad::testing::mock_nccl {

// The communicator this process created last reports `result` (an
// ncclResult_t) from ncclCommGetAsyncError from now on, until it is
// aborted, as NCCL does after a network failure: the process group's
// watchdog must abort it. Others are unaffected.
void fail_newest_communicator(int result);

}  // namespace triad::testing::mock_nccl
