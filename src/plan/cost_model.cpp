// The planner's cost model. Every term is a physical quantity (FLOPs over an
// achievable rate, bytes over a bandwidth); docs/planner.md derives each.
#include "triad/plan/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>

#include "triad/core/error.h"
#include "triad/parallel/context/ulysses.h"
#include "triad/parallel/pipeline/simulator.h"
#include "triad/parallel/pipeline/stage_balance.h"
#include "triad/parallel/pipeline/zero_bubble.h"

namespace triad::plan {
namespace {

constexpr double kFp16 = 2.0;  // bytes per half-precision element

// Seconds for a ring collective moving `fraction` * bytes through each GPU's
// link (all-reduce: 2(n-1)/n; reduce-scatter or all-gather: (n-1)/n).
double ring_time(double bytes, double fraction, int n, double bandwidth, double latency,
                 double efficiency) {
  if (n <= 1 || bytes <= 0) return 0.0;
  return fraction * bytes / (bandwidth * efficiency) + 2.0 * (n - 1) * latency;
}

// Time of one GEMM-like kernel: the slower of its math and its memory traffic.
double roofline(double flops, double bytes, const ClusterSpec& c) {
  return std::max(flops / (c.peak_flops * c.gemm_efficiency),
                  bytes / (c.memory_bandwidth * c.memory_efficiency));
}

// A reduce-scatter (or all-gather) of `bytes` over the TP group, and an
// all-reduce (twice the traffic).
double tp_reduce_scatter(double bytes, const ClusterSpec& c, const ParallelConfig& p) {
  return ring_time(bytes, (p.tp - 1.0) / p.tp, p.tp, c.intra_bandwidth, c.intra_latency,
                   c.collective_efficiency);
}
double tp_all_reduce(double bytes, const ClusterSpec& c, const ParallelConfig& p) {
  return ring_time(bytes, 2.0 * (p.tp - 1.0) / p.tp, p.tp, c.intra_bandwidth, c.intra_latency,
                   c.collective_efficiency);
}

// Per-layer, per-microbatch costs on one GPU (seconds).
struct LayerCost {
  double fwd_gemm = 0, fwd_mem = 0, fwd_tp = 0;
  double attn_gemm_fwd = 0, attn_mem_fwd = 0;  // the attention core (selective recompute redoes it)
  double bwd_input_gemm = 0, bwd_weight_gemm = 0, bwd_mem = 0, bwd_tp = 0;
  // Expert parallelism's all-to-all exchanges (a mixture's layers).
  double fwd_ep = 0, bwd_ep = 0;
  // Of bwd_tp, what hides behind the column-parallel layers' weight-gradient
  // GEMMs when B and W run together (each input gradient's collective runs
  // during its own layer's dW).
  double bwd_tp_hidden = 0;
  bool backward = true;  // false: a frozen leading layer, forward only
};

// Whether parameter `name` trains: under model.lora only the adapters, and
// never what ParallelConfig::frozen holds fixed.
bool trains(const nn::GptConfig& m, const ParallelConfig& p, const std::string& name) {
  return (m.lora.rank <= 0 || nn::is_lora_adapter(name)) && !p.frozen.count(name);
}

// What a layer's backward pass computes: which of its four weights
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) take a gradient, and
// whether the pass reaches the layer at all — it does not when nothing in
// it or before it (the token and position tables included) trains, since
// then nothing asks for its input gradients.
struct LayerTraining {
  std::array<bool, 4> weights = {true, true, true, true};
  bool backward = true;
  auto operator<=>(const LayerTraining&) const = default;
};

// Each layer's LayerTraining, in layer order.
std::vector<LayerTraining> layer_training(const nn::GptConfig& m, const ParallelConfig& p) {
  std::vector<LayerTraining> out(static_cast<size_t>(m.n_layer));
  if (m.lora.rank <= 0 && p.frozen.empty()) return out;
  const std::map<std::string, Shape> shapes = nn::gpt_parameter_shapes(m);
  static const std::array<const char*, 4> kLinears = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                      "mlp.c_proj"};
  bool reached =
      trains(m, p, "wte.weight") || (shapes.count("wpe.weight") && trains(m, p, "wpe.weight"));
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const std::string prefix = "h." + std::to_string(i) + ".";
    LayerTraining& l = out[static_cast<size_t>(i)];
    for (size_t k = 0; k < kLinears.size(); ++k)
      l.weights[k] = trains(m, p, prefix + kLinears[k] + ".weight");
    for (auto it = shapes.lower_bound(prefix);
         !reached && it != shapes.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      reached = trains(m, p, it->first);
    }
    l.backward = reached;
  }
  return out;
}

// Fraction of the GPU a GEMM with an (M, N) output and inner size K keeps
// busy: cuBLAS cuts the output into 128 x 128 tiles, one per SM at a time,
// so partial tiles (tile quantisation) and a last partial wave of tiles
// (wave quantisation) leave SMs idle. A product with fewer tiles than SMs
// and a long K (a weight gradient: K is the tokens) also splits K over
// several tiles of the same output (cuBLAS's split-K), up to the split that
// fills the waves best, each part at least kMinSplitK deep; the partial
// sums' reduction is left out (a few megabytes). Small GEMMs lose most.
double shape_efficiency(double M, double N, double K, const ClusterSpec& c) {
  constexpr double kMinSplitK = 1024;
  const double tile = 128.0;
  const double tm = std::ceil(M / tile), tn = std::ceil(N / tile);
  const double tiles = tm * tn;
  const double filled = (M * N) / (tiles * tile * tile);
  double best = 0;
  for (double split = 1;
       split == 1 || (tiles * (split - 1) < c.sm_count && K / split >= kMinSplitK); ++split) {
    const double waves = std::ceil(tiles * split / c.sm_count);
    best = std::max(best, filled * tiles * split / (waves * c.sm_count));
  }
  return best;
}

// Seconds for a GEMM producing an (M, N) output with inner size K.
double gemm_time(double M, double N, double K, const ClusterSpec& c) {
  return 2.0 * M * N * K / (c.peak_flops * c.gemm_efficiency * shape_efficiency(M, N, K, c));
}

// Forward, input-gradient and weight-gradient time of a linear layer with
// `tokens` rows, `in` inputs and `out` outputs (per GPU).
struct LinearTimes {
  double fwd, dx, dw;
};
LinearTimes linear_times(double tokens, double in, double out, const ClusterSpec& c) {
  return {gemm_time(tokens, out, in, c), gemm_time(tokens, in, out, c),
          gemm_time(out, in, tokens, c)};
}

// model.lora.dropout: the input widths (per rank) of a block's adapted
// layers, whose adapters take their input again through dropout — a copy
// kept for backward. The column-parallel layers' inputs are whole
// (gathered under sequence parallelism), masked in one pass each way; the
// row-parallel ones' are split and masked by feature, in three (transpose,
// mask, transpose back). All 0 without dropout.
struct LoraDropoutWidths {
  double rows = 0, by_feature = 0;
  double kept() const { return rows + by_feature; }
  double passes() const { return rows + 3.0 * by_feature; }  // widths read and written
};
// In a mixture-of-experts layer (`moe`) each token reaches k experts'
// adapters, and the shared expert's.
LoraDropoutWidths lora_dropout_widths(const nn::GptConfig& m, double t, bool moe = false) {
  LoraDropoutWidths w;
  if (m.lora.rank <= 0 || m.lora.dropout <= 0.0) return w;
  const double h = static_cast<double>(m.d_model);
  if (m.lora_on("attn.c_attn")) w.rows += h;
  // model.mla's layers read the input (q_a_proj or q_proj, kv_a_proj) or
  // a latent, whole on every rank.
  for (const auto& [layer, width] :
       {std::pair{"attn.q_a_proj", m.d_model}, std::pair{"attn.q_proj", m.d_model},
        std::pair{"attn.kv_a_proj", m.d_model}, std::pair{"attn.q_b_proj", m.mla.q_lora_rank},
        std::pair{"attn.kv_b_proj", m.mla.kv_lora_rank}}) {
    if (m.lora_on(layer)) w.rows += static_cast<double>(width);
  }
  if (m.lora_on("attn.c_proj")) w.by_feature += static_cast<double>(m.attn_out_width()) / t;
  if (!moe) {
    if (m.lora_on("mlp.c_fc")) w.rows += h;
    if (m.lora_on("mlp.c_proj")) w.by_feature += static_cast<double>(m.ffn()) / t;
    return w;
  }
  const double k = m.routed_per_token(), shared = m.moe.shared_ffn_hidden_size > 0 ? 1.0 : 0.0;
  if (m.lora_on("mlp.c_fc")) w.rows += (k + shared) * h;
  if (m.lora_on("mlp.c_proj")) {
    w.by_feature += (k * static_cast<double>(m.expert_ffn()) +
                     shared * static_cast<double>(m.moe.shared_ffn_hidden_size)) /
                    t;
  }
  return w;
}

