#include "triad/plan/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "triad/autograd/engine.h"
#include "triad/core/allocator.h"
#include "triad/core/error.h"
#include "triad/io/hf_export.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"
#include "triad/parallel/pipeline/stage_balance.h"
#include "triad/plan/model_spec.h"
#include "triad/plan/planner.h"

namespace triad::plan {
namespace {

ClusterSpec selene() {
  return load_cluster(std::string(TRIAD_SOURCE_DIR) + "/configs/clusters/dgx_a100_selene.yaml");
}

nn::GptConfig gpt(int64_t l, int64_t a, int64_t h) {
  nn::GptConfig m;
  m.n_layer = l;
  m.n_head = a;
  m.d_model = h;
  m.vocab_size = 51200;
  m.seq_len = 2048;
  return m;
}

ParallelConfig layout(int tp, int pp, int dp, int mb, Recompute rc = Recompute::Full) {
  ParallelConfig p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = mb;
  p.recompute = rc;
  return p;
}

// check_config refuses `p` with a ConfigError whose message holds `fragment`.
void expect_plan_config_error(const nn::GptConfig& m, const ClusterSpec& c, int gpus,
                              int global_batch, const ParallelConfig& p,
                              const std::string& fragment) {
  try {
    check_config(m, c, gpus, global_batch, p);
    ADD_FAILURE() << "expected ConfigError with '" << fragment << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// LLaMA's SwiGLU at F = 8h/3 has GPT-2's MLP parameters (3hF = 8h^2), FLOPs
// and activations (2(2F + F)/h = 16 of Korthikanti's sbh), so it is priced
// the same; at F = 4h it costs more on every count, and rotary embeddings
// drop only the position table.
TEST(CostModel, PricesTheMlpItIsGiven) {
  const ClusterSpec c = selene();
  const ParallelConfig p = layout(2, 2, 8, 2, Recompute::None);
  const nn::GptConfig gelu = gpt(8, 16, 1536);
  nn::GptConfig llama = gelu, wide = gelu, rope = gelu;
  llama.activation = wide.activation = nn::Activation::SwiGlu;
  llama.ffn_hidden_size = 4096;  // 8h/3
  wide.ffn_hidden_size = 4 * 1536;
  rope.position_embedding = nn::PositionEmbedding::Rotary;
  const Estimate g = estimate(gelu, c, 32, 64, p), l = estimate(llama, c, 32, 64, p),
                 w = estimate(wide, c, 32, 64, p), r = estimate(rope, c, 32, 64, p);
  EXPECT_NEAR(l.model_flops_per_step, g.model_flops_per_step, 1e-9 * g.model_flops_per_step);
  EXPECT_NEAR(l.step_time, g.step_time, 0.01 * g.step_time);
  EXPECT_NEAR(l.activation_bytes, g.activation_bytes, 1e-6 * g.activation_bytes);
  EXPECT_NEAR(l.weights_bytes, g.weights_bytes, 1e-3 * g.weights_bytes);
  // F = 4h: the MLP has 12h^2 weights instead of 8h^2.
  const double h = 1536;
  EXPECT_NEAR(w.model_flops_per_step - g.model_flops_per_step,
              64.0 * 2048 * 8 * 3 * 2 * (4 * h * h), 1e-6 * g.model_flops_per_step);
  EXPECT_GT(w.step_time, 1.1 * g.step_time);
  EXPECT_GT(w.activation_bytes, 1.05 * g.activation_bytes);
  // 4 layers a stage, split over tp 2, at 2 bytes: (h + 1) 4h more each.
  EXPECT_NEAR(w.weights_bytes - g.weights_bytes, 2.0 * 4 * (h + 1) * 4 * h / 2, 1.0);
  EXPECT_NEAR(g.weights_bytes - r.weights_bytes, 2.0 * 2048 * 1536, 1.0);
  // Without linear biases: 4h + 4h + h fewer parameters a layer, 4 layers a
  // stage split over tp 2, 2 bytes each.
  nn::GptConfig nobias = gelu;
  nobias.linear_bias = false;
  EXPECT_NEAR(g.weights_bytes - estimate(nobias, c, 32, 64, p).weights_bytes, 2.0 * 4 * 9 * h / 2,
              1.0);
  // Squared ReLU (relu2): GPT-2's weights and FLOPs, and its activations
  // (it keeps its input alone, as GELU does), but two elementwise passes
  // cost time.
  nn::GptConfig relu2 = gelu;
  relu2.activation = nn::Activation::Relu2;
  const Estimate q = estimate(relu2, c, 32, 64, p);
  EXPECT_DOUBLE_EQ(q.model_flops_per_step, g.model_flops_per_step);
  EXPECT_DOUBLE_EQ(q.weights_bytes, g.weights_bytes);
  EXPECT_DOUBLE_EQ(q.activation_bytes, g.activation_bytes);
  EXPECT_GT(q.step_time, g.step_time);
}

// model.mla (DeepSeek-V3's latent attention), read from a model section as
// the trainer reads it: its FLOPs are the model's own count, its
// up-projections and c_proj split over tp while the down-projections and
// their norms stay whole on every rank (in weights, and in the activations
// the latents leave), and it costs time as its six products do.
TEST(CostModel, PricesLatentAttention) {
  const ClusterSpec c = selene();
  const std::string base =
      "n_layer: 8\nn_head: 16\nd_model: 1536\nvocab_size: 51200\nseq_len: 2048\n"
      "position_embedding: rope\nactivation: swiglu\nffn_hidden_size: 4096\n"
      "normalization: rmsnorm\nlinear_bias: false\n";
  const nn::GptConfig dense = parse_model_spec(base);
  const nn::GptConfig mla = parse_model_spec(
      base +
      "mla: {kv_lora_rank: 256, q_lora_rank: 512, qk_nope_head_dim: 64, qk_rope_head_dim: 32, "
      "v_head_dim: 64}\n");
  ASSERT_TRUE(mla.latent_attention());
  for (const Recompute rc : {Recompute::None, Recompute::Full}) {
    const ParallelConfig one = layout(1, 2, 16, 2, rc), two = layout(2, 2, 8, 2, rc);
    const Estimate e1 = estimate(mla, c, 32, 64, one), e2 = estimate(mla, c, 32, 64, two);
    EXPECT_DOUBLE_EQ(e1.model_flops_per_step, mla.training_flops(64, rc == Recompute::Full));
    // Per stage of 4 layers, in 2 bytes: each layer's whole parameters at
    // tp 1; at tp 2 half of them, plus half again of the down-projections
    // and their norms, which every rank holds whole.
    const double h = 1536, whole = h * 512 + 512 + h * (256 + 32) + 256;
    const double block = static_cast<double>(mla.block_parameters(1));
    EXPECT_NEAR(e1.weights_bytes - e2.weights_bytes,
                2.0 * 4 * (block / 2 - whole / 2) + 2.0 * 51200 * h / 2, 1.0);
  }
  // The six products and narrower attention cost less than c_attn here
  // (the latents are narrow), and the padded heads' attention as much as
  // their width says; both keep the activations in the same range.
  const ParallelConfig p = layout(2, 2, 8, 2, Recompute::None);
  const Estimate d = estimate(dense, c, 32, 64, p), m = estimate(mla, c, 32, 64, p);
  EXPECT_LT(mla.attention_weights(), dense.attention_weights());
  EXPECT_GT(m.step_time, 0.5 * d.step_time);
  EXPECT_LT(m.step_time, 1.5 * d.step_time);
  EXPECT_GT(m.activation_bytes, d.activation_bytes);  // the latents, the wider fused heads
}

// model.lora: the weights are frozen and the adapters train. The weights
// still take their memory; gradients, AdamW's state, the data-parallel
// reduction and the optimizer step shrink to the adapters' share, and
// backward loses the frozen layers' (and head's) weight-gradient GEMMs.
// Read from a model section like the trainer's.
TEST(CostModel, PricesLoraAdaptersOnFrozenWeights) {
  const ClusterSpec c = selene();
  const nn::GptConfig full = gpt(8, 16, 1536);
  const nn::GptConfig lora = parse_model_spec(
      "n_layer: 8\nn_head: 16\nd_model: 1536\nvocab_size: 51200\nseq_len: 2048\n"
      "lora: {rank: 16, alpha: 32}\n");
  EXPECT_EQ(lora.lora.rank, 16);
  EXPECT_EQ(lora.lora.targets, nn::GptConfig::lora_layers());
  const ParallelConfig p = layout(2, 2, 8, 2, Recompute::None);
  const Estimate f = estimate(full, c, 32, 64, p), l = estimate(lora, c, 32, 64, p);
  EXPECT_NEAR(l.weights_bytes, f.weights_bytes, 1e-3 * f.weights_bytes);
  EXPECT_LT(l.gradient_bytes, 0.02 * f.gradient_bytes);
  EXPECT_LT(l.optimizer_bytes, 0.02 * f.optimizer_bytes);
  EXPECT_GT(l.gradient_bytes, 0.0);
  EXPECT_LT(l.dp_comm_time, 0.1 * f.dp_comm_time + 1e-6);
  EXPECT_LT(l.optimizer_time, 0.02 * f.optimizer_time);
  // Forward about as before (the adapters' thin products on top), backward
  // without the weight gradients' GEMMs.
  EXPECT_LT(l.step_time, 0.9 * f.step_time);
  EXPECT_GT(l.step_time, 0.5 * f.step_time);
  EXPECT_NEAR(l.activation_bytes, f.activation_bytes, 1e-6 * f.activation_bytes);
  nn::GptConfig attn = lora;
  attn.lora.targets = {"attn.c_attn", "attn.c_proj"};
  // Adapters on the attention alone: fewer thin products, and the MLP's
  // weights are as frozen as with adapters on them (no weight-gradient
  // GEMMs either way).
  const Estimate a = estimate(attn, c, 32, 64, p);
  EXPECT_LT(a.step_time, l.step_time);
  EXPECT_LT(a.gradient_bytes, l.gradient_bytes);
  EXPECT_THROW(parse_model_spec("n_layer: 2\nn_head: 2\nd_model: 16\nvocab_size: 32\n"
                                "seq_len: 8\nlora: {rank: 4, targets: [attn.qkv]}\n"),
               ConfigError);
}

// train.freeze (ParallelConfig::frozen): frozen parameters have no
// gradient, optimizer state or share of the reduction, a frozen weight no
// weight-gradient GEMM, and leading layers with nothing before them
// training no backward pass and no activations kept for one.
TEST(CostModel, PricesFrozenParameters) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(8, 16, 1536);
  const ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
  const Estimate full = estimate(m, c, 32, 64, p);
  // The tables and the first half of the layers.
  ParallelConfig bottom = p;
  double all = 0, kept = 0;
  for (const auto& [name, shape] : nn::gpt_parameter_shapes(m)) {
    const double n = static_cast<double>(numel(shape));
    all += n;
    const bool early = name.size() > 2 && name[0] == 'h' && name[2] < '4';
    if (name == "wte.weight" || name == "wpe.weight" || early) {
      bottom.frozen.insert(name);
    } else {
      kept += n;
    }
  }
  EXPECT_EQ(bottom.frozen.size(), 2u + 4u * 12u);
  const Estimate b = estimate(m, c, 32, 64, bottom);
  EXPECT_NEAR(b.gradient_bytes, full.gradient_bytes * kept / all, 1e-9 * full.gradient_bytes);
  EXPECT_NEAR(b.optimizer_bytes, full.optimizer_bytes * kept / all, 1e-9 * full.optimizer_bytes);
  EXPECT_LT(b.optimizer_time, 0.75 * full.optimizer_time);
  EXPECT_DOUBLE_EQ(b.weights_bytes, full.weights_bytes);
  // Four of the eight layers keep activations: full's are the logits and 8
  // layers', these the logits and 4 layers'.
  const double logits = 2.0 * 2048 * 51200 / 2 * 2;
  EXPECT_NEAR(full.activation_bytes - b.activation_bytes, b.activation_bytes - logits,
              1e-9 * full.activation_bytes);
  // Eight forwards and four backwards against eight of each (a backward
  // about twice a forward), the head's on both.
  EXPECT_LT(b.compute_time, 0.75 * full.compute_time);
  EXPECT_GT(b.compute_time, 0.55 * full.compute_time);

  // The MLP's weights in every layer: every backward runs, less the MLP's
  // weight-gradient GEMMs; every activation is kept.
  ParallelConfig mlp = p;
  for (int64_t i = 0; i < m.n_layer; ++i) {
    mlp.frozen.insert("h." + std::to_string(i) + ".mlp.c_fc.weight");
    mlp.frozen.insert("h." + std::to_string(i) + ".mlp.c_proj.weight");
  }
  const Estimate e = estimate(m, c, 32, 64, mlp);
  EXPECT_LT(e.compute_time, 0.95 * full.compute_time);
  EXPECT_GT(e.compute_time, b.compute_time);
  EXPECT_DOUBLE_EQ(e.activation_bytes, full.activation_bytes);
  // Freezing only the last layer's MLP leaves every earlier backward.
  ParallelConfig last = p;
  last.frozen = {"h.7.mlp.c_fc.weight"};
  EXPECT_LT(estimate(m, c, 32, 64, last).compute_time, full.compute_time);
  EXPECT_GT(estimate(m, c, 32, 64, last).compute_time, e.compute_time);

  ParallelConfig bad = p;
  bad.frozen = {"h.9.mlp.c_fc.weight"};
  try {
    estimate(m, c, 32, 64, bad);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("'h.9.mlp.c_fc.weight' is not a parameter"),
              std::string::npos)
        << err.what();
  }
}

// train.optimizer muon: the blocks' matrices keep one moment (8 bytes with
// the master, against AdamW's 12), and the step pays Newton-Schulz's GEMMs:
// the stage's matrices shared out over the tp ranks (5 x (4 a^2 b + 2 a^3)
// flops for an a x b block, a <= b), a dp-th of them under ZeRO-1, sixteen
// times slower in f32; the updates' TP exchange and ZeRO-1's dp gather
// cost time.
TEST(CostModel, PricesMuon) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(8, 16, 1536);
  const ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
  const Estimate adamw = estimate(m, c, 32, 64, p);
  ParallelConfig mp = p;
  mp.muon = true;
  const Estimate muon = estimate(m, c, 32, 64, mp);
  double hidden = 0, all = 0;
  for (const auto& [name, shape] : nn::gpt_parameter_shapes(m)) {
    all += static_cast<double>(numel(shape));
    if (nn::is_hidden_matrix(name, shape)) hidden += static_cast<double>(numel(shape));
  }
  EXPECT_NEAR(muon.optimizer_bytes, adamw.optimizer_bytes * (12.0 - 4.0 * hidden / all) / 12.0,
              1e-9 * adamw.optimizer_bytes);
  EXPECT_DOUBLE_EQ(muon.pipeline_time, adamw.pipeline_time);
  // GPT-2's blocks: c_attn 3 x (1536 x 1536), c_proj 1536 x 1536, c_fc
  // 6144 x 1536, its c_proj 1536 x 6144.
  const double a = 1536, ns = [&] {
    auto f = [](double x, double y) { return 5.0 * (4.0 * x * x * y + 2.0 * x * x * x); };
    return 8.0 * (4.0 * f(a, a) + 2.0 * f(a, 4 * a)) / 2;  // (over tp 2)
  }();
  const double rate = c.peak_flops * c.gemm_efficiency;
  const double extra = muon.optimizer_time - adamw.optimizer_time;
  EXPECT_GT(extra, ns / rate);
  EXPECT_LT(extra, ns / rate + 0.1 * ns / rate + 0.01);
  ParallelConfig f32 = mp;
  f32.muon_ns_fp32 = true;
  EXPECT_NEAR(estimate(m, c, 32, 64, f32).optimizer_time - adamw.optimizer_time - extra,
              15.0 * ns / rate, 1e-9 * ns / rate);
  // ZeRO-1 over 16 replicas: a sixteenth of the matrices, and the updates'
  // all-gather over dp.
  ParallelConfig z = mp, za = p;
  z.zero1 = za.zero1 = true;
  const Estimate zm = estimate(m, c, 32, 64, z), zadam = estimate(m, c, 32, 64, za);
  EXPECT_LT(zm.optimizer_time - zadam.optimizer_time, extra / 8);
  EXPECT_GT(zm.dp_comm_time, zadam.dp_comm_time);
  EXPECT_NE(muon.config.str().find(" muon"), std::string::npos);
}

// train.moment_precision bf16: AdamW's two moments and Muon's momentum in 2
// bytes each beside the f32 master (8 bytes a parameter, not 12; ZeRO-1
// shards them as ever), and a step streaming 22 bytes a parameter, not 30.
TEST(CostModel, PricesBf16Moments) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(8, 16, 1536);
  for (const bool zero : {false, true}) {
    for (const bool muon : {false, true}) {
      SCOPED_TRACE(std::string(zero ? "zero1" : "") + (muon ? " muon" : ""));
      ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
      p.zero1 = zero;
      p.muon = muon;
      ParallelConfig b = p;
      b.bf16_moments = true;
      const Estimate f32 = estimate(m, c, 32, 64, p), bf16 = estimate(m, c, 32, 64, b);
      double hidden = 0, all = 0;
      for (const auto& [name, shape] : nn::gpt_parameter_shapes(m)) {
        all += static_cast<double>(numel(shape));
        if (nn::is_hidden_matrix(name, shape)) hidden += static_cast<double>(numel(shape));
      }
      const double share = muon ? hidden / all : 0.0;
      EXPECT_NEAR(bf16.optimizer_bytes / f32.optimizer_bytes,
                  (4.0 + 2.0 * (2.0 - share)) / (4.0 + 4.0 * (2.0 - share)), 1e-9);
      EXPECT_NEAR(f32.memory_bytes - bf16.memory_bytes, f32.optimizer_bytes - bf16.optimizer_bytes,
                  1e-6 * f32.memory_bytes);
      EXPECT_LT(bf16.optimizer_time, f32.optimizer_time);
      EXPECT_DOUBLE_EQ(bf16.pipeline_time, f32.pipeline_time);
      EXPECT_NE(bf16.config.str().find(" moments=bf16"), std::string::npos);
      EXPECT_EQ(f32.config.str().find("moments"), std::string::npos);
    }
  }
  // AdamW's streamed bytes: 22 for 30.
  ParallelConfig p = layout(2, 1, 16, 2, Recompute::None), b = p;
  b.bf16_moments = true;
  const Estimate f32 = estimate(m, c, 32, 64, p), bf16 = estimate(m, c, 32, 64, b);
  EXPECT_NEAR(bf16.optimizer_time / f32.optimizer_time, 22.0 / 30.0, 1e-9);
}

