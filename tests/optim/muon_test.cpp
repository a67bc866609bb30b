#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "triad/ops.h"
#include "triad/optim/muon.h"

namespace triad::optim {
namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix to_matrix(const Tensor& t) {
  const auto v = to_double_vector(t);
  Matrix m(static_cast<size_t>(t.size(0)), std::vector<double>(static_cast<size_t>(t.size(1))));
  for (size_t i = 0; i < m.size(); ++i)
    for (size_t j = 0; j < m[i].size(); ++j) m[i][j] = v[i * m[i].size() + j];
  return m;
}

Matrix product(const Matrix& a, const Matrix& b) {
  Matrix c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

Matrix transposed(const Matrix& a) {
  Matrix t(a[0].size(), std::vector<double>(a.size()));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[0].size(); ++j) t[j][i] = a[i][j];
  return t;
}

// The Newton-Schulz iteration written out in double, loop by loop.
Matrix newton_schulz(Matrix x, int steps) {
  const bool tall = x.size() > x[0].size();
  if (tall) x = transposed(x);
  double norm = 0;
  for (const auto& row : x)
    for (double v : row) norm += v * v;
  norm = std::sqrt(norm);
  for (auto& row : x)
    for (double& v : row) v /= norm + 1e-7;
  for (int s = 0; s < steps; ++s) {
    const Matrix a = product(x, transposed(x));
    const Matrix aa = product(a, a);
    Matrix poly = a;
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t j = 0; j < a.size(); ++j) poly[i][j] = -4.7750 * a[i][j] + 2.0315 * aa[i][j];
    const Matrix px = product(poly, x);
    for (size_t i = 0; i < x.size(); ++i)
      for (size_t j = 0; j < x[0].size(); ++j) x[i][j] = 3.4445 * x[i][j] + px[i][j];
  }
  return tall ? transposed(x) : x;
}

void expect_matrix_near(const Tensor& got, const Matrix& want, double tol) {
  const Matrix g = to_matrix(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i)
    for (size_t j = 0; j < g[i].size(); ++j)
      EXPECT_NEAR(g[i][j], want[i][j], tol) << "(" << i << ", " << j << ")";
}

TEST(Muon, OrthogonalizeIsTheNewtonSchulzIterationOnTheWideSide) {
  for (const Shape& shape : {Shape{4, 9}, Shape{9, 4}, Shape{5, 5}}) {
    SCOPED_TRACE(shape_str(shape));
    const Tensor g = randn(shape, 11, 3, 1.0, DType::F64);
    const Tensor o = orthogonalize(g, 5);
    EXPECT_EQ(o.shape(), shape);
    expect_matrix_near(o, newton_schulz(to_matrix(g), 5), 1e-12);
    // Its singular values near 1: O O^T (wide side) within Newton-Schulz's
    // band on the diagonal, and the rows nearly orthogonal.
    Matrix m = to_matrix(o);
    if (m.size() > m[0].size()) m = transposed(m);
    const Matrix gram = product(m, transposed(m));
    for (size_t i = 0; i < gram.size(); ++i) {
      EXPECT_GT(gram[i][i], 0.4);
      EXPECT_LT(gram[i][i], 1.5);
    }
  }
  // f32 in f32, bf16 taken in f32.
  const Tensor g = randn({6, 3}, 12, 1, 1.0, DType::F32);
  EXPECT_EQ(orthogonalize(g).dtype(), DType::F32);
  expect_matrix_near(orthogonalize(g), newton_schulz(to_matrix(g), 5), 1e-5);
  EXPECT_EQ(orthogonalize(cast(g, DType::BF16)).dtype(), DType::F32);
  EXPECT_THROW(orthogonalize(zeros({4})), ShapeError);
  // In bf16 GEMMs: an f32 result near the f32 iteration's (bf16's 8 bits,
  // and Newton-Schulz forgiving of them), and not the same.
  const Tensor wide = randn({16, 48}, 13, 1, 1.0, DType::F32);
  const Tensor b = orthogonalize(wide, 5, DType::BF16);
  EXPECT_EQ(b.dtype(), DType::F32);
  const auto x = to_double_vector(b), y = to_double_vector(orthogonalize(wide));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  EXPECT_GT(worst, 0.0);
  EXPECT_LT(worst, 0.05);
  EXPECT_THROW(orthogonalize(wide, 5, DType::F16), ValueError);
}

