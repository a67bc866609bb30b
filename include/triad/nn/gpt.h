#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "triad/core/attention_heads.h"
#include "triad/core/rope_scaling.h"
#include "triad/nn/embedding.h"
#include "triad/nn/init.h"
#include "triad/nn/kv_cache.h"
#include "triad/nn/layer_norm.h"
#include "triad/nn/linear.h"
#include "triad/nn/module.h"

namespace triad::nn {

struct MoeStats;          // nn/moe.h
struct LossSums;          // below
class MoeMlp;             // nn/moe.h
class LatentProjections;  // nn/latent_attention.h

// Activation recomputation: `full` keeps only each block's input and reruns
// the block in backward; `selective` (the attention core) is what the
// attention kernel always does — it keeps the log-sum-exp and recomputes the
// probabilities — so it equals `none` here.
enum class Recompute { None, Selective, Full };
Recompute recompute_from_string(
    const std::string& name);  // none | selective | full, else ConfigError
const char* recompute_string(Recompute r);

// How tokens learn where they are: GPT-2's learned position table (wpe,
// added to the token embedding), or rotary embeddings (RoPE, GPT-NeoX's and
// LLaMA's: queries and keys turned by their positions inside each
// attention layer; no parameters, and a query-key product depends only on
// the tokens' distance).
enum class PositionEmbedding { Learned, Rotary };
PositionEmbedding position_embedding_from_string(
    const std::string& name);  // learned | rope, else ConfigError
const char* position_embedding_string(PositionEmbedding p);

// The MLP's activation: GPT-2's GELU (tanh approximation) between c_fc
// (C -> F) and c_proj, or SwiGLU (LLaMA's: c_fc makes C -> 2F, a gate and a
// value half, and silu(gate) * value goes on to c_proj).
// The MLP's: GELU (GPT-2's tanh approximation, fused into the two linear
// layers), the exact GELU through erf (GPT-NeoX's and Pythia's; Hugging
// Face's "gelu"), or a gated linear unit whose c_fc is twice as wide,
// [gate | up] -> act(gate) * up: SwiGLU (LLaMA's, silu) or GeGLU (Gemma's,
// GELU's tanh approximation).
enum class Activation { Gelu, GeluErf, SwiGlu, GeGlu, Relu2 };
// gelu | gelu_erf | swiglu | geglu | relu2, else ConfigError
Activation activation_from_string(const std::string& name);
const char* activation_string(Activation a);
// The activation of c_fc's output where the linear layers do not fuse it
// (every one but gelu): gelu_erf's, or a gated one's from [gate | up].
Tensor unfused_activation(Activation a, const Tensor& x);
// Token embeddings times model.embedding_multiplier (Gemma's sqrt(d_model)),
// the multiplier rounded to x's type when it is bf16 or f16 (as Gemma's
// reference implementations multiply).
Tensor scale_token_embeddings(const GptConfig& cfg, const Tensor& x);

// The blocks' and the final normalisation: GPT-2's LayerNorm (scale and
// shift, weight and bias) or LLaMA's RMSNorm (no mean, a weight only).
enum class Normalization { LayerNorm, RmsNorm };
Normalization normalization_from_string(
    const std::string& name);  // layernorm | rmsnorm, else ConfigError
const char* normalization_string(Normalization n);

struct GptConfig;
// model.qk_norm's value into `c` (qk_norm, qk_norm_full, qk_head_layernorm):
// false or none, true or head (Qwen3's, each head alone), full (OLMo 2's,
// the heads together), head_layernorm (Command R+'s, each head alone with
// weights of its own); ConfigError otherwise. And back: "false", "true",
// "full" or "head_layernorm".
void set_qk_norm(GptConfig& c, const std::string& value);
const char* qk_norm_string(const GptConfig& c);

// The shape of a GPT-2 style model.
struct GptConfig {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  // Key/value heads (config key model.n_kv_head): 0 (or n_head) is
  // multi-head attention; fewer, dividing n_head, is grouped-query
  // attention (LLaMA 2 70B's, LLaMA 3's, Mistral's): each key/value head
  // serves n_head / n_kv_head query heads, c_attn makes (n_head + 2 *
  // n_kv_head) * head_dim outputs and the key/value cache shrinks alike.
  int64_t n_kv_head = 0;
  int64_t d_model = 768;
  // Each head's width D (config key model.head_dim): 0 is d_model / n_head.
  // Set apart from it (Qwen3's, Gemma's, Mistral NeMo's), the heads are
  // n_head * D wide together: c_attn maps d_model to (n_head + 2 *
  // n_kv_head) * D and the attention's c_proj maps n_head * D back.
  int64_t head_size = 0;
  int64_t vocab_size = 50257;
  int64_t seq_len = 1024;
  double dropout = 0.0;
  double layer_norm_eps = 1e-5;  // every norm's eps (config key model.norm_eps)
  Recompute recompute = Recompute::None;
  // With Recompute::Full: only the first recompute_layers blocks of each
  // pipeline stage (of the whole model without a pipeline) recompute, the
  // others keep their activations (Megatron-LM's --recompute-method block
  // --recompute-num-layers); 0: every block. Multi-token prediction's
  // modules recompute under Full whatever it says.
  int64_t recompute_layers = 0;
  // Whether the block at `position` among its stage's layers recomputes.
  bool recomputes(int64_t position) const {
    return recompute == Recompute::Full && (recompute_layers == 0 || position < recompute_layers);
  }
  Normalization normalization = Normalization::LayerNorm;
  bool linear_bias = true;  // biases in the attention's and MLP's linear layers
  // Biases on the attention's q, k and v projections (c_attn) even when
  // linear_bias is off: Qwen2's blocks (config key model.qkv_bias).
  bool qkv_bias = false;
  bool c_attn_bias() const { return linear_bias || qkv_bias; }
  // Biases on the MLP's c_fc and c_proj even when linear_bias is off:
  // GPT-J's blocks, whose attention has none (config key model.mlp_bias).
  bool mlp_bias = false;
  bool mlp_biases() const { return linear_bias || mlp_bias; }
  // RMSNorm over each query head and each key head before rotary
  // embeddings, one weight of head_dim for the queries (attn.q_norm) and one
  // for the keys (attn.k_norm): Qwen3's blocks (config key model.qk_norm).
  bool qk_norm = false;
  // OLMo 2's and OLMoE's query/key norms instead (config key model.qk_norm:
  // full): one RMSNorm over all the queries together (q_width() wide) and
  // one over all the keys (kv_heads() * head_dim()), before the heads are
  // split apart. Needs qk_norm.
  bool qk_norm_full = false;
  // Command R+'s query/key norms instead (config key model.qk_norm:
  // head_layernorm): a LayerNorm without a shift over each head's D
  // features (the mean removed, whatever model.normalization says), each
  // head scaled by a weight of its own: attn.q_norm is n_head * D wide,
  // attn.k_norm kv_heads() * D, head h's weights at [h * D, (h + 1) * D).
  // Needs qk_norm, not qk_norm_full.
  bool qk_head_layernorm = false;
  // OLMo's clip_qkv (config key model.clip_qkv): c_attn's outputs, q, k
  // and v alike, clamped to [-clip_qkv, clip_qkv] before the query/key norms
  // and the rotation. 0: none.
  double clip_qkv = 0.0;
  // The query and key norms' widths.
  int64_t q_norm_width() const {
    return qk_norm_full || qk_head_layernorm ? q_width() : head_dim();
  }
  int64_t k_norm_width() const {
    return qk_norm_full || qk_head_layernorm ? kv_heads() * head_dim() : head_dim();
  }
  Activation activation = Activation::Gelu;
  int64_t ffn_hidden_size = 0;  // the MLP's hidden width F; 0: 4 * d_model
  PositionEmbedding position_embedding = PositionEmbedding::Learned;
  double rope_theta = 10000.0;  // RoPE's base: pair i turns by theta^(-2i/D) a position
  // RoPE's frequencies scaled for a longer context than the model was
  // trained on (config key model.rope_scaling; LLaMA 3.1's "llama3"):
  // core/rope_scaling.h.
  RopeScaling rope_scaling = {};
  // The output head: GPT-2's is the token embedding (tied); untied, it is a
  // (V, C) weight of its own, lm_head.weight (LLaMA's).
  bool tie_embeddings = true;
  // Gemma's two departures (config keys model.embedding_multiplier and
  // model.norm_weight_offset): the token embeddings are multiplied by this
  // (Gemma's sqrt(d_model)) before the first block; and every norm scales
  // by 1 + weight rather than weight, its weights starting at zero (the
  // same function, stored as Hugging Face stores Gemma's).
  double embedding_multiplier = 1.0;
  bool norm_weight_offset = false;
  // The weights' initial scale (config key model.init_std; Megatron-LM's
  // --init-method-std, Hugging Face's initializer_range): a run from
  // scratch draws every weight but the norms' and the biases from
  // normal(0, init_std), the residual projections (c_proj) from
  // normal(0, init_std / sqrt(2 n_layer)), GPT-2's and Megatron-LM's
  // scaled init. Large models start smaller (Nemotron-4's 0.0134; the
  // 0.006 of Megatron-LM's large-model example scripts).
  double init_std = 0.02;
  // Granite's two scalars (config keys model.residual_multiplier and
  // model.logit_scale). Each sublayer's output (after its post-norm, if
  // any) is multiplied by residual_multiplier before it joins the residual
  // stream: x + m * attn(ln_1(x)), then + m * mlp(ln_2(.)). The head's
  // logits are multiplied by logit_scale (Granite's 1 / logits_scaling),
  // through ln_f's output: the same product as scaling the logits, since
  // the head has no bias (model.head_bias is refused with it). 1: none.
  double residual_multiplier = 1.0;
  double logit_scale = 1.0;
  // Whether the blocks' norms and the final one learn a scale (and, as
  // LayerNorms, a shift) (config key model.norm_affine). false: OLMo's
  // non-parametric LayerNorm, (x - mean) / sqrt(var + eps) alone: ln_1,
  // ln_2, the post-norms and ln_f then hold no parameters. The query/key
  // norms keep their weights.
  bool norm_affine = true;
  // Whether the blocks' LayerNorms and the final one learn a shift (config
  // key model.norm_bias). false: a scale alone (Cohere's LayerNorm, which
  // subtracts the mean but adds no bias). Needs layernorm and norm_affine.
  bool norm_bias = true;
  // Whether the blocks' and the final norm carry a weight, and a bias.
  bool norm_weights() const { return norm_affine; }
  bool norm_biases() const {
    return norm_affine && norm_bias && normalization == Normalization::LayerNorm;
  }
  // Gemma 2's and 3's sandwich (config key model.post_norms): each
  // sublayer's output is normalised again before it joins the residual,
  // x + post_attn_norm(attn(ln_1(x))), then + post_mlp_norm(mlp(ln_2(.))).
  // Two more norms per block, of the blocks' kind (h.N.post_attn_norm,
  // h.N.post_mlp_norm).
  bool post_norms = false;
  // Whether each sublayer reads its input normalised (ln_1, ln_2; config key
  // model.pre_norms). false: OLMo 2's blocks, whose sublayers read the
  // residual stream as it is and only their outputs are normalised,
  // x + post_attn_norm(attn(x)), then + post_mlp_norm(mlp(.)); the blocks
  // have no ln_1 or ln_2. Needs model.post_norms and the sequential block.
  bool pre_norms = true;
  // GPT-NeoX's parallel residual (config key model.parallel_residual;
  // Pythia's use_parallel_residual): both sublayers read the block's input,
  // x + attn(ln_1(x)) + mlp(ln_2(x)), instead of the MLP reading the
  // attention's sum. The same parameters; only the wiring differs.
  bool parallel_residual = false;
  // One norm for both sublayers of the parallel residual (config key
  // model.shared_norm; Phi-1's and Phi-2's, GPT-J's, StableLM's parallel
  // blocks): x + attn(ln_1(x)) + mlp(ln_1(x)). The blocks have no ln_2.
  // Needs model.parallel_residual and no model.post_norms.
  bool shared_norm = false;
  // A bias on the output head's logits (config key model.head_bias; Phi-1's
  // and Phi-2's, GPT-J's): lm_head.bias (V), added before the loss and
  // before any soft cap. Needs an untied head (model.tie_embeddings: false).
  bool head_bias = false;
  // Whether tensor parallelism may sum both sublayers' row-parallel shares
  // and reduce them once: the parallel residual with nothing acting on
  // each sublayer's output alone (dropout, post-norms).
  bool reduces_sublayers_at_once() const {
    return parallel_residual && dropout == 0.0 && !post_norms;
  }
  // The RoPE base of the windowed layers (config key model.rope_local_theta;
  // Gemma 3's rope_local_base_freq): they turn by it, unscaled, while the
  // layers exempt from the window (model.full_attention_layers) keep
  // rope_theta and rope_scaling. 0: every layer alike.
  double rope_local_theta = 0.0;
  // Layers whose attention turns nothing (config key model.nope_layers; no
  // position embedding, "NoPE"): their queries and keys are not rotated, so
  // they see order through the causal mask and the other layers alone.
  // SmolLM3's every fourth layer (its no_rope_layers), Cohere 2's global
  // layers (Command R7B, Command A). Increasing indices; rope only.
  std::vector<int64_t> nope_layers = {};
  // Whether layer `layer` rotates its queries and keys: rope, and not one of
  // nope_layers.
  bool rotary_at(int64_t layer) const;
  // Partial rotation (config key model.rope_dim; Phi-4-mini's
  // partial_rotary_factor times head_dim): only each head's first rope_dim
  // dimensions turn, as a rope_dim-wide head would, and the rest pass
  // through. Even, at most head_dim; 0: the whole head.
  int64_t rope_dim = 0;
  // The attention scores' scale 1 / sqrt(query_pre_attn_scalar) instead of
  // 1 / sqrt(head_dim) (config key model.query_pre_attn_scalar; Gemma 2
  // 27B's and Gemma 3 27B's, d_model / n_head against heads of 128). With
  // rope only: the rotation multiplies q and k each by the fourth root of
  // the change (rope_of's amplitude), so every attention kernel and the
  // key/value cache see it. 0: head_dim.
  double query_pre_attn_scalar = 0.0;
  // Gemma 2's soft-capping (config keys model.attn_logit_softcap and
  // model.final_logit_softcap): the attention's scaled scores, and the
  // head's logits, each pass through cap * tanh(x / cap), so none exceeds
  // the cap in size. 0: none.
  double attn_logit_softcap = 0.0;
  double final_logit_softcap = 0.0;
  // The output logits' z-loss (PaLM's; OLMo 2's; config key
  // model.z_loss_coef): while training, the objective gains z_loss_coef
  // times the mean over the scored tokens of log(sum exp(logits))^2, which
  // keeps the softmax's normaliser near 1 (log 0) and the logits from
  // drifting (a cause of late-training loss spikes). Its gradient joins the
  // head's fused cross-entropy backward; the loss reported stays the cross
  // entropy, the z-loss beside it (train's `z_loss`). Not the router's
  // (moe.z_loss_coef). 0: none; PaLM used 1e-4.
  double z_loss_coef = 0.0;
  // Multi-token prediction (DeepSeek-V3's; config keys model.mtp_layers
  // and model.mtp_loss_weight): mtp_layers modules after the blocks
  // (MtpModule), the k-th predicting from each position the token k + 1
  // ahead of the next. While training, the objective is the next-token loss
  // plus mtp_loss_weight / mtp_layers times the sum of theirs (Megatron-LM's
  // --mtp-num-layers and --mtp-loss-scaling-factor); the loss the model
  // reports stays the next token's, and evaluation, the logits and decoding
  // use none of them. 0: none.
  int64_t mtp_layers = 0;
  double mtp_loss_weight = 0.1;
  // Whether the head's end of the model reads the token embedding too (a
  // tied head, or the prediction modules' lookups): a pipeline's last stage
  // then holds a copy of wte, its gradient summed with the first stage's.
  bool head_reads_token_embedding() const { return tie_embeddings || mtp_layers > 0; }
  // Low-rank adapters (config key model.lora; Hu et al., 2021, "LoRA"):
  // each targeted linear layer y = W x + b gains A (rank x in) and B (out x
  // rank) and computes W x + b + (alpha / rank) B A x. B starts at zero, so
  // the model starts as it was; the adapters alone train, every other
  // parameter frozen. They are parameters named after their layer
  // (h.N.attn.c_attn.lora_a, .lora_b) and split over tensor-parallel ranks
  // with it. rank 0: none.
  struct Lora {
    int64_t rank = 0;
    double alpha = 0;  // 0: rank (a scale of 1)
    // Among attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, and model.mla's
    // layers (latent_lora_layers). In a mixture-of-experts block mlp.c_fc
    // and mlp.c_proj name every expert's layer of that name and the shared
    // expert's (lora_modules), as PEFT's target_modules match every module
    // of a name.
    std::vector<std::string> targets = {};
    // The probability of zeroing each element of the adapters' input while
    // training (PEFT's lora_dropout); the layer's own path sees x whole.
    double dropout = 0;
    bool operator==(const Lora&) const = default;
  };
  Lora lora = {};
  // A mixture of experts in place of the MLP (config key model.moe;
  // Shazeer et al., 2017; Switch Transformer; Mixtral): a router (E, C)
  // scores each token's fit with E experts, each an MLP of the model's
  // activation, and the token goes to the top_k best, whose outputs are
  // summed weighted by their softmax probabilities (renormalised over the
  // k chosen when normalize_top_k, as Mixtral's and Qwen3-MoE's are).
  // Every expert has the MLP's shape at width ffn_hidden_size and no
  // biases. Dropless unless capacity_factor caps the experts' batches. A
  // token costs the work of k experts while the model holds E of them.
  struct Moe {
    int64_t experts = 0;  // 0: no mixture, dense MLPs everywhere
    int64_t top_k = 2;
    int64_t ffn_hidden_size = 0;  // each expert's hidden width; 0: the model's ffn()
    bool normalize_top_k = true;
    // The load-balancing loss's weight (Switch Transformer's alpha): each
    // MoE layer adds aux_loss_coef * E * sum_e f_e P_e to the objective,
    // f_e the share of the layer's token-to-expert assignments going to
    // expert e and P_e the mean router probability of e (1 when perfectly
    // balanced), as Megatron-LM's switch load balancing does.
    double aux_loss_coef = 0.01;
    // The router z-loss's weight (ST-MoE, Zoph et al., 2022; OLMoE's 0.001):
    // each MoE layer adds z_loss_coef * mean over its tokens of
    // logsumexp(router logits)^2 to the objective, keeping the logits small
    // (and their softmax accurate in low precision). 0: none.
    double z_loss_coef = 0;
    // Layers that keep a dense MLP (Qwen3-MoE's mlp_only_layers, the
    // layers between its decoder_sparse_step), increasing.
    std::vector<int64_t> dense_layers = {};
    // A shared expert every token takes besides its routed ones (Qwen2-MoE's,
    // DeepSeekMoE's): an MLP of the model's activation and this hidden width
    // (0: none), its output added to the routed experts' sum; with
    // shared_gate, times sigmoid(x . w) of a (1, C) weight of its own
    // (Qwen2-MoE's shared_expert_gate).
    int64_t shared_ffn_hidden_size = 0;
    bool shared_gate = false;
    // Each expert's capacity while training, as a multiple of a balanced
    // share (GShard's and Switch Transformer's capacity factor): of a
    // micro-batch's N tokens, an expert takes at most
    // ceil(capacity_factor * N * top_k / E) assignments and the rest are
    // dropped (the token's output lacks that expert's part; the residual
    // carries the token on). 0: dropless. Evaluation and generation are
    // always dropless, as Hugging Face's inference is.
    double capacity_factor = 0;
    // Which of an over-full expert's assignments it keeps: those of the
    // highest router probability (Probs, Megatron-LM's default) or the
    // earliest tokens' (Position, GShard's).
    enum class DropPolicy { Probs, Position };
    DropPolicy drop_policy = DropPolicy::Probs;
    // Each expert's batch padded to its capacity, every slot filled (the
    // empty ones by padding that weighs nothing): its shapes then never
    // change, and the tokens go to their slots on the device
    // (Backend::capacity_slots) without the host reading their choices.
    // What lets a mixture run inside a CUDA graph (train.cuda_graph), as
    // Megatron-LM's moe_pad_expert_input_to_capacity does. Needs a
    // capacity_factor.
    bool pad_to_capacity = false;
    // How the router scores a token's fit with each expert: a softmax over
    // the experts (Mixtral's, Qwen's), or each expert's own sigmoid
    // (DeepSeek-V3's, GLM-4.5's), whose k chosen scores are the gates,
    // renormalised over the k when normalize_top_k. The load-balancing loss
    // then reads each token's scores over their sum as its probabilities.
    enum class Score { Softmax, Sigmoid };
    Score score = Score::Softmax;
    // The routed experts' gates times this (DeepSeek's routed_scaling_factor).
    double routed_scaling_factor = 1.0;
    // Group-limited routing (DeepSeek-V3's n_group and topk_group): the
    // experts fall into `groups` equal, contiguous groups, each scored for a
    // token by group_score (below); the token chooses its top_k among the
    // experts of its top_groups best groups. 1 and 1: no limit.
    int64_t groups = 1;
    int64_t top_groups = 1;
    // How a group is scored for a token: the sum of its two best choosing
    // scores (TopTwoSum, DeepSeek-V3's noaux_tc), or its best one (Max,
    // DeepSeek-V2's group_limited_greedy). (Config key
    // model.moe.group_score: top2_sum | max.)
    enum class GroupScore { TopTwoSum, Max };
    GroupScore group_score = GroupScore::TopTwoSum;
    // Auxiliary-loss-free load balancing (Wang et al., 2024; DeepSeek-V3):
    // each layer holds a bias per expert (h.N.mlp.expert_bias, f32 under any
    // precision, zeros at first, kept in checkpoints and exports, never
    // given a gradient) that is added to the scores when choosing the
    // experts, not to the gates. After each applied step every bias moves
    // by bias_update_rate towards balance: up for an expert that received
    // fewer than the mean of the step's assignments (every micro-batch of
    // every rank counted), down for more. A rate of 0 keeps the biases as
    // they are (fine-tuning a model whose biases came with it).
    bool expert_bias = false;
    double bias_update_rate = 1e-3;
    // What the load-balancing loss balances: each micro-batch's tokens
    // together (MicroBatch: Switch Transformer's, Megatron-LM's aux_loss),
    // or each sequence's (Sequence: DeepSeek-V3's complementary
    // sequence-wise loss, Megatron-LM's seq_aux_loss), the loss then the
    // mean over the micro-batch's sequences of E sum_e f_e P_e, f and P
    // counted over that sequence's tokens alone.
    enum class BalanceScope { MicroBatch, Sequence };
    BalanceScope aux_loss_scope = BalanceScope::MicroBatch;
    bool operator==(const Moe&) const = default;
  };
  Moe moe = {};
  // Multi-head latent attention (config key model.mla; DeepSeek-V2's and
  // -V3's, Kimi K2's) in place of c_attn: the keys and values come from a
  // shared latent c = kv_a_norm(x W_kv_a) of kv_lora_rank features, each
  // head's key [k_rope | k_nope] and value from kv_b_proj(c), where k_rope
  // (qk_rope_head_dim wide, x W_kv_a's last features) is one key for every
  // head; the queries from q_b_proj(q_a_norm(x W_q_a)) through a latent of
  // q_lora_rank features (0: attn.q_proj straight from x). Only the
  // qk_rope_head_dim dimensions of each query and key turn (rope, at the
  // frequencies of a head that wide); the scores are q . k over
  // qk_nope_head_dim + qk_rope_head_dim dimensions, scaled by 1 /
  // sqrt(that), and the heads' v_head_dim-wide outputs go on to c_proj
  // (n_head * v_head_dim -> d_model). Under yarn rope scaling with
  // mscale_all_dim > 0 the scores are multiplied by (0.1 mscale_all_dim
  // ln(factor) + 1)^2 as DeepSeek's are. The norms are RMSNorms; with
  // model.linear_bias the layers that read x (q_a_proj or q_proj,
  // kv_a_proj) and c_proj have biases. kv_lora_rank 0: none.
  struct Mla {
    int64_t kv_lora_rank = 0;
    int64_t q_lora_rank = 0;
    int64_t qk_nope_head_dim = 0;
    int64_t qk_rope_head_dim = 0;
    int64_t v_head_dim = 0;
    double mscale_all_dim = 0;
    bool operator==(const Mla&) const = default;
  };
  Mla mla = {};
  bool latent_attention() const { return mla.kv_lora_rank > 0; }
  // A query's and key's width under model.mla (qk_nope_head_dim +
  // qk_rope_head_dim), and the multiplier on the queries that turns the
  // fused attention's 1 / sqrt(head_dim()) into the scale model.mla says
  // (1 where the two agree).
  int64_t latent_qk_dim() const { return mla.qk_nope_head_dim + mla.qk_rope_head_dim; }
  double latent_query_factor() const;
  // Whether layer `layer`'s MLP is a mixture of experts.
  bool moe_layer(int64_t layer) const;
  // Each expert's hidden width F, and its c_fc's output width (F, or 2F gated).
  int64_t expert_ffn() const { return moe.ffn_hidden_size > 0 ? moe.ffn_hidden_size : ffn(); }
  int64_t expert_fc_width() const { return gated_mlp() ? 2 * expert_ffn() : expert_ffn(); }
  // The expert assignments a token's work comes to while training: top_k,
  // or at most capacity_factor * top_k under a capacity factor below 1, and
  // exactly that padded to the capacity (every slot runs, empty or not);
  // what the planner prices (the FLOPs and MFU count top_k).
  double routed_per_token() const {
    const double k = static_cast<double>(moe.top_k);
    if (moe.capacity_factor > 0 && moe.pad_to_capacity) return k * moe.capacity_factor;
    return moe.capacity_factor > 0 && moe.capacity_factor < 1 ? k * moe.capacity_factor : k;
  }
  // The shared expert's c_fc output width (0 without one).
  int64_t shared_fc_width() const {
    return gated_mlp() ? 2 * moe.shared_ffn_hidden_size : moe.shared_ffn_hidden_size;
  }
  // The Hugging Face class an export writes (config key model.hf_type: its
  // model_type, e.g. "phi3"), when that class holds the model; empty (auto),
  // or a class that cannot hold it, leaves the export to the first class
  // that can (io/hf_export.h). Reading a config.json sets it to the file's
  // own type: a Phi-3 goes back out as Phi3ForCausalLM, with PEFT adapters
  // named after its fused modules, not as the LLaMA its blocks equal.
  std::string hf_type = {};
  // The layers LoRA can adapt, by their names inside a block.
  static const std::vector<std::string>& lora_layers();
  // And those of model.mla's latent attention (attn.q_a_proj,
  // attn.q_b_proj, attn.q_proj, attn.kv_a_proj, attn.kv_b_proj): a target
  // only where the model has the layer.
  static const std::vector<std::string>& latent_lora_layers();
  // Whether this model has latent attention's layer `layer` (one of them):
  // q_proj without a query latent, q_a_proj and q_b_proj with one.
  bool latent_layer_present(const std::string& layer) const;
  // The layers model.lora adapts when its targets are left out: every one
  // this model has, the attention's alone in a mixture of experts (adapters
  // on its experts are asked for by naming mlp.c_fc, mlp.c_proj), attn.c_proj
  // alone under model.mla (no c_attn).
  std::vector<std::string> default_lora_targets() const;
  // Whether the block layer `layer` ("attn.c_attn", ...) has adapters.
  bool lora_on(const std::string& layer) const;
  // The layers of block `block` that carry adapters, by their parameters'
  // names inside the block: the targets, a mixture-of-experts block's
  // mlp.c_fc and mlp.c_proj standing for each expert's and the shared
  // expert's (mlp.experts.<e>.c_fc, ..., mlp.shared.c_fc, ...). Empty
  // without adapters.
  std::vector<std::string> lora_modules(int64_t block) const;
  double lora_scale() const { return (lora.alpha > 0 ? lora.alpha : lora.rank) / lora.rank; }
  // How the adapters of block `layer`'s `name` layer drop their input out:
  // lora.dropout, from a stream of their own (the same on every rank and
  // layout), by feature in the layers tensor parallelism splits by input
  // features (attn.c_proj, mlp.c_proj, and the experts' c_proj). `name` is
  // the layer's name inside the block (lora_modules'), so each expert draws
  // its own masks.
  LoraDropout lora_dropout(int64_t layer, const std::string& name) const;
  // This model without adapters: the shape of the weights LoRA adapts, and of
  // a model file with the adapters merged in (W + scale B A).
  GptConfig without_lora() const {
    GptConfig c = *this;
    c.lora = {};
    return c;
  }
  bool rotary() const { return position_embedding == PositionEmbedding::Rotary; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Each head's width in the fused attention: model.head_dim, d_model /
  // n_head, or under model.mla the wider of a query's and a value's (the
  // narrower zero-padded to it).
  int64_t head_dim() const {
    if (latent_attention()) return std::max(latent_qk_dim(), mla.v_head_dim);
    return head_size > 0 ? head_size : d_model / n_head;
  }
  // The dimensions of each head rotary embeddings turn: rope_dim, or the
  // whole head.
  int64_t rotary_width() const { return rope_dim > 0 ? rope_dim : head_dim(); }
  AttentionHeads heads() const {
    return AttentionHeads{n_head, kv_heads()}.with_softcap(attn_logit_softcap);
  }
  // The query heads' width n_head * D (the attention's output, c_proj's
  // input): d_model unless model.head_dim sets D apart.
  int64_t q_width() const { return n_head * head_dim(); }
  // The attention's output as c_proj reads it: q_width(), or under
  // model.mla n_head * v_head_dim.
  int64_t attn_out_width() const {
    return latent_attention() ? n_head * mla.v_head_dim : q_width();
  }
  // The weights of one block's attention projections (c_attn and c_proj,
  // or model.mla's five or six), biases and norms aside: each is one
  // multiply-add per token.
  int64_t attention_weights() const;
  // Whether model.head_dim sets the heads' width apart from d_model / n_head.
  bool heads_apart() const { return q_width() != d_model; }
  // c_attn's output width: q plus k's and v's key/value heads.
  int64_t qkv_width() const { return q_width() + 2 * kv_heads() * head_dim(); }
  // Whether `tp` tensor-parallel ranks can hold the key/value heads: whole
  // heads each (n_kv_head divisible by tp), or, with fewer heads than
  // ranks, each head shared by tp / n_kv_head ranks (tp divisible by
  // n_kv_head), a rank holding the head its query heads use.
  bool kv_heads_fit(int64_t tp) const { return kv_heads() % tp == 0 || tp % kv_heads() == 0; }
  // kv_heads_fit's rule in words, for errors (`tp_key`: how the caller names tp).
  std::string kv_heads_rule(int64_t tp, const std::string& tp_key) const {
    return "must be divisible by " + tp_key + " (" + std::to_string(tp) +
           "), or divide it: each rank holds whole key/value heads, or shares one";
  }
  // One tensor-parallel rank's key/value heads (1 where they are shared).
  int64_t kv_heads_per_rank(int64_t tp) const { return kv_heads() >= tp ? kv_heads() / tp : 1; }
  // c_attn's output width on one of `tp` ranks.
  int64_t qkv_width_per_rank(int64_t tp) const {
    return q_width() / tp + 2 * kv_heads_per_rank(tp) * head_dim();
  }
  bool rms_norm() const { return normalization == Normalization::RmsNorm; }
  // The MLP's hidden width F, and c_fc's output width (F, or 2F for SwiGLU).
  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * d_model; }
  bool gated_mlp() const {
    return activation == Activation::SwiGlu || activation == Activation::GeGlu;
  }
  // Whether the MLP's linear layers fuse its activation (GPT-2's GELU).
  bool fused_gelu() const { return activation == Activation::Gelu; }
  int64_t fc_width() const { return gated_mlp() ? 2 * ffn() : ffn(); }
  // Packed documents (nn/documents.h): the token that ends a document (-1:
  // none), and whether each document of a row gets its own attention window
  // and its own positions (Megatron-LM's reset_attention_mask and
  // reset_position_ids). Either needs an eod_token in [0, vocab_size).
  int64_t eod_token = -1;
  bool reset_attention_mask = false;
  bool reset_position_ids = false;
  // Whether either reset is on (a forward pass then needs its documents).
  bool resets_documents() const { return reset_attention_mask || reset_position_ids; }
  // Sliding-window attention (config key model.sliding_window; Mistral's):
  // each query sees at most this many keys, itself and the ones just before
  // it (within its document); 0: every earlier key. Attention then costs
  // O(T * window) instead of O(T^2): the kernels skip the tiles before it.
  int64_t sliding_window = 0;
  // Layers exempt from the window (config key model.full_attention_layers):
  // they see every earlier key of their document, the others the window
  // alone. Interleaved local and global attention (Gemma's, GPT-OSS's) or
  // Qwen's first max_window_layers. Empty: every layer windowed.
  std::vector<int64_t> full_attention_layers = {};
  // The window layer `layer` attends through (0: none).
  int64_t window_of(int64_t layer) const;
  // The RoPE base and scaling layer `layer` turns its queries and keys by
  // (the scaling's amplitude carrying model.query_pre_attn_scalar).
  struct Rope {
    double theta;
    RopeScaling scaling;
  };
  Rope rope_of(int64_t layer) const;
  // Whether a forward pass needs nn::with_documents (its documents, or the
  // window's first keys).
  bool needs_attention_starts() const { return resets_documents() || sliding_window > 0; }