// train.ema_decay: an f32 average of every weight the rank trains, ZeRO-1
// or not (4 bytes a parameter: twice the bf16 weights' bytes), and 10 bytes
// a parameter more streamed by the step.
TEST(CostModel, PricesTheWeightsAverage) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(8, 16, 1536);
  for (const bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "zero1" : "");
    ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
    p.zero1 = zero;
    ParallelConfig a = p;
    a.ema = true;
    const Estimate plain = estimate(m, c, 32, 64, p), averaged = estimate(m, c, 32, 64, a);
    EXPECT_NEAR(averaged.optimizer_bytes - plain.optimizer_bytes, 2.0 * plain.weights_bytes,
                1e-6 * plain.weights_bytes);
    EXPECT_NEAR(averaged.memory_bytes - plain.memory_bytes, 2.0 * plain.weights_bytes,
                1e-6 * plain.weights_bytes);
    EXPECT_NEAR((averaged.optimizer_time - plain.optimizer_time) *
                    (c.memory_bandwidth * c.memory_efficiency),
                5.0 * plain.weights_bytes, 1e-6 * plain.weights_bytes);
    EXPECT_DOUBLE_EQ(averaged.pipeline_time, plain.pipeline_time);
    EXPECT_NE(averaged.config.str().find(" ema"), std::string::npos);
    EXPECT_EQ(plain.config.str().find(" ema"), std::string::npos);
  }
}

// model.lora.dropout keeps each adapted layer's dropped-out input for
// backward: 2h (the column-parallel layers' whole inputs) plus (h + 4h) / tp
// (the row-parallel ones' split inputs) per token and held layer, 2 bytes
// each; recomputing whole layers holds one layer's. The masking passes
// (memory-bound) cost some time, against a step that has no weight-gradient
// GEMMs left.
TEST(CostModel, PricesLoraDropoutsKeptInputs) {
  const ClusterSpec c = selene();
  nn::GptConfig lora = gpt(8, 16, 1536);
  lora.lora = {.rank = 16, .alpha = 32, .targets = nn::GptConfig::lora_layers()};
  nn::GptConfig dropped = lora;
  dropped.lora.dropout = 0.1;
  EXPECT_EQ(parse_model_spec("n_layer: 8\nn_head: 16\nd_model: 1536\nvocab_size: 51200\n"
                             "seq_len: 2048\nlora: {rank: 16, alpha: 32, dropout: 0.1}\n")
                .lora,
            dropped.lora);
  const double h = 1536, per_token = (2 * h + (h + 4 * h) / 2) * 2, tokens = 2.0 * 2048;
  for (Recompute rc : {Recompute::None, Recompute::Selective}) {
    const ParallelConfig p = layout(2, 2, 8, 2, rc);
    const Estimate a = estimate(lora, c, 32, 64, p), b = estimate(dropped, c, 32, 64, p);
    const double extra = b.activation_bytes - a.activation_bytes;
    // Some whole number of layers' worth (a stage of 4 holds several
    // micro-batches' activations under 1F1B).
    const double layers = extra / (tokens * per_token);
    EXPECT_GE(layers, 4.0 - 1e-9) << recompute_name(rc);
    EXPECT_NEAR(layers, std::round(layers), 1e-9) << recompute_name(rc);
    EXPECT_GT(b.step_time, a.step_time);
    EXPECT_LT(b.step_time, 1.08 * a.step_time);
  }
  const ParallelConfig full = layout(2, 2, 8, 2, Recompute::Full);
  EXPECT_NEAR(estimate(dropped, c, 32, 64, full).activation_bytes -
                  estimate(lora, c, 32, 64, full).activation_bytes,
              tokens * per_token, 1e-6 * tokens * per_token);
}

// model.lora on a mixture's experts (mlp.c_fc, mlp.c_proj): every expert
// carries adapters, so gradients, AdamW's state and the thin products grow
// over adapters on the attention alone; with dropout each token keeps the
// inputs of its k experts' adapters, c_fc's whole (k h) and c_proj's split
// by tp (k F / tp), per held layer.
TEST(CostModel, PricesLoraOnExperts) {
  const ClusterSpec c = selene();
  nn::GptConfig attn = gpt(8, 16, 1536);
  attn.activation = nn::Activation::SwiGlu;
  attn.moe = {.experts = 8, .top_k = 2, .ffn_hidden_size = 1536};
  attn.lora = {.rank = 16, .alpha = 32, .targets = {"attn.c_attn", "attn.c_proj"}};
  attn.validate();
  nn::GptConfig experts = attn;
  experts.lora.targets = {"mlp.c_fc", "mlp.c_proj"};
  const ParallelConfig p = layout(2, 2, 8, 2, Recompute::None);
  const Estimate a = estimate(attn, c, 32, 64, p), e = estimate(experts, c, 32, 64, p);
  EXPECT_GT(e.gradient_bytes, 2.0 * a.gradient_bytes);  // 8 experts' c_fc and c_proj a layer
  EXPECT_GT(e.optimizer_bytes, 2.0 * a.optimizer_bytes);
  EXPECT_GT(e.step_time, a.step_time);
  EXPECT_NEAR(e.weights_bytes, a.weights_bytes, 0.05 * a.weights_bytes);
  nn::GptConfig dropped = experts;
  dropped.lora.dropout = 0.1;
  const double h = 1536, k = 2, per_token = (k * h + k * 1536 / 2) * 2, tokens = 2.0 * 2048;
  const Estimate d = estimate(dropped, c, 32, 64, p);
  const double layers = (d.activation_bytes - e.activation_bytes) / (tokens * per_token);
  EXPECT_GE(layers, 4.0 - 1e-9);
  EXPECT_NEAR(layers, std::round(layers), 1e-9);
  EXPECT_GT(d.step_time, e.step_time);
}

// An untied head is a second (V, h) table: one process holds both, while a
// pipeline keeps one table a stage either way and no longer all-reduces
// the embedding's gradient between the first and last stage.
TEST(CostModel, PricesAnUntiedHead) {
  const ClusterSpec c = selene();
  const nn::GptConfig tied = gpt(8, 16, 1536);
  nn::GptConfig untied = tied;
  untied.tie_embeddings = false;
  const double table = static_cast<double>(tied.vocab_size) * 1536 / 2;  // split over tp 2
  const ParallelConfig one_stage = layout(2, 1, 16, 2, Recompute::None);
  EXPECT_NEAR(estimate(untied, c, 32, 64, one_stage).weights_bytes -
                  estimate(tied, c, 32, 64, one_stage).weights_bytes,
              2.0 * table, 1.0);
  const ParallelConfig stages = layout(2, 2, 8, 2, Recompute::None);
  const Estimate t = estimate(tied, c, 32, 64, stages), u = estimate(untied, c, 32, 64, stages);
  EXPECT_NEAR(u.weights_bytes, t.weights_bytes, 1.0);
  EXPECT_LT(u.step_time, t.step_time);
  EXPECT_NEAR(u.pipeline_time, t.pipeline_time, 1e-12);
}

// Grouped-query attention narrows c_attn from 3h to h + 2 * n_kv_head *
// head_dim: fewer weights, a faster QKV product, smaller q/k/v activations;
// the attention core (every query head's scores) is unchanged. The key/value
// heads split over tp like the query heads, or, fewer than the ranks, are
// shared: each rank holds (and computes) the one its query heads use.
TEST(CostModel, PricesGroupedQueryAttention) {
  const ClusterSpec c = selene();
  const nn::GptConfig mha = gpt(8, 16, 1536);
  nn::GptConfig gqa = mha;
  gqa.n_kv_head = 4;  // 16 query heads of 96 over 4 key/value heads
  // k's and v's rows (weight and bias) no longer there, split over tp 2.
  const double saved_per_layer = 2.0 * (1536 - 4 * 96) * (1536 + 1) / 2;
  const ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
  const Estimate m = estimate(mha, c, 32, 64, p), g = estimate(gqa, c, 32, 64, p);
  EXPECT_NEAR(m.weights_bytes - g.weights_bytes, 2.0 * 8 * saved_per_layer, 1.0);
  EXPECT_LT(g.step_time, m.step_time);
  EXPECT_LT(g.activation_bytes, m.activation_bytes);
  EXPECT_LT(g.model_flops_per_step, m.model_flops_per_step);
  // tp 8 over 4 key/value heads: each rank holds one whole head where an
  // even split would give it half of one (rank 0's q, k and v rows: 2 query
  // heads and 2 key/value heads of 96, weight and bias).
  const Estimate shared = estimate(gqa, c, 64, 64, layout(8, 1, 8, 1, Recompute::None));
  const Estimate split = estimate(mha, c, 64, 64, layout(8, 1, 8, 1, Recompute::None));
  const double qkv_rows_mha = 3.0 * 1536 / 8, qkv_rows_gqa = 1536.0 / 8 + 2 * 96;
  EXPECT_NEAR(split.weights_bytes - shared.weights_bytes,
              2.0 * 8 * (qkv_rows_mha - qkv_rows_gqa) * (1536 + 1), 1.0);
  nn::GptConfig odd = gpt(8, 12, 1536);
  odd.n_kv_head = 3;  // over tp 2: neither split nor shared evenly
  try {
    check_config(odd, c, 64, 64, layout(2, 1, 32, 1));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_kv_head (3) must be divisible by tp (2), or divide it"),
              std::string::npos)
        << e.what();
  }
}

// A sliding window shortens fused attention's work in proportion to the
// keys each query sees; one as long as the sequence changes nothing.
// Heads wider together than d_model (Qwen3's model.head_dim): c_attn and
// c_proj grow, and so do the attention core's products and the q, k, v and
// output activations; the estimate's weights are the model's own count.
TEST(CostModel, PricesHeadsOfTheirOwnWidth) {
  const ClusterSpec c = selene();
  const nn::GptConfig narrow = gpt(8, 16, 1536);  // heads of 96
  nn::GptConfig wide = narrow;
  wide.head_size = 128;  // 16 x 128 = 2048 wide
  wide.qk_norm = true;
  const ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
  const Estimate n = estimate(narrow, c, 32, 64, p), w = estimate(wide, c, 32, 64, p);
  // Per layer over tp 2: c_attn 3 * 512 rows more (weight and bias), c_proj
  // 512 columns more, the head norms (2 * 128; the planner divides a
  // layer's small replicated vectors by tp too).
  const double more_per_layer = (3.0 * 512 * (1536 + 1) + 512.0 * 1536 + 2 * 128) / 2;
  EXPECT_NEAR(w.weights_bytes - n.weights_bytes, 2.0 * 8 * more_per_layer, 1.0);
  EXPECT_GT(w.step_time, n.step_time);
  EXPECT_GT(w.activation_bytes, n.activation_bytes);
  EXPECT_NEAR(w.model_flops_per_step / n.model_flops_per_step,
              wide.training_flops(64) / narrow.training_flops(64), 1e-12);
  EXPECT_GT(w.model_flops_per_step, n.model_flops_per_step);
}

// An attention curve (efficiency.attention by the keys a query sees) prices
// each layer at its own length: the sequence's, or a sliding window's.
TEST(CostModel, PricesAttentionByTheKeysAQuerySees) {
  ClusterSpec curve = selene(), slow = selene(), fast = selene();
  curve.attention_curve = {{256, 0.2}, {2048, 0.5}};
  slow.attention_efficiency = 0.2;
  fast.attention_efficiency = 0.5;
  nn::GptConfig full = gpt(8, 16, 1536);  // s = 2048
  nn::GptConfig windowed = full, exempt = full;
  windowed.sliding_window = 256;
  exempt.sliding_window = 256;
  exempt.full_attention_layers = {0, 1, 2, 3, 4, 5, 6, 7};
  ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
  p.attention = Attention::Flash;
  const double at_full = estimate(full, curve, 32, 64, p).step_time;
  EXPECT_EQ(at_full, estimate(full, fast, 32, 64, p).step_time);
  EXPECT_LT(at_full, estimate(full, slow, 32, 64, p).step_time);
  EXPECT_EQ(estimate(windowed, curve, 32, 64, p).step_time,
            estimate(windowed, slow, 32, 64, p).step_time);
  EXPECT_EQ(estimate(exempt, curve, 32, 64, p).step_time, at_full);
}