// Layer `layer`'s costs: the layers differ only in their attention's window
// (model.sliding_window, and the layers model.full_attention_layers exempts).
LayerCost layer_cost(const nn::GptConfig& m, const ClusterSpec& c, const ParallelConfig& p,
                     int64_t layer, const LayerTraining& training) {
  const double b = p.micro_batch, s = static_cast<double>(m.seq_len),
               h = static_cast<double>(m.d_model);
  const double a = static_cast<double>(m.n_head), t = p.tp;
  const double hd = static_cast<double>(m.head_dim());
  // (Under context parallelism a rank's positions: its chunk of each sequence.)
  const double tokens = b * s / p.cp;
  LayerCost L;
  // Linear layers split over TP: QKV (h -> w/t, w = 3h, or h plus the
  // key/value heads' width twice under grouped-query attention), projection
  // (q/t -> h, q = a * head_dim = h unless model.head_dim sets it apart), MLP
  // up (h -> m/t, m = F or 2F for SwiGLU) and down (F/t -> h); 24bsh^2/t
  // FLOPs forward for GPT-2's F = 4h, the same again for each of the input
  // and weight gradients.
  const double f = static_cast<double>(m.ffn()), fc = static_cast<double>(m.fc_width());
  // (With fewer key/value heads than ranks each rank computes the head it
  // shares.)
  const double w_local = static_cast<double>(m.qkv_width_per_rank(p.tp));
  // A frozen weight (every one under model.lora, or those
  // ParallelConfig::frozen holds) has no weight-gradient GEMM. model.lora's
  // adapters add x A^T (rank outputs) and that times B^T, each with its two
  // gradients.
  // Those thin products (one side the rank) are bound by memory: each
  // streams its large operand once.
  const double r = static_cast<double>(m.lora.rank);
  const auto thin = [&](double M, double N, double K) {
    return std::max(2.0 * M * N * K / (c.peak_flops * c.gemm_efficiency),
                    kFp16 * (M * K + K * N + M * N) / (c.memory_bandwidth * c.memory_efficiency));
  };
  // Forward u = x A^T (rows, r) and u B^T; backward du = dy B and dx += du
  // A, dB = dy^T u and dA = du^T x.
  const auto adapters = [&](double rows, double in, double out) {
    return LinearTimes{thin(rows, r, in) + thin(rows, out, r),
                       thin(rows, r, out) + thin(rows, in, r),
                       thin(out, r, rows) + thin(r, in, rows)};
  };
  const auto with_lora = [&](const char* name, size_t index, double in, double out) {
    LinearTimes lt = linear_times(tokens, in, out, c);
    if (!training.weights[index]) lt.dw = 0;
    if (!m.lora_on(name)) return lt;
    const LinearTimes ad = adapters(tokens, in, out);
    return LinearTimes{lt.fwd + ad.fwd, lt.dx + ad.dx, lt.dw + ad.dw};
  };
  // n products' times with `name`'s adapters on each (a mixture's experts).
  const auto times_with_lora = [&](const char* name, double n, const LinearTimes& lt, double rows,
                                   double in, double out) {
    const LinearTimes ad = m.lora_on(name) ? adapters(rows, in, out) : LinearTimes{};
    return LinearTimes{n * (lt.fwd + ad.fwd), n * (lt.dx + ad.dx), n * (lt.dw + ad.dw)};
  };
  LinearTimes qkv = with_lora("attn.c_attn", 0, h, w_local);
  if (m.latent_attention()) {
    // model.mla: the down-projections whole on every rank (q_a_proj,
    // kv_a_proj), the up-projections split at whole heads (q_b_proj or
    // q_proj, kv_b_proj).
    const auto& la = m.mla;
    const double heads = a / t, qk = static_cast<double>(m.latent_qk_dim());
    const double q_rank = static_cast<double>(la.q_lora_rank),
                 kv_rank = static_cast<double>(la.kv_lora_rank);
    // (Each with its LoRA adapters when model.lora targets it.)
    std::vector<LinearTimes> parts;
    if (la.q_lora_rank > 0) {
      parts.push_back(with_lora("attn.q_a_proj", 0, h, q_rank));
      parts.push_back(with_lora("attn.q_b_proj", 0, q_rank, heads * qk));
    } else {
      parts.push_back(with_lora("attn.q_proj", 0, h, heads * qk));
    }
    parts.push_back(
        with_lora("attn.kv_a_proj", 0, h, kv_rank + static_cast<double>(la.qk_rope_head_dim)));
    parts.push_back(with_lora("attn.kv_b_proj", 0, kv_rank,
                              heads * static_cast<double>(la.qk_nope_head_dim + la.v_head_dim)));
    qkv = {};
    for (const LinearTimes& lt : parts) {
      qkv.fwd += lt.fwd;
      qkv.dx += lt.dx;
      qkv.dw += lt.dw;  // (with_lora's: none for frozen weights)
    }
  }
  // A mixture of experts (model.moe): the router (whole on every rank) and
  // each expert's shard over its share of the k assignments per token,
  // counted as balanced (tokens * k / E rows each; k capped by a capacity
  // factor below 1): E smaller GEMMs whose tiles fill the GPU less.
  const bool moe = m.moe_layer(layer);
  const double E = static_cast<double>(m.moe.experts), k = m.routed_per_token();
  LinearTimes up{}, down{}, router{}, shared_up{}, shared_down{};
  if (moe) {
    // (Each with its adapters under model.lora's mlp.c_fc and mlp.c_proj;
    // the experts' weights themselves are then frozen: no dW.)
    const double rows = tokens * k / E;
    const double efc = static_cast<double>(m.expert_fc_width()) / t,
                 ef = static_cast<double>(m.expert_ffn()) / t;
    LinearTimes u = linear_times(rows, h, efc, c), d = linear_times(rows, ef, h, c);
    if (!training.weights[2]) u.dw = 0;
    if (!training.weights[3]) d.dw = 0;
    up = times_with_lora("mlp.c_fc", E, u, rows, h, efc);
    down = times_with_lora("mlp.c_proj", E, d, rows, ef, h);
    router = linear_times(tokens, h, E, c);
    if (m.moe.shared_ffn_hidden_size > 0) {
      // The shared expert on every token, split as the experts are (its
      // gate, a column beside the router's, is left out).
      const double sfc = static_cast<double>(m.shared_fc_width()) / t,
                   sf = static_cast<double>(m.moe.shared_ffn_hidden_size) / t;
      shared_up = times_with_lora("mlp.c_fc", 1, linear_times(tokens, h, sfc, c), tokens, h, sfc);
      shared_down = times_with_lora("mlp.c_proj", 1, linear_times(tokens, sf, h, c), tokens, sf, h);
    }
  } else {
    up = with_lora("mlp.c_fc", 2, h, fc / t);
    down = with_lora("mlp.c_proj", 3, f / t, h);
  }
  for (const LinearTimes& lt :
       {qkv, with_lora("attn.c_proj", 1, static_cast<double>(m.attn_out_width()) / t, h), up, down,
        router, shared_up, shared_down}) {
    L.fwd_gemm += lt.fwd;
    L.bwd_input_gemm += lt.dx;
    L.bwd_weight_gemm += lt.dw;
  }
  // Attention core per GPU: (a/t) heads of s x s scores (a cp-th of them
  // under context parallelism, over the whole sequence).
  const double scores = (a / t / p.cp) * b * s * s;
  // (The all-gather's balanced layout gives every rank as many query-key
  // pairs as the all-to-all's cp-th of the heads: its two half-chunks, one
  // early and one late, see 2cp half-chunks of keys between them.)
  const cp::Exchange exchange =
      p.cp > 1 ? cp::resolve_exchange(p.cp_exchange, m, p.tp, p.cp) : cp::Exchange::AllToAll;
  const bool gathered = exchange == cp::Exchange::AllGather;
  const double attn_gemm_flops = 2.0 * scores * hd;  // one of QK^T or PV, every tile
  const double bw = c.memory_bandwidth * c.memory_efficiency;
  double attn_mem_bwd = 0;
  if (p.attention == Attention::Flash) {
    // Fused: the causal mask skips half the tiles (a sliding window of W
    // keys all but W - W(W-1)/2s of a query's s; a layer exempt from the
    // window, model.full_attention_layers, sees half); forward is QK^T and
    // PV, backward recomputes QK^T and forms dP, dQ, dK and dV (all input
    // gradients: attention has no weights). Scores never reach memory.
    // (The kernels' rate by the keys a query sees: the sequence, or the window.)
    const double W = static_cast<double>(m.window_of(layer));
    const double rate = c.peak_flops * c.flash_attention_efficiency(W > 0 && W < s ? W : s);
    const double seen = W > 0 && W < s ? (W - W * (W - 1) / (2 * s)) / s : 0.5;
    L.attn_gemm_fwd = seen * 2.0 * attn_gemm_flops / rate;
    L.fwd_gemm += L.attn_gemm_fwd;
    L.bwd_input_gemm += seen * 5.0 * attn_gemm_flops / rate;
  } else {
    // The two batched GEMMs move the score matrix through memory (2 bytes
    // per element each), which for small head dims costs more than their
    // math.
    const double one_attn_gemm = roofline(attn_gemm_flops, scores * kFp16, c);
    L.attn_gemm_fwd = 2.0 * one_attn_gemm;
    L.fwd_gemm += L.attn_gemm_fwd;
    L.bwd_input_gemm += 3.0 * one_attn_gemm;   // dP, dQ, dK
    L.bwd_weight_gemm += 1.0 * one_attn_gemm;  // dV
    // Memory-bound kernels. Scores: fused scale-mask-softmax reads and
    // writes them (4 B/element), dropout reads, writes and keeps a mask (5
    // B); backward: 5 B for dropout, 6 B for softmax.
    L.attn_mem_fwd = 9.0 * scores / bw;
    attn_mem_bwd = 11.0 * scores / bw;
  }
  // Token-wise kernels, bytes per token per hidden unit forward: two
  // LayerNorms (4 each), two fused bias-dropout-residual adds (7 each) and
  // the MLP's activation reading its m inputs and writing F outputs (16 for
  // GPT-2's bias-GELU on 4h, split by TP); model.post_norms adds two more
  // norms (4 each), model.shared_norm takes one away and model.pre_norms:
  // false both. With sequence parallelism the replicated ones are split
  // too. model.clip_qkv's clamp reads and writes q, k and v (4w/h, split
  // by TP); model.residual_multiplier's two scalings each read and write
  // a sublayer's output (4 each). Backward moves about twice as much.
  const double norms =
      (m.pre_norms ? (m.shared_norm ? 1.0 : 2.0) : 0.0) + (m.post_norms ? 2.0 : 0.0);
  const double residual_scaling = m.residual_multiplier != 1.0 ? 8.0 : 0.0;
  const double replicated =
      (14.0 + 4.0 * norms + residual_scaling) / (p.sequence_parallel ? t : 1.0);
  // A mixture's experts read and write k tokens' activations at their
  // width, and its dispatch and combine move k copies of each token whole
  // on every rank (the gathered rows and the weighted outputs, each written
  // and read).
  const double shared_width =
      static_cast<double>(m.shared_fc_width() + m.moe.shared_ffn_hidden_size);
  // model.activation relu2 runs two passes (a clamp, then a product): the
  // second reads and writes F more.
  const double relu2_pass = m.activation == nn::Activation::Relu2 ? 2.0 : 0.0;
  const double act_bytes =
      moe ? (k * static_cast<double>(m.expert_fc_width() + (1.0 + relu2_pass) * m.expert_ffn()) +
             shared_width + relu2_pass * static_cast<double>(m.moe.shared_ffn_hidden_size)) *
                2.0 / h
          : 2.0 * (fc + (1.0 + relu2_pass) * f) / h;
  const double dispatch_bytes = moe ? 8.0 * k : 0.0;
  const double clip_bytes = m.clip_qkv > 0 ? 4.0 * static_cast<double>(m.qkv_width()) / h : 0.0;
  const double token_bytes_fwd =
      tokens * h * (replicated + (act_bytes + clip_bytes) / t + dispatch_bytes);
  // model.lora.dropout's passes, as many backward (the mask drawn again,
  // the transposes' gradients) as forward.
  const double lora_bytes = tokens * lora_dropout_widths(m, t, moe).passes() * 2.0 * kFp16;
  L.fwd_mem = L.attn_mem_fwd + (token_bytes_fwd + lora_bytes) / bw;
  L.bwd_mem = attn_mem_bwd + (2.0 * token_bytes_fwd + lora_bytes) / bw;
  // Tensor parallelism: two all-reduces (or reduce-scatter + all-gather
  // pairs, the same bytes) of the b*s*h activation per direction. Backward,
  // the QKV and MLP-up layers' input gradients (all-reduced, or
  // reduce-scattered under sequence parallelism) overlap their own
  // weight-gradient GEMMs. model.parallel_residual, with no dropout or
  // post-norm acting on each sublayer's output alone, reduces both
  // sublayers' outputs at once: forward, one all-reduce (under sequence
  // parallelism two all-gathers and one reduce-scatter), and under sequence
  // parallelism one all-gather fewer backward.
  if (t > 1) {
    const double act = tokens * h * kFp16;
    const double ar = tp_all_reduce(act, c, p);
    const double rs = tp_reduce_scatter(act, c, p);
    const bool one_reduction = m.reduces_sublayers_at_once();
    // (A reduce-scatter and all-gather pair is priced as an all-reduce, as
    // above; the one left over as a reduce-scatter.)
    L.fwd_tp = !one_reduction ? 2.0 * ar : p.sequence_parallel ? ar + rs : ar;
    L.bwd_tp = one_reduction && p.sequence_parallel ? ar + rs : 2.0 * ar;
    const double input_grad = p.sequence_parallel ? rs : ar;
    // (The experts' input gradient is reduced after their passes, not
    // during a weight-gradient GEMM.)
    L.bwd_tp_hidden = std::min(input_grad, qkv.dw) + (moe ? 0.0 : std::min(input_grad, up.dw));
    if (m.qk_norm_full) {
      // model.qk_norm: full gathers the queries and keys (fp16, one
      // all-gather) forward for their norms, and their gradients backward.
      const double gathered =
          tokens *
          static_cast<double>(m.q_width() + std::max<int64_t>(m.kv_heads(), p.tp) * m.head_dim()) *
          kFp16;
      L.fwd_tp += tp_reduce_scatter(gathered, c, p);
      L.bwd_tp += tp_reduce_scatter(gathered, c, p);
    }
    if (moe) {
      // The gates' gradient (k f32 per token) all-reduced; under sequence
      // parallelism the router's probabilities (E f32 per token) gathered.
      L.bwd_tp += tp_all_reduce(tokens * (k + 1.0) * 4.0, c, p);
      if (p.sequence_parallel) L.fwd_tp += tp_reduce_scatter(tokens * E * 4.0, c, p);
    }
  }
  if (p.cp > 1) {
    // Context parallelism, all-to-all: q, k and v (this rank's heads'
    // width, its positions) go out to the other ranks' heads, and the
    // output comes back, all but 1/cp of each; all-gather: each rank
    // receives the other chunks' keys and values (cp - 1 times its own),
    // the gradients reduce-scattered back as many. Over NVLink while the cp
    // ranks (tp apart) share a node; backward the same for the gradients.
    // On the critical path as TP's collectives are, and priced with them.
    // All-to-all and ring: the all-to-all over cp_a2a ranks (tp apart),
    // then the ring over cp / cp_a2a positions (tp cp_a2a apart), each hop
    // a group's keys and values for a cp_a2a-th of the heads.
    const auto link = [&](long long span) {
      const bool in_node = static_cast<long long>(p.tp) * span <= c.gpus_per_node;
      return std::pair{
          (in_node ? c.intra_bandwidth : c.inter_bandwidth_per_gpu()) * c.collective_efficiency,
          in_node ? c.intra_latency : c.inter_latency};
    };
    const double kv = w_local - static_cast<double>(m.q_width()) / t;
    const auto all_to_all = [&](int ranks) {
      const auto [rate, latency] = link(ranks);
      const double out = static_cast<double>(m.q_width()) / t;
      const double bytes = tokens * (w_local + out) * kFp16;
      return (ranks - 1.0) / ranks * bytes / rate + 2.0 * (ranks - 1.0) * latency;
    };
    // Ring: positions - 1 hops of `hop_bytes` forward, each overlapping a
    // step's attention (a positions-th of the layer's), exposed only where
    // it outlasts it. Backward, the heavier steps (2.5 times a forward
    // one) each overlap the next keys' hop and the previous step's f32
    // gradients' hop, one after the other on the link; the last gradients'
    // hop, after the last step, is exposed whole.
    const auto ring = [&](int positions, double hop_bytes) {
      const auto [rate, latency] = link(p.cp);
      const double hop = hop_bytes / rate + latency;
      const double grad_hop = hop_bytes * 4.0 / kFp16 / rate + latency;
      const double fwd_step = L.attn_gemm_fwd / positions, bwd_step = 2.5 * fwd_step;
      const auto exposed = [](double transfer, double step) {
        return std::max(0.0, transfer - step);
      };
      L.fwd_tp += (positions - 1.0) * exposed(hop, fwd_step);
      L.bwd_tp += exposed(hop, bwd_step) + (positions - 2.0) * exposed(hop + grad_hop, bwd_step) +
                  exposed(grad_hop, bwd_step) + grad_hop;
    };
    if (exchange == cp::Exchange::Ring) {
      ring(p.cp, tokens * kv * kFp16);
    } else if (exchange == cp::Exchange::AllToAllRing) {
      // After the all-to-all a rank holds its group's cp_a2a shares of the
      // sequence for a cp_a2a-th of the key/value heads (fewer heads than
      // ranks: the one its queries read).
      const int a2a = p.cp_a2a;
      const int64_t kv_heads = m.kv_heads_per_rank(p.tp);
      const double kept = kv_heads % a2a == 0 ? kv / a2a : kv / static_cast<double>(kv_heads);
      const double exchange_time = all_to_all(a2a);
      L.fwd_tp += exchange_time;
      L.bwd_tp += exchange_time;
      ring(p.cp / a2a, a2a * tokens * kept * kFp16);
    } else {
      double exchange_time = 0;
      if (gathered) {
        const auto [rate, latency] = link(p.cp);
        exchange_time = (p.cp - 1.0) * tokens * kv * kFp16 / rate + (p.cp - 1.0) * latency;
      } else {
        exchange_time = all_to_all(p.cp);
      }
      L.fwd_tp += exchange_time;
      L.bwd_tp += exchange_time;
    }
  }
  if (moe && p.ep > 1) {
    // Expert parallelism: each exchange sends the rank's k rows per token
    // (whole width, fp16) to the experts' holders, all but 1/ep of them
    // away, over NVLink while the ep ranks (tp apart) share a node, else
    // over the GPU's share of the NICs; two forward (there and back), two
    // backward.
    const double rows = tokens * k * h * kFp16;
    const bool in_node = static_cast<long long>(p.tp) * p.ep <= c.gpus_per_node;
    const double exchange = (p.ep - 1.0) / p.ep * rows /
                                ((in_node ? c.intra_bandwidth : c.inter_bandwidth_per_gpu()) *
                                 c.collective_efficiency) +
                            (p.ep - 1.0) * (in_node ? c.intra_latency : c.inter_latency);
    L.fwd_ep = 2.0 * exchange;
    L.bwd_ep = 2.0 * exchange;
  }
  if (moe && p.cp > 1 && m.moe.pad_to_capacity && m.moe.capacity_factor > 0) {
    // Padded under context parallelism every rank routes the whole
    // micro-batch: it all-gathers the tokens (whole width, fp16) and the
    // router's probabilities (E f32 each) over the context group and, after
    // its cp-th of every expert's slots (k per token), the experts' outputs;
    // backward, reduce-scatters of the same sizes. Each moves cp - 1 ranks'
    // shares, over NVLink while the group (tp apart) shares a node.
    const bool in_node = static_cast<long long>(p.tp) * p.cp <= c.gpus_per_node;
    const double shares = tokens * (h * kFp16 + E * 4.0 + k * h * kFp16);
    const double gathers = (p.cp - 1.0) * shares /
                               ((in_node ? c.intra_bandwidth : c.inter_bandwidth_per_gpu()) *
                                c.collective_efficiency) +
                           3.0 * (p.cp - 1.0) * (in_node ? c.intra_latency : c.inter_latency);
    L.fwd_ep += gathers;
    L.bwd_ep += gathers;
  }
  if (!training.backward) {
    L.bwd_input_gemm = L.bwd_weight_gemm = L.bwd_mem = L.bwd_tp = L.bwd_tp_hidden = 0;
    L.bwd_ep = 0;
    L.backward = false;
  }
  return L;
}

