#pragma once

#include "triad/parallel/pipeline/schedule.h"
#include "triad/parallel/pipeline/simulator.h"

namespace triad::pipeline {

// Zero-bubble pipeline schedules chosen for the costs at hand (the automatic
// scheduling of Qi et al. 2023, without its ILP refinement).
//
// ZB-H1's hand-written order assumes the forward (F), input-gradient (B) and
// weight-gradient (W) passes take about the same time. When they do not — a
// W of a quarter of B is common — its fixed order stalls. Here the order is
// found for the measured costs: a list scheduler runs the pipeline in
// simulated time and, whenever a rank is free, starts its next B if the
// output gradient has arrived (the critical path), else its next F if the
// input has arrived and memory allows, else a pending W to fill the gap.
// Two variants of that rule — W whenever nothing else is ready, or W only
// when it ends before the next known arrival — each within the memory limit
// and, when the limit exceeds p, within 1F1B's too, and the hand-written
// ZB-H1 and 1F1B (with W right after B) orders are the candidates. Each
// that fits the limit gets its point-to-point batches (the hand-written
// ones make_schedule's) and is timed by simulate() as the executor runs it
// (`semantics` below); the quickest wins (ties: in that order).
// So the result is never slower in simulation than ZB-H1 or 1F1B within
// the same memory, nor than itself with the limit p.
//
// Each rank runs its F, B and W passes in microbatch order, so weight
// gradients accumulate in the same order as under every other schedule and
// training is bit-identical to 1F1B's.
struct ZeroBubbleOptions {
  // Microbatches a rank may hold between the start of their F and the end of
  // their W (full activations until B, the weight-gradient inputs until W);
  // 0 = p, what 1F1B's first rank holds (ZB-H1's budget). 2p - 1 gives the
  // paper's ZB-H2 budget. At least 1.
  int max_in_flight = 0;
  // How the executor waits for its receives, which the search simulates:
  // WaitAtConsumer on the host (MPI), StreamPerPeer on GPUs (NCCL links;
  // StreamOrdered on one stream).
  P2PSemantics semantics = P2PSemantics::WaitAtConsumer;
};

// v = 1 (one chunk per rank); costs may differ per stage (Costs' p-entry
// vectors; backward_input and backward_weight are used, backward is not).
// Every cost must be > 0. Throws ValueError naming a bad value. `simulated`,
// when given, receives simulate(result, costs, options.semantics), which the
// search has run.
Schedule make_zero_bubble_schedule(int p, int m, const Costs& costs,
                                   const ZeroBubbleOptions& options = {},
                                   SimulationResult* simulated = nullptr);

// ZB-V (Qi et al. 2023): two chunks per rank in the V placement (chunk 0 of
// rank r holds stage r, chunk 1 stage 2p-1-r), backward split into B and W.
// A microbatch goes down the ranks and back up, so every rank takes part
// in its forward twice and its backward twice, spaced so that each rank's
// W passes fill what would be bubbles; the last rank turns it round without
// communication and the first rank holds the embedding and the loss.
//
// The order comes from the same list scheduler as zb-auto's, on stages:
// whenever a rank is free it starts a B whose output gradient has arrived,
// else an F whose input has arrived — a chunk-1 F (a microbatch already in
// the pipeline, on its way to the loss) before a chunk-0 F (a new one) —
// else a W. A chunk-0 F admits a microbatch to the rank and reserves its
// two chunk activations until their W passes: at most
// `max_in_flight` microbatches (0 = p) are admitted at once, so the peak
// activation memory is 1F1B's (p microbatches of a whole stage = 2p of a
// half-size chunk) and no chunk-1 F ever waits for memory (no deadlock).
// Variants of the rule (which chunk's B first; whether a ready F goes
// before a ready B, which with B much heavier than F keeps microbatches
// from queueing at each of the V's 2p stages; W when idle, only when it
// fits before the next arrival, or first when a new microbatch waits for
// memory alone; room reserved per microbatch or one slot kept free) are
// timed with the costs and the shortest wins; the search stops at an order
// that meets the lower bound, and tries fewer variants when p * m > 2048.
//
// Costs are per stage (Costs' 1, 2 or 2p-entry vectors; backward_input and
// backward_weight are used); each must be > 0. Throws ValueError naming a
// bad value.
Schedule make_zero_bubble_v_schedule(int p, int m, const Costs& costs,
                                     const ZeroBubbleOptions& options = {});

}  // namespace triad::pipeline
