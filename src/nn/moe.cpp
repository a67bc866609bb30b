#include "triad/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/expert_choice.h"
#include "triad/autograd/checkpoint.h"
#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/linalg.h"
#include "triad/ops/nn_functional.h"
#include "triad/ops/reduce.h"
#include "triad/ops/shape_ops.h"

namespace triad::nn {

namespace {

// r (tokens, experts, top_k and choice set) completed: its loads, and the
// rows grouped by expert, each group in token order, under `capacity` (0:
// dropless; over it, `policy` ranks an expert's assignments by `chosen`,
// each assignment's score (tokens * top_k, as r.choice), or by token).
Routing group_rows(Routing r, const double* chosen, int64_t capacity,
                   GptConfig::Moe::DropPolicy policy) {
  const int64_t tokens = r.tokens, experts = r.experts, top_k = r.top_k;
  r.load.assign(static_cast<size_t>(experts), 0);
  for (const int64_t e : r.choice) ++r.load[static_cast<size_t>(e)];
  // Rows grouped by expert, each group in token order: a counting sort of
  // the assignments into one array, each expert's run starting where the
  // loads before it end.
  std::vector<int64_t> order(static_cast<size_t>(tokens * top_k)),
      start(static_cast<size_t>(experts) + 1, 0);
  for (int64_t e = 0; e < experts; ++e)
    start[static_cast<size_t>(e) + 1] =
        start[static_cast<size_t>(e)] + r.load[static_cast<size_t>(e)];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t a = 0; a < tokens * top_k; ++a)
      order[static_cast<size_t>(next[static_cast<size_t>(r.choice[static_cast<size_t>(a)])]++)] = a;
  }
  r.rows.resize(static_cast<size_t>(experts));
  r.token.reserve(order.size() + static_cast<size_t>(experts));
  r.assignment.reserve(order.size() + static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const auto first = order.begin() + start[static_cast<size_t>(e)];
    auto last = order.begin() + start[static_cast<size_t>(e) + 1];
    if (capacity > 0 && last - first > capacity) {
      // Over capacity: keep the most probable (a stable sort: equal ones
      // in token order) or the earliest, then put the kept back in token
      // order.
      if (policy == GptConfig::Moe::DropPolicy::Probs) {
        std::stable_sort(first, last, [&](int64_t a, int64_t b) { return chosen[a] > chosen[b]; });
      }
      r.dropped += (last - first) - capacity;
      last = first + capacity;
      std::sort(first, last);
    }
    if (first == last) {  // the padding row: token 0, the zero gate
      r.token.push_back(0);
      r.assignment.push_back(tokens * top_k);
      r.rows[static_cast<size_t>(e)] = 1;
      continue;
    }
    for (auto a = first; a != last; ++a) {
      r.token.push_back(*a / top_k);
      r.assignment.push_back(*a);
    }
    r.rows[static_cast<size_t>(e)] = last - first;
  }
  return r;
}

// Why token n (its scores `row`, a row of `experts`; its choosing scores
// add `bias`, empty: none) chose no expert: the error naming its first
// score that is not finite, else the first bias that makes one so.
[[noreturn]] void throw_unchosen(const double* row, int64_t n, int64_t experts,
                                 const std::vector<double>& bias) {
  for (int64_t e = 0; e < experts; ++e) {
    if (!std::isfinite(row[e])) {
      throw ValueError("route_top_k: token " + std::to_string(n) + "'s probability for expert " +
                       std::to_string(e) + " is " + std::to_string(row[e]) +
                       " (the router's output is not finite)");
    }
  }
  for (size_t e = 0; e < bias.size(); ++e) {
    if (!std::isfinite(row[e] + bias[e])) {
      throw ValueError("route_top_k: expert " + std::to_string(e) + "'s bias is " +
                       std::to_string(bias[e]) + " (token " + std::to_string(n) +
                       "'s choosing score is not finite)");
    }
  }
  throw ValueError("route_top_k: token " + std::to_string(n) + " chose no expert");
}

}  // namespace

Routing route_top_k(const std::vector<double>& probs, int64_t tokens, int64_t experts,
                    int64_t top_k, int64_t capacity, GptConfig::Moe::DropPolicy policy,
                    const ExpertChoice& choice) {
  if (tokens < 0 || experts < 1 || top_k < 1 || top_k > experts) {
    throw ValueError("route_top_k: top_k " + std::to_string(top_k) + " of " +
                     std::to_string(experts) + " experts for " + std::to_string(tokens) +
                     " tokens (expected 1 <= top_k <= experts)");
  }
  if (capacity < 0) {
    throw ValueError("route_top_k: capacity " + std::to_string(capacity) +
                     " (expected >= 0; 0: dropless)");
  }
  if (static_cast<int64_t>(probs.size()) != tokens * experts) {
    throw ValueError("route_top_k: " + std::to_string(probs.size()) + " probabilities for " +
                     std::to_string(tokens) + " tokens and " + std::to_string(experts) +
                     " experts");
  }
  if (!choice.bias.empty() && static_cast<int64_t>(choice.bias.size()) != experts) {
    throw ValueError("route_top_k: " + std::to_string(choice.bias.size()) + " expert biases for " +
                     std::to_string(experts) + " experts");
  }
  const detail::ExpertRule rule{experts,
                                top_k,
                                choice.bias.empty() ? nullptr : choice.bias.data(),
                                choice.groups,
                                choice.top_groups,
                                choice.group_best};
  if (const std::string problem = detail::expert_rule_problem(rule); !problem.empty())
    throw ValueError("route_top_k: " + problem);
  Routing r;
  r.tokens = tokens;
  r.experts = experts;
  r.top_k = top_k;
  r.choice.resize(static_cast<size_t>(tokens * top_k));
  detail::choose_experts(probs.data(), tokens, rule, r.choice.data());
  std::vector<double> chosen(r.choice.size());
  for (int64_t n = 0; n < tokens; ++n) {
    if (r.choice[static_cast<size_t>(n * top_k)] < 0)
      throw_unchosen(probs.data() + n * experts, n, experts, choice.bias);
    for (int64_t j = 0; j < top_k; ++j) {
      const size_t a = static_cast<size_t>(n * top_k + j);
      chosen[a] = probs[static_cast<size_t>(n * experts + r.choice[a])];
    }
  }
  return group_rows(std::move(r), chosen.data(), capacity, policy);
}

Routing route_chosen(std::vector<int64_t> choice, int64_t tokens, int64_t experts, int64_t top_k,
                     int64_t capacity, GptConfig::Moe::DropPolicy policy,
                     const std::vector<double>& chosen) {
  if (tokens < 0 || experts < 1 || top_k < 1 || top_k > experts ||
      static_cast<int64_t>(choice.size()) != tokens * top_k) {
    throw ValueError("route_chosen: " + std::to_string(choice.size()) + " choices for " +
                     std::to_string(tokens) + " tokens' top " + std::to_string(top_k) + " of " +
                     std::to_string(experts) + " experts");
  }
  if (capacity < 0) {
    throw ValueError("route_chosen: capacity " + std::to_string(capacity) +
                     " (expected >= 0; 0: dropless)");
  }
  const bool ranked = capacity > 0 && policy == GptConfig::Moe::DropPolicy::Probs;
  if (ranked && chosen.size() != choice.size()) {
    throw ValueError("route_chosen: " + std::to_string(chosen.size()) + " chosen scores for " +
                     std::to_string(choice.size()) +
                     " choices (a capacity that drops the least probable ranks by them)");
  }
  for (size_t a = 0; a < choice.size(); ++a) {
    if (choice[a] < 0 || choice[a] >= experts) {
      throw ValueError("route_chosen: token " + std::to_string(a / static_cast<size_t>(top_k)) +
                       " chose expert " + std::to_string(choice[a]) + " of " +
                       std::to_string(experts));
    }
  }
  Routing r;
  r.tokens = tokens;
  r.experts = experts;
  r.top_k = top_k;
  r.choice = std::move(choice);
  return group_rows(std::move(r), ranked ? chosen.data() : nullptr, capacity, policy);
}