// Output head and loss on the last stage, per microbatch (seconds).
struct HeadCost {
  double fwd = 0, bwd_input = 0, bwd_weight = 0;
  double bwd_tp_hidden = 0;  // as LayerCost's (its TP collectives are in the three above)
};

HeadCost head_cost(const nn::GptConfig& m, const ClusterSpec& c, const ParallelConfig& p) {
  const double tokens = static_cast<double>(p.micro_batch) * m.seq_len / p.cp;
  const double v = static_cast<double>(m.vocab_size) / p.tp, h = static_cast<double>(m.d_model);
  const LinearTimes lt = linear_times(tokens, h, v, c);
  // Cross entropy over the half-precision logits the head's product
  // writes (f32 only in its registers: bf16 or fp16 in memory, 2 bytes). A
  // rank holding the whole vocabulary (tp 1) reads them once for the loss
  // and writes their gradient over them in the same forward pass
  // (linear_cross_entropy's expected_grad, a z-loss's gradient with it; the
  // second read of a row comes from cache); for the vocab-parallel loss
  // (which reads its shard once, then reduces over the shards) the
  // gradient is a backward pass of its own, a read and a write.
  // Soft-capped logits (Gemma 2's final_logit_softcap) are read and written
  // once more, in place, before the loss (the gradient takes the cap's
  // derivative in the pass that writes it).
  const bool ahead = p.tp == 1;
  const double forward_passes = (ahead ? 3.0 : 2.0) + (m.final_logit_softcap > 0 ? 2.0 : 0.0);
  const double backward_passes = ahead ? 0.0 : 2.0;
  // model.logit_scale scales ln_f's output (tokens x h, 16-bit) before the
  // head: read and written forward, and its gradient's backward.
  const double scale_bytes = m.logit_scale != 1.0 ? tokens * h * kFp16 : 0.0;
  const double bandwidth = c.memory_bandwidth * c.memory_efficiency;
  const double ce_fwd = (tokens * v * kFp16 * forward_passes + scale_bytes) / bandwidth;
  const double ce_bwd = (tokens * v * kFp16 * backward_passes + scale_bytes) / bandwidth;
  // (A frozen head, as under model.lora: no weight gradient.)
  const double head_dw =
      trains(m, p, m.tie_embeddings ? "wte.weight" : "lm_head.weight") ? lt.dw : 0.0;
  HeadCost H{lt.fwd + ce_fwd, lt.dx + ce_bwd, head_dw};
  if (p.tp > 1) {
    // The vocab-parallel loss all-reduces the rows' max (one f32 per
    // token), then the shards' sums of exponentials with the target's
    // logit (two); x's gradient is all-reduced (reduce-scattered,
    // its input having been all-gathered, under sequence parallelism)
    // during the head's weight-gradient GEMM.
    const double act = tokens * h * kFp16;
    const double stats = tp_all_reduce(tokens * 4.0, c, p) + tp_all_reduce(tokens * 8.0, c, p);
    const double gather = p.sequence_parallel ? tp_reduce_scatter(act, c, p) : 0.0;
    const double dx = p.sequence_parallel ? tp_reduce_scatter(act, c, p) : tp_all_reduce(act, c, p);
    H.fwd += stats + gather;
    H.bwd_input += dx;
    H.bwd_tp_hidden = std::min(dx, head_dw);
  }
  return H;
}

