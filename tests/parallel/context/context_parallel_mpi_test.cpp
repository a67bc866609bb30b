// Context parallelism (DeepSpeed-Ulysses' all-to-all of heads, Llama 3's
// all-gather of keys and values, their ring, and all-to-alls inside groups
// with a ring across them) against one process: the exchanges as the
// linear maps they are (forward against the whole tensors, backward as
// their adjoints), each attention as the whole sequence's, then the
// sharded GPT — every rank its tokens of each sequence — whose group mean
// of losses and gradients is one process's, alone (cp = the world) and
// beside tensor parallelism (tp 2 x cp 2, with and without sequence
// parallelism), by every exchange. fp32 (and bf16 where stated);
// tolerances stated per test. CTest runs 2 and 4 ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/expect_close.h"
#include "support/mpi_main.h"
#include "support/tiny_deepseek.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/core/rng.h"
#include "triad/core/rope_scaling.h"
#include "triad/dist/world.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/parallel/context/all_gather.h"
#include "triad/parallel/context/hierarchical.h"
#include "triad/parallel/context/layout.h"
#include "triad/parallel/context/ring.h"
#include "triad/parallel/context/ulysses.h"
#include "triad/parallel/tensor/gpt.h"

namespace triad::cp {
namespace {

dist::ProcessGroupPtr g_world;

using testing::expect_close;

Tensor uniform(const Shape& shape, uint64_t stream) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = philox_uniform(3, stream, i) - 0.5;
  return from_vector(v, shape);
}

double summed_over_world(double x) {
  Tensor t = from_vector(std::vector<double>{x}, {1}, DType::F64);
  g_world->all_reduce(t, dist::ReduceOp::Sum)->wait();
  return item(t);
}

// The whole qkv (B, T, (q + 2 kv) D) -> the heads rank r keeps, whole
// sequence: query heads [r q/P, (r+1) q/P) and the key/value heads they
// read.
Tensor heads_of(const Tensor& qkv, const AttentionHeads& h, int64_t D, int r, int P) {
  const AttentionHeads kept = heads_kept(h, P);
  const int64_t kv_first = h.kv % P == 0 ? r * kept.kv : r / (P / h.kv);
  return concat({narrow(qkv, 2, r * kept.q * D, kept.q * D),
                 narrow(qkv, 2, h.q * D + kv_first * D, kept.kv * D),
                 narrow(qkv, 2, (h.q + h.kv) * D + kv_first * D, kept.kv * D)},
                2);
}

// sequence_to_heads is the whole tensor's heads of this rank; backward is
// its adjoint (sum over ranks of <f(x), g> = <x, f^T(g)>, the shared
// key/value heads' gradients summed); heads_to_sequence gives each rank its
// chunk back, and is the forward's inverse on the query heads.
TEST(Ulysses, ExchangesAreTheHeadsAndChunksOfTheWholeTensor) {
  const int P = g_world->size(), r = g_world->rank();
  const int64_t B = 2, D = 3, T = 4 * P, Tc = 4;
  // (Two key/value heads a rank: exchanged all-to-all; one for all: gathered.)
  for (const AttentionHeads h : {AttentionHeads{2 * P, 2 * P}, AttentionHeads{2 * P, 1}}) {
    SCOPED_TRACE("kv " + std::to_string(h.kv));
    const Tensor whole = uniform({B, T, h.fused() * D}, 1);
    Tensor chunk = contiguous(narrow(whole, 1, r * Tc, Tc)).detach();
    chunk.set_requires_grad(true);
    const Tensor out = sequence_to_heads(chunk, h, g_world);
    EXPECT_EQ(to_double_vector(out), to_double_vector(heads_of(whole, h, D, r, P)));
    const Tensor g = uniform(out.shape(), 10 + static_cast<uint64_t>(r));
    autograd::backward({out}, {g});
    const double lhs = summed_over_world(item(sum(mul(out, g))));
    const double rhs = summed_over_world(item(sum(mul(chunk, chunk.grad()))));
    EXPECT_NEAR(lhs, rhs, 1e-6 * std::abs(lhs));  // (f32 sums)
    // The attention's output for the kept query heads goes back to chunks.
    const AttentionHeads kept = heads_kept(h, P);
    const Tensor y_whole = uniform({B, T, h.q * D}, 2);
    const Tensor back =
        heads_to_sequence(contiguous(narrow(y_whole, 2, r * kept.q * D, kept.q * D)), D, g_world);
    EXPECT_EQ(to_double_vector(back), to_double_vector(narrow(y_whole, 1, r * Tc, Tc)));
  }
  if (P > 1) {
    try {
      heads_kept(AttentionHeads{P + 1, 1}, P);
      ADD_FAILURE() << "expected ShapeError";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be shared out over " + std::to_string(P) +
                                           " context-parallel ranks"),
                std::string::npos)
          << e.what();
    }
  }
}