  // Throws ConfigError naming the field when a value is impossible.
  void validate() const;
  // validate()'s checks of model.mla.
  void validate_latent_attention() const;
  // 12*l*h^2*(1 + 13/(12h) + (V+s)/(12*l*h)) of the PTD-P paper (tied head;
  // no s*h position table under rotary embeddings; V*h more for an untied
  // head), for any MLP width.
  int64_t num_parameters() const;
  // The same in floating point (for checks before the model is built: a
  // count validate() rejects does not overflow it).
  double parameter_count() const;
  // Block `layer`'s parameters (its linear layers, biases and two norms,
  // four with post_norms; a mixture's router and every expert).
  int64_t block_parameters(int64_t layer) const;
  // The parameters one token's forward pass uses: a mixture's top_k experts
  // of each MoE layer rather than all of them (parameter_count() without
  // model.moe).
  double active_parameter_count() const;
  // The experts' weights of every MoE layer (0 without model.moe): what
  // expert parallelism shares out among its ranks.
  double expert_parameter_count() const;
  // Model FLOPs of training on `sequences` sequences of seq_len tokens: the
  // PTD-P paper's count (every matrix product, attention over all s^2
  // scores, the head; backward twice forward, plus a forward again of the
  // `recomputed` share of the blocks, 1 under full recomputation),
  // 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) for GPT-2's MLP and generalised
  // to any F and SwiGLU; a windowed layer's queries count min(window, s)
  // keys instead of s; a mixture-of-experts layer's tokens each its router
  // and top_k experts.
  double training_flops(double sequences, double recomputed = 0.0) const;
};

// The full (unsharded) shape of each parameter of GPT's parts, by GPT-2's
// names: the token embedding (wte) when `token_embedding`, the position
// table when `embeds` (learned positions only), blocks `layers`, and ln_f
// (and an untied head's lm_head) when `head`; biases and widths as `cfg`
// says. The single list
// every layout (tensor-parallel shards, pipeline stages) builds its names
// from.
std::map<std::string, Shape> gpt_parameter_shapes(const GptConfig& cfg,
                                                  const std::vector<int64_t>& layers,
                                                  bool token_embedding, bool embeds, bool head);
// Every parameter of the whole model (all blocks, both ends).
std::map<std::string, Shape> gpt_parameter_shapes(const GptConfig& cfg);
// The norms of each block, by name: ln_1, ln_2 unless model.shared_norm
// (neither without model.pre_norms), post_attn_norm and post_mlp_norm with
// model.post_norms.
std::vector<const char*> block_norms(const GptConfig& cfg);
// A norm of the residual stream as `cfg` has them (ln_1, ln_2, the
// post-norms, ln_f): d_model wide, LayerNorm or RMSNorm, with or without
// Gemma's unit offset, learned or (model.norm_affine: false) not.
std::shared_ptr<LayerNorm> stream_norm(const GptConfig& cfg);
// A sublayer's output as it joins the residual stream: times
// model.residual_multiplier (Granite's), or as it is.
Tensor to_residual(const GptConfig& cfg, const Tensor& y);
// ln_f's output as the head reads it: times model.logit_scale, or as it is.
Tensor scale_for_head(const GptConfig& cfg, const Tensor& y);
// Whether a parameter is one of the blocks' hidden matrices (Muon's, under
// train.optimizer: muon): a 2-d weight of a block but a mixture's router and
// shared-expert gate and LoRA's adapters. Embeddings, the head, norms and
// biases are not.
bool is_hidden_matrix(const std::string& name, const Shape& shape);
// The rows of parameter `name` (`rows` in its full shape) cut into the
// matrices they fuse: c_attn's q, k and v (of their widths under
// grouped-query attention), a gated MLP's (or expert's) gate and value
// halves; one block otherwise. Throws a ShapeError when `rows` is not what
// `cfg` makes of the parameter.
std::vector<int64_t> fused_row_blocks(const GptConfig& cfg, const std::string& name, int64_t rows);
// Whether `name` is a LoRA adapter (ends in .lora_a or .lora_b), and the
// weight it adapts ("h.3.attn.c_attn.weight" for "h.3.attn.c_attn.lora_a").
bool is_lora_adapter(const std::string& name);
std::string lora_adapted_weight(const std::string& adapter);
// How a parameter of this model starts: GPT-2's rule (gpt2_init_rule), and
// for LoRA adapters A ~ N(0, 1/in) and B = 0.
InitRule gpt_init_rule(const std::string& name, const Shape& full_shape, const GptConfig& cfg);
// W + scale * B @ A in f32 on the host (W's dtype kept): a weight with its
// adapters merged in. Shapes are checked.
Tensor merge_lora(const Tensor& weight, const Tensor& lora_a, const Tensor& lora_b, double scale);

// What one forward pass needs besides its input. Randomness: dropout masks
// are a pure function of (seed, site, call) so that recomputation and other
// layouts reproduce them. The mode is per call, not a module flag: training
// = false (evaluation) turns dropout off. Packed documents
// (nn::with_documents fills them in): doc_starts (B, T) i32 on the
// attention's device, where each token's document starts (or its sliding
// window, if later: the first key it sees), and positions
// (B, T) i64, each token's position in its document; undefined: one
// document per row, positions 0..T-1.
struct ForwardContext {
  bool training = true;
  uint64_t seed = 0;
  uint64_t call = 0;  // distinct per (step, microbatch)
  Tensor doc_starts = {};
  Tensor positions = {};
  // When doc_starts holds a sliding window's first keys and some layers are
  // exempt from it (model.full_attention_layers): their first keys, the
  // documents' starts alone (an undefined tensor: 0). Unset otherwise.
  std::optional<Tensor> full_starts = {};
  // When doc_starts is a sliding window's first keys alone (no document
  // boundaries in them): that window; 0 otherwise.
  int64_t starts_window = 0;
  // The first keys the attention of a layer with (`windowed`) or without
  // the window reads.
  const Tensor& attention_starts(bool windowed) const {
    return !windowed && full_starts ? *full_starts : doc_starts;
  }
  // The heads of a layer whose window is `window` (0: none), with the
  // promise that its first keys are that window alone where they are
  // (AttentionHeads::with_window; cuDNN's fused attention then masks by the
  // window instead of reading them).
  AttentionHeads attention_heads(const AttentionHeads& heads, int64_t window) const {
    return heads.with_window(window > 0 && window == starts_window ? window : 0);
  }
  // Under context parallelism (set by TensorParallelGpt): the pieces of the
  // micro-batch's sequences this rank holds.
  std::shared_ptr<const SequencePieces> pieces = {};
  // Where layers inside the blocks draw dropout masks (LoRA's adapters):
  // the whole micro-batch's, of which a context-parallel rank's rows are
  // its pieces (a mixture's experts key their rows by assignment besides).
  DropoutDraw draw() const { return {training, seed, call, pieces, {}, calls}; }
  // The call's offset in device memory (DropoutDraw::calls): a captured
  // step's (train.cuda_graph), whose replays write theirs there. Undefined:
  // `call` alone.
  Tensor calls = {};
  // The gradient the training objective gives this micro-batch's loss (the
  // value its backward starts from: the loss scale and the micro-batch's
  // weight): a loss computed inside the model (model.moe's load balancing)
  // takes its own weight times this. 1: backward from the loss alone.
  double loss_grad = 1.0;
  // That gradient as a one-element device tensor (the loss's dtype), where
  // it changes between a CUDA graph's replays (train.loss_average tokens
  // inside a capture; loss_grad is then 0): multi-token prediction's losses
  // weigh their gradient by it. Undefined: loss_grad.
  Tensor loss_grad_seed = {};
  // Where mixture-of-experts layers report their routing while training
  // (null: nowhere).
  std::shared_ptr<MoeStats> moe_stats = {};
  // Where multi-token prediction reports its losses while training (null:
  // nowhere).
  std::shared_ptr<LossSums> mtp_stats = {};
  // Where the output logits' z-loss (model.z_loss_coef) is reported while
  // training (null: nowhere).
  std::shared_ptr<LossSums> z_loss_stats = {};
};

// Multi-head causal self-attention: c_attn (C -> 3C), fused attention, c_proj;
// grouped-query attention (cfg.n_kv_head < n_head): c_attn (C -> C + 2 *
// n_kv_head * head_dim), each key/value head shared by a group of query
// heads.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GptConfig& cfg, int64_t layer);
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const;
  // Inference on x (B, n, d_model) in cache slots [start, start + n): stores
  // this step's keys and values into k_cache and v_cache (B, Hkv, capacity,
  // D) and attends over slots [0, start + n), causally. Tokens sit at
  // positions start + t, or ctx.positions (B, n) when given. From an empty
  // cache (start 0) the prompt attends over itself with the fused attention,
  // as forward() does (no (n, n) scores in memory), taking ctx's first keys
  // (with_left_padding's or with_one_document's). Later tokens attend over
  // the cache in place (cached_attention), row b's text from slot
  // text_starts[b] ((B) i32; undefined: 0), its left padding unseen. No
  // dropout; forward only.
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t start,
                        const ForwardContext& ctx = {false, 0, 0},
                        const Tensor& text_starts = {}) const;

 private:
  // c_attn, then its clamp (model.clip_qkv), the query/key norms (model.qk_norm) and the rotary
  // embedding from `start` or at `positions`.
  Tensor project(const Tensor& x, const Tensor& positions, int64_t start,
                 const DropoutDraw& draw) const;

  // The attention's output as c_proj reads it (under model.mla each head's
  // value width alone).
  Tensor heads_out(const Tensor& y) const;

  std::shared_ptr<Linear> c_attn_, c_proj_;                   // (no c_attn under model.mla)
  std::shared_ptr<LatentProjections> latent_;                 // model.mla
  std::shared_ptr<LayerNorm> q_norm_, k_norm_;                // model.qk_norm: true or full
  std::shared_ptr<HeadLayerNorm> q_head_norm_, k_head_norm_;  // model.qk_norm: head_layernorm
  double clip_qkv_ = 0.0;                                     // model.clip_qkv (0: none)
  bool qk_norm_full_ = false;                                 // model.qk_norm: full
  AttentionHeads heads_;
  int64_t head_dim_;
  int64_t layer_;
  int64_t window_;  // this layer's window (window_of): forward_cached masks by it
  double dropout_;
  bool rotary_;
  GptConfig::Rope rope_;  // this layer's (rope_of)
};

