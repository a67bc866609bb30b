// LoRA adapters in PEFT's format: each Hugging Face module's B A is its rows
// of Triad's layer's (so the exported base plus the adapter is the merged
// model, module by module), the names are PEFT's, and adapter_config.json
// says what PEFT needs to scale and place them.
#include "triad/io/peft_adapter.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "support/tiny_deepseek.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_export.h"
#include "triad/io/safetensors.h"
#include "triad/ops.h"

namespace triad::io {
namespace {

using triad::testing::expect_error;

nn::GptConfig llama_like() {
  nn::GptConfig c{.n_layer = 2, .n_head = 4, .d_model = 16, .vocab_size = 40, .seq_len = 8};
  c.n_kv_head = 2;
  c.activation = nn::Activation::SwiGlu;
  c.ffn_hidden_size = 24;
  c.normalization = nn::Normalization::RmsNorm;
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.linear_bias = false;
  c.tie_embeddings = false;
  c.lora = {.rank = 3, .alpha = 6, .targets = nn::GptConfig::lora_layers()};
  return c;
}

// A model's state with random adapters (B too).
nn::StateDict random_state(const nn::GptConfig& c) {
  nn::StateDict out;
  uint64_t stream = 1;
  for (const auto& [name, shape] : nn::gpt_parameter_shapes(c))
    out[name] = randn(shape, 9, stream++, 0.3);
  return out;
}

// Each module's base weight plus its adapters' scaled B A is the merged
// model's weight under the export's names: `per_block` modules (A and B
// each) in each block.
void check_modules(const nn::GptConfig& c, const nn::StateDict& base, const nn::StateDict& merged,
                   const nn::StateDict& adapters, size_t per_block) {
  const auto peft = triad_lora_to_peft(adapters, c);
  EXPECT_EQ(peft.size(), static_cast<size_t>(c.n_layer) * per_block * 2);
  const auto hf_base = triad_to_hf(base, c.without_lora());
  const auto hf_merged = triad_to_hf(merged, c.without_lora());
  size_t modules = 0;
  for (const auto& [name, a] : peft) {
    const std::string tail = ".lora_A.weight";
    if (name.size() < tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail))
      continue;
    const std::string module =
        name.substr(std::string("base_model.model.").size(), name.size() - tail.size() - 17);
    const Tensor& b = peft.at("base_model.model." + module + ".lora_B.weight");
    EXPECT_EQ(a.size(0), 3) << module;
    const auto got =
        to_double_vector(add(hf_base.at(module + ".weight"), scale(matmul(b, a), 2.0)));
    const auto want = to_double_vector(hf_merged.at(module + ".weight"));
    ASSERT_EQ(got.size(), want.size()) << module;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << module << i;
    ++modules;
  }
  EXPECT_EQ(modules, static_cast<size_t>(c.n_layer) * per_block);
}

// A state with adapters split three ways: the base weights, the adapters,
// and the weights with the adapters merged in (scale 2, alpha 6 over rank 3).
struct Parts {
  nn::StateDict base, merged, adapters;
};
Parts parts_of(const nn::StateDict& state) {
  Parts p;
  for (const auto& [name, t] : state) {
    if (nn::is_lora_adapter(name)) {
      p.adapters[name] = t;
      continue;
    }
    p.base[name] = t;
    const std::string stem = name.substr(0, name.size() - std::string("weight").size());
    p.merged[name] = state.count(stem + "lora_a") ? nn::merge_lora(t, state.at(stem + "lora_a"),
                                                                   state.at(stem + "lora_b"), 2.0)
                                                  : t;
  }
  return p;
}

TEST(PeftAdapter, EachModulesProductIsItsRowsOfTheMergedLayer) {
  const nn::GptConfig c = llama_like();
  const auto [base, merged, adapters] = parts_of(random_state(c));
  // As LLaMA, then as Phi-3 (the class a Phi-3 read from Hugging Face goes
  // back as), whose fused modules take Triad's layers whole.
  for (const std::string type : {"", "phi3"}) {
    SCOPED_TRACE(type);
    nn::GptConfig as = c;
    as.hf_type = type;
    check_modules(as, base, merged, adapters, type.empty() ? 7 : 4);
  }
  const auto peft = triad_lora_to_peft(adapters, c);
  EXPECT_TRUE(peft.count("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"));
  EXPECT_EQ(peft.at("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight").shape(),
            (Shape{8, 3}));  // two key/value heads of 4
  EXPECT_EQ(peft.at("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight").shape(),
            (Shape{24, 3}));

  const auto config = nlohmann::json::parse(peft_adapter_config_json(c, "/models/base"));
  EXPECT_EQ(config.at("peft_type"), "LORA");
  EXPECT_EQ(config.at("r"), 3);
  EXPECT_EQ(config.at("lora_alpha"), 6.0);
  EXPECT_EQ(config.at("fan_in_fan_out"), false);
  EXPECT_EQ(config.at("lora_dropout"), 0.0);
  nn::GptConfig dropped = c;
  dropped.lora.dropout = 0.05;
  EXPECT_EQ(nlohmann::json::parse(peft_adapter_config_json(dropped, "/m")).at("lora_dropout"),
            0.05);
  EXPECT_EQ(config.at("base_model_name_or_path"), "/models/base");
  EXPECT_EQ(config.at("target_modules"),
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"}));
  // Phi-3's: its fused modules, B whole.
  nn::GptConfig phi3 = c;
  phi3.hf_type = "phi3";
  EXPECT_EQ(nlohmann::json::parse(peft_adapter_config_json(phi3, "/m")).at("target_modules"),
            (std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  const auto fused = triad_lora_to_peft(adapters, phi3);
  EXPECT_EQ(fused.at("base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight").shape(),
            (Shape{32, 3}));  // q 16, k and v 8 each
  EXPECT_EQ(fused.at("base_model.model.model.layers.0.mlp.gate_up_proj.lora_B.weight").shape(),
            (Shape{48, 3}));
}

// DeepSeek's latent attention (DeepseekV3ForCausalLM): a module for each of
// its layers, named as Hugging Face's, B's rope rows (each query head's and
// the shared key's) in the files' interleaved pairs as their weights' are:
// the exported base plus each module's B A is the merged model's weight.
TEST(PeftAdapter, LatentAttentionModulesAreDeepSeeksWithTheirRopeRowsInterleaved) {
  nn::GptConfig c = llama_like();
  c.n_kv_head = 0;
  c.mla = testing::tiny_latent_attention();
  c.moe = testing::tiny_deepseek_mixture();
  c.lora.targets = {"attn.q_a_proj", "attn.q_b_proj", "attn.kv_a_proj", "attn.kv_b_proj",
                    "attn.c_proj"};
  c.validate();
  EXPECT_EQ(std::string(hf_model_type(c)), "deepseek_v3");
  const auto [base, merged, adapters] = parts_of(random_state(c));
  check_modules(c, base, merged, adapters, 5);
  EXPECT_EQ(nlohmann::json::parse(peft_adapter_config_json(c, "/m")).at("target_modules"),
            (std::vector<std::string>{"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
                                      "o_proj"}));
  const auto peft = triad_lora_to_peft(adapters, c);
  EXPECT_EQ(
      peft.at("base_model.model.model.layers.1.self_attn.kv_a_proj_with_mqa.lora_B.weight").shape(),
      (Shape{10, 3}));  // the key latent of 6 and the shared rotated key of 4
}

// GPT-NeoX's modules take each layer's pair whole, query_key_value's B with
// its rows interleaved by head as the weight's are: the exported base plus
// each module's B A is still the merged model's weight.
TEST(PeftAdapter, GptNeoxModulesTakeEachLayerWholeWithQueryKeyValuesRowsByHead) {
  nn::GptConfig c{.n_layer = 2, .n_head = 4, .d_model = 16, .vocab_size = 40, .seq_len = 8};
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.parallel_residual = true;
  c.activation = nn::Activation::GeluErf;
  c.tie_embeddings = false;
  c.lora = {.rank = 3, .alpha = 6, .targets = nn::GptConfig::lora_layers()};
  ASSERT_STREQ(hf_model_type(c), "gpt_neox");
  const auto [base, merged, adapters] = parts_of(random_state(c));
  check_modules(c, base, merged, adapters, 4);
  EXPECT_EQ(
      nlohmann::json::parse(peft_adapter_config_json(c, "/m")).at("target_modules"),
      (std::vector<std::string>{"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}));
  const auto peft = triad_lora_to_peft(adapters, c);
  EXPECT_EQ(
      peft.at("base_model.model.gpt_neox.layers.1.attention.query_key_value.lora_B.weight").shape(),
      (Shape{48, 3}));
}

// Phi's, Falcon's, GPT-J's and StarCoder2's modules: Phi's q_proj, k_proj,
// v_proj, dense, fc1 and fc2; Falcon's query_key_value with B's rows grouped
// by key/value head; GPT-J's q_proj, k_proj and v_proj with B's q and k rows
// back in interleaved pairs, out_proj, fc_in and fc_out; StarCoder2's
// LLaMA-named attention with its own c_fc and c_proj; Nemotron's the same
// attention with its ungated up_proj and down_proj; Cohere's LLaMA names
// with B's q and k rows in interleaved pairs; GLM-4's the same with the
// rotated half of each head's rows so and gate_up_proj fused. The exported
// base plus
// each module's B A is the merged model's weight in each.
TEST(PeftAdapter, PhiFalconAndGptjModulesAreTheirClasses) {
  nn::GptConfig phi{.n_layer = 2, .n_head = 4, .d_model = 16, .vocab_size = 40, .seq_len = 8};
  phi.n_kv_head = 2;
  phi.position_embedding = nn::PositionEmbedding::Rotary;
  phi.rope_dim = 2;
  phi.parallel_residual = phi.shared_norm = phi.head_bias = true;
  phi.tie_embeddings = false;
  phi.lora = {.rank = 3, .alpha = 6, .targets = nn::GptConfig::lora_layers()};
  nn::GptConfig falcon = phi;
  falcon.shared_norm = falcon.head_bias = false;
  falcon.rope_dim = 0;
  falcon.linear_bias = false;
  nn::GptConfig gptj = phi;
  gptj.n_kv_head = 0;
  gptj.linear_bias = false;
  gptj.mlp_bias = true;
  nn::GptConfig codegen = gptj;  // q, k and v fused in 4 shards (one head each)
  codegen.hf_type = "codegen";
  nn::GptConfig starcoder2 = falcon;  // the sequential block: LLaMA's attention, c_fc, c_proj
  starcoder2.parallel_residual = false;
  starcoder2.linear_bias = true;
  nn::GptConfig nemotron = starcoder2;  // LayerNorm1P, squared ReLU: up_proj, down_proj
  nemotron.norm_weight_offset = true;
  nemotron.activation = nn::Activation::Relu2;
  nemotron.rope_dim = 2;
  nn::GptConfig arcee = falcon;  // LLaMA's blocks with that ungated MLP
  arcee.parallel_residual = arcee.shared_norm = false;
  arcee.normalization = nn::Normalization::RmsNorm;
  arcee.activation = nn::Activation::Relu2;
  nn::GptConfig cohere = falcon;  // one norm without a bias, SwiGLU, grouped heads
  cohere.shared_norm = true;
  cohere.norm_bias = false;
  cohere.activation = nn::Activation::SwiGlu;
  cohere.ffn_hidden_size = 24;
  nn::GptConfig glm4 = falcon;  // q, k and v biases, half of each head turned, four norms
  glm4.parallel_residual = false;
  glm4.normalization = nn::Normalization::RmsNorm;
  glm4.activation = nn::Activation::SwiGlu;
  glm4.ffn_hidden_size = 24;
  glm4.qkv_bias = true;
  glm4.rope_dim = 2;
  glm4.post_norms = true;
  for (const auto& [c, type, targets] :
       {std::tuple{phi, "phi",
                   std::vector<std::string>{"q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"}},
        std::tuple{
            falcon, "falcon",
            std::vector<std::string>{"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}},
        std::tuple{
            gptj, "gptj",
            std::vector<std::string>{"q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"}},
        std::tuple{codegen, "codegen",
                   std::vector<std::string>{"qkv_proj", "out_proj", "fc_in", "fc_out"}},
        std::tuple{
            starcoder2, "starcoder2",
            std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"}},
        std::tuple{nemotron, "nemotron",
                   std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "up_proj",
                                            "down_proj"}},
        std::tuple{arcee, "arcee",
                   std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "up_proj",
                                            "down_proj"}},
        std::tuple{cohere, "cohere",
                   std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                            "up_proj", "down_proj"}},
        std::tuple{glm4, "glm4",
                   std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj",
                                            "down_proj"}}}) {
    SCOPED_TRACE(type);
    ASSERT_STREQ(hf_model_type(c), type);
    const auto [base, merged, adapters] = parts_of(random_state(c));
    check_modules(c, base, merged, adapters, targets.size());
    EXPECT_EQ(nlohmann::json::parse(peft_adapter_config_json(c, "/m")).at("target_modules"),
              targets);
  }
}

// A mixture's experts (model.lora.targets mlp.c_fc, mlp.c_proj): every
// expert's modules and the shared expert's as each class names them, a
// dense layer's as LLaMA's; the exported base plus each module's B A is the
// merged model's weight. Granite MoE's fused experts have no PEFT form.
TEST(PeftAdapter, ExpertModulesAreEachClassesOwn) {
  nn::GptConfig mixtral = llama_like();
  mixtral.n_layer = 1;
  mixtral.moe = {.experts = 3, .top_k = 2, .ffn_hidden_size = 6};
  mixtral.lora.targets = {"attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  mixtral.validate();
  nn::GptConfig qwen2 = mixtral;  // a shared expert under a gate, q, k and v biases
  qwen2.hf_type = "qwen2_moe";
  qwen2.qkv_bias = true;
  qwen2.moe.normalize_top_k = false;
  qwen2.moe.shared_ffn_hidden_size = 8;
  qwen2.moe.shared_gate = true;
  nn::GptConfig deepseek = llama_like();  // a dense layer, then experts and shared ones
  deepseek.n_kv_head = 0;
  deepseek.mla = testing::tiny_latent_attention();
  deepseek.moe = testing::tiny_deepseek_mixture();
  deepseek.lora.targets = {"attn.kv_b_proj", "mlp.c_fc", "mlp.c_proj"};
  nn::GptConfig m2 = mixtral;  // Mixtral's names; norms over all the heads, a biased sigmoid
  m2.hf_type = "minimax_m2";
  nn::set_qk_norm(m2, "full");
  m2.moe.score = nn::GptConfig::Moe::Score::Sigmoid;
  m2.moe.expert_bias = true;
  for (const auto& [c, type, targets, modules, probe, shape] :
       {std::tuple{mixtral, "mixtral", std::vector<std::string>{"o_proj", "w1", "w3", "w2"},
                   size_t{1 + 3 * 3}, "model.layers.0.block_sparse_moe.experts.2.w3.lora_B",
                   Shape{6, 3}},
        std::tuple{m2, "minimax_m2", std::vector<std::string>{"o_proj", "w1", "w3", "w2"},
                   size_t{1 + 3 * 3}, "model.layers.0.block_sparse_moe.experts.1.w1.lora_A",
                   Shape{3, 16}},
        std::tuple{qwen2, "qwen2_moe",
                   std::vector<std::string>{"o_proj", "gate_proj", "up_proj", "down_proj"},
                   size_t{1 + 3 * 3 + 3}, "model.layers.0.mlp.shared_expert.up_proj.lora_B",
                   Shape{8, 3}},
        std::tuple{deepseek, "deepseek_v3",
                   std::vector<std::string>{"kv_b_proj", "gate_proj", "up_proj", "down_proj"},
                   size_t{0}, "model.layers.1.mlp.shared_experts.down_proj.lora_A",
                   Shape{3, 12}}}) {
    SCOPED_TRACE(type);
    ASSERT_STREQ(hf_model_type(c), type);
    const auto [base, merged, adapters] = parts_of(random_state(c));
    if (modules > 0) check_modules(c, base, merged, adapters, modules);
    const auto peft = triad_lora_to_peft(adapters, c);
    ASSERT_TRUE(peft.count("base_model.model." + std::string(probe) + ".weight")) << probe;
    EXPECT_EQ(peft.at("base_model.model." + std::string(probe) + ".weight").shape(), shape);
    EXPECT_EQ(nlohmann::json::parse(peft_adapter_config_json(c, "/m")).at("target_modules"),
              targets);
    EXPECT_EQ(peft_adapter_unsupported(c), "");
  }
  // DeepSeek's blocks differ (a dense first layer: kv_b_proj and three MLP
  // modules; then kv_b_proj, four experts' three and the shared experts'
  // three), so its modules are counted here.
  {
    const auto [base, merged, adapters] = parts_of(random_state(deepseek));
    const auto peft = triad_lora_to_peft(adapters, deepseek);
    EXPECT_EQ(peft.size(), 2u * ((1 + 3) + (1 + 4 * 3 + 3)));
    EXPECT_TRUE(peft.count("base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"));
    EXPECT_TRUE(
        peft.count("base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight"));
  }
  nn::GptConfig granite = mixtral;
  granite.hf_type = "granitemoe";
  ASSERT_STREQ(hf_model_type(granite), "granitemoe");
  const auto [base, merged, adapters] = parts_of(random_state(granite));
  expect_error([&] { triad_lora_to_peft(adapters, granite); },
               {"model_type granitemoe holds its experts fused", "merged into the weights only"});
  EXPECT_NE(peft_adapter_unsupported(granite), "");
  granite.lora.targets = {"attn.c_proj"};  // the attention's alone: PEFT's modules
  EXPECT_EQ(peft_adapter_unsupported(granite), "");
  // A mixture no class holds (Qwen2-MoE's gated shared expert without its
  // q, k and v biases) has no modules to name, adapters on its experts or
  // not.
  nn::GptConfig none = qwen2;
  none.qkv_bias = false;
  none.lora.targets = {"attn.c_proj"};
  EXPECT_NE(peft_adapter_unsupported(none).find("no Hugging Face class holds"), std::string::npos)
      << peft_adapter_unsupported(none);
}

TEST(PeftAdapter, Gpt2KeepsItsConv1DLayersAndTheFilesRoundTrip) {
  nn::GptConfig c{.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 20, .seq_len = 8};
  c.lora = {.rank = 2, .alpha = 0, .targets = {"attn.c_attn", "mlp.c_proj"}};
  nn::StateDict adapters;
  for (auto& [name, t] : random_state(c)) {
    if (nn::is_lora_adapter(name)) adapters[name] = t;
  }
  const auto peft = triad_lora_to_peft(adapters, c);
  ASSERT_EQ(peft.size(), 8u);
  EXPECT_EQ(to_double_vector(peft.at("base_model.model.transformer.h.1.attn.c_attn.lora_B.weight")),
            to_double_vector(adapters.at("h.1.attn.c_attn.lora_b")));
  EXPECT_EQ(peft.at("base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight").shape(),
            (Shape{2, 32}));
  triad::testing::TempDir dir;
  save_peft_adapter(adapters, c, dir.file("adapter"), "", DType::BF16);
  const auto file = load_safetensors(dir.file("adapter/adapter_model.safetensors"));
  ASSERT_EQ(file.tensors.size(), 8u);
  for (const auto& [name, t] : peft) {
    EXPECT_EQ(file.tensors.at(name).dtype(), DType::BF16) << name;
    EXPECT_EQ(to_double_vector(file.tensors.at(name)), to_double_vector(cast(t, DType::BF16)));
  }
  std::ifstream in(dir.file("adapter/adapter_config.json"));
  const auto config = nlohmann::json::parse(in);
  EXPECT_EQ(config.at("lora_alpha"), 2.0);  // alpha 0: the rank
  EXPECT_EQ(config.at("fan_in_fan_out"), true);
  EXPECT_EQ(config.at("target_modules"), (std::vector<std::string>{"attn.c_attn", "mlp.c_proj"}));
}

// The way back (init.adapter): an adapter written by save_peft_adapter reads
// back, and merged into the exported base model's file as it is read gives
// the model with the adapters merged in: LLaMA's split modules (q, k and v
// each with the one A), Mixtral's experts, and GPT-2's Conv1D layers
// (fan_in_fan_out: the delta transposed).
TEST(PeftAdapter, ReadBackAndMergedIntoTheBaseFileGivesTheMergedModel) {
  nn::GptConfig mixtral = llama_like();
  mixtral.n_layer = 1;
  mixtral.moe = {.experts = 3, .top_k = 2, .ffn_hidden_size = 6};
  mixtral.lora.targets = {"attn.c_attn", "mlp.c_fc", "mlp.c_proj"};
  nn::GptConfig gpt2{.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 20, .seq_len = 8};
  gpt2.lora = {.rank = 2, .alpha = 6, .targets = {"attn.c_attn", "mlp.c_proj"}};
  for (const nn::GptConfig& c : {llama_like(), mixtral, gpt2}) {
    SCOPED_TRACE(hf_model_type(c));
    const double s = c.lora_scale();
    nn::StateDict base, merged, adapters;
    for (const auto& [name, t] : random_state(c)) {
      if (nn::is_lora_adapter(name)) {
        adapters[name] = t;
      } else {
        base[name] = t;
      }
    }
    for (const auto& [name, t] : base) {
      const std::string stem = name.substr(0, name.size() - std::string("weight").size());
      merged[name] =
          adapters.count(stem + "lora_a")
              ? nn::merge_lora(t, adapters.at(stem + "lora_a"), adapters.at(stem + "lora_b"), s)
              : t;
    }
    triad::testing::TempDir dir;
    save_safetensors(dir.file("base.safetensors"), triad_to_hf(base, c.without_lora()));
    save_peft_adapter(adapters, c, dir.file("adapter"));
    const PeftDeltas deltas = read_peft_adapter(dir.file("adapter"));
    EXPECT_DOUBLE_EQ(deltas.scale, s);
    WeightLayout layout = weight_layout(c.without_lora());
    layout.adapter = &deltas;
    const nn::StateDict got = load_gpt2_state_dict(
        dir.file("base.safetensors"), nn::gpt_parameter_shapes(c.without_lora()), nullptr, layout);
    ASSERT_EQ(got.size(), merged.size());
    size_t changed = 0;
    for (const auto& [name, want] : merged) {
      const auto g = to_double_vector(got.at(name)), w = to_double_vector(want);
      ASSERT_EQ(g.size(), w.size()) << name;
      for (size_t i = 0; i < g.size(); ++i)
        ASSERT_NEAR(g[i], w[i], 1e-5 * (1 + std::abs(w[i]))) << name << " " << i;
      changed += to_double_vector(base.at(name)) != w ? 1 : 0;
    }
    EXPECT_EQ(changed, adapters.size() / 2);
  }
}

// What init.adapter cannot merge is named: DoRA, per-module ranks, an
// adapter for another model (a module the file lacks, or of another shape).
TEST(PeftAdapter, AdaptersThatCannotBeMergedAreNamed) {
  const nn::GptConfig c = llama_like();
  nn::StateDict base, adapters;
  for (const auto& [name, t] : random_state(c))
    (nn::is_lora_adapter(name) ? adapters : base)[name] = t;
  triad::testing::TempDir dir;
  save_safetensors(dir.file("base.safetensors"), triad_to_hf(base, c.without_lora()));
  save_peft_adapter(adapters, c, dir.file("adapter"));
  const std::string config = dir.file("adapter/adapter_config.json");
  const auto edit = [&](const std::function<void(nlohmann::json&)>& change) {
    std::ifstream in(config);
    nlohmann::json j = nlohmann::json::parse(in);
    in.close();
    change(j);
    std::ofstream(config) << j.dump(2);
  };
  edit([](nlohmann::json& j) { j["use_dora"] = true; });
  expect_error([&] { read_peft_adapter(dir.file("adapter")); }, {"use_dora", "DoRA"});
  edit([](nlohmann::json& j) {
    j["use_dora"] = false;
    j["rank_pattern"] = {{"q_proj", 8}};
  });
  expect_error([&] { read_peft_adapter(dir.file("adapter")); }, {"rank_pattern"});
  edit([](nlohmann::json& j) { j["rank_pattern"] = nlohmann::json::object(); });
  expect_error([&] { read_peft_adapter(dir.file("missing")); }, {"cannot read", "missing"});
  // Keys of another type are named (the JSON library's type_error escaped),
  // and so is a module whose rank is not r.
  edit([](nlohmann::json& j) { j["peft_type"] = 3; });
  expect_error([&] { read_peft_adapter(dir.file("adapter")); }, {"peft_type (3) must be a string"});
  edit([](nlohmann::json& j) {
    j["peft_type"] = "LORA";
    j["use_rslora"] = "no";
  });
  expect_error([&] { read_peft_adapter(dir.file("adapter")); },
               {"use_rslora (\"no\") must be true or false"});
  // lora_alpha of another type is named; absent, it is PEFT's default of 8
  // (the file says 2 x the rank: without it the scale is 8 / r).
  edit([](nlohmann::json& j) {
    j["use_rslora"] = false;
    j["lora_alpha"] = "16";
  });
  expect_error([&] { read_peft_adapter(dir.file("adapter")); },
               {"lora_alpha (\"16\") must be a number"});
  edit([](nlohmann::json& j) { j.erase("lora_alpha"); });
  EXPECT_DOUBLE_EQ(read_peft_adapter(dir.file("adapter")).scale, 8.0 / c.lora.rank);
  edit([](nlohmann::json& j) {
    j["lora_alpha"] = nullptr;
    j["use_rslora"] = true;
  });
  EXPECT_DOUBLE_EQ(read_peft_adapter(dir.file("adapter")).scale, 8.0 / std::sqrt(c.lora.rank));
  edit([](nlohmann::json& j) {
    j["use_rslora"] = false;
    j["r"] = j["r"].get<int>() + 1;
  });
  expect_error([&] { read_peft_adapter(dir.file("adapter")); },
               {"has lora_A [" + std::to_string(c.lora.rank) + ", ",
                "r = " + std::to_string(c.lora.rank + 1) + " as adapter_config.json says"});
  edit([](nlohmann::json& j) { j["r"] = j["r"].get<int>() - 1; });
  EXPECT_NO_THROW(read_peft_adapter(dir.file("adapter")));
  std::filesystem::create_directories(dir.file("listed"));
  std::ofstream(dir.file("listed/adapter_config.json")) << "[\"LORA\"]";
  expect_error([&] { read_peft_adapter(dir.file("listed")); }, {"is not a JSON object"});
  // For a model of three layers where the base has two: block 2's modules
  // match nothing in the file.
  nn::GptConfig deeper = c;
  deeper.n_layer = 3;
  nn::StateDict more;
  for (const auto& [name, t] : random_state(deeper))
    if (nn::is_lora_adapter(name)) more[name] = t;
  save_peft_adapter(more, deeper, dir.file("deeper"));
  PeftDeltas deltas = read_peft_adapter(dir.file("deeper"));
  WeightLayout layout = weight_layout(c.without_lora());
  layout.adapter = &deltas;
  const auto expected = nn::gpt_parameter_shapes(c.without_lora());
  expect_error(
      [&] { load_gpt2_state_dict(dir.file("base.safetensors"), expected, nullptr, layout); },
      {"module 'model.layers.2.", "adapts no weight", "another model"});
  // A module whose product is not its weight's shape.
  deltas = read_peft_adapter(dir.file("adapter"));
  deltas.modules.at("model.layers.0.mlp.up_proj").second = zeros({5, 3});
  expect_error(
      [&] { load_gpt2_state_dict(dir.file("base.safetensors"), expected, nullptr, layout); },
      {"module 'model.layers.0.mlp.up_proj' changes a weight of [5, 16]", "[24, 16]"});
}

TEST(PeftAdapter, MissingAdaptersAndModelsWithoutThemAreNamed) {
  nn::GptConfig c = llama_like();
  nn::StateDict adapters;
  for (auto& [name, t] : random_state(c)) {
    if (nn::is_lora_adapter(name) && name != "h.1.mlp.c_fc.lora_b") adapters[name] = t;
  }
  expect_error([&] { triad_lora_to_peft(adapters, c); }, {"missing 'h.1.mlp.c_fc.lora_b'"});
  adapters["h.1.mlp.c_fc.lora_b"] = zeros({5, 3});
  expect_error([&] { triad_lora_to_peft(adapters, c); },
               {"'h.1.mlp.c_fc.lora_b' is [5, 3], the model's [48, 3]"});
  expect_error([&] { triad_lora_to_peft(adapters, c.without_lora()); }, {"no LoRA adapters"});
}

}  // namespace
}  // namespace triad::io