// First keys (2, T) for the attention tests: a window of 7 over row 0, two
// documents (the second from position 7) in row 1.
Tensor window_and_documents(int64_t T) {
  std::vector<int64_t> first(static_cast<size_t>(2 * T), 0);
  for (int64_t t = 0; t < T; ++t) {
    first[static_cast<size_t>(t)] = std::max<int64_t>(0, t - 6);  // a window
    first[static_cast<size_t>(T + t)] = t < 7 ? 0 : 7;            // two documents
  }
  return from_vector(first, {2, T}, DType::I32);
}

// all_gather_attention on each rank's tokens (its chunk, or the balanced
// layout's two half-chunks) is the whole sequence's attention at those
// rows, and its gradient the whole one's at those rows (each rank's keys
// and values summing what every later query gave them), with grouped heads
// that do not share out, and with packed documents under a window.
TEST(AllGather, AttentionAndGradientsAreTheWholeSequencesChunks) {
  const int P = g_world->size(), r = g_world->rank();
  const int64_t B = 2, D = 4, T = 6 * P;
  const AttentionHeads h{3, 1};
  const Tensor first_keys = window_and_documents(T);
  for (const bool balanced : {false, true}) {
    for (const bool documents : {false, true}) {
      SCOPED_TRACE(std::string(balanced ? "balanced, " : "contiguous, ") +
                   (documents ? "documents and a window" : "causal"));
      const std::vector<cp::Run> runs =
          chunk_runs(T, r, balanced ? cp::Layout::balanced(P) : cp::Layout::contiguous(P));
      const Tensor starts = documents ? first_keys : Tensor();
      Tensor whole = uniform({B, T, h.fused() * D}, 4);
      whole.set_requires_grad(true);
      Tensor mine = contiguous(take_runs(whole, 1, runs)).detach();
      mine.set_requires_grad(true);
      const Tensor out = all_gather_attention(mine, h, starts, g_world, balanced);
      const Tensor want = causal_attention(whole, h, starts);
      expect_close(to_double_vector(out), to_double_vector(take_runs(want, 1, runs)), 1e-6, 1e-7,
                   "output");
      // Each rank's upstream gradient is its rows of one whole-sequence
      // gradient.
      const Tensor g = uniform({B, T, h.q * D}, 20);
      autograd::backward({out}, {contiguous(take_runs(g, 1, runs))});
      autograd::backward({want}, {g});
      expect_close(to_double_vector(mine.grad()),
                   to_double_vector(take_runs(whole.grad(), 1, runs)), 1e-5, 1e-6, "dqkv");
    }
  }
  // The balanced layout's halves: rank r's r and 2P - 1 - r, which gathered
  // in rank order go back to the sequence's.
  const std::vector<cp::Run> halves = chunk_runs(T, r, cp::Layout::balanced(P));
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_EQ(halves[0], (cp::Run{r * 3, 3}));
  EXPECT_EQ(halves[1], (cp::Run{(2 * P - 1 - r) * 3, 3}));
  const Tensor row = uniform({1, T, 2}, 30);
  std::vector<Tensor> blocks;
  for (int j = 0; j < P; ++j)
    blocks.push_back(take_runs(row, 1, chunk_runs(T, j, cp::Layout::balanced(P))));
  EXPECT_EQ(to_double_vector(to_sequence_order(concat(blocks, 1), 1, cp::Layout::balanced(P))),
            to_double_vector(row));
}