TEST(Muon, UpdateScales) {
  EXPECT_DOUBLE_EQ(muon_update_scale(64, 16, MuonScale::AdamWRms), 0.2 * 8);
  EXPECT_DOUBLE_EQ(muon_update_scale(16, 64, MuonScale::AdamWRms), 0.2 * 8);
  EXPECT_DOUBLE_EQ(muon_update_scale(64, 16, MuonScale::Spectral), 2.0);
  EXPECT_DOUBLE_EQ(muon_update_scale(16, 64, MuonScale::Spectral), 1.0);
  EXPECT_EQ(muon_scale_from_string("spectral"), MuonScale::Spectral);
  EXPECT_STREQ(to_string(MuonScale::AdamWRms), "adamw_rms");
  EXPECT_THROW(muon_scale_from_string("adam"), ValueError);
}

// Two steps of Nesterov momentum, row blocks orthogonalised apart (a fused
// weight's [q | k | v]), decoupled decay and a clipping coefficient, against
// the update written out in double.
TEST(Muon, TwoStepsMatchTheUpdateWrittenOut) {
  const Tensor start = randn({7, 4}, 21, 0, 1.0, DType::F64);
  Tensor w = clone(start).detach();
  w.set_requires_grad(true);
  MuonOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.2;
  MuonMatrix m;
  m.name = "h.0.attn.c_attn.weight";
  m.row_blocks = {3, 2, 2};
  Muon opt({{m, w}}, o);
  const double lr = 0.05, coef = 0.5;
  Matrix p = to_matrix(start), buf(7, std::vector<double>(4, 0.0));
  for (int step = 0; step < 2; ++step) {
    const Tensor grad = randn({7, 4}, 22, static_cast<uint64_t>(step), 1.0, DType::F64);
    w.set_grad(grad);
    opt.step(lr, coef);
    const Matrix g = to_matrix(grad);
    Matrix u = g;
    for (size_t i = 0; i < 7; ++i) {
      for (size_t j = 0; j < 4; ++j) {
        buf[i][j] = o.momentum * buf[i][j] + coef * g[i][j];
        u[i][j] = coef * g[i][j] + o.momentum * buf[i][j];
      }
    }
    size_t at = 0;
    for (int64_t rows : m.row_blocks) {
      const Matrix block(u.begin() + static_cast<long>(at),
                         u.begin() + static_cast<long>(at) + rows);
      const Matrix ob = newton_schulz(block, 5);
      const double s = 0.2 * std::sqrt(std::max<double>(static_cast<double>(rows), 4.0));
      for (size_t i = 0; i < ob.size(); ++i)
        for (size_t j = 0; j < 4; ++j)
          p[at + i][j] = p[at + i][j] * (1 - lr * o.weight_decay) - lr * s * ob[i][j];
      at += static_cast<size_t>(rows);
    }
  }
  expect_matrix_near(w, p, 1e-12);
  EXPECT_EQ(opt.step_count(), 2);
  // The gradient is left as it was.
  EXPECT_EQ(to_double_vector(w.grad()), to_double_vector(randn({7, 4}, 22, 1, 1.0, DType::F64)));
}

// An updater sees every stepping matrix once, in order, with its u, and
// its update is applied as Muon's own would be: here one that gives the
// update Muon computes for the whole matrix.
TEST(Muon, AnUpdaterTakesTheMatricesInOrder) {
  const Tensor start = randn({6, 4}, 31, 0, 1.0, DType::F64);
  const Tensor grad = randn({6, 4}, 32, 0, 1.0, DType::F64);
  Tensor a = clone(start).detach(), b = clone(start).detach(), idle = zeros({3, 3}, DType::F64);
  for (Tensor* t : {&a, &b, &idle}) t->set_requires_grad(true);
  MuonOptions o;
  MuonMatrix ma{"a", {2, 4}}, mb{"b", {}}, mi{"idle", {}};
  Muon plain({{ma, a}}, o);
  std::vector<std::string> seen;
  Muon custom({{mi, idle}, {mb, b}}, o,
              [&](const std::vector<std::string>& names, const std::function<Tensor(size_t)>& u,
                  const std::function<void(size_t, const Tensor&)>& apply) {
                seen = names;
                for (size_t i = 0; i < names.size(); ++i)
                  apply(i, muon_update(u(i), {2, 4}, o, names[i]));
              });
  a.set_grad(grad);
  b.set_grad(grad);  // (idle has none: skipped)
  plain.step(0.1);
  custom.step(0.1);
  EXPECT_EQ(seen, std::vector<std::string>{"b"});
  EXPECT_EQ(to_double_vector(b), to_double_vector(a));
  EXPECT_EQ(to_double_vector(custom.state()[1].momentum), to_double_vector(grad));
}

