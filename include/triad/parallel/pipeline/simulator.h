#pragma once

#include <string>
#include <vector>

#include "triad/parallel/pipeline/schedule.h"

namespace triad::pipeline {

// Per-action costs for the simulator. Times in seconds (any unit works as
// long as it is consistent). Each vector holds one entry (every stage), v
// entries (one per chunk: chunk c of every rank) or p*v entries (one per
// stage: the first and last stages carry the embedding and the head).
struct Costs {
  std::vector<double> forward{1.0};
  std::vector<double> backward{2.0};         // full backward (B + W)
  std::vector<double> backward_input{1.0};   // B, split schedules
  std::vector<double> backward_weight{1.0};  // W, split schedules
  double p2p_latency = 0.0;                  // per message
  double p2p_bandwidth = 0.0;                // bytes/s; 0 = infinite
  double message_bytes = 0.0;                // activation (= gradient) size

  // The cost of a `kind` action on `stage` (= chunk * p + rank) of a
  // schedule of p ranks and v chunks per rank. Throws ValueError when a
  // vector's size is none of 1, v and p*v.
  double of(ComputeKind kind, int stage, int p, int v) const;
  // Throws ValueError naming the first time, size or bandwidth that is
  // negative, NaN or infinite (simulate() checks its costs so).
  void check() const;
  double transfer() const {
    return p2p_latency + (p2p_bandwidth > 0 ? message_bytes / p2p_bandwidth : 0.0);
  }
};

// One box of a rank's timeline.
struct TimelineEvent {
  double start = 0;
  double end = 0;
  bool compute = true;  // false: waiting in a point-to-point batch
  ComputeKind kind = ComputeKind::Forward;
  int chunk = 0;
  int microbatch = 0;
};

struct SimulationResult {
  std::vector<std::vector<TimelineEvent>> timeline;  // per rank
  double makespan = 0;
  // (makespan - ideal) / ideal with ideal = the busiest rank's compute time:
  // the PTD-P paper's bubble time fraction.
  double bubble_fraction = 0;
  // Peak number of (chunk, microbatch) pairs whose activations are alive
  // (from the start of F to the end of its B), per rank.
  std::vector<int> peak_alive;
  // Split schedules: peak number of microbatches past B still waiting for W
  // (their weight-gradient inputs stay alive), per rank.
  std::vector<int> peak_weight_pending;
  // Peak of (alive + waiting for W) at the same moment, per rank.
  std::vector<int> peak_held;
  std::vector<double> compute_time;  // per rank
};

// How a point-to-point batch completes.
enum class P2PSemantics {
  // Triad's executor: sends are posted and the rank moves on; a batch that
  // only receives is waited for by the compute action that consumes its
  // payload (the forward of the next stage, the backward of the previous
  // one), so the rank computes meanwhile; a batch that sends and receives
  // waits for its receives where it is posted.
  WaitAtConsumer,
  // Sends are posted and the rank moves on; every batch waits for its
  // receives where it is posted (an executor with isend/irecv that waits
  // for each batch at once).
  AsyncSends,
  // Every operation, send or receive, must meet its posted counterpart
  // before the batch completes (rendezvous; the strictest model).
  Blocking,
  // Triad's executor on GPUs with one NCCL stream per rank
  // (TRIAD_NCCL_P2P_STREAMS=one): the host never waits in a batch; each
  // rank's batches run one after another on its communication stream, a
  // batch starting once it is posted and the one before it has finished,
  // and every operation meets its counterpart in the peer's running batch
  // (rendezvous, as NCCL's point-to-point kernels do for messages larger
  // than their buffers). Compute waits for a received payload only at the
  // action that consumes it, whether its batch also sent or not.
  StreamOrdered,
  // Triad's executor on GPUs: as StreamOrdered, with one communication
  // stream per peer (the pipeline group's NCCL links, as PyTorch's NCCL
  // group keeps a communicator per pair of ranks for point-to-point calls):
  // a send to the next rank that waits for its receiver holds up nothing
  // from the previous rank.
  StreamPerPeer,
};

// Discrete-event execution: each rank runs its list in order; a compute
// action takes its cost; a message moves when both sides have posted it and
// takes the transfer time; where a rank waits depends on `semantics`.
// Throws ValueError if the schedule deadlocks.
SimulationResult simulate(const Schedule& schedule, const Costs& costs,
                          P2PSemantics semantics = P2PSemantics::WaitAtConsumer);

// Chrome trace JSON (opens in Perfetto / chrome://tracing): one process, one
// thread row per rank, times in microseconds of the simulation unit x 1e6.
std::string timeline_chrome_trace(const Schedule& schedule, const SimulationResult& result);

// SVG in the style of the PTD-P schedule figures: one row per device, one
// box per action numbered by microbatch, coloured by microbatch, forward
// light, backward dark (B and W told apart), idle time left blank.
std::string timeline_svg(const Schedule& schedule, const SimulationResult& result);

}  // namespace triad::pipeline