struct SimKey {
  int kind, p, v, m, limit;
  // Each stage's F, B and W relative to a layer's forward, in 1e-4 units,
  // and the message time likewise.
  std::vector<long> f, bi, bw;
  long comm;
  bool operator<(const SimKey& o) const {
    return std::tie(kind, p, v, m, limit, f, bi, bw, comm) <
           std::tie(o.kind, o.p, o.v, o.m, o.limit, o.f, o.bi, o.bw, o.comm);
  }
};

// The schedule simulated on per-stage costs (p * v stages: each its layers'
// F, B and W, the last one with the head's), cached: the planner asks for
// the same shapes many times. The result's times are in units of `unit` (a
// layer's forward).
pipeline::SimulationResult simulate_cached(pipeline::ScheduleKind kind, int p, int v, int m,
                                           int limit, const std::vector<double>& f,
                                           const std::vector<double>& bi,
                                           const std::vector<double>& bw, double comm,
                                           double unit) {
  static std::mutex mutex;
  static std::map<SimKey, pipeline::SimulationResult> cache;
  auto q = [&](double x) { return std::lround(x / unit * 1e4); };
  auto qs = [&](const std::vector<double>& xs) {
    std::vector<long> out;
    for (double x : xs) out.push_back(q(x));
    return out;
  };
  const SimKey key{
      static_cast<int>(kind),
      p,
      v,
      m,
      kind == pipeline::ScheduleKind::ZbAuto || kind == pipeline::ScheduleKind::ZbV ? limit : 0,
      qs(f),
      qs(bi),
      qs(bw),
      q(comm)};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  pipeline::Costs costs;
  auto back = [](const std::vector<long>& xs) {
    std::vector<double> out;
    // A stage too cheap to price still costs something (the search needs > 0).
    for (long x : xs) out.push_back(std::max(x, 1L) / 1e4);
    return out;
  };
  costs.forward = back(key.f);
  costs.backward_input = back(key.bi);
  costs.backward_weight = back(key.bw);
  costs.backward.resize(costs.forward.size());
  for (size_t st = 0; st < costs.backward.size(); ++st)
    costs.backward[st] = costs.backward_input[st] + costs.backward_weight[st];
  costs.p2p_latency = key.comm / 1e4;
  // zb-auto's order is searched for these very costs, as the trainer does
  // for the ones it measures; zb-v's list scheduler takes them too.
  // (zb-auto's search simulates the order it picks: its result is used.)
  // The executor on GPUs waits as StreamPerPeer models.
  const auto semantics = pipeline::P2PSemantics::StreamPerPeer;
  pipeline::SimulationResult result;
  if (kind == pipeline::ScheduleKind::ZbAuto) {
    pipeline::make_zero_bubble_schedule(p, m, costs, {key.limit, semantics}, &result);
  } else {
    result =
        pipeline::simulate(kind == pipeline::ScheduleKind::ZbV
                               ? pipeline::make_zero_bubble_v_schedule(p, m, costs, {key.limit})
                               : pipeline::make_schedule(kind, p, m, v),
                           costs, semantics);
  }
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, result);
  return result;
}

std::string need(const std::string& what, long long value, const std::string& rule) {
  return what + " (" + std::to_string(value) + ") " + rule;
}

}  // namespace

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

Recompute recompute_from_name(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw ConfigError("recompute '" + name + "' must be none, selective or full");
}

const char* attention_name(Attention a) {
  return a == Attention::Flash ? "flash" : "unfused";
}

Attention attention_from_name(const std::string& name) {
  if (name == "unfused") return Attention::Unfused;
  if (name == "flash") return Attention::Flash;
  throw ConfigError("attention '" + name + "' must be unfused or flash");
}

std::string ParallelConfig::str() const {
  std::string stages;
  for (int64_t n : stage_layers) stages += (stages.empty() ? " stages=[" : ",") + std::to_string(n);
  if (!stages.empty()) stages += "]";
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) +
         " vpp=" + std::to_string(vpp) + " mb=" + std::to_string(micro_batch) +
         " recompute=" + recompute_name(recompute) +
         (recompute_layers > 0 ? " recompute_layers=" + std::to_string(recompute_layers) : "") +
         " sp=" + (sequence_parallel ? "on" : "off") + " zero1=" + (zero1 ? "on" : "off") +
         (ep > 1 ? " ep=" + std::to_string(ep) : "") + (cp > 1 ? " cp=" + std::to_string(cp) : "") +
         (cp > 1 && cp_exchange != cp::Exchange::Auto
              ? std::string(" cp_comm=") + cp::exchange_name(cp_exchange)
              : "") +
         (cp_a2a > 1 ? " cp_a2a=" + std::to_string(cp_a2a) : "") + " " +
         pipeline::schedule_name(schedule) +
         ((schedule == pipeline::ScheduleKind::ZbAuto || schedule == pipeline::ScheduleKind::ZbV) &&
                  zb_max_in_flight > 0
              ? " max-in-flight=" + std::to_string(zb_max_in_flight)
              : std::string()) +
         (attention == Attention::Flash ? " attention=flash" : "") + stages +
         (muon ? " muon" : "") + (bf16_moments ? " moments=bf16" : "") +
         (bf16_grads ? " grads=bf16" : "") + (ema ? " ema" : "");
}

double ptdp_model_flops(const nn::GptConfig& m, int global_batch, double recomputed) {
  // 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)), or 96*...*V/(16*l*h) with full
  // recomputation, for GPT-2's MLP; GptConfig generalises it to any MLP.
  return m.training_flops(static_cast<double>(global_batch), recomputed);
}

ParallelConfig concrete_context_exchange(const nn::GptConfig& m, const ClusterSpec& c,
                                         ParallelConfig p) {
  // (A layout without sizes is check_config's to name.)
  if (p.cp <= 1 || p.cp_exchange != cp::Exchange::Auto || p.tp < 1 || p.pp < 1 || p.dp < 1 ||
      m.n_head % p.tp != 0) {
    return p;
  }
  // Each context group's GPUs' nodes: group (pp rank, dp index, tp rank)
  // holds ranks tp apart from t + tp (d cp) + tp dp cp pp_rank.
  const int64_t per_node = std::max(1, c.gpus_per_node);
  std::vector<std::vector<int>> nodes;
  for (int64_t stage = 0; stage < p.pp; ++stage) {
    for (int64_t d = 0; d < p.dp; ++d) {
      for (int64_t t = 0; t < p.tp; ++t) {
        std::vector<int>& group = nodes.emplace_back();
        for (int64_t i = 0; i < p.cp; ++i) {
          const int64_t rank = t + p.tp * (d * p.cp + i) + int64_t{p.tp} * p.dp * p.cp * stage;
          group.push_back(static_cast<int>(rank / per_node));
        }
      }
    }
  }
  const cp::ExchangeChoice chosen =
      cp::choose_exchange(p.cp_exchange, p.cp_a2a, m, p.tp, p.cp, p.sequence_parallel, nodes);
  p.cp_exchange = chosen.exchange;
  p.cp_a2a = static_cast<int>(chosen.a2a);
  return p;
}

