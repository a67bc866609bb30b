#pragma once

#include <string>
#include <utility>
#include <vector>

namespace triad::plan {

// The hardware the planner prices a run on, read from a cluster YAML
// (configs/clusters/*.yaml; docs/planner.md lists every key).
struct ClusterSpec {
  std::string name;
  int gpus_per_node = 8;
  std::string gpu_name;
  double peak_flops = 0;        // dense fp16/bf16 FLOP/s per GPU
  int sm_count = 108;           // streaming multiprocessors (GEMM wave quantisation)
  double memory_bytes = 0;      // per GPU
  double memory_bandwidth = 0;  // bytes/s per GPU
  double intra_bandwidth = 0;   // bytes/s per GPU per direction (NVLink)
  double intra_latency = 0;     // s
  double inter_bandwidth = 0;   // bytes/s per node per direction (all NICs)
  double inter_latency = 0;     // s
  // Achievable fractions (see docs/planner.md for the argument behind each).
  double gemm_efficiency = 0.7;        // large GEMMs, fraction of peak_flops
  double memory_efficiency = 0.8;      // memory-bound kernels, of memory_bandwidth
  double collective_efficiency = 0.8;  // NCCL bus bandwidth, of link bandwidth
  // Fused (flash) attention, fraction of peak_flops, forward and backward
  // together: one fraction for every length, or a curve of (keys a query
  // sees, fraction) points measured at those lengths (attention_curve, by
  // length; efficiency.attention: {1024: 0.22, 4096: 0.29}), whose kernels
  // run longer rows faster. Neither: three quarters of gemm_efficiency
  // (FlashAttention-2 reaches 50-73% of an A100's peak forward and
  // backward, where large GEMMs reach about 80-90%).
  double attention_efficiency = 0;
  std::vector<std::pair<double, double>> attention_curve;
  // The fraction for queries that each see up to `keys` keys (a sequence's
  // length, or a sliding window's): the curve read linearly in log2(keys)
  // between its points and held at its ends' fractions beyond them.
  double flash_attention_efficiency(double keys) const;
  double reserved_bytes = 2e9;  // context, workspace, fragmentation

  double inter_bandwidth_per_gpu() const { return inter_bandwidth / gpus_per_node; }
};

// Reads and validates a cluster file; errors name the key and the value.
ClusterSpec load_cluster(const std::string& path);
ClusterSpec parse_cluster(const std::string& yaml_text, const std::string& source = "<cluster>");

}  // namespace triad::plan
