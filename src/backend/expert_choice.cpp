// A mixture of experts' top-k choice on the host (expert_choice.h).
#include "backend/expert_choice.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/routing_list.h"
#include "triad/core/error.h"

namespace triad::detail {

namespace {

// The k best of v[0..n) into top (their indices) and value, best first;
// equal ones by index (a stable order every rank of a tensor-parallel
// group agrees on): each offered in index order to the list the device
// keeps too (kernels/routing_list.h).
void best_k(const double* v, int64_t n, int64_t k, int64_t* top, double* value) {
  int64_t held = 0;
  for (int64_t i = 0; i < n; ++i) kernels::insert_best(v[i], i, value, top, held, k);
}

}  // namespace

std::string expert_rule_problem(const ExpertRule& rule) {
  const int64_t E = rule.experts, k = rule.top_k, groups = rule.groups;
  if (E < 1 || k < 1 || k > E) {
    return "top_k " + std::to_string(k) + " of " + std::to_string(E) +
           " experts (expected 1 <= top_k <= experts)";
  }
  for (int64_t e = 0; rule.bias && e < E; ++e) {
    if (!std::isfinite(rule.bias[e])) {
      return "expert " + std::to_string(e) + "'s bias is " + std::to_string(rule.bias[e]) +
             " (expected a finite number)";
    }
  }
  if (rule.group_best < 1) {
    return "a group scored by its " + std::to_string(rule.group_best) +
           " best experts (expected at least 1)";
  }
  const int64_t size = groups > 0 ? E / groups : 0;
  if (groups < 1 || E % groups != 0 || rule.top_groups < 1 || rule.top_groups > groups ||
      k > rule.top_groups * size) {
    return "top_k " + std::to_string(k) + " within the best " + std::to_string(rule.top_groups) +
           " of " + std::to_string(groups) + " groups of " + std::to_string(E) +
           " experts (expected groups dividing the experts, 1 <= top_groups <= groups, and top_k "
           "within top_groups' experts)";
  }
  return "";
}

void choose_experts(const double* scores, int64_t tokens, const ExpertRule& rule, int64_t* choice) {
  const int64_t E = rule.experts, K = rule.top_k, G = rule.groups, width = E / G,
                open = rule.top_groups, counted = std::min(rule.group_best, width);
  const double* const shift = rule.bias;
  const bool grouped = G > 1, shifted = shift || grouped;
  // Each token's choice is its own: tokens run in parallel (each thread
  // with its own scratch), the same choices on any number of threads.
#pragma omp parallel if (tokens * E >= (int64_t{1} << 16))
  {
    std::vector<int64_t> best(static_cast<size_t>(std::max(G, counted)));
    std::vector<double> best_value(best.size()), top_value(static_cast<size_t>(K));
    std::vector<double> chosen_by(shifted ? static_cast<size_t>(E) : 0);
    std::vector<double> group_score(static_cast<size_t>(G));
    std::vector<char> kept(static_cast<size_t>(G));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < tokens; ++n) {
      const double* p = scores + n * E;
      int64_t* const mine = choice + n * K;
      bool finite = true;
      for (int64_t e = 0; e < E; ++e) finite &= std::isfinite(p[e] + (shift ? shift[e] : 0.0));
      if (!finite) {
        std::fill(mine, mine + K, int64_t{-1});
        continue;
      }
      // What the token chooses by: its scores, plus the biases, with the
      // experts outside its best groups out of reach.
      const double* s = p;
      if (shifted) {
        double* by = chosen_by.data();
        for (int64_t e = 0; e < E; ++e) by[e] = p[e] + (shift ? shift[e] : 0.0);
        if (grouped) {
          // Each group's score: the sum of its `counted` best.
          for (int64_t g = 0; g < G; ++g) {
            best_k(by + g * width, width, counted, best.data(), best_value.data());
            double sum = 0.0;
            for (int64_t j = 0; j < counted; ++j) sum += best_value[static_cast<size_t>(j)];
            group_score[static_cast<size_t>(g)] = sum;
          }
          // The experts of every group but the best top_groups are out of
          // reach.
          best_k(group_score.data(), G, open, best.data(), best_value.data());
          std::fill(kept.begin(), kept.end(), char{0});
          for (int64_t j = 0; j < open; ++j)
            kept[static_cast<size_t>(best[static_cast<size_t>(j)])] = 1;
          for (int64_t g = 0; g < G; ++g) {
            if (!kept[static_cast<size_t>(g)])
              std::fill(by + g * width, by + (g + 1) * width,
                        -std::numeric_limits<double>::infinity());
          }
        }
        s = by;
      }
      best_k(s, E, K, mine, top_value.data());
    }
  }
}

