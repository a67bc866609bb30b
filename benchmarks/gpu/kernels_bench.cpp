// Each CUDA kernel family at GPT-2 124M shapes (B 8, T 1024, C 768, NH 12,
// V 50304) in bf16, and decoding's attention over a cache of T slots, timed
// over repeated launches on the device's compute stream, against the
// device's ceilings: achieved GB/s over --hbm-gbs for memory-bound kernels,
// TFLOP/s over --peak-tflops for GEMMs and attention.
// One JSON line per kernel, then the launch-gap probe's two (stream and
// CUDA graph).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "triad/backend/backend.h"
#include "triad/backend/cuda.h"
#include "triad/nn/documents.h"
#include "triad/ops.h"

namespace {

using triad::DType;
using triad::Tensor;

double time_ms(const std::function<void()>& f, int iters) {
  f();  // warm up (allocations, cuBLASLt heuristics)
  triad::cuda::synchronize(0);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  triad::cuda::synchronize(0);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
             .count() /
         iters;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Triad CUDA kernel benchmarks"};
  int64_t B = 8, T = 1024, C = 768, NH = 12, V = 50304;
  int iters = 20;
  double hbm_gbs = 4800, peak_tflops = 989;
  app.add_option("--batch", B);
  app.add_option("--seq", T);
  app.add_option("--d-model", C);
  app.add_option("--heads", NH);
  app.add_option("--vocab", V);
  app.add_option("--iters", iters);
  app.add_option("--hbm-gbs", hbm_gbs, "memory bandwidth ceiling (GB/s)");
  app.add_option("--peak-tflops", peak_tflops, "dense bf16 matrix ceiling (TFLOP/s)");
  int64_t P = 124'000'000;
  app.add_option("--adamw-params", P, "parameters in the AdamW step (GPT-2 124M's by default)");
  bool no_sweep = false;
  app.add_flag("--no-sweep", no_sweep,
               "attention at the main shape only (skip the sweep across model shapes)");
  CLI11_PARSE(app, argc, argv);
  if (triad::cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device visible\n");
    return 77;
  }
  const triad::Device gpu = triad::Device::cuda(0);
  triad::Backend& be = triad::backend_for(triad::DeviceType::CUDA);
  const DType bf = DType::BF16;
  const int64_t N = B * T;
  auto rnd = [&](const triad::Shape& s, uint64_t stream, DType d = DType::BF16) {
    return triad::to_device(triad::randn(s, 1, stream, 1.0, d), gpu);
  };
  auto report = [&](const std::string& name, double ms, double bytes, double flops) {
    nlohmann::json j{{"kernel", name}, {"ms", ms}};
    if (bytes > 0) {
      const double gbs = bytes / (ms / 1e3) / 1e9;
      j["gb_per_s"] = gbs;
      j["of_hbm"] = gbs / hbm_gbs;
    }
    if (flops > 0) {
      const double tf = flops / (ms / 1e3) / 1e12;
      j["tflops"] = tf;
      j["of_peak"] = tf / peak_tflops;
    }
    std::printf("%s\n", j.dump().c_str());
  };
  const double h = 2.0;  // bytes per bf16 element

  Tensor x = rnd({N, C}, 1), w = rnd({C}, 2), b = rnd({C}, 3), y = triad::empty({N, C}, bf, gpu);
  Tensor mean = triad::empty({N}, DType::F32, gpu), rstd = triad::empty({N}, DType::F32, gpu);
  report("layer_norm_forward",
         time_ms([&] { be.layer_norm_forward(x, w, b, 1e-5, y, mean, rstd, 0.0); }, iters),
         2 * N * C * h, 0);
  Tensor dx = triad::empty({N, C}, bf, gpu), dw = triad::empty({C}, bf, gpu),
         db = triad::empty({C}, bf, gpu);
  report("layer_norm_backward",
         time_ms([&] { be.layer_norm_backward(y, x, w, mean, rstd, dx, dw, db, 0.0); }, iters),
         4 * N * C * h, 0);
  // The same with each lane's column sums in registers
  // (cuda::set_norm_backward_register_sums), against the shared-memory sums.
  triad::cuda::set_norm_backward_register_sums(true);
  report("layer_norm_backward_register_sums",
         time_ms([&] { be.layer_norm_backward(y, x, w, mean, rstd, dx, dw, db, 0.0); }, iters),
         4 * N * C * h, 0);
  triad::cuda::set_norm_backward_register_sums(false);
  // The residual add fused into the LayerNorm: reads x, r; writes h, y (and
  // back: reads dy, dh, h; writes dx), against residual_add + layer_norm.
  Tensor r = rnd({N, C}, 13), hsum = triad::empty({N, C}, bf, gpu);
  report("add_layer_norm_forward",
         time_ms([&] { be.add_layer_norm_forward(x, r, w, b, 1e-5, hsum, y, mean, rstd, 0.0); },
                 iters),
         4 * N * C * h, 0);
  report("add_layer_norm_backward",
         time_ms([&] { be.add_layer_norm_backward(y, r, hsum, w, mean, rstd, dx, dw, db, 0.0); },
                 iters),
         5 * N * C * h, 0);
  // The same at GPT-2 350M's training step (16 sequences of T, C 1024) as a
  // block runs them: the residual add in the forward, its gradient added
  // in the backward, the parameters' gradients into f32 (both add-norm
  // kernels hold each lane's part of a row in registers at this width).
  {
    const int64_t rows = 16 * T, width = 1024;
    Tensor xs = rnd({rows, width}, 50), rs = rnd({rows, width}, 51), ws = rnd({width}, 52),
           bs = rnd({width}, 53), hs = triad::empty({rows, width}, bf, gpu),
           ys = triad::empty({rows, width}, bf, gpu), dxs = triad::empty({rows, width}, bf, gpu);
    Tensor ms = triad::empty({rows}, DType::F32, gpu), rss = triad::empty({rows}, DType::F32, gpu);
    Tensor dws = triad::empty({width}, DType::F32, gpu),
           dbs = triad::empty({width}, DType::F32, gpu);
    const std::string shape = "_" + std::to_string(rows) + "x" + std::to_string(width);
    report("add_layer_norm_forward" + shape,
           time_ms([&] { be.add_layer_norm_forward(xs, rs, ws, bs, 1e-5, hs, ys, ms, rss, 0.0); },
                   iters),
           4 * rows * width * h, 0);
    // (Then with each lane's column sums in registers,
    // cuda::set_norm_backward_register_sums.)
    for (const bool registers : {false, true}) {
      triad::cuda::set_norm_backward_register_sums(registers);
      report("add_layer_norm_backward_into_f32" + std::string(registers ? "_register_sums" : "") +
                 shape,
             time_ms(
                 [&] {
                   be.layer_norm_backward_into(ys, &rs, hs, ws, ms, rss, dxs, dws, dbs, 0.0, 0.0);
                 },
                 iters),
             5 * rows * width * h, 0);
    }
    triad::cuda::set_norm_backward_register_sums(false);
  }
  // RMSNorm (LLaMA's) and its fused residual add: LayerNorm's kernels
  // without the mean and the bias; the weight's f32 gradient as in training.
  Tensor dw32 = triad::empty({C}, DType::F32, gpu);
  report("rms_norm_forward", time_ms([&] { be.rms_norm_forward(x, w, 1e-5, y, rstd, 0.0); }, iters),
         2 * N * C * h, 0);
  report("add_rms_norm_forward",
         time_ms([&] { be.add_rms_norm_forward(x, r, w, 1e-5, hsum, y, rstd, 0.0); }, iters),
         4 * N * C * h, 0);
  report(
      "add_rms_norm_backward",
      time_ms([&] { be.rms_norm_backward_into(y, &r, hsum, w, rstd, dx, dw32, 0.0, 0.0); }, iters),
      5 * N * C * h, 0);
  Tensor a4 = rnd({N, 4 * C}, 4), g4 = triad::empty({N, 4 * C}, bf, gpu);
  const auto tanh = triad::GeluForm::Tanh, erf = triad::GeluForm::Erf;
  report("gelu_forward", time_ms([&] { be.gelu_forward(a4, g4, tanh); }, iters), 2 * N * 4 * C * h,
         0);
  report("gelu_backward", time_ms([&] { be.gelu_backward(a4, g4, g4, tanh); }, iters),
         3 * N * 4 * C * h, 0);
  // The exact form (GPT-NeoX's): erf instead of one exp, the same bytes.
  report("gelu_erf_forward", time_ms([&] { be.gelu_forward(a4, g4, erf); }, iters),
         2 * N * 4 * C * h, 0);
  report("gelu_erf_backward", time_ms([&] { be.gelu_backward(a4, g4, g4, erf); }, iters),
         3 * N * 4 * C * h, 0);
  report("residual_add", time_ms([&] { be.binary(triad::BinaryOp::Add, x, dx, y); }, iters),
         3 * N * C * h, 0);
  report("dropout",
         time_ms(
             [&] {
               be.dropout(x, 0.1, 1, 2, {3, 0, 0}, {}, {}, y);
             },
             iters),
         2 * N * C * h, 0);
  // The same as a context-parallel chunk of a longer row's masks (LoRA's
  // adapters under parallel.cp): rows of C draws, 3C + 1 apart.
  const auto row = static_cast<uint64_t>(C);
  report("dropout_rows",
         time_ms(
             [&] {
               be.dropout(x, 0.1, 1, 2, {3, row, 3 * row + 1}, {}, {}, y);
             },
             iters),
         2 * N * C * h, 0);
  // Rows keyed in reverse order (a mixture's experts' rows drawing LoRA's
  // masks by assignment): the keys' reads besides.
  {
    std::vector<int64_t> order(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) order[static_cast<size_t>(i)] = N - 1 - i;
    const Tensor keys = triad::to_device(triad::from_vector(order, {N}, DType::I64), gpu);
    report("dropout_keyed",
           time_ms(
               [&] {
                 be.dropout(x, 0.1, 1, 2, {3, row, row}, keys, {}, y);
               },
               iters),
           2 * N * C * h + 8.0 * static_cast<double>(N), 0);
  }
  // SwiGLU on an 8C-wide c_fc output (F = 4C): reads 8C, writes 4C per token
  // (backward reads 8C and 4C, writes 8C).
  {
    Tensor fc = rnd({N, 8 * C}, 15), act = triad::empty({N, 4 * C}, bf, gpu),
           dfc = triad::empty({N, 8 * C}, bf, gpu);
    report("swiglu_forward", time_ms([&] { be.glu_forward(fc, act, triad::GluGate::Silu); }, iters),
           12.0 * N * C * h, 0);
    report("swiglu_backward",
           time_ms([&] { be.glu_backward(fc, act, dfc, triad::GluGate::Silu); }, iters),
           20.0 * N * C * h, 0);
  }
  // Rotary embeddings of a (B, T, 3C) qkv in NH heads: reads and writes
  // all of it (v copied).
  {
    Tensor qkv = rnd({B, T, 3 * C}, 14), turned = triad::empty({B, T, 3 * C}, bf, gpu);
    report("rotary_embedding",
           time_ms([&] { be.rotary_embedding(qkv, NH, {}, 0, 10000.0, {}, false, turned); }, iters),
           2 * N * 3 * C * h, 0);
  }

  // Attention: every implementation at the main shape, then the fast two
  // across model shapes (the per-shape choice auto makes). A shape an
  // implementation cannot run is reported with its reason, not fatal.
  // `heads`: query heads, or query and key/value heads (grouped-query),
  // and a sliding window (heads.window: the calls get its first keys).
  auto bench_attention = [&](int64_t ab, int64_t at, int64_t ac, triad::AttentionHeads heads,
                             std::initializer_list<triad::cuda::AttentionKernel> kernels,
                             const std::string& suffix) {
    const int64_t anh = heads.q, width = ac + 2 * heads.kv * (ac / heads.q);
    Tensor qkv = rnd({ab, at, width}, 5), out = triad::empty({ab, at, ac}, bf, gpu);
    Tensor lse = triad::empty({ab, anh, at}, DType::F32, gpu),
           dqkv = triad::empty({ab, at, width}, bf, gpu);
    const double D = static_cast<double>(ac / anh);
    // Causal: half of the 4 B NH T^2 D forward FLOPs; with a window, 4 D
    // a head for each query's min(t + 1, W) keys. Backward 2.5x forward.
    const int64_t W = heads.window;
    double keys = 0;
    for (int64_t t = 0; W > 0 && t < at; ++t) keys += static_cast<double>(std::min(t + 1, W));
    const double attn_fwd =
        W > 0 ? 4.0 * ab * anh * keys * D : 2.0 * ab * anh * static_cast<double>(at) * at * D;
    const Tensor starts =
        W > 0 ? triad::to_device(triad::nn::sliding_window_starts(ab, at, W), gpu) : Tensor();
    for (auto kernel : kernels) {
      const std::string why =
          triad::cuda::attention_kernel_unavailable(kernel, DType::BF16, at, ac, heads);
      if (!why.empty()) {
        std::printf(
            "%s\n",
            nlohmann::json{{"kernel", std::string("attention_") +
                                          triad::cuda::attention_kernel_name(kernel) + suffix},
                           {"unavailable", why}}
                .dump()
                .c_str());
        continue;
      }
      triad::cuda::set_attention_kernel(kernel);
      const std::string tag = triad::cuda::attention_kernel_name(kernel) + suffix;
      try {
        report("attention_forward_" + tag,
               time_ms([&] { be.attention_forward(qkv, heads, out, lse, starts); }, iters), 0,
               attn_fwd);
        report(
            "attention_backward_" + tag,
            time_ms([&] { be.attention_backward(qkv, out, lse, out, heads, dqkv, starts); }, iters),
            0, 2.5 * attn_fwd);
      } catch (const std::exception& e) {
        std::printf(
            "%s\n",
            nlohmann::json{{"kernel", "attention_" + tag}, {"error", e.what()}}.dump().c_str());
      }
    }
    triad::cuda::set_attention_kernel(triad::cuda::AttentionKernel::Auto);
  };
  bench_attention(B, T, C, NH,
                  {triad::cuda::AttentionKernel::Simt, triad::cuda::AttentionKernel::TensorCore,
                   triad::cuda::AttentionKernel::Cudnn},
                  "");
  struct AttnShape {
    int64_t b, t, c, nh;
  };
  for (const AttnShape& a : {AttnShape{8, 1024, 1024, 16}, AttnShape{4, 2048, 768, 12},
                             AttnShape{4, 1024, 2048, 16}, AttnShape{2, 4096, 1024, 16}}) {
    if (no_sweep) break;
    bench_attention(a.b, a.t, a.c, a.nh,
                    {triad::cuda::AttentionKernel::TensorCore, triad::cuda::AttentionKernel::Cudnn},
                    "_B" + std::to_string(a.b) + "_T" + std::to_string(a.t) + "_C" +
                        std::to_string(a.c) + "_NH" + std::to_string(a.nh));
  }
  // Grouped-query attention: a tp-8 rank of LLaMA 2 70B (8 query heads of
  // 128 over one key/value head) and LLaMA 3 8B whole (32 over 8), through
  // Triad's tensor-core kernels and cuDNN's graph. The FLOPs are multi-head
  // attention's; the k/v traffic shrinks by the group.
  struct GqaShape {
    int64_t b, t, c, nh, kv;
  };
  for (const GqaShape& a : {GqaShape{2, 4096, 1024, 8, 1}, GqaShape{1, 4096, 4096, 32, 8}}) {
    if (no_sweep) break;
    const triad::AttentionHeads heads{a.nh, a.kv};
    bench_attention(a.b, a.t, a.c, heads,
                    {triad::cuda::AttentionKernel::TensorCore, triad::cuda::AttentionKernel::Cudnn},
                    "_gqa_B" + std::to_string(a.b) + "_T" + std::to_string(a.t) + "_C" +
                        std::to_string(a.c) + "_NH" + std::to_string(heads.q) + "_KV" +
                        std::to_string(heads.kv));
  }
  // Head dim 256: Gemma 2 2B's layer (8 query heads over 4 key/value
  // heads), through Triad's SIMT kernels (two lanes a row), its tensor-core
  // kernels (dk/dv in two halves of columns; 227 KiB of shared memory a block) and cuDNN;
  // with Gemma 2's soft cap of 50, which cuDNN's graph has no node for,
  // Triad's alone.
  for (double cap : {0.0, 50.0}) {
    if (no_sweep) break;
    const triad::AttentionHeads heads = triad::AttentionHeads{8, 4}.with_softcap(cap);
    bench_attention(1, 2048, 2048, heads,
                    {triad::cuda::AttentionKernel::Simt, triad::cuda::AttentionKernel::TensorCore,
                     triad::cuda::AttentionKernel::Cudnn},
                    std::string("_D256_B1_T2048_NH8_KV4") + (cap > 0 ? "_softcap50" : ""));
  }
  // Many short sequences: 4096 of 128 tokens over 16 heads of 64, 65536
  // (batch, head) pairs, past the 65535 a grid's y holds (the SIMT kernels'
  // old limit): every kernel's grid takes them along x.
  if (!no_sweep) {
    bench_attention(4096, 128, 1024, 16,
                    {triad::cuda::AttentionKernel::Simt, triad::cuda::AttentionKernel::TensorCore,
                     triad::cuda::AttentionKernel::Cudnn},
                    "_B4096_T128_C1024_NH16");
  }
  // Packed documents (data.reset_attention_mask): four equal documents a
  // row, so a quarter of the causal FLOPs; the kernels skip the other
  // documents' tiles, and the time should fall about as much.
  {
    Tensor qkv = rnd({B, T, 3 * C}, 5), out = triad::empty({B, T, C}, bf, gpu);
    Tensor lse = triad::empty({B, NH, T}, DType::F32, gpu),
           dqkv = triad::empty({B, T, 3 * C}, bf, gpu);
    std::vector<int64_t> starts(static_cast<size_t>(B * T));
    const int64_t doc = std::max<int64_t>(1, T / 4);
    for (int64_t i = 0; i < B * T; ++i) starts[i] = (i % T) / doc * doc;
    const Tensor st = triad::to_device(triad::from_vector(starts, {B, T}, DType::I32), gpu);
    const double docs_fwd = 2.0 * B * NH * static_cast<double>(T) * doc * (C / NH);
    triad::cuda::set_attention_kernel(triad::cuda::AttentionKernel::TensorCore);
    try {
      report("attention_forward_tensor_core_docs4",
             time_ms([&] { be.attention_forward(qkv, NH, out, lse, st); }, iters), 0, docs_fwd);
      report("attention_backward_tensor_core_docs4",
             time_ms([&] { be.attention_backward(qkv, out, lse, out, NH, dqkv, st); }, iters), 0,
             2.5 * docs_fwd);
    } catch (const std::exception& e) {
      std::printf("%s\n",
                  nlohmann::json{{"kernel", "attention_tensor_core_docs4"}, {"error", e.what()}}
                      .dump()
                      .c_str());
    }
    triad::cuda::set_attention_kernel(triad::cuda::AttentionKernel::Auto);
  }

  // A sliding window of a quarter of the sequence alone (Mistral's,
  // Gemma 3's local layers): Triad's tensor-core kernels skip the tiles
  // before each block's window, cuDNN masks by its windowed graph (the heads
  // promise the window).
  {
    const int64_t W = std::max<int64_t>(1, T / 4);
    bench_attention(B, T, C, triad::AttentionHeads{NH}.with_window(W),
                    {triad::cuda::AttentionKernel::TensorCore, triad::cuda::AttentionKernel::Cudnn},
                    "_window" + std::to_string(W));
  }

  // Ring attention's steps (parallel.cp_comm: ring): a half-chunk of T / 2
  // queries over an earlier half-chunk's T / 2 keys, every key seen (4 B NH
  // (T/2)^2 D FLOPs forward, backward 2.5x), and the fold of the block into
  // the running f32 output (memory-bound: the f32 output read and written,
  // the bf16 block read, the log-sum-exps).
  {
    const int64_t Th = std::max<int64_t>(1, T / 2);
    Tensor q = rnd({B, Th, C}, 18), kv = rnd({B, Th, 2 * C}, 19);
    Tensor part = triad::empty({B, Th, C}, bf, gpu),
           lse = triad::empty({B, NH, Th}, DType::F32, gpu);
    Tensor dq = triad::empty({B, Th, C}, bf, gpu), dkv = triad::empty({B, Th, 2 * C}, bf, gpu);
    const double block_fwd = 4.0 * B * NH * static_cast<double>(Th) * Th * (C / NH);
    try {
      report("attention_ring_block_forward",
             time_ms([&] { be.attention_parts_forward(q, kv, NH, Th, part, lse, {}); }, iters), 0,
             block_fwd);
      report(
          "attention_ring_block_backward",
          time_ms([&] { be.attention_parts_backward(q, kv, part, lse, part, NH, Th, dq, dkv, {}); },
                  iters),
          0, 2.5 * block_fwd);
      Tensor acc = triad::zeros({B, Th, C}, DType::F32, gpu);
      Tensor acc_lse = triad::zeros({B, NH, Th}, DType::F32, gpu);
      report("attention_merge",
             time_ms([&] { be.attention_merge(acc, acc_lse, part, lse); }, iters),
             B * Th * (C * (2.0 * 4 + h) + NH * 3.0 * 4), 0);
    } catch (const std::exception& e) {
      std::printf(
          "%s\n",
          nlohmann::json{{"kernel", "attention_ring_block"}, {"error", e.what()}}.dump().c_str());
    }
  }

  // Decoding's attention: one new token per row over a cache of T slots
  // (memory-bound: every cached key and value is read once), for a batch of
  // B rows and for one row (12 blocks: how far one block per query leaves
  // the device idle).
  for (const int64_t rows : {B, int64_t{1}}) {
    const int64_t D = C / NH;
    Tensor q1 = rnd({rows, 1, 3 * C}, 15), kc = rnd({rows, NH, T, D}, 16),
           vc = rnd({rows, NH, T, D}, 17), o1 = triad::empty({rows, 1, C}, bf, gpu);
    report("cached_attention_decode_b" + std::to_string(rows),
           time_ms([&] { be.cached_attention_forward(q1, kc, vc, NH, 0, {}, o1); }, iters),
           2.0 * rows * NH * T * D * h, 0);
  }

  Tensor wq = rnd({3 * C, C}, 6), yq = triad::empty({N, 3 * C}, bf, gpu);
  report("gemm_qkv_forward", time_ms([&] { be.gemm(x, wq, yq, false, true, 1, 0); }, iters), 0,
         2.0 * N * C * 3 * C);
  Tensor dwq = triad::empty({3 * C, C}, bf, gpu);
  report("gemm_qkv_weight_grad", time_ms([&] { be.gemm(yq, x, dwq, true, false, 1, 0); }, iters), 0,
         2.0 * N * C * 3 * C);
  // A mixture's expert products, whose token extent is the rows routed to
  // the expert and rarely a multiple of 8 (on the H200 cuBLASLt ran the
  // head's products 8 times slower with an odd m or k): the MLP's first
  // layer forward (n odd) and its weight gradient into f32 (k odd), at N
  // rows and at N - 3.
  for (const int64_t rows : {N, N - 3}) {
    Tensor xe = rnd({rows, C}, 18), he = triad::empty({rows, 4 * C}, bf, gpu);
    Tensor we = rnd({4 * C, C}, 19), dwe = triad::empty({4 * C, C}, DType::F32, gpu);
    const std::string tokens = "_tokens" + std::to_string(rows);
    report("gemm_expert_forward" + tokens,
           time_ms([&] { be.gemm(xe, we, he, false, true, 1, 0); }, iters), 0,
           2.0 * rows * C * 4 * C);
    report("gemm_expert_weight_grad" + tokens,
           time_ms([&] { be.gemm(he, xe, dwe, true, false, 1, 0); }, iters), 0,
           2.0 * rows * C * 4 * C);
  }
  // The MLP's first layer, fused (bias + GELU in cuBLASLt's epilogue) and
  // composed (bias broadcast, GEMM, GELU pass), as the reference does it.
  Tensor wfc = rnd({4 * C, C}, 11), bfc = rnd({4 * C}, 12);
  Tensor hfc = triad::empty({N, 4 * C}, bf, gpu), pre = triad::empty({N, 4 * C}, bf, gpu);
  report("linear_gelu_fc_fused", time_ms([&] { be.linear_forward(x, wfc, bfc, hfc, &pre); }, iters),
         0, 2.0 * N * C * 4 * C);
  report("linear_gelu_fc_composed",
         time_ms([&] { be.Backend::linear_forward(x, wfc, bfc, hfc, &pre); }, iters), 0,
         2.0 * N * C * 4 * C);
  // A bias-free first layer (a mixture's experts'): GELU alone in the
  // epilogue, against the product and a GELU pass.
  report("linear_gelu_fc_nobias_fused",
         time_ms([&] { be.linear_forward(x, wfc, Tensor(), hfc, &pre); }, iters), 0,
         2.0 * N * C * 4 * C);
  report("linear_gelu_fc_nobias_composed",
         time_ms([&] { be.Backend::linear_forward(x, wfc, Tensor(), hfc, &pre); }, iters), 0,
         2.0 * N * C * 4 * C);
  // Its backward into the pre-activation: the second layer's input gradient
  // with GELU's derivative in the epilogue, against GEMM + GELU backward.
  Tensor wproj = rnd({C, 4 * C}, 14), dpre = triad::empty({N, 4 * C}, bf, gpu);
  report("mlp_input_grad_fused",
         time_ms([&] { be.gelu_linear_input_grad(x, wproj, pre, dpre); }, iters), 0,
         2.0 * N * C * 4 * C);
  report("mlp_input_grad_composed",
         time_ms([&] { be.Backend::gelu_linear_input_grad(x, wproj, pre, dpre); }, iters), 0,
         2.0 * N * C * 4 * C);
  Tensor wte = rnd({V, C}, 7), logits = triad::empty({N, V}, bf, gpu);
  report("gemm_lm_head", time_ms([&] { be.gemm(x, wte, logits, false, true, 1, 0); }, iters), 0,
         2.0 * N * C * V);

  std::vector<int64_t> tg(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) tg[i] = (i * 7919) % V;
  Tensor targets = triad::to_device(triad::from_vector(tg, {N}, DType::I64), gpu);
  Tensor losses = triad::empty({N}, DType::F32, gpu), lse_v = triad::empty({N}, DType::F32, gpu);
  report("cross_entropy_forward",
         time_ms([&] { be.cross_entropy_forward(logits, targets, -100, losses, lse_v); }, iters),
         N * V * h, 0);
  Tensor dl = triad::to_device(triad::full({N}, 1.0 / N, DType::F32), gpu);
  report("cross_entropy_backward",
         time_ms(
             [&] {
               be.cross_entropy_backward(logits, targets, lse_v, dl, Tensor(), -100, logits, 0.0);
             },
             iters),
         2 * N * V * h, 0);
  // Both in one kernel (a training step's head, linear_cross_entropy's
  // expected_grad): each row read from memory once and again from cache,
  // its gradient written over it. Counted as one read and one write, so
  // near the bandwidth means the second read came from cache; against the
  // two above, the time it saves a step.
  report("cross_entropy_forward_backward",
         time_ms(
             [&] {
               be.cross_entropy_forward_backward(logits, targets, -100, losses, lse_v, dl, logits,
                                                 0.0);
             },
             iters),
         2 * N * V * h, 0);
  // Token ids on the host, as a training step's batch gives them: the
  // backend checks them there and queues their upload. (Ids on the device
  // are copied back for that check, which waits for the device: that wait
  // is not the gather's time.)
  const Tensor host_ids = triad::from_vector(tg, {N}, DType::I64);
  report("embedding_forward", time_ms([&] { be.embedding_forward(wte, host_ids, y); }, iters),
         2 * N * C * h, 0);

  // A linear layer's bias gradient: the column sums of its output gradient
  // (N, 3C) in bf16, added into the f32 gradient (two launches).
  Tensor acc3 = triad::to_device(triad::zeros({3 * C}, DType::F32), gpu);
  report("bias_grad_column_sums", time_ms([&] { be.sum_rows_into(yq, acc3, 1.0); }, iters),
         N * 3 * C * h, 0);
  // The same at a training step's rows (16 sequences) and a block's three
  // widths (the projections', the attention input's, the MLP's; a step's
  // bias gradients are twice as many of the first as of the others).
  for (int64_t width : {C, 3 * C, 4 * C}) {
    const int64_t rows = 16 * T;
    Tensor dy = rnd({rows, width}, 40 + static_cast<uint64_t>(width));
    Tensor sums = triad::to_device(triad::zeros({width}, DType::F32), gpu);
    report("bias_grad_column_sums_" + std::to_string(rows) + "x" + std::to_string(width),
           time_ms([&] { be.sum_rows_into(dy, sums, 1.0); }, iters), rows * width * h, 0);
  }
  // The token table's gradient: the rows the ids touch, added into f32.
  Tensor dwte = triad::to_device(triad::zeros({V, C}, DType::F32), gpu);
  report("embedding_backward_into",
         time_ms([&] { be.embedding_backward_into(host_ids, x, dwte, 1.0); }, iters),
         N * C * (h + 8), 0);
  // The same on ids drawn as real text's tokens fall (Zipf's law, s = 1: the
  // commonest id takes about 9% of the positions, some 700 of 8192), where
  // an id's positions are summed in pieces side by side.
  {
    std::vector<double> cdf(static_cast<size_t>(V));
    double total = 0;
    for (int64_t k = 0; k < V; ++k) cdf[static_cast<size_t>(k)] = total += 1.0 / double(k + 1);
    std::mt19937_64 draw(5);
    std::vector<int64_t> zipf(static_cast<size_t>(N));
    for (int64_t& id : zipf) {
      const double u = std::uniform_real_distribution<double>(0.0, total)(draw);
      id = std::min<int64_t>(V - 1, std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    }
    const Tensor zipf_ids = triad::from_vector(zipf, {N}, DType::I64);
    report("embedding_backward_into_zipf",
           time_ms([&] { be.embedding_backward_into(zipf_ids, x, dwte, 1.0); }, iters),
           N * C * (h + 8), 0);
  }

  // A mixture's top-k choice on the device (Backend::route_top_k), N
  // tokens' f32 scores: Mixtral's top 2 of 8, and DeepSeek-V3's biased top 8
  // of 256 within 4 of 8 groups. (bench_routing times the same choices on
  // the host.)
  {
    struct Rule {
      const char* name;
      int64_t E, k, groups, top_groups;
      bool biased;
    };
    for (const Rule& r : {Rule{"route_top_k_8_top2", 8, 2, 1, 1, false},
                          Rule{"route_top_k_256_top8_groups", 256, 8, 8, 4, true}}) {
      Tensor scores = triad::to_device(triad::softmax(triad::randn({N, r.E}, 11, 1)), gpu);
      Tensor bias = r.biased ? triad::to_device(triad::randn({r.E}, 11, 2, 0.01), gpu) : Tensor();
      Tensor choice = triad::empty({N, r.k}, DType::I64, gpu);
      report(
          r.name,
          time_ms([&] { be.route_top_k(scores, bias, r.groups, r.top_groups, 2, choice); }, iters),
          static_cast<double>(N * (r.E * 4 + r.k * 8)), 0);
    }
  }

  // A mixture's batches padded to their capacity (Backend::capacity_slots,
  // model.moe.pad_to_capacity), N tokens' top k of E at 1.25 balanced
  // shares, from Mixtral's 2 of 8 to DeepSeek-V3's 8 of 256: by position,
  // and by score (each over-full expert's radix select, 4 passes, for its
  // capacity-th score). Bytes: the choices and scores read once and the
  // slots, picks and counts written. Below 32 experts each of the E blocks
  // reads the choices several times more, from L2; from 32 on the
  // assignments are listed by expert first (kernels::kListedExperts), each
  // block reading only its own: the rows on either side of 32 say where
  // the two should meet.
  for (const auto& [E, k] :
       {std::pair<int64_t, int64_t>{8, 2}, {16, 2}, {32, 4}, {64, 6}, {256, 8}}) {
    const int64_t capacity = (N * k * 5 + E * 4 - 1) / (E * 4);
    std::vector<int64_t> picks(static_cast<size_t>(N * k));
    for (size_t i = 0; i < picks.size(); ++i)  // (skewed: the low experts over their capacity)
      picks[i] = static_cast<int64_t>((i * 2654435761u >> 9) % (E + E / 2 - 1)) % E;
    const Tensor choice = triad::to_device(triad::from_vector(picks, {N, k}, DType::I64), gpu);
    const Tensor scores = triad::to_device(triad::rand_uniform({N, k}, 13, 1, 0.0, 1.0), gpu);
    Tensor token = triad::empty({E * capacity}, DType::I64, gpu),
           assignment = triad::empty({E * capacity}, DType::I64, gpu),
           picked = triad::empty({N * k}, DType::I64, gpu),
           counts = triad::empty({1, E}, DType::I64, gpu);
    for (const bool ranked : {false, true}) {
      const std::string name = "capacity_slots_" + std::to_string(E) + "_top" + std::to_string(k);
      report(ranked ? name + "_probs" : name,
             time_ms(
                 [&] {
                   be.capacity_slots(choice, ranked ? scores : Tensor(), E, capacity, N, token,
                                     assignment, picked, counts);
                 },
                 iters),
             static_cast<double>(N * k * (ranked ? 28 : 24) + E * capacity * 16), 0);
    }
  }

  // A dropless mixture's experts' products sized on the device
  // (Backend::grouped_gemm_rows and grouped_gemm_sums: Triad's WMMA
  // kernels), GPT-2 124M's N tokens' top 2 of 8 experts (C x 4C each, bf16,
  // the rows skewed as a router leaves them), beside cuBLASLt's products on
  // each expert's rows (the host-routed path, which knows the counts): the
  // forward, the input gradient, and the weights' gradients into f32.
  {
    const int64_t E = 8, M = N * 2, F = 4 * C;
    std::vector<int64_t> at{0};
    for (int64_t e = 0; e < E; ++e)
      at.push_back(at.back() + (e + 1 == E ? M - at.back() : M * (6 + e % 4) / 72));
    const Tensor offsets = triad::to_device(triad::from_vector(at, {E + 1}), gpu);
    const Tensor x = triad::randn({M, C}, 17, 1, 1.0, DType::BF16, gpu),
                 dy = triad::randn({M, F}, 17, 2, 1.0, DType::BF16, gpu);
    std::vector<Tensor> w, gw;
    for (int64_t e = 0; e < E; ++e) {
      w.push_back(triad::randn({F, C}, 17, 10 + static_cast<uint64_t>(e), 0.02, DType::BF16, gpu));
      gw.push_back(triad::empty({F, C}, DType::F32, gpu));
    }
    Tensor h = triad::empty({M, F}, DType::BF16, gpu), dx = triad::empty({M, C}, DType::BF16, gpu);
    const double flops = 2.0 * static_cast<double>(M * C * F);
    const auto piece = [](const Tensor& t, int64_t first, int64_t n) {
      return triad::make_view(t, {n, t.size(1)}, {t.size(1), 1}, t.offset() + first * t.size(1));
    };
    const auto per_expert = [&](const std::function<void(int64_t, int64_t, int64_t)>& f) {
      for (int64_t e = 0; e < E; ++e)
        f(e, at[static_cast<size_t>(e)],
          at[static_cast<size_t>(e + 1)] - at[static_cast<size_t>(e)]);
    };
    report("grouped_rows_moe_fc_forward",
           time_ms([&] { be.grouped_gemm_rows(x, w, offsets, true, h); }, iters), 0, flops);
    report("cublaslt_per_expert_moe_fc_forward",
           time_ms(
               [&] {
                 per_expert([&](int64_t e, int64_t first, int64_t n) {
                   Tensor out = piece(h, first, n);
                   be.gemm(piece(x, first, n), w[static_cast<size_t>(e)], out, false, true, 1.0,
                           0.0);
                 });
               },
               iters),
           0, flops);
    report("grouped_rows_moe_fc_input_grad",
           time_ms([&] { be.grouped_gemm_rows(dy, w, offsets, false, dx); }, iters), 0, flops);
    report("cublaslt_per_expert_moe_fc_input_grad",
           time_ms(
               [&] {
                 per_expert([&](int64_t e, int64_t first, int64_t n) {
                   Tensor out = piece(dx, first, n);
                   be.gemm(piece(dy, first, n), w[static_cast<size_t>(e)], out, false, false, 1.0,
                           0.0);
                 });
               },
               iters),
           0, flops);
    report("grouped_sums_moe_fc_weight_grad",
           time_ms([&] { be.grouped_gemm_sums(dy, x, offsets, gw, 1.0); }, iters), 0, flops);
    report("cublaslt_per_expert_moe_fc_weight_grad",
           time_ms(
               [&] {
                 per_expert([&](int64_t e, int64_t first, int64_t n) {
                   be.gemm(piece(dy, first, n), piece(x, first, n), gw[static_cast<size_t>(e)],
                           true, false, 1.0, 1.0);
                 });
               },
               iters),
           0, flops);
  }

  // The optimizer's step as the trainer runs it: bf16 parameters with f32
  // masters, gradients and moments, GPT-2 124M's tensors (per layer 4
  // matrices, 9 vectors; the two tables), all in one adamw_many; and the
  // global norm's sum of squares over the same f32 gradients.
  {
    std::vector<triad::Shape> shapes{{V, C}, {T, C}, {C}, {C}};
    for (int l = 0; l < 12; ++l) {
      for (const triad::Shape& s : std::vector<triad::Shape>{{3 * C, C},
                                                             {C, C},
                                                             {4 * C, C},
                                                             {C, 4 * C},
                                                             {3 * C},
                                                             {C},
                                                             {4 * C},
                                                             {C},
                                                             {C},
                                                             {C},
                                                             {C},
                                                             {C}}) {
        shapes.push_back(s);
      }
    }
    std::vector<triad::Backend::AdamWEntry> entries;
    std::vector<Tensor> grads;
    int64_t total = 0;
    uint64_t stream = 100;
    for (const triad::Shape& s : shapes) {
      triad::Backend::AdamWEntry e;
      e.master = rnd(s, stream++, DType::F32);
      e.param =
          triad::to_device(triad::cast(triad::to_device(e.master, triad::Device::cpu()), bf), gpu);
      e.grad = rnd(s, stream++, DType::F32);
      e.m = triad::to_device(triad::zeros(s, DType::F32), gpu);
      e.v = triad::to_device(triad::full(s, 0.01, DType::F32), gpu);
      e.weight_decay = 0.1;
      total += e.param.numel();
      grads.push_back(e.grad);
      entries.push_back(e);
    }
    triad::AdamWStep hp;
    hp.lr = 1e-4;
    // Reads grad, master, m, v (f32); writes master, m, v (f32) and param (bf16).
    report("adamw_many_bf16_masters_" + std::to_string(total),
           time_ms([&] { be.adamw_many(entries, hp); }, iters), total * (7.0 * 4 + h), 0);
    // The same with bf16 moments (train.moment_precision: bf16): m and v
    // read and written in 2 bytes each.
    for (auto& e : entries) {
      e.m = triad::cast(e.m, bf);
      e.v = triad::cast(e.v, bf);
    }
    report("adamw_many_bf16_masters_bf16_moments_" + std::to_string(total),
           time_ms([&] { be.adamw_many(entries, hp); }, iters), total * (3.0 * 4 + 4.0 * h + h), 0);
    Tensor norm = triad::to_device(triad::zeros({1}, DType::F64), gpu);
    report("grad_norm_sum_of_squares_" + std::to_string(total),
           time_ms([&] { be.sum_of_squares(grads, norm); }, iters), total * 4.0, 0);
  }

  Tensor p = rnd({P}, 8, DType::F32), g = rnd({P}, 9, DType::F32), m = rnd({P}, 10, DType::F32),
         v = triad::to_device(triad::full({P}, 0.01, DType::F32), gpu);
  triad::AdamWStep hp;
  hp.lr = 1e-4;
  report("adamw_f32_" + std::to_string(P), time_ms([&] { be.adamw(p, g, m, v, hp); }, iters),
         7.0 * P * 4, 0);

  // What a launch costs the device beyond its own work, from the stream's
  // queue and from a CUDA graph (cuda::capture): 500 one-element fills
  // queued behind products that keep the device busy until the host has
  // queued them all, timed by events between the fills. "us_per_launch"
  // times a training step's launches is what capturing the step would
  // save, at most; "host_queue_ms" against "blocker_ms" says whether the
  // device did wait for the host (then the figure is the host's pace).
  {
    constexpr int kLaunches = 500;
    Tensor tiny = triad::empty({1}, DType::F32, gpu);
    auto fills = [&] {
      for (int i = 0; i < kLaunches; ++i) be.fill(tiny, static_cast<double>(i));
    };
    triad::cuda::Graph graph = triad::cuda::capture(0, fills);
    Tensor wb = rnd({4 * C, C}, 30), yb = triad::empty({N, 4 * C}, bf, gpu);
    void* start = triad::cuda::create_timing_event(0);
    void* mid = triad::cuda::create_timing_event(0);
    void* end = triad::cuda::create_timing_event(0);
    auto probe = [&](const std::string& how, const std::function<void()>& queue) {
      queue();  // warm up
      triad::cuda::synchronize(0);
      triad::cuda::record_timing_event(0, start);
      for (int i = 0; i < 200; ++i) be.gemm(x, wb, yb, false, true, 1, 0);  // the blocker
      triad::cuda::record_timing_event(0, mid);
      const auto h0 = std::chrono::steady_clock::now();
      queue();
      const double host_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
      triad::cuda::record_timing_event(0, end);
      const double blocker_ms = triad::cuda::elapsed_ms(start, mid);
      const double ms = triad::cuda::elapsed_ms(mid, end);
      nlohmann::json j{{"kernel", "launch_gap_" + how},
                       {"ms", ms},
                       {"launches", kLaunches},
                       {"us_per_launch", ms * 1e3 / kLaunches},
                       {"host_queue_ms", host_ms},
                       {"blocker_ms", blocker_ms},
                       {"device_waited_for_host", host_ms > blocker_ms}};
      std::printf("%s\n", j.dump().c_str());
    };
    probe("stream", fills);
    probe("graph", [&] { graph.replay(); });
    const float check = *triad::to_device(tiny, triad::Device::cpu()).data<float>();
    if (check != static_cast<float>(kLaunches - 1)) {
      std::printf("{\"kernel\":\"launch_gap_graph\",\"error\":\"the last fill left %g, not %d\"}\n",
                  static_cast<double>(check), kLaunches - 1);
      return 1;
    }
    for (void* e : {start, mid, end}) triad::cuda::destroy_timing_event(e);
  }
  return 0;
}
