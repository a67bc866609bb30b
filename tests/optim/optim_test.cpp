#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "support/expect_error.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"
#include "triad/optim/clip.h"
#include "triad/optim/lr_schedule.h"

namespace triad::optim {
namespace {

// AdamW written out in doubles, PyTorch's order of operations: `p` after a
// step for each of `decays` (that step's weight decay), the gradient `g`
// every step.
std::vector<double> adamw_closed_form(std::vector<double> p, const std::vector<double>& g,
                                      const AdamWOptions& o, const std::vector<double>& decays) {
  std::vector<double> m(p.size(), 0), v(p.size(), 0);
  for (size_t k = 0; k < decays.size(); ++k) {
    const double step = static_cast<double>(k + 1);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - o.lr * decays[k];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(o.beta1, step));
      const double vh = v[i] / (1 - std::pow(o.beta2, step));
      p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  return p;
}

// A 2x2 matrix "w" and a vector "b" (f64) stepped by `opt` (made from them)
// once for each of `decays`, set_weight_decay'd to it first unless
// `set_decays` is false, against the closed form: w decays, b never.
void expect_closed_form_steps(const AdamWOptions& o, const std::vector<double>& decays,
                              bool set_decays) {
  Tensor w = from_vector(std::vector<double>{0.5, -1.0, 2.0, 0.25}, {2, 2}, DType::F64);
  Tensor b = from_vector(std::vector<double>{0.3, -0.7}, {2}, DType::F64);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  AdamW opt({{"w", w}, {"b", b}}, o);
  const std::vector<double> gw{0.1, -0.2, 0.3, 0.4}, gb{-0.5, 0.6};
  const auto expect_w = adamw_closed_form(to_double_vector(w), gw, o, decays);
  const auto expect_b =
      adamw_closed_form(to_double_vector(b), gb, o, std::vector<double>(decays.size(), 0.0));
  for (double wd : decays) {
    if (set_decays) opt.set_weight_decay(wd);
    w.set_grad(from_vector(gw, {2, 2}, DType::F64));
    b.set_grad(from_vector(gb, {2}, DType::F64));
    opt.step(o.lr);
  }
  EXPECT_EQ(opt.step_count(), static_cast<int64_t>(decays.size()));
  const auto got_w = to_double_vector(w), got_b = to_double_vector(b);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got_w[i], expect_w[i], 1e-12);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(got_b[i], expect_b[i], 1e-12);
  EXPECT_TRUE(opt.state()[0].decay);
  EXPECT_FALSE(opt.state()[1].decay);
  if (!set_decays) return;
  EXPECT_EQ(opt.options().weight_decay, decays.back());
  testing::expect_error<ValueError>([&] { opt.set_weight_decay(-0.1); },
                                    {"AdamW", "weight_decay", "-0.1", ">= 0"});
  EXPECT_EQ(opt.options().weight_decay, decays.back());  // (unchanged)
}

TEST(AdamW, MatchesTheClosedFormForTwoStepsAndDecaysOnlyMatrices) {
  AdamWOptions o;
  o.lr = 0.1;
  o.beta1 = 0.8;
  o.beta2 = 0.9;
  o.eps = 1e-8;
  o.weight_decay = 0.5;
  expect_closed_form_steps(o, {0.5, 0.5}, false);
}

// train.weight_decay_schedule: set_weight_decay changes the decay of the
// steps after it (0.5, then 0.2, then 0), of the matrices alone.
TEST(AdamW, SetWeightDecayChangesTheNextSteps) {
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  expect_closed_form_steps(o, {0.5, 0.2, 0.0}, true);
}

// train.no_weight_decay: a matrix named in no_decay steps as it would with
// weight_decay 0, bit for bit, while the other matrices decay.
TEST(AdamW, NoDecayNamesStepAsWithoutWeightDecay) {
  auto run = [](double weight_decay, const std::set<std::string>& no_decay) {
    std::vector<std::pair<std::string, Tensor>> params;
    for (const char* name : {"wte.weight", "h.0.mlp.c_fc.weight"}) {
      Tensor p = randn({5, 3}, 81, 0).detach();
      p.set_requires_grad(true);
      params.push_back({name, p});
    }
    AdamWOptions o;
    o.weight_decay = weight_decay;
    o.no_decay = no_decay;
    AdamW opt(params, o);
    for (int step = 0; step < 3; ++step) {
      for (auto& [name, p] : params) p.set_grad(randn({5, 3}, 82, static_cast<uint64_t>(step)));
      opt.step(0.05);
    }
    return std::pair{opt.state()[0].decay, params};
  };
  const auto [decays, some] = run(0.5, {"wte.weight"});
  const auto [all_decay, all] = run(0.5, {});
  const auto [never, none] = run(0.0, {});
  EXPECT_FALSE(decays);
  EXPECT_TRUE(all_decay);
  EXPECT_EQ(to_double_vector(some[0].second), to_double_vector(none[0].second));
  EXPECT_EQ(to_double_vector(some[1].second), to_double_vector(all[1].second));
  EXPECT_NE(to_double_vector(some[0].second), to_double_vector(all[0].second));
}

// train.lr_scale: a parameter with a factor steps as it would at lr times
// it (weight decay included), bit for bit, while the others take lr; a
// factor that is not > 0 is named.
TEST(AdamW, LrScaleNamesStepAtTheirFactorTimesLr) {
  auto run = [](double lr, const std::map<std::string, double>& lr_scale) {
    std::vector<std::pair<std::string, Tensor>> params;
    for (const char* name : {"wte.weight", "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias"}) {
      Tensor p = randn(name[9] == 'b' ? Shape{5} : Shape{5, 3}, 83, 0).detach();
      p.set_requires_grad(true);
      params.push_back({name, p});
    }
    AdamWOptions o;
    o.weight_decay = 0.3;
    o.lr_scale = lr_scale;
    AdamW opt(params, o);
    for (int step = 0; step < 3; ++step) {
      for (auto& [name, p] : params) p.set_grad(randn(p.shape(), 84, static_cast<uint64_t>(step)));
      opt.step(lr);
    }
    std::vector<std::vector<double>> out;
    for (auto& [name, p] : params) out.push_back(to_double_vector(p));
    return out;
  };
  const auto scaled = run(0.05, {{"wte.weight", 3.0}, {"h.0.mlp.c_fc.bias", 0.5}});
  const auto plain = run(0.05, {}), triple = run(0.15, {}), half = run(0.025, {});
  EXPECT_EQ(scaled[0], triple[0]);
  EXPECT_EQ(scaled[1], plain[1]);
  EXPECT_EQ(scaled[2], half[2]);
  EXPECT_NE(scaled[0], plain[0]);
  for (double bad : {0.0, -1.0, std::nan("")}) {
    try {
      Tensor p = zeros({2, 2});
      AdamWOptions o;
      o.lr_scale = {{"w", bad}};
      AdamW opt({{"w", p}}, o);
      FAIL() << bad;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("learning-rate factor of 'w'"), std::string::npos)
          << e.what();
    }
  }
}

