// A mixture of experts' top-k choice as a backend op (Backend::route_top_k,
// src/backend/expert_choice.h): the CPU's equals nn::route_top_k's choice,
// with each choice's own score beside it, route_chosen builds the same
// routing from them (under a capacity too), a token with a score that is
// not finite chooses -1, and bad arguments are refused naming the value.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "src/backend/expert_choice.h"
#include "triad/backend/backend.h"
#include "triad/core/error.h"
#include "triad/nn/moe.h"
#include "triad/ops/creation.h"

namespace triad {
namespace {

// Scores with many equal values (multiples of 1/8), where the order of
// equal ones decides.
std::vector<double> tied_scores(int64_t N, int64_t E, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(N * E));
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (double& s : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s = static_cast<double>(x % 8) / 8.0;
  }
  return v;
}

struct ChoiceCase {
  int64_t N, E, k, groups, top_groups, group_best;
  bool biased;
};

// The CPU backend's choice; `chosen`, when not null, receives each
// choice's score beside it.
std::vector<int64_t> cpu_choice(const std::vector<double>& scores, const std::vector<double>& bias,
                                const ChoiceCase& c, DType dtype,
                                std::vector<double>* chosen = nullptr) {
  const Tensor s = from_vector(scores, {c.N, c.E}, dtype);
  const Tensor b = bias.empty() ? Tensor() : from_vector(bias, {c.E}, DType::F32);
  Tensor choice = empty({c.N, c.k}, DType::I64);
  Tensor values = empty({c.N, c.k}, dtype);
  backend_for(DeviceType::CPU)
      .route_top_k(s, b, c.groups, c.top_groups, c.group_best, choice, chosen ? &values : nullptr);
  if (chosen) *chosen = to_double_vector(values);
  return std::vector<int64_t>(choice.data<int64_t>(), choice.data<int64_t>() + c.N * c.k);
}

TEST(ExpertChoice, TheBackendsChoiceIsRouteTopKs) {
  const ChoiceCase cases[] = {{37, 8, 2, 1, 1, 2, false},  {50, 16, 4, 4, 2, 2, true},
                              {20, 12, 3, 3, 1, 1, true},  {9, 6, 6, 1, 1, 2, true},
                              {64, 32, 8, 8, 4, 2, false}, {5, 4, 1, 2, 1, 3, false}};
  for (const ChoiceCase& c : cases) {
    for (DType dtype : {DType::F32, DType::F64}) {
      SCOPED_TRACE("E " + std::to_string(c.E) + " k " + std::to_string(c.k) + " groups " +
                   std::to_string(c.groups) + " " + dtype_name(dtype));
      const std::vector<double> scores = tied_scores(c.N, c.E, static_cast<uint64_t>(c.E + c.k));
      std::vector<double> bias;
      // (Biases that f32 holds exactly, so both sides add the same values.)
      for (int64_t e = 0; c.biased && e < c.E; ++e) bias.push_back(static_cast<double>(e % 3) / 16);
      const nn::ExpertChoice rule{bias, c.groups, c.top_groups, c.group_best};
      const nn::Routing want =
          nn::route_top_k(scores, c.N, c.E, c.k, 0, nn::GptConfig::Moe::DropPolicy::Probs, rule);
      std::vector<double> chosen;
      EXPECT_EQ(cpu_choice(scores, bias, c, dtype, &chosen), want.choice);
      // Each choice's own score (without its bias), exactly.
      ASSERT_EQ(chosen.size(), want.choice.size());
      for (size_t a = 0; a < chosen.size(); ++a) {
        EXPECT_EQ(chosen[a], scores[(a / static_cast<size_t>(c.k)) * static_cast<size_t>(c.E) +
                                    static_cast<size_t>(want.choice[a])])
            << a;
      }
      // route_chosen builds the same routing from those choices, and under
      // a capacity (ranked by those scores, full of ties, or by token) the
      // same as route_top_k's.
      const nn::Routing built = nn::route_chosen(want.choice, c.N, c.E, c.k);
      EXPECT_EQ(built.token, want.token);
      EXPECT_EQ(built.assignment, want.assignment);
      EXPECT_EQ(built.rows, want.rows);
      EXPECT_EQ(built.load, want.load);
      const int64_t capacity = nn::expert_capacity(0.6, c.N, c.E, c.k);
      for (auto policy :
           {nn::GptConfig::Moe::DropPolicy::Probs, nn::GptConfig::Moe::DropPolicy::Position}) {
        const nn::Routing capped = nn::route_top_k(scores, c.N, c.E, c.k, capacity, policy, rule);
        const nn::Routing from_chosen =
            nn::route_chosen(want.choice, c.N, c.E, c.k, capacity, policy, chosen);
        EXPECT_EQ(from_chosen.token, capped.token);
        EXPECT_EQ(from_chosen.assignment, capped.assignment);
        EXPECT_EQ(from_chosen.rows, capped.rows);
        EXPECT_EQ(from_chosen.dropped, capped.dropped);
        if (c.N * c.k > capacity * c.E) {
          EXPECT_GT(capped.dropped, 0);
        }
      }
    }
  }
}

// Under a capacity that keeps the most probable, route_chosen needs each
// choice's score; it refuses a capacity below 0 too.
TEST(ExpertChoice, RouteChosenUnderACapacityNeedsTheChosenScores) {
  const std::vector<int64_t> choice{0, 1, 1, 0, 0, 1};
  auto refusal = [&](int64_t capacity, const std::vector<double>& chosen) {
    try {
      (void)nn::route_chosen(choice, 3, 2, 2, capacity, nn::GptConfig::Moe::DropPolicy::Probs,
                             chosen);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(refusal(2, {}).find("0 chosen scores for 6 choices"), std::string::npos);
  EXPECT_NE(refusal(2, {0.5, 0.5}).find("2 chosen scores for 6 choices"), std::string::npos);
  EXPECT_NE(refusal(-1, {}).find("capacity -1"), std::string::npos);
  // Ranked by token or dropless, the scores are not needed.
  EXPECT_EQ(nn::route_chosen(choice, 3, 2, 2, 2, nn::GptConfig::Moe::DropPolicy::Position).dropped,
            2);
  // Expert 0's assignments 0, 3 and 4 (scores .2, .9, .5): capacity 2 keeps
  // the two most probable, 3 and 4.
  const nn::Routing r = nn::route_chosen(choice, 3, 2, 2, 2, nn::GptConfig::Moe::DropPolicy::Probs,
                                         {0.2, 0.8, 0.8, 0.9, 0.5, 0.5});
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(std::vector<int64_t>(r.assignment.begin(), r.assignment.begin() + r.rows[0]),
            (std::vector<int64_t>{3, 4}));
}

TEST(ExpertChoice, ATokenWithAScoreNotFiniteChoosesNothing) {
  const ChoiceCase c{3, 4, 2, 1, 1, 2, false};
  std::vector<double> scores = tied_scores(3, 4, 5);
  scores[6] = NAN;  // token 1
  const std::vector<int64_t> got = cpu_choice(scores, {}, c, DType::F32);
  EXPECT_EQ(got[2], -1);
  EXPECT_EQ(got[3], -1);
  EXPECT_GE(got[0], 0);
  EXPECT_GE(got[4], 0);
  try {
    (void)nn::route_chosen(got, 3, 4, 2);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 chose expert -1 of 4"), std::string::npos)
        << e.what();
  }
}

TEST(ExpertChoice, RefusesWhatCannotChoose) {
  Backend& be = backend_for(DeviceType::CPU);
  const Tensor scores = from_vector(tied_scores(4, 6, 1), {4, 6}, DType::F32);
  auto refusal = [&](const Tensor& s, const Tensor& b, int64_t groups, int64_t top_groups,
                     int64_t best, Tensor choice) {
    try {
      be.route_top_k(s, b, groups, top_groups, best, choice);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor choice2 = empty({4, 2}, DType::I64);
  EXPECT_NE(refusal(scores, Tensor(), 1, 1, 2, empty({4, 7}, DType::I64)).find("top_k 7 of 6"),
            std::string::npos);
  EXPECT_NE(refusal(scores, Tensor(), 1, 1, 2, empty({3, 2}, DType::I64)).find("choice i64 [3, 2]"),
            std::string::npos);
  EXPECT_NE(refusal(scores, Tensor(), 1, 1, 2, empty({4, 2}, DType::I32)).find("choice i32"),
            std::string::npos);
  EXPECT_NE(
      refusal(from_vector(tied_scores(4, 6, 1), {4, 6}, DType::BF16), Tensor(), 1, 1, 2, choice2)
          .find("scores bf16 [4, 6]"),
      std::string::npos);
  EXPECT_NE(refusal(scores, zeros({5}, DType::F32), 1, 1, 2, choice2).find("bias f32 [5]"),
            std::string::npos);
  EXPECT_NE(refusal(scores, from_vector(std::vector<double>{0, 0, NAN, 0, 0, 0}, {6}, DType::F32),
                    1, 1, 2, choice2)
                .find("expert 2's bias is nan"),
            std::string::npos);
  EXPECT_NE(refusal(scores, Tensor(), 4, 1, 2, choice2).find("groups dividing the experts"),
            std::string::npos);
  EXPECT_NE(refusal(scores, Tensor(), 3, 1, 2, empty({4, 3}, DType::I64)).find("top_k 3 within"),
            std::string::npos);
  EXPECT_NE(refusal(scores, Tensor(), 3, 1, 0, choice2).find("scored by its 0 best"),
            std::string::npos);
  // The chosen scores take the scores' dtype and the choice's shape.
  for (const Tensor& bad : {empty({4, 2}, DType::F64), empty({4, 3}, DType::F32)}) {
    Tensor chosen = bad, choice = choice2;
    try {
      be.route_top_k(scores, Tensor(), 1, 1, 2, choice, &chosen);
      ADD_FAILURE() << "expected an error";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("chosen scores " + std::string(dtype_name(bad.dtype())) +
                                           " " + shape_str(bad.shape())),
                std::string::npos)
          << e.what();
    }
  }
}

// The balance from each sequence's summed probabilities is balance_loss's.
TEST(ExpertChoice, TheBalanceOfSummedProbabilitiesIsTheBalanceLoss) {
  const std::vector<double> p = tied_scores(8, 4, 3);
  const nn::Routing r = nn::route_top_k(p, 8, 4, 2);
  for (int64_t sequence : {int64_t{0}, int64_t{2}, int64_t{4}}) {
    const int64_t T = sequence > 0 ? sequence : 8;
    std::vector<double> sums(static_cast<size_t>((8 / T) * 4), 0.0);
    for (int64_t n = 0; n < 8; ++n)
      for (int64_t e = 0; e < 4; ++e) sums[static_cast<size_t>((n / T) * 4 + e)] += p[n * 4 + e];
    EXPECT_DOUBLE_EQ(nn::balance_loss_of_sums(r, sums, sequence), nn::balance_loss(r, p, sequence));
  }
  EXPECT_THROW((void)nn::balance_loss_of_sums(r, std::vector<double>(3), 0), ValueError);
}

// A dropless mixture's rows formed by the backend (Backend::dropless_rows):
// every assignment a row, grouped by expert in token order, as the host's
// dropless routing groups them (without its padding rows for experts no
// token chose), the offsets each expert's first row, and the tokens that
// could not choose (-1) left past the last group; picked and the counts
// per run of tokens as capacity_slots gives them.
TEST(ExpertChoice, DroplessRowsAreTheHostsDroplessRouting) {
  for (const auto& [N, E, k, group] : std::vector<std::array<int64_t, 4>>{
           {12, 4, 2, 4}, {7, 3, 1, 7}, {30, 8, 3, 10}, {5, 40, 2, 1}}) {
    SCOPED_TRACE(std::to_string(N) + " tokens, " + std::to_string(E) + " experts, top " +
                 std::to_string(k) + ", groups of " + std::to_string(group));
    const ChoiceCase c{N, E, k, 1, 1, 2, false};
    std::vector<int64_t> choice = cpu_choice(tied_scores(N, E, 7 + N), {}, c, DType::F64);
    // Token 1 could not choose (its scores not finite).
    for (int64_t j = 0; j < k; ++j) choice[static_cast<size_t>(k + j)] = -1;
    std::vector<int64_t> valid = choice;
    for (int64_t j = 0; j < k; ++j) valid[static_cast<size_t>(k + j)] = choice[0 + j];
    Tensor token = empty({N * k}, DType::I64), assignment = empty({N * k}, DType::I64),
           offsets = empty({E + 1}, DType::I64), picked = empty({N * k}, DType::I64),
           counts = empty({N / group, E}, DType::I64);
    backend_for(DeviceType::CPU)
        .dropless_rows(from_vector(choice, {N, k}), E, group, token, assignment, offsets, picked,
                       counts);
    const auto v = [](const Tensor& t) {
      return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
    };
    // The host's routing of the tokens that chose, token 1 left out.
    std::vector<int64_t> want_token, want_assignment, want_offsets{0},
        want_counts(static_cast<size_t>(N / group * E));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t a = 0; a < N * k; ++a) {
        if (choice[static_cast<size_t>(a)] != e) continue;
        want_token.push_back(a / k);
        want_assignment.push_back(a);
        ++want_counts[static_cast<size_t>((a / k / group) * E + e)];
      }
      want_offsets.push_back(static_cast<int64_t>(want_token.size()));
    }
    const nn::Routing host = nn::route_chosen(valid, N, E, k);
    int64_t rows = 0;
    for (int64_t e = 0; e < E; ++e) rows += host.load[static_cast<size_t>(e)];
    EXPECT_EQ(rows, N * k);  // (every token chose in `valid`)
    for (int64_t j = 0; j < k; ++j) {
      want_token.push_back(0);
      want_assignment.push_back(N * k);
    }
    EXPECT_EQ(v(token), want_token);
    EXPECT_EQ(v(assignment), want_assignment);
    EXPECT_EQ(v(offsets), want_offsets);
    EXPECT_EQ(v(counts), want_counts);
    std::vector<int64_t> want_picked;
    for (int64_t a = 0; a < N * k; ++a) {
      const int64_t e = choice[static_cast<size_t>(a)];
      want_picked.push_back(e < 0 ? N * E : (a / k) * E + e);
    }
    EXPECT_EQ(v(picked), want_picked);
    // The host's grouping of the same rows: its rows for experts that took
    // any, in the same order.
    std::vector<int64_t> host_rows;
    for (size_t r = 0; r < host.token.size(); ++r) {
      if (host.assignment[r] < N * k && host.assignment[r] / k != 1)
        host_rows.push_back(host.assignment[r]);
    }
    EXPECT_EQ(std::vector<int64_t>(want_assignment.begin(), want_assignment.end() - k), host_rows);
  }
}

TEST(ExpertChoice, DroplessRowsRefuseWhatDoesNotGroup) {
  Tensor choice = zeros({6, 2}, DType::I64), token = empty({12}, DType::I64),
         assignment = empty({12}, DType::I64), offsets = empty({4}, DType::I64),
         picked = empty({12}, DType::I64), counts = empty({2, 3}, DType::I64);
  Backend& cpu = backend_for(DeviceType::CPU);
  EXPECT_THROW(
      {
        try {
          cpu.dropless_rows(choice, 3, 4, token, assignment, offsets, picked, counts);
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("6 tokens in groups of 4"), std::string::npos);
          throw;
        }
      },
      ValueError);
  Tensor short_offsets = empty({3}, DType::I64);
  EXPECT_THROW(
      {
        try {
          cpu.dropless_rows(choice, 3, 3, token, assignment, short_offsets, picked, counts);
        } catch (const ShapeError& e) {
          EXPECT_NE(std::string(e.what()).find("dropless_rows: offsets i64 [3]"),
                    std::string::npos);
          throw;
        }
      },
      ShapeError);
}

}  // namespace
}  // namespace triad