Routing keep_assignments(const Routing& r, const std::vector<char>& keep, int64_t tokens,
                         int64_t top_k) {
  const int64_t padding = tokens * top_k;
  if (static_cast<int64_t>(keep.size()) != padding) {
    throw ValueError("keep_assignments: " + std::to_string(keep.size()) + " flags for " +
                     std::to_string(padding) + " assignments");
  }
  Routing out;
  out.tokens = r.tokens;
  out.top_k = r.top_k;
  out.experts = r.experts;
  out.choice = r.choice;
  out.load = r.load;
  out.dropped = r.dropped;
  out.rows.resize(r.rows.size());
  size_t at = 0;
  for (size_t e = 0; e < r.rows.size(); ++e) {
    int64_t kept = 0;
    for (int64_t i = 0; i < r.rows[e]; ++i, ++at) {
      const int64_t a = r.assignment[at];
      if (a == padding) continue;
      if (!keep[static_cast<size_t>(a)]) {
        ++out.dropped;
        continue;
      }
      out.token.push_back(r.token[at]);
      out.assignment.push_back(a);
      ++kept;
    }
    if (kept == 0) {  // the padding row: token 0, the zero gate
      out.token.push_back(0);
      out.assignment.push_back(padding);
      kept = 1;
    }
    out.rows[e] = kept;
  }
  return out;
}

int64_t expert_capacity(double factor, int64_t tokens, int64_t experts, int64_t top_k) {
  if (!(factor >= 0) || !std::isfinite(factor) || tokens < 0 || experts < 1 || top_k < 1) {
    throw ValueError("expert_capacity: factor " + std::to_string(factor) + " for " +
                     std::to_string(tokens) + " tokens, " + std::to_string(experts) +
                     " experts, top " + std::to_string(top_k) +
                     " (expected a finite factor >= 0, experts and top_k >= 1)");
  }
  if (factor == 0) return 0;
  const double share = factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts);
  // No expert takes more than every assignment: a larger factor (1e300 is
  // finite; its capacity no int64 holds) drops nothing either.
  if (share >= static_cast<double>(tokens * top_k)) return std::max<int64_t>(1, tokens * top_k);
  // (A share that is an integer up to rounding stays that integer.)
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(share - 1e-9)));
}

double balance_loss(const Routing& r, const std::vector<double>& probs, int64_t sequence) {
  if (r.tokens == 0) return 0.0;
  const int64_t T = sequence > 0 ? sequence : r.tokens, E = r.experts;
  if (r.tokens % T != 0) {
    throw ValueError("balance_loss: sequences of " + std::to_string(T) + " tokens do not divide " +
                     std::to_string(r.tokens));
  }
  if (static_cast<int64_t>(probs.size()) != r.tokens * E) {
    throw ValueError("balance_loss: " + std::to_string(probs.size()) + " probabilities for " +
                     std::to_string(r.tokens) + " tokens and " + std::to_string(E) + " experts");
  }
  std::vector<double> sums(static_cast<size_t>((r.tokens / T) * E), 0.0);
  for (int64_t n = 0; n < r.tokens; ++n) {
    for (int64_t e = 0; e < E; ++e)
      sums[static_cast<size_t>((n / T) * E + e)] += probs[static_cast<size_t>(n * E + e)];
  }
  return balance_loss_of_sums(r, sums, sequence);
}

double balance_loss_of_sums(const Routing& r, const std::vector<double>& sums, int64_t sequence) {
  if (r.tokens == 0) return 0.0;
  const int64_t T = sequence > 0 ? sequence : r.tokens;
  if (r.tokens % T != 0) {
    throw ValueError("balance_loss: sequences of " + std::to_string(T) + " tokens do not divide " +
                     std::to_string(r.tokens));
  }
  const int64_t E = r.experts, k = r.top_k, S = r.tokens / T;
  if (static_cast<int64_t>(sums.size()) != S * E) {
    throw ValueError("balance_loss: " + std::to_string(sums.size()) + " sums for " +
                     std::to_string(S) + " sequences of " + std::to_string(E) + " experts");
  }
  const auto at = [](int64_t i) { return static_cast<size_t>(i); };
  std::vector<double> counts(at(S * E), 0.0);
  for (int64_t n = 0; n < r.tokens; ++n)
    for (int64_t j = 0; j < k; ++j) ++counts[at((n / T) * E + r.choice[at(n * k + j)])];
  return balance_loss_of_counts(counts, sums, T, k, E);
}

double balance_loss_of_counts(const std::vector<double>& counts, const std::vector<double>& sums,
                              int64_t sequence, int64_t top_k, int64_t experts) {
  const int64_t T = sequence, k = top_k, E = experts;
  const auto size = static_cast<int64_t>(counts.size());
  if (T < 1 || k < 1 || E < 1 || counts.size() != sums.size() || size % E != 0) {
    throw ValueError("balance_loss: " + std::to_string(counts.size()) + " counts and " +
                     std::to_string(sums.size()) + " sums of " + std::to_string(E) +
                     " experts for sequences of " + std::to_string(T) + " tokens, top_k " +
                     std::to_string(k) + " (expected as many of each, whole rows of experts)");
  }
  const int64_t S = size / E;
  if (S == 0) return 0.0;
  double total = 0;
  for (int64_t i = 0; i < size; ++i) {
    const auto at = static_cast<size_t>(i);
    total += counts[at] / static_cast<double>(T * k) * sums[at] / static_cast<double>(T);
  }
  return static_cast<double>(E) * total / static_cast<double>(S);
}

bool is_moe_state(const std::string& name) {
  static const std::string kBias = ".mlp.expert_bias";
  return name.size() > kBias.size() &&
         name.compare(name.size() - kBias.size(), kBias.size(), kBias) == 0;
}

void update_expert_bias(Tensor& bias, const std::vector<double>& load, double rate) {
  const int64_t E = bias.numel();
  if (bias.dim() != 1 || static_cast<int64_t>(load.size()) != E) {
    throw ValueError("update_expert_bias: " + std::to_string(load.size()) + " loads for biases " +
                     shape_str(bias.shape()) + " (expected one per expert)");
  }
  double total = 0;
  for (size_t e = 0; e < load.size(); ++e) {
    if (!std::isfinite(load[e])) {
      throw ValueError("update_expert_bias: expert " + std::to_string(e) + "'s load is " +
                       std::to_string(load[e]) + " (expected a finite count)");
    }
    total += load[e];
  }
  std::vector<double> b = to_double_vector(bias);
  for (size_t e = 0; e < b.size(); ++e) {
    // load < total / E, compared exactly for counts (and for counts scaled
    // alike, as a tensor-parallel group's are).
    const double scaled = load[e] * static_cast<double>(E);
    if (scaled < total) b[e] += rate;
    if (scaled > total) b[e] -= rate;
  }
  autograd::NoGradGuard no_grad;
  copy_(bias, from_vector(b, bias.shape(), bias.dtype(), bias.device()));
}

void MoeStats::add_loads(int64_t layer, const std::vector<int64_t>& load) {
  std::vector<double>& into = loads[layer];
  if (into.empty()) into.assign(load.size(), 0.0);
  if (into.size() != load.size()) {
    throw ValueError("MoeStats: layer " + std::to_string(layer) + " reported " +
                     std::to_string(load.size()) + " experts' loads after " +
                     std::to_string(into.size()));
  }
  for (size_t e = 0; e < load.size(); ++e) into[e] += static_cast<double>(load[e]);
}

void MoeStats::record(double balance, double load, double dropped, double z_loss) {
  balance_sum += balance;
  max_load = std::max(max_load, load);
  dropped_sum += dropped;
  z_loss_sum += z_loss;
  ++records;
}

void MoeStats::record_counts(int64_t layer, const std::vector<double>& counts,
                             const std::vector<double>& sums, double z_loss, int64_t sequence,
                             int64_t top_k, int64_t experts, int64_t capacity) {
  const double balance = balance_loss_of_counts(counts, sums, sequence, top_k, experts);
  const int64_t E = experts, S = static_cast<int64_t>(counts.size()) / E;
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < S * E; ++i)
    load[static_cast<size_t>(i % E)] += std::llround(counts[static_cast<size_t>(i)]);
  int64_t busiest = 0, dropped = 0;
  for (const int64_t l : load) {
    busiest = std::max(busiest, l);
    if (capacity > 0) dropped += std::max<int64_t>(l - capacity, 0);
  }
  const double assignments = static_cast<double>(std::max<int64_t>(S * sequence * top_k, 1));
  add_loads(layer, load);
  record(balance, static_cast<double>(busiest * E) / assignments,
         static_cast<double>(dropped) / assignments, z_loss);
}