// Mixed precision: a bf16 parameter is updated through an f32 master with
// f32 moments; the master follows exactly the trajectory of an f32
// parameter fed the same gradients, and the parameter is the master rounded.
TEST(AdamW, HalfParametersStepThroughF32Masters) {
  Tensor w32 = randn({4, 6}, 3, 1), b32 = randn({6}, 3, 2);
  Tensor w16 = cast(w32, DType::BF16).detach(), b16 = cast(b32, DType::BF16).detach();
  // Start the f32 run from the same (bf16-rounded) values the masters hold.
  w32 = cast(w16, DType::F32).detach();
  b32 = cast(b16, DType::F32).detach();
  for (Tensor* t : {&w32, &b32, &w16, &b16}) t->set_requires_grad(true);
  optim::AdamWOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  optim::AdamW full({{"w", w32}, {"b", b32}}, o), mixed({{"w", w16}, {"b", b16}}, o);
  ASSERT_TRUE(mixed.state()[0].master.defined());
  EXPECT_EQ(mixed.state()[0].m.dtype(), DType::F32);
  EXPECT_FALSE(full.state()[0].master.defined());
  for (int step = 0; step < 3; ++step) {
    Tensor gw = randn({4, 6}, 9, step), gb = randn({6}, 9, 10 + step);
    w32.set_grad(gw);
    b32.set_grad(gb);
    w16.set_grad(gw);  // f32 gradients, as half leaves accumulate them
    b16.set_grad(gb);
    full.step(o.lr);
    mixed.step(o.lr);
  }
  EXPECT_EQ(to_double_vector(mixed.state()[0].master), to_double_vector(w32));
  EXPECT_EQ(to_double_vector(mixed.state()[1].master), to_double_vector(b32));
  EXPECT_EQ(to_double_vector(w16), to_double_vector(cast(w32, DType::BF16)));
  EXPECT_EQ(to_double_vector(b16), to_double_vector(cast(b32, DType::BF16)));
}