ExpertRule route_top_k_rule(const Tensor& scores, const Tensor& bias, int64_t groups,
                            int64_t top_groups, int64_t group_best, const Tensor& choice,
                            const Tensor* chosen) {
  const auto is_float = [](DType d) { return d == DType::F32 || d == DType::F64; };
  if (scores.dim() != 2 || !scores.is_contiguous() || !is_float(scores.dtype())) {
    throw ShapeError("route_top_k: scores " + std::string(dtype_name(scores.dtype())) + " " +
                     shape_str(scores.shape()) + " (expected contiguous (N, E), f32 or f64)");
  }
  const int64_t N = scores.size(0), E = scores.size(1);
  if (choice.dim() != 2 || choice.size(0) != N || !choice.is_contiguous() ||
      choice.dtype() != DType::I64 || choice.device() != scores.device()) {
    throw ShapeError("route_top_k: choice " + std::string(dtype_name(choice.dtype())) + " " +
                     shape_str(choice.shape()) + " on " + choice.device().str() + " for " +
                     std::to_string(N) + " tokens on " + scores.device().str() +
                     " (expected contiguous i64 (N, k) on the scores' device)");
  }
  if (chosen && (chosen->shape() != choice.shape() || !chosen->is_contiguous() ||
                 chosen->dtype() != scores.dtype() || chosen->device() != scores.device())) {
    throw ShapeError("route_top_k: chosen scores " + std::string(dtype_name(chosen->dtype())) +
                     " " + shape_str(chosen->shape()) + " on " + chosen->device().str() +
                     " for choice " + shape_str(choice.shape()) + " (expected contiguous, " +
                     dtype_name(scores.dtype()) + " like the scores, on " + scores.device().str() +
                     ")");
  }
  if (bias.defined() && (bias.dim() != 1 || bias.numel() != E || !bias.is_contiguous() ||
                         !is_float(bias.dtype()) || bias.device() != scores.device())) {
    throw ShapeError("route_top_k: bias " + std::string(dtype_name(bias.dtype())) + " " +
                     shape_str(bias.shape()) + " on " + bias.device().str() + " for " +
                     std::to_string(E) + " experts (expected contiguous (E), f32 or f64, on " +
                     scores.device().str() + ")");
  }
  const ExpertRule rule{E, choice.size(1), nullptr, groups, top_groups, group_best};
  if (const std::string problem = expert_rule_problem(rule); !problem.empty())
    throw ValueError("route_top_k: " + problem);
  return rule;
}

void check_capacity_slots(const Tensor& choice, const Tensor& scores, int64_t experts,
                          int64_t capacity, int64_t group, const Tensor& slot_token,
                          const Tensor& slot_assignment, const Tensor& picked,
                          const Tensor& counts) {
  if (choice.dtype() != DType::I64 || choice.dim() != 2 || !choice.is_contiguous()) {
    throw ShapeError("capacity_slots: choice " + std::string(dtype_name(choice.dtype())) + " " +
                     shape_str(choice.shape()) + " (expected contiguous i64 (tokens, top_k))");
  }
  const int64_t N = choice.size(0), k = choice.size(1);
  if (experts < 1 || capacity < 1 || group < 1 || N % group != 0) {
    throw ValueError("capacity_slots: capacity " + std::to_string(capacity) + " for " +
                     std::to_string(experts) + " experts, " + std::to_string(N) +
                     " tokens in groups of " + std::to_string(group) +
                     " (expected experts >= 1, capacity >= 1 and groups that divide the tokens)");
  }
  if (scores.defined() && ((scores.dtype() != DType::F32 && scores.dtype() != DType::F64) ||
                           scores.shape() != choice.shape() || !scores.is_contiguous() ||
                           !(scores.device() == choice.device()))) {
    throw ShapeError("capacity_slots: scores " + std::string(dtype_name(scores.dtype())) + " " +
                     shape_str(scores.shape()) + " on " + scores.device().str() +
                     " (expected contiguous f32 or f64 " + shape_str(choice.shape()) + " on " +
                     choice.device().str() + ")");
  }
  const auto expect = [&](const Tensor& t, const char* what, const Shape& shape) {
    if (t.dtype() != DType::I64 || t.shape() != shape || !t.is_contiguous() ||
        !(t.device() == choice.device())) {
      throw ShapeError(std::string("capacity_slots: ") + what + " " + dtype_name(t.dtype()) + " " +
                       shape_str(t.shape()) + " on " + t.device().str() +
                       " (expected contiguous i64 " + shape_str(shape) + " on " +
                       choice.device().str() + ")");
    }
  };
  expect(slot_token, "slot_token", {experts * capacity});
  expect(slot_assignment, "slot_assignment", {experts * capacity});
  expect(picked, "picked", {N * k});
  expect(counts, "counts", {N / group, experts});
}