TEST(CostModel, PricesASlidingWindow) {
  const ClusterSpec c = selene();
  const nn::GptConfig full = gpt(8, 16, 1536);  // s = 2048
  nn::GptConfig same = full, windowed = full;
  same.sliding_window = 2048;
  windowed.sliding_window = 256;
  ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
  p.attention = Attention::Flash;
  const Estimate f = estimate(full, c, 32, 64, p), w = estimate(windowed, c, 32, 64, p);
  EXPECT_EQ(estimate(same, c, 32, 64, p).step_time, f.step_time);
  EXPECT_LT(w.step_time, f.step_time);
  EXPECT_LT(w.gemm_time, f.gemm_time);
  EXPECT_EQ(w.memory_bytes, f.memory_bytes);
  // Layers exempt from the window (model.full_attention_layers) cost what
  // full attention does: every one exempt is no window, half of them half
  // way between.
  nn::GptConfig all_exempt = windowed, half = windowed;
  all_exempt.full_attention_layers = {0, 1, 2, 3, 4, 5, 6, 7};
  half.full_attention_layers = {1, 3, 5, 7};
  EXPECT_NEAR(estimate(all_exempt, c, 32, 64, p).step_time, f.step_time, 1e-12 * f.step_time);
  const Estimate h = estimate(half, c, 32, 64, p);
  EXPECT_NEAR(h.gemm_time, 0.5 * (w.gemm_time + f.gemm_time), 1e-9 * f.gemm_time);
  // The model FLOPs count the window's work too, so MFU does not credit the
  // scores a window skips: the windowed model does fewer FLOPs a step and
  // its MFU stays near the full model's (not above it by the time saved).
  EXPECT_LT(w.model_flops_per_step, f.model_flops_per_step);
  EXPECT_EQ(w.model_flops_per_step, windowed.training_flops(64));
  EXPECT_LT(w.mfu, 1.1 * f.mfu);
  // Gemma 3 1B's windows of 512 on a context of 32768: without counting
  // them, its MFU came out above 100%.
  const nn::GptConfig gemma3 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/gemma3_1b.yaml");
  ParallelConfig dp = layout(1, 1, 16, 1, Recompute::None);
  dp.attention = Attention::Flash;
  const Estimate g = estimate(gemma3, c, 16, 16, dp);
  EXPECT_GT(g.mfu, 0.0);
  EXPECT_LT(g.mfu, 1.0);
}

// Each stage is priced for the layers it holds: with the exempt layers all
// on one stage, that stage costs what a fully attending model's does and a
// windowed one's what a windowed model's does (a mean layer would make the
// two placements of the same layers cost the same), and stage balancing,
// which weighs the same layers, moves layers off the exempt stage.
TEST(CostModel, PricesEachStagesOwnWindows) {
  const ClusterSpec c = selene();
  nn::GptConfig windowed = gpt(8, 16, 1536);
  windowed.seq_len = 8192;
  windowed.vocab_size = 1024;  // a head too light to matter
  windowed.sliding_window = 256;
  nn::GptConfig front = windowed, back = windowed, full = windowed;
  front.full_attention_layers = {0, 1, 2, 3};
  back.full_attention_layers = {4, 5, 6, 7};
  full.full_attention_layers = {0, 1, 2, 3, 4, 5, 6, 7};
  ParallelConfig p = layout(2, 2, 2, 1, Recompute::None);
  p.attention = Attention::Flash;
  p.schedule = pipeline::ScheduleKind::OneFOneB;
  const Estimate f = estimate(front, c, 8, 16, p), b = estimate(back, c, 8, 16, p);
  const Estimate all = estimate(full, c, 8, 16, p), none = estimate(windowed, c, 8, 16, p);
  // The busiest rank holds the four exempt layers: a fully attending
  // model's stage without the head.
  EXPECT_NEAR(f.gemm_time, all.gemm_time, 1e-9 * all.gemm_time);
  EXPECT_NEAR(b.gemm_time, all.gemm_time, 1e-9 * all.gemm_time);
  EXPECT_GT(f.gemm_time, 1.5 * none.gemm_time);
  // ... and the last stage adds the head to them: back is the slower.
  EXPECT_GT(b.compute_time, f.compute_time);
  EXPECT_LT(f.compute_time, all.compute_time);
  EXPECT_GT(f.compute_time, none.compute_time);
  // Balanced for those windows, fewer exempt layers share a stage and a
  // microbatch's slowest stage is quicker than the even split's. So is the
  // step once there are enough microbatches (32) for that to outweigh the
  // fill and drain: with 8 the even split is slightly quicker, its light
  // stage's pass filling much of the bubble (the executor waits for a
  // receive where its payload is consumed) and its heavy stage holding
  // fewer parameters.
  ParallelConfig balanced = p;
  balanced.stage_layers = pipeline::balanced_stage_layers(front, 2, 1);
  ASSERT_LT(balanced.stage_layers[0], 4);
  const Estimate fb = estimate(front, c, 8, 16, balanced);
  EXPECT_LT(fb.compute_time, f.compute_time);
  const Estimate f_long = estimate(front, c, 8, 64, p),
                 fb_long = estimate(front, c, 8, 64, balanced);
  EXPECT_LT(fb_long.step_time, f_long.step_time);
}

// model.post_norms: two more norms a layer, each reading and writing the
// b*s*h activation (8 of the token-wise kernels' 22 bytes more) and keeping
// its input (4 sbh more, split only under sequence parallelism); the GEMMs
// are unchanged.
TEST(CostModel, PricesPostNorms) {
  const ClusterSpec c = selene();
  const nn::GptConfig plain = gpt(8, 16, 1536);
  nn::GptConfig sandwich = plain;
  sandwich.post_norms = true;
  for (const bool sp : {false, true}) {
    ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
    p.sequence_parallel = sp;
    const Estimate a = estimate(plain, c, 32, 64, p), b = estimate(sandwich, c, 32, 64, p);
    EXPECT_EQ(b.gemm_time, a.gemm_time);
    EXPECT_GT(b.memory_bound_time, a.memory_bound_time);
    const double sbh = 2.0 * 2048 * 1536;  // micro batch 2, s 2048, h 1536
    EXPECT_NEAR(b.activation_bytes - a.activation_bytes,
                b.peak_inflight * 8 * 4.0 * sbh / (sp ? 2 : 1), 1e-6 * a.activation_bytes);
  }
}

// model.parallel_residual reduces both sublayers' outputs at once: per
// layer and micro-batch, of the two all-reduces forward and two backward
// (4 AR), one forward fewer (3 AR); under sequence parallelism the eight
// all-gathers and reduce-scatters become six (two pairs priced as
// all-reduces, two alone, each a little over half an all-reduce through
// its latency). So the collectives eight more layers add cost 3/4 as much,
// or a little more (the embedding's and the head's are the same either
// way). The GEMMs are unchanged, and with dropout each sublayer reduces
// apart.
TEST(CostModel, PricesTheParallelResidualsSingleReduction) {
  const ClusterSpec c = selene();
  for (const bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sp" : "no sp");
    ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
    p.sequence_parallel = sp;
    double added[2];
    for (const bool parallel_residual : {false, true}) {
      nn::GptConfig shallow = gpt(8, 16, 1536), deep = gpt(16, 16, 1536);
      shallow.parallel_residual = deep.parallel_residual = parallel_residual;
      added[parallel_residual] =
          estimate(deep, c, 32, 64, p).tp_comm_time - estimate(shallow, c, 32, 64, p).tp_comm_time;
    }
    if (sp) {
      EXPECT_GT(added[1] / added[0], 0.75);
      EXPECT_LT(added[1] / added[0], 0.8);
    } else {
      EXPECT_NEAR(added[1] / added[0], 0.75, 1e-9);
    }
    const nn::GptConfig plain = gpt(8, 16, 1536);
    nn::GptConfig parallel = plain;
    parallel.parallel_residual = true;
    const Estimate a = estimate(plain, c, 32, 64, p), b = estimate(parallel, c, 32, 64, p);
    EXPECT_EQ(b.gemm_time, a.gemm_time);
    EXPECT_LT(b.tp_comm_time, a.tp_comm_time);
    nn::GptConfig dropped = parallel, sequential = plain;
    dropped.dropout = sequential.dropout = 0.1;
    EXPECT_DOUBLE_EQ(estimate(dropped, c, 32, 64, p).tp_comm_time,
                     estimate(sequential, c, 32, 64, p).tp_comm_time);
  }
}

// Gemma 2's soft-capped logits cost one more in-place pass over them
// before the loss: a longer step at the same GEMM time, the same model
// FLOPs and memory; capped attention scores cost nothing priced.
TEST(CostModel, PricesSoftCappedLogits) {
  const ClusterSpec c = selene();
  nn::GptConfig plain = gpt(8, 16, 1536);
  plain.vocab_size = 256000;  // Gemma's: the head's pass is worth seeing
  nn::GptConfig capped = plain;
  capped.final_logit_softcap = 30.0;
  capped.attn_logit_softcap = 50.0;
  const ParallelConfig p = layout(2, 1, 16, 2, Recompute::None);
  const Estimate a = estimate(plain, c, 32, 64, p), b = estimate(capped, c, 32, 64, p);
  EXPECT_GT(b.step_time, a.step_time);
  EXPECT_EQ(b.gemm_time, a.gemm_time);
  EXPECT_EQ(b.model_flops_per_step, a.model_flops_per_step);
  EXPECT_EQ(b.memory_bytes, a.memory_bytes);
  nn::GptConfig scores_only = plain;
  scores_only.attn_logit_softcap = 50.0;
  EXPECT_EQ(estimate(scores_only, c, 32, 64, p).step_time, a.step_time);
}

// The output z-loss rides in the loss's pass over the logits: no dearer a
// step where the vocabulary is whole on a rank (its gradient written with
// the loss) nor where it is split (the backward pass there anyway).
TEST(CostModel, AZLossCostsNoPassOverTheLogits) {
  const ClusterSpec c = selene();
  nn::GptConfig plain = gpt(8, 16, 1536);
  plain.vocab_size = 256000;
  nn::GptConfig z = plain;
  z.z_loss_coef = 1e-4;
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const ParallelConfig p = layout(tp, 1, 32 / tp, 2, Recompute::None);
    EXPECT_EQ(estimate(z, c, 32, 64, p).step_time, estimate(plain, c, 32, 64, p).step_time);
  }
}

// The two published PTD-P runs (Narayanan et al. 2021, Table 1) the cluster
// file is checked against: fp16, full recomputation, s = 2048, V = 51200.
TEST(CostModel, PredictsThePublishedPtdpRunsWithin15Percent) {
  const ClusterSpec c = selene();
  const Estimate small = estimate(gpt(24, 24, 2304), c, 32, 512, layout(1, 1, 32, 16));
  EXPECT_NEAR(small.tflops_per_gpu, 137.0, 0.15 * 137.0);
  const Estimate huge = estimate(gpt(128, 160, 25600), c, 3072, 3072, layout(8, 64, 6, 1));
  EXPECT_NEAR(huge.tflops_per_gpu, 163.0, 0.15 * 163.0);
  EXPECT_TRUE(small.fits);
  EXPECT_TRUE(huge.fits);
  // The big run's bubble is the simulated 1F1B one: (p-1)/m, slightly more
  // with the head on the last stage and communication.
  EXPECT_NEAR(huge.bubble_fraction, 63.0 / 512.0, 0.02);
}

// GPT-2 350M and 124M on one H200 as Triad ran them there (bf16, 16
// sequences of 1024 tokens, cuDNN's attention; docs/benchmarks.md,
// 2026-12-04, commit 37d9bf1): 80.47 ms and 30.47 ms a step. The H200 file's
// attention efficiency is that run's own attention kernels' rate; its GEMM
// and memory knobs are the A100's, nothing fitted to the step. The step
// within 5% (350M) and 8% (124M), and, for 350M, each part against the
// op profile's: its products (layers and head, without attention) took
// 51.5 ms, cuDNN's attention 13.4 and the memory-bound kernels about 13.4.
TEST(CostModel, PredictsGpt2sMeasuredStepsOnOneH200) {
  const ClusterSpec c =
      load_cluster(std::string(TRIAD_SOURCE_DIR) + "/configs/clusters/hgx_h200.yaml");
  ParallelConfig p = layout(1, 1, 1, 16, Recompute::None);
  p.attention = Attention::Flash;
  const nn::GptConfig m350 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/gpt2_350m.yaml");
  const Estimate e = estimate(m350, c, 1, 16, p);
  EXPECT_NEAR(e.step_time, 0.08047, 0.05 * 0.08047);
  // The attention core: 4 s h FLOPs a token a layer forward (half of them
  // under the causal mask), 2.5 times that backward.
  const double tokens = 16.0 * 1024, attention_flops = 3.5 * 0.5 * 4.0 * 1024 * 1024 * 24 * tokens;
  const double attention = attention_flops / (c.peak_flops * c.flash_attention_efficiency(1024));
  EXPECT_NEAR(attention, 0.0134, 0.1 * 0.0134);
  // The products, the head's among them: what the micro-batch computes
  // besides the memory-bound kernels, the attention core and the head's
  // cross entropy (its product's logits written, read and overwritten by
  // their gradient: three passes of 2 bytes).
  const double cross_entropy =
      3.0 * tokens * 50304 * 2.0 / (c.memory_bandwidth * c.memory_efficiency);
  EXPECT_NEAR(e.compute_time - e.memory_bound_time - attention - cross_entropy, 0.0515,
              0.05 * 0.0515);
  const nn::GptConfig m124 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/gpt2_124m.yaml");
  EXPECT_NEAR(estimate(m124, c, 1, 16, p).step_time, 0.03047, 0.08 * 0.03047);
}

// Nemotron-4 340B's last pretraining stage as its report gives it: 6144
// H100s (tp 8, pp 12 interleaved, dp 64), batches of 2304 sequences of
// 4096 tokens in bf16, 8.0 s a step at 41-42% MFU. Priced as Triad runs
// such a layout (flash attention, the DP and TP reductions overlapped,
// sequence parallelism, ZeRO-1; 8 chunks a rank, the report giving no
// count), with the H100 file's knobs, nothing fitted: within 15%, and it
// fits in 80 GB.
// Nemotron-4 340B on DGX H100s as NVIDIA lays it out: tp 8, pp stages of vpp
// chunks, dp replicas with ZeRO-1, micro-batch 1, sequence parallelism, no
// recomputation, interleaved 1F1B, fused attention, both overlaps.
struct Nemotron340b {
  nn::GptConfig model =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/nemotron4_340b.yaml");
  ClusterSpec cluster =
      load_cluster(std::string(TRIAD_SOURCE_DIR) + "/configs/clusters/dgx_h100.yaml");
  static ParallelConfig layout(int pp, int vpp, int dp) {
    ParallelConfig p = ::triad::plan::layout(8, pp, dp, 1, Recompute::None);
    p.vpp = vpp;
    p.schedule = pipeline::ScheduleKind::Interleaved;
    p.sequence_parallel = p.zero1 = p.overlap_dp = p.overlap_tp = true;
    p.attention = Attention::Flash;
    return p;
  }
};

TEST(CostModel, PredictsNemotron4_340bsPublishedStepWithin15Percent) {
  const Nemotron340b n;
  const Estimate e = estimate(n.model, n.cluster, 6144, 2304, Nemotron340b::layout(12, 8, 64));
  EXPECT_NEAR(e.step_time, 8.0, 0.15 * 8.0);
  EXPECT_TRUE(e.fits) << e.memory_bytes / 1e9 << " GB";
}

