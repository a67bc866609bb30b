// Data parallelism and ZeRO-1 through the trainer on dp = world size (CTest:
// 2 and 4 ranks): buckets start their reduction from the gradient-ready
// hooks while backward runs, ZeRO-1 keeps 1/dp of the optimizer state, and a
// NaN on one rank skips the step on all without advancing the schedule.
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "support/expect_error.h"
#include "support/forwarding_group.h"
#include "support/mpi_main.h"
#include "support/temp_dir.h"
#include "triad/autograd/engine.h"
#include "triad/core/allocator.h"
#include "triad/data/token_shard.h"
#include "triad/dist/world.h"
#include "triad/io/checkpoint.h"
#include "triad/io/gpt2_weights.h"
#include "triad/ops.h"
#include "triad/parallel/data/grad_reducer.h"
#include "triad/parallel/tensor/gpt.h"
#include "triad/train/attention_choice.h"
#include "triad/train/trainer.h"

namespace triad::train {
namespace {

dist::ProcessGroupPtr g_world;

Config config(const testing::TempDir& dir, int zero) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 6000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  const int dp = g_world->size();
  std::string yaml =
      "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 32, seq_len: 16}\n"
      "train: {steps: 4, global_batch_size: " +
      std::to_string(4 * dp) +
      ", micro_batch_size: 2, lr: 1.0e-2, warmup_steps: 2}\n"
      "parallel: {dp: " +
      std::to_string(dp) + ", zero: " + std::to_string(zero) +
      ", bucket_mb: 0.004}\n"
      "data: {train: " +
      dir.file("train.bin") +
      "}\n"
      "output: {dir: " +
      dir.file("out") + "}\n";
  return parse_config(yaml);
}

TEST(AttentionChoice, RanksAgreeOnTheKernelFastestForTheWorld) {
  const int P = g_world->size(), me = g_world->rank();
  cuda::AttentionChoice c;
  c.batch = 4, c.seq_len = 1024, c.d_model = 768, c.n_head = 12;
  // Rank 0 alone finds cuDNN much faster; every other rank finds Triad's
  // kernels a little faster: summed, Triad's kernels win, on every rank.
  c.own_ms = me == 0 ? 10.0 : 2.0;
  c.cudnn_ms = me == 0 ? 1.0 : 2.0 + 9.0 / (P - 1) + 0.5;  // loses 9 ms and more
  c.cudnn = c.cudnn_ms < c.own_ms;
  ASSERT_TRUE(agree_attention_choice(true, c, g_world.get()));
  EXPECT_FALSE(c.cudnn);
  EXPECT_DOUBLE_EQ(c.own_ms, 10.0 + 2.0 * (P - 1));
  // The other way round: rank 0's large saving outweighs the rest.
  cuda::AttentionChoice d = c;
  d.own_ms = me == 0 ? 30.0 : 2.0;
  d.cudnn_ms = me == 0 ? 1.0 : 2.5;
  ASSERT_TRUE(agree_attention_choice(true, d, g_world.get()));
  EXPECT_TRUE(d.cudnn);
  // A rank that cannot run cuDNN takes every rank to Triad's kernels.
  cuda::AttentionChoice e = d;
  const bool has = me != P - 1;
  EXPECT_EQ(agree_attention_choice(has, e, g_world.get()), has);
  if (has) {
    EXPECT_FALSE(e.cudnn);
  }
}

TEST(AttentionChoice, DecisionsRoundTripThroughCheckpointJson) {
  cuda::AttentionChoice c;
  c.dtype = DType::F16;
  c.deterministic = false;
  c.batch = 2, c.seq_len = 128, c.d_model = 64, c.n_head = 4;
  c.cudnn = true, c.own_ms = 1.5, c.cudnn_ms = 0.25;
  const auto back = attention_choices_from_json(attention_choices_to_json({c}));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(back[0].same_problem(c));
  EXPECT_TRUE(back[0].cudnn);
  EXPECT_EQ(back[0].cudnn_ms, 0.25);
  // An inference decision stays one (and apart from the training one).
  cuda::AttentionChoice f = c;
  f.forward_only = true;
  const auto both = attention_choices_from_json(attention_choices_to_json({c, f}));
  ASSERT_EQ(both.size(), 2u);
  EXPECT_FALSE(both[0].forward_only);
  EXPECT_TRUE(both[1].same_problem(f));
  EXPECT_FALSE(both[1].same_problem(c));
  // A grouped-query decision keeps its key/value heads and is another
  // problem; a multi-head one writes none (as checkpoints before them), and
  // kv_heads equal to n_head is the same problem as 0.
  cuda::AttentionChoice g = c;
  g.kv_heads = 2;
  const auto grouped = attention_choices_from_json(attention_choices_to_json({g}));
  ASSERT_EQ(grouped.size(), 1u);
  EXPECT_EQ(grouped[0].kv_heads, 2);
  EXPECT_TRUE(grouped[0].same_problem(g));
  EXPECT_FALSE(grouped[0].same_problem(c));
  EXPECT_FALSE(attention_choices_to_json({c})[0].contains("kv_heads"));
  cuda::AttentionChoice all = c;
  all.kv_heads = 4;
  EXPECT_TRUE(all.same_problem(c));
  nlohmann::json bad = attention_choices_to_json({g});
  bad[0]["kv_heads"] = "two";
  EXPECT_THROW(attention_choices_from_json(bad), IoError);
  bad[0]["kv_heads"] = 0;
  EXPECT_THROW(attention_choices_from_json(bad), IoError);
  bad = attention_choices_to_json({c});
  bad[0]["kernel"] = "flash";
  try {
    attention_choices_from_json(bad);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 'flash'"), std::string::npos) << e.what();
  }
  bad[0].erase("kernel");
  EXPECT_THROW(attention_choices_from_json(bad), IoError);
  bad = attention_choices_to_json({c});
  bad[0]["seq_len"] = 1024.5;  // (read as 1024 once)
  EXPECT_THROW(attention_choices_from_json(bad), IoError);
}

// The model.safetensors a run writes is the model it trained, on layouts
// with pipelines (only the first pipeline rank of tp and dp rank 0 gathers
// it, one tensor at a time; the other pipelines send nothing) and with
// tensor parallelism alone (only dp rank 0's group joins its shards).
// A 4-layer model trained `steps` steps on `layout` (a YAML map of
// parallel settings), global batch 8 of micro-batches of 1.
Config four_layers(const testing::TempDir& dir, const std::string& layout, int steps) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 6000; ++i) tokens.push_back(static_cast<uint16_t>((i * 5 + i / 7) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  return parse_config(
      "model: {n_layer: 4, n_head: 4, d_model: 16, vocab_size: 32, seq_len: 16}\n"
      "train: {steps: " +
      std::to_string(steps) +
      ", global_batch_size: 8, micro_batch_size: 1, lr: 1.0e-2}\n"
      "parallel: " +
      layout + "\ndata: {train: " + dir.file("train.bin") + "}\noutput: {dir: " + dir.file("out") +
      "}\nlog: {interval: 1}\n");
}

TEST(DataParallel, TheSavedModelIsTheTrainedOneOnEveryLayout) {
  const int P = g_world->size();
  std::vector<std::string> layouts{"{pp: " + std::to_string(P) + "}",
                                   "{tp: " + std::to_string(P) + "}"};
  if (P == 4) {
    layouts.push_back("{tp: 2, dp: 2, zero: 1}");
    layouts.insert(layouts.end(), {"{pp: 2, dp: 2}", "{pp: 2, dp: 2, zero: 1}",
                                   "{tp: 2, pp: 2, sequence_parallel: true}",
                                   "{pp: 2, vpp: 2, schedule: zb-v, dp: 2}"});
  }
  for (const std::string& layout : layouts) {
    SCOPED_TRACE(layout);
    testing::TempDir dir;
    const Config c = four_layers(dir, layout, 2);
    Trainer t(c, g_world);
    t.run();  // writes out/model.safetensors on rank 0
    const nn::StateDict trained = t.full_state_dict();
    if (g_world->rank() != 0) continue;
    const nn::StateDict saved = io::load_gpt2_state_dict(dir.file("out/model.safetensors"),
                                                         nn::gpt_parameter_shapes(c.model));
    ASSERT_EQ(saved.size(), trained.size());
    for (const auto& [name, want] : trained) {
      ASSERT_TRUE(saved.count(name)) << name;
      EXPECT_EQ(to_double_vector(saved.at(name)), to_double_vector(want)) << name;
    }
  }
}

// parallel.check_replicas_interval 1: on each layout every replica agrees
// after every step (ZeRO-1's pieces gathered first, experts over their own
// replicas); a bit flipped in one rank's copy of a weight after step 2
// stops every rank at that step's check, and the ranks whose replicas
// differ name the weight, the kind of replicas, and which ranks hold which
// checksum.
TEST(DataParallel, AReplicaThatChangedAloneStopsEveryRank) {
  const int P = g_world->size(), me = g_world->rank();
  const std::string dp = std::to_string(P);
  struct Case {
    std::string layout, model, name;
    int flipper;
    // What the ranks that see the difference must say, by world rank
    // (absent: "on other ranks").
    std::map<int, std::vector<std::string>> said;
  };
  std::vector<Case> cases{
      {"{dp: " + dp + "}", "", "h.1.mlp.c_fc.weight", P - 1, {}},
      {"{dp: " + dp + ", zero: 1, bucket_mb: 0.001}", "", "h.0.attn.c_proj.weight", 0, {}}};
  for (Case& c : cases) {
    for (int r = 0; r < P; ++r) {
      c.said[r] = {c.name + " (data-parallel replicas):",
                   "rank " + std::to_string(c.flipper) + " holds "};
    }
  }
  if (P == 4) {
    // tp 2 x dp 2 (ranks 0 1 | 2 3): rank 3's dp peer is rank 1.
    cases.push_back({"{tp: 2, dp: 2, zero: 1}",
                     "",
                     "ln_f.weight",
                     3,
                     {{1, {"ln_f.weight (data-parallel replicas): ", "rank 3 holds"}},
                      {3, {"ln_f.weight (data-parallel replicas): ", "rank 1 holds"}}}});
    // pp 2 x dp 2 (stage 0: ranks 0 1, stage 1: 2 3), the embedding tied:
    // rank 3's wte differs from its dp peer's (2) and its first stage's (1).
    cases.push_back({"{pp: 2, dp: 2}",
                     "",
                     "wte.weight",
                     3,
                     {{1, {"wte.weight (first and last pipeline stages' replicas):"}},
                      {2, {"wte.weight (data-parallel replicas):", "rank 2 holds"}},
                      {3,
                       {"wte.weight (data-parallel replicas):",
                        "wte.weight (first and last pipeline stages' replicas):"}}}});
    // dp 4, ep 2: an expert's replicas are ranks {0, 2} and {1, 3}.
    cases.push_back({"{dp: 4, ep: 2, zero: 1}",
                     ", moe: {experts: 4, top_k: 2, ffn_hidden_size: 16}",
                     "h.2.mlp.experts.3.c_fc.weight",
                     3,
                     {{1,
                       {"h.2.mlp.experts.3.c_fc.weight (expert-data-parallel replicas):",
                        "rank 1 holds", "rank 3 holds"}},
                      {3, {"(expert-data-parallel replicas)"}}}});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.layout);
    testing::TempDir dir;
    std::vector<uint16_t> tokens;
    for (int i = 0; i < 6000; ++i) tokens.push_back(static_cast<uint16_t>((i * 5 + i / 7) % 31));
    data::write_token_shard(dir.file("train.bin"), tokens);
    std::string layout = c.layout;
    layout.insert(layout.size() - 1, ", check_replicas_interval: 1");
    Trainer t(parse_config("model: {n_layer: 4, n_head: 4, d_model: 16, vocab_size: 32, "
                           "seq_len: 16" +
                           c.model +
                           "}\ntrain: {steps: 3, global_batch_size: 8, micro_batch_size: 1, "
                           "lr: 1.0e-2}\nparallel: " +
                           layout + "\ndata: {train: " + dir.file("train.bin") +
                           "}\noutput: {dir: " + dir.file("out") + "}\n"),
              g_world);
    if (me == c.flipper) t.flip_parameter_bit_at(1, c.name);
    t.step(0);  // the replicas agree
    std::vector<std::string> want{
        "step 2: replicas of the weights differ "
        "(parallel.check_replicas_interval)"};
    const auto it = c.said.find(me);
    if (it == c.said.end()) {
      want.push_back("on other ranks");
    } else {
      want.insert(want.end(), it->second.begin(), it->second.end());
    }
    testing::expect_error<Error>([&] { t.step(1); }, want);
  }
}

