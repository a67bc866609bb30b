// Exports to Hugging Face's layouts read back (config.json through
// model.hf_config's reader, weights through init.from's) to the same model,
// and a model no Hugging Face class holds is named.
#include "triad/io/hf_export.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>

#include "support/temp_dir.h"
#include "support/tiny_deepseek.h"
#include "triad/core/allocator.h"
#include "triad/core/error.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_config.h"
#include "triad/io/safetensors.h"
#include "triad/ops.h"

namespace triad::io {
namespace {

nn::GptConfig llama(bool tied, int64_t kv) {
  nn::GptConfig c{
      .n_layer = 2, .n_head = 4, .n_kv_head = kv, .d_model = 16, .vocab_size = 19, .seq_len = 12};
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = 5000.0;
  c.activation = nn::Activation::SwiGlu;
  c.ffn_hidden_size = 24;
  c.normalization = nn::Normalization::RmsNorm;
  c.layer_norm_eps = 1e-6;
  c.linear_bias = false;
  c.tie_embeddings = tied;
  return c;
}

// Cohere's blocks over llama(true, 2)'s: LLaMA's sublayers in parallel on
// one LayerNorm without a bias, the logits times `logit_scale`.
nn::GptConfig cohere_blocks(double logit_scale) {
  nn::GptConfig c = llama(true, 2);
  c.normalization = nn::Normalization::LayerNorm;
  c.layer_norm_eps = 1e-5;
  c.norm_bias = false;
  c.parallel_residual = c.shared_norm = true;
  c.logit_scale = logit_scale;
  return c;
}

nn::GptConfig gpt2(bool tied) {
  nn::GptConfig c{.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 6};
  c.ffn_hidden_size = 20;
  c.tie_embeddings = tied;
  return c;
}

// Gemma's blocks on llama(true, 1): GeGLU, an embedding multiplier of
// sqrt(16), norms scaling by 1 + weight. `version` 2 adds post-norms and a
// window on layer 0 (layer 1 global); 3 also head norms and the windowed
// layer's own RoPE base.
nn::GptConfig gemma(int version) {
  nn::GptConfig c = llama(true, 1);
  c.activation = nn::Activation::GeGlu;
  c.embedding_multiplier = 4.0;
  c.norm_weight_offset = true;
  if (version >= 2) {
    c.post_norms = true;
    c.sliding_window = 3;
    c.full_attention_layers = {1};
  }
  if (version >= 3) {
    c.qk_norm = true;
    c.rope_local_theta = 7.0;
  }
  return c;
}

// No Hugging Face class holds `c`, and the error names `why`.
void expect_no_class(const nn::GptConfig& c, const std::string& why) {
  try {
    hf_model_type(c);
    ADD_FAILURE() << "exported as " << hf_model_type(c) << " (expected: " << why << ")";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

void expect_same_model(const nn::GptConfig& a, const nn::GptConfig& b) {
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.kv_heads(), b.kv_heads());
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.ffn(), b.ffn());
  EXPECT_EQ(a.position_embedding, b.position_embedding);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.normalization, b.normalization);
  EXPECT_EQ(a.linear_bias, b.linear_bias);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_DOUBLE_EQ(a.embedding_multiplier, b.embedding_multiplier);
  EXPECT_DOUBLE_EQ(a.residual_multiplier, b.residual_multiplier);
  EXPECT_DOUBLE_EQ(a.logit_scale, b.logit_scale);
  EXPECT_EQ(a.norm_weight_offset, b.norm_weight_offset);
  EXPECT_EQ(a.post_norms, b.post_norms);
  EXPECT_EQ(a.pre_norms, b.pre_norms);
  EXPECT_EQ(a.norm_affine, b.norm_affine);
  EXPECT_EQ(a.clip_qkv, b.clip_qkv);
  EXPECT_DOUBLE_EQ(a.layer_norm_eps, b.layer_norm_eps);
  EXPECT_EQ(a.qk_norm_full, b.qk_norm_full);
  EXPECT_EQ(a.parallel_residual, b.parallel_residual);
  EXPECT_EQ(a.shared_norm, b.shared_norm);
  EXPECT_EQ(a.head_bias, b.head_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.rope_local_theta, b.rope_local_theta);
  EXPECT_EQ(a.query_pre_attn_scalar, b.query_pre_attn_scalar);
  EXPECT_EQ(a.head_dim(), b.head_dim());
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(rope_factors(a.rope_scaling, false), rope_factors(b.rope_scaling, false));
  EXPECT_EQ(rope_factors(a.rope_scaling, true), rope_factors(b.rope_scaling, true));
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.full_attention_layers, b.full_attention_layers);
  EXPECT_EQ(a.nope_layers, b.nope_layers);
  EXPECT_EQ(a.rope_scaling.kind, b.rope_scaling.kind);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.rope_scaling.attention_factor, b.rope_scaling.attention_factor);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_seq_len, b.rope_scaling.original_seq_len);
  EXPECT_DOUBLE_EQ(a.layer_norm_eps, b.layer_norm_eps);
  if (a.rotary()) {
    EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  }
  EXPECT_EQ(a.moe, b.moe);
  EXPECT_EQ(a.init_std, b.init_std);
  EXPECT_EQ(a.num_parameters(), b.num_parameters());
}

// Every parameter's name and shape: what init.from's reader checks a file
// against.
std::map<std::string, Shape> shapes_of(const nn::Gpt& model) {
  std::map<std::string, Shape> out;
  for (const auto& [name, p] : model.named_parameters()) out[name] = p.shape();
  return out;
}

// init.from's reader gives `model` back from `dir`, bit for bit.
void expect_reads_back(const std::string& dir, const nn::Gpt& model) {
  const auto expected = shapes_of(model);
  const nn::StateDict back =
      load_gpt2_state_dict(dir, expected, nullptr, weight_layout(model.config()));
  ASSERT_EQ(back.size(), expected.size());
  for (const auto& [name, t] : model.state_dict())
    EXPECT_EQ(to_double_vector(back.at(name)), to_double_vector(t)) << name;
}

// What save_hf_model wrote for a model: its tensors by Hugging Face's names,
// its config.json, and the model's own weights to compare them with.
struct Exported {
  std::map<std::string, Tensor> tensors;
  nlohmann::json config;
  nn::StateDict weights;
};

// `c` (weights of seed 3) through save_hf_model and back: written as class
// `type`, read back as the same model with hf_type `type`, and its weights
// bit for bit through init.from's reader, from the directory and from its
// model.safetensors alone. What was written, for the caller's own checks.
Exported expect_round_trip(const nn::GptConfig& c, const std::string& type) {
  EXPECT_EQ(std::string(hf_model_type(c)), type);
  const nn::Gpt model(c, 3);
  testing::TempDir dir;
  save_hf_model(model.state_dict(), c, dir.file("hf"));
  const nn::GptConfig back = load_hf_config(dir.file("hf"));
  EXPECT_EQ(back.hf_type, type);
  expect_same_model(c, back);
  expect_reads_back(dir.file("hf"), model);
  // model.safetensors alone (no config.json beside it): the model's own
  // class says what the file's names leave open.
  std::filesystem::create_directory(dir.file("alone"));
  std::filesystem::copy_file(dir.file("hf/model.safetensors"), dir.file("alone/model.safetensors"));
  expect_reads_back(dir.file("alone/model.safetensors"), model);
  std::ifstream config(dir.file("hf/config.json"));
  return {load_safetensors(dir.file("hf/model.safetensors")).tensors, nlohmann::json::parse(config),
          model.state_dict()};
}