// NVIDIA's DGX Cloud benchmark of Nemotron-4 340B in bf16 (dgxc-benchmarking,
// NeMo 24.11) on 128 H100s: tp 8, pp 8, vpp 12, micro-batch 1, global batch
// 32 (dp 2), 4.61 s a step. NeMo's config (NeMo-Framework-Launcher's
// nemotron_340b.yaml) runs Megatron-core's distributed optimizer with
// bf16 gradients (`grad_sync_dtype: bf16`) and bf16 optimizer state
// (`dtype: bf16`), with no recomputation: so priced it fits the 80 GB, and
// with f32 gradients and moments it would not.
TEST(CostModel, FitsNemotron4_340bOn128H100sAsNeMoTrainsIt) {
  const Nemotron340b n;
  const nn::GptConfig& m = n.model;
  const ClusterSpec& c = n.cluster;
  const ParallelConfig p = Nemotron340b::layout(8, 12, 2);
  ParallelConfig nemo = p;
  nemo.bf16_grads = nemo.bf16_moments = true;
  const Estimate wide = estimate(m, c, 128, 32, p), e = estimate(m, c, 128, 32, nemo);
  EXPECT_NEAR(e.step_time, 4.61, 0.15 * 4.61);
  EXPECT_TRUE(e.fits) << e.memory_bytes / 1e9 << " GB";
  EXPECT_FALSE(wide.fits) << wide.memory_bytes / 1e9 << " GB";
  EXPECT_NEAR(e.gradient_bytes, wide.gradient_bytes / 2, 1.0);
  EXPECT_NEAR(e.optimizer_bytes, wide.optimizer_bytes * 8 / 12, 1.0);
  EXPECT_NE(e.config.str().find(" moments=bf16 grads=bf16"), std::string::npos) << e.config.str();
  // bf16 gradients: 2 bytes fewer read by the step.
  ParallelConfig g = p;
  g.bf16_grads = true;
  const Estimate grads = estimate(m, c, 128, 32, g);
  EXPECT_NEAR(grads.optimizer_time / wide.optimizer_time, 28.0 / 30.0, 1e-9);
  // And the data-parallel all-reduce carries bf16: half the bytes (its
  // time, not hidden behind backward here, about half).
  ParallelConfig exposed = g, exposed_wide = p;
  exposed.overlap_dp = exposed_wide.overlap_dp = exposed.zero1 = exposed_wide.zero1 = false;
  EXPECT_NEAR(estimate(m, c, 128, 32, exposed).dp_comm_time /
                  estimate(m, c, 128, 32, exposed_wide).dp_comm_time,
              0.5, 0.01);
}

TEST(CostModel, ModelFlopsFollowThePtdpFormula) {
  const nn::GptConfig m = gpt(24, 24, 2304);
  const double B = 512, s = 2048, l = 24, h = 2304, V = 51200;
  EXPECT_NEAR(ptdp_model_flops(m, 512, true),
              96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)), 1e3);
  EXPECT_NEAR(ptdp_model_flops(m, 512, false),
              72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)), 1e3);
}

TEST(CostModel, MemoryRespondsToRecomputeSequenceParallelAndZero) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(32, 32, 4096);
  auto with = [&](Recompute rc, bool sp, bool z) {
    ParallelConfig p = layout(4, 2, 4, 2, rc);
    p.sequence_parallel = sp;
    p.zero1 = z;
    return estimate(m, c, 32, 256, p);
  };
  const Estimate none = with(Recompute::None, false, false),
                 sel = with(Recompute::Selective, false, false),
                 full = with(Recompute::Full, false, false);
  EXPECT_GT(none.activation_bytes, sel.activation_bytes);
  EXPECT_GT(sel.activation_bytes, full.activation_bytes);
  // Recomputation costs time.
  EXPECT_LT(none.compute_time, sel.compute_time);
  EXPECT_LT(sel.compute_time, full.compute_time);
  const Estimate sp = with(Recompute::Selective, true, false);
  EXPECT_LT(sp.activation_bytes, sel.activation_bytes);
  const Estimate zero = with(Recompute::Selective, false, true);
  EXPECT_NEAR(zero.optimizer_bytes, sel.optimizer_bytes / 4, 1.0);  // dp = 4
  EXPECT_EQ(zero.weights_bytes, sel.weights_bytes);
}

// model.recompute_layers: the first N layers of each stage recompute, the
// others keep their activations, so time and memory fall between no
// recomputation and full; N at least a stage's layers is full
// recomputation, and model FLOPs count the recomputed share.
TEST(CostModel, RecomputingTheFirstLayersOfEachStageFallsBetweenNoneAndFull) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(32, 32, 4096);
  auto with = [&](Recompute rc, int layers) {
    ParallelConfig p = layout(4, 2, 4, 2, rc);  // 16 layers a stage
    p.recompute_layers = layers;
    return estimate(m, c, 32, 256, p);
  };
  const Estimate none = with(Recompute::None, 0), four = with(Recompute::Full, 4),
                 eight = with(Recompute::Full, 8), full = with(Recompute::Full, 0);
  EXPECT_GT(none.activation_bytes, four.activation_bytes);
  EXPECT_GT(four.activation_bytes, eight.activation_bytes);
  EXPECT_GT(eight.activation_bytes, full.activation_bytes);
  EXPECT_LT(none.compute_time, four.compute_time);
  EXPECT_LT(four.compute_time, eight.compute_time);
  EXPECT_LT(eight.compute_time, full.compute_time);
  // Half the layers recomputed: half full recomputation's extra time.
  EXPECT_NEAR(eight.compute_time - none.compute_time, (full.compute_time - none.compute_time) / 2,
              1e-9 * full.compute_time);
  EXPECT_DOUBLE_EQ(with(Recompute::Full, 16).step_time, full.step_time);
  EXPECT_DOUBLE_EQ(with(Recompute::Full, 40).activation_bytes, full.activation_bytes);
  EXPECT_NEAR(eight.model_flops_per_step,
              (none.model_flops_per_step + full.model_flops_per_step) / 2,
              1e-9 * full.model_flops_per_step);
  EXPECT_NE(eight.config.str().find("recompute=full recompute_layers=8 "), std::string::npos)
      << eight.config.str();
  EXPECT_NE(eight.json().find("\"recompute_layers\":8"), std::string::npos) << eight.json();
  ParallelConfig bad = layout(4, 2, 4, 2, Recompute::Selective);
  bad.recompute_layers = 2;
  expect_plan_config_error(m, c, 32, 256, bad, "recompute_layers (2) goes with recompute full");
}

// With overlap_tp and backward in one piece, the QKV and MLP-up layers'
// input-gradient collectives (and the head's) run during those layers'
// weight-gradient GEMMs. Zero-bubble schedules run B and W apart and hide
// none of it, as does the 2021 baseline: all else equal, their busiest
// rank's microbatch costs the layers' hidden time more, and the head's.
// Under sequence parallelism the collective is a reduce-scatter, half an
// all-reduce's bytes.
TEST(CostModel, TensorParallelInputGradientsHideBehindTheirWeightGradients) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(8, 32, 4096);
  ParallelConfig p = layout(8, 2, 1, 1, Recompute::None);
  p.schedule = pipeline::ScheduleKind::OneFOneB;
  const Estimate after = estimate(m, c, 16, 16, p);  // Megatron-LM's 2021 baseline
  p.overlap_tp = true;
  const Estimate whole = estimate(m, c, 16, 16, p);
  EXPECT_EQ(after.tp_comm_hidden_time, 0.0);
  p.schedule = pipeline::ScheduleKind::ZbH1;
  const Estimate split = estimate(m, c, 16, 16, p);
  EXPECT_GT(whole.tp_comm_hidden_time, 0.1 * whole.tp_comm_time);
  EXPECT_LE(whole.tp_comm_hidden_time, 0.5 * whole.tp_comm_time);  // forward's half never hides
  EXPECT_EQ(split.tp_comm_hidden_time, 0.0);
  EXPECT_DOUBLE_EQ(split.compute_time, after.compute_time);
  EXPECT_DOUBLE_EQ(split.tp_comm_time, whole.tp_comm_time);
  EXPECT_GT(split.compute_time - whole.compute_time, whole.tp_comm_hidden_time);
  EXPECT_LT(split.compute_time - whole.compute_time, 2.0 * whole.tp_comm_hidden_time);
  // At tp 2 the GEMMs outlast the collectives: backward's half of the
  // TP time hides whole, and under sequence parallelism about half as much.
  ParallelConfig q = layout(2, 2, 4, 1, Recompute::None);
  q.overlap_tp = true;
  const Estimate ar = estimate(m, c, 16, 16, q);
  q.sequence_parallel = true;
  const Estimate rs = estimate(m, c, 16, 16, q);
  EXPECT_NEAR(ar.tp_comm_hidden_time, 0.5 * ar.tp_comm_time, 1e-9 * ar.tp_comm_time);
  EXPECT_NEAR(rs.tp_comm_hidden_time, 0.5 * ar.tp_comm_hidden_time, 0.1 * ar.tp_comm_hidden_time);
  EXPECT_NE(whole.json().find("\"tp_comm_hidden_per_microbatch_s\""), std::string::npos);
}

// ZeRO-1's parameter all-gather follows the optimizer step; with
// overlap_param_gather (the trainer's default) it runs under the next
// step's first forward pass instead, and only what outlasts that pass is
// exposed. Without overlap_dp (Megatron-LM's 2021 baseline) nothing hides.
// Between pipeline stages on different nodes, tp 8 without sequence
// parallelism: scatter-gather sends an eighth of the activation over the
// network and all-gathers it over NVLink; without it the whole activation
// crosses. Sequence-parallel activations are split already.
TEST(CostModel, ScatterGatherSendsOneCopyBetweenStages) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(8, 32, 4096);
  ParallelConfig p = layout(8, 2, 1, 1, Recompute::None);
  const Estimate split = estimate(m, c, 16, 16, p);
  p.scatter_gather = false;
  const Estimate whole = estimate(m, c, 16, 16, p);
  EXPECT_GT(whole.p2p_time, 3.0 * split.p2p_time);
  EXPECT_GT(whole.step_time, split.step_time);
  p.sequence_parallel = true;
  const Estimate sp_off = estimate(m, c, 16, 16, p);
  p.scatter_gather = true;
  const Estimate sp_on = estimate(m, c, 16, 16, p);
  EXPECT_EQ(sp_off.p2p_time, sp_on.p2p_time);
  EXPECT_LT(sp_on.p2p_time, split.p2p_time);  // no all-gather after it
}

TEST(CostModel, ZeroOnesParameterGatherHidesBehindTheNextForward) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(8, 16, 1536);
  ParallelConfig p = layout(1, 1, 64, 1, Recompute::None);  // dp over 8 nodes
  p.zero1 = true;
  p.overlap_dp = true;
  ParallelConfig after = p;
  after.overlap_param_gather = false;
  const Estimate on = estimate(m, c, 64, 64, p), off = estimate(m, c, 64, 64, after);
  EXPECT_GT(off.dp_comm_time, 0.0);
  EXPECT_LT(on.dp_comm_time, off.dp_comm_time);
  EXPECT_LT(on.step_time, off.step_time);
  // Only the hidden all-gather differs: the step is no more than it faster.
  EXPECT_NEAR(off.step_time - on.step_time, off.dp_comm_time - on.dp_comm_time,
              1e-12 * off.step_time);
  p.overlap_dp = after.overlap_dp = false;
  EXPECT_EQ(estimate(m, c, 64, 64, p).step_time, estimate(m, c, 64, 64, after).step_time);
}

TEST(CostModel, InterleavingCutsTheBubbleAndSmallMicrobatchesLoseGemmEfficiency) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(32, 32, 4096);
  ParallelConfig a = layout(8, 4, 1, 1, Recompute::Selective);
  ParallelConfig b = a;
  b.vpp = 2;
  b.schedule = pipeline::ScheduleKind::Interleaved;
  const Estimate one = estimate(m, c, 32, 16, a), two = estimate(m, c, 32, 16, b);
  EXPECT_LT(two.bubble_fraction, one.bubble_fraction);
  ParallelConfig z = a;
  z.schedule = pipeline::ScheduleKind::ZbH1;
  EXPECT_LT(estimate(m, c, 32, 16, z).bubble_fraction, one.bubble_fraction);
  // zb-auto searches its order for the predicted costs: never slower than
  // ZB-H1 or 1F1B, within 1F1B's memory by default and in a larger budget
  // when given one (ZB-H2's 2p - 1), which it uses.
  ParallelConfig za = a;
  za.schedule = pipeline::ScheduleKind::ZbAuto;
  const Estimate zb_auto = estimate(m, c, 32, 16, za), zb_h1 = estimate(m, c, 32, 16, z);
  EXPECT_LE(zb_auto.step_time, zb_h1.step_time * (1 + 1e-12));
  EXPECT_LE(zb_auto.step_time, one.step_time * (1 + 1e-12));
  EXPECT_LE(zb_auto.peak_inflight, a.pp);
  za.zb_max_in_flight = 2 * a.pp - 1;
  EXPECT_EQ(za.str(),
            "tp=8 pp=4 dp=1 vpp=1 mb=1 recompute=selective sp=off zero1=off zb-auto "
            "max-in-flight=7");
  const Estimate zb_h2 = estimate(m, c, 32, 16, za);
  EXPECT_LE(zb_h2.step_time, zb_auto.step_time * (1 + 1e-12));
  EXPECT_LE(zb_h2.peak_inflight, 2 * a.pp - 1);
  // Per token, a micro batch of 1 x 2048 tokens over tp = 8 runs its GEMMs
  // less efficiently than 8 x 2048.
  const Estimate mb1 = estimate(m, c, 32, 64, layout(8, 1, 4, 1, Recompute::None));
  const Estimate mb8 = estimate(m, c, 32, 64, layout(8, 1, 4, 8, Recompute::None));
  EXPECT_GT(mb1.gemm_time * 8, mb8.gemm_time * 1.01);
}

// ZB-V: two half-size chunks per rank in a V. The same activation memory as
// 1F1B (2p chunk activations of L / 2p layers), a smaller bubble than
// ZB-H1's (half its warm-up with equal F, B and W; here W is lighter and
// twice as many messages cross between ranks: 22% less), and rank 0 holds both ends of the model:
// one tied table (no gradient to sum across stages) or the table and an untied head.
TEST(CostModel, ZbVCutsZbH1sBubbleInTheSameMemory) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(32, 32, 4096);
  const ParallelConfig ofob = layout(8, 4, 1, 1, Recompute::Selective);
  ParallelConfig h1 = ofob, v = ofob;
  h1.schedule = pipeline::ScheduleKind::ZbH1;
  v.schedule = pipeline::ScheduleKind::ZbV;
  v.vpp = 2;
  const Estimate a = estimate(m, c, 32, 16, ofob), zb = estimate(m, c, 32, 16, h1),
                 zv = estimate(m, c, 32, 16, v);
  EXPECT_LT(zv.bubble_fraction, 0.85 * zb.bubble_fraction);
  EXPECT_LT(zv.step_time, zb.step_time);
  EXPECT_LE(zv.peak_inflight, 2 * v.pp);
  EXPECT_LE(zv.activation_bytes, a.activation_bytes * (1 + 1e-9));
  // The untied head joins the table on rank 0; a tied one is the table.
  nn::GptConfig untied = m;
  untied.tie_embeddings = false;
  const double table = static_cast<double>(m.vocab_size) * 4096 / 8;
  EXPECT_NEAR(estimate(untied, c, 32, 16, v).weights_bytes - zv.weights_bytes, 2.0 * table, 1.0);
  EXPECT_NEAR(estimate(untied, c, 32, 16, h1).weights_bytes - zb.weights_bytes, 0.0, 1.0);
  // Its in-flight budget is priced and printed as zb-auto's is.
  v.zb_max_in_flight = 2 * v.pp;
  EXPECT_EQ(v.str(),
            "tp=8 pp=4 dp=1 vpp=2 mb=1 recompute=selective sp=off zero1=off zb-v max-in-flight=8");
  EXPECT_LE(estimate(m, c, 32, 16, v).step_time, zv.step_time * (1 + 1e-12));
  // The planner offers it.
  SearchSpace space;
  space.micro_batches = {1};
  bool offered = false;
  for (const Estimate& e : recommend(m, c, 32, 16, space))
    offered = offered || e.config.schedule == pipeline::ScheduleKind::ZbV;
  EXPECT_TRUE(offered);
}