void check_config(const nn::GptConfig& m, const ClusterSpec& c, int gpus, int global_batch,
                  const ParallelConfig& asked) {
  const ParallelConfig p = concrete_context_exchange(m, c, asked);
  m.validate();
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.cp < 1 || p.vpp < 1 || p.micro_batch < 1) {
    throw ConfigError("tp, pp, dp, cp, vpp and micro batch must all be >= 1 (got " + p.str() + ")");
  }
  if (static_cast<long long>(p.tp) * p.pp * p.dp * p.cp != gpus) {
    const std::string cp = p.cp > 1 ? "*cp" : "", cps = p.cp > 1 ? "*" + std::to_string(p.cp) : "";
    throw ConfigError("GPUs (" + std::to_string(gpus) + ") must equal tp*pp*dp" + cp + " = " +
                      std::to_string(p.tp) + "*" + std::to_string(p.pp) + "*" +
                      std::to_string(p.dp) + cps + " = " +
                      std::to_string(static_cast<long long>(p.tp) * p.pp * p.dp * p.cp));
  }
  if (p.recompute_layers < 0 || (p.recompute_layers > 0 && p.recompute != Recompute::Full)) {
    throw ConfigError(need("recompute_layers", p.recompute_layers,
                           p.recompute_layers < 0 ? "must be at least 0 (0: every layer)"
                                                  : "goes with recompute full"));
  }
  // (The heads, the length and the losses against the chunks.)
  try {
    cp::check_context_parallel(m, p.tp, p.cp, p.sequence_parallel, p.cp_exchange, p.cp_a2a);
  } catch (const NotSupportedError& e) {
    throw ConfigError(e.what());
  }
  if (m.n_head % p.tp != 0) {
    throw ConfigError(
        need("n_head", m.n_head, "must be divisible by tp (" + std::to_string(p.tp) + ")"));
  }
  if (!m.kv_heads_fit(p.tp)) {
    throw ConfigError(need("n_kv_head", m.kv_heads(), m.kv_heads_rule(p.tp, "tp")));
  }
  if (p.ep < 1 || (p.dp * p.cp) % p.ep != 0) {
    throw ConfigError(need("ep", p.ep,
                           "must divide dp (" + std::to_string(p.dp) + ")" +
                               (p.cp > 1 ? " times cp (" + std::to_string(p.cp) + ")" : "")));
  }
  if (p.ep > 1 && (m.moe.experts == 0 || m.moe.experts % p.ep != 0)) {
    throw ConfigError(need("ep", p.ep,
                           "needs a mixture of experts whose experts (" +
                               std::to_string(m.moe.experts) + ") it divides"));
  }
  if (m.moe.shared_ffn_hidden_size % p.tp != 0) {
    throw ConfigError(need("moe.shared_ffn_hidden_size", m.moe.shared_ffn_hidden_size,
                           "must be divisible by tp (" + std::to_string(p.tp) +
                               "): the shared expert's hidden units are split over the ranks"));
  }
  if (m.moe.experts > 0 && m.expert_ffn() % p.tp != 0) {
    throw ConfigError(need("moe.ffn_hidden_size", m.expert_ffn(),
                           "must be divisible by tp (" + std::to_string(p.tp) +
                               "): each expert's hidden units are split over the ranks"));
  }
  if (p.tp > c.gpus_per_node) {
    throw ConfigError(need("tp", p.tp,
                           "must not exceed gpus_per_node (" + std::to_string(c.gpus_per_node) +
                               "): a tensor-parallel group stays inside one node"));
  }
  const long long stages = static_cast<long long>(p.pp) * p.vpp;
  if (!p.stage_layers.empty()) {
    pipeline::check_stage_layers(p.stage_layers, stages, m.n_layer);
  } else if (m.n_layer % stages != 0) {
    throw ConfigError(
        need("n_layer", m.n_layer, "must be divisible by pp*vpp (" + std::to_string(stages) + ")"));
  }
  if (global_batch % (static_cast<long long>(p.micro_batch) * p.dp) != 0) {
    throw ConfigError(need(
        "global batch", global_batch,
        "must be divisible by micro batch * dp (" + std::to_string(p.micro_batch * p.dp) + ")"));
  }
  const bool interleaved = p.schedule == pipeline::ScheduleKind::Interleaved;
  if (p.schedule == pipeline::ScheduleKind::ZbV) {
    if (p.vpp != 2) {
      throw ConfigError("vpp (" + std::to_string(p.vpp) +
                        ") must be 2 for the zb-v schedule (two chunks per rank in a V)");
    }
  } else if (interleaved != (p.vpp > 1)) {
    throw ConfigError("vpp (" + std::to_string(p.vpp) +
                      ") > 1 goes with the interleaved or zb-v schedule and only with them (got " +
                      pipeline::schedule_name(p.schedule) + ")");
  }
  if (p.sequence_parallel && p.tp == 1) throw ConfigError("sequence parallelism needs tp > 1");
  if (!p.frozen.empty()) {
    const std::map<std::string, Shape> shapes = nn::gpt_parameter_shapes(m);
    for (const std::string& name : p.frozen) {
      if (!shapes.count(name))
        throw ConfigError("frozen parameter '" + name + "' is not a parameter of this model");
    }
  }
}

namespace {

// estimate() with the schedule simulated, or (`simulate` false) the bounds
// from below that estimate_lower_bound() describes.
Estimate price(const nn::GptConfig& m, const ClusterSpec& c, int gpus, int global_batch,
               const ParallelConfig& asked, bool simulate) {
  const ParallelConfig p = concrete_context_exchange(m, c, asked);
  check_config(m, c, gpus, global_batch, p);  // (p's exchange is concrete already)
  Estimate e;
  e.config = p;
  e.num_microbatches = global_batch / (p.micro_batch * p.dp);
  const double b = p.micro_batch, s = static_cast<double>(m.seq_len),
               h = static_cast<double>(m.d_model);
  const double a = static_cast<double>(m.n_head), t = p.tp, V = static_cast<double>(m.vocab_size);
  // ---- the stages: each one's layers (the split given, or an even one) and
  // the ranks holding them (the schedule's placement)
  const int S = p.pp * p.vpp;
  const std::vector<int64_t> counts =
      p.stage_layers.empty() ? std::vector<int64_t>(S, m.n_layer / S) : p.stage_layers;
  const pipeline::Placement placement = pipeline::placement_of(p.schedule);
  // What trains in each layer. The layers before `backward_from` (frozen,
  // with nothing before them training) keep no activations: no backward
  // pass reaches them.
  const std::vector<LayerTraining> training = layer_training(m, p);
  int64_t backward_from = 0;
  while (backward_from < m.n_layer && !training[static_cast<size_t>(backward_from)].backward)
    ++backward_from;
  std::vector<int64_t> stage_start(S, 0);
  for (int st = 1; st < S; ++st) stage_start[st] = stage_start[st - 1] + counts[st - 1];
  std::vector<int64_t> widest(p.pp, 0);  // its largest chunk's layers keeping activations
  for (int r = 0; r < p.pp; ++r) {
    for (int ch = 0; ch < p.vpp; ++ch) {
      const int st = pipeline::stage_at(placement, p.pp, r, ch);
      const int64_t n = counts[st];
      // (The last stage's prediction modules, model.mtp_layers, keep their
      // blocks' activations beside its layers'.)
      const int64_t kept = std::clamp<int64_t>(stage_start[st] + n - backward_from, 0, n) +
                           (st == S - 1 ? m.mtp_layers : 0);
      widest[r] = std::max(widest[r], kept);
    }
  }

  // ---- compute per microbatch: each layer's F, B and W (the layers differ
  // in their attention's window); each stage's, the last with the output
  // head and the loss
  // Zero-bubble schedules run B (input gradients) and W apart: nothing
  // then hides the input gradients' TP collectives.
  const bool split_backward = p.schedule == pipeline::ScheduleKind::ZbH1 ||
                              p.schedule == pipeline::ScheduleKind::ZbAuto ||
                              p.schedule == pipeline::ScheduleKind::ZbV;
  const bool hide_tp = p.overlap_tp && !split_backward;
  const HeadCost H = head_cost(m, c, p);
  const double head_hidden = hide_tp ? H.bwd_tp_hidden : 0.0;
  // Recomputation reruns forward work inside the backward. Selective
  // recomputation redoes the attention core to avoid storing its score-
  // sized activations; fused attention stores none, so it changes nothing.
  const bool flash = p.attention == Attention::Flash;
  const Recompute recompute =
      flash && p.recompute == Recompute::Selective ? Recompute::None : p.recompute;
  struct Layer {
    double f, bi, bw;          // the pipeline's passes
    double gemm, mem, tp, ep;  // the breakdown (forward + backward + recomputation)
    double tp_hidden;          // of tp, hidden behind weight-gradient GEMMs
  };
  auto layer_of = [&](const LayerCost& L, Recompute recompute) {
    Layer x;
    if (!L.backward) {  // forward only: nothing to recompute either
      x.f = L.fwd_gemm + L.fwd_mem + L.fwd_tp + L.fwd_ep;
      x.bi = x.bw = x.tp_hidden = 0;
      x.gemm = L.fwd_gemm, x.mem = L.fwd_mem, x.tp = L.fwd_tp, x.ep = L.fwd_ep;
      return x;
    }
    x.f = L.fwd_gemm + L.fwd_mem + L.fwd_tp + L.fwd_ep;
    // (The exchanges' backward carries input gradients: B's.)
    x.bi = L.bwd_input_gemm + 0.5 * L.bwd_mem + 0.5 * L.bwd_tp + L.bwd_ep +
           (recompute == Recompute::Full        ? x.f
            : recompute == Recompute::Selective ? L.attn_gemm_fwd + L.attn_mem_fwd
                                                : 0.0);
    // (Unsplit, B and W run as one: the hidden collectives leave W.)
    x.tp_hidden = hide_tp ? L.bwd_tp_hidden : 0.0;
    x.bw = L.bwd_weight_gemm + 0.5 * L.bwd_mem + 0.5 * L.bwd_tp - x.tp_hidden;
    x.gemm = L.fwd_gemm + L.bwd_input_gemm + L.bwd_weight_gemm +
             (recompute == Recompute::Full        ? L.fwd_gemm
              : recompute == Recompute::Selective ? L.attn_gemm_fwd
                                                  : 0);
    x.mem = L.fwd_mem + L.bwd_mem + (recompute == Recompute::Full ? L.fwd_mem : 0);
    x.tp = L.fwd_tp + L.bwd_tp + (recompute == Recompute::Full ? L.fwd_tp : 0);
    x.ep = L.fwd_ep + L.bwd_ep + (recompute == Recompute::Full ? L.fwd_ep : 0);
    return x;
  };
  // A few kinds of layer: windowed and not (layer_cost reads the window of
  // the layer it is given), dense or a mixture of experts, and what of each
  // trains.
  // (Each kind as it runs under `recompute` and, for recompute_layers, as it
  // runs keeping its activations.)
  std::map<std::tuple<int64_t, bool, LayerTraining>, std::pair<Layer, Layer>> kinds;
  std::vector<std::pair<Layer, Layer>> layers(static_cast<size_t>(m.n_layer));
  double mean_f = 0;
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const auto key =
        std::make_tuple(m.window_of(i), m.moe_layer(i), training[static_cast<size_t>(i)]);
    auto it = kinds.find(key);
    if (it == kinds.end()) {
      const LayerCost L = layer_cost(m, c, p, i, std::get<2>(key));
      it = kinds.emplace(key, std::make_pair(layer_of(L, recompute), layer_of(L, Recompute::None)))
               .first;
    }
    layers[static_cast<size_t>(i)] = it->second;
    mean_f += it->second.first.f / static_cast<double>(m.n_layer);
  }
  // Stage st holds the layers from first[st] on (stages in layer order);
  // under full recomputation its first recomputed_layers recompute and the
  // others keep their activations.
  std::vector<Layer> stage(S, Layer{});
  for (int st = 0, first = 0; st < S; first += static_cast<int>(counts[st]), ++st) {
    const int64_t again = recompute == Recompute::Full
                              ? pipeline::recomputed_layers(counts[st], p.recompute_layers)
                              : counts[st];
    for (int64_t i = first; i < first + counts[st]; ++i) {
      const auto& both = layers[static_cast<size_t>(i)];
      const Layer& x = i - first < again ? both.first : both.second;
      Layer& y = stage[st];
      y.f += x.f, y.bi += x.bi, y.bw += x.bw, y.gemm += x.gemm, y.mem += x.mem, y.tp += x.tp;
      y.ep += x.ep;
      y.tp_hidden += x.tp_hidden;
    }
  }
  // Multi-token prediction (model.mtp_layers): on the last stage each
  // module's block (priced as layer n_layer + k - 1, all of it training),
  // its eh_proj (2h -> h, whole on every TP rank: each rank's tokens under
  // sequence parallelism) and another pass through the head and its loss.
  Layer mtp{};
  if (m.mtp_layers > 0) {
    const double tokens = b * s / p.cp / (p.sequence_parallel ? t : 1.0);
    const LinearTimes eh = linear_times(tokens, 2.0 * h, h, c);
    for (int64_t k = 1; k <= m.mtp_layers; ++k) {
      const Layer x = layer_of(layer_cost(m, c, p, m.n_layer + k - 1, LayerTraining{}), recompute);
      mtp.f += x.f + eh.fwd + H.fwd;
      mtp.bi += x.bi + eh.dx + H.bwd_input;
      mtp.bw += x.bw + eh.dw + H.bwd_weight - head_hidden;
    }
  }
  std::vector<double> sf(S), sbi(S), sbw(S);
  for (int st = 0; st < S; ++st) {
    const bool head = st == S - 1;
    sf[st] = stage[st].f + (head ? H.fwd + mtp.f : 0.0);
    sbi[st] = stage[st].bi + (head ? H.bwd_input + mtp.bi : 0.0);
    sbw[st] = stage[st].bw + (head ? H.bwd_weight - head_hidden + mtp.bw : 0.0);
  }
  // The busiest rank's work per microbatch (its stages' F, B and W) sets
  // the pace; the breakdown is of its layers.
  int busiest = 0;
  std::vector<double> rank_backward(p.pp, 0.0);
  std::vector<double> rank_work(p.pp, 0.0);
  for (int r = 0; r < p.pp; ++r) {
    for (int ch = 0; ch < p.vpp; ++ch) {
      const int st = pipeline::stage_at(placement, p.pp, r, ch);
      rank_work[r] += sf[st] + sbi[st] + sbw[st];
      rank_backward[r] += sbi[st] + sbw[st];
    }
    if (rank_work[r] > rank_work[busiest]) busiest = r;
  }
  e.compute_time = rank_work[busiest];
  for (int ch = 0; ch < p.vpp; ++ch) {
    const Layer& y = stage[pipeline::stage_at(placement, p.pp, busiest, ch)];
    e.gemm_time += y.gemm;
    e.memory_bound_time += y.mem;
    e.tp_comm_time += y.tp;
    e.tp_comm_hidden_time += y.tp_hidden;
    e.ep_comm_time += y.ep;
  }