// The final model.safetensors is written as the tensors are joined; a write
// that fails on rank 0 raises there once the others have given their
// tensors, and no rank waits forever (here the file's temporary name is
// taken by a directory).
TEST(DataParallel, AFinalWriteThatFailsStopsTheWriterOnly) {
  const int P = g_world->size();
  for (const std::string& layout :
       {"{pp: " + std::to_string(P) + "}", "{tp: " + std::to_string(P) + "}"}) {
    SCOPED_TRACE(layout);
    testing::TempDir dir;
    std::filesystem::create_directories(dir.file("out/model.safetensors.tmp"));
    Trainer t(four_layers(dir, layout, 1), g_world);
    if (g_world->rank() == 0) {
      try {
        t.run();
        FAIL() << "the write did not fail";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("model.safetensors.tmp"), std::string::npos)
            << e.what();
      }
    } else {
      EXPECT_NO_THROW(t.run());
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("out/model.safetensors")));
    g_world->barrier()->wait();
  }
}

// Without tensor parallelism nothing sums a replicated tensor's partial
// gradients after backward (the query/key norms', LoRA's c_fc A and c_proj
// B): their buckets start during backward as the rest do, none left for
// finish().
TEST(DataParallel, BucketsOfTensorParallelPartialsStartDuringBackwardAtTp1) {
  testing::TempDir dir;
  Config c = config(dir, 0);
  c.model.qk_norm = true;
  Config lora = c;
  lora.model.lora.rank = 2;
  lora.model.lora.targets = {"attn.c_attn", "mlp.c_fc", "mlp.c_proj"};
  lora.parallel.bucket_mb = 0.0005;  // (the adapters are small: several buckets still)
  for (const Config& each : {c, lora}) {
    SCOPED_TRACE(each.model.lora.rank > 0 ? "LoRA" : "query/key norms");
    Trainer t(each, g_world);
    ASSERT_NE(t.reducer(), nullptr);
    const int buckets = t.reducer()->num_buckets();
    EXPECT_GE(buckets, 2);
    t.step(0);
    t.step(1);
    EXPECT_EQ(t.reducer()->launched_early_last_step(), buckets);
  }
}