// Position-wise MLP: c_fc (C -> F), GELU (tanh), c_proj (F -> C); or gated
// (SwiGLU, GeGLU) c_fc (C -> 2F), the gated activation, c_proj (F -> C). F
// is 4C by default.
class Mlp : public Module {
 public:
  Mlp(const GptConfig& cfg, int64_t layer);
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const;

 private:
  std::shared_ptr<Linear> c_fc_, c_proj_;
  int64_t layer_;
  double dropout_;
  Activation activation_;
};

// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x))
// (the mlp a mixture of experts on model.moe's layers);
// with model.post_norms each sublayer's output is normalised again
// (post_attn_norm, post_mlp_norm) before the residual add; with
// model.parallel_residual both read x: x + attn(ln_1(x)) + mlp(ln_2(x)),
// and with model.shared_norm ln_1's output: x + attn(ln_1(x)) + mlp(ln_1(x));
// without model.pre_norms the sublayers read the residual stream itself:
// h = x + post_attn_norm(attn(x)), then h + post_mlp_norm(mlp(h)). Each
// sublayer's output joins the stream times model.residual_multiplier.
class Block : public Module {
 public:
  Block(const GptConfig& cfg, int64_t layer);
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const;
  // The residual stream between blocks as its sum so far (`base`) and the
  // last sublayer's output not yet added to it (`pending`; undefined when
  // there is none). The next block's ln_1 adds it in its fused add + norm,
  // as ln_2 adds the attention's: no separate add runs, forward or backward
  // (the add's backward sum is the norm kernel's too). The same values as
  // forward(base + pending).
  struct Stream {
    Tensor base, pending;
  };
  // Whether forward_stream applies: pre-norms with an ln_2, the sublayers in
  // turn (not model.parallel_residual).
  bool defers_residual() const;
  Stream forward_stream(const Stream& in, const ForwardContext& ctx) const;
  // Inference with a key/value cache (CausalSelfAttention::forward_cached).
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t start,
                        const ForwardContext& ctx = {false, 0, 0},
                        const Tensor& text_starts = {}) const;

 private:
  // No ln_2 under model.shared_norm, neither without model.pre_norms.
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<LayerNorm> post_attn_norm_, post_mlp_norm_;  // model.post_norms only
  bool parallel_residual_ = false;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Mlp> mlp_;     // a dense layer's
  std::shared_ptr<MoeMlp> moe_;  // a mixture-of-experts layer's (model.moe)
  int64_t layer_;
  double dropout_;
  double residual_multiplier_;
  // The MLP sublayer's output (before any post-norm).
  Tensor mlp_forward(const Tensor& x, const ForwardContext& ctx) const;
  // A sublayer's output y as it joins the residual stream: normalised again
  // by `norm` (a post-norm; null: none), then times the residual multiplier.
  Tensor joining(const std::shared_ptr<LayerNorm>& norm, const Tensor& y) const;
};

