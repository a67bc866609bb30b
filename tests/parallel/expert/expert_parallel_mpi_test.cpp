// Expert parallelism against one process holding every expert: each rank
// routes its own tokens, the experts are shared out among the ranks (CTest
// runs 2 and 4), and every output, input gradient and router gradient is
// one process's on that rank's tokens, every expert's gradient the sum of
// one process's over all the ranks' tokens. f64 on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "support/mpi_main.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/nn/moe.h"
#include "triad/ops.h"
#include "triad/parallel/expert/dispatch.h"

namespace triad::ep {
namespace {

dist::ProcessGroupPtr g_world;

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << "[" << i << "]";
}

// Rank a sends rank b (a + b) % 3 + 1 rows, each naming its sender, row and
// receiver; backward each row's gradient goes back to its sender.
TEST(AllToAllRows, SendsRowsAndTheirGradientsBack) {
  const int P = g_world->size(), me = g_world->rank();
  auto rows = [](int from, int to) { return static_cast<int64_t>((from + to) % 3 + 1); };
  std::vector<int64_t> send(P), recv(P);
  std::vector<double> data;
  for (int to = 0; to < P; ++to) {
    send[to] = rows(me, to);
    recv[to] = rows(to, me);
    for (int64_t k = 0; k < send[to]; ++k)
      data.insert(data.end(), {double(me), double(k), double(to)});
  }
  int64_t sent = 0, received = 0;
  for (int r = 0; r < P; ++r) sent += send[r], received += recv[r];
  Tensor x = from_vector(data, {sent, 3}, DType::F64);
  x.set_requires_grad(true);
  const Tensor y = all_to_all_rows(x, send, recv, g_world);
  ASSERT_EQ(y.shape(), (Shape{received, 3}));
  const std::vector<double> got = to_double_vector(y);
  int64_t at = 0;
  for (int from = 0; from < P; ++from) {
    for (int64_t k = 0; k < recv[from]; ++k, ++at) {
      ASSERT_EQ(got[3 * at], from);
      ASSERT_EQ(got[3 * at + 1], k);
      ASSERT_EQ(got[3 * at + 2], me);
    }
  }
  // d(sum(y * y * receiver)) / dx = 2 x * receiver, on every row of x.
  autograd::backward({y}, {mul(y, scale(ones(y.shape(), DType::F64), 2.0 * (me + 1)))});
  const std::vector<double> g = to_double_vector(x.grad());
  at = 0;
  for (int to = 0; to < P; ++to) {
    for (int64_t k = 0; k < send[to]; ++k, ++at) {
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(g[3 * at + c], data[3 * at + c] * 2.0 * (to + 1)) << "row " << at;
    }
  }
}

nn::GptConfig moe_config(int64_t experts, int64_t top_k) {
  nn::GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 8;
  c.vocab_size = 16;
  c.seq_len = 8;
  c.activation = nn::Activation::SwiGlu;
  c.moe.experts = experts;
  c.moe.top_k = top_k;
  c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coef = 0.1;
  return c;
}

// Each rank's tokens through a mixture whose experts the ranks share, and
// through one process's whole mixture of the same weights.
// With LoRA's adapters on the experts dropping their input out, each row
// draws its assignment's mask wherever it runs: each rank's micro-batch (its
// own call) gives one process's outputs and gradients.
TEST(ExpertParallel, MatchesOneProcessHoldingEveryExpert) {
  const int P = g_world->size(), me = g_world->rank();
  for (const bool adapters : {false, true})
    for (const int64_t per_rank : {1, 2}) {
      nn::GptConfig cfg = moe_config(per_rank * P, std::min<int64_t>(2, per_rank * P));
      if (adapters) {
        cfg.lora.rank = 2;
        cfg.lora.targets = {"mlp.c_fc", "mlp.c_proj"};
        cfg.lora.dropout = 0.5;
      }
      SCOPED_TRACE(std::to_string(cfg.moe.experts) + " experts" +
                   (adapters ? " with adapters" : ""));
      nn::MoeMlp whole(cfg, 0);
      whole.to(DType::F64);
      {
        autograd::NoGradGuard ng;
        uint64_t stream = 1;
        for (auto& [name, p] : whole.named_parameters()) {
          Tensor r = randn(p.shape(), 17, stream++, 0.5, DType::F64);
          copy_(p, r);
        }
      }
      auto placement = std::make_shared<ExpertParallel>(cfg.moe.experts, g_world);
      EXPECT_EQ(placement->count(), per_rank);
      EXPECT_EQ(placement->first(), me * per_rank);
      nn::MoeMlp shared(cfg, 0, 1, placement);
      shared.to(DType::F64);
      nn::StateDict mine;
      const nn::StateDict all = whole.state_dict();
      for (const auto& [name, p] : shared.named_parameters()) mine.emplace(name, all.at(name));
      EXPECT_EQ(mine.size(), 1 + (adapters ? 6 : 2) * static_cast<size_t>(per_rank));
      shared.load_state_dict(mine);
      // Rank r's tokens: 5 + r of them (the ranks route different numbers).
      auto tokens = [&](int r) {
        return randn({1, 5 + r, cfg.d_model}, 23, 10 + r, 1.0, DType::F64);
      };
      auto upstream = [&](int r) {
        return randn({1, 5 + r, cfg.d_model}, 23, 50 + r, 1.0, DType::F64);
      };
      Tensor x = tokens(me);
      x.set_requires_grad(true);
      auto context = [](int r) {
        nn::ForwardContext ctx{true, 3, static_cast<uint64_t>(r)};  // rank r's micro-batch
        ctx.loss_grad = 0.5;
        return ctx;
      };
      const Tensor y = shared.forward(x, context(me));
      autograd::backward({y}, {upstream(me)});
      // One process: this rank's tokens first (the router's gradient is
      // theirs alone), then every other rank's, the experts' gradients summed.
      std::vector<double> want_y, want_dx;
      Tensor router = whole.state_dict().at("router.weight");
      for (int k = 0; k < P; ++k) {
        const int r = (me + k) % P;
        Tensor xr = tokens(r);
        xr.set_requires_grad(true);
        const Tensor yr = whole.forward(xr, context(r));
        autograd::backward({yr}, {upstream(r)});
        if (r != me) continue;
        want_y = to_double_vector(yr);
        want_dx = to_double_vector(xr.grad());
        expect_close(to_double_vector(shared.state_dict().at("router.weight").grad()),
                     to_double_vector(router.grad()), 1e-10, "router.weight");
      }
      expect_close(to_double_vector(y), want_y, 1e-10, "outputs");
      expect_close(to_double_vector(x.grad()), want_dx, 1e-10, "input gradient");
      for (const auto& [name, p] : shared.named_parameters()) {
        if (name == "router.weight") continue;
        expect_close(to_double_vector(p.grad()), to_double_vector(all.at(name).grad()), 1e-10,
                     name);
      }
    }
}

TEST(ExpertParallel, RefusesExpertsTheGroupCannotShare) {
  if (g_world->size() == 1) GTEST_SKIP() << "one rank holds any number";
  try {
    ExpertParallel bad(g_world->size() + 1, g_world);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must be divisible by parallel.ep"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::ep

int main(int argc, char** argv) {
  return triad::testing::run_mpi_tests(
      argc, argv, [](const triad::dist::ProcessGroupPtr& w) { triad::ep::g_world = w; },
      [] { triad::ep::g_world.reset(); });
}