// Each configuration through save_hf_model, then back: the config, and the
// weights bit for bit through init.from's reader (directory form).
TEST(HfExport, LlamaAndGpt2RoundTrip) {
  testing::TempDir dir;
  int n = 0;
  nn::GptConfig mistral = llama(false, 2);
  mistral.sliding_window = 5;                             // MistralForCausalLM
  mistral.rope_scaling.kind = RopeScaling::Kind::Llama3;  // and LLaMA 3.1's RoPE scaling
  mistral.rope_scaling.factor = 4.0;
  mistral.rope_scaling.original_seq_len = 64.0;
  nn::GptConfig qwen2 = llama(true, 2);  // Qwen2ForCausalLM: q, k and v biases
  qwen2.qkv_bias = true;
  qwen2.rope_scaling.kind = RopeScaling::Kind::Yarn;  // with Qwen2.5's long context
  qwen2.rope_scaling.factor = 4.0;
  qwen2.rope_scaling.original_seq_len = 3.0;
  qwen2.rope_scaling.beta_fast = 8.0;
  qwen2.rope_scaling.attention_factor = 1.5;
  nn::GptConfig qwen3 = llama(true, 2);  // Qwen3ForCausalLM: head norms, heads of 6
  qwen3.qk_norm = true;
  qwen3.head_size = 6;
  nn::GptConfig wide = llama(false, 2);  // LlamaForCausalLM with heads of its own width
  wide.head_size = 8;
  nn::GptConfig qwen_window = qwen3;  // Qwen's window from layer 1 on
  qwen_window.sliding_window = 4;
  qwen_window.full_attention_layers = {0};
  nn::GptConfig stretched = llama(false, 0);  // a linear RoPE stretch
  stretched.rope_scaling.kind = RopeScaling::Kind::Linear;
  stretched.rope_scaling.factor = 2.0;
  nn::GptConfig gemma1 = gemma(1);  // GemmaForCausalLM, with heads of 8
  gemma1.head_size = 8;
  nn::GptConfig gemma2 = gemma(2);  // Gemma2ForCausalLM
  gemma2.head_size = 8;
  nn::GptConfig gemma3 = gemma(3);  // Gemma3ForCausalLM, its global layer's RoPE scaled
  gemma3.head_size = 8;
  gemma3.rope_scaling.kind = RopeScaling::Kind::Linear;
  gemma3.rope_scaling.factor = 2.0;
  gemma3.query_pre_attn_scalar = 10.0;   // scores over sqrt(10), not sqrt(8)
  nn::GptConfig phi4 = llama(false, 2);  // Phi3ForCausalLM: half of each head of 4 turned,
  phi4.rope_dim = 2;                     // with longrope over a window on every layer
  phi4.sliding_window = 5;
  phi4.rope_scaling.kind = RopeScaling::Kind::LongRope;
  phi4.rope_scaling.original_seq_len = 3.0;
  phi4.rope_scaling.factor = 4.0;  // (max_position_embeddings 12 over 3)
  ASSERT_EQ(set_rope_factors(phi4.rope_scaling, {1.0}, {3.5}), "");
  nn::GptConfig phi3 = llama(true, 0);  // a Phi-3 turning whole heads, by model.hf_type
  phi3.hf_type = "phi3";
  nn::GptConfig pythia = gpt2(false);  // GPTNeoXForCausalLM: parallel, exact GELU, half turned
  pythia.position_embedding = nn::PositionEmbedding::Rotary;
  pythia.rope_dim = 2;
  pythia.parallel_residual = true;
  pythia.activation = nn::Activation::GeluErf;
  nn::GptConfig neox = gpt2(true);  // sequential, tanh GELU, whole heads, a linear stretch
  neox.position_embedding = nn::PositionEmbedding::Rotary;
  neox.rope_theta = 300.0;
  neox.rope_scaling.kind = RopeScaling::Kind::Linear;
  neox.rope_scaling.factor = 2.0;
  nn::GptConfig exact_gpt2 = gpt2(true);  // GPT2LMHeadModel with activation_function gelu
  exact_gpt2.activation = nn::Activation::GeluErf;
  nn::GptConfig stablelm = llama(false, 2);  // StableLmForCausalLM: LayerNorms, q, k and v
  stablelm.normalization = nn::Normalization::LayerNorm;  // biases, half of each head turned
  stablelm.qkv_bias = true;
  stablelm.rope_dim = 2;
  stablelm.layer_norm_eps = 1e-5;
  // PhiForCausalLM: one norm for the parallel sublayers, a biased head,
  // half of each head turned, grouped key/value heads.
  nn::GptConfig phi2 = pythia;
  phi2.shared_norm = true;
  phi2.head_bias = true;
  phi2.n_kv_head = 1;
  phi2.activation = nn::Activation::Gelu;
  // FalconForCausalLM: Falcon 7B's multi-query attention, one norm, no
  // linear biases, a tied head; and the new decoder architecture's two
  // norms over grouped key/value heads, with biases and an untied head.
  nn::GptConfig falcon7 = llama(true, 1);
  falcon7.normalization = nn::Normalization::LayerNorm;
  falcon7.activation = nn::Activation::GeluErf;
  falcon7.ffn_hidden_size = 0;
  falcon7.layer_norm_eps = 1e-5;
  falcon7.parallel_residual = true;
  falcon7.shared_norm = true;
  nn::GptConfig falcon40 = falcon7;
  falcon40.n_kv_head = 2;
  falcon40.shared_norm = false;
  falcon40.linear_bias = true;
  falcon40.tie_embeddings = false;
  // GPTJForCausalLM: one norm, biases on the MLP alone, a biased head, half
  // of each head turned in GPT-J's interleaved pairs; and whole heads.
  nn::GptConfig gptj = phi2;
  gptj.n_kv_head = 0;
  gptj.linear_bias = false;
  gptj.mlp_bias = true;
  nn::GptConfig gptj_whole = gptj;
  gptj_whole.rope_dim = 0;
  gptj_whole.activation = nn::Activation::GeluErf;
  // CodeGenForCausalLM (by model.hf_type): GPT-J's blocks, q, k and v fused
  // in 4 shards of whole heads.
  nn::GptConfig codegen = llama(false, 0);
  codegen.normalization = nn::Normalization::LayerNorm;
  codegen.activation = nn::Activation::Gelu;
  codegen.ffn_hidden_size = 0;
  codegen.layer_norm_eps = 1e-5;
  codegen.rope_theta = 10000.0;
  codegen.rope_dim = 2;
  codegen.parallel_residual = codegen.shared_norm = codegen.head_bias = true;
  codegen.mlp_bias = true;
  codegen.hf_type = "codegen";
  nn::GptConfig stablelm_parallel = stablelm;  // StableLM 2 12B's shared-norm parallel blocks
  stablelm_parallel.parallel_residual = true;
  stablelm_parallel.shared_norm = true;
  nn::GptConfig stablelm_12b = stablelm_parallel;  // and its LayerNorm on each q and k head
  nn::set_qk_norm(stablelm_12b, "head_layernorm");
  nn::GptConfig glm = llama(false, 2);  // GlmForCausalLM: q, k and v biases, half of each
  glm.qkv_bias = true;                  // head turned in interleaved pairs
  glm.rope_dim = 2;
  nn::GptConfig glm4 = glm;  // Glm4ForCausalLM: and its four norms
  glm4.post_norms = true;
  nn::GptConfig helium = llama(false, 2);  // HeliumForCausalLM: whole heads turned in
  helium.qkv_bias = true;                  // interleaved pairs, q, k and v biases
  helium.hf_type = "helium";
  // NemotronForCausalLM: LayerNorm1P (LayerNorms scaling by 1 + weight),
  // squared ReLU, half of each head turned, grouped heads, no biases; with
  // biases everywhere and heads apart; with the MLP's alone and exact GELU.
  nn::GptConfig nemotron = llama(false, 2);
  nemotron.normalization = nn::Normalization::LayerNorm;
  nemotron.norm_weight_offset = true;
  nemotron.layer_norm_eps = 1e-5;
  nemotron.activation = nn::Activation::Relu2;
  nemotron.rope_dim = 2;
  nemotron.init_std = 0.0134;  // (initializer_range, Nemotron-4's)
  nn::GptConfig nemotron_biased = nemotron;
  nemotron_biased.linear_bias = true;
  nemotron_biased.head_size = 8;
  nemotron_biased.rope_dim = 4;
  nn::GptConfig nemotron_gelu = nemotron;
  nemotron_gelu.mlp_bias = true;
  nemotron_gelu.activation = nn::Activation::GeluErf;
  nemotron_gelu.tie_embeddings = true;
  // ArceeForCausalLM: LLaMA's blocks with that ungated MLP (F 24); and
  // with the exact GELU and heads of their own width.
  nn::GptConfig arcee = llama(false, 2);
  arcee.activation = nn::Activation::Relu2;
  nn::GptConfig arcee_gelu = arcee;
  arcee_gelu.activation = nn::Activation::GeluErf;
  arcee_gelu.head_size = 8;
  for (const nn::GptConfig& c : {llama(false, 2),
                                 llama(true, 0),
                                 llama(false, 1),
                                 mistral,
                                 qwen2,
                                 qwen3,
                                 qwen_window,
                                 wide,
                                 stretched,
                                 gemma1,
                                 gemma2,
                                 gemma3,
                                 phi4,
                                 phi3,
                                 stablelm,
                                 stablelm_parallel,
                                 stablelm_12b,
                                 glm,
                                 glm4,
                                 helium,
                                 nemotron,
                                 nemotron_biased,
                                 nemotron_gelu,
                                 arcee,
                                 arcee_gelu,
                                 phi2,
                                 falcon7,
                                 falcon40,
                                 gptj,
                                 gptj_whole,
                                 codegen,
                                 pythia,
                                 neox,
                                 gpt2(true),
                                 gpt2(false),
                                 exact_gpt2}) {
    SCOPED_TRACE(std::string(hf_model_type(c)) + " " + std::to_string(n));
    const nn::Gpt model(c, 7);
    const std::string out = dir.file("hf" + std::to_string(n++));
    save_hf_model(model.state_dict(), c, out);
    expect_same_model(load_hf_config(out), c);
    expect_reads_back(out, model);
    // triad-export's way, from Triad's file one block at a time: the same
    // tensors and config.json.
    const std::string triad_file = dir.file("triad" + std::to_string(n) + ".safetensors");
    save_gpt2_safetensors(model, triad_file);
    bool told = false;
    export_hf_model(triad_file, c, out + "_streamed", {.before_writing = [&] { told = true; }});
    EXPECT_TRUE(told);
    const Safetensors whole = load_safetensors(out + "/model.safetensors"),
                      streamed = load_safetensors(out + "_streamed/model.safetensors");
    ASSERT_EQ(streamed.tensors.size(), whole.tensors.size());
    for (const auto& [name, t] : whole.tensors) {
      ASSERT_TRUE(streamed.tensors.count(name)) << name;
      EXPECT_EQ(streamed.tensors.at(name).dtype(), t.dtype()) << name;
      EXPECT_EQ(streamed.tensors.at(name).shape(), t.shape()) << name;
      EXPECT_EQ(to_double_vector(streamed.tensors.at(name)), to_double_vector(t)) << name;
    }
    auto text = [](const std::string& path) {
      std::ifstream in(path);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(text(out + "_streamed/config.json"), text(out + "/config.json"));
  }
}

// triad-export holds one block of the model at a time (host allocator's
// peak under half the model's bytes for 8 blocks), and a file that does not
// fit the model writes nothing: neither the directory nor the tokenizer
// (its callback) is touched.
// Mixtures of experts: Mixtral's class (Mistral's blocks, renormalised,
// experts on every layer; block_sparse_moe's gate and w1, w3, w2) and
// Qwen3-MoE's (query/key norms, dense layers allowed, any renormalisation;
// mlp.gate and gate_proj, up_proj, down_proj), each round trip the config
// and the weights bit for bit; what keeps a mixture from each is named, and
// no dense class holds one.
TEST(HfExport, MixturesOfExpertsRoundTripAsMixtralAndQwen3Moe) {
  // (Mixtral's intermediate_size is its experts' width: a model with no
  // dense layer reads back with that as its ffn_hidden_size.)
  nn::GptConfig mixtral = llama(false, 2);
  mixtral.ffn_hidden_size = 10;
  mixtral.moe.experts = 4;
  mixtral.moe.top_k = 2;
  mixtral.moe.aux_loss_coef = 0.02;
  mixtral.sliding_window = 5;
  nn::GptConfig qwen = llama(true, 2);
  qwen.qk_norm = true;
  qwen.head_size = 6;
  qwen.moe = {.experts = 3,
              .top_k = 2,
              .ffn_hidden_size = 8,
              .normalize_top_k = false,
              .aux_loss_coef = 0.001,
              .dense_layers = {0}};
  // Qwen2-MoE: Qwen2's biased q, k and v, and a gated shared expert.
  nn::GptConfig qwen2 = llama(false, 2);
  qwen2.qkv_bias = true;
  qwen2.moe = {.experts = 3,
               .top_k = 2,
               .ffn_hidden_size = 8,
               .normalize_top_k = false,
               .aux_loss_coef = 0.001,
               .dense_layers = {0},
               .shared_ffn_hidden_size = 6,
               .shared_gate = true};
  // OLMoE: LLaMA's blocks with norms over all the queries and keys, and
  // experts on every layer (intermediate_size their width).
  nn::GptConfig olmoe = llama(false, 2);
  nn::set_qk_norm(olmoe, "full");
  olmoe.ffn_hidden_size = 8;
  olmoe.moe = {.experts = 3, .top_k = 2, .normalize_top_k = false, .aux_loss_coef = 0.01};
  // GLM-4.5: q, k and v biases, Qwen3's query/key norms on wider heads,
  // half of each head turned, a dense first layer, then DeepSeek-V3's router
  // (sigmoid scores, expert biases, groups, scaled gates) and an ungated
  // shared expert two experts wide.
  nn::GptConfig glm45 = llama(false, 2);
  glm45.qkv_bias = true;
  glm45.qk_norm = true;
  glm45.head_size = 8;
  glm45.rope_dim = 4;
  glm45.moe = testing::tiny_deepseek_mixture();
  // dots.llm1: the same mixture on Qwen3's blocks, not renormalised, and a
  // window from its second layer on.
  nn::GptConfig dots = glm45;
  dots.qkv_bias = false;
  dots.rope_dim = 0;
  dots.moe.normalize_top_k = false;
  dots.moe.groups = dots.moe.top_groups = 1;
  dots.sliding_window = 5;
  dots.full_attention_layers = {0};
  // DeepSeek-V3: GLM-4.5's mixture under multi-head latent attention on
  // LLaMA's blocks.
  nn::GptConfig v3 = llama(false, 0);
  v3.moe = glm45.moe;
  v3.mla = testing::tiny_latent_attention();
  // DeepSeek-V2: softmax routing, groups scored by their best expert, the
  // gates scaled, not renormalised, no biases; queries straight from x.
  nn::GptConfig v2 = v3;
  v2.mla.q_lora_rank = 0;
  v2.moe.score = nn::GptConfig::Moe::Score::Softmax;
  v2.moe.expert_bias = false;
  v2.moe.normalize_top_k = false;
  v2.moe.group_score = nn::GptConfig::Moe::GroupScore::Max;
  v2.moe.aux_loss_coef = 0.001;
  // MiniMax-M2: OLMoE's norms over all the queries and keys on wider
  // heads, half of each turned, and experts on every layer chosen by
  // biased sigmoid scores, renormalised, unscaled, no shared expert.
  nn::GptConfig m2 = olmoe;
  m2.head_size = 8;
  m2.rope_dim = 4;
  m2.moe = testing::tiny_deepseek_mixture();
  m2.moe.dense_layers.clear();
  m2.moe.groups = m2.moe.top_groups = 1;
  m2.moe.routed_scaling_factor = 1.0;
  m2.moe.shared_ffn_hidden_size = 0;
  m2.moe.normalize_top_k = true;
  m2.ffn_hidden_size = m2.moe.ffn_hidden_size;  // (intermediate_size: the experts')
  m2.moe.ffn_hidden_size = 0;
  for (const auto& [c, type, gate, names] :
       {std::tuple{
            m2, "minimax_m2", "model.layers.1.block_sparse_moe.experts.2.w1.weight",
            std::vector<std::string>{"model.layers.1.self_attn.q_norm.weight",
                                     "model.layers.1.self_attn.k_norm.weight",
                                     "model.layers.0.block_sparse_moe.gate.weight",
                                     "model.layers.0.block_sparse_moe.e_score_correction_bias",
                                     "model.layers.1.block_sparse_moe.experts.3.w3.weight",
                                     "model.layers.1.block_sparse_moe.experts.3.w2.weight"}},
        std::tuple{v2, "deepseek_v2", "model.layers.1.mlp.experts.2.gate_proj.weight",
                   std::vector<std::string>{"model.layers.1.self_attn.q_proj.weight",
                                            "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                                            "model.layers.1.mlp.gate.weight",
                                            "model.layers.1.mlp.shared_experts.up_proj.weight"}},
        std::tuple{v3, "deepseek_v3", "model.layers.1.mlp.experts.2.gate_proj.weight",
                   std::vector<std::string>{"model.layers.1.self_attn.q_a_proj.weight",
                                            "model.layers.1.self_attn.q_a_layernorm.weight",
                                            "model.layers.1.self_attn.q_b_proj.weight",
                                            "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                                            "model.layers.1.self_attn.kv_a_layernorm.weight",
                                            "model.layers.1.self_attn.kv_b_proj.weight",
                                            "model.layers.1.self_attn.o_proj.weight",
                                            "model.layers.1.mlp.gate.e_score_correction_bias"}},
        std::tuple{dots, "dots1", "model.layers.1.mlp.experts.2.gate_proj.weight",
                   std::vector<std::string>{"model.layers.1.self_attn.k_norm.weight",
                                            "model.layers.1.mlp.gate.e_score_correction_bias",
                                            "model.layers.1.mlp.shared_experts.down_proj.weight"}},
        std::tuple{glm45, "glm4_moe", "model.layers.1.mlp.experts.2.gate_proj.weight",
                   std::vector<std::string>{"model.layers.1.self_attn.q_proj.bias",
                                            "model.layers.1.self_attn.q_norm.weight",
                                            "model.layers.0.mlp.gate_proj.weight",
                                            "model.layers.1.mlp.gate.weight",
                                            "model.layers.1.mlp.gate.e_score_correction_bias",
                                            "model.layers.1.mlp.shared_experts.gate_proj.weight",
                                            "model.layers.1.mlp.shared_experts.up_proj.weight",
                                            "model.layers.1.mlp.shared_experts.down_proj.weight"}},
        std::tuple{olmoe, "olmoe", "model.layers.1.mlp.experts.2.gate_proj.weight",
                   std::vector<std::string>{"model.layers.1.input_layernorm.weight",
                                            "model.layers.1.post_attention_layernorm.weight",
                                            "model.layers.1.self_attn.q_norm.weight",
                                            "model.layers.1.self_attn.k_norm.weight",
                                            "model.layers.0.mlp.gate.weight",
                                            "model.layers.1.mlp.experts.2.up_proj.weight",
                                            "model.layers.1.mlp.experts.2.down_proj.weight"}},
        std::tuple{mixtral, "mixtral", "model.layers.1.block_sparse_moe.experts.2.w1.weight",
                   std::vector<std::string>{"model.layers.1.block_sparse_moe.gate.weight",
                                            "model.layers.1.block_sparse_moe.experts.3.w1.weight",
                                            "model.layers.1.block_sparse_moe.experts.3.w3.weight",
                                            "model.layers.1.block_sparse_moe.experts.3.w2.weight"}},
        std::tuple{qwen, "qwen3_moe", "model.layers.1.mlp.experts.2.gate_proj.weight",
                   std::vector<std::string>{"model.layers.0.mlp.gate_proj.weight",
                                            "model.layers.1.mlp.gate.weight",
                                            "model.layers.1.mlp.experts.2.gate_proj.weight",
                                            "model.layers.1.mlp.experts.2.up_proj.weight",
                                            "model.layers.1.mlp.experts.2.down_proj.weight"}},
        std::tuple{qwen2, "qwen2_moe", "model.layers.1.mlp.experts.2.gate_proj.weight",
                   std::vector<std::string>{"model.layers.1.self_attn.q_proj.bias",
                                            "model.layers.1.mlp.gate.weight",
                                            "model.layers.1.mlp.shared_expert.gate_proj.weight",
                                            "model.layers.1.mlp.shared_expert.up_proj.weight",
                                            "model.layers.1.mlp.shared_expert.down_proj.weight",
                                            "model.layers.1.mlp.shared_expert_gate.weight"}}}) {
    SCOPED_TRACE(type);
    const Exported out = expect_round_trip(c, type);
    for (const std::string& name : names) EXPECT_TRUE(out.tensors.count(name)) << name;
    // An expert's c_fc is [gate | up]: its gate half is w1 (gate_proj).
    const Tensor fc = out.weights.at("h.1.mlp.experts.2.c_fc.weight");
    EXPECT_EQ(to_double_vector(out.tensors.at(gate)),
              to_double_vector(narrow(fc, 0, 0, c.expert_ffn())));
  }
  nn::GptConfig raw = mixtral;
  raw.moe.normalize_top_k = false;
  raw.moe.dense_layers = {1};
  try {
    exported_as(raw, "mixtral");
    ADD_FAILURE() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(
        std::string(e.what()).find("model.moe.normalize_top_k is false, model.moe.dense_layers "
                                   "keeps layers dense"),
        std::string::npos)
        << e.what();
  }
  // A mixture saved without expert biases reads into one balanced by them,
  // the biases starting at zero (the file's own choice).
  {
    const nn::Gpt plain(qwen, 3);
    testing::TempDir d;
    save_hf_model(plain.state_dict(), qwen, d.file("hf"));
    nn::GptConfig biased = qwen;
    biased.moe.score = nn::GptConfig::Moe::Score::Sigmoid;
    biased.moe.expert_bias = true;
    nn::Gpt model(biased, 1);
    copy_(model.state_dict().at("h.1.mlp.expert_bias"), full({3}, 0.5));
    load_gpt2_safetensors(model, d.file("hf"));
    EXPECT_EQ(to_double_vector(model.state_dict().at("h.1.mlp.expert_bias")),
              std::vector<double>(3, 0.0));
    EXPECT_EQ(to_double_vector(model.state_dict().at("h.1.mlp.router.weight")),
              to_double_vector(plain.state_dict().at("h.1.mlp.router.weight")));
  }
  // What keeps DeepSeek-V3's router from the softmax classes, and theirs
  // from GLM-4.5's.
  EXPECT_NE(hf_misfit(glm45, "qwen3_moe")
                .find("model.moe.score is sigmoid, model.moe.routed_scaling_factor is not 1, "
                      "model.moe.groups limits each token to groups of experts, "
                      "model.moe.expert_bias is true"),
            std::string::npos);
  EXPECT_NE(hf_misfit(qwen, "glm4_moe")
                .find("model.moe.score is not sigmoid, model.moe.expert_bias is false"),
            std::string::npos);
  // MiniMax-M2's class is the one for its mixture; its router is neither
  // GLM-4.5's (which has a shared expert) nor the softmax classes'.
  EXPECT_EQ(std::string(hf_model_type(m2)), "minimax_m2");
  EXPECT_NE(hf_misfit(m2, "glm4_moe").find("model.qk_norm is full"), std::string::npos);
  EXPECT_NE(hf_misfit(m2, "olmoe").find("model.moe.score is sigmoid"), std::string::npos);
  nn::GptConfig m2_apart = m2;
  m2_apart.moe.routed_scaling_factor = 2.5;
  m2_apart.moe.groups = 2;
  m2_apart.moe.dense_layers = {0};
  m2_apart.moe.shared_ffn_hidden_size = 8;
  m2_apart.qk_norm_full = false;
  EXPECT_NE(hf_misfit(m2_apart, "minimax_m2")
                .find("model.moe.routed_scaling_factor is not 1, model.moe.groups limits each "
                      "token to groups of experts, model.moe.dense_layers keeps layers dense, "
                      "model.moe.shared_ffn_hidden_size is set"),
            std::string::npos)
      << hf_misfit(m2_apart, "minimax_m2");
  EXPECT_NE(hf_misfit(m2_apart, "minimax_m2").find("model.qk_norm is not full"), std::string::npos);
  EXPECT_NE(hf_misfit(glm45, "minimax_m2").find("model.qk_norm is not full"), std::string::npos);
  // Latent attention is DeepSeek-V3's class's alone, and that class's own.
  EXPECT_EQ(hf_misfit(v3, "glm4_moe"),
            "model.mla is set (latent attention, DeepSeek-V2's and -V3's)");
  EXPECT_EQ(hf_misfit(v3, "llama"), "model.mla is set (latent attention, DeepSeek-V2's and -V3's)");
  EXPECT_EQ(std::string(hf_model_type(v3)), "deepseek_v3");
  // A dense model with latent attention goes out under DeepSeek's classes
  // (V2's first, as hf_model_types lists them) with every layer dense, and
  // comes back dense.
  nn::GptConfig v3_attention = v3;
  v3_attention.moe = {};
  EXPECT_EQ(hf_misfit(v3_attention, "deepseek_v3"), "");
  {
    const Exported out = expect_round_trip(v3_attention, "deepseek_v2");
    EXPECT_EQ(out.config.at("first_k_dense_replace"), v3_attention.n_layer);
    EXPECT_TRUE(out.tensors.count("model.layers.1.mlp.gate_proj.weight"));
  }
  EXPECT_EQ(std::string(hf_model_type(v2)), "deepseek_v2");
  nn::GptConfig v2_by_two = v2;
  v2_by_two.moe.group_score = nn::GptConfig::Moe::GroupScore::TopTwoSum;
  EXPECT_NE(hf_misfit(v2_by_two, "deepseek_v2").find("model.moe.group_score is not max"),
            std::string::npos);
  EXPECT_NE(hf_misfit(v2, "deepseek_v3")
                .find("model.moe.score is not sigmoid, model.moe.expert_bias is false"),
            std::string::npos);
  nn::GptConfig no_latent = v3;
  no_latent.mla = {};
  EXPECT_NE(hf_misfit(no_latent, "deepseek_v3")
                .find("model.mla is not set (DeepSeek's attention is latent)"),
            std::string::npos);
  nn::GptConfig late = glm45;
  late.moe.dense_layers = {1};
  late.moe.shared_ffn_hidden_size = 9;
  late.moe.shared_gate = true;
  EXPECT_NE(hf_misfit(late, "glm4_moe")
                .find("model.moe.dense_layers are not the first layers (first_k_dense_replace), "
                      "model.moe.shared_ffn_hidden_size is not a multiple of the experts' width "
                      "(n_shared_experts), model.moe.shared_gate is true"),
            std::string::npos);
  EXPECT_NE(hf_misfit(mixtral, "mistral").find("model.moe is set"), std::string::npos);
  EXPECT_NE(hf_misfit(llama(false, 2), "mixtral").find("model.moe is not set"), std::string::npos);
  EXPECT_NE(hf_misfit(qwen, "qwen2_moe").find("model.moe has no gated shared expert"),
            std::string::npos);
  EXPECT_NE(hf_misfit(qwen2, "qwen3_moe").find("model.moe.shared_ffn_hidden_size is set"),
            std::string::npos);
  nn::GptConfig biased = mixtral;
  biased.qkv_bias = true;
  expect_no_class(biased, "no Hugging Face class holds this mixture of experts");
  // OLMoE's query/key norms span all the heads; Qwen3-MoE's each head.
  EXPECT_NE(hf_misfit(olmoe, "qwen3_moe").find("model.qk_norm is full"), std::string::npos);
  EXPECT_NE(hf_misfit(qwen, "olmoe").find("model.qk_norm is not full"), std::string::npos);
  nn::GptConfig olmoe_dense = olmoe;
  olmoe_dense.moe.dense_layers = {0};
  EXPECT_NE(hf_misfit(olmoe_dense, "olmoe").find("model.moe.dense_layers keeps layers dense"),
            std::string::npos);
}

// OLMo 2: LLaMA's blocks with post-norms in place of pre-norms and norms
// over all the queries and all the keys. Its config and weights go out as
// Olmo2ForCausalLM's (post_attention_layernorm the attention output's
// norm, no input_layernorm) and read back the same model; no other class
// holds either departure.
TEST(HfExport, Olmo2RoundTripsAndNoOtherClassHoldsIt) {
  nn::GptConfig olmo2 = llama(false, 2);
  nn::set_qk_norm(olmo2, "full");
  olmo2.pre_norms = false;
  olmo2.post_norms = true;
  EXPECT_EQ(std::string(hf_architecture(olmo2)), "Olmo2ForCausalLM");
  const Exported out = expect_round_trip(olmo2, "olmo2");
  const auto& tensors = out.tensors;
  EXPECT_EQ(tensors.count("model.layers.0.input_layernorm.weight"), 0u);
  EXPECT_EQ(to_double_vector(tensors.at("model.layers.1.post_attention_layernorm.weight")),
            to_double_vector(out.weights.at("h.1.post_attn_norm.weight")));
  EXPECT_EQ(to_double_vector(tensors.at("model.layers.1.post_feedforward_layernorm.weight")),
            to_double_vector(out.weights.at("h.1.post_mlp_norm.weight")));
  EXPECT_EQ(tensors.at("model.layers.1.self_attn.q_norm.weight").shape(), (Shape{16}));
  EXPECT_EQ(tensors.at("model.layers.1.self_attn.k_norm.weight").shape(), (Shape{8}));
  // Per-head norms, pre-norms, or heads of their own width keep it from
  // Olmo2ForCausalLM; its departures keep it from every other class.
  nn::GptConfig per_head = olmo2;
  nn::set_qk_norm(per_head, "true");
  EXPECT_NE(hf_misfit(per_head, "olmo2").find("model.qk_norm is not full"), std::string::npos);
  nn::GptConfig wide = olmo2;
  wide.head_size = 6;
  EXPECT_NE(hf_misfit(wide, "olmo2").find("model.head_dim is not d_model / n_head"),
            std::string::npos);
  nn::GptConfig sandwich = olmo2;
  sandwich.pre_norms = true;
  EXPECT_NE(hf_misfit(sandwich, "olmo2").find("model.pre_norms is true"), std::string::npos);
  EXPECT_NE(hf_misfit(olmo2, "qwen3").find("model.qk_norm is full"), std::string::npos);
  EXPECT_NE(hf_misfit(olmo2, "gemma2").find("model.pre_norms is false"), std::string::npos);
  EXPECT_NE(hf_misfit(olmo2, "olmoe").find("model.pre_norms is false"), std::string::npos);
  nn::GptConfig learned = olmo2;
  learned.position_embedding = nn::PositionEmbedding::Learned;
  expect_no_class(learned, "Olmo2ForCausalLM LLaMA's with post-norms instead of pre-norms");
}

// EXAONE 4's blocks (OLMo 2's sublayer norms, an RMSNorm on each query and
// key head, the window's global layers without rope) through
// Exaone4ForCausalLM and back: with the window, without one (every layer
// global and turning: sliding_window null), and with layers turning by
// nothing but no window (one as long as the context). Its global layers
// must be the ones without rope.
TEST(HfExport, Exaone4RoundTripsWithItsGlobalLayersWithoutRope) {
  nn::GptConfig c = llama(false, 2);
  nn::set_qk_norm(c, "true");
  c.pre_norms = false;
  c.post_norms = true;
  nn::GptConfig plain = c;
  EXPECT_TRUE(expect_round_trip(plain, "exaone4").config.at("sliding_window").is_null());
  c.sliding_window = 3;
  c.full_attention_layers = c.nope_layers = {1};
  const Exported out = expect_round_trip(c, "exaone4");
  EXPECT_EQ(out.config.at("layer_types"),
            nlohmann::json::array({"sliding_attention", "full_attention"}));
  EXPECT_EQ(out.config.at("sliding_window"), 3);
  EXPECT_EQ(out.tensors.count("model.layers.1.self_attn.q_norm.weight"), 1u);
  nn::GptConfig unwindowed = c;
  unwindowed.sliding_window = 0;
  unwindowed.full_attention_layers.clear();
  EXPECT_EQ(expect_round_trip(unwindowed, "exaone4").config.at("sliding_window"),
            unwindowed.seq_len);
  nn::GptConfig turning = c;
  turning.nope_layers.clear();
  EXPECT_NE(hf_misfit(turning, "exaone4")
                .find("model.full_attention_layers is not "
                      "model.nope_layers"),
            std::string::npos);
  nn::GptConfig full_norms = c;
  nn::set_qk_norm(full_norms, "full");
  EXPECT_NE(hf_misfit(full_norms, "exaone4").find("model.qk_norm is full"), std::string::npos);
  nn::GptConfig no_norms = c;
  nn::set_qk_norm(no_norms, "false");
  EXPECT_NE(hf_misfit(no_norms, "exaone4").find("model.qk_norm is false"), std::string::npos);
}

// OLMo 3's blocks (OLMo 2's with a window on some layers, those turning
// unscaled at rope_theta under a scaled RoPE) through Olmo3ForCausalLM and
// back: layer_types and sliding_window written, the weights bit for bit.
// OLMo 2's class holds no window; a windowed layer scaled, or turning at a
// base of its own, fits neither.
TEST(HfExport, Olmo3WindowsRoundTripAndTheirRopeTurnsUnscaled) {
  nn::GptConfig olmo3 = llama(false, 2);
  nn::set_qk_norm(olmo3, "full");
  olmo3.pre_norms = false;
  olmo3.post_norms = true;
  olmo3.sliding_window = 3;
  olmo3.full_attention_layers = {1};
  EXPECT_NE(hf_misfit(olmo3, "olmo2").find("model.sliding_window is set"), std::string::npos);
  const Exported out = expect_round_trip(olmo3, "olmo3");
  EXPECT_EQ(out.config.at("layer_types"),
            nlohmann::json::array({"sliding_attention", "full_attention"}));
  EXPECT_EQ(out.config.at("sliding_window"), 3);
  EXPECT_EQ(out.tensors.count("model.layers.1.post_feedforward_layernorm.weight"), 1u);
  nn::GptConfig scaled = olmo3;  // yarn on the global layer alone
  scaled.rope_scaling.kind = RopeScaling::Kind::Yarn;
  scaled.rope_scaling.factor = 4.0;
  scaled.rope_scaling.original_seq_len = 3.0;
  EXPECT_NE(hf_misfit(scaled, "olmo3").find("the windowed layers' RoPE is scaled"),
            std::string::npos);
  scaled.rope_local_theta = scaled.rope_theta;
  EXPECT_EQ(expect_round_trip(scaled, "olmo3").config.at("rope_scaling").at("rope_type"), "yarn");
  nn::GptConfig own_base = scaled;
  own_base.rope_local_theta = 7.0;
  EXPECT_NE(hf_misfit(own_base, "olmo3").find("model.rope_local_theta is not rope_theta"),
            std::string::npos);
}

// OLMo: LLaMA's blocks with LayerNorms that learn nothing. Its config and
// weights go out as OlmoForCausalLM's (no norm tensors, no eps key) and
// read back the same model; learned norms, RMSNorm or another eps keep it
// from OlmoForCausalLM, and its weightless norms from every other class.
TEST(HfExport, OlmoRoundTripsAndNoOtherClassHoldsIt) {
  nn::GptConfig olmo = llama(false, 2);
  olmo.normalization = nn::Normalization::LayerNorm;
  olmo.layer_norm_eps = 1e-5;
  olmo.norm_affine = false;
  olmo.clip_qkv = 2.5;
  EXPECT_EQ(std::string(hf_architecture(olmo)), "OlmoForCausalLM");
  const Exported out = expect_round_trip(olmo, "olmo");
  for (const auto& [name, t] : out.tensors) EXPECT_EQ(name.find("norm"), std::string::npos) << name;
  EXPECT_EQ(out.tensors.size(), 2 + 2 * 7u);  // embeddings, head; q, k, v, o, gate, up, down
  const nlohmann::json& j = out.config;
  EXPECT_EQ(j.at("model_type"), "olmo");
  EXPECT_EQ(j.at("clip_qkv"), 2.5);
  EXPECT_FALSE(j.contains("rms_norm_eps"));
  // Only OLMo's classes clamp q, k and v.
  nn::GptConfig clipped_llama = llama(false, 2);
  clipped_llama.clip_qkv = 2.5;
  EXPECT_NE(hf_misfit(clipped_llama, "llama").find("model.clip_qkv is set"), std::string::npos);
  nn::GptConfig learned = olmo;
  learned.clip_qkv = 0.0;
  learned.norm_affine = true;
  EXPECT_NE(hf_misfit(learned, "olmo").find("model.norm_affine is true"), std::string::npos);
  EXPECT_EQ(std::string(hf_model_type(learned)), "stablelm");
  nn::GptConfig eps = olmo;
  eps.layer_norm_eps = 1e-6;
  EXPECT_NE(hf_misfit(eps, "olmo").find("model.norm_eps is not 1e-5"), std::string::npos);
  nn::GptConfig rms = olmo;
  rms.normalization = nn::Normalization::RmsNorm;
  EXPECT_NE(hf_misfit(rms, "olmo").find("model.normalization is not layernorm"), std::string::npos);
  for (const char* other : {"llama", "stablelm", "olmo2", "gpt_neox", "gpt2", "olmoe"})
    EXPECT_NE(hf_misfit(olmo, other).find("model.norm_affine is false"), std::string::npos)
        << other;
  nn::GptConfig learned_positions = olmo;
  learned_positions.position_embedding = nn::PositionEmbedding::Learned;
  expect_no_class(learned_positions, "OlmoForCausalLM LLaMA's with layernorm without weights");
}

// Granite's blocks (LLaMA's with its four multipliers) through
// GraniteForCausalLM and back: the multipliers as GraniteConfig names them
// (the attention's the scores' scale itself, the logits' a divisor), the
// weights under LLaMA's names. Only Granite's class scales the residual
// stream's additions or the logits; its heads are hidden_size /
// num_attention_heads wide.
TEST(HfExport, GraniteRoundTripsAndNoOtherClassHoldsItsScalars) {
  nn::GptConfig granite = llama(true, 2);
  granite.embedding_multiplier = 12.0;
  granite.residual_multiplier = 0.22;
  granite.query_pre_attn_scalar = 16.0;  // attention_multiplier 1/4
  granite.logit_scale = 1.0 / 8;
  EXPECT_EQ(std::string(hf_architecture(granite)), "GraniteForCausalLM");
  const nlohmann::json j = expect_round_trip(granite, "granite").config;
  EXPECT_EQ(j.at("model_type"), "granite");
  EXPECT_EQ(j.at("embedding_multiplier"), 12.0);
  EXPECT_EQ(j.at("residual_multiplier"), 0.22);
  EXPECT_EQ(j.at("attention_multiplier"), 0.25);
  EXPECT_EQ(j.at("logits_scaling"), 8.0);
  EXPECT_FALSE(j.contains("head_dim"));
  // A plain LLaMA goes out as LLaMA, with GraniteConfig's multipliers of 1
  // and the usual scale had it been asked for as Granite.
  EXPECT_EQ(std::string(hf_model_type(llama(true, 2))), "llama");
  EXPECT_EQ(hf_misfit(llama(true, 2), "granite"), "");
  for (const char* other : {"llama", "mistral", "qwen3", "gemma", "stablelm", "olmo2", "phi3",
                            "gpt_neox", "gpt2", "mixtral"}) {
    SCOPED_TRACE(other);
    const std::string why = hf_misfit(granite, other);
    EXPECT_NE(why.find("model.residual_multiplier is not 1"), std::string::npos) << why;
    EXPECT_NE(why.find("model.logit_scale is not 1"), std::string::npos) << why;
  }
  nn::GptConfig wide_heads = granite;
  wide_heads.head_size = 8;
  EXPECT_NE(hf_misfit(wide_heads, "granite").find("Granite's heads are hidden_size"),
            std::string::npos);
  nn::GptConfig windowed = granite;
  windowed.sliding_window = 4;
  expect_no_class(windowed, "GraniteForCausalLM LLaMA's with any embedding, residual and logit");
}

// GraniteMoE's and GraniteMoeShared's mixtures through their classes and
// back: the experts fused into input_linear (E, 2F, C) and output_linear
// (E, C, F) and read apart again, bit for bit; the shared expert ungated
// under shared_mlp. A gated shared expert (Qwen2-MoE's) or experts not
// renormalised are not Granite's.
TEST(HfExport, GraniteMoeRoundTripsWithItsExpertsFused) {
  for (const int64_t shared : {0, 12}) {
    SCOPED_TRACE(shared);
    nn::GptConfig c = llama(true, 2);
    c.residual_multiplier = 0.5;
    c.logit_scale = 0.25;
    c.moe.experts = 3;
    c.moe.top_k = 2;
    c.ffn_hidden_size = 10;  // (the experts', as GraniteMoeConfig's one intermediate_size)
    c.moe.shared_ffn_hidden_size = shared;
    const Exported out = expect_round_trip(c, shared > 0 ? "granitemoeshared" : "granitemoe");
    const auto& tensors = out.tensors;
    const std::string moe = "model.layers.1.block_sparse_moe.";
    EXPECT_EQ(tensors.at(moe + "input_linear.weight").shape(), (Shape{3, 20, 16}));
    EXPECT_EQ(tensors.at(moe + "output_linear.weight").shape(), (Shape{3, 16, 10}));
    EXPECT_EQ(tensors.at(moe + "router.layer.weight").shape(), (Shape{3, 16}));
    EXPECT_EQ(tensors.count("model.layers.0.shared_mlp.input_linear.weight"), shared > 0 ? 1u : 0u);
    const nlohmann::json& j = out.config;
    EXPECT_EQ(j.at("num_local_experts"), 3);
    EXPECT_EQ(j.at("intermediate_size"), 10);
    EXPECT_EQ(j.contains("shared_intermediate_size"), shared > 0);
    EXPECT_EQ(j.at("logits_scaling"), 4.0);
  }
  nn::GptConfig c = llama(true, 2);
  c.moe.experts = 3;
  c.moe.top_k = 2;
  c.moe.normalize_top_k = false;
  EXPECT_NE(hf_misfit(c, "granitemoe").find("model.moe.normalize_top_k is false"),
            std::string::npos);
  c.moe.normalize_top_k = true;
  c.moe.shared_ffn_hidden_size = 8;
  c.moe.shared_gate = true;
  EXPECT_NE(hf_misfit(c, "granitemoeshared").find("model.moe.shared_gate is true"),
            std::string::npos);
  EXPECT_NE(hf_misfit(c, "granitemoe").find("model.moe.shared_ffn_hidden_size is set"),
            std::string::npos);
  EXPECT_NE(hf_misfit(c, "granite").find("model.moe is set"), std::string::npos);
}

// Cohere's blocks (LLaMA's sublayers in parallel on one LayerNorm without a
// bias, the logits scaled) through CohereForCausalLM and back: q's and k's
// rows in interleaved pairs in the file (each head's rows (2i, 2i + 1) are
// Triad's (i, i + D/2)), v's as they are, and the reader orders them back,
// bit for bit, with grouped key/value heads. A LayerNorm without a bias is
// no other class's.
TEST(HfExport, CohereRoundTripsWithItsRowsInterleaved) {
  const nn::GptConfig c = cohere_blocks(0.0625);
  const Exported out = expect_round_trip(c, "cohere");
  const int64_t D = c.head_dim();
  const std::vector<double> qkv = to_double_vector(out.weights.at("h.1.attn.c_attn.weight")),
                            q = to_double_vector(
                                out.tensors.at("model.layers.1.self_attn.q_proj.weight")),
                            k = to_double_vector(
                                out.tensors.at("model.layers.1.self_attn.k_proj.weight"));
  const int64_t C = c.d_model, Q = c.q_width();
  for (int64_t head : {0, 3}) {
    for (int64_t i = 0; i < D / 2; ++i) {
      for (int64_t pair = 0; pair < 2; ++pair) {
        const int64_t file_row = head * D + 2 * i + pair, ours = head * D + pair * (D / 2) + i;
        EXPECT_EQ(q[static_cast<size_t>(file_row * C)], qkv[static_cast<size_t>(ours * C)]);
      }
    }
  }
  // The keys' second head (of 2), rows 2i + 1 against Triad's D/2 + i.
  EXPECT_EQ(k[static_cast<size_t>((D + 3) * C)], qkv[static_cast<size_t>((Q + D + D / 2 + 1) * C)]);
  EXPECT_EQ(out.tensors.count("model.layers.0.input_layernorm.bias"), 0u);
  EXPECT_EQ(out.tensors.count("model.layers.0.post_attention_layernorm.weight"), 0u);
  EXPECT_EQ(out.config.at("logit_scale"), 0.0625);
  EXPECT_EQ(out.config.at("layer_norm_eps"), 1e-5);
  for (const char* other : {"stablelm", "gpt_neox", "falcon", "llama"})
    EXPECT_NE(hf_misfit(c, other).find("model.norm_bias is false"), std::string::npos) << other;
  nn::GptConfig biased = c;
  biased.norm_bias = true;
  EXPECT_NE(hf_misfit(biased, "cohere").find("model.norm_bias is true"), std::string::npos);
}

// Command R+'s per-head LayerNorms (model.qk_norm: head_layernorm) through
// CohereForCausalLM and back: use_qk_norm, q_norm (n_head, D) and k_norm
// (kv heads, D) in the file, each head's weights in the interleaved order of
// its q and k rows (the file's (h, 2i + pair) is Triad's h * D + pair * D/2
// + i), read back bit for bit from the directory and from the file alone.
// No other class but StableLM's holds them: StableLM 2 12B writes a
// LayerNorm of D for each head, in the heads' order.
TEST(HfExport, HeadLayerNormsRoundTripAsCommandRPlusAndStableLm12bWriteThem) {
  nn::GptConfig c = cohere_blocks(0.5);
  nn::set_qk_norm(c, "head_layernorm");
  nn::Gpt model(c, 3);
  nn::StateDict sd = model.state_dict();
  for (auto& [name, t] : sd) {  // weights that tell every feature apart
    if (name.find("_norm.weight") == std::string::npos) continue;
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0 + 0.01 * static_cast<double>(i);
    t = from_vector(v, t.shape());
  }
  model.load_state_dict(sd);
  EXPECT_EQ(std::string(hf_model_type(c)), "cohere");
  testing::TempDir dir;
  save_hf_model(model.state_dict(), c, dir.file("hf"));
  const nn::GptConfig back = load_hf_config(dir.file("hf"));
  EXPECT_TRUE(back.qk_head_layernorm);
  expect_same_model(c, back);
  expect_reads_back(dir.file("hf"), model);
  std::filesystem::create_directory(dir.file("alone"));
  std::filesystem::copy_file(dir.file("hf/model.safetensors"), dir.file("alone/model.safetensors"));
  expect_reads_back(dir.file("alone/model.safetensors"), model);
  const auto tensors = load_safetensors(dir.file("hf/model.safetensors")).tensors;
  const int64_t D = c.head_dim();
  const Tensor& q = tensors.at("model.layers.1.self_attn.q_norm.weight");
  const Tensor& k = tensors.at("model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(q.shape(), (Shape{c.n_head, D}));
  EXPECT_EQ(k.shape(), (Shape{c.kv_heads(), D}));
  const std::vector<double> fq = to_double_vector(q),
                            ours = to_double_vector(sd.at("h.1.attn.q_norm.weight"));
  for (int64_t h = 0; h < c.n_head; ++h) {
    for (int64_t i = 0; i < D / 2; ++i) {
      for (int64_t pair = 0; pair < 2; ++pair) {
        EXPECT_EQ(fq[static_cast<size_t>(h * D + 2 * i + pair)],
                  ours[static_cast<size_t>(h * D + pair * (D / 2) + i)])
            << h << " " << i << " " << pair;
      }
    }
  }
  std::ifstream config(dir.file("hf/config.json"));
  EXPECT_EQ(nlohmann::json::parse(config).at("use_qk_norm"), true);
  for (const char* other : {"qwen3", "gemma3_text", "olmo2", "cohere2", "llama"})
    EXPECT_NE(hf_misfit(c, other).find("model.qk_norm is"), std::string::npos) << other;
  nn::GptConfig qwen_norms = cohere_blocks(0.5);
  qwen_norms.qk_norm = true;
  EXPECT_NE(hf_misfit(qwen_norms, "cohere").find("model.qk_norm is not head_layernorm or false"),
            std::string::npos);

  // StableLM 2 12B's: a LayerNorm of D for each head, q_layernorm.norms.h
  // (and k_layernorm's for each key/value head), in the heads' order.
  nn::GptConfig s = llama(false, 2);
  s.normalization = nn::Normalization::LayerNorm;
  s.layer_norm_eps = 1e-5;
  s.rope_dim = 2;
  s.parallel_residual = s.shared_norm = true;
  nn::set_qk_norm(s, "head_layernorm");
  EXPECT_EQ(std::string(hf_model_type(s)), "stablelm");
  nn::Gpt twelve(s, 3);
  nn::StateDict tw = twelve.state_dict();
  for (auto& [name, t] : tw) {
    if (name.find("attn.") == std::string::npos || name.find("_norm.weight") == std::string::npos)
      continue;
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 2.0 - 0.01 * static_cast<double>(i);
    t = from_vector(v, t.shape());
  }
  twelve.load_state_dict(tw);
  save_hf_model(twelve.state_dict(), s, dir.file("stablelm"));
  expect_same_model(s, load_hf_config(dir.file("stablelm")));
  expect_reads_back(dir.file("stablelm"), twelve);
  const auto st = load_safetensors(dir.file("stablelm/model.safetensors")).tensors;
  const std::vector<double> k_ours = to_double_vector(tw.at("h.0.attn.k_norm.weight"));
  const int64_t SD = s.head_dim();
  for (int64_t h = 0; h < s.kv_heads(); ++h) {
    const Tensor& w =
        st.at("model.layers.0.self_attn.k_layernorm.norms." + std::to_string(h) + ".weight");
    EXPECT_EQ(to_double_vector(w),
              std::vector<double>(k_ours.begin() + h * SD, k_ours.begin() + (h + 1) * SD));
  }
  EXPECT_EQ(st.count("model.layers.0.self_attn.q_layernorm.norms." + std::to_string(s.n_head - 1) +
                     ".weight"),
            1u);
  EXPECT_EQ(st.count("model.layers.0.self_attn.q_norm.weight"), 0u);
}

// GLM's blocks through GlmForCausalLM and Glm4ForCausalLM and back: q's
// and k's rows and biases with the rotated part of each head (rope_dim of
// it) in interleaved pairs in the file (the file's row h * D + 2i + pair is
// Triad's h * D + pair * r/2 + i for i < r/2), the rest of each head and v
// as they are; gate_up_proj as c_fc; GLM-4's four norms by their names.
TEST(HfExport, GlmRoundTripsWithTheRotatedRowsInterleaved) {
  nn::GptConfig c = llama(false, 2);
  c.qkv_bias = true;
  c.head_size = 8;
  c.rope_dim = 4;  // half of each head of 8
  c.post_norms = true;
  const Exported out = expect_round_trip(c, "glm4");
  const int64_t D = c.head_dim(), r = c.rope_dim, C = c.d_model, Q = c.q_width();
  const std::vector<double> qkv = to_double_vector(out.weights.at("h.1.attn.c_attn.weight")),
                            bias = to_double_vector(out.weights.at("h.1.attn.c_attn.bias")),
                            q = to_double_vector(
                                out.tensors.at("model.layers.1.self_attn.q_proj.weight")),
                            kb = to_double_vector(
                                out.tensors.at("model.layers.1.self_attn.k_proj.bias"));
  for (int64_t head : {int64_t{0}, c.n_head - 1}) {
    for (int64_t i = 0; i < r / 2; ++i) {
      for (int64_t pair = 0; pair < 2; ++pair) {
        const int64_t file_row = head * D + 2 * i + pair, ours = head * D + pair * (r / 2) + i;
        EXPECT_EQ(q[static_cast<size_t>(file_row * C)], qkv[static_cast<size_t>(ours * C)]);
      }
    }
    for (int64_t d = r; d < D; ++d)  // the unturned rows as they are
      EXPECT_EQ(q[static_cast<size_t>((head * D + d) * C)],
                qkv[static_cast<size_t>((head * D + d) * C)]);
  }
  // The keys' bias, second head: the file's row 1 is Triad's r / 2.
  EXPECT_EQ(kb[static_cast<size_t>(D + 1)], bias[static_cast<size_t>(Q + D + r / 2)]);
  EXPECT_EQ(to_double_vector(out.tensors.at("model.layers.0.mlp.gate_up_proj.weight")),
            to_double_vector(out.weights.at("h.0.mlp.c_fc.weight")));
  for (const auto& [ours, theirs] : {std::pair{"post_attn_norm", "post_self_attn_layernorm"},
                                     {"ln_2", "post_attention_layernorm"},
                                     {"post_mlp_norm", "post_mlp_layernorm"}}) {
    EXPECT_EQ(out.tensors.count(std::string("model.layers.1.") + theirs + ".weight"), 1u) << theirs;
    EXPECT_EQ(out.weights.count(std::string("h.1.") + ours + ".weight"), 1u) << ours;
  }
  EXPECT_EQ(out.config.at("partial_rotary_factor"), 0.5);
  EXPECT_EQ(out.config.at("attention_bias"), true);
  nn::GptConfig plain = c;
  plain.post_norms = false;
  EXPECT_EQ(
      expect_round_trip(plain, "glm").tensors.count("model.layers.0.post_mlp_layernorm.weight"),
      0u);
  EXPECT_NE(hf_misfit(plain, "glm4").find("model.post_norms is false"), std::string::npos);
  nn::GptConfig windowed = c;
  windowed.sliding_window = 3;
  EXPECT_NE(hf_misfit(windowed, "glm4").find("model.sliding_window is set"), std::string::npos);
}

// Layers without rope: only SmolLM3's class (any of them, windows on any
// layers) and Cohere 2's (its global layers, which a window exempts) hold
// them. Through each and back: no_rope_layers' flags, Cohere 2's
// layer_types, and the weights bit for bit (Cohere 2's q and k rows
// interleaved as Cohere's).
TEST(HfExport, LayersWithoutRopeRoundTripAsSmollm3AndCohere2) {
  nn::GptConfig smol = llama(true, 2);
  smol.nope_layers = {1};
  EXPECT_NE(hf_misfit(smol, "llama").find("model.nope_layers is set"), std::string::npos);
  EXPECT_NE(hf_misfit(smol, "qwen3").find("model.nope_layers is set"), std::string::npos);
  const Exported out = expect_round_trip(smol, "smollm3");
  EXPECT_EQ(out.config.at("no_rope_layers"), nlohmann::json::array({1, 0}));
  EXPECT_EQ(out.config.at("use_sliding_window"), false);
  EXPECT_EQ(out.tensors.count("model.layers.1.self_attn.q_proj.weight"), 1u);
  nn::GptConfig windowed = smol;  // SmolLM3's window on layer 0 alone
  windowed.sliding_window = 5;
  windowed.full_attention_layers = {1};
  const Exported w = expect_round_trip(windowed, "smollm3");
  EXPECT_EQ(w.config.at("layer_types"),
            nlohmann::json::array({"sliding_attention", "full_attention"}));
  EXPECT_EQ(w.config.at("sliding_window"), 5);

  nn::GptConfig c = cohere_blocks(0.25);
  c.sliding_window = 5;
  c.full_attention_layers = c.nope_layers = {1};
  EXPECT_NE(hf_misfit(c, "cohere").find("model.nope_layers is set"), std::string::npos);
  const Exported cohere2 = expect_round_trip(c, "cohere2");
  EXPECT_EQ(cohere2.config.at("layer_types"),
            nlohmann::json::array({"sliding_attention", "full_attention"}));
  EXPECT_EQ(cohere2.config.at("sliding_window"), 5);
  // (Its rows interleaved: the file's row 1 is Triad's row D / 2.)
  const int64_t C = c.d_model, D = c.head_dim();
  EXPECT_EQ(to_double_vector(cohere2.tensors.at(
                "model.layers.0.self_attn.q_proj.weight"))[static_cast<size_t>(C)],
            to_double_vector(
                cohere2.weights.at("h.0.attn.c_attn.weight"))[static_cast<size_t>(D / 2 * C)]);
  nn::GptConfig elsewhere = c;
  elsewhere.nope_layers = {0};
  EXPECT_NE(hf_misfit(elsewhere, "cohere2")
                .find("model.full_attention_layers is not "
                      "model.nope_layers"),
            std::string::npos);
  EXPECT_THROW(hf_model_type(elsewhere), NotSupportedError);  // (nor SmolLM3's LLaMA blocks)
}

// StarCoder2's blocks through Starcoder2ForCausalLM and back: LLaMA's
// attention names with biases (o_proj's too), its ungated MLP as mlp.c_fc
// and mlp.c_proj, LayerNorms with biases; without linear biases, none
// written but the norms'. Grouped key/value heads or a window keep such a
// model from GPT-NeoX's class, which a model with neither goes to first.
TEST(HfExport, Starcoder2RoundTripsWithItsBiases) {
  for (const bool biases : {true, false}) {
    SCOPED_TRACE(biases);
    nn::GptConfig c = llama(false, 2);
    c.normalization = nn::Normalization::LayerNorm;
    c.layer_norm_eps = 1e-5;
    c.activation = nn::Activation::Gelu;
    c.ffn_hidden_size = 40;
    c.linear_bias = biases;
    c.sliding_window = 5;
    const Exported out = expect_round_trip(c, "starcoder2");
    EXPECT_EQ(out.tensors.count("model.layers.1.self_attn.o_proj.bias"), biases ? 1u : 0u);
    EXPECT_EQ(out.tensors.count("model.layers.1.mlp.c_fc.bias"), biases ? 1u : 0u);
    EXPECT_EQ(to_double_vector(out.tensors.at("model.layers.1.mlp.c_proj.weight")),
              to_double_vector(out.weights.at("h.1.mlp.c_proj.weight")));
    EXPECT_EQ(out.tensors.count("model.layers.0.post_attention_layernorm.bias"), 1u);
    EXPECT_EQ(out.config.at("use_bias"), biases);
    EXPECT_EQ(out.config.at("sliding_window"), 5);
    EXPECT_EQ(out.config.at("hidden_act"), "gelu_pytorch_tanh");
  }
  nn::GptConfig neox = llama(false, 0);
  neox.normalization = nn::Normalization::LayerNorm;
  neox.activation = nn::Activation::GeluErf;
  neox.linear_bias = true;
  EXPECT_EQ(std::string(hf_model_type(neox)), "gpt_neox");
  EXPECT_EQ(hf_misfit(neox, "starcoder2"), "");
  nn::GptConfig parallel = neox;
  parallel.parallel_residual = true;
  EXPECT_NE(hf_misfit(parallel, "starcoder2").find("model.parallel_residual is true"),
            std::string::npos);
  nn::GptConfig gated = neox;
  gated.activation = nn::Activation::SwiGlu;
  EXPECT_NE(hf_misfit(gated, "starcoder2").find("model.activation is not gelu"), std::string::npos);
}

TEST(HfExport, ExportingHoldsOneBlockAtATimeAndABrokenFileWritesNothing) {
  testing::TempDir dir;
  nn::GptConfig c = llama(false, 2);
  c.n_layer = 8;
  c.d_model = 64;
  c.n_head = 4;
  c.ffn_hidden_size = 128;
  const std::string triad_file = dir.file("triad.safetensors");
  int64_t model_bytes = 0;
  {
    const nn::Gpt model(c, 3);
    save_gpt2_safetensors(model, triad_file);
    for (const auto& [name, p] : model.named_parameters()) model_bytes += p.nbytes();
  }
  Allocator& host = cpu_allocator();
  const int64_t before = host.stats().allocated;
  host.reset_peak();
  export_hf_model(triad_file, c, dir.file("hf"));
  const int64_t peak = host.stats().peak_allocated - before;
  EXPECT_LT(peak, model_bytes / 2) << "of a " << model_bytes << "-byte model";
  nn::GptConfig deeper = c;
  deeper.n_layer = 9;
  bool told = false;
  try {
    export_hf_model(triad_file, deeper, dir.file("never"),
                    {.before_writing = [&] { told = true; }});
    FAIL() << "a file of another depth was exported";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("the file holds 8 blocks"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(told);
  EXPECT_FALSE(std::filesystem::exists(dir.file("never")));
}

// The files of an exported directory, sorted.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Past the largest shard, Hugging Face's shards and index: every shard
// within the limit (or one tensor alone), the index naming each tensor's
// shard and the total, init.from's reader giving back the same model; a
// later export replaces the earlier one's weights whole, and one that
// fails half way leaves them as they were.
TEST(HfExport, LargeModelsAreShardedWithAnIndexAndEachExportReplacesTheLast) {
  testing::TempDir dir;
  nn::GptConfig c = llama(false, 2);
  c.n_layer = 4;
  c.d_model = 32;
  c.ffn_hidden_size = 64;
  const nn::Gpt model(c, 5);
  const std::string triad_file = dir.file("triad.safetensors");
  save_gpt2_safetensors(model, triad_file);
  auto expect_model = [&](const std::string& out) { expect_reads_back(out, model); };
  const std::string out = dir.file("hf");
  constexpr int64_t kMax = 10000;  // a block is 4 * 32 * 32 * 4 * (1 + 1/2 + ...) bytes
  const std::vector<std::string> files =
      export_hf_model(triad_file, c, out, {.max_shard_bytes = kMax});
  ASSERT_GT(files.size(), 4u);
  EXPECT_EQ(files.front(), "model-00001-of-" +
                               std::string(5 - std::to_string(files.size()).size(), '0') +
                               std::to_string(files.size()) + ".safetensors");
  std::vector<std::string> want = files;
  want.insert(want.end(), {"config.json", "model.safetensors.index.json"});
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listing(out), want);  // no single file, nothing left under a hidden name
  std::ifstream in(out + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  int64_t total = 0;
  std::map<std::string, int64_t> tensors_in;
  for (const auto& file : files) {
    const Safetensors st = load_safetensors(out + "/" + file);
    int64_t bytes = 0;
    for (const auto& [name, t] : st.tensors) {
      bytes += t.nbytes();
      EXPECT_EQ(index["weight_map"][name].get<std::string>(), file) << name;
    }
    EXPECT_TRUE(bytes <= kMax || st.tensors.size() == 1) << file << ": " << bytes << " bytes";
    EXPECT_EQ(st.metadata.at("format"), "pt");
    total += bytes;
    tensors_in[file] = static_cast<int64_t>(st.tensors.size());
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  int64_t listed = 0;
  for (const auto& [file, n] : tensors_in) listed += n;
  EXPECT_EQ(static_cast<int64_t>(index["weight_map"].size()), listed);
  expect_model(out);
  // save_hf_model shards alike.
  const auto saved =
      save_hf_model(model.state_dict(), c, dir.file("saved"), {.max_shard_bytes = kMax});
  EXPECT_GT(saved.size(), 4u);
  expect_model(dir.file("saved"));

  // Fewer, larger shards over the same directory: the old ones beyond them go.
  const auto fewer = export_hf_model(triad_file, c, out, {.max_shard_bytes = 4 * kMax});
  ASSERT_LT(fewer.size(), files.size());
  ASSERT_GT(fewer.size(), 1u);
  want = fewer;
  want.insert(want.end(), {"config.json", "model.safetensors.index.json"});
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listing(out), want);
  expect_model(out);

  // An export that fails on its second shard (a directory stands where its
  // file would go): the earlier export's files are untouched, nothing new
  // is left.
  const std::string blocker = out + "/.triad-export-" + files[1] + ".tmp";
  std::filesystem::create_directories(blocker);
  EXPECT_THROW(export_hf_model(triad_file, c, out, {.max_shard_bytes = kMax}), IoError);
  std::filesystem::remove(blocker);
  EXPECT_EQ(listing(out), want);
  expect_model(out);

  // One file again (the default limit): the shards and the index go.
  EXPECT_EQ(export_hf_model(triad_file, c, out), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(listing(out), (std::vector<std::string>{"config.json", "model.safetensors"}));
  expect_model(out);
  EXPECT_THROW(export_hf_model(triad_file, c, dir.file("never"), {.max_shard_bytes = 0}),
               ValueError);
  // Not into the directory of the file it reads (its model.safetensors
  // would be replaced): the file is untouched.
  const auto before = load_safetensors(triad_file).tensors.size();
  try {
    export_hf_model(triad_file, c, dir.path().string());
    FAIL() << "exported over its own source";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("holds the weights"), std::string::npos) << e.what();
  }
  EXPECT_EQ(load_safetensors(triad_file).tensors.size(), before);
  EXPECT_FALSE(std::filesystem::exists(dir.file("config.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("never")));
}

// An fp32 model exported in bf16 (or f16): every tensor rounded as it is
// written, config.json's torch_dtype saying so, init.from's reader giving
// back the rounded model; save_hf_model alike. An unknown name is refused.
TEST(HfExport, WeightsAreWrittenInTheTypeAsked) {
  testing::TempDir dir;
  const nn::GptConfig c = llama(false, 2);
  const nn::Gpt model(c, 9);
  const std::string triad_file = dir.file("triad.safetensors");
  save_gpt2_safetensors(model, triad_file);
  const auto expected = shapes_of(model);
  for (const auto& [dtype, torch_dtype] :
       {std::pair{DType::BF16, "bfloat16"}, std::pair{DType::F16, "float16"}}) {
    SCOPED_TRACE(torch_dtype);
    const std::string out = dir.file(std::string("hf_") + torch_dtype);
    export_hf_model(triad_file, c, out, {.dtype = dtype});
    for (const auto& [name, t] : load_safetensors(out + "/model.safetensors").tensors)
      EXPECT_EQ(t.dtype(), dtype) << name;
    std::ifstream in(out + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(in)["torch_dtype"].get<std::string>(), torch_dtype);
    const nn::StateDict back = load_gpt2_state_dict(out, expected);
    for (const auto& [name, t] : model.state_dict()) {
      ASSERT_EQ(back.at(name).dtype(), dtype) << name;
      EXPECT_EQ(to_double_vector(back.at(name)), to_double_vector(cast(t, dtype))) << name;
      if (name.find("norm") == std::string::npos && name.find("ln_") == std::string::npos) {
        EXPECT_NE(to_double_vector(back.at(name)), to_double_vector(t)) << name << " not rounded";
      }
    }
    save_hf_model(model.state_dict(), c, out + "_saved", {.dtype = dtype});
    for (const auto& [name, t] : load_safetensors(out + "_saved/model.safetensors").tensors)
      EXPECT_EQ(t.dtype(), dtype) << name;
  }
  EXPECT_EQ(hf_weights_dtype("bf16"), DType::BF16);
  EXPECT_EQ(hf_weights_dtype("float32"), DType::F32);
  try {
    hf_weights_dtype("int8");
    FAIL() << "int8 weights";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'int8': expected float32, bfloat16 or float16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(export_hf_model(triad_file, c, dir.file("never"), {.dtype = DType::I64}),
               ValueError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("never")));
}

// transformers' max_shard_size spellings.
TEST(HfExport, ShardSizesReadAsTransformersWritesThem) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_byte_size("500MiB"), 500LL * 1024 * 1024);
  EXPECT_EQ(parse_byte_size("1.5gb"), 1'500'000'000);
  EXPECT_EQ(parse_byte_size("123"), 123);
  EXPECT_EQ(parse_byte_size("64 KB"), 64'000);
  EXPECT_EQ(parse_byte_size("2TiB"), 2LL << 40);
  // (The last past a double's range: std::stod's out_of_range escaped.)
  const std::string huge(400, '9');
  for (const std::string& bad :
       {std::string(), std::string("GB"), std::string("5XB"), std::string("-1"), std::string("0"),
        std::string("0.5"), std::string("5 G B"), std::string("1e9"), std::string("5GB!"), huge}) {
    try {
      parse_byte_size(bad);
      ADD_FAILURE() << "'" << bad << "' was read as a size";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("size '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

// Gemma's class and config.json: GeGLU as gelu_pytorch_tanh, and a model
// missing one of Gemma's departures named as what keeps it from the class.
TEST(HfExport, GemmaClassAndWhatKeepsAModelFromIt) {
  const nn::GptConfig gemma1 = gemma(1);
  EXPECT_STREQ(hf_architecture(gemma1), "GemmaForCausalLM");
  const auto j = nlohmann::json::parse(hf_config_json(gemma1));
  EXPECT_EQ(j.at("model_type"), "gemma");
  EXPECT_EQ(j.at("hidden_activation"), "gelu_pytorch_tanh");
  nn::GptConfig unscaled = gemma1;
  unscaled.embedding_multiplier = 1.0;
  expect_no_class(unscaled, "model.embedding_multiplier is not sqrt(d_model)");
  nn::GptConfig plain_norms = gemma1;
  plain_norms.norm_weight_offset = false;
  expect_no_class(plain_norms, "model.norm_weight_offset is false");
  nn::GptConfig offset_llama = llama(true, 1);
  offset_llama.norm_weight_offset = true;
  expect_no_class(offset_llama, "model.norm_weight_offset is true");
}

// Gemma 2's and 3's classes: post-norms (and Gemma 3's head norms) under
// Hugging Face's four norm names, the global layers as layer_types, Gemma
// 3's local RoPE base; a model one step from either is named.
TEST(HfExport, Gemma2And3ClassesAndWhatKeepsAModelFromThem) {
  const nn::GptConfig gemma3 = gemma(3);
  EXPECT_STREQ(hf_architecture(gemma3), "Gemma3ForCausalLM");
  const auto j = nlohmann::json::parse(hf_config_json(gemma3));
  EXPECT_EQ(j.at("model_type"), "gemma3_text");
  EXPECT_EQ(j.at("layer_types"), nlohmann::json({"sliding_attention", "full_attention"}));
  EXPECT_EQ(j.at("rope_local_base_freq"), 7.0);
  EXPECT_EQ(j.at("query_pre_attn_scalar"), gemma3.head_dim());
  EXPECT_TRUE(j.at("attn_logit_softcapping").is_null());
  const auto names = triad_to_hf(nn::Gpt(gemma3, 1).state_dict(), gemma3);
  for (const char* norm : {"input_layernorm", "post_attention_layernorm",
                           "pre_feedforward_layernorm", "post_feedforward_layernorm"})
    EXPECT_EQ(names.count(std::string("model.layers.1.") + norm + ".weight"), 1u) << norm;
  const nn::GptConfig gemma2 = gemma(2);
  EXPECT_STREQ(hf_architecture(gemma2), "Gemma2ForCausalLM");
  EXPECT_EQ(nlohmann::json::parse(hf_config_json(gemma2)).count("rope_local_base_freq"), 0u);
  // Gemma 2's soft caps are written (null when unset) and read back; no
  // other class has them.
  nn::GptConfig capped = gemma2;
  capped.attn_logit_softcap = 50.0;
  capped.final_logit_softcap = 30.0;
  const std::string capped_json = hf_config_json(capped);
  const auto cj = nlohmann::json::parse(capped_json);
  EXPECT_EQ(cj.at("attn_logit_softcapping"), 50.0);
  EXPECT_EQ(cj.at("final_logit_softcapping"), 30.0);
  EXPECT_TRUE(
      nlohmann::json::parse(hf_config_json(gemma2)).at("final_logit_softcapping").is_null());
  const nn::GptConfig back = gpt_config_from_hf(capped_json, "exported/config.json");
  EXPECT_EQ(back.attn_logit_softcap, 50.0);
  EXPECT_EQ(back.final_logit_softcap, 30.0);
  nn::GptConfig capped_llama = llama(true, 1);
  capped_llama.final_logit_softcap = 30.0;
  expect_no_class(capped_llama, "model.final_logit_softcap is set");
  nn::GptConfig capped_gemma1 = gemma(1);
  capped_gemma1.attn_logit_softcap = 50.0;
  expect_no_class(capped_gemma1, "model.attn_logit_softcap is set");
  // Gemma 3's local layers turn unscaled: scaling every layer's RoPE alike
  // fits no class; a local base without the post-norms neither.
  nn::GptConfig scaled_everywhere = gemma3;
  scaled_everywhere.rope_local_theta = 0.0;
  scaled_everywhere.rope_scaling.kind = RopeScaling::Kind::Linear;
  scaled_everywhere.rope_scaling.factor = 2.0;
  expect_no_class(scaled_everywhere, "the windowed layers' RoPE is scaled");
  nn::GptConfig local_gemma = gemma3;
  local_gemma.post_norms = false;
  expect_no_class(local_gemma, "model.post_norms is false");
  // A LLaMA with post-norms (and none of Gemma's departures) is GLM-4's.
  nn::GptConfig sandwich_llama = llama(true, 1);
  sandwich_llama.post_norms = true;
  EXPECT_NE(hf_misfit(sandwich_llama, "llama").find("model.post_norms is true"), std::string::npos);
  EXPECT_EQ(std::string(hf_model_type(sandwich_llama)), "glm4");
  // A LLaMA with its scores scaled otherwise is Granite's (attention_multiplier).
  nn::GptConfig rescaled_llama = llama(true, 1);
  rescaled_llama.query_pre_attn_scalar = 9.0;
  EXPECT_NE(hf_misfit(rescaled_llama, "llama").find("model.query_pre_attn_scalar is not head_dim"),
            std::string::npos);
  EXPECT_EQ(std::string(hf_model_type(rescaled_llama)), "granite");
}

// Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration, 4B and
// up): config.json's text_config is the language model, and its tensors
// sit under language_model.model. (or, from later transformers,
// model.language_model.) beside the vision tower's and the projector's,
// which Triad leaves out (a shard holding only them is mapped, its header
// checked, nothing copied). Both layouts, in one file or sharded, read back
// as the text model, bit for bit.
TEST(HfExport, Gemma3MultimodalCheckpointsReadAsTheirLanguageModel) {
  const nn::GptConfig c = gemma(3);
  const nn::Gpt model(c, 3);
  const auto text = triad_to_hf(model.state_dict(), c);
  testing::TempDir dir;
  for (const std::string prefix :
       {"language_model.model.", "model.language_model.", "sharded:language_model.model."}) {
    SCOPED_TRACE(prefix);
    const bool sharded = prefix.rfind("sharded:", 0) == 0;
    const std::string out = dir.file(std::to_string(prefix.size()));
    std::filesystem::create_directories(out);
    std::map<std::string, Tensor> tensors;
    const std::string lm = sharded ? prefix.substr(8) : prefix;
    for (const auto& [name, t] : text) tensors[lm + name.substr(6)] = t;  // past "model."
    const std::string tower = lm[0] == 'l' ? "" : "model.";
    std::map<std::string, Tensor> vision = {
        {tower + "vision_tower.vision_model.embeddings.patch_embedding.weight", ones({4, 3, 2, 2})},
        {tower + "multi_modal_projector.mm_input_projection_weight", ones({5, 16})}};
    if (sharded) {
      save_safetensors(out + "/model-00001-of-00002.safetensors", tensors);
      save_safetensors(out + "/model-00002-of-00002.safetensors", vision);
      nlohmann::json map;
      for (const auto& [name, t] : tensors) map[name] = "model-00001-of-00002.safetensors";
      for (const auto& [name, t] : vision) map[name] = "model-00002-of-00002.safetensors";
      std::ofstream(out + "/model.safetensors.index.json")
          << nlohmann::json{{"weight_map", map}}.dump();
    } else {
      tensors.insert(vision.begin(), vision.end());
      save_safetensors(out + "/model.safetensors", tensors, {{"format", "pt"}});
    }
    nlohmann::json config = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                             {"model_type", "gemma3"},
                             {"text_config", nlohmann::json::parse(hf_config_json(c))},
                             {"vision_config", {{"model_type", "siglip_vision_model"}}}};
    std::ofstream(out + "/config.json") << config.dump();
    expect_same_model(load_hf_config(out), c);
    std::map<std::string, Shape> expected;
    for (auto& [name, p] : model.named_parameters()) expected[name] = p.shape();
    const nn::StateDict back = load_gpt2_state_dict(out, expected);
    ASSERT_EQ(back.size(), expected.size());
    for (const auto& [name, t] : model.state_dict())
      EXPECT_EQ(to_double_vector(back.at(name)), to_double_vector(t)) << name;
  }
  // A text_config of another kind is named.
  const nlohmann::json other = {{"model_type", "gemma3"},
                                {"text_config", {{"model_type", "llama"}}}};
  EXPECT_THROW(gpt_config_from_hf(other.dump(), "x"), NotSupportedError);
  EXPECT_THROW(gpt_config_from_hf(R"({"model_type": "gemma3"})", "x"), ConfigError);
}

// Phi-3's checkpoints fuse q, k and v into qkv_proj and gate and up into
// gate_up_proj, in the order Triad's c_attn and c_fc hold them: they load
// as they are, bit for bit; a layer missing half of the pair is named.
TEST(HfExport, Phi3FusedProjectionsLoad) {
  const nn::GptConfig c = llama(false, 2);
  const nn::Gpt model(c, 3);
  const nn::StateDict sd = model.state_dict();
  std::map<std::string, Tensor> phi3{{"model.embed_tokens.weight", sd.at("wte.weight")},
                                     {"model.norm.weight", sd.at("ln_f.weight")},
                                     {"lm_head.weight", sd.at("lm_head.weight")}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    phi3[hf + "input_layernorm.weight"] = sd.at(p + "ln_1.weight");
    phi3[hf + "post_attention_layernorm.weight"] = sd.at(p + "ln_2.weight");
    phi3[hf + "self_attn.qkv_proj.weight"] = sd.at(p + "attn.c_attn.weight");
    phi3[hf + "self_attn.o_proj.weight"] = sd.at(p + "attn.c_proj.weight");
    phi3[hf + "mlp.gate_up_proj.weight"] = sd.at(p + "mlp.c_fc.weight");
    phi3[hf + "mlp.down_proj.weight"] = sd.at(p + "mlp.c_proj.weight");
  }
  testing::TempDir dir;
  save_safetensors(dir.file("model.safetensors"), phi3, {});
  std::map<std::string, Shape> expected;
  for (auto& [name, p] : model.named_parameters()) expected[name] = p.shape();
  const nn::StateDict back = load_gpt2_state_dict(dir.path().string(), expected);
  ASSERT_EQ(back.size(), expected.size());
  for (const auto& [name, t] : sd)
    EXPECT_EQ(to_double_vector(back.at(name)), to_double_vector(t)) << name;
  phi3.erase("model.layers.1.mlp.gate_up_proj.weight");
  save_safetensors(dir.file("half.safetensors"), phi3, {});
  try {
    load_gpt2_state_dict(dir.file("half.safetensors"), expected);
    FAIL() << "a layer without gate_up_proj loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.gate_up_proj.weight' is missing"),
              std::string::npos)
        << e.what();
  }
}

// The names and shapes Hugging Face's classes load.
TEST(HfExport, NamesAndShapesAreHuggingFaces) {
  const nn::GptConfig c = llama(false, 2);  // 4 query heads of 4 over 2 key/value heads
  const auto t = triad_to_hf(nn::Gpt(c, 1).state_dict(), c);
  EXPECT_EQ(t.at("model.layers.1.self_attn.q_proj.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(t.at("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{8, 16}));
  EXPECT_EQ(t.at("model.layers.1.self_attn.v_proj.weight").shape(), (Shape{8, 16}));
  EXPECT_EQ(t.at("model.layers.0.mlp.gate_proj.weight").shape(), (Shape{24, 16}));
  EXPECT_EQ(t.at("model.layers.0.mlp.down_proj.weight").shape(), (Shape{16, 24}));
  EXPECT_EQ(t.at("lm_head.weight").shape(), (Shape{19, 16}));
  EXPECT_EQ(t.size(), 3u + 2 * 9);
  const auto j = nlohmann::json::parse(hf_config_json(c));
  EXPECT_EQ(j.at("architectures").at(0), "LlamaForCausalLM");
  EXPECT_EQ(j.at("num_key_value_heads"), 2);
  EXPECT_EQ(j.at("head_dim"), 4);
  EXPECT_EQ(j.at("intermediate_size"), 24);
  EXPECT_EQ(j.at("tie_word_embeddings"), false);
  const nn::GptConfig g = gpt2(true);
  const auto gt = triad_to_hf(nn::Gpt(g, 1).state_dict(), g);
  EXPECT_EQ(gt.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{8, 24}));  // Conv1D
  EXPECT_EQ(gt.at("transformer.wpe.weight").shape(), (Shape{6, 8}));
  EXPECT_FALSE(gt.count("lm_head.weight"));
  const auto gj = nlohmann::json::parse(hf_config_json(g, "bfloat16"));
  EXPECT_EQ(gj.at("model_type"), "gpt2");
  EXPECT_EQ(gj.at("n_inner"), 20);
  EXPECT_EQ(gj.at("torch_dtype"), "bfloat16");
  // GPT-NeoX's query_key_value: head h's q, k and v rows together, at
  // h * 3D + {0, D, 2D}, from c_attn's [q | k | v]; the old buffers are not
  // written, and every linear layer has its bias.
  nn::GptConfig x = gpt2(false);
  x.position_embedding = nn::PositionEmbedding::Rotary;
  x.parallel_residual = true;
  const nn::Gpt xm(x, 1);
  const auto xt = triad_to_hf(xm.state_dict(), x);
  EXPECT_EQ(xt.size(), 4u + 2 * 12);
  EXPECT_TRUE(xt.count("embed_out.weight"));
  EXPECT_TRUE(xt.count("gpt_neox.layers.1.mlp.dense_4h_to_h.bias"));
  const std::vector<double> ours = to_double_vector(xm.state_dict().at("h.1.attn.c_attn.weight")),
                            theirs = to_double_vector(
                                xt.at("gpt_neox.layers.1.attention.query_key_value.weight"));
  const int64_t D = 4, C = 8;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t part = 0; part < 3; ++part) {
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t col = 0; col < C; ++col) {
          ASSERT_EQ(theirs[((h * 3 + part) * D + d) * C + col],
                    ours[((part * 2 + h) * D + d) * C + col])
              << "head " << h << " part " << part;
        }
      }
    }
  }
  const auto xj = nlohmann::json::parse(hf_config_json(x));
  EXPECT_EQ(xj.at("architectures").at(0), "GPTNeoXForCausalLM");
  EXPECT_EQ(xj.at("use_parallel_residual"), true);
  EXPECT_EQ(xj.at("hidden_act"), "gelu_new");
  EXPECT_EQ(xj.at("rotary_pct"), 1.0);
  // Phi-3's fused projections, whole.
  nn::GptConfig p = c;
  p.hf_type = "phi3";
  const auto pt = triad_to_hf(nn::Gpt(p, 1).state_dict(), p);
  EXPECT_EQ(pt.at("model.layers.1.self_attn.qkv_proj.weight").shape(), (Shape{32, 16}));
  EXPECT_EQ(pt.at("model.layers.1.mlp.gate_up_proj.weight").shape(), (Shape{48, 16}));
  EXPECT_FALSE(pt.count("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(pt.size(), 3u + 2 * 6);
  const auto pj = nlohmann::json::parse(hf_config_json(p));
  EXPECT_EQ(pj.at("architectures").at(0), "Phi3ForCausalLM");
  EXPECT_EQ(pj.at("partial_rotary_factor"), 1.0);
  EXPECT_TRUE(pj.at("sliding_window").is_null());
  EXPECT_TRUE(pj.at("rope_scaling").is_null());
  EXPECT_FALSE(pj.contains("attention_bias"));
  // Phi's: q_proj, k_proj and v_proj with their biases, dense, fc1 and fc2,
  // one norm a block, and the head's bias.
  nn::GptConfig f = x;
  f.shared_norm = true;
  f.head_bias = true;
  f.tie_embeddings = false;
  f.n_kv_head = 1;
  EXPECT_STREQ(hf_model_type(f), "phi");
  const auto ft = triad_to_hf(nn::Gpt(f, 1).state_dict(), f);
  EXPECT_EQ(ft.at("model.layers.1.self_attn.q_proj.bias").shape(), (Shape{8}));
  EXPECT_EQ(ft.at("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{4, 8}));
  EXPECT_EQ(ft.at("model.layers.1.self_attn.dense.weight").shape(), (Shape{8, 8}));
  EXPECT_EQ(ft.at("model.layers.0.mlp.fc1.weight").shape(), (Shape{20, 8}));
  EXPECT_EQ(ft.at("model.layers.0.mlp.fc2.bias").shape(), (Shape{8}));
  EXPECT_EQ(ft.at("lm_head.bias").shape(), (Shape{11}));
  EXPECT_FALSE(ft.count("model.layers.0.post_attention_layernorm.weight"));
  EXPECT_EQ(ft.size(), 5u + 2 * 14);
  const auto fj = nlohmann::json::parse(hf_config_json(f));
  EXPECT_EQ(fj.at("architectures").at(0), "PhiForCausalLM");
  EXPECT_EQ(fj.at("num_key_value_heads"), 1);
  EXPECT_EQ(fj.at("partial_rotary_factor"), 1.0);
  EXPECT_EQ(fj.at("qk_layernorm"), false);
  // Without the shared norm or the head's bias, no class but GPT-NeoX's (or
  // none) holds it.
  nn::GptConfig unbiased = f;
  unbiased.head_bias = false;
  unbiased.rope_dim = 2;  // (turning whole heads, Falcon's class would hold it)
  expect_no_class(unbiased,
                  "PhiForCausalLM the same with grouped heads allowed, the parallel "
                  "residual with a shared norm, and a head bias (here "
                  "model.head_bias is false)");
  nn::GptConfig two_norms = f;
  two_norms.shared_norm = false;
  expect_no_class(two_norms, "model.shared_norm is false");
  // Falcon's query_key_value: key/value head g's query heads, then its key
  // and its value, at g * (r + 2) * D, from c_attn's [q | k | v]; the new
  // decoder architecture's two norms under their names.
  nn::GptConfig fa = llama(false, 2);  // 4 query heads of 4 over 2 key/value heads
  fa.normalization = nn::Normalization::LayerNorm;
  fa.activation = nn::Activation::Gelu;
  fa.ffn_hidden_size = 0;
  fa.parallel_residual = true;
  EXPECT_STREQ(hf_model_type(fa), "falcon");
  const nn::Gpt fm(fa, 1);
  const auto fat = triad_to_hf(fm.state_dict(), fa);
  EXPECT_TRUE(fat.count("transformer.h.1.ln_attn.bias"));
  EXPECT_TRUE(fat.count("transformer.h.1.ln_mlp.weight"));
  EXPECT_FALSE(fat.count("transformer.h.1.input_layernorm.weight"));
  EXPECT_FALSE(fat.count("transformer.h.1.self_attention.dense.bias"));
  EXPECT_EQ(fat.size(), 4u + 2 * 8);
  const std::vector<double> stack = to_double_vector(fm.state_dict().at("h.0.attn.c_attn.weight")),
                            grouped = to_double_vector(
                                fat.at("transformer.h.0.self_attention.query_key_value.weight"));
  const int64_t HD = 4, W = 16;
  // Group g: q heads 2g, 2g + 1 (Triad's rows 0..15), then k_g (16 + 4g),
  // then v_g (24 + 4g).
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t part = 0; part < 4; ++part) {
      const int64_t from = part < 2 ? (2 * g + part) * HD : part == 2 ? 16 + g * HD : 24 + g * HD;
      for (int64_t d = 0; d < HD; ++d) {
        for (int64_t col = 0; col < W; ++col) {
          ASSERT_EQ(grouped[((g * 4 + part) * HD + d) * W + col], stack[(from + d) * W + col])
              << "group " << g << " part " << part;
        }
      }
    }
  }
  EXPECT_EQ(to_double_vector(falcon_qkv_rows_to_triad(
                fat.at("transformer.h.0.self_attention.query_key_value.weight"), 4, 2)),
            stack);
  {
    // CodeGen's qkv_proj: in each of 4 shards (2 heads each of 8), the
    // shard's q rows, then v's, then k's; GPT-J's stack keeps the heads'
    // order.
    const int64_t H = 8, HD = 2;
    std::vector<double> rows;
    for (int64_t i = 0; i < 3 * H * HD; ++i) rows.push_back(static_cast<double>(i));
    const Tensor heads = from_vector(rows, {3 * H * HD, 1}, DType::F64);
    const std::vector<double> sharded = to_double_vector(stack_qkv_rows_to_codegen(heads, H));
    for (int64_t shard = 0; shard < 4; ++shard) {
      for (int64_t part = 0; part < 3; ++part) {  // q, v, k
        const int64_t from = (part == 0 ? 0 : part == 1 ? 2 : 1) * H * HD + shard * 2 * HD;
        for (int64_t r = 0; r < 2 * HD; ++r)
          ASSERT_EQ(sharded[static_cast<size_t>((shard * 3 + part) * 2 * HD + r)],
                    static_cast<double>(from + r))
              << "shard " << shard << " part " << part;
      }
    }
    EXPECT_EQ(to_double_vector(codegen_qkv_rows_to_stack(stack_qkv_rows_to_codegen(heads, H), H)),
              rows);
    EXPECT_THROW(stack_qkv_rows_to_codegen(heads, 6), ShapeError);  // 6 heads: not 4 shards
  }
  const auto faj = nlohmann::json::parse(hf_config_json(fa));
  EXPECT_EQ(faj.at("architectures").at(0), "FalconForCausalLM");
  EXPECT_EQ(faj.at("new_decoder_architecture"), true);
  EXPECT_EQ(faj.at("num_kv_heads"), 2);
  EXPECT_EQ(faj.at("num_ln_in_parallel_attn"), 2);
  EXPECT_EQ(faj.at("bias"), false);
  EXPECT_EQ(faj.at("activation"), "gelu_new");
  try {
    falcon_qkv_rows_to_triad(fat.at("transformer.h.0.self_attention.query_key_value.weight"), 4, 3);
    FAIL() << "three key/value heads accepted for 4 query heads";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("is not 4 query heads and twice 3 key/value heads"),
              std::string::npos)
        << e.what();
  }
}

// model.hf_type picks among the classes that hold a model: a Mistral
// without a window stays Mistral (its window null), and a class that cannot
// hold the model leaves the choice to the list; a name no class has is a
// ConfigError.
TEST(HfExport, TheModelsOwnClassIsPreferred) {
  nn::GptConfig c = llama(false, 2);
  EXPECT_STREQ(hf_model_type(c), "llama");
  c.hf_type = "mistral";
  EXPECT_STREQ(hf_model_type(c), "mistral");
  const auto j = nlohmann::json::parse(hf_config_json(c));
  EXPECT_EQ(j.at("architectures").at(0), "MistralForCausalLM");
  EXPECT_TRUE(j.at("sliding_window").is_null());
  const nn::GptConfig back = gpt_config_from_hf(j.dump(), "x");
  EXPECT_EQ(back.sliding_window, 0);
  EXPECT_EQ(back.hf_type, "mistral");
  c.hf_type = "qwen3";  // (no query/key norms here)
  EXPECT_STREQ(hf_model_type(c), "llama");
  c.hf_type = "llama";
  c.sliding_window = 5;  // (LLaMA has no window)
  EXPECT_STREQ(hf_model_type(c), "mistral");
  // Asked for one class and nothing else (triad-export --hf-type): a class
  // that cannot hold the model is refused with what keeps it.
  EXPECT_EQ(exported_as(llama(false, 2), "phi3").hf_type, "phi3");
  EXPECT_EQ(hf_misfit(llama(false, 2), "llama"), "");
  EXPECT_EQ(hf_misfit(c, "llama"), "model.sliding_window is set");
  try {
    exported_as(llama(false, 2), "gemma");
    FAIL() << "a LLaMA exported as Gemma";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("model_type gemma (GemmaForCausalLM) cannot hold this "
                                         "model: model.activation is not geglu"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(exported_as(c, "Phi3"), ConfigError);
  c.hf_type = "phi4";
  try {
    hf_model_type(c);
    FAIL() << "model_type phi4 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "model.hf_type 'phi4' is not a model_type Triad exports "
            "(llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, "
            "gemma3_text, phi3, stablelm, olmo, olmo2, olmo3, olmoe, granite, granitemoe, "
            "granitemoeshared, cohere, cohere2, smollm3, glm, glm4, glm4_moe, dots1, deepseek_v2, "
            "deepseek_v3, minimax_m2, "
            "helium, seed_oss, "
            "exaone4, arcee, "
            "gpt_neox, "
            "starcoder2, nemotron, "
            "phi, falcon, gptj, codegen, gpt2, or auto)"),
        std::string::npos)
        << e.what();
  }
}

// model.activation relu2 (squared ReLU): Nemotron's class alone holds it;
// every other class's refusal says so rather than writing GELU's name, and
// Nemotron's names what else keeps GPT-2's blocks from it.
TEST(HfExport, SquaredReluIsNemotronsAlone) {
  nn::GptConfig c = gpt2(true);
  EXPECT_EQ(std::string(hf_model_type(c)), "gpt2");
  c.activation = nn::Activation::Relu2;
  const std::string why =
      "model.activation is relu2 (squared ReLU, NemotronForCausalLM's and ArceeForCausalLM's "
      "alone)";
  for (const char* type : {"gpt2", "gpt_neox", "falcon", "llama", "starcoder2", "phi", "gptj"}) {
    EXPECT_EQ(hf_misfit(c, type), why) << type;
  }
  EXPECT_EQ(hf_misfit(c, "nemotron"),
            "model.position_embedding is not rope, model.norm_weight_offset is false "
            "(Nemotron's LayerNorm1P scales by 1 + weight)");
  expect_no_class(c,
                  "NemotronForCausalLM the sequential block with rope on any share of each "
                  "head, relu2, gelu or gelu_erf, layernorm scaling by 1 + weight "
                  "(norm_weight_offset), biases on every linear layer, on the MLP alone or "
                  "none, grouped heads allowed and no window (here model.position_embedding "
                  "is not rope, model.norm_weight_offset is false");
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.norm_weight_offset = true;
  EXPECT_EQ(std::string(hf_model_type(c)), "nemotron");
  EXPECT_EQ(std::string(hf_architecture(c)), "NemotronForCausalLM");
  // What Nemotron's class lacks: a window, a parallel residual, biases on
  // q, k and v alone, RMSNorm, a gated MLP.
  for (const auto& [edit, reason] :
       std::vector<std::pair<std::function<void(nn::GptConfig&)>, std::string>>{
           {[](nn::GptConfig& m) { m.sliding_window = 3; }, "model.sliding_window is set"},
           {[](nn::GptConfig& m) { m.parallel_residual = true; },
            "model.parallel_residual is true"},
           {[](nn::GptConfig& m) {
              m.linear_bias = false;
              m.qkv_bias = true;
            },
            "model.qkv_bias without model.linear_bias"},
           {[](nn::GptConfig& m) { m.normalization = nn::Normalization::RmsNorm; },
            "model.normalization is rmsnorm"},
           {[](nn::GptConfig& m) { m.activation = nn::Activation::SwiGlu; },
            "model.activation is not relu2, gelu or gelu_erf"}}) {
    nn::GptConfig m = c;
    edit(m);
    EXPECT_EQ(hf_misfit(m, "nemotron"), reason);
  }
}

TEST(HfExport, AModelNoClassHoldsIsNamed) {
  nn::GptConfig c = gpt2(true);
  c.position_embedding = nn::PositionEmbedding::Rotary;  // rope with GELU and LayerNorm,
  c.linear_bias = false;                                 // no biases: StarCoder2's
  EXPECT_EQ(std::string(hf_model_type(c)), "starcoder2");
  c.rope_dim = 2;  // half of each head turned: no class's
  try {
    hf_model_type(c);
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("LlamaForCausalLM needs rope, swiglu, rmsnorm, no linear biases and no "
                     "query/key norms (here model.rope_dim turns part of each head (only Phi-3, "
                     "StableLM, GLM, GLM-4.5 and MiniMax-M2 turn part), model.activation is not "
                     "swiglu, "
                     "model.normalization is "
                     "not rmsnorm)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("GPTNeoXForCausalLM needs rope (on any share of each head), gelu or "
                     "gelu_erf, layernorm, linear biases, a key/value head per query head and "
                     "heads d_model / n_head wide (here model.linear_bias is false)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("(here model.linear_bias is false, model.position_embedding is rope)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("Starcoder2ForCausalLM the sequential block with rope on whole heads, gelu "
                     "or gelu_erf, layernorm, biases on every linear layer or none, grouped heads "
                     "allowed and a window on every layer or none (here model.rope_dim turns part "
                     "of each head)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("NemotronForCausalLM the sequential block with rope on any share of each "
                     "head, relu2, gelu or gelu_erf, layernorm scaling by 1 + weight "
                     "(norm_weight_offset), biases on every linear layer, on the MLP alone or "
                     "none, grouped heads allowed and no window (here model.norm_weight_offset "
                     "is false (Nemotron's LayerNorm1P scales by 1 + weight))"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("FalconForCausalLM parallel blocks with rope on whole heads, gelu or "
                     "gelu_erf, layernorm, biases on every linear layer or none, and no head "
                     "bias (here model.parallel_residual is false, model.rope_dim turns part of "
                     "each head)"),
              std::string::npos)
        << m;
  }
  // The parallel residual only GPT-NeoX's class holds; LLaMA's blocks name it.
  nn::GptConfig parallel_llama = llama(false, 0);
  parallel_llama.parallel_residual = true;
  expect_no_class(parallel_llama, "model.parallel_residual is true");
  nn::GptConfig grouped = gpt2(true);
  grouped.n_kv_head = 1;
  EXPECT_THROW(hf_model_type(grouped), NotSupportedError);
  nn::GptConfig windowed = gpt2(true);
  windowed.sliding_window = 3;
  EXPECT_THROW(hf_model_type(windowed), NotSupportedError);
  nn::GptConfig mistral = llama(false, 2);
  mistral.sliding_window = 5;
  EXPECT_STREQ(hf_model_type(mistral), "mistral");
  nn::GptConfig qwen2 = llama(false, 2);
  qwen2.qkv_bias = true;
  EXPECT_STREQ(hf_model_type(qwen2), "qwen2");
  const auto qj = nlohmann::json::parse(hf_config_json(qwen2));
  EXPECT_EQ(qj.at("architectures").at(0), "Qwen2ForCausalLM");
  EXPECT_FALSE(qj.contains("attention_bias"));
  const auto qt = triad_to_hf(nn::Gpt(qwen2, 1).state_dict(), qwen2);
  EXPECT_EQ(qt.at("model.layers.1.self_attn.q_proj.bias").shape(), (Shape{16}));
  EXPECT_EQ(qt.at("model.layers.1.self_attn.k_proj.bias").shape(), (Shape{8}));
  EXPECT_FALSE(qt.count("model.layers.1.self_attn.o_proj.bias"));
  // Qwen's window covers the layers from max_window_layers on: the exempt
  // layers must be the first ones.
  qwen2.sliding_window = 5;
  qwen2.full_attention_layers = {0};
  const auto wj = nlohmann::json::parse(hf_config_json(qwen2));
  EXPECT_EQ(wj.at("use_sliding_window"), true);
  EXPECT_EQ(wj.at("sliding_window"), 5);
  EXPECT_EQ(wj.at("max_window_layers"), 1);
  qwen2.full_attention_layers = {1};
  try {
    hf_model_type(qwen2);
    FAIL() << "a Qwen2 windowed on its first layer only exported";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("Qwen2ForCausalLM the same with biases on q, k and v "
                                         "only, and a window, if any, on every layer from some "
                                         "layer on (here model.full_attention_layers is not the "
                                         "first layers)"),
              std::string::npos)
        << e.what();
  }
  // Mistral's window covers every layer; SmolLM3's layer_types hold any
  // mix.
  nn::GptConfig mixed = llama(false, 2);
  mixed.sliding_window = 5;
  mixed.full_attention_layers = {0};
  EXPECT_NE(hf_misfit(mixed, "mistral").find("model.full_attention_layers exempts layers"),
            std::string::npos);
  EXPECT_STREQ(hf_model_type(mixed), "smollm3");
  EXPECT_EQ(nlohmann::json::parse(hf_config_json(mistral)).at("sliding_window"), 5);
  // Qwen3: the head norms under their names, the projections as wide as the
  // heads (4 query heads of 6: 24, over 2 key/value heads: 12).
  nn::GptConfig qwen3 = llama(false, 2);
  qwen3.qk_norm = true;
  qwen3.head_size = 6;
  EXPECT_STREQ(hf_model_type(qwen3), "qwen3");
  const auto q3 = nlohmann::json::parse(hf_config_json(qwen3));
  EXPECT_EQ(q3.at("architectures").at(0), "Qwen3ForCausalLM");
  EXPECT_EQ(q3.at("head_dim"), 6);
  const auto q3t = triad_to_hf(nn::Gpt(qwen3, 1).state_dict(), qwen3);
  EXPECT_EQ(q3t.at("model.layers.1.self_attn.q_norm.weight").shape(), (Shape{6}));
  EXPECT_EQ(q3t.at("model.layers.1.self_attn.k_norm.weight").shape(), (Shape{6}));
  EXPECT_EQ(q3t.at("model.layers.1.self_attn.q_proj.weight").shape(), (Shape{24, 16}));
  EXPECT_EQ(q3t.at("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{12, 16}));
  EXPECT_EQ(q3t.at("model.layers.1.self_attn.o_proj.weight").shape(), (Shape{16, 24}));
  // GPT-2's class has neither.
  nn::GptConfig normed = gpt2(true);
  normed.qk_norm = true;
  try {
    hf_model_type(normed);
    FAIL() << "a GPT-2 with head norms exported";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("model.qk_norm is true"), std::string::npos) << e.what();
  }
  nn::GptConfig wide_gpt2 = gpt2(true);
  wide_gpt2.head_size = 8;
  EXPECT_THROW(hf_model_type(wide_gpt2), NotSupportedError);
  // Weights that do not fit the configured model are named.
  const nn::GptConfig l = llama(false, 2);
  nn::StateDict sd = nn::Gpt(l, 1).state_dict();
  sd["h.1.attn.c_attn.weight"] = sd.at("h.1.attn.c_proj.weight");
  EXPECT_THROW(triad_to_hf(sd, l), ShapeError);
}

// The tokenizer goes along with the export: a file by its kind, a model
// directory's tokenizer files as they are; checked before anything is
// copied.
TEST(HfExport, CopiesTheTokenizerIntoTheExportedDirectory) {
  const std::string fixtures = std::string(TRIAD_SOURCE_DIR) + "/tests/data/fixtures/";
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  testing::TempDir out;
  const std::string sp_dir = out.file("sp");
  EXPECT_EQ(copy_hf_tokenizer(fixtures + "sentencepiece_bpe.model", sp_dir, 700),
            std::vector<std::string>{"tokenizer.model"});
  EXPECT_EQ(bytes(sp_dir + "/tokenizer.model"), bytes(fixtures + "sentencepiece_bpe.model"));
  EXPECT_EQ(copy_hf_tokenizer(fixtures + "tokenizer.json", out.file("hf"), 512),
            std::vector<std::string>{"tokenizer.json"});
  // A model directory: its tokenizer files, not its weights or config.
  testing::TempDir model;
  testing::write_text(model.file("tokenizer.json"), bytes(fixtures + "tokenizer.json"));
  testing::write_text(model.file("tokenizer_config.json"), R"({"model_max_length": 64})");
  testing::write_text(model.file("config.json"), "{}");
  testing::write_text(model.file("model.safetensors"), "not copied");
  testing::write_text(model.file("generation_config.json"), R"({"eos_token_id": [0, 300]})");
  const auto written = copy_hf_tokenizer(model.path().string(), out.file("dir"), 301);
  EXPECT_EQ(written, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json",
                                               "generation_config.json"}));
  EXPECT_EQ(load_hf_stop_tokens(out.file("dir")), (std::vector<int64_t>{0, 300}));
  EXPECT_FALSE(std::filesystem::exists(out.file("dir") + "/config.json"));
  EXPECT_EQ(bytes(out.file("dir") + "/tokenizer_config.json"), R"({"model_max_length": 64})");
  // Ids past the model's vocabulary, a directory without a tokenizer, a
  // file that is not one: refused, nothing written.
  try {
    copy_hf_tokenizer(fixtures + "sentencepiece_bpe.model", out.file("small"), 256);
    FAIL() << "a 700-token tokenizer went with a 256-token model";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("has 700 tokens but the model's vocab_size is 256"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out.file("small")));
  // A generation_config.json whose end token the model does not have.
  testing::write_text(model.file("generation_config.json"), R"({"eos_token_id": [0, 301]})");
  try {
    copy_hf_tokenizer(model.path().string(), out.file("bad_end"), 301);
    FAIL() << "an end token past the vocabulary was copied";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "generation_config.json': eos_token_id 301 is not below the model's vocab_size "
                  "301"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out.file("bad_end")));
  testing::TempDir empty;
  EXPECT_THROW(copy_hf_tokenizer(empty.path().string(), out.file("none"), 700), IoError);
  testing::write_text(empty.file("bogus.model"), "\x0b\x01");
  EXPECT_THROW(copy_hf_tokenizer(empty.file("bogus.model"), out.file("none"), 700), IoError);
  EXPECT_FALSE(std::filesystem::exists(out.file("none")));
}

}  // namespace
}  // namespace triad::io
