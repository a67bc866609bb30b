#pragma once

// A stand-in for libcudnn's backend (graph) API that runs on the CPU, for
// testing src/backend/cuda/cudnn_attention.cpp without a GPU. It checks
// what a caller hands it the way the real library would reject it (the type
// each attribute takes, required attributes, shapes that fit, every bound
// tensor in the variant pack and no virtual one, descriptors finalized
// before use) and executes an operation graph by interpreting its matmul,
// pointwise, reduction and reshape operations on host memory. Device
// pointers are host pointers here. It cannot tell whether the real library
// has a fused engine for a graph: that needs a GPU.
#include <cstddef>
#include <cstdint>
#include <string>

namespace triad::testing::mock_cudnn {

struct Stats {
  int64_t graphs_finalized = 0;
  int64_t plans_finalized = 0;
  int64_t executions = 0;
  int64_t live_descriptors = 0;
  // What the last BINARY_SELECT executed wrote where its condition was
  // false (the causal mask's fill value).
  float select_fill = 0;
};
Stats stats();
void reset();
// Workspace bytes every plan reports (the engine's own scratch).
constexpr int64_t kEngineWorkspace = 4096;
// When set, heuristics return no engine configuration (cuDNN without an
// engine for the graph).
void set_no_engines(bool none);
// The version cudnnGetVersion reports (default 91900; reset() restores it).
void set_version(size_t version);
// The message of the last rejected call ("" if none).
std::string last_error();

}  // namespace triad::testing::mock_cudnn
