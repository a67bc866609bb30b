// Training throughput of GPT-2 shaped models on one GPU: forward, backward,
// clipping and AdamW on random tokens, in fp32, bf16 or fp16 (f32 masters).
// Prints one JSON line: tokens/s, step time, model TFLOP/s (PTD-P count,
// attention included), MFU against --peak-tflops, peak device memory, and
// where a step's time goes: forward with the loss, backward, clipping and
// optimizer, the device's time over the same timed steps (events on the
// compute stream, DeviceTimer: the host does not wait between phases).
// --recompute selective|full measures what activation recomputation saves
// (peak_memory_gib) and costs (tokens/s). --cuda-graph captures the forward
// and backward passes once and replays them each step (cuda::capture).
//   bench_train_gpu --preset 124m --batch 16 --precision bf16 --peak-tflops 989
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#ifdef TRIAD_CUDA_SIM
#include "cuda_sim/sim.h"
#endif

#include "triad/autograd/engine.h"
#include "triad/backend/cuda.h"
#include "triad/backend/device_timer.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"
#include "triad/optim/clip.h"

namespace {
int run(int argc, char** argv) {
  CLI::App app{"Triad GPU training throughput"};
  std::string preset = "124m", precision = "bf16", device_name = "cuda:0";
  int64_t batch = 16, seq = 1024, steps = 10, warmup = 3;
  double peak_tflops = 989.0;
  app.add_option("--preset", preset, "124m | 350m | tiny")
      ->check(CLI::IsMember({"124m", "350m", "tiny"}));
  app.add_option("--precision", precision)->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--device", device_name);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--peak-tflops", peak_tflops, "dense peak of the device in this precision");
  int64_t n_layer = 0, d_model = 0, n_head = 0, vocab = 0;
  app.add_option("--n-layer", n_layer, "override the preset's layers");
  app.add_option("--d-model", d_model, "override the preset's width");
  app.add_option("--n-head", n_head, "override the preset's heads");
  app.add_option("--vocab", vocab, "override the vocabulary (default 50304)");
  std::string attention = "auto";
  app.add_option("--attention-kernel", attention, "auto | simt | tensor_core | cudnn");
  bool nondeterministic = false;
  app.add_flag("--attention-nondeterministic", nondeterministic,
               "let cuDNN's attention backward accumulate dQ with atomics");
  bool bias_grad_epilogue = false;
  app.add_flag("--bias-grad-epilogue", bias_grad_epilogue,
               "the linear layers' bias gradients in the weight gradient GEMM's epilogue "
               "(cuBLASLt's BGRADB; cuda::GemmSettings::bias_grad_epilogue), not by the "
               "column-sum kernel");
  bool dgelu_bias_grad_epilogue = false;
  app.add_flag("--dgelu-bias-grad-epilogue", dgelu_bias_grad_epilogue,
               "the MLPs' first bias gradients from the GELU-derivative GEMM's epilogue "
               "(cuBLASLt's DGELU_BGRAD; cuda::GemmSettings::dgelu_bias_grad_epilogue), not by "
               "the column-sum kernel");
  bool gelu_apart = false;
  app.add_flag("--gelu-apart", gelu_apart,
               "the MLPs' first products with their bias alone, then the GELU kernel, not GELU "
               "in the products' epilogue (cuda::GemmSettings::gelu_epilogue false)");
  bool add_norm_bias_sums = false;
  app.add_flag("--add-norm-bias-sums", add_norm_bias_sums,
               "the output projections' bias gradients from the add-norm backward's sums "
               "(cuda::set_add_norm_bias_sums), not by the column-sum kernel");
  bool norm_backward_register_sums = false;
  app.add_flag("--norm-backward-register-sums", norm_backward_register_sums,
               "the LayerNorm backward's weight and bias column sums in each lane's registers "
               "over its rows (cuda::set_norm_backward_register_sums), not in shared memory");
  int gemm_autotune = 0;
  app.add_option("--gemm-autotune", gemm_autotune,
                 "time up to this many of cuBLASLt's candidate algorithms on each product's "
                 "first call and keep the fastest (cuda::GemmSettings::autotune; 0: the "
                 "heuristic's first choice)")
      ->check(CLI::Range(0, 64));
  std::string recompute = "none";
  app.add_option("--recompute", recompute,
                 "activation recomputation: none | selective (attention core) | full (each "
                 "block's forward again in backward); MFU still counts model FLOPs only")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  std::string activation = "gelu";
  app.add_option("--activation", activation,
                 "the MLPs' (and experts') activation, model.activation: gelu (GPT-2's, fused "
                 "into its products) | gelu_erf | swiglu | geglu | relu2 (a mixture's experts "
                 "then run as grouped products)")
      ->check(CLI::IsMember({"gelu", "gelu_erf", "swiglu", "geglu", "relu2"}));
  int64_t experts = 0, top_k = 2;
  app.add_option("--experts", experts,
                 "a mixture of this many experts in every layer (model.moe; 0: dense MLPs)");
  app.add_option("--top-k", top_k, "experts each token takes (with --experts)");
  double capacity_factor = 0, moe_z_loss = 0;
  app.add_option("--capacity-factor", capacity_factor,
                 "each expert's capacity as a multiple of a balanced share, the rest dropped "
                 "(model.moe.capacity_factor, with --experts; 0: dropless)")
      ->check(CLI::NonNegativeNumber);
  bool pad_to_capacity = false;
  app.add_flag("--pad-to-capacity", pad_to_capacity,
               "each expert's batch padded to its capacity, routed on the device with no wait "
               "(model.moe.pad_to_capacity; with --capacity-factor): what "
               "lets --cuda-graph capture a mixture");
  app.add_option("--moe-z-loss", moe_z_loss,
                 "the router z-loss's coefficient (model.moe.z_loss_coef, with --experts)")
      ->check(CLI::NonNegativeNumber);
  std::string moments = "fp32", grads = "fp32";
  app.add_option("--moment-precision", moments,
                 "fp32 | bf16: the AdamW moments' storage (train.moment_precision)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--grad-precision", grads,
                 "fp32 | bf16: the gradients' dtype under bf16 (train.grad_precision)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  bool sync_free = false;
  app.add_flag("--sync-free", sync_free,
               "clip on the device (AdamW::step_clipped) and read the loss only after the timed "
               "steps: no step waits for the device, as PyTorch's loop in train_gpu_torch.py "
               "(the default reads the norm and the loss each step, as triad-train does)");
  bool host_routing = false;
  app.add_flag("--host-routing", host_routing,
               "steps without a cuda::DeviceChecks: a dropless mixture reads its routing on the "
               "host once a layer and runs cuBLASLt's products on its experts' rows (the default "
               "groups them and sizes Triad's grouped products on the device, no wait)");
  bool cuda_graph = false;
  app.add_flag("--cuda-graph", cuda_graph,
               "capture the forward and backward passes once after the warm-up "
               "(cuda::capture) and replay them each step as one launch, the batch refilled "
               "in device tensors first; clipping and AdamW stay outside the graph (the "
               "profiled steps of --profile-steps run uncaptured)");
  int64_t profile_steps = 0;
  app.add_option("--profile-steps", profile_steps,
                 "after the timed steps, this many more with the device's time per backend op "
                 "recorded (\"op_profile\" in the JSON line)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (grads == "bf16" && precision != "bf16") {
    std::fprintf(stderr, "--grad-precision bf16 needs --precision bf16\n");
    return 2;
  }
  if (cuda_graph && warmup < 2) {
    // (Eager steps first, so that what libraries set up on first use is not
    // captured; the graph's first replay is the last warm-up step.)
    std::fprintf(stderr, "--cuda-graph needs --warmup 2 or more (got %lld)\n",
                 static_cast<long long>(warmup));
    return 2;
  }
  if (cuda_graph && experts > 0 && !pad_to_capacity && capacity_factor > 0) {
    // (A capped mixture not padded reads its routing on the host.)
    std::fprintf(stderr,
                 "--cuda-graph: a mixture of experts capped by --capacity-factor waits for its "
                 "routing in every layer, which a CUDA graph cannot hold (--pad-to-capacity "
                 "routes it on the device)\n");
    return 2;
  }
  if (host_routing && (cuda_graph || sync_free)) {
    std::fprintf(stderr,
                 "--host-routing waits for the device in every mixture layer: not with "
                 "--cuda-graph or --sync-free\n");
    return 2;
  }
  if (pad_to_capacity && (experts == 0 || capacity_factor == 0)) {
    std::fprintf(stderr, "--pad-to-capacity needs --experts and --capacity-factor\n");
    return 2;
  }

  triad::cuda::set_attention_kernel(triad::cuda::attention_kernel_from_string(attention));
  triad::cuda::set_attention_deterministic(!nondeterministic);
  triad::cuda::set_add_norm_bias_sums(add_norm_bias_sums);
  triad::cuda::set_norm_backward_register_sums(norm_backward_register_sums);
  {
    triad::cuda::GemmSettings gemm = triad::cuda::gemm_settings();
    gemm.bias_grad_epilogue = bias_grad_epilogue;
    gemm.dgelu_bias_grad_epilogue = dgelu_bias_grad_epilogue;
    gemm.gelu_epilogue = !gelu_apart;
    gemm.autotune = gemm_autotune;
    triad::cuda::set_gemm_settings(gemm);
  }
  triad::nn::GptConfig cfg;
  if (preset == "350m") {
    cfg.n_layer = 24, cfg.n_head = 16, cfg.d_model = 1024;
  } else if (preset == "tiny") {
    cfg.n_layer = 2, cfg.n_head = 4, cfg.d_model = 128;
  }
  cfg.vocab_size = 50304;  // GPT-2's 50257 padded to a multiple of 128
  // Overrides (a tiny width with the full depth measures the framework's
  // own cost per step: the launches and bookkeeping the GPU must not wait on).
  if (n_layer > 0) cfg.n_layer = n_layer;
  if (d_model > 0) cfg.d_model = d_model;
  if (n_head > 0) cfg.n_head = n_head;
  if (vocab > 0) cfg.vocab_size = vocab;
  cfg.seq_len = seq;
  cfg.recompute = triad::nn::recompute_from_string(recompute);
  cfg.activation = triad::nn::activation_from_string(activation);
  cfg.moe.experts = experts;
  cfg.moe.top_k = top_k;
  cfg.moe.capacity_factor = capacity_factor;
  cfg.moe.z_loss_coef = moe_z_loss;
  cfg.moe.pad_to_capacity = pad_to_capacity;
  const triad::Device device = triad::device_from_string(device_name);
  const triad::DType dtype = precision == "bf16"   ? triad::DType::BF16
                             : precision == "fp16" ? triad::DType::F16
                                                   : triad::DType::F32;
  triad::nn::Gpt model(cfg, 1);
  model.to(device);
  model.to(dtype);
  if (grads == "bf16") {
    for (auto& p : model.parameters()) p.set_half_grad(true);
  }
  triad::optim::AdamWOptions adamw;
  adamw.moment_dtype = moments == "bf16" ? triad::DType::BF16 : triad::DType::F32;
  triad::optim::AdamW opt(model.named_parameters(), adamw);
  const int64_t T = cfg.seq_len;
  std::vector<int64_t> in, tg;
  for (int64_t i = 0; i < batch * T; ++i) {
    in.push_back(
        static_cast<int64_t>((i * 2654435761u) % std::min<int64_t>(50257, cfg.vocab_size)));
    tg.push_back(
        static_cast<int64_t>(((i + 1) * 2654435761u) % std::min<int64_t>(50257, cfg.vocab_size)));
  }
  // On the host, as the trainer keeps its batches (the embedding and the loss
  // upload them without waiting for the device).
  triad::Tensor ids = triad::from_vector(in, {batch, T});
  triad::Tensor targets = triad::from_vector(tg, {batch, T});
  double loss = 0;
  triad::Tensor last_loss;  // (--sync-free: read after the timed steps)
  // Clipping as the trainer does it: the global norm, read in one copy with
  // the step's loss (the step's one wait), then its coefficient folded into
  // the AdamW step (no pass over every gradient to scale it). --sync-free:
  // the same coefficient decided on the device (a non-finite norm skips the
  // update there), the loss read after the timed steps.
  // An uncaptured step's checks of the indices it formed on the device (a
  // padded mixture's routing: cuda::DeviceChecks, as the trainer opens)
  // come back in the same copy; --sync-free: checked after the clock.
  std::vector<std::unique_ptr<triad::cuda::DeviceChecks>> unchecked;
  auto clip_and_step = [&](const triad::Tensor& l,
                           std::unique_ptr<triad::cuda::DeviceChecks> checks) {
    std::vector<triad::Tensor> grads;
    for (const triad::Tensor& p : model.parameters())
      if (p.grad().defined()) grads.push_back(p.grad());
    const triad::Tensor squares = triad::optim::sum_of_squares_device(grads);
    if (sync_free) {
      opt.step_clipped(1e-4, squares, 1.0);
      if (checks) unchecked.push_back(std::move(checks));
      return;
    }
    std::vector<triad::Tensor> read{squares, l};
    const std::vector<triad::Tensor> words =
        checks ? checks->words() : std::vector<triad::Tensor>{};
    read.insert(read.end(), words.begin(), words.end());
    const std::vector<double> both = triad::items(read);
    if (checks) checks->check(std::vector<int64_t>(both.begin() + 2, both.end()));
    const double norm = std::sqrt(both.at(0));
    loss = both.at(1);
    opt.step(1e-4, std::isfinite(norm) ? std::min(1.0, 1.0 / (norm + 1e-6)) : 1.0);
  };
  triad::DeviceTimer phases(device);
  bool timing = false;  // (the timed steps' phases)
  // The host's time to queue the timed steps' forward and backward passes
  // (on a GPU the device runs them meanwhile; each step's read of the norm
  // left it with only the last optimizer step queued): against the
  // device's time for them ("phases_ms"), how close the host comes to
  // holding the device up, and what capturing the passes would save it.
  double host_queue_ms = 0;
  // --cuda-graph: the passes captured after the warm-up, on the batch in
  // device tensors (refilled before each replay, as a trainer refills them
  // from its loader); the gradients the graph writes stay between steps.
  triad::cuda::Graph graph;
  triad::Tensor dev_ids, dev_targets, graph_loss;
  auto replay_step = [&] {
    const auto h0 = std::chrono::steady_clock::now();
    const triad::DeviceTimer::Mark m0 = phases.mark();
    triad::copy_(dev_ids, ids);
    triad::copy_(dev_targets, targets);
    graph.replay();
    const triad::DeviceTimer::Mark m1 = phases.mark();
    if (timing) {
      host_queue_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
    }
    clip_and_step(graph_loss, nullptr);
    const triad::DeviceTimer::Mark m2 = phases.mark();
    last_loss = graph_loss;
    if (!timing) return;
    phases.add("forward_backward", m0, m1);
    phases.add("clip_and_optimizer", m1, m2);
  };
  auto run_step = [&] {
    if (!graph.empty()) return replay_step();
    const auto h0 = std::chrono::steady_clock::now();
    const triad::DeviceTimer::Mark m0 = phases.mark();
    auto checks = device.is_cuda() && !host_routing
                      ? std::make_unique<triad::cuda::DeviceChecks>(device.index)
                      : nullptr;
    triad::Tensor l = model.loss(ids, targets);
    const triad::DeviceTimer::Mark m1 = phases.mark();
    triad::autograd::backward({l});
    if (checks) checks->close();
    const triad::DeviceTimer::Mark m2 = phases.mark();
    if (timing) {
      host_queue_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
    }
    clip_and_step(l, std::move(checks));
    model.zero_grad();
    const triad::DeviceTimer::Mark m3 = phases.mark();
    last_loss = l;
    if (!timing) return;  // (the caller reads the marks: phases.read())
    phases.add("forward", m0, m1);
    phases.add("backward", m1, m2);
    phases.add("clip_and_optimizer", m2, m3);
  };
  for (int64_t i = 0; i < warmup - (cuda_graph ? 1 : 0); ++i) {
    run_step();
    phases.read();  // (the warm-up's marks, dropped)
  }
  if (cuda_graph) {
    // (After the warm-up: cuDNN's plans, the attention's choice and the
    // products' algorithms are made; zero_grad left no gradients, so the
    // capture's backward writes new ones rather than adding.)
    dev_ids = triad::to_device(ids, device);
    dev_targets = triad::to_device(targets, device);
    // (The warm-up's cached blocks back to the device: the graph's own pool
    // takes their place instead of adding to them.)
    triad::cuda::empty_cache(device.index);
    graph = triad::cuda::capture(device.index, [&] {
      graph_loss = model.loss(dev_ids, dev_targets);
      triad::autograd::backward({graph_loss});
    });
    run_step();  // (its first replay: the last warm-up step)
    graph.check();
    phases.read();
  }
#ifdef TRIAD_CUDA_SIM
  // On the simulator: how often one step makes the host wait for the
  // device (each wait empties the queue of launches the GPU runs ahead on).
  const int64_t waits_before = triad_sim::counters().host_waits;
  run_step();
  const int64_t host_waits = triad_sim::counters().host_waits - waits_before;
  phases.read();
#endif
  timing = true;
  // Blocks the caching allocator had to ask the device for during the timed
  // steps (each a cudaMalloc on the step's path): none when every step's
  // tensors repeat the sizes the warm-up cached.
  const int64_t system_allocs_before =
      device.is_cuda() ? triad::cuda::memory_stats(device.index).system_allocs : 0;
  // Products that asked cuBLASLt's heuristic for an algorithm during the
  // timed steps (each a host call on the step's path, and with autotuning a
  // timing that waits), and those that took their class's algorithm: a
  // mixture's experts' token counts are new shapes every step.
  const triad::cuda::GemmTuning gemm_before =
      device.is_cuda() ? triad::cuda::gemm_tuning(device.index) : triad::cuda::GemmTuning{};
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) run_step();
  // The clock stops once the device has run every step, the last one's
  // optimizer included (queued after the step's one wait): reading the
  // last loss again waits for all of it. (--sync-free: the only read.)
  if (last_loss.defined()) {
    const double last = triad::item(last_loss);
    if (sync_free) loss = last;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // (The replays' checks of the ids and targets, after the clock: the batch
  // is the same each step, and the device is idle by now.)
  if (!graph.empty()) graph.check();
  for (const auto& checks : unchecked) checks->check();
  unchecked.clear();
  const double tokens_per_s = static_cast<double>(steps * batch * T) / secs;
  // (That read has made the host wait for the phases: no wait here.)
  nlohmann::json phases_ms = nlohmann::json::object();
  for (const auto& [phase, seconds] : phases.read())
    phases_ms[phase] = 1e3 * seconds / static_cast<double>(std::max<int64_t>(steps, 1));
  timing = false;
  // PTD-P model FLOPs (forward and backward, no recomputation) per token:
  // 72 L h^2 (1 + s / (6h) + V / (12 L h)) for GPT-2's blocks, a mixture's
  // router and top k experts in its layers; the count the trainer's MFU uses.
  const double flops_per_token = cfg.training_flops(1.0) / static_cast<double>(T);
  const double tflops = tokens_per_s * flops_per_token / 1e12;
  nlohmann::json j{
      {"impl", "triad"},
      {"preset", preset},
      {"precision", precision},
      {"sync_free", sync_free},
      {"cuda_graph", cuda_graph},
      {"attention_kernel", attention},
      {"attention_deterministic", !nondeterministic},
      {"bias_grad_epilogue", bias_grad_epilogue},
      {"dgelu_bias_grad_epilogue", dgelu_bias_grad_epilogue},
      {"gelu_apart", gelu_apart},
      {"add_norm_bias_sums", add_norm_bias_sums},
      {"norm_backward_register_sums", norm_backward_register_sums},
      {"recompute", recompute},
      {"activation", activation},
      {"moment_precision", moments},
      {"grad_precision", grads},
      {"device", device.str()},
      {"batch", batch},
      {"seq", T},
      {"vocab", cfg.vocab_size},
      {"params", model.num_parameters()},
      {"experts", experts},
      {"top_k", experts > 0 ? top_k : 0},
      {"capacity_factor", experts > 0 ? capacity_factor : 0.0},
      {"moe_z_loss", experts > 0 ? moe_z_loss : 0.0},
      {"pad_to_capacity", pad_to_capacity},
      {"host_routing", host_routing},
      {"active_params", cfg.active_parameter_count()},
      {"tokens_per_s", tokens_per_s},
      {"step_ms", secs * 1000.0 / static_cast<double>(steps)},
      {"model_tflops", tflops},
      {"mfu", peak_tflops > 0 ? tflops / peak_tflops : 0.0},
      {"loss", loss},
      {"phases_ms", phases_ms},
      {"host_queue_ms",
       {{"forward_backward", host_queue_ms / static_cast<double>(std::max<int64_t>(steps, 1))}}}};
#ifdef TRIAD_CUDA_SIM
  j["host_waits_per_step"] = host_waits;
#endif
  if (device.is_cuda() && gemm_autotune > 1) {
    // What the timing found (once per distinct product, in the warm-up).
    const triad::cuda::GemmTuning t = triad::cuda::gemm_tuning(device.index);
    j["gemm_autotune"] = {{"candidates", gemm_autotune}, {"problems", t.problems},
                          {"changed", t.changed},        {"untimed", t.untimed},
                          {"first_ms", t.first_ms},      {"best_ms", t.best_ms}};
  }
  if (device.is_cuda()) {
    const triad::cuda::GemmTuning gemm_after = triad::cuda::gemm_tuning(device.index);
    const double per_step = 1.0 / static_cast<double>(std::max<int64_t>(steps, 1));
    j["gemm_queries_per_step"] =
        static_cast<double>(gemm_after.queried - gemm_before.queried) * per_step;
    j["gemm_reused_per_step"] =
        static_cast<double>(gemm_after.reused - gemm_before.reused) * per_step;
    j["system_allocs_per_step"] =
        static_cast<double>(triad::cuda::memory_stats(device.index).system_allocs -
                            system_allocs_before) /
        static_cast<double>(std::max<int64_t>(steps, 1));
    j["peak_memory_gib"] =
        static_cast<double>(triad::cuda::memory_stats(device.index).peak_allocated) /
        (1024.0 * 1024.0 * 1024.0);
  }
  if (device.is_cuda() && profile_steps > 0) {
    // Where a step's time goes: the device's time per backend op over
    // further steps (each call bracketed by events, so slightly slower),
    // per step, against the step's own time.
    triad::cuda::op_profile(device.index);  // drop anything recorded before
    triad::cuda::set_op_profiling(true);
    // (A graph's replay cannot be timed op by op: the profiled steps run
    // uncaptured, after the graph is gone, its gradients dropped first.)
    if (!graph.empty()) {
      graph = triad::cuda::Graph();
      model.zero_grad();
    }
    const auto p0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < profile_steps; ++i) run_step();
    phases.read();  // (also waits for a --sync-free run's last step)
    for (const auto& checks : unchecked) checks->check();
    unchecked.clear();
    const double profiled_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count() /
        static_cast<double>(profile_steps);
    triad::cuda::set_op_profiling(false);
    double total = 0;
    nlohmann::json ops = nlohmann::json::array();
    const auto times = triad::cuda::op_profile(device.index);
    for (const auto& t : times) total += t.ms;
    for (const auto& t : times) {
      ops.push_back({{"op", t.op},
                     {"calls_per_step", static_cast<double>(t.calls) / profile_steps},
                     {"ms_per_step", t.ms / profile_steps},
                     {"share", total > 0 ? t.ms / total : 0.0}});
    }
    j["op_profile"] = {{"steps", profile_steps},
                       {"step_ms", profiled_ms},
                       {"ops_ms_per_step", total / profile_steps},
                       {"ops", ops}};
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_gpu: %s\n", e.what());
    return 1;
  }
}