// Gradient clipping folds its coefficient into the step: the same bits as
// scaling every gradient first, f32 in place and bf16 through f32 masters,
// and the gradients stay as they were.
// Two equal lists of three parameters of dtype d (a 5 x 7 matrix and two
// vectors of 11, named p0 to p2), for two optimizers to step side by side.
std::pair<std::vector<std::pair<std::string, Tensor>>, std::vector<std::pair<std::string, Tensor>>>
twin_parameters(DType d) {
  std::vector<std::pair<std::string, Tensor>> a, b;
  for (int i = 0; i < 3; ++i) {
    const Shape shape = i == 0 ? Shape{5, 7} : Shape{11};
    Tensor p = randn(shape, 4, static_cast<uint64_t>(i), 1.0, d);
    std::string name = "p";  // (appending avoids GCC 12's -Wrestrict false alarm)
    name += std::to_string(i);
    a.push_back({name, clone(p).detach()});
    b.push_back({name, clone(p).detach()});
  }
  return {a, b};
}

TEST(AdamW, AGradScaleEqualsScalingTheGradientsFirst) {
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    auto [scaled, folded] = twin_parameters(d);
    AdamWOptions o;
    o.weight_decay = 0.1;
    AdamW opt_scaled(scaled, o), opt_folded(folded, o);
    const double coef = 0.3718;
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < scaled.size(); ++i) {
        Tensor g = randn(scaled[i].second.shape(), 5, static_cast<uint64_t>(10 * step + i), 2.0,
                         DType::F32);
        Tensor gs = clone(g).detach();
        scale_(gs, coef);
        scaled[i].second.set_grad(gs);
        folded[i].second.set_grad(g);
      }
      opt_scaled.step(1e-2);
      const std::vector<double> before = to_double_vector(folded[1].second.grad());
      opt_folded.step(1e-2, coef);
      EXPECT_EQ(to_double_vector(folded[1].second.grad()), before);
    }
    for (size_t i = 0; i < scaled.size(); ++i) {
      EXPECT_EQ(to_double_vector(folded[i].second), to_double_vector(scaled[i].second)) << i;
      EXPECT_EQ(to_double_vector(opt_folded.state()[i].v),
                to_double_vector(opt_scaled.state()[i].v))
          << i;
    }
  }
}