TEST(DataParallel, BucketsStartDuringBackwardAndZeroShardsTheState) {
  int64_t full_state = 0;
  for (int zero : {0, 1}) {
    testing::TempDir dir;
    Trainer t(config(dir, zero), g_world);
    ASSERT_NE(t.reducer(), nullptr);
    const int buckets = t.reducer()->num_buckets();
    EXPECT_GT(buckets, 2);
    t.step(0);  // learns how many gradients each parameter receives
    EXPECT_EQ(t.reducer()->launched_early_last_step(), 0);
    t.step(1);
    // From then on every bucket starts from the hooks, during backward.
    EXPECT_EQ(t.reducer()->launched_early_last_step(), buckets);
    const int dp = g_world->size();
    const int64_t align = dp::GradientReducer::kAlign;
    // Every parameter's gradient starts aligned in the flat buffer.
    for (const auto& [name, p] : t.reducer()->params())
      EXPECT_EQ(p.grad().offset() % align, 0) << name;
    if (zero == 0) {
      full_state = t.optimizer_state_elements();
      continue;
    }
    // parallel.overlap_param_gather (on by default): the step left every
    // bucket's all-gather running, and step 2's forward pass waited for
    // each where it first read the bucket's parameters; reading the
    // parameters from outside waits for the rest.
    EXPECT_EQ(t.reducer()->pending_gathers(), buckets);
    EXPECT_EQ(t.reducer()->gathers_waited_by_parts_last_step(), buckets);
    t.full_state_dict();
    EXPECT_EQ(t.reducer()->pending_gathers(), 0);
    // Every bucket splits into dp equal, aligned pieces (NCCL's
    // reduce-scatter and all-gather, not per-rank reduces and broadcasts).
    for (int64_t len : t.reducer()->bucket_lengths()) EXPECT_EQ(len % (align * dp), 0) << len;
    // Every element of the state is on exactly one rank, and each rank
    // holds 1/dp of it, give or take the gaps (under kAlign * dp per
    // bucket and kAlign per parameter).
    Tensor n = from_vector(std::vector<double>{static_cast<double>(t.optimizer_state_elements())},
                           {1}, DType::F64);
    g_world->all_reduce(n, dist::ReduceOp::Sum)->wait();
    EXPECT_EQ(static_cast<int64_t>(item(n)), full_state);
    const double slack = static_cast<double>(
        buckets * align * dp + static_cast<int64_t>(t.reducer()->params().size()) * align);
    EXPECT_NEAR(static_cast<double>(t.optimizer_state_elements()),
                static_cast<double>(full_state) / dp, slack);
  }
}