// The last stage also runs the head: a GPT-2-sized vocabulary on a narrow
// model makes it the slowest by far under an even split. The balanced split
// gives it fewer layers, and the planner prices the split it is given.
TEST(CostModel, PricesTheStagesSplitAndPrefersABalancedOne) {
  const ClusterSpec c = selene();
  nn::GptConfig m = gpt(24, 16, 1024);
  m.vocab_size = 128000;
  ParallelConfig even = layout(1, 4, 8, 1, Recompute::None);
  even.attention = Attention::Flash;
  ParallelConfig balanced = even;
  balanced.stage_layers = pipeline::balanced_stage_layers(m, 4, 1);
  ASSERT_LT(balanced.stage_layers.back(), 6);
  EXPECT_NE(balanced.str().find(" stages=["), std::string::npos) << balanced.str();
  const Estimate a = estimate(m, c, 32, 256, even), b = estimate(m, c, 32, 256, balanced);
  EXPECT_LT(b.compute_time, 0.85 * a.compute_time);  // the busiest rank's work
  EXPECT_LT(b.step_time, 0.9 * a.step_time);
  // An explicit even split is priced as the default one.
  ParallelConfig listed = even;
  listed.stage_layers = {6, 6, 6, 6};
  EXPECT_NEAR(estimate(m, c, 32, 256, listed).step_time, a.step_time, 1e-12 * a.step_time);
  // A split can leave n_layer indivisible by pp: 24 layers on 5 stages.
  ParallelConfig five = layout(1, 5, 1, 1, Recompute::None);
  five.stage_layers = pipeline::balanced_stage_layers(m, 5, 1);
  EXPECT_NO_THROW(estimate(m, c, 5, 40, five));
  // The planner offers balanced splits, and ranks one first here.
  SearchSpace space;
  space.micro_batches = {1};
  space.attention = Attention::Flash;
  const auto best = recommend(m, c, 32, 256, space);
  ASSERT_FALSE(best.empty());
  bool offered = false;
  for (const Estimate& e : best) offered = offered || !e.config.stage_layers.empty();
  EXPECT_TRUE(offered);
}

TEST(CostModel, FusedAttentionStoresNoScoresAndSkipsMaskedTiles) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(32, 32, 4096);  // s = 2048, head dim 128
  auto with = [&](Attention attn, Recompute rc, bool sp) {
    ParallelConfig p = layout(4, 2, 4, 2, rc);
    p.attention = attn;
    p.sequence_parallel = sp;
    return estimate(m, c, 32, 256, p);
  };
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallelism");
    const Estimate unfused = with(Attention::Unfused, Recompute::None, sp);
    const Estimate flash = with(Attention::Flash, Recompute::None, sp);
    // Memory: per stored layer, the 5as/h share of the (s x s) scores gives
    // way to the f32 log-sum-exp (4a/h), both over tp.
    const double b = 2, s = 2048, h = 4096, a = 32, t = 4;
    const int layers = unfused.peak_inflight * 32 / 2;
    ASSERT_EQ(flash.peak_inflight, unfused.peak_inflight);
    EXPECT_NEAR(unfused.activation_bytes - flash.activation_bytes,
                layers * s * b * h * (5 * a * s / h - 4 * a / h) / t, 1.0);
    // Time: no score traffic through memory and half the tiles, so less.
    EXPECT_LT(flash.memory_bound_time, unfused.memory_bound_time);
    EXPECT_LT(flash.step_time, unfused.step_time);
    EXPECT_GT(flash.mfu, unfused.mfu);
  }
  // Selective recomputation only avoids storing score-sized activations:
  // with fused attention it costs and saves nothing, as in the trainer.
  const Estimate none = with(Attention::Flash, Recompute::None, false);
  const Estimate sel = with(Attention::Flash, Recompute::Selective, false);
  EXPECT_EQ(sel.step_time, none.step_time);
  EXPECT_EQ(sel.activation_bytes, none.activation_bytes);
  EXPECT_LT(with(Attention::Flash, Recompute::Full, false).activation_bytes, none.activation_bytes);
  // The flash rate: 3/4 of the GEMM efficiency unless the cluster says.
  ClusterSpec faster = c;
  faster.attention_efficiency = c.gemm_efficiency;
  ParallelConfig p = layout(4, 2, 4, 2, Recompute::None);
  p.attention = Attention::Flash;
  EXPECT_LT(estimate(m, faster, 32, 256, p).gemm_time, none.gemm_time);
  EXPECT_EQ(attention_from_name("flash"), Attention::Flash);
  EXPECT_THROW(attention_from_name("fused"), ConfigError);
}

// Context parallelism on a long sequence (32768 positions, fused
// attention): cp 2 against the same GPUs as two more replicas halves each
// rank's stored activations and logits (the attention's log-sum-exp too: a
// cp-th of the heads over the whole sequence) and its compute per
// microbatch, adds the exchanges of q, k, v and the output (priced with
// tp's collectives), and reduces gradients over the same dp * cp ranks.
// The planner tries it when asked. Bad layouts name the numbers.
// Multi-token prediction (model.mtp_layers) on the last stage: each module's
// block, eh_proj and three norms in the weights (and, beside an untied
// head, a copy of the token table), its block's activations and logits of
// its own, its work in the last stage's passes; stage_layers auto moves
// layers off the last stage for it.
TEST(CostModel, PricesMultiTokenPredictionOnTheLastStage) {
  const ClusterSpec c = selene();
  nn::GptConfig m = gpt(8, 16, 2048);
  m.tie_embeddings = false;
  nn::GptConfig predicting = m;
  predicting.mtp_layers = 1;
  ParallelConfig p = layout(2, 4, 2, 1, Recompute::None);
  p.attention = Attention::Flash;
  const Estimate none = estimate(m, c, 16, 64, p), one = estimate(predicting, c, 16, 64, p);
  const double h = 2048, t = 2;
  const double added = static_cast<double>(m.block_parameters(m.n_layer)) / t + 2 * h * h +
                       3 * 2 * h + static_cast<double>(m.vocab_size) * h / t;
  EXPECT_NEAR(one.weights_bytes - none.weights_bytes, 2.0 * added, 1e-6 * none.weights_bytes);
  EXPECT_GT(one.activation_bytes, none.activation_bytes);
  // The last stage (two layers and the head before) gains a layer's work
  // and the head's again: the pipeline runs at its pace.
  EXPECT_GT(one.step_time, none.step_time * 1.2);
  EXPECT_GT(one.model_flops_per_step, none.model_flops_per_step);
  // A tied head already has its table on the last stage.
  nn::GptConfig tied = predicting;
  tied.tie_embeddings = true;
  nn::GptConfig tied_none = m;
  tied_none.tie_embeddings = true;
  EXPECT_NEAR(
      estimate(tied, c, 16, 64, p).weights_bytes - estimate(tied_none, c, 16, 64, p).weights_bytes,
      2.0 * (added - static_cast<double>(m.vocab_size) * h / t), 1e-6 * none.weights_bytes);
  // Balanced stages give the last one fewer layers.
  nn::GptConfig deep = gpt(24, 16, 2048), deep_predicting = deep;
  deep_predicting.mtp_layers = 1;
  const std::vector<int64_t> plain = pipeline::balanced_stage_layers(deep, 4, 1);
  const std::vector<int64_t> balanced = pipeline::balanced_stage_layers(deep_predicting, 4, 1);
  EXPECT_LT(balanced.back(), plain.back());
  // The planner reads the keys.
  const nn::GptConfig spec = parse_model_spec(
      "n_layer: 2\nn_head: 2\nd_model: 16\nvocab_size: 64\nseq_len: 32\nmtp_layers: 2\n"
      "mtp_loss_weight: 0.2\n");
  EXPECT_EQ(spec.mtp_layers, 2);
  EXPECT_EQ(spec.mtp_loss_weight, 0.2);
}

TEST(CostModel, ContextParallelismSharesEachSequenceOut) {
  const ClusterSpec c = selene();
  nn::GptConfig m = gpt(8, 32, 4096);
  m.seq_len = 32768;
  auto priced = [&](int dp, int cp) {
    ParallelConfig p = layout(8, 1, dp, 1, Recompute::None);
    p.cp = cp;
    p.attention = Attention::Flash;
    p.sequence_parallel = true;
    return estimate(m, c, 16, 16, p);
  };
  const Estimate two = priced(2, 1), chunked = priced(1, 2);
  EXPECT_EQ(chunked.num_microbatches, 2 * two.num_microbatches);  // (half the replicas)
  EXPECT_NEAR(chunked.activation_bytes, two.activation_bytes / 2, 1e-9 * two.activation_bytes);
  // (Per microbatch, one sequence: half its positions, and the exchanges.)
  EXPECT_NEAR(chunked.gemm_time, two.gemm_time / 2, 0.05 * two.gemm_time);
  EXPECT_GT(chunked.tp_comm_time, two.tp_comm_time / 2 * 1.2);
  EXPECT_NE(chunked.json().find("\"cp\":2"), std::string::npos);
  EXPECT_NE(chunked.config.str().find(" cp=2"), std::string::npos);
  // The search tries context parallelism only when asked.
  SearchSpace space;
  space.micro_batches = {1};
  space.vpps = {1};
  space.try_zb_h1 = space.try_zb_auto = space.try_zb_v = false;
  space.attention = Attention::Flash;
  for (const auto& e : recommend(m, c, 16, 16, space)) EXPECT_EQ(e.config.cp, 1);
  space.cps = {1, 2, 4};
  bool chunking = false;
  std::set<cp::Exchange> exchanges;
  for (const auto& e : recommend(m, c, 16, 16, space)) {
    chunking = chunking || e.config.cp > 1;
    if (e.config.cp > 1) {
      exchanges.insert(e.config.cp_exchange);
      EXPECT_NE(e.config.str().find(" cp_comm="), std::string::npos) << e.config.str();
    }
    EXPECT_EQ(e.config.tp * e.config.pp * e.config.dp * e.config.cp, 16);
  }
  EXPECT_TRUE(chunking);
  // Every exchange tried (the heads share out over 2 and 4 ranks; all-to-
  // alls of 2 inside a node beside tp up to 4, a ring of 2 across them).
  EXPECT_EQ(exchanges, (std::set<cp::Exchange>{cp::Exchange::AllToAll, cp::Exchange::AllGather,
                                               cp::Exchange::Ring, cp::Exchange::AllToAllRing}));
  ParallelConfig bad = layout(8, 1, 2, 1, Recompute::None);
  bad.cp = 2;
  try {
    estimate(m, c, 16, 16, bad);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must equal tp*pp*dp*cp = 8*1*2*2 = 32"),
              std::string::npos)
        << e.what();
  }
  bad = layout(8, 1, 1, 1, Recompute::None);
  bad.cp = 16;  // 4 heads a tensor-parallel rank over 16 ranks
  bad.cp_exchange = cp::Exchange::AllToAll;
  try {
    estimate(m, c, 128, 16, bad);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cp (16) beside parallel.tp (8)"),
              std::string::npos)
        << e.what();
  }
  // The all-gather takes them (auto picks it): as much attention work
  // (balanced), another exchange, and every rank keeps the gathered keys
  // and values.
  ParallelConfig gathered = bad;
  gathered.cp_exchange = cp::Exchange::Auto;
  const Estimate g = estimate(m, c, 128, 16, gathered);
  ParallelConfig shared = layout(8, 1, 1, 1, Recompute::None);
  shared.cp = 4;  // 4 heads a tensor-parallel rank over 4 ranks: all-to-all
  shared.cp_exchange = cp::Exchange::AllToAll;
  const Estimate a2a = estimate(m, c, 32, 16, shared);
  shared.cp_exchange = cp::Exchange::AllGather;
  const Estimate ag = estimate(m, c, 32, 16, shared);
  EXPECT_GT(ag.activation_bytes, a2a.activation_bytes);
  EXPECT_NEAR(ag.gemm_time, a2a.gemm_time, 1e-9 * a2a.gemm_time);
  EXPECT_NE(ag.tp_comm_time, a2a.tp_comm_time);
  // The ring: the same work, nothing gathered kept for backward, and its
  // forward hops hidden under the steps' attention where they are shorter;
  // backward adds the gradients' hops.
  shared.cp_exchange = cp::Exchange::Ring;
  const Estimate ring = estimate(m, c, 32, 16, shared);
  EXPECT_NEAR(ring.gemm_time, a2a.gemm_time, 1e-9 * a2a.gemm_time);
  EXPECT_DOUBLE_EQ(ring.activation_bytes, a2a.activation_bytes);
  EXPECT_LT(ring.activation_bytes, ag.activation_bytes);
  EXPECT_GT(ring.tp_comm_time, 0.0);
  EXPECT_NE(ring.tp_comm_time, ag.tp_comm_time);
  EXPECT_NE(shared.str().find(" cp_comm=ring"), std::string::npos) << shared.str();
  EXPECT_GT(g.step_time, 0.0);
  EXPECT_NE(gathered.str(), shared.str());
}

// Hierarchical context parallelism (all_to_all+ring) over two nodes: tp 2
// x cp 8, all-to-alls of 4 ranks inside each node and a ring of 2 across
// them. The same attention work and activations as the flat all-to-all,
// whose bytes all cross the slower links; here only the ring's hops do,
// under the steps' attention. cp_comm auto picks it on these nodes, and
// the flat all-to-all inside one node.
TEST(CostModel, AllToAllsInsideANodeAndARingAcrossMoveLessBetweenNodes) {
  const ClusterSpec c = selene();
  nn::GptConfig m = gpt(8, 32, 4096);
  m.seq_len = 32768;
  ParallelConfig p = layout(2, 1, 1, 1, Recompute::None);
  p.cp = 8;
  p.attention = Attention::Flash;
  p.cp_exchange = cp::Exchange::AllToAll;
  const Estimate flat = estimate(m, c, 16, 16, p);
  p.cp_exchange = cp::Exchange::AllToAllRing;
  p.cp_a2a = 4;
  const Estimate both = estimate(m, c, 16, 16, p);
  EXPECT_NEAR(both.gemm_time, flat.gemm_time, 1e-9 * flat.gemm_time);
  EXPECT_DOUBLE_EQ(both.activation_bytes, flat.activation_bytes);
  EXPECT_GT(both.tp_comm_time, 0.0);
  EXPECT_LT(both.tp_comm_time, flat.tp_comm_time);
  EXPECT_NE(p.str().find(" cp_comm=all_to_all+ring cp_a2a=4"), std::string::npos) << p.str();
  EXPECT_NE(both.json().find("\"cp_a2a\":4"), std::string::npos) << both.json();
  // cp_a2a must divide cp, between 1 and cp.
  p.cp_a2a = 3;
  expect_plan_config_error(m, c, 16, 16, p,
                           "parallel.cp_a2a (3) must be a divisor of parallel.cp (8)");
  // cp_comm auto chooses these all-to-alls by itself (the context group
  // spans the two nodes of 8 GPUs), priced and named alike.
  p.cp_exchange = cp::Exchange::Auto;
  p.cp_a2a = 1;
  const Estimate automatic = estimate(m, c, 16, 16, p);
  EXPECT_EQ(automatic.config.cp_exchange, cp::Exchange::AllToAllRing);
  EXPECT_EQ(automatic.config.cp_a2a, 4);
  EXPECT_DOUBLE_EQ(automatic.step_time, both.step_time);
  EXPECT_EQ(concrete_context_exchange(m, c, p).cp_a2a, 4);
  // Inside one node (tp 1 x cp 8): the flat all-to-all.
  ParallelConfig inside = p;
  inside.tp = 1;
  const Estimate flat_inside = estimate(m, c, 8, 16, inside);
  EXPECT_EQ(flat_inside.config.cp_exchange, cp::Exchange::AllToAll);
  EXPECT_EQ(flat_inside.config.cp_a2a, 1);
  // tp 8 x cp 2: the pair spans two nodes, and no all-to-all of fewer
  // ranks exists: the flat one.
  ParallelConfig wide = p;
  wide.tp = 8;
  wide.cp = 2;
  const ParallelConfig across = concrete_context_exchange(m, c, wide);
  EXPECT_EQ(across.cp_exchange, cp::Exchange::AllToAll);
  EXPECT_EQ(across.cp_a2a, 1);
}