// Losses reported beside the objective while training
// (ForwardContext::mtp_stats: each multi-token-prediction depth's loss,
// model.mtp_layers of them; z_loss_stats: the output z-loss), each summed
// over the micro-batches recorded, as f64 scalars on the loss's device, so
// that nothing waits for them until the step reads them.
struct LossSums {
  std::vector<Tensor> sums;
  int64_t records = 0;
  // The sums as a caller read them with other values in one copy (a
  // trainer, with the step's loss and gradient norm), one per sum; empty
  // until then. A record after it is an error.
  std::vector<double> read;
  // One micro-batch's losses, one per depth.
  void record(const std::vector<Tensor>& losses);
  // The sums on the host (zeros before any record): `read` where it holds
  // them, else read now, one copy for all.
  std::vector<double> host_sums(int64_t depths) const;
};

// The layer whose router a parameter named `name` biases: N for
// h.N.mlp.expert_bias, n_layer + K for multi-token prediction module K's
// (mtp.K.block.mlp.expert_bias); -1 for any other name.
int64_t expert_bias_layer(const GptConfig& cfg, const std::string& name);

// Multi-token prediction's inputs at depth k (1-based): the ids k positions
// ahead, ids[b][i + k] (0 past the row's end, where nothing is predicted),
// and the targets, targets[b][i + k] (the token k + 1 ahead of position i's
// next) where i + k < T and, when `doc_starts` (B, T) is defined (packed
// documents: document_layout's starts), positions i and i + k lie in one
// document; -100 (ignored) elsewhere. Both i64 (B, T), on the host; made
// on the device instead from ids or targets there (and doc_starts, when
// defined, there too), where a CUDA graph's capture cannot read them. ids
// and targets may be i32 or i64.
Tensor mtp_ahead(const Tensor& ids, int64_t k);
Tensor mtp_targets(const Tensor& targets, const Tensor& doc_starts, int64_t k);