// `attend` on this rank's rows (`runs` of a sequence of T; 2 rows, head
// dim 4, all of `heads`, in `dtype`) is the whole sequence's causal
// attention at those rows, and its gradient the whole one's at them, each
// rank's upstream gradient its rows of one whole-sequence gradient.
// `starts`: the whole sequence's first keys, or undefined.
void expect_whole_sequences_rows(const std::function<Tensor(const Tensor&, const Tensor&)>& attend,
                                 const AttentionHeads& heads, int64_t T,
                                 const std::vector<cp::Run>& runs, DType dtype,
                                 const Tensor& starts) {
  const int64_t B = 2, D = 4;
  Tensor whole = cast(uniform({B, T, heads.fused() * D}, 4), dtype).detach();
  whole.set_requires_grad(true);
  Tensor mine = contiguous(take_runs(whole, 1, runs)).detach();
  mine.set_requires_grad(true);
  const Tensor out = attend(mine, starts);
  ASSERT_EQ(out.dtype(), dtype);
  const Tensor want = causal_attention(whole, heads, starts);
  const double tol = dtype == DType::F32 ? 1e-6 : 2e-2;
  expect_close(to_double_vector(out), to_double_vector(take_runs(want, 1, runs)), tol, tol / 10,
               "output");
  const Tensor g = cast(uniform({B, T, heads.q * D}, 20), dtype);
  autograd::backward({out}, {contiguous(take_runs(g, 1, runs))});
  autograd::backward({want}, {g});
  expect_close(to_double_vector(mine.grad()), to_double_vector(take_runs(whole.grad(), 1, runs)),
               10 * tol, tol, "dqkv");
}

// ring_attention on each rank's half-chunks is the whole sequence's
// attention at those rows, and its gradient the whole one's (each rank's
// keys and values back with what every later query on every rank gave
// them), with grouped heads that do not share out, a soft cap, packed
// documents under a window (whole blocks of keys unseen by a later
// document's queries), and in bf16 (f32 blocks folded together).
TEST(Ring, AttentionAndGradientsAreTheWholeSequencesHalfChunks) {
  const int P = g_world->size(), r = g_world->rank();
  const int64_t T = 6 * P;
  const AttentionHeads h{3, 1};
  const Tensor first_keys = window_and_documents(T);
  const std::vector<cp::Run> runs = chunk_runs(T, r, cp::Layout::balanced(P));
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const bool documents : {false, true}) {
      for (const double cap : {0.0, 2.0}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) +
                     (documents ? ", documents and a window" : "") + (cap > 0 ? ", soft cap" : ""));
        expect_whole_sequences_rows(
            [&](const Tensor& mine, const Tensor& starts) {
              return ring_attention(mine, h.with_softcap(cap), starts, g_world);
            },
            h.with_softcap(cap), T, runs, dtype, documents ? first_keys : Tensor());
      }
    }
  }
}

// The groups of hierarchical context parallelism over the world: all-to-
// alls of `a2a` consecutive ranks, a ring of the world / a2a at the same
// place in each.
Hierarchy hierarchy_of_world(int a2a) {
  const int r = g_world->rank();
  dist::ProcessGroupPtr all_to_all = dist::split_group(g_world, r / a2a, "cp-a2a");
  dist::ProcessGroupPtr ring = dist::split_group(g_world, r % a2a, "cp-ring");
  return {std::move(all_to_all), std::move(ring)};
}