  // ---- pipeline point-to-point: one (b, s, h) activation, split over the TP
  // ranks (sequence parallel, or scatter-gather with the receiving stage's
  // all-gather of the pieces); across nodes when a pipeline hop skips a
  // whole node of tp*dp ranks.
  if (p.pp > 1) {
    const double whole = b * s / p.cp * h * kFp16;  // (a chunk under context parallelism)
    const bool scatter_gather = !p.sequence_parallel && p.scatter_gather && p.tp > 1;
    const double bytes = p.sequence_parallel || scatter_gather ? whole / t : whole;
    const bool cross = p.tp * p.dp * p.cp >= c.gpus_per_node;
    const double bwid = cross ? c.inter_bandwidth_per_gpu() : c.intra_bandwidth;
    e.p2p_time =
        (cross ? c.inter_latency : c.intra_latency) + bytes / (bwid * c.collective_efficiency);
    if (scatter_gather) e.p2p_time += tp_reduce_scatter(whole, c, p);
  }
  // Chunks whose activations each rank holds at its peak.
  std::vector<double> held_chunks(static_cast<size_t>(p.pp), 1.0);
  if (simulate) {
    const pipeline::SimulationResult sim =
        simulate_cached(p.schedule, p.pp, p.vpp, e.num_microbatches, p.zb_max_in_flight, sf, sbi,
                        sbw, e.p2p_time, mean_f);
    e.pipeline_time = sim.makespan * mean_f;
    e.bubble_fraction = sim.bubble_fraction;
    // Chunk activations held at once per rank (split schedules hold a
    // microbatch's until its W), and the layers they span on the rank that
    // holds the most.
    const std::vector<int>& held = split_backward ? sim.peak_held : sim.peak_alive;
    for (int r = 0; r < p.pp && r < static_cast<int>(held.size()); ++r) {
      e.peak_inflight = std::max(e.peak_inflight, held[r]);
      held_chunks[static_cast<size_t>(r)] = held[r];
    }
  } else {
    // No rank starts before the first microbatch's forward has reached its
    // first stage, nor ends before it has then run every microbatch's
    // passes one after another. And the step does not end before the
    // pipeline has drained: the last input gradient a rank computes at its
    // first stage comes after all its forwards and input gradients (each
    // needs its microbatch's forward through every later stage and the
    // input gradients back), and is followed by that microbatch's input
    // gradients through the earlier stages (and, when W runs apart, stage
    // 0's W). Both less a thousandth: the simulator rounds each stage's
    // costs to 1e-4 of a layer's forward. And every rank holds at least one
    // chunk's activations at some point.
    auto input_grad = [&](int st) { return sbi[st] + (split_backward ? 0.0 : sbw[st]); };
    double pipeline = 0;
    for (int r = 0; r < p.pp; ++r) {
      int first = S;
      double forward_and_input_grad = 0;
      for (int ch = 0; ch < p.vpp; ++ch) {
        const int st = pipeline::stage_at(placement, p.pp, r, ch);
        first = std::min(first, st);
        forward_and_input_grad += sf[st] + input_grad(st);
      }
      const double start = std::accumulate(sf.begin(), sf.begin() + first, 0.0);
      double drain = split_backward ? sbw[0] : 0.0;
      for (int st = 0; st < first; ++st) drain += input_grad(st);
      pipeline = std::max({pipeline, start + e.num_microbatches * rank_work[r],
                           start + e.num_microbatches * forward_and_input_grad + drain});
    }
    e.pipeline_time = pipeline * (1 - 1e-3);
    e.peak_inflight = 1;
  }

