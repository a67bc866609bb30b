#pragma once

// A mixture of experts' top-k choice, token by token, as every backend makes
// it (the host reference here, kernels/routing.cu on a GPU): the same
// experts for the same scores, so a GPU routes as the CPU does.
//
// Token n chooses by its scores plus a bias per expert (none: the scores),
// with the experts outside its best `top_groups` of `groups` equal,
// contiguous groups out of reach; a group is scored by the sum of its
// `group_best` best (at most the group's size). Its top_k are the best of
// what remains, best first, equal ones by the lower index. All in f64: a
// score and its bias are added in f64, each group's best summed in order
// from 0.
#include <cstdint>
#include <string>

#include "triad/core/tensor.h"

namespace triad::detail {

struct ExpertRule {
  int64_t experts = 1, top_k = 1;
  const double* bias = nullptr;  // (experts) or null
  int64_t groups = 1, top_groups = 1, group_best = 2;
};

// The reason `rule` cannot choose ("" when it can): top_k within
// [1, experts], groups dividing the experts, 1 <= top_groups <= groups,
// top_k within the top groups' experts, group_best >= 1 and a finite bias.
// The message starts with what is wrong, for a caller to prefix its name.
std::string expert_rule_problem(const ExpertRule& rule);

// choice[n * top_k + j] = token n's j-th expert, for scores (tokens,
// experts) row-major. A token with a score (plus its bias) that is not
// finite chooses -1 top_k times. Tokens run in parallel; the result does not depend on the
// threads. Expects a rule without a problem.
void choose_experts(const double* scores, int64_t tokens, const ExpertRule& rule, int64_t* choice);

// Backend::route_top_k's arguments checked (ShapeError or ValueError naming
// the value, prefixed "route_top_k: "): its rule, without the bias's values.
ExpertRule route_top_k_rule(const Tensor& scores, const Tensor& bias, int64_t groups,
                            int64_t top_groups, int64_t group_best, const Tensor& choice,
                            const Tensor* chosen = nullptr);

// Backend::capacity_slots's arguments checked (ShapeError or ValueError
// naming the value, prefixed "capacity_slots: "): choice (N, k) i64 and
// the outputs' shapes on its device, scores (undefined, or f32 or f64 as
// choice's shape on its device), capacity >= 1, experts >= 1 and a group
// dividing N.
void check_capacity_slots(const Tensor& choice, const Tensor& scores, int64_t experts,
                          int64_t capacity, int64_t group, const Tensor& slot_token,
                          const Tensor& slot_assignment, const Tensor& picked,
                          const Tensor& counts);

// Backend::capacity_slots on the host, from choice (N * k) row-major and
// scores (the same, or null: by position) into the outputs' arrays.
void fill_capacity_slots(const int64_t* choice, const double* scores, int64_t tokens, int64_t top_k,
                         int64_t experts, int64_t capacity, int64_t group, int64_t* slot_token,
                         int64_t* slot_assignment, int64_t* picked, int64_t* counts);

// Backend::dropless_rows's arguments checked (ShapeError or ValueError
// naming the value, prefixed "dropless_rows: "): choice (N, k) i64 and the
// outputs' shapes on its device, experts >= 1 and a group dividing N.
void check_dropless_rows(const Tensor& choice, int64_t experts, int64_t group,
                         const Tensor& row_token, const Tensor& row_assignment,
                         const Tensor& offsets, const Tensor& picked, const Tensor& counts);

// Backend::dropless_rows on the host, from choice (N * k) row-major into
// the outputs' arrays.
void fill_dropless_rows(const int64_t* choice, int64_t tokens, int64_t top_k, int64_t experts,
                        int64_t group, int64_t* row_token, int64_t* row_assignment,
                        int64_t* offsets, int64_t* picked, int64_t* counts);

}  // namespace triad::detail