// Four parameters of odd sizes (a reducer with 256-byte buckets cuts them
// into several buckets).
std::vector<std::pair<std::string, Tensor>> small_params() {
  std::vector<std::pair<std::string, Tensor>> params;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
           {"a", {37, 5}}, {"b", {101}}, {"c", {8, 9}}, {"d", {300}}})
    params.push_back({name, zeros(shape).set_requires_grad(true)});
  return params;
}

// GradientReducer::set_deferred (train.cuda_graph beside a group whose
// collectives cannot join a capture): no bucket starts during backward,
// finish() reduces them all, to the same average. A CPU group's reductions
// cannot be captured.
TEST(DataParallel, DeferredBucketsAllReduceInFinishToTheSameAverage) {
  const int dp = g_world->size(), me = g_world->rank();
  for (bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "deferred" : "from the hooks");
    dp::GradientReducer r(small_params(), g_world, 256.0, false);
    ASSERT_GT(r.num_buckets(), 2);
    EXPECT_FALSE(r.captures_reductions());
    r.set_deferred(deferred);
    for (int step = 0; step < 2; ++step) {  // (the first learns the counts)
      r.zero_grad();
      Tensor loss;
      for (const auto& [name, p] : r.params()) {
        const Tensor part = sum(mul(p, full(p.shape(), me + 1.0 + step)));
        loss = loss.defined() ? add(loss, part) : part;
      }
      autograd::backward({loss});
      r.finish();
    }
    EXPECT_EQ(r.launched_early_last_step(), deferred ? 0 : r.num_buckets());
    for (const auto& [name, p] : r.params()) {
      for (double v : to_double_vector(p.grad())) ASSERT_EQ(v, (dp + 1) / 2.0 + 1) << name;
    }
  }
}

// ZeRO-1 gathers the parameters in place: each rank's updated piece of a
// bucket is already where the gathered bucket keeps it, so no tensor is
// allocated for the gather, and every rank ends with every owner's values.
TEST(DataParallel, ZeroOneGathersTheParametersInPlace) {
  const int dp = g_world->size(), me = g_world->rank();
  dp::GradientReducer r(small_params(), g_world, 256.0, true);  // 64 elements: several buckets
  ASSERT_GT(r.num_buckets(), 2);
  // Each rank writes (its rank + 1) into its own pieces.
  for (const auto& seg : r.shard_segments()) {
    Tensor piece = narrow(r.flat_params(), 0, seg.flat_offset, seg.length);
    fill_(piece, me + 1);
  }
  const int64_t allocs = cpu_allocator().stats().num_allocs;
  r.gather_parameters();
  EXPECT_EQ(cpu_allocator().stats().num_allocs, allocs);
  // Every parameter element holds the value of the rank owning its piece.
  const std::vector<double> got = to_double_vector(r.flat_params());
  std::vector<int> owner(got.size(), -1);
  int64_t begin = 0;
  for (int64_t len : r.bucket_lengths()) {
    for (int64_t i = 0; i < len; ++i) owner[begin + i] = static_cast<int>(i / (len / dp));
    begin += len;
  }
  for (const auto& seg : r.shard_segments())
    for (int64_t i = 0; i < seg.length; ++i) ASSERT_EQ(owner[seg.flat_offset + i], me);
  for (const auto& [name, p] : r.params()) {
    const std::vector<double> v = to_double_vector(p);
    const int64_t at = p.offset() - r.flat_params().offset();
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(v[i], owner[at + static_cast<int64_t>(i)] + 1) << name << " element " << i;
  }
}