Tensor MoeStats::pending_values() const {
  if (pending.empty()) return Tensor{};
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> parts;
  for (const Pending& p : pending) {
    parts.push_back(reshape(cast(p.counts, DType::F64), {p.counts.numel()}));
    parts.push_back(reshape(cast(p.sums, DType::F64), {p.sums.numel()}));
    if (p.z.defined()) parts.push_back(reshape(cast(p.z, DType::F64), {1}));
  }
  return concat(parts, 0);
}

void MoeStats::settle(const std::vector<double>& values) {
  int64_t expected = 0;
  for (const Pending& p : pending)
    expected += p.counts.numel() + p.sums.numel() + (p.z.defined() ? 1 : 0);
  if (static_cast<int64_t>(values.size()) != expected) {
    throw ValueError("MoeStats::settle: " + std::to_string(values.size()) + " values for " +
                     std::to_string(pending.size()) + " pending records (expected " +
                     std::to_string(expected) + ")");
  }
  auto at = values.begin();
  const auto take = [&at](int64_t n) {
    std::vector<double> v(at, at + n);
    at += n;
    return v;
  };
  std::vector<Pending> read = std::move(pending);
  pending.clear();
  for (const Pending& p : read) {
    const std::vector<double> counts = take(p.counts.numel()), sums = take(p.sums.numel());
    const double z = p.z.defined() ? take(1)[0] : 0.0;
    // Every token makes top_k assignments; one that could not choose (its
    // router's scores not finite) counted none.
    const double made = std::accumulate(counts.begin(), counts.end(), 0.0);
    const int64_t S = p.counts.size(0), all = S * p.sequence * p.top_k;
    if (std::llround(made) != all) {
      throw ValueError("MoeMlp (layer " + std::to_string(p.layer) + "): " +
                       std::to_string(all - std::llround(made)) + " of the " + std::to_string(all) +
                       " routing choices chose no expert (some tokens' router scores, or scores "
                       "plus expert biases, are not finite; found on the device)");
    }
    record_counts(p.layer, counts, sums, z, p.sequence, p.top_k, p.counts.size(1), p.capacity);
  }
}

void MoeStats::settle() {
  if (pending.empty()) return;
  settle(to_double_vector(pending_values()));
}

namespace {

// One expert's two linear layers under their names.
class ExpertModule : public Module {
 public:
  ExpertModule(int64_t C, int64_t fc, int64_t F) {
    c_fc = register_module("c_fc", std::make_shared<Linear>(C, fc, false));
    c_proj = register_module("c_proj", std::make_shared<Linear>(F, C, false));
  }
  std::shared_ptr<Linear> c_fc, c_proj;
};

// Modules registered under names of the caller's choosing.
class NamedModules : public Module {
 public:
  void add(const std::string& name, std::shared_ptr<Module> m) {
    register_module(name, std::move(m));
  }
};

// sigmoid(z) of each element of z (N, n), as the first of softmax([z, 0]):
// exact where z is far from 0 on either side.
Tensor sigmoid(const Tensor& z) {
  const Tensor column = reshape(z, {z.numel(), 1});
  return reshape(narrow(softmax(concat({column, zeros_like(column)}, 1)), 1, 0, 1), z.shape());
}

// A host vector as an index tensor (i64) on the host: the ops upload it
// where they need it without waiting for the device.
Tensor host_index(const std::vector<int64_t>& v) {
  return from_vector(v, {static_cast<int64_t>(v.size())}, DType::I64, Device::cpu());
}

}  // namespace

MoeMlp::MoeMlp(const GptConfig& cfg, int64_t layer, int64_t shards,
               std::shared_ptr<const ExpertPlacement> placement, int64_t shard)
    : placement_(std::move(placement)),
      experts_total_(cfg.moe.experts),
      top_k_(cfg.moe.top_k),
      normalize_(cfg.moe.normalize_top_k),
      aux_coef_(cfg.moe.aux_loss_coef),
      z_coef_(cfg.moe.z_loss_coef),
      capacity_factor_(cfg.moe.capacity_factor),
      drop_policy_(cfg.moe.drop_policy),
      score_(cfg.moe.score),
      routed_scale_(cfg.moe.routed_scaling_factor),
      groups_(cfg.moe.groups),
      top_groups_(cfg.moe.top_groups),
      group_best_(cfg.moe.group_score == GptConfig::Moe::GroupScore::Max ? 1 : 2),
      balance_scope_(cfg.moe.aux_loss_scope),
      layer_(layer),
      activation_(cfg.activation) {
  if (!cfg.moe_layer(layer)) {
    throw ValueError("MoeMlp: layer " + std::to_string(layer) +
                     " has a dense MLP (model.moe.experts " + std::to_string(cfg.moe.experts) +
                     ", dense_layers)");
  }
  if (shards < 1 || cfg.expert_ffn() % shards != 0) {
    throw ConfigError("model.moe.ffn_hidden_size (" + std::to_string(cfg.expert_ffn()) +
                      ") must be divisible by parallel.tp (" + std::to_string(shards) + ")");
  }
  if (shard < 0 || shard >= shards) {
    throw ValueError("MoeMlp: shard " + std::to_string(shard) + " of " + std::to_string(shards) +
                     " (expected 0 <= shard < shards)");
  }
  const int64_t first = placement_ ? placement_->first() : 0;
  const int64_t count = placement_ ? placement_->count() : cfg.moe.experts;
  if (first < 0 || count < 1 || first + count > cfg.moe.experts) {
    throw ValueError("MoeMlp: experts [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + ") of a layer of " +
                     std::to_string(cfg.moe.experts));
  }
  const int64_t C = cfg.d_model;
  router_ = register_module("router", std::make_shared<Linear>(C, cfg.moe.experts, false));
  if (cfg.moe.expert_bias)
    expert_bias_ = register_state("expert_bias", zeros({cfg.moe.experts}, DType::F32));
  // Named by their index in the whole layer, held here or not.
  auto list = register_module("experts", std::make_shared<NamedModules>());
  for (int64_t e = first; e < first + count; ++e) {
    auto m = std::make_shared<ExpertModule>(C, cfg.expert_fc_width() / shards,
                                            cfg.expert_ffn() / shards);
    list->add(std::to_string(e), m);
    experts_.push_back({m->c_fc, m->c_proj});
  }
  if (cfg.moe.shared_ffn_hidden_size > 0) {
    if (cfg.moe.shared_ffn_hidden_size % shards != 0) {
      throw ConfigError("model.moe.shared_ffn_hidden_size (" +
                        std::to_string(cfg.moe.shared_ffn_hidden_size) +
                        ") must be divisible by parallel.tp (" + std::to_string(shards) + ")");
    }
    auto m = register_module(
        "shared", std::make_shared<ExpertModule>(C, cfg.shared_fc_width() / shards,
                                                 cfg.moe.shared_ffn_hidden_size / shards));
    shared_ = Expert{m->c_fc, m->c_proj};
  }
  if (cfg.moe.shared_gate)
    shared_gate_ = register_module("shared_gate", std::make_shared<Linear>(C, 1, false));
  // LoRA's adapters on the experts, each drawing its own dropout masks
  // (each row its assignment's: assignment_keys). (c_proj reads this rank's
  // slice of the hidden units.)
  const auto adapt = [&](const std::string& stem, const Expert& e, int64_t hidden) {
    if (cfg.lora_on("mlp.c_fc")) {
      e.c_fc->enable_lora(cfg.lora.rank, cfg.lora_scale(), cfg.lora_dropout(layer, stem + "c_fc"));
    }
    if (cfg.lora_on("mlp.c_proj")) {
      if (shards > 1) e.c_proj->set_lora_input_shard(shard * (hidden / shards), hidden);
      e.c_proj->enable_lora(cfg.lora.rank, cfg.lora_scale(),
                            cfg.lora_dropout(layer, stem + "c_proj"));
    }
  };
  for (int64_t i = 0; i < count; ++i) {
    adapt("mlp.experts." + std::to_string(first + i) + ".", experts_[static_cast<size_t>(i)],
          cfg.expert_ffn());
  }
  keyed_dropout_ = cfg.lora.dropout > 0 && (cfg.lora_on("mlp.c_fc") || cfg.lora_on("mlp.c_proj"));
  pad_ = cfg.moe.pad_to_capacity;
  if (shared_) adapt("mlp.shared.", *shared_, cfg.moe.shared_ffn_hidden_size);
}