// The memory model against Triad itself: a bf16 model trained on the CPU
// backend keeps what a GPU run keeps (bf16 weights, f32 gradients, masters
// and moments, bf16 activations), and the host allocator counts every byte.
// The planner's total (weights, gradients, optimizer state, activations by
// Korthikanti's count with fused attention, the logits) should come within
// 15% of the measured peak of a step, with and without full recomputation.
// (One CPU-only transient: the backend widens the bf16 logits to f32 around
// the head's product and loss, 4 bytes per logit a GPU never holds; at micro
// batch 4 with full recomputation, where the logits dominate, the measured
// peak is about 11% above the GPU's.)
TEST(CostModel, MemoryPredictionMatchesTriadsMeasuredPeak) {
  nn::GptConfig m;
  m.n_layer = 4, m.n_head = 4, m.d_model = 256, m.vocab_size = 1024, m.seq_len = 256;
  const ClusterSpec c = selene();
  for (Recompute rc : {Recompute::None, Recompute::Full}) {
    for (int b : {1, 4}) {
      SCOPED_TRACE(std::string(recompute_name(rc)) + ", micro batch " + std::to_string(b));
      nn::GptConfig mc = m;
      mc.recompute = rc == Recompute::Full ? nn::Recompute::Full : nn::Recompute::None;
      nn::Gpt model(mc, 1, DType::BF16);
      optim::AdamW opt(model.named_parameters(), {});
      std::vector<int64_t> ids(static_cast<size_t>(b) * 256), next(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 7) % 1024, next[i] = (i * 7 + 1) % 1024;
      const Tensor x = from_vector(ids, {b, 256}), y = from_vector(next, {b, 256});
      auto forward_backward = [&] { autograd::backward({model.loss(x, y)}); };
      forward_backward();
      opt.step(1e-4);  // the optimizer state exists from here on
      model.zero_grad();
      Allocator& host = cpu_allocator();
      host.reset_peak();
      forward_backward();
      const double measured = static_cast<double>(host.stats().peak_allocated);
      ParallelConfig p = layout(1, 1, 1, b, rc);
      p.attention = Attention::Flash;
      const Estimate e = estimate(m, c, 1, b, p);
      const double predicted = e.memory_bytes - c.reserved_bytes;
      EXPECT_NEAR(predicted / measured, 1.0, 0.15)
          << "predicted " << predicted / 1e6 << " MB, measured " << measured / 1e6 << " MB";
    }
  }
}

TEST(Planner, WithFusedAttentionSelectiveRecomputeIsNotListedTwice) {
  const ClusterSpec c = selene();
  SearchSpace space;
  space.micro_batches = {1, 2};
  space.attention = Attention::Flash;
  const auto all = recommend(gpt(24, 32, 4096), c, 16, 64, space);
  ASSERT_FALSE(all.empty());
  for (const auto& e : all) {
    EXPECT_EQ(e.config.attention, Attention::Flash);
    EXPECT_NE(e.config.recompute, Recompute::Selective);
  }
}

TEST(CostModel, InvalidLayoutsAreErrorsNamingTheNumbers) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(24, 24, 2304);
  auto expect_error = [&](const ParallelConfig& p, int gpus, int gb, const std::string& fragment) {
    expect_plan_config_error(m, c, gpus, gb, p, fragment);
  };
  expect_error(layout(2, 2, 2, 1), 16, 64, "GPUs (16) must equal tp*pp*dp = 2*2*2 = 8");
  expect_error(layout(16, 1, 1, 1), 16, 64, "n_head (24) must be divisible by tp (16)");
  expect_error(layout(1, 5, 1, 1), 5, 64, "n_layer (24) must be divisible by pp*vpp (5)");
  expect_error(layout(1, 1, 8, 3), 8, 64,
               "global batch (64) must be divisible by micro batch * dp (24)");
  ParallelConfig inter = layout(1, 4, 1, 1);
  inter.vpp = 2;
  inter.schedule = pipeline::ScheduleKind::Interleaved;
  // Any number of microbatches (the short last group leaves its slots empty).
  EXPECT_GT(estimate(m, c, 4, 6, inter).step_time, 0.0);
  ParallelConfig split = layout(1, 4, 1, 1);
  split.stage_layers = {6, 6, 6};
  expect_error(split, 4, 8, "stage_layers has 3 entries, expected parallel.pp * parallel.vpp = 4");
  split.stage_layers = {6, 6, 0, 12};
  expect_error(split, 4, 8,
               "stage_layers[2] (0) must be >= 1 (only the first and the last stage may hold no "
               "layer)");
  split.stage_layers = {6, 6, 6, 5};
  expect_error(split, 4, 8, "stage_layers add up to 23 layers but model.n_layer is 24");
  ParallelConfig v = layout(1, 4, 1, 1);
  v.schedule = pipeline::ScheduleKind::ZbV;
  expect_error(v, 4, 8, "vpp (1) must be 2 for the zb-v schedule");
  v.vpp = 2;
  EXPECT_NO_THROW(check_config(m, c, 4, 6, v));  // any number of microbatches
  ParallelConfig h1 = layout(1, 4, 1, 1);
  h1.schedule = pipeline::ScheduleKind::ZbH1;
  h1.vpp = 2;
  expect_error(h1, 4, 8, "vpp (2) > 1 goes with the interleaved or zb-v schedule");
  ParallelConfig sp = layout(1, 1, 1, 1);
  sp.sequence_parallel = true;
  expect_error(sp, 1, 8, "sequence parallelism needs tp > 1");
  nn::GptConfig wide = gpt(24, 32, 4096);
  try {
    check_config(wide, c, 16, 64, layout(16, 1, 1, 1));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gpus_per_node (8)"), std::string::npos) << e.what();
  }
}

TEST(Planner, RecommendsOnlyFittingLayoutsFastestFirst) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(24, 32, 4096);  // ~5B parameters
  SearchSpace space;
  space.micro_batches = {1, 2};
  auto all = recommend(m, c, 16, 64, space);
  ASSERT_FALSE(all.empty());
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LE(all[i - 1].step_time, all[i].step_time * 1.001);
  for (const auto& e : all) {
    EXPECT_TRUE(e.fits);
    EXPECT_LE(e.memory_bytes, c.memory_bytes);
    EXPECT_EQ(e.config.tp * e.config.pp * e.config.dp, 16);
  }
  // 5B parameters at 18 bytes each do not fit on one 80 GB GPU without
  // splitting the model or the optimizer state: no such layout survives.
  for (const auto& e : all) EXPECT_FALSE(e.config.tp == 1 && e.config.pp == 1 && !e.config.zero1);
  const std::string j = all.front().json();
  for (const char* key : {"tflops_per_gpu", "step_time_s", "tokens_per_s", "mfu",
                          "memory_per_gpu_gb", "bubble_fraction"}) {
    EXPECT_NE(j.find(key), std::string::npos) << key;
  }
}