// A group whose all-gathers run only when waited for (every other call goes
// straight through): a parameter read before its bucket's gather was waited
// for still holds its value from before the step, as it would on a GPU,
// where MPI's shared memory might deliver the values early anyway. Ranks
// wait in the same order (a forward pass's), so the deferred calls still
// meet.
class GatherOnWait final : public testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  dist::WorkPtr all_gather(const Tensor& input, Tensor& output) override {
    struct Deferred final : dist::Work {
      dist::ProcessGroupPtr group;
      Tensor in, out;
      bool done = false;
      void wait() override {
        if (!done) group->all_gather(in, out)->wait();
        done = true;
      }
      void wait_for(std::chrono::milliseconds) override { wait(); }
      bool is_completed() override { return done; }
    };
    auto w = std::make_shared<Deferred>();
    w->group = inner(), w->in = input, w->out = output;
    return w;
  }
};

// parallel.overlap_param_gather: the ZeRO-1 step leaves its all-gathers
// running and the next forward pass waits for each bucket when it reaches
// the bucket's parameters (the model's parameter fence). The losses are
// bitwise those of gathering at once; without the fences the forward pass
// reads parameters before their gather and the losses differ.
TEST(DataParallel, OverlappedParameterGathersAreWaitedForPartByPart) {
  const int me = g_world->rank();
  const dist::ProcessGroupPtr tp = dist::split_group(g_world, me, "tp");  // one rank each
  nn::GptConfig cfg;
  cfg.n_layer = 3, cfg.n_head = 2, cfg.d_model = 16, cfg.vocab_size = 32, cfg.seq_len = 8;
  auto run = [&](bool overlap, bool fences) {
    tp::TensorParallelGpt model(cfg, 5, tp, false);
    dp::GradientReducer r(model.named_parameters(), std::make_shared<GatherOnWait>(g_world), 1024.0,
                          true);
    EXPECT_GT(r.num_buckets(), 3);
    r.set_overlap_param_gather(overlap);
    if (fences) {
      model.set_parameter_fence(
          [&r](const nn::Module& part) { r.wait_gathered(part.parameters()); });
    }
    optim::AdamWOptions o;
    dp::ZeroAdamW opt(r, o);
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
      std::vector<int64_t> ids, targets;
      for (int i = 0; i < 16; ++i) {
        ids.push_back((i * 3 + step + 5 * me) % 32);
        targets.push_back((i * 7 + step + me) % 32);
      }
      Tensor loss = model.loss(from_vector(ids, {2, 8}, DType::I64),
                               from_vector(targets, {2, 8}, DType::I64));
      // Every part's fence ran: nothing is left pending after the forward.
      if (overlap && fences) {
        EXPECT_EQ(r.pending_gathers(), 0) << "step " << step;
      }
      autograd::backward({loss});
      r.finish();
      if (overlap && fences && step > 0) {
        EXPECT_EQ(r.gathers_waited_by_parts_last_step(), r.num_buckets()) << "step " << step;
      }
      opt.step(1e-2);
      EXPECT_EQ(r.pending_gathers(), overlap ? r.num_buckets() : 0) << "step " << step;
      r.zero_grad();
      losses.push_back(item(loss));
    }
    return losses;
  };
  const std::vector<double> eager = run(false, false);
  EXPECT_EQ(run(true, true), eager);
  EXPECT_NE(run(true, false), eager);
}

// ZeRO-1 reduce-scatters the gradients in place: each rank's averaged piece
// lands where the optimizer reads it, with no tensor allocated for it.
// Three ZeRO-1 steps of `zero` over the reducer `r` against one process's
// step (`step_plain`) of `plain` (the same parameters, in the same order):
// every rank gives both the same gradients (of `grads`' dtype; their
// average is each rank's, exactly), and after each step every parameter
// must be bit for bit one process's. `before(step)`, when given, runs
// before each step of both.
void expect_zero_steps_as_one_process(dp::GradientReducer& r, dp::ZeroAdamW& zero,
                                      std::vector<std::pair<std::string, Tensor>>& plain,
                                      const std::function<void()>& step_plain, DType grads,
                                      uint64_t seed, const std::function<void(int)>& before = {}) {
  for (int step = 0; step < 3; ++step) {
    if (before) before(step);
    for (size_t i = 0; i < plain.size(); ++i) {
      const Tensor g = cast(randn(plain[i].second.shape(), seed, 10 * step + i, 0.5), grads);
      plain[i].second.set_grad(clone(g));
      Tensor grad = r.params()[i].second.grad();
      copy_(grad, g);
    }
    r.finish();
    zero.step(1e-2, 0.8);
    r.wait_gathers();
    step_plain();
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(to_double_vector(r.params()[i].second), to_double_vector(plain[i].second))
          << plain[i].first << " step " << step;
    }
    r.zero_grad();
  }
}