// hierarchical_attention on each rank's share of its group's half-chunks
// (4 ranks: all-to-alls of 2, a ring of 2) is the whole sequence's
// attention at those rows, and its gradient the whole one's: with grouped
// heads exchanged (4 query, 2 key/value heads) and one key/value head
// gathered whole in each all-to-all, packed documents under a window, and
// in bf16.
TEST(Hierarchical, AttentionAndGradientsAreTheWholeSequencesShares) {
  const int P = g_world->size(), r = g_world->rank();
  if (P != 4) GTEST_SKIP() << "all-to-alls of 2 and a ring of 2 need 4 ranks";
  const Hierarchy groups = hierarchy_of_world(2);
  const int64_t B = 2, D = 4, T = 24;
  const Tensor first_keys = window_and_documents(T);
  const std::vector<cp::Run> runs = chunk_runs(T, r, cp::Layout::hierarchical(P, 2));
  for (const AttentionHeads h : {AttentionHeads{4, 2}, AttentionHeads{2, 1}}) {
    for (const DType dtype : {DType::F32, DType::BF16}) {
      for (const bool documents : {false, true}) {
        SCOPED_TRACE(std::to_string(h.q) + " query and " + std::to_string(h.kv) +
                     " key/value heads, " + dtype_name(dtype) +
                     (documents ? ", documents and a window" : ""));
        expect_whole_sequences_rows(
            [&](const Tensor& mine, const Tensor& starts) {
              return hierarchical_attention(mine, h, starts, groups);
            },
            h, T, runs, dtype, documents ? first_keys : Tensor());
      }
    }
  }
  // Heads that do not share out over the all-to-all are named.
  try {
    const Tensor odd = uniform({B, T / P, 5 * D}, 4);
    (void)hierarchical_attention(odd, AttentionHeads{3, 1}, Tensor(), groups);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("3 query and 1 key/value heads"), std::string::npos)
        << e.what();
  }
}

nn::GptConfig tiny() {
  return {.n_layer = 2, .n_head = 4, .d_model = 32, .vocab_size = 300, .seq_len = 16};
}

Tensor token_ids(uint64_t stream) {
  std::vector<int64_t> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>(philox_uniform(5, stream, i) * 300) % 300;
  return from_vector(ids, {2, 16});
}

struct Sharding {
  int tp;
  bool sp;
  bool ep = false;  // a mixture's experts shared out over the context group
  Exchange exchange = Exchange::Auto;
  int a2a = 1;  // under Exchange::AllToAllRing: the all-to-alls' ranks
};

// `cfg` sharded over tp x cp ranks (cp = world / tp; the tensor-parallel
// groups consecutive ranks) against nn::Gpt from the same seed: logits,
// the group mean of the loss of (ids, targets) and of every gradient.
void expect_matches_one_process(const nn::GptConfig& cfg, const Sharding& layout, const Tensor& ids,
                                const Tensor& targets) {
  const int W = g_world->size(), r = g_world->rank();
  const dist::ProcessGroupPtr tp = dist::split_group(g_world, r / layout.tp, "tp");
  const dist::ProcessGroupPtr cp = dist::split_group(g_world, r % layout.tp, "cp");
  ASSERT_EQ(cp->size(), W / layout.tp);
  nn::Gpt ref(cfg, 7);
  const dist::ProcessGroupPtr experts = layout.ep ? cp : dist::ProcessGroupPtr{};
  // (Hierarchical: cp is the world, tp 1.)
  const Hierarchy hierarchy = layout.a2a > 1 ? hierarchy_of_world(layout.a2a) : Hierarchy{};
  tp::TensorParallelGpt model(cfg, 7, tp, layout.sp, tp::StagePlan::whole(cfg.n_layer), experts, cp,
                              layout.exchange, hierarchy);
  if (layout.exchange != Exchange::Auto) {
    EXPECT_EQ(model.context_exchange(), layout.exchange);
  }
  expect_close(to_double_vector(model.logits(ids)), to_double_vector(ref.forward(ids)), 2e-5, 0,
               "logits");
  Tensor l = model.loss(ids, targets), lr = ref.loss(ids, targets);
  Tensor mean_loss = cast(l.detach(), DType::F64);
  cp->all_reduce(mean_loss, dist::ReduceOp::Sum)->wait();
  EXPECT_NEAR(item(mean_loss) / cp->size(), item(lr), 1e-6 * item(lr));
  autograd::backward({l});
  autograd::backward({lr});
  model.reduce_partial_grads();
  // The group's mean gradient, as the data-parallel reduction takes it (an
  // expert held by one rank of an expert-parallel group already sums the
  // group's tokens: the trainer divides it by ep).
  nn::StateDict grads;
  // (No gradient: the expert biases, moved by their own rule, and an
  // expert no token chose; zeros, as one process's.)
  auto grad_of = [](const Tensor& p) {
    return p.grad().defined() ? contiguous(p.grad()).detach() : zeros(p.shape(), p.dtype());
  };
  for (auto& [name, p] : model.named_parameters()) {
    Tensor g = grad_of(p);
    if (!layout.ep || !tp::TensorParallelGpt::is_expert(name))
      cp->all_reduce(g, dist::ReduceOp::Sum)->wait();
    grads[name] = scale(g, 1.0 / cp->size());
  }
  tp::TensorParallelGpt holder(cfg, 0, tp, layout.sp, tp::StagePlan::whole(cfg.n_layer), experts);
  holder.load_state_dict(grads);
  const nn::StateDict full = holder.full_state_dict();
  EXPECT_EQ(full.size(), ref.named_parameters().size());
  for (auto& [name, p] : ref.named_parameters()) {
    expect_close(to_double_vector(full.at(name)), to_double_vector(grad_of(p)), 1e-6, 1e-4, name);
  }
}