// The next-token loss carrying the prediction modules' losses `depths`
// (one per module) into backward: its value unchanged, their sum joining
// its gradient with weight cfg.mtp_loss_weight / depths * ctx.loss_grad
// (attach_loss); ctx.mtp_stats records them.
Tensor with_mtp_losses(const GptConfig& cfg, const Tensor& loss, const std::vector<Tensor>& depths,
                       const ForwardContext& ctx);
// The gradient each of `depths` modules' losses gets from with_mtp_losses:
// cfg.mtp_loss_weight / depths times the micro-batch's loss gradient, the
// product formed in `dtype` (the losses' statistics dtype) as a replay
// forms it from ForwardContext::loss_grad_seed on the device, so that the
// gradient a module's head writes ahead is the one that arrives.
double mtp_loss_grad(const GptConfig& cfg, int64_t depths, double loss_grad, DType dtype);
// A loss computed beside the model's (multi-token prediction's, a
// mixture's balance and router z-losses) joined to x's graph with
// gradient weight * the micro-batch's loss gradient (attach_loss): formed
// in `loss`'s dtype from ctx.loss_grad (side_loss_grad), or on the device
// from ctx.loss_grad_seed where a CUDA graph's replays refill it; the same
// bits either way.
Tensor attach_side_loss(const Tensor& x, const Tensor& loss, double weight,
                        const ForwardContext& ctx);