  // ---- parameters on the most loaded pipeline rank
  const double ffn_w = static_cast<double>(m.ffn()), fc_w = static_cast<double>(m.fc_width());
  // A key/value head shared by several ranks is held by each of them.
  const double shared_kv =
      2.0 * static_cast<double>(m.head_dim()) * (h + (m.c_attn_bias() ? 1.0 : 0.0)) *
      (static_cast<double>(m.kv_heads_per_rank(p.tp)) - static_cast<double>(m.kv_heads()) / t);
  // model.mla's down-projections and their norms, whole on every TP rank.
  double latent_whole = 0;
  if (m.latent_attention()) {
    const auto& la = m.mla;
    const double q_rank = static_cast<double>(la.q_lora_rank),
                 kv_in = static_cast<double>(la.kv_lora_rank + la.qk_rope_head_dim);
    const double bias = m.linear_bias ? 1.0 : 0.0;
    latent_whole =
        ((h + bias) * q_rank + q_rank + (h + bias) * kv_in + static_cast<double>(la.kv_lora_rank)) *
        (1.0 - 1.0 / t);
  }
  // Each rank's blocks (a mixture's router whole on every TP rank), and of
  // them the experts (reduced over their own replicas under expert
  // parallelism).
  // (The last stage's prediction modules, model.mtp_layers: each a block,
  // eh_proj and three norms, these whole on every TP rank.)
  const double norm_size =
      static_cast<double>((m.norm_weights() ? 1 : 0) + (m.norm_biases() ? 1 : 0)) * h;
  double body = 0, experts_held = 0;
  for (int r = 0; r < p.pp; ++r) {
    double held = 0, experts = 0;
    auto hold_block = [&](int64_t i) {
      held += static_cast<double>(m.block_parameters(i)) / t + shared_kv + latent_whole;
      if (m.moe_layer(i)) {
        held += static_cast<double>(m.moe.experts) * h * (1.0 - 1.0 / t);
        // Expert parallelism: 1/ep of the experts.
        const double all = static_cast<double>(m.moe.experts) * h *
                           static_cast<double>(m.expert_fc_width() + m.expert_ffn()) / t;
        held -= all * (1.0 - 1.0 / p.ep);
        experts += all / p.ep;
      }
    };
    for (int ch = 0; ch < p.vpp; ++ch) {
      const int st = pipeline::stage_at(placement, p.pp, r, ch);
      for (int64_t i = stage_start[st]; i < stage_start[st] + counts[st]; ++i) hold_block(i);
      if (st != S - 1) continue;
      for (int64_t k = 1; k <= m.mtp_layers; ++k) {
        hold_block(m.n_layer + k - 1);
        held += 2.0 * h * h + 3.0 * norm_size;
      }
    }
    if (held > body) body = held, experts_held = experts;
  }
  // The token table on the first stage (and a tied copy, or an untied
  // head, on the last when pp > 1; one process, and ZB-V's first rank, hold
  // both an untied head and the table, or the one tied table).
  const double table = V * h / t;
  const bool both_ends = p.pp == 1 || pipeline::placement_of(p.schedule) == pipeline::Placement::V;
  // (With prediction modules the last stage holds a copy of the table
  // beside an untied head.)
  const double embedding =
      (!m.tie_embeddings && (both_ends || m.mtp_layers > 0) ? 2.0 : 1.0) * table;
  const double positions = m.rotary() ? 0.0 : s * h;  // the learned table, first stage
  const double params = body + embedding + positions;
  // The parameters that train, which have gradients and optimizer state:
  // all, or under model.lora the adapters, less what ParallelConfig::frozen
  // holds fixed (their share of the whole model taken as the rank's share).
  double trained = params;
  if (m.lora.rank > 0 || !p.frozen.empty()) {
    double kept = 0, all = 0;
    for (const auto& [name, shape] : nn::gpt_parameter_shapes(m)) {
      const double n = static_cast<double>(numel(shape));
      all += n;
      if (trains(m, p, name)) kept += n;
    }
    trained = params * kept / all;
  }
  // ---- Muon (train.optimizer muon): the share of what trains that is the
  // blocks' hidden matrices, and the busiest rank's Newton-Schulz GEMM
  // flops (its layers' matrices whole, the experts it holds).
  double muon_share = 0, muon_flops = 0, muon_expert_flops = 0, muon_rank_elements = 0;
  if (p.muon) {
    double hidden = 0, all = 0;
    for (const auto& [name, shape] : nn::gpt_parameter_shapes(m)) {
      if (!trains(m, p, name)) continue;
      const double n = static_cast<double>(numel(shape));
      all += n;
      if (nn::is_hidden_matrix(name, shape)) hidden += n;
    }
    muon_share = all > 0 ? hidden / all : 0.0;
    const int steps = 5;
    for (int r = 0; r < p.pp; ++r) {
      double dense = 0, expert = 0, elements = 0;
      for (int ch = 0; ch < p.vpp; ++ch) {
        const int st = pipeline::stage_at(placement, p.pp, r, ch);
        for (int64_t i = stage_start[st]; i < stage_start[st] + counts[st]; ++i) {
          for (const auto& [name, shape] : nn::gpt_parameter_shapes(m, {i}, false, false, false)) {
            if (!nn::is_hidden_matrix(name, shape) || !trains(m, p, name)) continue;
            const bool is_expert = name.find(".mlp.experts.") != std::string::npos;
            const double held = is_expert ? 1.0 / p.ep : 1.0;
            elements += held * static_cast<double>(numel(shape)) / t;
            for (int64_t rows : nn::fused_row_blocks(m, name, shape[0])) {
              const double a = static_cast<double>(std::min(rows, shape[1]));
              const double b = static_cast<double>(std::max(rows, shape[1]));
              const double f = held * steps * (4.0 * a * a * b + 2.0 * a * a * a);
              (is_expert ? expert : dense) += f;
            }
          }
        }
      }
      if (dense + expert > muon_flops + muon_expert_flops) {
        muon_flops = dense, muon_expert_flops = expert, muon_rank_elements = elements;
      }
    }
  }
  // ---- data parallelism: fp32 gradient reduction (hierarchical: inside the
  // node over NVLink, then across nodes through each GPU's share of the NICs)
  // (Under expert parallelism the experts' share of what trains reduces
  // over the dp / ep ranks holding each, ep * tp ranks apart.)
  const double expert_trained = params > 0 ? trained * experts_held / params : 0.0;
  const double dense_trained = trained - expert_trained;
  // (Context parallelism's ranks reduce with the replicas: dp * cp of them.)
  const int reducing = p.dp * p.cp;
  if (reducing > 1) {
    // A ring over the node's ranks, then one over the nodes, for `n` ranks
    // `stride` GPUs apart; `fraction`: 2 for an all-reduce, 1 for a
    // reduce-scatter or all-gather.
    auto hierarchical = [&](double bytes, double fraction, int n, int stride) {
      if (n <= 1) return 0.0;
      const int in_node = std::max(1, std::min(n, c.gpus_per_node / stride));
      const int nodes = n / in_node;
      return ring_time(bytes, fraction * (in_node - 1) / in_node, in_node, c.intra_bandwidth,
                       c.intra_latency, c.collective_efficiency) +
             ring_time(bytes / in_node, fraction * (nodes - 1) / std::max(nodes, 1), nodes,
                       c.inter_bandwidth_per_gpu(), c.inter_latency, c.collective_efficiency);
    };
    auto reduction = [&](double elements, double bytes_each, double fraction) {
      return hierarchical((elements - expert_trained) * bytes_each, fraction, reducing, p.tp) +
             hierarchical(expert_trained * bytes_each, fraction, reducing / p.ep, p.tp * p.ep);
    };
    // The reduction is overlapped with the last microbatch's backward when
    // the reducer allows.
    const double backward = rank_backward[busiest];
    const double forward = rank_work[busiest] - backward;
    // (bf16 gradients reduce in bf16 on NCCL: 2 bytes an element.)
    const double wire = p.bf16_grads ? 2.0 : 4.0;
    if (!p.zero1) {
      const double time = reduction(trained, wire, 2.0);
      e.dp_comm_time = p.overlap_dp ? std::max(0.0, time - backward) : time;
    } else {
      // Reduce-scatter the gradients (during backward), all-gather fp16
      // parameters after the step — with overlap_param_gather during the
      // next step's first forward pass, each part waiting for its own.
      const double scatter = reduction(trained, wire, 1.0);
      const double gather = reduction(trained, kFp16, 1.0);
      e.dp_comm_time =
          !p.overlap_dp ? scatter + gather
                        : std::max(0.0, scatter - backward) +
                              (p.overlap_param_gather ? std::max(0.0, gather - forward) : gather);
      // Muon: every rank's f32 updates of the matrices gathered over dp,
      // after backward.
      if (p.muon) e.dp_comm_time += reduction(trained * muon_share, 4.0, 1.0);
    }
  }
  // Tied embeddings (or prediction modules' copy of the table): first and
  // last stage all-reduce the embedding gradient (unless they are one
  // rank's).
  double embedding_sync = 0;
  if (!both_ends && m.head_reads_token_embedding()) {
    embedding_sync = ring_time(table * 4.0, 1.0, 2, c.inter_bandwidth_per_gpu(), c.inter_latency,
                               c.collective_efficiency);
  }
  // Optimizer: AdamW streams fp32 master, moments and gradients, writes fp16 params:
  // 30 bytes a parameter; 22 with bf16 moments (each read and written in 2),
  // 2 fewer with bf16 gradients.
  // (ZeRO-1 shards the experts' over their dp / ep replicas.)
  const double optimized =
      p.zero1 ? dense_trained / reducing + expert_trained / (reducing / p.ep) : trained;
  const double moment_bytes = p.bf16_moments ? 2.0 : 4.0;
  const double grad_bytes = p.bf16_grads ? 2.0 : 4.0;
  e.optimizer_time = optimized * (10.0 + grad_bytes + 4.0 * moment_bytes) /
                     (c.memory_bandwidth * c.memory_efficiency);
  // train.ema_decay: the f32 average read and written, the weights read,
  // on every rank for all it trains.
  if (p.ema) e.optimizer_time += trained * 10.0 / (c.memory_bandwidth * c.memory_efficiency);
  if (p.muon) {
    // Newton-Schulz in bf16, or in f32 without TF32: about a sixteenth of
    // the bf16 tensor-core peak (A100: 19.5 of 312 TFLOP/s; H100 SXM: 67 of
    // 989). Without ZeRO-1 every data-parallel replica orthogonalises all of
    // its stage's matrices; with it, those its pieces touch. The TP ranks
    // share each stage's matrices out (tp::ShardedMuon), each sending its
    // f32 shards of the others' matrices and receiving their updates back.
    const double share_dense = p.zero1 ? 1.0 / reducing : 1.0;
    const double share_expert = p.zero1 ? 1.0 / std::max(1, reducing / p.ep) : 1.0;
    const double flops = (muon_flops * share_dense + muon_expert_flops * share_expert) / t;
    e.optimizer_time += flops / (c.peak_flops / (p.muon_ns_fp32 ? 16.0 : 1.0) * c.gemm_efficiency);
    if (p.tp > 1) {
      e.optimizer_time += 2.0 * muon_rank_elements * share_dense * 4.0 * (t - 1.0) / t /
                              (c.intra_bandwidth * c.collective_efficiency) +
                          2.0 * c.intra_latency;
    }
  }
  e.step_time = e.pipeline_time + e.dp_comm_time + embedding_sync + e.optimizer_time;

  // ---- throughput
  e.tokens_per_s = global_batch * s / e.step_time;
  // (With recompute_layers, the share of the layers that recompute.)
  double recomputed_share = 0;
  if (p.recompute == Recompute::Full) {
    for (int64_t n : counts)
      recomputed_share += static_cast<double>(pipeline::recomputed_layers(n, p.recompute_layers));
    recomputed_share /= static_cast<double>(m.n_layer);
  }
  e.model_flops_per_step = ptdp_model_flops(m, global_batch, recomputed_share);
  e.tflops_per_gpu = e.model_flops_per_step / e.step_time / gpus / 1e12;
  e.mfu = ptdp_model_flops(m, global_batch, false) / e.step_time / gpus / c.peak_flops;