// bf16 parameters step through f32 masters and f32 momentum: the master
// follows an f32 parameter's trajectory exactly.
TEST(Muon, HalfParametersStepThroughF32Masters) {
  Tensor w16 = cast(randn({5, 8}, 41, 0), DType::BF16).detach();
  Tensor w32 = cast(w16, DType::F32).detach();
  w16.set_requires_grad(true);
  w32.set_requires_grad(true);
  MuonMatrix m;
  m.name = "w";
  Muon mixed({{m, w16}}, {}), full({{m, w32}}, {});
  ASSERT_TRUE(mixed.state()[0].master.defined());
  EXPECT_EQ(mixed.state()[0].momentum.dtype(), DType::F32);
  for (int step = 0; step < 3; ++step) {
    const Tensor g = randn({5, 8}, 42, static_cast<uint64_t>(step));
    w16.set_grad(g);
    w32.set_grad(g);
    mixed.step(0.02);
    full.step(0.02);
  }
  EXPECT_EQ(to_double_vector(mixed.state()[0].master), to_double_vector(w32));
  EXPECT_EQ(to_double_vector(w16), to_double_vector(cast(w32, DType::BF16)));
}

// train.moment_precision bf16: the momentum is f32 Muon's as stored, then
// stored rounded to bf16; the update uses it as computed. Nesterov's and
// the plain momentum alike.
TEST(Muon, ABf16MomentumIsTheF32OneRoundedAfterEachStep) {
  for (const bool nesterov : {true, false}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "plain");
    Tensor a = randn({6, 4}, 51, 0).detach(), b = clone(a).detach();
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    MuonMatrix m;
    m.name = "w";
    MuonOptions o;
    o.nesterov = nesterov;
    MuonOptions bf = o;
    bf.moment_dtype = DType::BF16;
    Muon rounded({{m, a}}, bf), reference({{m, b}}, o);
    EXPECT_EQ(rounded.state()[0].momentum.dtype(), DType::BF16);
    for (int step = 0; step < 3; ++step) {
      const Tensor g = randn({6, 4}, 52, static_cast<uint64_t>(step));
      a.set_grad(g);
      b.set_grad(g);
      rounded.step(0.02, 0.5);
      reference.step(0.02, 0.5);
      Tensor& r = reference.state()[0].momentum;
      copy_(r, cast(cast(r, DType::BF16), DType::F32));
      EXPECT_EQ(to_double_vector(rounded.state()[0].momentum), to_double_vector(r)) << step;
      EXPECT_EQ(to_double_vector(a), to_double_vector(b)) << step;
    }
  }
  // A bf16 momentum needs f32 parameters (or half ones with masters).
  Tensor d = zeros({2, 2}, DType::F64);
  MuonMatrix m;
  m.name = "d";
  MuonOptions bf;
  bf.moment_dtype = DType::BF16;
  EXPECT_THROW(Muon({{m, d}}, bf), ValueError);
  bf.moment_dtype = DType::F16;
  EXPECT_THROW(Muon({{m, zeros({2, 2})}}, bf), ValueError);
}

