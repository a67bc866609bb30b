#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace triad::pipeline {

// Pipeline schedules as plain data: for each pipeline rank, the ordered list
// of what it does. No tensors, no communication: the executor runs these
// lists, the simulator times them, the planner prices them.
//
// Layout: p ranks, v model chunks per rank, S = p*v model stages. Stage 0
// takes the embedding, stage S-1 the loss. Where the stages live is the
// schedule's Placement (below).

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZbH1, ZbAuto, ZbV };

const char* schedule_name(ScheduleKind kind);
// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-auto", "zb-v"; throws
// ValueError listing them.
ScheduleKind schedule_from_name(const std::string& name);

// Where the model stages live.
//  Loop  chunk c of rank r holds stage c*p + r: the stages go round the
//        ranks v times (1F1B, interleaved, every schedule but ZB-V).
//  V     two chunks per rank: chunk 0 of rank r holds stage r, chunk 1 stage
//        2p-1-r. The model goes down the ranks and back up, so rank 0 holds
//        the first and the last stage (the embedding and the loss: a tied
//        embedding is one tensor) and rank p-1 hands stage p-1's output to
//        stage p without communication (ZB-V).
// In both, stage s belongs to chunk s / p.
enum class Placement { Loop, V };
Placement placement_of(ScheduleKind kind);
int stage_at(Placement placement, int p, int rank, int chunk);
int rank_at(Placement placement, int p, int stage);

enum class ComputeKind { Forward, Backward, BackwardInput, BackwardWeight };

// What travels between stages: the activation a forward produces, or the
// gradient (of the stage's input) a backward produces.
enum class Payload { Activation, Gradient };

// One point-to-point message, seen from one side.
struct P2POp {
  bool is_send = false;
  Payload payload = Payload::Activation;
  int stage = 0;  // the stage that produced the payload
  int microbatch = 0;
  int peer = 0;  // the other rank
  bool operator==(const P2POp&) const = default;
};

// An entry of a rank's list: either one compute action, or a batch of
// point-to-point operations posted together (like batch_isend_irecv) that
// completes when all of them have completed.
struct Action {
  enum class Type { Compute, P2P } type = Type::Compute;
  ComputeKind compute = ComputeKind::Forward;
  int chunk = 0;
  int microbatch = 0;
  std::vector<P2POp> ops;  // for P2P

  static Action make_compute(ComputeKind k, int chunk, int microbatch) {
    Action a;
    a.compute = k;
    a.chunk = chunk;
    a.microbatch = microbatch;
    return a;
  }
  bool is_compute() const { return type == Type::Compute; }
  std::string str() const;  // "F(c0,m3)", "B(c1,m0)", "W(...)", "P2P[send A s2 m3 -> 1, ...]"
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int p = 1;                    // pipeline ranks
  int v = 1;                    // chunks per rank
  int m = 1;                    // microbatches
  bool split_backward = false;  // BackwardInput + BackwardWeight instead of Backward
  std::vector<std::vector<Action>> ranks;

  int num_stages() const { return p * v; }
  Placement placement() const { return placement_of(kind); }
  int stage_of(int rank, int chunk) const { return stage_at(placement(), p, rank, chunk); }
  int rank_of(int stage) const { return rank_at(placement(), p, stage); }
  int chunk_of(int stage) const { return stage / p; }
};

// Builds a schedule: compute order by the kind's rule, then the
// point-to-point batches it implies (each batch holds the sends of the
// previous compute action and the receives of the next). Constraints, each a
// ValueError naming the numbers: p, m >= 1; v >= 1 with v == 1 unless
// Interleaved or ZB-V; Interleaved needs v >= 2 and m a multiple of p, ZB-V
// v == 2.
//
//  GPipe        all forwards, then all backwards.
//  1F1B         rank r: min(p-r-1, m) warm-up forwards, then one forward /
//               one backward, then the remaining backwards.
//  Interleaved  Megatron's interleaved 1F1B: forwards walk microbatches in
//               groups of p through chunk 0..v-1, backwards through v-1..0;
//               warm-up (p-r-1)*2 + (v-1)*p on rank r (capped at m*v).
//  ZB-H1        backward split into B (input grad) and W (weight grad); the
//               order is that of a list scheduler on unit costs that prefers
//               B, then F while at most p-r microbatches are in flight, then
//               W — so W fills what would be bubbles and peak activation
//               memory stays that of 1F1B (Qi et al. 2023).
//  ZB-auto      zero-bubble order chosen for measured costs
//               (zero_bubble.h); here for equal F, B and W costs and 1F1B's
//               memory.
//  ZB-V         the V placement with B/W split (zero_bubble.h,
//               make_zero_bubble_v_schedule): 1F1B's activation memory and,
//               for equal F, B and W costs, almost no bubble; here for those
//               costs.
Schedule make_schedule(ScheduleKind kind, int p, int m, int v = 1);

// The compute actions of make_schedule(kind, p, m, v), rank by rank,
// without the point-to-point batches; the same checks.
std::vector<std::vector<Action>> compute_orders(ScheduleKind kind, int p, int m, int v = 1);

// The cost of a compute action on a rank, for schedule_from_orders().
using ActionCost = std::function<double(int rank, const Action& action)>;

// A schedule from per-rank compute orders (compute actions only): adds the
// point-to-point batches the orders imply. Each message's round is the time
// its producer finishes when the orders run with `cost` (every cost > 0;
// empty: F 1, B 2, B/W 1 each) and free communication; a rank posts a
// round's operations together, before its first action starting at or after
// that time, so the lists cannot deadlock even under rendezvous semantics.
// Throws Error when the orders would wait forever. Run validate() on the
// result for the full check.
Schedule schedule_from_orders(ScheduleKind kind, int p, int m, int v, bool split_backward,
                              std::vector<std::vector<Action>> orders, const ActionCost& cost = {});

// Result of validate(): ok, or the first problem found.
struct Validation {
  bool ok = true;
  std::string error;
};

// Checks that every (stage, microbatch) is forwarded once and backwarded
// once (B and W once each when split); every compute action's inputs were
// received or produced earlier on its rank; every send has exactly one
// matching receive on the peer; and executing the lists with blocking
// rendezvous point-to-point semantics (a batch completes when each of its
// operations meets its peer's posted counterpart) reaches the end on every
// rank, i.e. cannot deadlock.
Validation validate(const Schedule& schedule);

}  // namespace triad::pipeline