// The reducer's parameters set to random values (drawn from `seed`), and
// one process's copies of them, by name in the reducer's order.
std::vector<std::pair<std::string, Tensor>> start_alike(dp::GradientReducer& r, uint64_t seed) {
  std::vector<std::pair<std::string, Tensor>> plain;
  for (size_t i = 0; i < r.params().size(); ++i) {
    const auto& [name, p] = r.params()[i];
    const Tensor start = randn(p.shape(), seed, i, 1.0);
    Tensor shared = p;  // (a view of the reducer's flat parameters)
    copy_(shared, start);
    Tensor mine = clone(start).detach();
    mine.set_requires_grad(true);
    plain.push_back({name, mine});
  }
  return plain;
}

// train.moment_precision bf16 under ZeRO-1: each rank's pieces keep bf16
// moments and step exactly as one process's AdamW with bf16 moments does
// (every rank's gradients alike, so their average is each one's, exactly).
TEST(DataParallel, ZeroOneBf16MomentsStepAsOneProcessDoes) {
  dp::GradientReducer r(small_params(), g_world, 256.0, true);
  ASSERT_GT(r.num_buckets(), 2);
  std::vector<std::pair<std::string, Tensor>> plain = start_alike(r, 61);
  optim::AdamWOptions o;
  o.weight_decay = 0.1;
  o.moment_dtype = DType::BF16;
  dp::ZeroAdamW zero(r, o);
  EXPECT_EQ(zero.m().dtype(), DType::BF16);
  EXPECT_EQ(zero.v().dtype(), DType::BF16);
  optim::AdamW adamw(plain, o);
  expect_zero_steps_as_one_process(
      r, zero, plain, [&] { adamw.step(1e-2, 0.8); }, DType::F32, 62);
}

// train.grad_precision bf16 under ZeRO-1 with Muon (and bf16 moments): bf16
// parameters with f32 masters, bf16 gradient buckets, Muon's matrices'
// update terms held in them and gathered, AdamW for the rest: each step
// bit for bit one process's Muon and AdamW on the same bf16 gradients.
TEST(DataParallel, ZeroOneBf16GradientsWithMuonStepAsOneProcessDoes) {
  std::vector<std::pair<std::string, Tensor>> half = small_params(), plain;
  for (size_t i = 0; i < half.size(); ++i) {
    auto& [name, p] = half[i];
    p = cast(randn(p.shape(), 71, i, 1.0), DType::BF16).detach();
    p.set_requires_grad(true);
    p.set_half_grad(true);
    Tensor mine = clone(p).detach();
    mine.set_requires_grad(true);
    mine.set_half_grad(true);
    plain.push_back({name, mine});
  }
  dp::GradientReducer r(half, g_world, 256.0, true);
  ASSERT_EQ(r.flat_grads().dtype(), DType::BF16);
  optim::AdamWOptions o;
  o.weight_decay = 0.1;
  o.moment_dtype = DType::BF16;
  optim::MuonOptions mo;
  mo.moment_dtype = DType::BF16;
  // The matrices "a" and "c" take Muon's update, the vectors AdamW's.
  dp::ZeroAdamW zero(r, o, {{"a", {"a", {}}}, {"c", {"c", {}}}}, mo);
  optim::Muon muon({{{"a", {}}, plain[0].second}, {{"c", {}}, plain[2].second}}, mo);
  optim::AdamW adamw({plain[1], plain[3]}, o);
  expect_zero_steps_as_one_process(
      r, zero, plain,
      [&] {
        muon.step(1e-2, 0.8);
        adamw.step(1e-2, 0.8);
      },
      DType::BF16, 72);
}

// ZeRO-1 with AdamW options `o` and Muon options `mo` ("c" Muon's, the
// others AdamW's) steps as one process's optimizers under them do; with
// `decays`, every optimizer's weight decay is set to decays[k] before step k.
void expect_zero_with_options_as_one_process(const optim::AdamWOptions& o,
                                             const optim::MuonOptions& mo, uint64_t seed,
                                             const std::vector<double>& decays = {}) {
  dp::GradientReducer r(small_params(), g_world, 256.0, true);
  std::vector<std::pair<std::string, Tensor>> plain = start_alike(r, seed);
  dp::ZeroAdamW zero(r, o, {{"c", {"c", {}}}}, mo);
  optim::Muon muon({{{"c", {}}, plain[2].second}}, mo);
  optim::AdamW adamw({plain[0], plain[1], plain[3]}, o);
  std::function<void(int)> before;
  if (!decays.empty()) {
    before = [&](int step) {
      const double wd = decays.at(static_cast<size_t>(step));
      zero.set_weight_decay(wd);
      muon.set_weight_decay(wd);
      adamw.set_weight_decay(wd);
    };
  }
  expect_zero_steps_as_one_process(
      r, zero, plain,
      [&] {
        muon.step(1e-2, 0.8);
        adamw.step(1e-2, 0.8);
      },
      DType::F32, seed + 1, before);
}

// train.no_weight_decay under ZeRO-1: the pieces of a matrix named in
// no_decay (one AdamW's, one Muon's) step undecayed, as one process's.
TEST(DataParallel, ZeroOneStepsNoDecayNamesAsOneProcessDoes) {
  optim::AdamWOptions o;
  o.weight_decay = 0.3;
  o.no_decay = {"a"};
  optim::MuonOptions mo;
  mo.weight_decay = 0.3;
  mo.no_decay = {"c"};
  expect_zero_with_options_as_one_process(o, mo, 101);
}