std::vector<Sharding> layouts() {
  std::vector<Sharding> out{{1, false}};
  if (g_world->size() == 4) out.insert(out.end(), {{2, false}, {2, true}});
  return out;
}

// GPT-2's blocks (learned positions: each chunk looks up its own), LLaMA's
// (rope at the chunk's positions, longrope's factors the whole row's,
// grouped key/value heads: exchanged when
// each rank keeps some, gathered and shared when fewer than the ranks),
// OLMo 2's norms over all the heads (per token), packed documents with a
// window and loss-masked targets (uneven among the chunks: each rank's
// loss weighs its share of the scored targets), and DeepSeek's latent
// attention (its padded heads exchanged as any); mixtures balanced by
// expert biases, by a load-balancing loss over the micro-batch (with a
// z-loss) or per sequence (its shares counted over every chunk), or capped
// by a capacity (the drops chosen among every chunk's assignments, by
// position or probability, as one process chooses them), their experts on
// every rank or shared out over the context group (each expert's tokens
// gathered from every chunk). Each by the heads' all-to-all, by the keys'
// and values' all-gather and by their ring; and heads that do not share out
// (3 over the world's 2 or 4 ranks), which Auto sends to the all-gather.
TEST(ContextParallelGpt, LossLogitsAndEveryGradientMatchOneProcess) {
  const Tensor ids = token_ids(1), targets = token_ids(2);
  for (const std::string variant :
       {"gpt-2", "llama, grouped-query attention", "llama, one key/value head",
        "llama, longrope past the chunks", "olmo 2's norms over all heads",
        "packed documents, a window, masked targets", "latent attention",
        "a mixture balanced by expert biases", "a mixture with a balance loss and a z-loss",
        "a mixture with a balance loss per sequence", "a mixture capped, dropping by position",
        "a mixture capped, dropping the least probable", "llama, heads that do not share out"}) {
    nn::GptConfig cfg = tiny();
    Tensor t = targets;
    if (variant != "gpt-2") {
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.linear_bias = false;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.rope_theta = 30.0;
    }
    if (variant.find("grouped") != std::string::npos) {
      cfg.n_head = 8;
      cfg.n_kv_head = 4;
    }
    if (variant.find("one key/value") != std::string::npos) cfg.n_kv_head = 1;
    const bool odd_heads = variant.find("do not share out") != std::string::npos;
    if (odd_heads) {
      cfg.n_head = 3;
      cfg.d_model = 24;
    }
    if (variant.find("longrope") != std::string::npos) {
      // Rows of 16 past an original context of 12, each chunk within it:
      // the long factors, the whole row's, on every rank.
      RopeScaling& rope = cfg.rope_scaling;
      rope.kind = RopeScaling::Kind::LongRope;
      rope.original_seq_len = 12;
      rope.factor = 16.0 / 12.0;
      ASSERT_EQ(set_rope_factors(rope, {1.0, 1.5, 2.0, 3.0}, {2.0, 5.0, 11.0, 23.0}), "");
    }
    if (variant.find("olmo") != std::string::npos) nn::set_qk_norm(cfg, "full");
    if (variant.find("packed") != std::string::npos) {
      cfg.eod_token = static_cast<int64_t>(to_double_vector(ids)[5]);  // a document ends there
      cfg.reset_attention_mask = cfg.reset_position_ids = true;
      cfg.sliding_window = 5;
      std::vector<double> v = to_double_vector(targets);
      for (size_t i = 0; i < 9; ++i) v[i] = -100;  // the first row's first chunks unscored
      t = cast(from_vector(v, targets.shape()), DType::I64);
    }
    if (variant.find("latent") != std::string::npos) {
      cfg.mla = testing::tiny_latent_attention();
      cfg.n_layer = 1;
    }
    std::vector<Sharding> tried = layouts();
    if (variant.find("expert biases") != std::string::npos) {
      cfg.moe = {.experts = 4,
                 .top_k = 2,
                 .ffn_hidden_size = 16,
                 .aux_loss_coef = 0,
                 .score = nn::GptConfig::Moe::Score::Sigmoid,
                 .expert_bias = true};
    } else if (variant.find("mixture") != std::string::npos) {
      // Large weights, so that the losses' gradients show in the router's.
      cfg.moe = {.experts = 4, .top_k = 2, .ffn_hidden_size = 16, .aux_loss_coef = 0.5};
      if (variant.find("z-loss") != std::string::npos) cfg.moe.z_loss_coef = 0.5;
      if (variant.find("per sequence") != std::string::npos) {
        cfg.moe.score = nn::GptConfig::Moe::Score::Sigmoid;
        cfg.moe.aux_loss_scope = nn::GptConfig::Moe::BalanceScope::Sequence;
      }
      if (variant.find("capped") != std::string::npos) {
        // 12 rows an expert for the micro-batch's 64 assignments: some drop,
        // chosen among every chunk's together.
        cfg.moe.capacity_factor = 0.75;
        cfg.moe.drop_policy = variant.find("position") != std::string::npos
                                  ? nn::GptConfig::Moe::DropPolicy::Position
                                  : nn::GptConfig::Moe::DropPolicy::Probs;
      }
    }
    if (cfg.moe.experts > 0) {
      // (And the experts shared out over the context group, their tokens
      // exchanged among its chunks.)
      for (const Sharding& l : layouts()) {
        if (4 % (g_world->size() / l.tp) == 0) tried.push_back({l.tp, l.sp, true});
      }
    }
    if (odd_heads) {
      tried = {{1, false}, {1, false, false, Exchange::Ring}};
    } else {
      for (size_t i = 0, n = tried.size(); i < n; ++i) {
        for (const Exchange balanced : {Exchange::AllGather, Exchange::Ring}) {
          Sharding other = tried[i];
          other.exchange = balanced;
          tried.push_back(other);
        }
        // Over 4 ranks alone: all-to-alls of 2, a ring of 2.
        if (g_world->size() == 4 && tried[i].tp == 1) {
          Sharding both = tried[i];
          both.exchange = Exchange::AllToAllRing;
          both.a2a = 2;
          tried.push_back(both);
        }
      }
    }
    for (const Sharding& layout : tried) {
      SCOPED_TRACE(variant + ", tp " + std::to_string(layout.tp) + (layout.sp ? ", sp" : "") +
                   (layout.ep ? ", ep over cp" : "") + ", " + exchange_name(layout.exchange));
      expect_matches_one_process(cfg, layout, ids, t);
    }
  }
}