MoeMlp::Scores MoeMlp::route(const Tensor& x) const {
  const int64_t C = router_->weight().size(1);
  if (x.dim() < 1 || x.size(-1) != C) {
    throw ShapeError("MoeMlp: input " + shape_str(x.shape()) + " (expected (..., " +
                     std::to_string(C) + "))");
  }
  const Tensor tokens = reshape(x, {x.numel() / C, C});
  Scores s;
  const Tensor logits = cast(router_->forward(tokens), stat_dtype(x.dtype()));
  s.probs = score_ == GptConfig::Moe::Score::Sigmoid ? sigmoid(logits) : softmax(logits);
  if (z_coef_ > 0) s.logits = logits;
  if (shared_gate_)
    s.shared_gate = sigmoid(cast(shared_gate_->forward(tokens), stat_dtype(x.dtype())));
  return s;
}

Tensor MoeMlp::assignment_keys(const Routing& routing, int64_t N, const DropoutDraw& draw,
                               Device device) const {
  // Local token n is b * held + i, the i-th token this rank holds of
  // sequence b; it is token b * T + (its place in the row) of the whole
  // micro-batch (every token in order without pieces).
  const int64_t k = top_k_;
  std::vector<int64_t> place;  // the held tokens' places in their row
  int64_t T = N, held = N;
  if (draw.pieces) {
    T = draw.pieces->row_length;
    held = draw.pieces->held();
    for (const auto& [first, count] : draw.pieces->runs)
      for (int64_t j = 0; j < count; ++j) place.push_back(first + j);
    if (held <= 0 || N % held != 0) {
      throw ShapeError("MoeMlp: " + std::to_string(N) + " tokens are not whole rows of the " +
                       std::to_string(held) + " held of each sequence of " + std::to_string(T));
    }
  }
  const auto tokens = static_cast<uint64_t>((N / held) * T);
  std::vector<int64_t> keys(routing.assignment.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    // (An expert's padding row, assignment N k, weighs nothing: any key.)
    const int64_t a = std::min(routing.assignment[r], N * k - 1), n = a / k;
    const int64_t m = draw.pieces ? (n / held) * T + place[static_cast<size_t>(n % held)] : n;
    keys[r] = static_cast<int64_t>(assignment_key(draw.call, tokens, static_cast<uint64_t>(k),
                                                  static_cast<uint64_t>(m),
                                                  static_cast<uint64_t>(a % k)));
  }
  return to_device(from_vector(keys, {static_cast<int64_t>(keys.size())}, DType::I64), device);
}

Tensor MoeMlp::device_assignment_keys(const Tensor& slot_assignment, int64_t N,
                                      const DropoutDraw& draw) const {
  if (draw.pieces) {
    throw NotSupportedError(
        "MoeMlp: assignment keys formed on the device for rows held as pieces of their sequences "
        "(padded under context parallelism, a mixture routes the whole micro-batch)");
  }
  autograd::NoGradGuard no_grad;
  const Device dev = slot_assignment.device();
  const int64_t A = N * top_k_;
  // key = (call N + n) k + j = call A + a (modulo 2^64, as the host's):
  // the call's part is a fill's value, exact below 2^53.
  const uint64_t base = draw.call * static_cast<uint64_t>(A);
  if (base >= (uint64_t{1} << 53)) {
    throw NotSupportedError("MoeMlp: LoRA dropout keys at call " + std::to_string(draw.call) +
                            " of " + std::to_string(A) +
                            " assignments formed on the device (their base passes 2^53)");
  }
  // (Integer arithmetic on the backend, elementwise over the rows.)
  const Tensor a = contiguous(slot_assignment);
  const int64_t M = a.numel();
  auto op = [&](BinaryOp o, const Tensor& x, const Tensor& y) {
    Tensor out = empty({M}, DType::I64, dev);
    backend_for(out).binary(o, x, y, out);
    return out;
  };
  const Tensor total = full({M}, static_cast<double>(A), DType::I64, dev);
  // (a / A is 1 for the padding's assignment A alone: keyed as A - 1.)
  Tensor keys = op(BinaryOp::Add, op(BinaryOp::Sub, a, op(BinaryOp::Div, a, total)),
                   full({M}, static_cast<double>(base), DType::I64, dev));
  if (draw.calls.defined()) {
    // The replay's call: its count, in device memory, times A.
    const Tensor calls = contiguous(draw.calls);
    const Tensor count = make_view(calls, {M}, {0}, calls.offset());
    keys = op(BinaryOp::Add, keys, op(BinaryOp::Mul, count, total));
  }
  return keys;
}

bool MoeMlp::grouped_experts() const {
  // GPT-2's GELU keeps its epilogues in each expert's products.
  return activation_ != Activation::Gelu && groupable();
}

bool MoeMlp::groupable() const {
  // Adapters and biases are each expert's own.
  for (const Expert& e : experts_) {
    for (const auto* l : {e.c_fc.get(), e.c_proj.get()}) {
      if (l->has_lora() || l->bias().defined()) return false;
    }
  }
  return true;
}

bool MoeMlp::device_groupable(bool training) const {
  for (const Expert& e : experts_) {
    for (const auto* l : {e.c_fc.get(), e.c_proj.get()}) {
      if (l->bias().defined() || (l->has_lora() && training && l->lora_dropout_p() > 0)) {
        return false;
      }
    }
  }
  return true;
}

Tensor MoeMlp::expert_forward(const Expert& e, const Tensor& x, const DropoutDraw& draw) const {
  if (activation_ == Activation::Gelu)
    return e.c_proj->forward_after_gelu(e.c_fc->forward_gelu(x, draw), draw);
  return e.c_proj->forward(unfused_activation(activation_, e.c_fc->forward(x, draw)), draw);
}