// train.weight_decay_schedule under ZeRO-1: a decay set before each step
// (0.05, 0.3, 0.6) steps the pieces of AdamW's matrix ("a") and Muon's
// ("c") as one process's optimizers under the same decays.
TEST(DataParallel, ZeroOneFollowsAChangingWeightDecayAsOneProcessDoes) {
  optim::AdamWOptions o;
  o.weight_decay = 0.05;
  optim::MuonOptions mo;
  mo.weight_decay = 0.05;
  expect_zero_with_options_as_one_process(o, mo, 105, {0.05, 0.3, 0.6});
  dp::GradientReducer r(small_params(), g_world, 256.0, true);
  dp::ZeroAdamW zero(r, o);
  testing::expect_error<ValueError>([&] { zero.set_weight_decay(INFINITY); },
                                    {"ZeroAdamW", "weight_decay", "inf", "finite"});
}

// train.lr_scale under ZeRO-1: the pieces of a parameter with a factor (two
// AdamW's, one Muon's) step at lr times it, as one process's.
TEST(DataParallel, ZeroOneStepsLrScaledNamesAsOneProcessDoes) {
  optim::AdamWOptions o;
  o.lr_scale = {{"a", 3.0}, {"b", 0.5}};
  optim::MuonOptions mo;
  mo.lr_scale = {{"c", 2.0}};
  expect_zero_with_options_as_one_process(o, mo, 103);
}

TEST(DataParallel, ZeroOneReduceScattersTheGradientsInPlace) {
  const int dp = g_world->size(), me = g_world->rank();
  dp::GradientReducer r(small_params(), g_world, 256.0, true);
  ASSERT_GT(r.num_buckets(), 2);
  // Rank m's gradient element i is (m + 1) * (i % 11 + 1): the average is
  // (dp + 1) / 2 times (i % 11 + 1).
  const int64_t n = r.flat_grads().numel();
  std::vector<double> mine(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mine[i] = (me + 1) * static_cast<double>(i % 11 + 1);
  copy_(r.flat_grads(), from_vector(mine, {n}));
  const int64_t allocs = cpu_allocator().stats().num_allocs;
  r.finish();  // the first call learns the (empty) step and reduces every bucket
  EXPECT_EQ(cpu_allocator().stats().num_allocs, allocs);
  const std::vector<double> got = to_double_vector(r.flat_grads());
  for (const auto& seg : r.shard_segments())
    for (int64_t i = seg.flat_offset; i < seg.flat_offset + seg.length; ++i)
      ASSERT_DOUBLE_EQ(got[i], (dp + 1) / 2.0 * static_cast<double>(i % 11 + 1)) << i;
}

TEST(DataParallel, NanOnOneRankSkipsTheStepOnAll) {
  testing::TempDir dir;
  Trainer t(config(dir, 0), g_world);
  if (g_world->rank() == g_world->size() - 1) t.inject_nan_at(1);
  StepMetrics a = t.step(0), b = t.step(1), c = t.step(2);
  EXPECT_FALSE(a.skipped);
  EXPECT_TRUE(b.skipped);
  EXPECT_FALSE(c.skipped);
  // The schedule did not advance over the skipped step.
  EXPECT_EQ(b.lr, c.lr);
  EXPECT_TRUE(std::isfinite(c.loss));
}

// A directory every rank sees (named by rank 0), removed at the end.
std::string shared_dir() {
  Tensor id = from_vector(std::vector<double>{static_cast<double>(::getpid())}, {1}, DType::F64);
  g_world->broadcast(id, 0)->wait();
  return (std::filesystem::temp_directory_path() /
          ("triad_ckpt_" + std::to_string(static_cast<int64_t>(item(id)))))
      .string();
}

// In f32 and in bf16 (whose f32 masters are ZeRO-1's pieces too: resuming
// refreshes the bf16 parameters from them and all-gathers them).
TEST(DataParallel, ZeroOneResumeIsBitwiseAcrossRanks) {
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::string root = shared_dir() + "_" + precision;
    testing::TempDir data;  // per-rank copy of the same tokens
    auto make = [&](int64_t steps, int64_t interval, const char* resume) {
      Config c = config(data, 1);
      c.train.steps = steps;
      c.train.precision = precision;
      c.output_dir = root + "/out";
      c.checkpoint.dir = root + "/ckpt";
      c.checkpoint.interval = interval;
      c.checkpoint.resume = resume;
      return c;
    };
    std::vector<StepMetrics> whole, rest;
    {
      Trainer t(make(6, 3, "never"), g_world);
      whole = t.run();
    }
    if (g_world->rank() == 0) std::ofstream(root + "/ckpt/latest", std::ios::trunc) << "step_3\n";
    g_world->barrier()->wait();
    {
      Trainer t(make(6, 0, "auto"), g_world);
      rest = t.run();
    }
    ASSERT_EQ(rest.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(rest[i].loss, whole[3 + i].loss) << "step " << rest[i].step;
      EXPECT_EQ(rest[i].grad_norm, whole[3 + i].grad_norm) << "step " << rest[i].step;
    }
    g_world->barrier()->wait();
    if (g_world->rank() == 0) std::filesystem::remove_all(root);
  }
}