// weight * loss_grad as a replay forms it from the seed: in f64 for f64,
// else the product of the two as f32.
double side_loss_grad(double weight, double loss_grad, DType dtype);

// Multi-token prediction module k (DeepSeek-V3's MTP module; k from 1 to
// model.mtp_layers): from the previous depth's hidden states h (B, T, C;
// the blocks' output for k = 1) and the token embeddings e (B, T, C) of the
// ids k positions ahead (mtp_ahead), h' = block(eh_proj([ln_embed(e) |
// ln_hidden(h)])), the block one of the model's kind (as layer n_layer + k
// - 1 would be: a mixture's, windowed, ... as that layer's settings say).
// ln_out(h') is what the model's own head reads. Parameters: ln_embed,
// ln_hidden and ln_out (the model's norms), eh_proj.weight (C, 2C) and
// block.* (a block's names).
class MtpModule : public Module {
 public:
  MtpModule(const GptConfig& cfg, int64_t depth);
  // h' of hidden and the embeddings `ahead`, both (B, T, C).
  Tensor forward(const Tensor& hidden, const Tensor& ahead, const ForwardContext& ctx) const;
  // ln_out over h'.
  Tensor out_norm(const Tensor& h) const;

 private:
  std::shared_ptr<LayerNorm> ln_embed_, ln_hidden_, ln_out_;
  std::shared_ptr<Linear> eh_proj_;
  std::shared_ptr<Block> block_;
  bool recompute_ = false;  // model.recompute: full (the block rerun in backward)
};