// Clipping decided where the gradients are (step_clipped, a loop that never
// waits for the device): the same bits as step() given the coefficient the
// host computes from the global norm, binding (max_norm 0.5) or not
// (1e6), f32 in place and bf16 through masters; a sum that is not finite
// leaves every parameter, master and moment as it was (the step still
// counts); bad arguments are refused naming the value.
TEST(AdamW, StepClippedOnTheDeviceIsStepWithTheHostsCoefficient) {
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    auto [host, device] = twin_parameters(d);
    AdamWOptions o;
    o.weight_decay = 0.1;
    AdamW opt_host(host, o), opt_device(device, o);
    for (int step = 0; step < 3; ++step) {
      const double max_norm = step == 1 ? 1e6 : 0.5;
      std::vector<Tensor> grads;
      for (size_t i = 0; i < host.size(); ++i) {
        Tensor g =
            randn(host[i].second.shape(), 5, static_cast<uint64_t>(10 * step + i), 2.0, DType::F32);
        host[i].second.set_grad(clone(g).detach());
        device[i].second.set_grad(g);
        grads.push_back(g);
      }
      const double norm = global_grad_norm({host[0].second, host[1].second, host[2].second});
      const double coef = clip_coefficient(norm, max_norm);  // the trainer's
      if (step != 1) {
        EXPECT_LT(coef, 0.5);
      }
      opt_host.step(1e-2, coef);
      opt_device.step_clipped(1e-2, sum_of_squares_device(grads), max_norm);
    }
    for (size_t i = 0; i < host.size(); ++i) {
      EXPECT_EQ(to_double_vector(device[i].second), to_double_vector(host[i].second)) << i;
      EXPECT_EQ(to_double_vector(opt_device.state()[i].m), to_double_vector(opt_host.state()[i].m))
          << i;
      EXPECT_EQ(to_double_vector(opt_device.state()[i].v), to_double_vector(opt_host.state()[i].v))
          << i;
    }
    // A NaN gradient: nothing moves, and the step counts.
    std::vector<std::vector<double>> before;
    for (const auto& s : opt_device.state()) {
      before.push_back(to_double_vector(s.param));
      before.push_back(to_double_vector(s.m));
      before.push_back(to_double_vector(s.v));
      if (s.master.defined()) before.push_back(to_double_vector(s.master));
    }
    std::vector<Tensor> grads;
    for (auto& [name, p] : device) {
      Tensor g = randn(p.shape(), 6, 1, 1.0, DType::F32);
      p.set_grad(g);
      grads.push_back(g);
    }
    fill_(grads[1], NAN);
    opt_device.step_clipped(1e-2, sum_of_squares_device(grads), 1.0);
    EXPECT_EQ(opt_device.step_count(), 4);
    size_t at = 0;
    for (const auto& s : opt_device.state()) {
      EXPECT_EQ(to_double_vector(s.param), before[at++]) << s.name;
      EXPECT_EQ(to_double_vector(s.m), before[at++]) << s.name;
      EXPECT_EQ(to_double_vector(s.v), before[at++]) << s.name;
      if (s.master.defined()) {
        EXPECT_EQ(to_double_vector(s.master), before[at++]) << s.name;
      }
    }
    const Tensor sum = sum_of_squares_device(grads);
    testing::expect_error<ValueError>([&] { opt_device.step_clipped(1e-2, sum, 0.0); },
                                      {"max_norm 0.000000 (expected a finite number > 0)"});
    testing::expect_error<ShapeError>(
        [&] { opt_device.step_clipped(1e-2, zeros({2}, DType::F64), 1.0); },
        {"sum of squares f64 [2] on cpu (expected one f64 element on cpu"});
    testing::expect_error<ShapeError>(
        [&] { opt_device.step_clipped(1e-2, zeros({1}, DType::F32), 1.0); },
        {"sum of squares f32 [1]"});
  }
}

// train.moment_precision bf16: each step is f32 AdamW's on the moments as
// stored, which it then stores rounded to bf16; f32 parameters in place,
// and half ones through f32 masters, with clipping's scale folded in.
TEST(AdamW, Bf16MomentsAreF32MomentsRoundedAfterEachStep) {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto params = [&] {
      std::vector<std::pair<std::string, Tensor>> p{{"w", cast(randn({5, 7}, 3, 0, 1.0), dtype)},
                                                    {"b", cast(randn({9}, 3, 1, 1.0), dtype)}};
      for (auto& [name, t] : p) t = t.detach(), t.set_requires_grad(true);
      return p;
    };
    auto narrow = params(), wide = params();
    AdamWOptions o;
    o.weight_decay = 0.1;
    AdamWOptions bf = o;
    bf.moment_dtype = DType::BF16;
    AdamW rounded(narrow, bf), reference(wide, o);
    for (const auto& st : rounded.state()) {
      EXPECT_EQ(st.m.dtype(), DType::BF16);
      EXPECT_EQ(st.v.dtype(), DType::BF16);
      EXPECT_EQ(st.master.defined(), dtype != DType::F32);
    }
    double apart = 0;
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < narrow.size(); ++i) {
        const Tensor g = randn(narrow[i].second.shape(), 5, 10 * step + i, 0.3);
        narrow[i].second.set_grad(dtype == DType::F32 ? clone(g) : cast(g, DType::F32));
        wide[i].second.set_grad(dtype == DType::F32 ? clone(g) : cast(g, DType::F32));
      }
      rounded.step(1e-2, 0.75);
      reference.step(1e-2, 0.75);
      for (size_t i = 0; i < narrow.size(); ++i) {
        auto& r = reference.state()[i];
        // What the reference's step computed, as bf16 stores it.
        copy_(r.m, cast(cast(r.m, DType::BF16), DType::F32));
        copy_(r.v, cast(cast(r.v, DType::BF16), DType::F32));
        EXPECT_EQ(to_double_vector(rounded.state()[i].m), to_double_vector(r.m)) << step;
        EXPECT_EQ(to_double_vector(rounded.state()[i].v), to_double_vector(r.v)) << step;
        EXPECT_EQ(to_double_vector(narrow[i].second), to_double_vector(wide[i].second)) << step;
        if (dtype != DType::F32) {
          EXPECT_EQ(to_double_vector(rounded.state()[i].master), to_double_vector(r.master));
        }
      }
    }
    // Without the rounding the steps would differ: f32 moments part from them.
    auto free = params();
    AdamW unrounded(free, o);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < free.size(); ++i) {
        const Tensor g = randn(free[i].second.shape(), 5, 10 * step + i, 0.3);
        free[i].second.set_grad(dtype == DType::F32 ? clone(g) : cast(g, DType::F32));
      }
      unrounded.step(1e-2, 0.75);
    }
    for (size_t i = 0; i < free.size(); ++i) {
      const auto a = to_double_vector(unrounded.state()[i].m);
      const auto b = to_double_vector(rounded.state()[i].m);
      for (size_t k = 0; k < a.size(); ++k) apart = std::max(apart, std::abs(a[k] - b[k]));
    }
    EXPECT_GT(apart, 0.0);
  }
}