  // ---- memory per GPU (Korthikanti et al. 2022 for activations)
  e.weights_bytes = params * 2.0;
  // f32 gradients, or bf16 (train.grad_precision: Megatron-LM's default).
  e.gradient_bytes = trained * grad_bytes;
  // f32 master and AdamW's two moments (f32, or bf16: train.moment_precision);
  // Muon's matrices one moment.
  e.optimizer_bytes = optimized * (4.0 + moment_bytes * (2.0 - muon_share));
  // train.ema_decay's f32 average, whole on every data-parallel rank.
  if (p.ema) e.optimizer_bytes += trained * 4.0;
  // (A chunk of each sequence under context parallelism; the attention's
  // own, below, a cp-th of the heads over the whole sequence.)
  const double sbh = s / p.cp * b * h;
  // Attention's share beyond the 34 sbh of a layer: softmax output, dropout
  // mask and output of the (s x s) scores (5as/h), or with fused attention
  // the f32 log-sum-exp per head and position (4a/h).
  const double attn_extra = flash ? 4.0 * a / h : 5.0 * a * s / h;
  // Of the 34 sbh, 16 are the MLP's activation input (4h) and c_proj's input
  // (4h) in 2 bytes: 2(m + F)/h for another width or SwiGLU; 6 are q, k and
  // v (2w/h with grouped-query attention's narrower k and v) and 2 the
  // attention's output (2q/h when model.head_dim sets the heads' width
  // apart). 24 of them are split by TP. model.post_norms keeps two more
  // norm inputs (4 sbh), replicated as the others' are; model.shared_norm
  // keeps neither ln_2's input nor a normalised input of the MLP's own
  // (c_fc reads the tensor c_attn keeps): 4 sbh fewer; model.pre_norms:
  // false keeps neither pre-norm's input (the sublayers read the stream,
  // which the residual keeps): 4 sbh fewer. Query/key norms keep q and k
  // as c_attn made them (2(q + kv)/h), split by TP per head; over all the
  // heads (model.qk_norm: full) every rank keeps them gathered, whole.
  // model.clip_qkv's clamp keeps c_attn's output as it was (2w/h more),
  // split by TP with its heads.
  const double qkv_acts = 2.0 * static_cast<double>(m.qkv_width()) / h;
  const double clip_acts = m.clip_qkv > 0 ? qkv_acts : 0.0;
  const double attn_out = 2.0 * static_cast<double>(m.q_width()) / h;
  const double norm_acts =
      (m.post_norms ? 4.0 : 0.0) - (m.shared_norm ? 4.0 : 0.0) - (m.pre_norms ? 0.0 : 4.0);
  const double qk_norm_acts =
      m.qk_norm ? 2.0 * static_cast<double>(m.q_width() + m.kv_heads() * m.head_dim()) / h : 0.0;
  const double qk_split = m.qk_norm_full ? 0.0 : qk_norm_acts;
  // (Gathered, each rank's key/value heads: with fewer heads than ranks,
  // every sharer's copy.)
  const double qk_gathered =
      m.qk_norm_full ? 2.0 *
                           static_cast<double>(m.q_width() + std::max<int64_t>(m.kv_heads(), p.tp) *
                                                                 m.head_dim()) /
                           h
                     : 0.0;
  const double unsplit_dense = 10.0 + norm_acts;
  // A mixture's layer keeps k tokens' expert activations (split), and
  // the dispatched rows and the experts' outputs before the gates, k
  // copies of each token whole on every rank (4k sbh). Layers of both kinds
  // are priced as the larger.
  bool any_moe = false, any_dense = false;
  for (int64_t i = 0; i < m.n_layer; ++i) (m.moe_layer(i) ? any_moe : any_dense) = true;
  const double k_moe = m.routed_per_token();
  // (model.activation relu2 keeps its input alone, as GELU does: ops'
  // relu2.)
  const double moe_acts =
      any_moe ? (k_moe * static_cast<double>(m.expert_fc_width() + m.expert_ffn()) +
                 static_cast<double>(m.shared_fc_width() + m.moe.shared_ffn_hidden_size)) *
                    2.0 / h
              : 0;
  const double mlp_acts = std::max(any_dense ? 2.0 * (fc_w + ffn_w) / h : 0.0, moe_acts);
  // (Padded under context parallelism the outputs kept are the whole
  // micro-batch's, gathered over the context group: cp times a rank's.)
  const bool gathered_moe = p.cp > 1 && m.moe.pad_to_capacity && m.moe.capacity_factor > 0;
  const double unsplit_moe = any_moe ? (2.0 + 2.0 * (gathered_moe ? p.cp : 1)) * k_moe : 0.0;
  // model.mla keeps its latents (q_a_proj's and kv_a_proj's outputs and
  // their normalised copies, whole on every TP rank: they see the gathered
  // sequence) and its up-projections' outputs (split by TP with the heads),
  // beside the fused q, k and v counted above.
  double latent_unsplit = 0, latent_split = 0;
  if (m.latent_attention()) {
    const auto& la = m.mla;
    latent_unsplit =
        2.0 * static_cast<double>(2 * la.q_lora_rank + 2 * la.kv_lora_rank + la.qk_rope_head_dim) /
        h;
    latent_split =
        2.0 * a * static_cast<double>(m.latent_qk_dim() + la.qk_nope_head_dim + la.v_head_dim) / h;
  }
  const double split = attn_out + qkv_acts + mlp_acts + qk_split + clip_acts + latent_split,
               whole = 18.0 + norm_acts + mlp_acts + unsplit_moe + qk_split + clip_acts +
                       latent_split + t * latent_unsplit;
  const double unsplit = unsplit_dense + unsplit_moe + latent_unsplit;
  // The adapters' dropped-out inputs (model.lora.dropout), kept unless the
  // whole layer is recomputed.
  // (The larger of a dense and a mixture-of-experts layer's.)
  const double lora_kept = b * s / p.cp *
                           std::max(any_dense ? lora_dropout_widths(m, t).kept() : 0.0,
                                    any_moe ? lora_dropout_widths(m, t, true).kept() : 0.0) *
                           kFp16;
  // What a layer keeps: everything (None), all but the scores' (Selective),
  // or its input alone (Full).
  const auto per_layer_of = [&](Recompute mode) {
    switch (mode) {
      case Recompute::None:
        return p.sequence_parallel ? sbh * (whole + attn_extra) / t
                                   : sbh * (unsplit + split / t + attn_extra / t);
      case Recompute::Selective:
        return p.sequence_parallel ? sbh * whole / t : sbh * (unsplit + split / t);
      case Recompute::Full:
        break;
    }
    return 2.0 * sbh / (p.sequence_parallel ? t : 1.0);
  };
  // Context parallelism's all-gather keeps each layer's gathered keys and
  // values for backward: for each of the rank's two half-chunks those of
  // the sequence up to its end, (2cp + 1) half-chunks in all, cp - 1/2
  // chunks more than its own (this rank's heads' width).
  const double kv_width =
      static_cast<double>(m.qkv_width_per_rank(p.tp)) - static_cast<double>(m.q_width()) / p.tp;
  const double gathered_kv =
      p.cp > 1 && cp::resolve_exchange(p.cp_exchange, m, p.tp, p.cp) == cp::Exchange::AllGather
          ? sbh * (p.cp - 0.5) * 2.0 * kv_width / h
          : 0.0;
  // A layer that keeps its activations, and one that recomputes them.
  const double kept_layer =
      per_layer_of(recompute == Recompute::Full ? Recompute::None : recompute) + lora_kept +
      sbh * qk_gathered + gathered_kv;
  const double recomputed_layer = per_layer_of(Recompute::Full);
  // Each rank's held chunks, the first recompute_layers of a chunk's layers
  // recomputed (all of them under plain full recomputation).
  double activations = 0;
  for (int r = 0; r < p.pp; ++r) {
    const int64_t chunk = widest[static_cast<size_t>(r)];
    const double w = static_cast<double>(chunk);
    const double again =
        recompute == Recompute::Full
            ? static_cast<double>(pipeline::recomputed_layers(chunk, p.recompute_layers))
            : 0.0;
    activations = std::max(activations, held_chunks[static_cast<size_t>(r)] *
                                            (again * recomputed_layer + (w - again) * kept_layer));
  }
  if (recompute == Recompute::Full) {
    activations += sbh * (whole + attn_extra) / t + lora_kept + sbh * qk_gathered +
                   gathered_kv;  // one rebuilt
  }
  // bf16 logits of one micro-batch; backward writes their gradient over
  // them (linear_head_loss), so there is no second buffer. Each prediction
  // module keeps logits of its own until backward.
  activations += static_cast<double>(1 + m.mtp_layers) * b * s / p.cp * V / t * 2.0;
  e.activation_bytes = activations;
  e.memory_bytes = e.weights_bytes + e.gradient_bytes + e.optimizer_bytes + e.activation_bytes +
                   c.reserved_bytes;
  e.fits = e.memory_bytes <= c.memory_bytes;
  return e;
}

}  // namespace

Estimate estimate(const nn::GptConfig& m, const ClusterSpec& c, int gpus, int global_batch,
                  const ParallelConfig& p) {
  return price(m, c, gpus, global_batch, p, true);
}

Estimate estimate_lower_bound(const nn::GptConfig& m, const ClusterSpec& c, int gpus,
                              int global_batch, const ParallelConfig& p) {
  return price(m, c, gpus, global_batch, p, false);
}

std::string Estimate::json() const {
  nlohmann::json j{{"tp", config.tp},
                   {"pp", config.pp},
                   {"dp", config.dp},
                   {"vpp", config.vpp},
                   {"micro_batch", config.micro_batch},
                   {"recompute", recompute_name(config.recompute)},
                   {"recompute_layers", config.recompute_layers},
                   {"sequence_parallel", config.sequence_parallel},
                   {"zero1", config.zero1},
                   {"ep", config.ep},
                   {"cp", config.cp},
                   {"cp_comm", cp::exchange_name(config.cp_exchange)},
                   {"cp_a2a", config.cp_a2a},
                   {"schedule", pipeline::schedule_name(config.schedule)},
                   {"stage_layers", config.stage_layers},
                   {"overlap_dp", config.overlap_dp},
                   {"overlap_tp", config.overlap_tp},
                   {"scatter_gather", config.scatter_gather},
                   {"overlap_param_gather", config.overlap_param_gather},
                   {"attention", attention_name(config.attention)},
                   {"num_microbatches", num_microbatches},
                   {"step_time_s", step_time},
                   {"tokens_per_s", tokens_per_s},
                   {"tflops_per_gpu", tflops_per_gpu},
                   {"mfu", mfu},
                   {"bubble_fraction", bubble_fraction},
                   {"memory_per_gpu_gb", memory_bytes / 1e9},
                   {"fits", fits},
                   {"breakdown",
                    {{"pipeline_s", pipeline_time},
                     {"compute_per_microbatch_s", compute_time},
                     {"gemm_per_microbatch_s", gemm_time},
                     {"memory_bound_per_microbatch_s", memory_bound_time},
                     {"tp_comm_per_microbatch_s", tp_comm_time},
                     {"tp_comm_hidden_per_microbatch_s", tp_comm_hidden_time},
                     {"ep_comm_per_microbatch_s", ep_comm_time},
                     {"p2p_per_message_s", p2p_time},
                     {"dp_comm_s", dp_comm_time},
                     {"optimizer_s", optimizer_time},
                     {"weights_gb", weights_bytes / 1e9},
                     {"gradients_gb", gradient_bytes / 1e9},
                     {"optimizer_state_gb", optimizer_bytes / 1e9},
                     {"activations_gb", activation_bytes / 1e9},
                     {"peak_inflight_microbatch_chunks", peak_inflight}}}};
  return j.dump();
}

}  // namespace triad::plan