// GPT-2: token + learned position embeddings (or rotary embeddings in each
// attention layer), n_layer blocks, final LayerNorm, output head tied to
// the token embedding (or its own lm_head.weight). Parameter names are
// GPT-2's (wte.weight, h.0.attn.c_attn.weight, ...), linear weights stored
// (out, in). The pieces (embed, block, head) are public so pipeline stages
// can run a sub-range.
class Gpt : public Module {
 public:
  // Random: parameters initialised by gpt2_init_rule, layout-independently.
  // None: parameters as their layers make them (zeros; norms' weights
  // ones), for a caller that loads all of them next (triad-generate,
  // triad-eval): no random draws, and no second copy of the model held
  // while initialising (a 7B model's 28 GB in f32).
  enum class Init { Random, None };
  Gpt(const GptConfig& cfg, uint64_t seed, DType dtype = DType::F32, Init init = Init::Random);
  const GptConfig& config() const { return cfg_; }

  // ids (B, T) at positions [start, start + T) -> hidden (B, T, C).
  Tensor embed(const Tensor& ids, const ForwardContext& ctx, int64_t start = 0) const;
  const Block& block(int64_t i) const { return *blocks_.at(i); }
  // hidden (B, T, C) -> logits (B, T, V).
  Tensor head(const Tensor& hidden) const;
  Tensor forward(const Tensor& ids, const ForwardContext& ctx = {}) const;
  // Mean cross entropy of the next-token predictions (the head and the loss
  // fused: linear_cross_entropy). With model.mtp_layers, while training
  // (ctx.training), the multi-token-prediction modules' losses join its
  // gradient (attach_loss: mtp_loss_weight / mtp_layers * ctx.loss_grad
  // each), its value staying the next token's; ctx.mtp_stats gets them.
  // With model.z_loss_coef, while training, the z-loss joins its gradient
  // in the head's op (linear_cross_entropy's z_loss_coef), and
  // ctx.z_loss_stats gets it.
  Tensor loss(const Tensor& ids, const Tensor& targets, const ForwardContext& ctx = {}) const;
  // Multi-token prediction's loss at each depth for hidden, the blocks'
  // output (trunk) on ids under ctx (its documents already filled in).
  std::vector<Tensor> mtp_losses(const Tensor& hidden, const Tensor& ids, const Tensor& targets,
                                 const ForwardContext& ctx) const;
  // Inference on the next tokens: ids (B, n) continue the cache's B
  // sequences at positions [cache.length, cache.length + n); returns their
  // logits (B, n, V), the same as forward() on the whole sequences gives at
  // those positions (up to rounding), and advances cache.length by n. In a
  // left-padded cache (KvCache::row_start) row b's positions count from its
  // start slot, and its logits are those of its text alone. No
  // dropout, no autograd graph. last_only: only the last position's logits
  // (B, 1, V), the one a sampler needs. Errors name a batch that differs
  // from the cache's and positions beyond model.seq_len.
  Tensor decode(const Tensor& ids, KvCache& cache, bool last_only = false) const;
  // decode() without the head: the hidden states (B, n, C) that head()
  // turns into those logits, for a caller that needs only some positions'.
  Tensor decode_hidden(const Tensor& ids, KvCache& cache) const;
  // The output head's (V, C) weight: wte's, or lm_head's when untied.
  const Tensor& head_weight() const;
  // Its bias (V) under model.head_bias; undefined otherwise.
  Tensor head_bias() const;

 private:
  GptConfig cfg_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<Linear> lm_head_;  // untied head only (its weight and bias)
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::vector<std::shared_ptr<MtpModule>> mtp_;  // model.mtp_layers

  // embed and every block: ids (B, T) -> hidden (B, T, C) before ln_f, as
  // a stream whose last add may still be pending (Block::Stream).
  Block::Stream trunk_stream(const Tensor& ids, const ForwardContext& ctx) const;
  // ln_f of a trunk's stream, a pending add fused into it: {hidden, normed}.
  AddNorm final_norm(const Block::Stream& s) const;
  // The logits of ln_f's output (head() after its ln_f).
  Tensor logits_of(const Tensor& normed) const;
};

}  // namespace triad::nn