// What context parallelism cannot share out is named before anything runs.
TEST(ContextParallelGpt, WhatItCannotSplitIsNamed) {
  const int W = g_world->size();
  if (W == 1) GTEST_SKIP() << "needs a group of several ranks";
  auto error_of = [&](const nn::GptConfig& cfg) -> std::string {
    try {
      tp::TensorParallelGpt(cfg, 1, dist::split_group(g_world, g_world->rank(), "tp"), false,
                            tp::StagePlan::whole(cfg.n_layer), dist::ProcessGroupPtr{}, g_world);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  nn::GptConfig heads = tiny();
  heads.n_head = W + 1;
  heads.d_model = 4 * heads.n_head;
  auto error_with = [&](const nn::GptConfig& cfg, Exchange exchange) -> std::string {
    try {
      tp::TensorParallelGpt(cfg, 1, dist::split_group(g_world, g_world->rank(), "tp"), false,
                            tp::StagePlan::whole(cfg.n_layer), dist::ProcessGroupPtr{}, g_world,
                            exchange);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  // The all-to-all needs the heads to share out; the all-gather (and Auto,
  // which picks it) takes them.
  EXPECT_NE(error_with(heads, Exchange::AllToAll).find("the query heads a multiple of cp"),
            std::string::npos)
      << error_with(heads, Exchange::AllToAll);
  EXPECT_EQ(error_with(heads, Exchange::AllGather), "no error");
  EXPECT_EQ(error_of(heads), "no error");
  nn::GptConfig length = tiny();
  length.seq_len = 4 * W + 1;
  EXPECT_NE(error_of(length).find("model.seq_len (" + std::to_string(4 * W + 1) +
                                  ") must be divisible by cp"),
            std::string::npos)
      << error_of(length);
  // The all-to-all and ring: its groups, and its ranks laid out as the
  // context group's (rank r the ring's r / a2a-th).
  if (W == 4) {
    auto error_hierarchical = [&](const Hierarchy& groups) -> std::string {
      try {
        tp::TensorParallelGpt(tiny(), 1, dist::split_group(g_world, g_world->rank(), "tp"), false,
                              tp::StagePlan::whole(2), dist::ProcessGroupPtr{}, g_world,
                              Exchange::AllToAllRing, groups);
      } catch (const Error& e) {
        return e.what();
      }
      return "no error";
    };
    EXPECT_NE(error_hierarchical({}).find("parallel.cp_a2a (1) must be a divisor of parallel.cp "
                                          "(4) above 1 and below it"),
              std::string::npos)
        << error_hierarchical({});
    const int r = g_world->rank();
    // (The all-to-all's ranks 2 apart, not consecutive.)
    const Hierarchy crossed{dist::split_group(g_world, r % 2, "cp-a2a"),
                            dist::split_group(g_world, r / 2, "cp-ring")};
    EXPECT_NE(error_hierarchical(crossed).find("needs the context-parallel group's all-to-all "
                                               "groups (blocks of a2a consecutive ranks)"),
              std::string::npos)
        << error_hierarchical(crossed);
    EXPECT_EQ(error_hierarchical(hierarchy_of_world(2)), "no error");
  }
  nn::GptConfig mixture = tiny();  // (a capacity is taken: chosen over every chunk)
  mixture.moe = {.experts = 4, .top_k = 2, .capacity_factor = 1.25};
  EXPECT_EQ(error_of(mixture), "no error");
  // A chunk-sized sequence is named when it arrives.
  tp::TensorParallelGpt model(tiny(), 1, dist::split_group(g_world, g_world->rank(), "tp"), false,
                              tp::StagePlan::whole(2), dist::ProcessGroupPtr{}, g_world);
  try {
    model.loss(narrow(token_ids(1), 1, 0, 4 * W - 1), narrow(token_ids(2), 1, 0, 4 * W - 1));
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(
        std::string(e.what()).find("must be divisible by parallel.cp (" + std::to_string(W) + ")"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::cp

int main(int argc, char** argv) {
  return triad::testing::run_mpi_tests(
      argc, argv, [](const triad::dist::ProcessGroupPtr& w) { triad::cp::g_world = w; },
      [] { triad::cp::g_world.reset(); });
}