void fill_capacity_slots(const int64_t* choice, const double* scores, int64_t N, int64_t k,
                         int64_t E, int64_t capacity, int64_t group, int64_t* slot_token,
                         int64_t* slot_assignment, int64_t* picked, int64_t* counts) {
  std::fill(counts, counts + (N / group) * E, int64_t{0});
  // Each expert's assignments in token order.
  std::vector<std::vector<int64_t>> mine(static_cast<size_t>(E));
  for (int64_t a = 0; a < N * k; ++a) {
    const int64_t e = choice[a], n = a / k;
    if (e < 0 || e >= E) {
      picked[a] = N * E;
      continue;
    }
    picked[a] = n * E + e;
    ++counts[(n / group) * E + e];
    mine[static_cast<size_t>(e)].push_back(a);
  }
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t>& kept = mine[static_cast<size_t>(e)];
    if (static_cast<int64_t>(kept.size()) > capacity) {
      // Over capacity: the highest scores (a stable sort: equal ones in
      // token order) or the earliest, then back in token order.
      if (scores) {
        std::stable_sort(kept.begin(), kept.end(),
                         [scores](int64_t a, int64_t b) { return scores[a] > scores[b]; });
      }
      kept.resize(static_cast<size_t>(capacity));
      std::sort(kept.begin(), kept.end());
    }
    for (int64_t place = 0; place < capacity; ++place) {
      const bool used = place < static_cast<int64_t>(kept.size());
      const int64_t a = used ? kept[static_cast<size_t>(place)] : N * k;
      slot_token[e * capacity + place] = used ? a / k : 0;
      slot_assignment[e * capacity + place] = a;
    }
  }
}

void check_dropless_rows(const Tensor& choice, int64_t experts, int64_t group,
                         const Tensor& row_token, const Tensor& row_assignment,
                         const Tensor& offsets, const Tensor& picked, const Tensor& counts) {
  if (choice.dtype() != DType::I64 || choice.dim() != 2 || !choice.is_contiguous()) {
    throw ShapeError("dropless_rows: choice " + std::string(dtype_name(choice.dtype())) + " " +
                     shape_str(choice.shape()) + " (expected contiguous i64 (tokens, top_k))");
  }
  const int64_t N = choice.size(0), k = choice.size(1);
  if (experts < 1 || experts > (int64_t{1} << 30) || group < 1 || N % group != 0) {
    throw ValueError("dropless_rows: " + std::to_string(experts) + " experts, " +
                     std::to_string(N) + " tokens in groups of " + std::to_string(group) +
                     " (expected 1 <= experts <= 2^30 and groups that divide the tokens)");
  }
  const auto expect = [&](const Tensor& t, const char* what, const Shape& shape) {
    if (t.dtype() != DType::I64 || t.shape() != shape || !t.is_contiguous() ||
        !(t.device() == choice.device())) {
      throw ShapeError(std::string("dropless_rows: ") + what + " " + dtype_name(t.dtype()) + " " +
                       shape_str(t.shape()) + " on " + t.device().str() +
                       " (expected contiguous i64 " + shape_str(shape) + " on " +
                       choice.device().str() + ")");
    }
  };
  expect(row_token, "row_token", {N * k});
  expect(row_assignment, "row_assignment", {N * k});
  expect(offsets, "offsets", {experts + 1});
  expect(picked, "picked", {N * k});
  expect(counts, "counts", {N / group, experts});
}

void fill_dropless_rows(const int64_t* choice, int64_t N, int64_t k, int64_t E, int64_t group,
                        int64_t* row_token, int64_t* row_assignment, int64_t* offsets,
                        int64_t* picked, int64_t* counts) {
  std::fill(counts, counts + (N / group) * E, int64_t{0});
  std::fill(offsets, offsets + E + 1, int64_t{0});
  // A counting sort: each expert's rows start where the loads before it
  // end, its assignments placed in token order.
  for (int64_t a = 0; a < N * k; ++a) {
    const int64_t e = choice[a], n = a / k;
    const bool valid = e >= 0 && e < E;
    picked[a] = valid ? n * E + e : N * E;
    if (!valid) continue;
    ++counts[(n / group) * E + e];
    ++offsets[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets, offsets + E);
  for (int64_t r = offsets[E]; r < N * k; ++r) {
    row_token[r] = 0;
    row_assignment[r] = N * k;
  }
  for (int64_t a = 0; a < N * k; ++a) {
    const int64_t e = choice[a];
    if (e < 0 || e >= E) continue;
    const int64_t r = next[static_cast<size_t>(e)]++;
    row_token[r] = a / k;
    row_assignment[r] = a;
  }
}

}  // namespace triad::detail