TEST(AdamW, MomentsAreF32OrBf16) {
  Tensor w = zeros({2, 2});
  w.set_requires_grad(true);
  AdamWOptions o;
  o.moment_dtype = DType::F16;
  try {
    AdamW({{"w", w}}, o);
    FAIL() << "f16 moments were accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("moments of dtype f16 are not supported (f32 or bf16)"),
              std::string::npos)
        << e.what();
  }
  // bf16 moments beside f64 parameters: refused by name.
  Tensor d = zeros({2, 2}, DType::F64);
  d.set_requires_grad(true);
  o.moment_dtype = DType::BF16;
  try {
    AdamW({{"d", d}}, o);
    FAIL() << "bf16 moments beside f64 were accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'d' is f64"), std::string::npos) << e.what();
  }
}

TEST(AdamW, RejectsBadHyperParameters) {
  Tensor w = zeros({2, 2});
  w.set_requires_grad(true);
  AdamWOptions o;
  o.beta1 = 1.0;
  EXPECT_THROW(AdamW({{"w", w}}, o), ValueError);
  o = {};
  o.eps = 0;
  EXPECT_THROW(AdamW({{"w", w}}, o), ValueError);
}

TEST(ClipCoefficient, IsPyTorchsMinOfOneAndTheRatio) {
  EXPECT_EQ(clip_coefficient(5.0, 1.0), 1.0 / (5.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);                 // under the bound
  EXPECT_EQ(clip_coefficient(1.0, 1.0), 1.0 / (1.0 + 1e-6));  // 1e-6 under 1
  EXPECT_EQ(clip_coefficient(50.0, 0.0), 1.0);                // 0: no clipping
  EXPECT_EQ(clip_coefficient(50.0, -2.0), 1.0);
  EXPECT_EQ(clip_coefficient(std::nan(""), 1.0), 1.0);  // as the division gives
  EXPECT_EQ(clip_coefficient(INFINITY, 1.0), 0.0);
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
}

TEST(ClipGradNorm, UsesPyTorchsCoefficientAndOnlyShrinks) {
  Tensor a = zeros({2}, DType::F64), b = zeros({1}, DType::F64);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  a.set_grad(from_vector(std::vector<double>{3, 0}, {2}, DType::F64));
  b.set_grad(from_vector(std::vector<double>{4}, {1}, DType::F64));
  EXPECT_NEAR(clip_grad_norm({a, b}, 10.0), 5.0, 1e-12);
  EXPECT_NEAR(to_double_vector(a.grad())[0], 3.0, 1e-12);  // coef > 1: untouched
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-12);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(to_double_vector(a.grad())[0], 3.0 * coef, 1e-12);
  EXPECT_NEAR(to_double_vector(b.grad())[0], 4.0 * coef, 1e-12);
  EXPECT_NEAR(global_grad_norm({a, b}), 5.0 * coef, 1e-12);
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), 5.0 * coef, 1e-12);  // 0 = report only
}