Routing MoeMlp::route_chunk_under_capacity(std::vector<int64_t> choice,
                                           const std::vector<double>& chosen, int64_t chunk,
                                           int64_t capacity) const {
  const int64_t E = num_experts(), k = top_k_, P = chunks_.parts, me = chunks_.rank;
  const int64_t N = static_cast<int64_t>(choice.size()) / k;
  if (!chunks_.gather || chunk < 1 || N % chunk != 0 || me < 0 || me >= P ||
      (!chosen.empty() && chosen.size() != choice.size())) {
    throw ValueError(
        "MoeMlp: an expert capacity under context parallelism needs the chunks' "
        "gather and rank (" +
        std::to_string(me) + " of " + std::to_string(P) + "), chunks of whole rows (" +
        std::to_string(N) + " tokens in chunks of " + std::to_string(chunk) + ") and " +
        std::to_string(choice.size()) + " chosen scores or none (got " +
        std::to_string(chosen.size()) + ")");
  }
  // Each token's k choices, then their k scores (none: 0s): 2 k values a
  // token, exact as f64 (an expert's index is below 2^53).
  std::vector<double> mine(static_cast<size_t>(2 * N * k));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < k; ++j) {
      const size_t a = static_cast<size_t>(n * k + j);
      mine[static_cast<size_t>(2 * n * k + j)] = static_cast<double>(choice[a]);
      mine[static_cast<size_t>(2 * n * k + k + j)] = chosen.empty() ? 0.0 : chosen[a];
    }
  }
  const std::vector<double> all = chunks_.gather(mine);  // rank r's, in rank order
  if (static_cast<int64_t>(all.size()) != P * 2 * N * k) {
    throw ValueError("MoeMlp: the chunks' gather gave " + std::to_string(all.size()) +
                     " values, not " + std::to_string(P * 2 * N * k));
  }
  // The micro-batch's tokens in one process's order: sequence by sequence,
  // each sequence's tokens where the ranks' runs put them (unset: the
  // chunks in rank order). position[r][j]: rank r's j-th token's place in
  // its row.
  std::vector<std::vector<int64_t>> position(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) {
    auto& at = position[static_cast<size_t>(r)];
    if (!chunks_.runs) {
      for (int64_t j = 0; j < chunk; ++j) at.push_back(r * chunk + j);
      continue;
    }
    for (const auto& [first, count] : chunks_.runs(P * chunk, r))
      for (int64_t j = 0; j < count; ++j) at.push_back(first + j);
    if (static_cast<int64_t>(at.size()) != chunk) {
      throw ValueError("MoeMlp: rank " + std::to_string(r) + "'s runs hold " +
                       std::to_string(at.size()) + " of a row's tokens, not its chunk of " +
                       std::to_string(chunk));
    }
  }
  auto global = [&](int64_t r, int64_t n) {
    const int64_t row = n / chunk, j = n % chunk;
    return row * P * chunk + position[static_cast<size_t>(r)][static_cast<size_t>(j)];
  };
  std::vector<int64_t> whole_choice(static_cast<size_t>(P * N * k));
  std::vector<double> whole_chosen(whole_choice.size());
  for (int64_t r = 0; r < P; ++r) {
    for (int64_t n = 0; n < N; ++n) {
      const double* from = all.data() + (r * N + n) * 2 * k;
      const int64_t g = global(r, n);
      for (int64_t j = 0; j < k; ++j) {
        const double e = from[j];
        if (!(e >= 0 && e < static_cast<double>(E))) {
          throw ValueError("MoeMlp: rank " + std::to_string(r) + "'s token " + std::to_string(n) +
                           " chose expert " + std::to_string(e) + " of " + std::to_string(E));
        }
        whole_choice[static_cast<size_t>(g * k + j)] = static_cast<int64_t>(e);
        whole_chosen[static_cast<size_t>(g * k + j)] = from[k + j];
      }
    }
  }
  const Routing whole =
      route_chosen(std::move(whole_choice), P * N, E, k, capacity, drop_policy_, whole_chosen);
  std::vector<char> kept_whole(static_cast<size_t>(P * N * k), 0);
  for (int64_t a : whole.assignment) {
    if (a < P * N * k) kept_whole[static_cast<size_t>(a)] = 1;
  }
  std::vector<char> keep(static_cast<size_t>(N * k));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < k; ++j)
      keep[static_cast<size_t>(n * k + j)] = kept_whole[static_cast<size_t>(global(me, n) * k + j)];
  }
  return keep_assignments(route_chosen(std::move(choice), N, E, k), keep, N, k);
}

Routing MoeMlp::route_on_device(const Tensor& probs, int64_t capacity, int64_t chunk,
                                const std::vector<Tensor>& also,
                                std::vector<std::vector<double>>* also_host) const {
  const int64_t N = probs.size(0), E = num_experts(), k = top_k_;
  // Under a capacity that drops the least probable, each choice's score
  // ranks an expert's assignments: read with the choices.
  const bool ranked = capacity > 0 && drop_policy_ == GptConfig::Moe::DropPolicy::Probs;
  const Tensor scores = probs.is_contiguous() ? probs : contiguous(probs);
  Tensor chosen = empty({N, k}, DType::I64, probs.device());
  Tensor chosen_scores = ranked ? empty({N, k}, scores.dtype(), probs.device()) : Tensor{};
  backend_for(probs).route_top_k(scores, expert_bias_, groups_, top_groups_, group_best_, chosen,
                                 ranked ? &chosen_scores : nullptr);
  std::vector<int64_t> choice;
  std::vector<double> chosen_host;
  std::vector<Tensor> more = also;
  if (ranked) more.insert(more.begin(), chosen_scores);
  std::vector<std::vector<double>> more_host;
  if (!more.empty()) {
    // One read for all: the choices as f64 (exact below 2^53), then each of
    // `more` in turn.
    autograd::NoGradGuard no_grad;
    std::vector<Tensor> parts{reshape(cast(chosen, DType::F64), {N * k})};
    for (const Tensor& t : more) parts.push_back(reshape(cast(t, DType::F64), {t.numel()}));
    const std::vector<double> all = to_double_vector(concat(parts, 0));
    choice.assign(all.begin(), all.begin() + N * k);
    auto at = all.begin() + N * k;
    for (const Tensor& t : more) {
      more_host.emplace_back(at, at + t.numel());
      at += t.numel();
    }
  } else {
    const Tensor host = to_device(chosen, Device::cpu());
    choice.assign(host.data<int64_t>(), host.data<int64_t>() + N * k);
  }
  if (ranked) {
    chosen_host = std::move(more_host.front());
    more_host.erase(more_host.begin());
  }
  if (also_host) *also_host = std::move(more_host);
  for (int64_t n = 0; n < N; ++n) {
    if (choice[static_cast<size_t>(n * k)] >= 0) continue;
    // A token that could not choose: the scores (and biases) read only now.
    throw_unchosen(to_double_vector(narrow(probs, 0, n, 1)).data(), n, E,
                   expert_bias_.defined() ? to_double_vector(expert_bias_) : std::vector<double>{});
  }
  if (capacity > 0 && chunks_.parts > 1)
    return route_chunk_under_capacity(std::move(choice), chosen_host, chunk, capacity);
  return route_chosen(std::move(choice), N, E, k, capacity, drop_policy_, chosen_host);
}