// Two matrices (an attention projection and an MLP's) from the same start,
// after three Muon steps at `lr` under `o`, with the same gradients.
// (`before(muon, step)`, when given, runs before each step.)
std::vector<std::vector<double>> two_matrices_stepped(
    const MuonOptions& o, double lr, const std::function<void(Muon&, int)>& before = {}) {
  std::vector<std::pair<MuonMatrix, Tensor>> matrices;
  for (const char* name : {"h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight"}) {
    Tensor p = randn({6, 4}, 91, 0).detach();
    p.set_requires_grad(true);
    MuonMatrix m;
    m.name = name;
    matrices.push_back({m, p});
  }
  Muon muon(matrices, o);
  for (int step = 0; step < 3; ++step) {
    if (before) before(muon, step);
    for (auto& [m, p] : matrices) p.set_grad(randn({6, 4}, 92, static_cast<uint64_t>(step)));
    muon.step(lr);
  }
  return {to_double_vector(matrices[0].second), to_double_vector(matrices[1].second)};
}

// train.no_weight_decay: a matrix named in no_decay takes Muon's update
// without the decay, bit for bit as under weight_decay 0.
TEST(Muon, NoDecayNamesStepAsWithoutWeightDecay) {
  auto run = [](double weight_decay, const std::set<std::string>& no_decay) {
    MuonOptions o;
    o.weight_decay = weight_decay;
    o.no_decay = no_decay;
    return two_matrices_stepped(o, 0.02);
  };
  const auto some = run(0.5, {"h.0.attn.c_attn.weight"});
  const auto all = run(0.5, {}), none = run(0.0, {});
  EXPECT_EQ(some[0], none[0]);
  EXPECT_EQ(some[1], all[1]);
  EXPECT_NE(some[0], all[0]);
}

// train.weight_decay_schedule: set_weight_decay before the first step steps
// exactly as the decay given at construction does (no_decay's matrix still
// undecayed), and it changes the steps after it.
TEST(Muon, SetWeightDecayStepsAsTheDecayGivenAtConstruction) {
  auto run = [](double constructed, double set, int change_at) {
    MuonOptions o;
    o.weight_decay = constructed;
    o.no_decay = {"h.0.attn.c_attn.weight"};
    return two_matrices_stepped(o, 0.02, [&](Muon& muon, int step) {
      if (step == change_at) muon.set_weight_decay(set);
    });
  };
  const auto set = run(0.1, 0.4, 0), given = run(0.4, 0.4, -1);
  EXPECT_EQ(set, given);
  const auto later = run(0.1, 0.4, 2), never = run(0.1, 0.1, -1);
  EXPECT_EQ(later[0], never[0]);  // (no_decay's)
  EXPECT_NE(later[1], never[1]);
  EXPECT_NE(later[1], given[1]);
}

// train.lr_scale on Muon's matrices: a factor steps a matrix as lr times it
// would, bit for bit (its weight decay too).
TEST(Muon, LrScaleNamesStepAtTheirFactorTimesLr) {
  auto run = [](double lr, const std::map<std::string, double>& lr_scale) {
    MuonOptions o;
    o.weight_decay = 0.2;
    o.lr_scale = lr_scale;
    return two_matrices_stepped(o, lr);
  };
  const auto scaled = run(0.02, {{"h.0.mlp.c_fc.weight", 2.0}});
  const auto plain = run(0.02, {}), twice = run(0.04, {});
  EXPECT_EQ(scaled[0], plain[0]);
  EXPECT_EQ(scaled[1], twice[1]);
  EXPECT_NE(scaled[1], plain[1]);
}

TEST(Muon, RejectsBadOptionsAndShapes) {
  Tensor w = zeros({2, 2});
  w.set_requires_grad(true);
  MuonMatrix m;
  m.name = "w";
  MuonOptions o;
  o.momentum = 1.0;
  EXPECT_THROW(Muon({{m, w}}, o), ValueError);
  o = {};
  o.ns_steps = 0;
  EXPECT_THROW(Muon({{m, w}}, o), ValueError);
  Tensor b = zeros({3});
  m.name = "b";
  try {
    Muon({{m, b}}, {});
    FAIL() << "a vector was taken";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  // Row blocks that do not add up to the matrix's rows.
  m.name = "w";
  m.row_blocks = {1, 2};
  Muon bad({{m, w}}, {});
  w.set_grad(ones({2, 2}));
  EXPECT_THROW(bad.step(0.1), ShapeError);
}

}  // namespace
}  // namespace triad::optim