LrSchedule schedule(LrDecay decay, int64_t warmup, int64_t decay_steps, int64_t cooldown = 0) {
  return LrSchedule({1.0, 0.1, warmup, decay_steps, decay, cooldown});
}

TEST(LrSchedule, WarmupThenCosineToMinLr) {
  LrSchedule s = schedule(LrDecay::Cosine, 10, 110);
  EXPECT_NEAR(s.at(0), 0.1, 1e-12);
  EXPECT_NEAR(s.at(9), 1.0, 1e-12);
  EXPECT_NEAR(s.at(10), 1.0, 1e-12);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // half way: (lr + min_lr) / 2
  EXPECT_NEAR(s.at(35), 0.1 + 0.45 * (1 + std::cos(M_PI / 4)), 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  for (int k = 11; k < 110; ++k) EXPECT_LE(s.at(k), s.at(k - 1));
  LrSchedule same(LrScheduleOptions{0.3, 0.3, 0, 50});
  for (int k = 0; k < 60; k += 7) EXPECT_NEAR(same.at(k), 0.3, 1e-15);
  EXPECT_THROW(LrSchedule(LrScheduleOptions{0.1, 0.2, 0, 10}), ValueError);
}

// A warm-up from warmup_init: step k at init + (lr - init)(k + 1)/W, so
// init 0 is the plain warm-up and the decay after it is untouched; an init
// outside [0, lr] is refused naming it.
TEST(LrSchedule, WarmupStartsFromWarmupInit) {
  LrScheduleOptions o{1.0, 0.1, 10, 110, LrDecay::Cosine};
  o.warmup_init = 0.2;
  const LrSchedule s(o);
  const LrSchedule plain = schedule(LrDecay::Cosine, 10, 110);
  EXPECT_NEAR(s.at(0), 0.2 + 0.8 * 0.1, 1e-12);
  EXPECT_NEAR(s.at(4), 0.2 + 0.8 * 0.5, 1e-12);
  EXPECT_NEAR(s.at(2.5), 0.2 + 0.8 * 0.35, 1e-12);
  EXPECT_NEAR(s.at(9), 1.0, 1e-12);
  for (int k = 1; k < 10; ++k) EXPECT_GT(s.at(k), s.at(k - 1)) << k;
  for (int k = 0; k < 9; ++k) EXPECT_GT(s.at(k), plain.at(k)) << k;
  for (int k : {9, 10, 35, 60, 110, 200}) EXPECT_EQ(s.at(k), plain.at(k)) << k;
  for (double bad : {-0.1, 1.5}) {
    o.warmup_init = bad;
    testing::expect_error<ValueError>([&] { (void)LrSchedule(o); },
                                      {"warmup_init (" + std::to_string(bad) + ")", "[0, lr"});
  }
}

// Fractional steps (a batch-size ramp's small steps): the warm-up grows in
// proportion and stops at lr, and the decay falls in between.
TEST(LrSchedule, FractionalStepsInterpolate) {
  LrSchedule s = schedule(LrDecay::Cosine, 10, 110);
  EXPECT_NEAR(s.at(2.5), 0.35, 1e-12);
  EXPECT_NEAR(s.at(8.5), 0.95, 1e-12);
  EXPECT_NEAR(s.at(9.5), 1.0, 1e-12);  // past the warm-up's end: lr, not 1.05
  EXPECT_LT(s.at(60.5), s.at(60.0));
  EXPECT_GT(s.at(60.5), s.at(61.0));
}

// wsd's cool-down shapes over steps 90 to 110 (lr 1 to min_lr 0.1): cosine
// half way at its middle, 1-sqrt down by sqrt(p) of the way (a quarter in:
// half way down), each the stable phase before and min_lr after, and each
// falling every step.
TEST(LrSchedule, WarmupStableDecayCoolsDownInTheShapeAsked) {
  LrSchedule cosine({1.0, 0.1, 10, 110, LrDecay::Wsd, 20, CooldownShape::Cosine});
  LrSchedule root({1.0, 0.1, 10, 110, LrDecay::Wsd, 20, CooldownShape::OneMinusSqrt});
  for (const LrSchedule* s : {&cosine, &root}) {
    for (int k : {10, 50, 90}) EXPECT_EQ(s->at(k), 1.0) << k;
    for (int k = 91; k <= 110; ++k) EXPECT_LT(s->at(k), s->at(k - 1)) << k;
    EXPECT_NEAR(s->at(110), 0.1, 1e-12);
    EXPECT_NEAR(s->at(200), 0.1, 1e-12);
  }
  EXPECT_NEAR(cosine.at(100), 0.55, 1e-12);
  EXPECT_NEAR(cosine.at(95), 1.0 - 0.9 * 0.5 * (1.0 - std::cos(M_PI / 4)), 1e-12);
  EXPECT_NEAR(root.at(95), 0.55, 1e-12);
  EXPECT_NEAR(root.at(100), 1.0 - 0.9 * std::sqrt(0.5), 1e-12);
  EXPECT_EQ(cooldown_shape_from_string("1-sqrt"), CooldownShape::OneMinusSqrt);
  EXPECT_STREQ(cooldown_shape_name(CooldownShape::Cosine), "cosine");
  EXPECT_THROW(cooldown_shape_from_string("exp"), ValueError);
}

TEST(LrSchedule, LinearConstantAndWarmupStableDecay) {
  LrSchedule linear = schedule(LrDecay::Linear, 10, 110);
  EXPECT_NEAR(linear.at(4), 0.5, 1e-12);
  EXPECT_NEAR(linear.at(10), 1.0, 1e-12);
  EXPECT_NEAR(linear.at(35), 1.0 - 0.9 * 0.25, 1e-12);
  EXPECT_NEAR(linear.at(60), 0.55, 1e-12);
  EXPECT_NEAR(linear.at(110), 0.1, 1e-12);
  LrSchedule constant = schedule(LrDecay::Constant, 4, 110);
  EXPECT_NEAR(constant.at(1), 0.5, 1e-12);
  for (int k : {4, 50, 109, 110, 1000}) EXPECT_EQ(constant.at(k), 1.0) << k;
  // wsd: warm-up to step 10, lr until step 90, then a straight line down to
  // min_lr at 110.
  LrSchedule wsd = schedule(LrDecay::Wsd, 10, 110, 20);
  EXPECT_NEAR(wsd.at(9), 1.0, 1e-12);
  for (int k : {10, 50, 89, 90}) EXPECT_EQ(wsd.at(k), 1.0) << k;
  EXPECT_NEAR(wsd.at(100), 0.55, 1e-12);
  EXPECT_NEAR(wsd.at(105), 0.325, 1e-12);
  EXPECT_NEAR(wsd.at(110), 0.1, 1e-12);
  EXPECT_NEAR(wsd.at(111), 0.1, 1e-12);
  // The cool-down may take the whole span after warm-up (then it is linear).
  LrSchedule whole = schedule(LrDecay::Wsd, 10, 110, 100);
  for (int k = 0; k < 120; ++k) EXPECT_NEAR(whole.at(k), linear.at(k), 1e-12) << k;
  auto expect_error = [](const LrScheduleOptions& o, const std::string& fragment) {
    try {
      LrSchedule s(o);
      FAIL() << "expected ValueError with '" << fragment << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error({1.0, 0.1, 10, 110, LrDecay::Wsd, 0},
               "cooldown_steps (0) must be between 1 and decay_steps - warmup_steps (110 - 10 = "
               "100)");
  expect_error({1.0, 0.1, 10, 110, LrDecay::Wsd, 101}, "cooldown_steps (101)");
  expect_error({1.0, 0.1, 10, 110, LrDecay::Cosine, 5},
               "cooldown_steps (5) applies to the wsd decay only, not cosine");
  expect_error({1.0, 0.1, -1, 110}, "warmup_steps (-1) must be >= 0");
  expect_error({1.0, 0.1, 10, 110, LrDecay::Linear, 0, CooldownShape::OneMinusSqrt},
               "cooldown_shape 1-sqrt applies to the wsd decay only, not linear");
  // inverse_sqrt: lr * sqrt(10 / (s + 1)) after warm-up, min_lr its floor
  // (reached at s + 1 = 1000) and after decay_steps.
  LrSchedule root = schedule(LrDecay::InverseSqrt, 10, 2000);
  EXPECT_NEAR(root.at(4), 0.5, 1e-12);
  EXPECT_NEAR(root.at(9), 1.0, 1e-12);
  EXPECT_NEAR(root.at(39), 0.5, 1e-12);
  EXPECT_NEAR(root.at(249), 0.2, 1e-12);
  EXPECT_NEAR(root.at(1999), 0.1, 1e-12);
  EXPECT_EQ(root.at(2000), 0.1);
  EXPECT_NEAR(schedule(LrDecay::InverseSqrt, 0, 2000).at(3), 0.5, 1e-12);  // sqrt(1 / 4)
  EXPECT_EQ(lr_decay_from_string("inverse_sqrt"), LrDecay::InverseSqrt);
  EXPECT_STREQ(lr_decay_name(LrDecay::InverseSqrt), "inverse_sqrt");
  EXPECT_EQ(lr_decay_from_string("wsd"), LrDecay::Wsd);
  EXPECT_STREQ(lr_decay_name(LrDecay::Linear), "linear");
  EXPECT_THROW(lr_decay_from_string("step"), ValueError);
}

}  // namespace
}  // namespace triad::optim

namespace triad {
namespace {

TEST(Clip, DeviceSideSumOfSquaresEqualsTheHostSum) {
  const std::vector<Tensor> ts{randn({7, 3}, 1, 1), Tensor(), randn({5}, 1, 2, 3.0),
                               cast(randn({4, 4}, 1, 3), DType::BF16)};
  // The exact sum of the values held; bf16 is squared in f32 (exactly), so
  // only f32 rounding of squares and sums remains.
  double want = 0;
  for (const auto& t : ts) {
    if (!t.defined()) continue;
    double one = 0;
    for (double v : to_double_vector(t)) one += v * v;
    EXPECT_NEAR(optim::sum_of_squares(t), one, 1e-6 * one);
    want += one;
  }
  const Tensor got = optim::sum_of_squares_device(ts);
  EXPECT_EQ(got.dtype(), DType::F64);
  EXPECT_EQ(got.numel(), 1);
  EXPECT_NEAR(item(got), want, 1e-6 * want);
  EXPECT_FALSE(optim::sum_of_squares_device({}).defined());
}

// log.grad_norms' groups: numbered in the order of their names, each
// parameter in its key's group; each group's sum of squares in its place,
// zero for a group with nothing defined.
TEST(Clip, GroupedSumsOfSquaresFollowTheGroupsNames) {
  const optim::NormGroups groups({"b.x", "a.y", "b.z", "c"}, [](const std::string& name) {
    return name.substr(0, name.find('.'));
  });
  EXPECT_EQ(groups.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(groups.of("a.y"), 0u);
  EXPECT_EQ(groups.of("b.x"), 1u);
  EXPECT_EQ(groups.of("b.z"), 1u);
  EXPECT_EQ(groups.of("c"), 2u);
  try {
    groups.of("d");
    FAIL() << "expected an error for a parameter in no group";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'d'"), std::string::npos) << e.what();
  }
  const Tensor x = randn({3, 5}, 1, 4), y = randn({7}, 1, 5), z = randn({2, 2}, 1, 6);
  auto sq = [](const Tensor& t) {
    double s = 0;
    for (double v : to_double_vector(t)) s += v * v;
    return s;
  };
  const Tensor got = optim::grouped_sum_of_squares({{y}, {x, Tensor(), z}, {}}, Device::cpu());
  ASSERT_EQ(got.numel(), 3);
  EXPECT_EQ(got.dtype(), DType::F64);
  const auto v = to_double_vector(got);
  EXPECT_NEAR(v[0], sq(y), 1e-6 * sq(y));
  EXPECT_NEAR(v[1], sq(x) + sq(z), 1e-6 * (sq(x) + sq(z)));
  EXPECT_EQ(v[2], 0.0);
  EXPECT_FALSE(optim::grouped_sum_of_squares({{}, {Tensor()}}, Device::cpu()).defined());
  // One group is the plain global sum.
  EXPECT_NEAR(item(optim::grouped_sum_of_squares({{x, y}}, Device::cpu())), sq(x) + sq(y),
              1e-6 * (sq(x) + sq(y)));
}

}  // namespace
}  // namespace triad
