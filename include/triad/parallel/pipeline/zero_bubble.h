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
// ZB-H1 and 1F1B (with W right after B) orders are all timed with the costs
// (each action as soon as its rank is free and its input has arrived, the
// transfer time after its producer ends); the shortest that fits the limit
// wins (ties: in that order), and only it gets its point-to-point batches.
// With free communication that timing is the simulator's, so the result is
// never slower in simulation than ZB-H1 or 1F1B within the same memory, nor
// than itself with the limit p.
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
};

// v = 1 (one chunk per rank); costs may differ per stage (Costs' p-entry
// vectors; backward_input and backward_weight are used, backward is not).
// Every cost must be > 0. Throws ValueError naming a bad value.
Schedule make_zero_bubble_schedule(int p, int m, const Costs& costs,
                                   const ZeroBubbleOptions& options = {});

}  // namespace triad::pipeline