// The bound the planner orders its search by is never above what pricing
// the layout in full says (time and memory), and a layout it says cannot
// fit does not. Deep pipelines of every schedule, where the simulation is
// what costs.
TEST(Planner, TheLowerBoundIsBelowTheFullPrice) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(48, 32, 4096);
  int checked = 0;
  for (auto [kind, v] : {std::pair{pipeline::ScheduleKind::OneFOneB, 1},
                         {pipeline::ScheduleKind::Interleaved, 2},
                         {pipeline::ScheduleKind::ZbH1, 1},
                         {pipeline::ScheduleKind::ZbAuto, 1},
                         {pipeline::ScheduleKind::ZbV, 2}}) {
    for (int pp : {2, 8, 24}) {
      if (m.n_layer % (pp * v) != 0) continue;
      for (Recompute rc : {Recompute::None, Recompute::Full}) {
        for (int mb : {1, 4}) {
          ParallelConfig p = layout(4, pp, 96 / (4 * pp), mb, rc);
          p.vpp = v;
          p.schedule = kind;
          p.attention = Attention::Flash;
          SCOPED_TRACE(p.str());
          const Estimate full = estimate(m, c, 96, 96 * 4, p);
          const Estimate bound = estimate_lower_bound(m, c, 96, 96 * 4, p);
          EXPECT_LE(bound.step_time, full.step_time);
          // (Not a vacuous bound: the bubble and the activations beyond one
          // chunk are all it leaves out.)
          EXPECT_GT(bound.step_time, (1 - full.bubble_fraction) * 0.99 * full.step_time);
          EXPECT_LE(bound.memory_bytes, full.memory_bytes);
          EXPECT_TRUE(bound.fits || !full.fits);
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 5 * 3 * 2 * 2);
  // 10B parameters at 18 bytes each on one GPU: the bound rules it out.
  const ParallelConfig whole = layout(1, 1, 96, 1, Recompute::Full);
  EXPECT_FALSE(estimate_lower_bound(m, c, 96, 96 * 4, whole).fits);
  EXPECT_FALSE(estimate(m, c, 96, 96 * 4, whole).fits);
}

// With as many microbatches as stages the fill and the drain are a third of
// 1F1B's step: the bound counts both (the last rank's forwards arrive after
// p - 1 stages' forwards, and its last backward goes back through p - 1
// stages' backwards), so it comes within a few percent of the simulated
// time, where counting the fill alone left out a quarter of it.
TEST(Planner, TheLowerBoundCountsThePipelinesDrain) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(48, 32, 4096);
  for (auto [kind, v] : {std::pair{pipeline::ScheduleKind::OneFOneB, 1},
                         {pipeline::ScheduleKind::GPipe, 1},
                         {pipeline::ScheduleKind::Interleaved, 2}}) {
    ParallelConfig p = layout(4, 8, 3, 1, Recompute::Full);
    p.vpp = v;
    p.schedule = kind;
    p.attention = Attention::Flash;
    SCOPED_TRACE(p.str());
    const Estimate full = estimate(m, c, 96, 3 * 8, p);  // 8 microbatches
    const Estimate bound = estimate_lower_bound(m, c, 96, 3 * 8, p);
    ASSERT_EQ(full.num_microbatches, 8);
    EXPECT_GT(full.bubble_fraction, 0.2);
    EXPECT_LE(bound.pipeline_time, full.pipeline_time);
    EXPECT_GT(bound.pipeline_time, 0.97 * full.pipeline_time);
  }
}

// Asked for the best few, the planner prices far fewer layouts and returns
// exactly the first few of the exhaustive ranking.
// At 32K tokens LLaMA 2 70B on 64 H100s cannot keep every activation, and
// recomputing only some of each chunk's layers (model.recompute_layers)
// beats recomputing all of them: the search finds it, and without those
// candidates its best is slower.
TEST(Planner, RecomputingSomeLayersCanBeatRecomputingAll) {
  nn::GptConfig m =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/llama2_70b.yaml");
  m.seq_len = 32768;
  const ClusterSpec c =
      load_cluster(std::string(TRIAD_SOURCE_DIR) + "/configs/clusters/dgx_h100.yaml");
  SearchSpace space;
  space.attention = Attention::Flash;
  space.top = 3;
  const auto best = recommend(m, c, 64, 32, space);
  ASSERT_FALSE(best.empty());
  EXPECT_EQ(best[0].config.recompute, Recompute::Full);
  EXPECT_GT(best[0].config.recompute_layers, 0) << best[0].config.str();
  for (const Estimate& e : best) EXPECT_NE(e.config.recompute, Recompute::None) << e.config.str();
  space.try_recompute_layers = false;
  const auto without = recommend(m, c, 64, 32, space);
  ASSERT_FALSE(without.empty());
  EXPECT_EQ(without[0].config.recompute_layers, 0);
  EXPECT_LT(best[0].step_time, without[0].step_time);
}

TEST(Planner, TheBestFewMatchPricingEveryLayout) {
  const ClusterSpec c = selene();
  const nn::GptConfig m = gpt(24, 32, 4096);
  SearchSpace space;
  space.micro_batches = {1, 2, 4};
  space.attention = Attention::Flash;
  SearchStats all_stats;
  const auto all = recommend(m, c, 32, 128, space, &all_stats);
  ASSERT_GT(all.size(), 10u);
  EXPECT_EQ(all_stats.priced, all_stats.layouts);
  EXPECT_EQ(all_stats.fit, all.size());
  for (const Estimate& e : all) {
    EXPECT_LE(estimate_lower_bound(m, c, 32, 128, e.config).step_time, e.step_time)
        << e.config.str();
  }
  for (int top : {1, 3, 10}) {
    SCOPED_TRACE(top);
    space.top = top;
    SearchStats stats;
    const auto best = recommend(m, c, 32, 128, space, &stats);
    ASSERT_EQ(best.size(), static_cast<size_t>(top));
    EXPECT_EQ(stats.layouts, all_stats.layouts);
    EXPECT_LT(stats.priced, all_stats.layouts / 2);
    for (int i = 0; i < top; ++i) {
      EXPECT_EQ(best[i].config.str(), all[i].config.str()) << i;
      EXPECT_EQ(best[i].step_time, all[i].step_time) << i;
      EXPECT_EQ(best[i].memory_bytes, all[i].memory_bytes) << i;
    }
  }
  // More wanted than fit: every one that fits, in the same order.
  space.top = static_cast<int>(all.size()) + 5;
  const auto every = recommend(m, c, 32, 128, space);
  ASSERT_EQ(every.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(every[i].config.str(), all[i].config.str());
}

TEST(PlannerFiles, ClusterAndModelFilesAreValidated) {
  EXPECT_NO_THROW(load_cluster(std::string(TRIAD_SOURCE_DIR) + "/configs/clusters/dgx_h100.yaml"));
  EXPECT_NO_THROW(load_cluster(std::string(TRIAD_SOURCE_DIR) + "/configs/clusters/hgx_h200.yaml"));
  const std::string ok =
      "gpus_per_node: 8\ngpu: {peak_tflops: 312, memory_gib: 80, memory_bandwidth_gbs: 2039}\n"
      "intra_node: {bandwidth_gbs: 300}\ninter_node: {bandwidth_gbs: 200}\n";
  EXPECT_NO_THROW(parse_cluster(ok));
  auto expect_error = [](const std::string& yaml, const std::string& fragment) {
    try {
      parse_cluster(yaml);
      FAIL() << "expected ConfigError with '" << fragment << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(ok + "nics: 8\n", "unknown key 'nics'");
  expect_error(ok + "gpus_per_node: 4\n", "key 'gpus_per_node' is given twice (lines 1 and 5)");
  expect_error(ok + "efficiency: {gemm: 1.5}\n", "efficiency.gemm (1.500000) must be in (0, 1]");
  expect_error("gpus_per_node: 8\n", "missing required key 'gpu'");
  expect_error(ok + "efficiency: {gemm: fast}\n", "efficiency.gemm: expected a number, got 'fast'");
  // Counts are whole numbers an int holds; names are names; keys are plain
  // names (a list as a key once escaped as yaml-cpp's own exception).
  expect_error(
      "gpus_per_node: 1e300\ngpu: {peak_tflops: 1, memory_gib: 8, memory_bandwidth_gbs: 1}\n"
      "intra_node: {bandwidth_gbs: 300}\ninter_node: {bandwidth_gbs: 200}\n",
      "gpus_per_node (1e300) must be a positive integer");
  expect_error(
      "gpus_per_node: 8\ngpu: {peak_tflops: 1, memory_gib: 8, memory_bandwidth_gbs: 1, "
      "sm_count: 2.5}\nintra_node: {bandwidth_gbs: 300}\ninter_node: {bandwidth_gbs: 200}\n",
      "gpu.sm_count (2.5) must be a positive integer");
  expect_error(ok + "name: [a, b]\n", "name: expected a name, got '[a, b]'");
  expect_error(ok + "[a]: 1\n", "a key must be a plain name, got '[a]' (line 5)");
  expect_error(
      "gpus_per_node: 8\ngpu: {peak_tflops: 1, memory_gib: 8, memory_bandwidth_gbs: 1}\n"
      "intra_node: {bandwidth_gbs: 300, {x: 1}: 2}\ninter_node: {bandwidth_gbs: 200}\n",
      "intra_node: a key must be a plain name, got '{x: 1}'");
  EXPECT_DOUBLE_EQ(
      parse_cluster(ok + "efficiency: {attention: 0.5}\n").flash_attention_efficiency(4096), 0.5);
  expect_error(ok + "efficiency: {attention: 2}\n", "efficiency.attention");
  // A curve by the keys a query sees: its points in any order, read
  // linearly in log2 between them and held beyond its ends.
  const ClusterSpec curve =
      parse_cluster(ok + "efficiency: {attention: {4096: 0.3, 1024: 0.2, 16384: 0.4}}\n");
  ASSERT_EQ(curve.attention_curve.size(), 3u);
  EXPECT_DOUBLE_EQ(curve.flash_attention_efficiency(512), 0.2);
  EXPECT_DOUBLE_EQ(curve.flash_attention_efficiency(1024), 0.2);
  EXPECT_NEAR(curve.flash_attention_efficiency(2048), 0.25, 1e-12);
  EXPECT_DOUBLE_EQ(curve.flash_attention_efficiency(4096), 0.3);
  EXPECT_NEAR(curve.flash_attention_efficiency(8192), 0.35, 1e-12);
  EXPECT_DOUBLE_EQ(curve.flash_attention_efficiency(65536), 0.4);
  EXPECT_DOUBLE_EQ(
      parse_cluster(ok + "efficiency: {attention: {2048: 0.25}}\n").flash_attention_efficiency(100),
      0.25);
  expect_error(ok + "efficiency: {attention: {}}\n",
               "efficiency.attention: a curve needs at least one point");
  expect_error(ok + "efficiency: {attention: {1024: 1.5}}\n",
               "efficiency.attention.1024 (1.500000) must be in (0, 1]");
  expect_error(ok + "efficiency: {attention: {0.5: 0.2}}\n",
               "efficiency.attention.0.5: a length of keys must be a finite number >= 1, got 0.5");
  expect_error(ok + "efficiency: {attention: {long: 0.2}}\n",
               "efficiency.attention.long (a length): expected a number, got 'long'");
  expect_error(ok + "efficiency: {attention: {1024: 0.2, 1024.0: 0.3}}\n",
               "efficiency.attention.1024.0: the length 1024.0 twice");
  expect_error(ok + "efficiency: {attention: [0.2, 0.3]}\n", "efficiency.attention");
  // Latencies and the reserve may be zero but not negative, and the reserve
  // leaves room for the model; no value may be infinite.
  EXPECT_NO_THROW(parse_cluster(ok + "reserved_gib: 0\n"));
  expect_error(
      "gpus_per_node: 8\ngpu: {peak_tflops: 312, memory_gib: 80, memory_bandwidth_gbs: 2039}\n"
      "intra_node: {bandwidth_gbs: 300, latency_us: -3}\ninter_node: {bandwidth_gbs: 200}\n",
      "intra_node.latency_us (-3.000000) must be a finite number >= 0");
  expect_error(
      "gpus_per_node: 8\ngpu: {peak_tflops: 312, memory_gib: 80, memory_bandwidth_gbs: 2039}\n"
      "intra_node: {bandwidth_gbs: 300}\ninter_node: {bandwidth_gbs: 200, latency_us: .nan}\n",
      "inter_node.latency_us (nan)");
  expect_error(ok + "reserved_gib: -1\n", "reserved_gib (-1.000000) must be a finite number >= 0");
  expect_error(ok + "reserved_gib: 80\n",
               "reserved_gib (80) must be less than gpu.memory_gib (80): nothing would be left");
  expect_error(
      "gpus_per_node: 8\ngpu: {peak_tflops: .inf, memory_gib: 80, memory_bandwidth_gbs: 2039}\n"
      "intra_node: {bandwidth_gbs: 300}\ninter_node: {bandwidth_gbs: 200}\n",
      "gpu.peak_tflops (inf) must be a finite number > 0");
  // A trainer config works as a model file, and so does a bare model section.
  nn::GptConfig m = load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/gpt_tiny.yaml");
  EXPECT_EQ(m.d_model, 128);
  EXPECT_EQ(
      parse_model_spec("{n_layer: 2, n_head: 2, d_model: 8, vocab_size: 10, seq_len: 4}").n_layer,
      2);
  EXPECT_THROW(parse_model_spec("{n_layer: 2, n_head: 2, d_model: 8, vocab_size: 10}"),
               ConfigError);
  EXPECT_THROW(
      parse_model_spec("{n_layer: 2, n_head: 2, d_model: 8, vocab_size: 10, seq_len: 4, width: 3}"),
      ConfigError);
  // A rotary model has no position table to count.
  const nn::GptConfig rope = parse_model_spec(
      "{n_layer: 2, n_head: 2, d_model: 8, vocab_size: 10, seq_len: 4, position_embedding: rope, "
      "rope_theta: 500000}");
  EXPECT_TRUE(rope.rotary());
  EXPECT_EQ(parse_model_spec("{n_layer: 2, n_head: 2, d_model: 8, vocab_size: 10, seq_len: 4}")
                    .num_parameters() -
                rope.num_parameters(),
            4 * 8);
  EXPECT_THROW(parse_model_spec("{n_layer: 2, n_head: 2, d_model: 8, vocab_size: 10, seq_len: 4, "
                                "position_embedding: alibi}"),
               ConfigError);
  // LLaMA 2 7B from its options has the published model's parameters
  // exactly (Hugging Face's count for Llama-2-7b): 32 blocks of attention
  // 4h^2, SwiGLU 3hF and two RMSNorms, two untied 32000 x h tables, the
  // final norm.
  const nn::GptConfig llama =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/llama2_7b.yaml");
  EXPECT_EQ(llama.num_parameters(), 6'738'415'616);
  // A trainer config's other model keys are accepted (nothing priced).
  EXPECT_EQ(parse_model_spec("{n_layer: 2, n_head: 2, d_model: 8, vocab_size: 10, seq_len: 4, "
                             "norm_eps: 1.0e-6, attention_kernel: simt}")
                .layer_norm_eps,
            1e-6);
  nn::GptConfig tied = llama;
  tied.tie_embeddings = true;
  EXPECT_EQ(llama.num_parameters() - tied.num_parameters(), int64_t{32000} * 4096);
  // LLaMA 2 70B, whose 64 query heads share 8 key/value heads: c_attn is
  // h + 2 * 8 * 128 tall instead of 3h, and the count is the published one.
  const nn::GptConfig big =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/llama2_70b.yaml");
  EXPECT_EQ(big.kv_heads(), 8);
  EXPECT_EQ(big.num_parameters(), 68'976'648'192);
  nn::GptConfig mha = big;
  mha.n_kv_head = 0;
  EXPECT_EQ(mha.num_parameters() - big.num_parameters(), int64_t{80} * 2 * (8192 - 8 * 128) * 8192);
  // Qwen3 4B: 32 query heads of 128 over 8, 4096 wide on a d_model of
  // 2560, with the head norms; Hugging Face's count.
  const nn::GptConfig qwen3 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/qwen3_4b.yaml");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.q_width(), 4096);
  EXPECT_EQ(qwen3.num_parameters(), 4'022'468'096);
  // Command R+: Cohere's parallel blocks whose query and key heads each
  // have LayerNorm weights of their own (96 x 128 and 8 x 128 a layer).
  const nn::GptConfig plus =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/command_r_plus.yaml");
  EXPECT_TRUE(plus.qk_head_layernorm);
  EXPECT_EQ(plus.num_parameters(), 103'810'674'688);
  // OLMo 7B: LLaMA's blocks with LayerNorms that learn nothing; Hugging
  // Face's count, and no norm parameters to hold (2 x 4096 per norm, 65
  // norms, fewer than with learned LayerNorms).
  const nn::GptConfig olmo =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/olmo_7b.yaml");
  EXPECT_FALSE(olmo.norm_affine);
  EXPECT_EQ(olmo.num_parameters(), 6'888'095'744);
  nn::GptConfig olmo_learned = olmo;
  olmo_learned.norm_affine = true;
  EXPECT_EQ(olmo_learned.num_parameters() - olmo.num_parameters(), int64_t{65} * 2 * 4096);
  EXPECT_LT(estimate(olmo, selene(), 8, 8, layout(1, 1, 8, 1, Recompute::Selective)).memory_bytes,
            estimate(olmo_learned, selene(), 8, 8, layout(1, 1, 8, 1, Recompute::Selective))
                .memory_bytes);
  // OLMo 7B 0424's clip_qkv: the clamp keeps c_attn's output as it was, 2
  // bytes for each of q, k and v (3 x 4096) per token, split by TP, and
  // its passes cost time.
  nn::GptConfig clipped = olmo;
  clipped.clip_qkv = 8.0;
  const ParallelConfig clip_tp2 = layout(2, 1, 4, 1, Recompute::Selective);
  const double tokens = 2048.0 * 1;  // seq_len, micro batch 1
  EXPECT_NEAR(estimate(clipped, selene(), 8, 8, clip_tp2).activation_bytes -
                  estimate(olmo, selene(), 8, 8, clip_tp2).activation_bytes,
              32 * tokens * 2 * 3 * 4096 / 2, 1e-9 * tokens * 4096 * 32);
  EXPECT_GT(estimate(clipped, selene(), 8, 8, clip_tp2).memory_bound_time,
            estimate(olmo, selene(), 8, 8, clip_tp2).memory_bound_time);
  // Granite 3.0 8B: LLaMA's shapes (8,170,848,256 parameters by them) with
  // its multipliers, which hold no parameters and keep no activations: the
  // two residual scalings and ln_f's scaling are passes over the stream
  // (time alone), and the scores' scale rides the rotation.
  const nn::GptConfig granite =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/granite_3_8b.yaml");
  EXPECT_EQ(granite.num_parameters(), 8'170'848'256);
  EXPECT_EQ(granite.residual_multiplier, 0.22);
  EXPECT_EQ(granite.logit_scale, 0.0625);
  nn::GptConfig unscaled = granite;
  unscaled.residual_multiplier = unscaled.logit_scale = 1.0;
  const ParallelConfig granite_tp2 = layout(2, 1, 4, 1, Recompute::Selective);
  EXPECT_EQ(estimate(granite, selene(), 8, 8, granite_tp2).memory_bytes,
            estimate(unscaled, selene(), 8, 8, granite_tp2).memory_bytes);
  EXPECT_GT(estimate(granite, selene(), 8, 8, granite_tp2).memory_bound_time,
            estimate(unscaled, selene(), 8, 8, granite_tp2).memory_bound_time);
  // OLMo 2 7B: no pre-norms, two post-norms and the query/key norms over
  // all the heads (4096 each); Hugging Face's count. Under tensor
  // parallelism its query/key norms gather the queries and keys: more
  // tensor-parallel traffic than per-head norms, none on one rank; and two
  // norms a layer fewer than a sandwich of four.
  const nn::GptConfig olmo2 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/olmo2_7b.yaml");
  EXPECT_TRUE(olmo2.qk_norm_full && olmo2.post_norms);
  EXPECT_FALSE(olmo2.pre_norms);
  EXPECT_EQ(olmo2.num_parameters(), 7'298'617'344);
  nn::GptConfig olmo2_per_head = olmo2;
  nn::set_qk_norm(olmo2_per_head, "true");
  const ParallelConfig olmo_tp2 = layout(2, 1, 4, 1, Recompute::Selective);
  EXPECT_GT(estimate(olmo2, selene(), 8, 8, olmo_tp2).tp_comm_time,
            estimate(olmo2_per_head, selene(), 8, 8, olmo_tp2).tp_comm_time);
  const ParallelConfig olmo_tp1 = layout(1, 1, 8, 1, Recompute::Selective);
  EXPECT_DOUBLE_EQ(estimate(olmo2, selene(), 8, 8, olmo_tp1).tp_comm_time, 0.0);
  nn::GptConfig sandwich = olmo2;
  sandwich.pre_norms = true;
  EXPECT_GT(estimate(sandwich, selene(), 8, 8, olmo_tp2).memory_bound_time,
            estimate(olmo2, selene(), 8, 8, olmo_tp2).memory_bound_time);
  // Activations: the pre-norms' inputs are 4 sbh a layer more (bytes: 4 *
  // s * b * h per layer, over TP's 2 ranks as the others replicated are);
  // the query/key norms keep q and k (2 (q + kv) sbh), which the full norm
  // keeps gathered on every rank and the per-head norm splits over TP.
  const Estimate olmo_est = estimate(olmo2, selene(), 8, 8, olmo_tp2);
  const double sbh = 4096.0 * 1 * 4096;  // seq_len, micro batch 1, d_model
  EXPECT_NEAR(
      estimate(sandwich, selene(), 8, 8, olmo_tp2).activation_bytes - olmo_est.activation_bytes,
      32 * 4 * sbh, 1e-6 * olmo_est.activation_bytes);
  EXPECT_NEAR(olmo_est.activation_bytes -
                  estimate(olmo2_per_head, selene(), 8, 8, olmo_tp2).activation_bytes,
              32 * 2.0 * (4096 + 4096) * 4096 * (1 - 1.0 / 2), 1e-6 * olmo_est.activation_bytes);
  nn::GptConfig no_qk_norm = olmo2;
  nn::set_qk_norm(no_qk_norm, "false");
  EXPECT_NEAR(estimate(olmo2_per_head, selene(), 8, 8, olmo_tp2).activation_bytes -
                  estimate(no_qk_norm, selene(), 8, 8, olmo_tp2).activation_bytes,
              32 * 2.0 * (4096 + 4096) * 4096 / 2, 1e-6 * olmo_est.activation_bytes);
  const nn::GptConfig olmoe =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/olmoe_1b_7b.yaml");
  EXPECT_EQ(olmoe.num_parameters(), 6'919'161'856);
  EXPECT_DOUBLE_EQ(olmoe.active_parameter_count(), 1'282'017'280.0);
  // Gemma 7B: GeGLU, 16 heads of 256 on a d_model of 3072; the planner's
  // model is the one model.hf_config reads from its config.json.
  const nn::GptConfig gemma =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/gemma_7b.yaml");
  EXPECT_EQ(gemma.activation, nn::Activation::GeGlu);
  EXPECT_TRUE(gemma.norm_weight_offset);
  EXPECT_DOUBLE_EQ(gemma.embedding_multiplier, std::sqrt(3072.0));
  EXPECT_EQ(gemma.num_parameters(), 8'537'680'896);
  // Gemma 3 27B's language model: 62 layers of q (4096 x 5376), k and v
  // (2048 x 5376), o, the MLP (3 x 21504 x 5376), four norms and the two
  // head norms, plus the tied table of 262208 and the final norm; every
  // sixth layer global.
  const nn::GptConfig gemma3 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/gemma3_27b.yaml");
  EXPECT_TRUE(gemma3.post_norms && gemma3.qk_norm);
  EXPECT_EQ(gemma3.num_parameters(), 27'009'346'304);
  EXPECT_EQ(gemma3.full_attention_layers.size(), 10u);
  EXPECT_EQ(gemma3.window_of(59), 0);
  EXPECT_EQ(gemma3.window_of(60), 1024);
  // Gemma 2 9B: 42 layers of q (4096 x 3584), k and v (2048 x 3584), o,
  // the MLP (3 x 14336 x 3584) and four norms, plus the tied table of 256000
  // and the final norm; every other layer global, and its soft caps (the
  // logits' priced as a pass over them).
  const nn::GptConfig gemma2 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/gemma2_9b.yaml");
  EXPECT_TRUE(gemma2.post_norms);
  EXPECT_FALSE(gemma2.qk_norm);
  EXPECT_EQ(gemma2.num_parameters(), 9'241'705'984);
  EXPECT_EQ(gemma2.window_of(40), 4096);
  EXPECT_EQ(gemma2.window_of(41), 0);
  EXPECT_EQ(gemma2.attn_logit_softcap, 50.0);
  EXPECT_EQ(gemma2.final_logit_softcap, 30.0);
  // Pythia 6.9B: GPT-NeoX's blocks, the paper's parameter count, and its
  // parallel residual priced with one reduction a layer fewer under tp.
  const nn::GptConfig pythia =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/pythia_6.9b.yaml");
  EXPECT_TRUE(pythia.parallel_residual);
  EXPECT_EQ(pythia.activation, nn::Activation::GeluErf);
  EXPECT_EQ(pythia.num_parameters(), 6'857'302'016);
  nn::GptConfig sequential = pythia;
  sequential.parallel_residual = false;
  const ParallelConfig tp8 = layout(8, 1, 16, 1, Recompute::None);
  EXPECT_LT(estimate(pythia, selene(), 128, 1024, tp8).tp_comm_time,
            estimate(sequential, selene(), 128, 1024, tp8).tp_comm_time);
  // Phi-2: one norm for both sublayers and a biased head, the published
  // parameter count; its shared norm priced as one norm's activations less.
  const nn::GptConfig phi2 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/phi_2.yaml");
  EXPECT_TRUE(phi2.shared_norm);
  EXPECT_TRUE(phi2.head_bias);
  EXPECT_EQ(phi2.num_parameters(), 2'779'683'840);
  nn::GptConfig two_norms = phi2;
  two_norms.shared_norm = false;
  const ParallelConfig tp2 = layout(2, 1, 4, 1, Recompute::None);
  const Estimate shared = estimate(phi2, selene(), 8, 8, tp2),
                 apart = estimate(two_norms, selene(), 8, 8, tp2);
  EXPECT_LT(shared.activation_bytes, apart.activation_bytes);
  EXPECT_LT(shared.memory_bound_time, apart.memory_bound_time);
  // Falcon 7B (multi-query attention, one norm, no biases, tied) and GPT-J
  // 6B (biases on the MLP alone, a biased head): the published counts.
  const nn::GptConfig falcon =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/falcon_7b.yaml");
  EXPECT_EQ(falcon.kv_heads(), 1);
  EXPECT_EQ(falcon.num_parameters(), 6'921'720'704);
  const nn::GptConfig gptj =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/gptj_6b.yaml");
  EXPECT_TRUE(gptj.mlp_bias);
  EXPECT_EQ(gptj.num_parameters(), 6'050'882'784);
  // Nemotron-4 15B: LayerNorm1P, squared ReLU, half of each head turned,
  // untied: its count, and Hugging Face's class for it.
  const nn::GptConfig nemotron =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/nemotron4_15b.yaml");
  EXPECT_EQ(nemotron.activation, nn::Activation::Relu2);
  EXPECT_TRUE(nemotron.norm_weight_offset);
  EXPECT_EQ(nemotron.num_parameters(), 15'628'775'424);
  EXPECT_STREQ(io::hf_model_type(nemotron), "nemotron");
  EXPECT_EQ(nemotron.init_std, 0.0134);
  // Nemotron-4 340B: the paper's 331.6B non-embedding and 9.4B embedding
  // parameters, heads of 192.
  const nn::GptConfig nemotron340 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/nemotron4_340b.yaml");
  EXPECT_EQ(nemotron340.num_parameters(), 341'029'195'776);
  EXPECT_EQ(nemotron340.head_dim(), 192);
  // Mixtral 8x7B: the published parameter count, and the count a token
  // uses (two of eight experts); priced, a mixture holds its experts'
  // weights but computes two experts' FLOPs a token, so against the dense
  // model of the same width it needs more memory and little more time.
  const nn::GptConfig mixtral =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/mixtral_8x7b.yaml");
  EXPECT_EQ(mixtral.moe.experts, 8);
  EXPECT_EQ(mixtral.num_parameters(), 46'702'792'704);
  EXPECT_DOUBLE_EQ(mixtral.active_parameter_count(), 12'879'925'248.0);
  nn::GptConfig mistral = mixtral;
  mistral.moe = {};
  mistral.seq_len = 4096;
  nn::GptConfig mixtral_4k = mixtral;
  mixtral_4k.seq_len = 4096;
  const ParallelConfig tp8pp4 = layout(8, 4, 1, 1, Recompute::Selective);
  const Estimate sparse = estimate(mixtral_4k, selene(), 32, 32, tp8pp4),
                 dense = estimate(mistral, selene(), 32, 32, tp8pp4);
  EXPECT_GT(sparse.weights_bytes, 5.0 * dense.weights_bytes);
  EXPECT_GT(sparse.gemm_time, dense.gemm_time);
  EXPECT_LT(sparse.gemm_time, 2.5 * dense.gemm_time);
  EXPECT_NEAR(sparse.model_flops_per_step / dense.model_flops_per_step,
              mixtral_4k.training_flops(32) / mistral.training_flops(32), 1e-12);
  try {
    nn::GptConfig odd = mixtral_4k;
    odd.moe.ffn_hidden_size = 1001;
    estimate(odd, selene(), 32, 32, tp8pp4);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("moe.ffn_hidden_size (1001) must be divisible by tp (8)"),
              std::string::npos)
        << e.what();
  }
  // Qwen1.5-MoE-A2.7B: a shared expert of 5632 beside 60 routed experts;
  // its published counts, and the shared expert priced on every token
  // (its GEMMs, as wide as the routed four together, and its activations).
  const nn::GptConfig qwen2moe =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/qwen1.5_moe_a2.7b.yaml");
  EXPECT_EQ(qwen2moe.moe.shared_ffn_hidden_size, 5632);
  EXPECT_TRUE(qwen2moe.moe.shared_gate);
  EXPECT_EQ(qwen2moe.num_parameters(), 14'315'784'192);
  EXPECT_DOUBLE_EQ(qwen2moe.active_parameter_count(), 2'689'173'504.0);
  nn::GptConfig unshared = qwen2moe;
  unshared.moe.shared_ffn_hidden_size = 0;
  unshared.moe.shared_gate = false;
  const ParallelConfig qwen_tp2 = layout(2, 1, 4, 1, Recompute::Selective);
  const Estimate with_shared = estimate(qwen2moe, selene(), 8, 8, qwen_tp2),
                 without_shared = estimate(unshared, selene(), 8, 8, qwen_tp2);
  EXPECT_GT(with_shared.gemm_time, without_shared.gemm_time);
  EXPECT_GT(with_shared.activation_bytes, without_shared.activation_bytes);
  EXPECT_GT(with_shared.weights_bytes, without_shared.weights_bytes);
  try {
    nn::GptConfig odd = qwen2moe;
    odd.moe.shared_ffn_hidden_size = 5633;
    estimate(odd, selene(), 8, 8, qwen_tp2);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("moe.shared_ffn_hidden_size (5633) must be divisible by "
                                         "tp (2)"),
              std::string::npos)
        << e.what();
  }
  // GLM-4.5: DeepSeek-V3's router over 160 experts after 3 dense layers,
  // a shared expert one expert wide; its counts without the prediction
  // layer (Hugging Face's GLM-4.5 config reads to the same, hf_config_test),
  // the expert biases (160 a mixture layer) among them. The router's way
  // of choosing costs nothing the planner prices: a softmax one estimates
  // the same.
  const nn::GptConfig glm45 =
      load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/glm4_5.yaml");
  EXPECT_EQ(glm45.moe.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_TRUE(glm45.moe.expert_bias);
  EXPECT_EQ(glm45.num_parameters(), 352'797'829'024);
  EXPECT_DOUBLE_EQ(glm45.active_parameter_count(), 33'632'266'144.0);
  nn::GptConfig softmax = glm45;
  softmax.moe.score = nn::GptConfig::Moe::Score::Softmax;
  softmax.moe.routed_scaling_factor = 1;
  softmax.moe.expert_bias = false;
  EXPECT_EQ(glm45.num_parameters() - softmax.num_parameters(), 89 * 160);
  const ParallelConfig glm_layout = layout(8, 4, 4, 1, Recompute::Selective);
  EXPECT_DOUBLE_EQ(estimate(glm45, selene(), 128, 64, glm_layout).gemm_time,
                   estimate(softmax, selene(), 128, 64, glm_layout).gemm_time);
  // A capacity factor below 1 caps each expert's rows: less expert work
  // and fewer kept activations than dropless routing; 1 or more is priced
  // as dropless (balanced routing fills no expert past its share).
  nn::GptConfig capped = mixtral_4k;
  capped.moe.capacity_factor = 0.5;
  const Estimate half = estimate(capped, selene(), 32, 32, tp8pp4);
  EXPECT_LT(half.gemm_time, sparse.gemm_time);
  EXPECT_LT(half.activation_bytes, sparse.activation_bytes);
  capped.moe.capacity_factor = 1.5;
  EXPECT_DOUBLE_EQ(estimate(capped, selene(), 32, 32, tp8pp4).gemm_time, sparse.gemm_time);
  // Padded to that capacity (model.moe.pad_to_capacity), every slot runs:
  // half again the dropless routing's expert work and kept rows; padded to
  // half, as capped to half.
  capped.moe.pad_to_capacity = true;
  const Estimate padded = estimate(capped, selene(), 32, 32, tp8pp4);
  EXPECT_GT(padded.gemm_time, sparse.gemm_time);
  EXPECT_GT(padded.activation_bytes, sparse.activation_bytes);
  capped.moe.capacity_factor = 0.5;
  EXPECT_DOUBLE_EQ(estimate(capped, selene(), 32, 32, tp8pp4).gemm_time, half.gemm_time);
  // Padded under context parallelism every rank all-gathers the
  // micro-batch's tokens, probabilities and the experts' outputs over the
  // context group (reduce-scatters backward): priced with the mixture's
  // exchanges, and nothing of the kind unpadded (the host routes it).
  ParallelConfig cp2 = layout(8, 4, 1, 1, Recompute::Selective);
  cp2.cp = 2;
  cp2.attention = Attention::Flash;
  const Estimate gathered = estimate(capped, selene(), 64, 32, cp2);
  EXPECT_GT(gathered.ep_comm_time, 0.0);
  nn::GptConfig unpadded = capped;
  unpadded.moe.pad_to_capacity = false;
  const Estimate host_routed = estimate(unpadded, selene(), 64, 32, cp2);
  EXPECT_EQ(host_routed.ep_comm_time, 0.0);
  // (It also keeps the whole micro-batch's outputs before the gates.)
  EXPECT_GT(gathered.activation_bytes, host_routed.activation_bytes);
  ParallelConfig cp4 = cp2;
  cp4.cp = 4;
  EXPECT_GT(estimate(capped, selene(), 128, 32, cp4).ep_comm_time, gathered.ep_comm_time);
  // Expert parallelism over the data-parallel ranks: the experts' weights
  // and optimizer state shared out (ZeRO-1 over their own replicas), two
  // all-to-all exchanges each way per MoE layer, none without it.
  ParallelConfig dp8 = layout(2, 1, 8, 1, Recompute::Selective);
  dp8.zero1 = true;
  ParallelConfig ep8 = dp8;
  ep8.ep = 8;
  const Estimate replicated = estimate(mixtral_4k, selene(), 16, 64, dp8),
                 spread = estimate(mixtral_4k, selene(), 16, 64, ep8);
  EXPECT_EQ(replicated.ep_comm_time, 0.0);
  EXPECT_GT(spread.ep_comm_time, 0.0);
  const double expert_weights = 2.0 * mixtral_4k.expert_parameter_count() / 2;  // fp16, tp 2
  EXPECT_NEAR(replicated.weights_bytes - spread.weights_bytes, expert_weights * 7.0 / 8.0,
              1e-6 * expert_weights);
  EXPECT_NEAR(replicated.gradient_bytes - spread.gradient_bytes, 2.0 * expert_weights * 7.0 / 8.0,
              1e-6 * expert_weights);
  // (ZeRO-1 already shards the experts' optimizer state over dp: the same
  // bytes either way; without it, 1/ep of the experts' state.)
  EXPECT_NEAR(spread.optimizer_bytes, replicated.optimizer_bytes, 1e-6 * expert_weights);
  ParallelConfig plain_ep = ep8;
  plain_ep.zero1 = false;
  ParallelConfig plain_dp = dp8;
  plain_dp.zero1 = false;
  EXPECT_NEAR(estimate(mixtral_4k, selene(), 16, 64, plain_dp).optimizer_bytes -
                  estimate(mixtral_4k, selene(), 16, 64, plain_ep).optimizer_bytes,
              6.0 * expert_weights * 7.0 / 8.0, 1e-6 * expert_weights);
  EXPECT_NE(spread.config.str().find("ep=8"), std::string::npos);
  EXPECT_NE(spread.json().find("\"ep_comm_per_microbatch_s\""), std::string::npos);
  try {
    ParallelConfig bad = dp8;
    bad.ep = 3;
    estimate(mixtral_4k, selene(), 16, 64, bad);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ep (3) must divide dp (8)"), std::string::npos)
        << e.what();
  }
  const nn::GptConfig switched = parse_model_spec(
      "{n_layer: 4, n_head: 4, d_model: 8, vocab_size: 10, seq_len: 4, activation: swiglu, "
      "moe: {experts: 4, top_k: 1, ffn_hidden_size: 6, dense_layers: [0, 2]}}");
  EXPECT_EQ(switched.moe.dense_layers, (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(switched.moe_layer(1));
  EXPECT_FALSE(switched.moe_layer(2));
  // A trainer's model section: its dropout (which keeps both reductions) is read too.
  const nn::GptConfig dropped = parse_model_spec(
      "{n_layer: 2, n_head: 4, d_model: 8, vocab_size: 10, seq_len: 4, parallel_residual: true, "
      "dropout: 0.1}");
  EXPECT_TRUE(dropped.parallel_residual);
  EXPECT_EQ(dropped.dropout, 0.1);
  try {
    parse_model_spec(
        "{n_layer: 2, n_head: 4, n_kv_head: 3, d_model: 8, vocab_size: 10, "
        "seq_len: 4}");
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_head (3)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace triad::plan