Tensor MoeMlp::experts(const Tensor& x, const Scores& scores, const ForwardContext& ctx,
                       const GateHook& gate) const {
  const Tensor& probs = scores.probs;
  const int64_t C = router_->weight().size(1), E = num_experts(), k = top_k_;
  if (x.dim() < 1 || x.size(-1) != C) {
    throw ShapeError("MoeMlp: input " + shape_str(x.shape()) + " (expected (..., " +
                     std::to_string(C) + "))");
  }
  const int64_t N = x.numel() / C;
  if (N == 0) throw ShapeError("MoeMlp: input " + shape_str(x.shape()) + " holds no tokens");
  // The tokens each sequence-wise balance counts apart: x's rows (..., T,
  // C); a (N, C) input is one sequence.
  const int64_t sequence = balance_scope_ == GptConfig::Moe::BalanceScope::Sequence
                               ? (x.dim() >= 3 ? x.size(-2) : N)
                               : 0;
  if (probs.dim() != 2 || probs.size(0) != N || probs.size(1) != E) {
    throw ShapeError("MoeMlp: router probabilities " + shape_str(probs.shape()) + " for " +
                     std::to_string(N) + " tokens (expected (" + std::to_string(N) + ", " +
                     std::to_string(E) + "))");
  }
  // Capacity caps the experts' batches while training (evaluation and
  // generation are dropless).
  // Under context parallelism the micro-batch is every rank's chunks.
  const int64_t P = chunks_.parts;
  const int64_t capacity = ctx.training ? expert_capacity(capacity_factor_, N * P, E, k) : 0;
  // model.moe.pad_to_capacity: every expert's batch its capacity, the
  // slots filled where the scores are.
  const bool padded = pad_ && capacity > 0;
  // Padded under context parallelism (`across`): every rank routes the whole
  // micro-batch, its tokens and probabilities gathered from the context
  // group (chunks_.gather_rows) in the sequences' order, as one process
  // would; each runs its P-th of every expert's slots, and the experts'
  // outputs are gathered back. Nothing waits for the host, and the routing,
  // the drops and the counts are one process's.
  const bool across = padded && P > 1;
  if (across &&
      (!chunks_.gather_rows || !chunks_.sequence_order || chunks_.rank < 0 || chunks_.rank >= P)) {
    throw ValueError(
        "MoeMlp: an expert capacity padded under context parallelism needs the "
        "chunks' gather of rows, their sequence order and the rank (" +
        std::to_string(chunks_.rank) + " of " + std::to_string(P) + ")");
  }
  // (The experts' adapters' dropout keys then number the whole micro-batch's
  // assignments in one process's order, as its tokens are: no pieces.)
  const auto whole_draw = [](DropoutDraw d) {
    d.pieces = nullptr;
    return d;
  };
  const int64_t Pw = across ? P : 1, N_all = N * Pw;
  // The micro-batch's rows (Sx sequences of Tx tokens here) gathered from
  // every rank of the context group, in each sequence's order, and this
  // rank's tokens of such rows back (chunks_.runs).
  const int64_t Tx = x.dim() >= 3 ? x.size(-2) : N, Sx = N / Tx;
  const auto gathered_in_order = [&](const Tensor& t) {  // (Sx, Tx, W) -> (Sx, P Tx, W)
    return chunks_.sequence_order(chunks_.gather_rows(t));
  };
  const auto own_rows = [&](const Tensor& t) {  // (Sx, P Tx, W) -> (Sx, Tx, W)
    if (!chunks_.runs) return narrow(t, 1, chunks_.rank * Tx, Tx);
    std::vector<Tensor> parts;
    for (const auto& [first, count] : chunks_.runs(P * Tx, chunks_.rank))
      parts.push_back(narrow(t, 1, first, count));
    return parts.size() == 1 ? parts[0] : concat(parts, 1);
  };
  Tensor x_all = reshape(x, {N, C}), probs_all = probs;
  if (across) {
    x_all = reshape(gathered_in_order(reshape(x, {Sx, Tx, C})), {N_all, C});
    probs_all = reshape(gathered_in_order(reshape(probs, {Sx, Tx, E})), {N_all, E});
  }
  const bool sigmoid_scores = score_ == GptConfig::Moe::Score::Sigmoid;
  const bool balancing =
                 ctx.training && autograd::grad_enabled() && aux_coef_ > 0 && probs.requires_grad(),
             reporting = ctx.moe_stats && ctx.training && !autograd::recomputing();
  const int64_t T_local = sequence > 0 ? sequence : N, S = N / T_local;
  // The probabilities the balance counts: sigmoid scores as probabilities
  // (each token's over their sum).
  const auto balanced_of = [&](const Tensor& q) {
    return sigmoid_scores ? div(q, affine(sum(q, 1, true), 1.0, 1e-20)) : q;
  };
  const auto balanced_probs = [&] { return balanced_of(probs); };
  // What the device can do before the host reads the routing, queued ahead
  // of that read so that the read waits for it anyway and the device works
  // while the host routes: each expert's probabilities summed over each
  // sequence (S x E; only when read), and the shared expert.
  Tensor p_summed;
  if (reporting || (balancing && P > 1 && !across)) {
    autograd::NoGradGuard no_grad;
    // (Across the context group: the whole micro-batch's, as its counts.)
    p_summed = sum(reshape(balanced_of(probs_all), {S, T_local * Pw, E}), 1);
  }
  Tensor shared_out;
  if (shared_) shared_out = expert_forward(*shared_, reshape(x, {N, C}), ctx.draw());
  // The router z-loss (ST-MoE), Z = mean_n lse_n^2 with lse_n =
  // logsumexp_e(logits_ne): a cross entropy's second output over the
  // router's logits (their targets, ignored by Z, all 0), in the logits'
  // statistics dtype where they are; its gradient, 2 / N lse_n
  // softmax_ne, comes from that op's backward.
  const bool z_loss_on = ctx.training && z_coef_ > 0;
  Tensor z;
  if (z_loss_on) {
    if (!scores.logits.defined() || scores.logits.shape() != probs.shape()) {
      throw ShapeError("MoeMlp: the router's logits " + shape_str(scores.logits.shape()) +
                       " for the z-loss (expected " + shape_str(probs.shape()) + ")");
    }
    // (Inside a capture the targets live on the device, as a captured loss's.)
    const bool capturing = backend_for(scores.logits).capturing(scores.logits.device());
    cross_entropy(scores.logits,
                  zeros({N}, DType::I64, capturing ? scores.logits.device() : Device::cpu()), -100,
                  &z);
  }
  // What the host reads with the routing: those sums and the z-loss's value.
  std::vector<Tensor> read_with;
  if (p_summed.defined()) read_with.push_back(p_summed);
  if (z.defined()) read_with.push_back(z);
  // The one read of the step's routing on the host (a GPU waits for the
  // router here): the experts' batch sizes decide the GEMMs' shapes. The
  // tokens choose where the scores are (on a GPU, a kernel), and the host
  // reads their choices (and, under a capacity, the chosen scores, which
  // rank an expert's assignments).
  std::vector<std::vector<double>> read;
  Routing routing;
  // Where each token's chosen probabilities are in probs (N k), each row's
  // token and assignment (its gate), and each expert's rows: the host's,
  // or the device's inside a capture.
  Tensor picked_at, token_at, assignment_at;
  std::vector<int64_t> per_expert;
  Tensor counts;   // pad_to_capacity: (S, E) i64, each sequence's assignments per expert
  Tensor keys;     // the experts' adapters' dropout keys, formed on the device (padded)
  Tensor offsets;  // a dropless routing on the device: each expert's rows (E + 1)
  bool recorded = false;
  // A dropless mixture inside a capture, or a cuda::DeviceChecks (the
  // trainer's uncaptured steps on a GPU): the rows grouped on the device
  // and the experts' products sized there (grouped_linear's offsets), so
  // the host reads nothing, as a padded mixture's; under context
  // parallelism the balance's counts and summed probabilities are added
  // over the group there too (chunks_.gather_rows). It needs this rank to
  // hold every expert (the exchange's counts are read on the host) and
  // experts without biases whose adapters drop nothing out (each expert
  // draws its own masks, so it runs on its own rows); inside a capture,
  // without them, nothing can route.
  const bool dropless = !padded && capacity == 0;
  bool device_dropless = false;
  if (dropless) {
    Backend& backend = backend_for(probs);
    const bool capturing = backend.capturing(probs.device());
    if (capturing || backend.checks_indices_on_device(probs.device())) {
      device_dropless =
          !placement_ && (P == 1 || chunks_.gather_rows) && device_groupable(ctx.training);
      if (capturing && !device_dropless) {
        throw NotSupportedError(
            "MoeMlp (layer " + std::to_string(layer_) +
            "): a dropless mixture inside a CUDA graph needs every expert on this rank (no "
            "expert parallelism), the context group's gather of rows under context parallelism "
            "and experts without LoRA dropout on their adapters (this layer has " +
            (placement_                        ? "expert parallelism"
             : !device_groupable(ctx.training) ? "LoRA dropout on its experts' adapters"
                                               : "no gather") +
            "); model.moe.pad_to_capacity routes them on the device");
      }
    }
  }
  if (device_dropless) {
    Backend& backend = backend_for(probs);
    const Device dev = probs.device();
    Tensor chosen = empty({N, k}, DType::I64, dev);
    {
      autograd::NoGradGuard no_grad;
      const Tensor scored = probs.is_contiguous() ? probs : contiguous(probs);
      backend.route_top_k(scored, expert_bias_, groups_, top_groups_, group_best_, chosen);
    }
    token_at = empty({N * k}, DType::I64, dev);
    assignment_at = empty({N * k}, DType::I64, dev);
    picked_at = empty({N * k}, DType::I64, dev);
    offsets = empty({E + 1}, DType::I64, dev);
    counts = empty({S, E}, DType::I64, dev);
    backend.dropless_rows(chosen, E, T_local, token_at, assignment_at, offsets, picked_at, counts);
    Tensor sums = p_summed;
    if (P > 1) {
      // The whole micro-batch's counts and summed probabilities, every
      // rank's added over the context group on the device (the host path's
      // chunks_.sum).
      autograd::NoGradGuard no_grad;
      std::vector<Tensor> parts{cast(counts, DType::F64)};
      if (p_summed.defined()) parts.push_back(cast(p_summed, DType::F64));
      const int64_t width = p_summed.defined() ? 2 * E : E;
      const Tensor all = sum(chunks_.gather_rows(reshape(concat(parts, 1), {S, 1, width})), 1);
      counts = contiguous(narrow(all, 1, 0, E));
      if (p_summed.defined()) sums = contiguous(narrow(all, 1, E, E));
    }
    if (reporting) {
      ctx.moe_stats->pending.push_back(
          {layer_, T_local * P, k, 0, counts, sums, z.defined() ? z.detach() : Tensor{}});
    }
    recorded = true;
  } else if (padded) {
    Backend& backend = backend_for(probs);
    const Device dev = probs.device();
    Tensor chosen = empty({N_all, k}, DType::I64, dev);
    // (drop_policy probs: an over-full expert ranks its assignments by
    // their scores, which the choice writes beside it.)
    const bool ranked = drop_policy_ == GptConfig::Moe::DropPolicy::Probs;
    Tensor chosen_scores = ranked ? empty({N_all, k}, probs.dtype(), dev) : Tensor{};
    {
      autograd::NoGradGuard no_grad;
      const Tensor scored = probs_all.is_contiguous() ? probs_all : contiguous(probs_all);
      backend.route_top_k(scored, expert_bias_, groups_, top_groups_, group_best_, chosen,
                          ranked ? &chosen_scores : nullptr);
    }
    Tensor slot_token = empty({E * capacity}, DType::I64, dev),
           slot_assignment = empty({E * capacity}, DType::I64, dev),
           picked = empty({N_all * k}, DType::I64, dev);
    counts = empty({S, E}, DType::I64, dev);
    backend.capacity_slots(chosen, chosen_scores, E, capacity, T_local * Pw, slot_token,
                           slot_assignment, picked, counts);
    per_expert.assign(static_cast<size_t>(E), capacity);
    // Inside a capture, or a cuda::DeviceChecks (the trainer's uncaptured
    // steps on a GPU), the host reads nothing: the ops take the device's
    // indices and check them there, the experts' adapters' dropout keys
    // are formed there, and the routing's statistics wait on the device
    // for the step's end (MoeStats::settle).
    if (backend.capturing(dev) || backend.checks_indices_on_device(dev)) {
      if (ctx.training && keyed_dropout_) {
        keys = device_assignment_keys(slot_assignment, N_all,
                                      across ? whole_draw(ctx.draw()) : ctx.draw());
      }
      picked_at = picked;
      token_at = slot_token;
      assignment_at = slot_assignment;
      if (reporting) {
        ctx.moe_stats->pending.push_back({layer_, T_local * Pw, k, capacity, counts, p_summed,
                                          z.defined() ? z.detach() : Tensor{}});
      }
      recorded = true;
    } else {
      // One read, as the dropless routing's: the slots, the choices and the
      // counts with what the host reads beside them.
      autograd::NoGradGuard no_grad;
      std::vector<Tensor> parts{slot_token, slot_assignment, picked,
                                reshape(counts, {counts.numel()})};
      for (Tensor& t : parts) t = cast(t, DType::F64);
      for (const Tensor& t : read_with) parts.push_back(reshape(cast(t, DType::F64), {t.numel()}));
      const std::vector<double> all = to_double_vector(concat(parts, 0));
      auto at = all.begin();
      const auto take = [&at](int64_t n) {
        std::vector<int64_t> v(static_cast<size_t>(n));
        for (int64_t& x : v) x = static_cast<int64_t>(*at++);
        return v;
      };
      routing.tokens = N_all;
      routing.experts = E;
      routing.top_k = k;
      routing.token = take(E * capacity);
      routing.assignment = take(E * capacity);
      const std::vector<int64_t> pick = take(N_all * k);
      std::vector<double> per_sequence(at, at + S * E);
      at += S * E;
      for (const Tensor& t : read_with) {
        read.emplace_back(at, at + t.numel());
        at += t.numel();
      }
      routing.choice.resize(static_cast<size_t>(N_all * k));
      for (int64_t a = 0; a < N_all * k; ++a) {
        const int64_t p = pick[static_cast<size_t>(a)], n = a / k;
        if (p == N_all * E) {
          // A token that could not choose: the scores (and biases) read only now.
          throw_unchosen(
              to_double_vector(narrow(probs_all, 0, n, 1)).data(), n, E,
              expert_bias_.defined() ? to_double_vector(expert_bias_) : std::vector<double>{});
        }
        routing.choice[static_cast<size_t>(a)] = p - n * E;
      }
      routing.rows = per_expert;
      routing.load.assign(static_cast<size_t>(E), 0);
      for (int64_t i = 0; i < S * E; ++i)
        routing.load[static_cast<size_t>(i % E)] +=
            static_cast<int64_t>(per_sequence[static_cast<size_t>(i)]);
      for (const int64_t l : routing.load) routing.dropped += std::max<int64_t>(l - capacity, 0);
      picked_at = host_index(pick);
      if (reporting) {
        ctx.moe_stats->record_counts(layer_, per_sequence, read.front(),
                                     z.defined() ? read.back().at(0) : 0.0, T_local * Pw, k, E,
                                     capacity);
      }
      recorded = true;
    }
  } else {
    routing = route_on_device(probs, capacity, x.dim() >= 3 ? x.size(-2) : N, read_with, &read);
    std::vector<int64_t> picked(static_cast<size_t>(N * k));
    for (int64_t a = 0; a < N * k; ++a)
      picked[static_cast<size_t>(a)] = (a / k) * E + routing.choice[static_cast<size_t>(a)];
    picked_at = host_index(picked);
    per_expert = routing.rows;
  }
  if (!token_at.defined()) {
    token_at = host_index(routing.token);
    assignment_at = host_index(routing.assignment);
  }
  std::vector<double> p_sums;
  if (p_summed.defined() && !read.empty()) p_sums = std::move(read.front());
  // The gates: each token's k chosen probabilities, renormalised over the k
  // if asked, then the padding's 0: (N k + 1, 1). (Padded, probs gain a 0
  // row where a token that could not choose points.)
  Tensor g =
      embedding(padded || device_dropless ? concat({reshape(probs_all, {N_all * E, 1}),
                                                    zeros({1, 1}, probs.dtype(), probs.device())},
                                                   0)
                                          : reshape(probs, {N * E, 1}),
                picked_at);  // (N_all k, 1)
  if (normalize_) {
    // (Sigmoid scores may all underflow: the sum keeps off 0, as DeepSeek's.)
    const Tensor per_token = reshape(g, {N_all, k});
    const Tensor total = sum(per_token, 1, true);
    g = reshape(div(per_token, sigmoid_scores ? affine(total, 1.0, 1e-20) : total), {N_all * k, 1});
  }
  if (routed_scale_ != 1.0) g = scale(g, routed_scale_);
  g = concat({g, zeros({1, 1}, g.dtype(), g.device())}, 0);
  if (gate) g = gate(g);
  // Across the context group each expert's slots are cut into P shares of
  // `share` (the last ones padded with empty slots: token 0, gate 0), and
  // this rank runs its share of every expert's; the combine takes every
  // slot, in one process's order.
  const int64_t share = across ? (capacity + P - 1) / P : 0, wide = share * P;
  // A slot-wise index (E * capacity) widened to every expert's `wide`
  // slots, and this rank's share of it (E * share).
  const auto widened = [&](const Tensor& t, double empty_value) {
    if (wide == capacity) return t;
    return reshape(concat({reshape(t, {E, capacity}),
                           full({E, wide - capacity}, empty_value, DType::I64, t.device())},
                          1),
                   {E * wide});
  };
  const auto own_share = [&](const Tensor& t) {
    return reshape(contiguous(narrow(reshape(t, {E, wide}), 1, chunks_.rank * share, share)),
                   {E * share});
  };
  Tensor tokens = token_at, slot_assignment_at = assignment_at, row_tokens = token_at;
  if (across) {
    tokens = widened(token_at, 0.0);
    slot_assignment_at = widened(assignment_at, static_cast<double>(N_all * k));
    row_tokens = own_share(tokens);
    per_expert.assign(static_cast<size_t>(E), share);
  }
  const Tensor gates = cast(embedding(g, slot_assignment_at), x.dtype());  // (M, 1)
  const Tensor rows = embedding(x_all, row_tokens);                        // (M, C), this rank's
  // The adapters' dropout masks: each routed expert's row draws its
  // assignment's (the rows' keys, which travel with them to other ranks);
  // the shared expert's rows are the micro-batch's tokens in order, which
  // draw the whole sequences'.
  const DropoutDraw mask = ctx.draw();
  if (ctx.training && keyed_dropout_ && !keys.defined())
    keys = assignment_keys(routing, N_all, across ? whole_draw(mask) : mask, x.device());
  if (across && keys.defined()) keys = own_share(widened(keys, 0.0));
  // (Keyed rows' keys hold their call: a replay's count is in them.)
  auto draw = [&mask](const Tensor& k) {
    return DropoutDraw{
        mask.training, mask.seed, mask.call, {}, k, k.defined() ? Tensor{} : mask.calls};
  };
  Tensor outputs;  // (M, C), in rows' order
  if (placement_) {
    outputs = placement_->run(
        rows, per_expert, keys,
        [this, &draw](int64_t i, const Tensor& x, const Tensor& k) {
          return expert_forward(experts_.at(static_cast<size_t>(i)), x, draw(k));
        },
        padded);
  } else if (device_dropless) {
    // The experts' products sized on the device (GPT-2's GELU between
    // them unfused), each layer's adapters as two more: y = x W^T + s (x
    // A^T) B^T.
    const auto layer = [&](const std::function<const Linear&(const Expert&)>& which,
                           const Tensor& in) {
      std::vector<Tensor> w, a, b;
      for (const Expert& e : experts_) {
        const Linear& l = which(e);
        w.push_back(l.weight());
        if (l.has_lora()) {
          a.push_back(l.lora_a());
          b.push_back(l.lora_b());
        }
      }
      Tensor y = grouped_linear(in, w, offsets);
      if (a.empty()) return y;
      const double s = which(experts_.front()).lora_scale();
      return add(y, scale(grouped_linear(grouped_linear(in, a, offsets), b, offsets), s));
    };
    const Tensor h = layer([](const Expert& e) -> const Linear& { return *e.c_fc; }, rows);
    outputs = layer([](const Expert& e) -> const Linear& { return *e.c_proj; },
                    activation_ == Activation::Gelu ? gelu(h) : unfused_activation(activation_, h));
  } else if (grouped_experts()) {
    // The experts' two layers as two grouped products over the rows as
    // they are: no split of the rows, no concat of the outputs.
    std::vector<Tensor> fc, proj;
    for (const Expert& e : experts_) {
      fc.push_back(e.c_fc->weight());
      proj.push_back(e.c_proj->weight());
    }
    outputs = grouped_linear(unfused_activation(activation_, grouped_linear(rows, fc, per_expert)),
                             proj, per_expert);
  } else {
    // (Split as one op: the rows' gradient is the experts' side by side.)
    std::vector<Tensor> parts = split(rows, per_expert, 0);
    int64_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = per_expert[static_cast<size_t>(e)];
      Tensor& part = parts[static_cast<size_t>(e)];
      part = expert_forward(experts_[static_cast<size_t>(e)], part,
                            draw(keys.defined() ? narrow(keys, 0, at, n) : Tensor{}));
      at += n;
    }
    outputs = concat(parts, 0);
  }
  if (across) {
    // Every rank's shares side by side: each expert's slots in order.
    const int64_t share = per_expert.front();
    outputs = reshape(chunks_.gather_rows(reshape(outputs, {E, share, C})), {E * share * P, C});
  }
  const Tensor weighted = mul(outputs, gates);
  Tensor combined = index_add_rows(weighted, tokens, N_all);  // (N_all, C)
  if (across) combined = reshape(own_rows(reshape(combined, {Sx, Tx * P, C})), {N, C});
  if (shared_) {
    Tensor y = shared_out;
    if (shared_gate_) {
      if (!scores.shared_gate.defined() || scores.shared_gate.shape() != Shape{N, 1}) {
        throw ShapeError("MoeMlp: the shared expert's gate " +
                         shape_str(scores.shared_gate.shape()) + " for " + std::to_string(N) +
                         " tokens (expected (" + std::to_string(N) + ", 1))");
      }
      const Tensor g = gate ? gate(scores.shared_gate) : scores.shared_gate;
      y = mul(y, cast(g, x.dtype()));
    }
    combined = add(combined, y);
  }
  Tensor out = reshape(combined, x.shape());
  // Under context parallelism the whole micro-batch's counts and summed
  // probabilities of each expert, per sequence (over every rank's chunk of
  // it) or for all of them: S x E of each, summed over the ranks once.
  std::vector<double> whole;
  if (P > 1 && !across && !device_dropless && (balancing || reporting)) {
    whole.assign(static_cast<size_t>(2 * S * E), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t s = n / T_local;
      for (int64_t j = 0; j < k; ++j)
        whole[static_cast<size_t>(s * E + routing.choice[static_cast<size_t>(n * k + j)])] += 1.0;
    }
    std::copy(p_sums.begin(), p_sums.end(), whole.begin() + S * E);
    chunks_.sum(whole);
  }
  if (balancing) {
    // The load-balancing loss, differentiable through P (the mean
    // probabilities); f, the assignment shares, are counts. Over the whole
    // micro-batch, or each of its S sequences of T tokens apart (the mean
    // of theirs). Under context parallelism f counts every chunk and P is
    // this rank's tokens' (Chunks).
    const int64_t T = T_local;
    const bool counted = padded || device_dropless;
    std::vector<double> share(static_cast<size_t>(counted ? 0 : S * E), 0.0);
    if (counted) {
      // (The counts where they were made: a capture's replays count their own.)
    } else if (P > 1) {
      for (int64_t i = 0; i < S * E; ++i)
        share[static_cast<size_t>(i)] =
            whole[static_cast<size_t>(i)] / static_cast<double>(T * P * k);
    } else {
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j < k; ++j) {
          share[static_cast<size_t>((n / T) * E +
                                    routing.choice[static_cast<size_t>(n * k + j)])] +=
              1.0 / static_cast<double>(T * k);
        }
      }
    }
    // (Counted where the routing ran: the whole micro-batch's, over every
    // rank of a context group.)
    const Tensor f = counted
                         ? scale(cast(counts, probs.dtype()), 1.0 / static_cast<double>(T * P * k))
                         : from_vector(share, {S, E}, probs.dtype(), probs.device());
    const Tensor p = balanced_probs();
    const Tensor aux = scale(sum(mul(f, mean(reshape(p, {S, T, E}), 1))),
                             static_cast<double>(E) / static_cast<double>(S));
    out = attach_side_loss(out, aux, aux_coef_, ctx);
  }
  double z_loss = 0;
  if (z.defined()) {
    if (!recorded) z_loss = read.back().at(0);
    if (z.requires_grad()) out = attach_side_loss(out, z, z_coef_, ctx);
  }
  if (reporting && !recorded) {
    // The busiest expert's assignments: under context parallelism the whole
    // micro-batch's (every chunk's counts, summed over the sequences).
    int64_t busiest = *std::max_element(routing.load.begin(), routing.load.end());
    if (P > 1) {
      busiest = 0;
      for (int64_t e = 0; e < E; ++e) {
        double load = 0;
        for (int64_t s = 0; s < S; ++s) load += whole[static_cast<size_t>(s * E + e)];
        busiest = std::max(busiest, static_cast<int64_t>(std::llround(load)));
      }
    }
    double balance = 0;
    if (P > 1) {
      // The whole micro-batch's: E/S sum_s sum_e f_se P_se.
      const double T = static_cast<double>(T_local * P);
      for (int64_t i = 0; i < S * E; ++i) {
        balance += whole[static_cast<size_t>(i)] / (T * static_cast<double>(k)) *
                   whole[static_cast<size_t>(S * E + i)] / T;
      }
      balance *= static_cast<double>(E) / static_cast<double>(S);
    } else {
      balance = balance_loss_of_sums(routing, p_sums, sequence);
    }
    ctx.moe_stats->add_loads(layer_, routing.load);
    ctx.moe_stats->record(
        balance,
        static_cast<double>(busiest * E) / static_cast<double>(std::max<int64_t>(N * P * k, 1)),
        static_cast<double>(routing.dropped) / static_cast<double>(N * k), z_loss);
  }
  return out;
}

}  // namespace triad::nn