// A checkpoint of this layout whose ZeRO-1 pieces are cut another way (as
// one written before the buffers' layout changed) is resharded, not read
// as if its flat state matched this run's: here each rank's segments are
// stored in reverse order, the same total length, so reading the flat
// tensors as they are would hand every parameter another one's moments.
TEST(DataParallel, ZeroOnePiecesCutAnotherWayAreResharded) {
  const std::string root = shared_dir();
  testing::TempDir data;
  auto make = [&](int64_t steps, int64_t interval, const std::string& dir) {
    Config c = config(data, 1);
    c.train.steps = steps;
    c.output_dir = root + "/out";
    c.checkpoint.dir = dir;
    c.checkpoint.interval = interval;
    c.checkpoint.resume = "auto";
    return c;
  };
  std::vector<StepMetrics> whole, rest;
  {
    Trainer t(make(6, 3, root + "/ckpt"), g_world);
    whole = t.run();
  }
  if (g_world->rank() == 0) std::ofstream(root + "/ckpt/latest", std::ios::trunc) << "step_3\n";
  g_world->barrier()->wait();
  const auto info = io::find_latest_checkpoint(root + "/ckpt");
  ASSERT_TRUE(info.has_value());
  const int rank = g_world->rank();
  io::RankState st = io::read_rank_state(*info, rank);
  RankPlacement pl = placement_from_json(st.metadata.at("placement"));
  ASSERT_GE(pl.zero_segments.size(), 2u);
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (const auto& seg : pl.zero_segments) starts.push_back(at), at += seg.length;
  for (const char* key : {"zero/m", "zero/v", "zero/master"}) {
    auto it = st.tensors.find(key);
    if (it == st.tensors.end()) continue;
    std::vector<Tensor> pieces;
    for (size_t i = pl.zero_segments.size(); i-- > 0;)
      pieces.push_back(narrow(it->second, 0, starts[i], pl.zero_segments[i].length));
    it->second = concat(pieces, 0).detach();
  }
  std::reverse(pl.zero_segments.begin(), pl.zero_segments.end());
  st.metadata["placement"] = placement_to_json(pl);
  const std::string moved = root + "/moved";
  io::write_rank_state(io::checkpoint_staging_dir(moved, 3), rank, st.tensors, st.metadata);
  g_world->barrier()->wait();
  if (rank == 0) io::commit_checkpoint(moved, 3, g_world->size(), info->layout, "", 1);
  g_world->barrier()->wait();
  {
    Trainer t(make(6, 0, moved), g_world);
    rest = t.run();
  }
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(rest[i].loss, whole[3 + i].loss) << "step " << rest[i].step;
  g_world->barrier()->wait();
  if (rank == 0) std::filesystem::remove_all(root);
}

// trace.json's rows share one clock, whenever each rank started: each
// rank's row used to start at its own trainer's construction, so a rank
// that started later had its passes drawn early (here rank r starts 150 ms
// after rank r-1). On a pipeline of every rank, stage s can only run
// microbatch i's forward once stage s-1's has ended (and stage s-1 its
// backward once stage s's has), which the merged trace must show. (This
// file holds the trainer's multi-process tests.)
TEST(TrainerTrace, EveryRanksRowIsOnOneClock) {
  const int P = g_world->size();
  testing::TempDir dir;
  const Config c = four_layers(dir, "{pp: " + std::to_string(P) + "}", 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(150 * g_world->rank()));
  Trainer t(c, g_world);
  t.run();
  if (g_world->rank() != 0) return;
  std::ifstream in(dir.file("out/trace.json"));
  const nlohmann::json trace = nlohmann::json::parse(in);
  // [rank][name]: the start and end of each occurrence (one a step), in µs.
  std::vector<std::map<std::string, std::vector<std::pair<double, double>>>> at(
      static_cast<size_t>(P));
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"];
    at.at(e["pid"].get<size_t>())[e["name"]].push_back({ts, ts + e["dur"].get<double>()});
  }
  int checked = 0;
  for (int s = 1; s < P; ++s) {
    for (int i = 0; i < 8; ++i) {  // (8 micro-batches a step)
      for (const char kind : {'F', 'B'}) {
        const std::string name = kind + std::to_string(i);
        const auto& later = at[static_cast<size_t>(kind == 'F' ? s : s - 1)][name];
        const auto& earlier = at[static_cast<size_t>(kind == 'F' ? s - 1 : s)][name];
        ASSERT_EQ(later.size(), 2u) << name << " on stage " << s;
        ASSERT_EQ(earlier.size(), 2u) << name << " on stage " << s;
        for (size_t step = 0; step < 2; ++step) {
          EXPECT_GE(later[step].first, earlier[step].second - 1.0)
              << name << " of step " << step + 1 << " between stages " << s - 1 << " and " << s;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 32 * (P - 1));
}

}  // namespace
}  // namespace triad::train

int main(int argc, char** argv) {
  return triad::testing::run_mpi_tests(
      argc, argv, [](const triad::dist::ProcessGroupPtr& w) { triad::train::g_world = w; },
      [] { triad::train::g_world.reset(); });
}
