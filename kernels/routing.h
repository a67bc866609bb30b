#pragma once

// A mixture of experts' top-k choice on the device (routing.cu), the same
// choice as the host's (src/backend/expert_choice.h): each token's top k
// of its scores plus an expert bias, among its best groups' experts, all
// in f64, equal ones by the lower index. One thread a token, its short
// lists in local memory, so the lists are bounded (kMaxRouteList).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

// The longest list a thread keeps: top_k, the groups, and the best of a
// group that score it.
inline constexpr int64_t kMaxRouteList = 64;

struct RouteShape {
  int64_t tokens = 0, experts = 1, top_k = 1;
  int64_t groups = 1, top_groups = 1, group_best = 2;
};

// Whether the kernel takes this choice: f32 or f64 scores and bias, a rule
// that can choose (as expert_choice.h's) and lists within kMaxRouteList.
Status check_route_top_k(ScalarType scores, ScalarType bias, const RouteShape& shape);

// choice (tokens, top_k) i64 from scores (tokens, experts) and bias
// (experts; null: none) of types `scores_type` and `bias_type`. A token
// whose score plus bias is not finite somewhere chooses -1 top_k times.
// chosen (tokens, top_k) of `scores_type`, when not null: each choice's
// score without its bias (a -1's 0).
void route_top_k(const void* scores, ScalarType scores_type, const void* bias, ScalarType bias_type,
                 const RouteShape& shape, int64_t* choice, void* chosen, cudaStream_t stream);

// An expert's batch padded to its capacity (model.moe.pad_to_capacity):
// `capacity` of each expert's assignments (its first, or its best by
// score) in token order, as Backend::capacity_slots describes. `group`
// tokens make each group whose assignments are counted apart (a divisor
// of tokens).
struct CapacityShape {
  int64_t tokens = 0, experts = 1, top_k = 1, capacity = 1, group = 1;
};
// Whether the kernel takes this shape: 1 <= top_k, experts and capacity,
// and groups that divide the tokens.
Status check_capacity_slots(const CapacityShape& shape);
// From kListedExperts experts on, capacity_slots first lists each
// expert's assignments (a counting sort in chunks of `chunk` assignments,
// `chunks` of them) so that each expert's block reads only its own: its
// work grows as the assignments, not as experts x assignments. That needs
// a workspace of `bytes` (0 below kListedExperts).
constexpr int64_t kListedExperts = 32;
struct CapacityLists {
  int64_t chunk = 0, chunks = 0;
  size_t bytes = 0;
};
CapacityLists capacity_lists(const CapacityShape& shape);
// choice (tokens, top_k) i64 (an expert, or -1 where a token could not
// choose); scores (tokens, top_k) of scores_type (f32 or f64), each
// choice's score, or null: an over-full expert keeps its highest-scoring
// assignments (equal ones the earlier), else its earliest; slot_token and
// slot_assignment (experts * capacity), picked (tokens * top_k) and counts
// (tokens / group, experts), all i64. One block an expert, each reading
// every assignment (below kListedExperts) or its own list (the workspace,
// capacity_lists(shape).bytes of device memory).
void capacity_slots(const int64_t* choice, const void* scores, ScalarType scores_type,
                    const CapacityShape& shape, int64_t* slot_token, int64_t* slot_assignment,
                    int64_t* picked, int64_t* counts, void* workspace, cudaStream_t stream);

// A dropless mixture's experts' batch (Backend::dropless_rows): every
// assignment a row, grouped by expert, each group in token order, by the
// counting sort capacity_slots' many experts list with, for any number of
// experts.
struct DroplessShape {
  int64_t tokens = 0, experts = 1, top_k = 1, group = 1;
};
// Whether the kernels take this shape: 1 <= top_k and experts (at most
// 2^30), and groups that divide the tokens.
Status check_dropless_rows(const DroplessShape& shape);
// The device memory dropless_rows needs beside its outputs (the chunks'
// counts per expert), in bytes; 0 for no tokens.
size_t dropless_workspace(const DroplessShape& shape);
// choice (tokens, top_k) i64 (an expert, or -1 where a token could not
// choose) into row_token and row_assignment (tokens * top_k), offsets
// (experts + 1), picked (tokens * top_k) and counts (tokens / group,
// experts), all i64, as Backend::dropless_rows describes. Five small
// kernels: each chunk's counts per expert, a scan of each expert's, one
// over the experts (the offsets), each chunk's rows written in order, and
// each expert's tokens and counts by group.
void dropless_rows(const int64_t* choice, const DroplessShape& shape, int64_t* row_token,
                   int64_t* row_assignment, int64_t* offsets, int64_t* picked, int64_t* counts,
                   void* workspace, cudaStream_t stream);

}  // namespace triad::kernels
