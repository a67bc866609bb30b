// Triad vs PyTorch on a random GPT-2 (CTest label "parity"). The reference
// files come from gpt2_reference.py, run by CTest as a fixture before this.
//
// Tolerances (fp32 on both sides, different summation orders):
//   logits     |a - b| <= 1e-5
//   loss       relative 1e-6
//   gradients  |a - b| <= 1e-6 + 1e-4 |b|
//   10 losses of training (AdamW, decay, clipping, accumulation) relative 1e-5
//   greedy generation: the same tokens
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "support/temp_dir.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/core/rope_scaling.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_config.h"
#include "triad/io/hf_export.h"
#include "triad/io/safetensors.h"
#include "triad/io/torch_checkpoint.h"
#include "triad/nn/evaluate.h"
#include "triad/nn/generate.h"
#include "triad/nn/moe.h"
#include "triad/ops.h"
#include "triad/train/trainer.h"

namespace triad {
namespace {

// The largest |a[i] - b[i]| over two lists of one length.
double worst_difference(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// How far `model`'s logits on the reference's input are from the
// reference's logits under `prefix`: a model that departs from the
// reference's must land away from them.
double logits_away_from(const nn::Gpt& model, const std::map<std::string, Tensor>& ref,
                        const std::string& prefix) {
  return worst_difference(to_double_vector(model.forward(cast(ref.at("input_ids"), DType::I64))),
                          to_double_vector(ref.at(prefix + "logits")));
}

std::string ref_dir() {
  const char* d = std::getenv("TRIAD_PARITY_REFERENCE");
  return d ? d : "";
}

class Gpt2Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* why = std::getenv("TRIAD_PARITY_UNAVAILABLE")) GTEST_SKIP() << why;
    ASSERT_FALSE(ref_dir().empty()) << "TRIAD_PARITY_REFERENCE is not set";
    std::ifstream in(ref_dir() + "/config.json");
    ASSERT_TRUE(in) << "missing " << ref_dir()
                    << "/config.json (the reference fixture did not run)";
    cfg_ = nlohmann::json::parse(in);
    model_cfg_.n_layer = cfg_["model"]["n_layer"];
    model_cfg_.n_head = cfg_["model"]["n_head"];
    model_cfg_.d_model = cfg_["model"]["d_model"];
    model_cfg_.vocab_size = cfg_["model"]["vocab_size"];
    model_cfg_.seq_len = cfg_["model"]["seq_len"];
    ref_ = io::load_safetensors(ref_dir() + "/reference.safetensors").tensors;
  }
  nlohmann::json cfg_;
  nn::GptConfig model_cfg_;

  // The reference's LLaMA-style model: rotary embeddings, SwiGLU, RMSNorm,
  // no linear biases, an untied head, grouped-query attention.
  nn::GptConfig llama_style() const {
    nn::GptConfig cfg = model_cfg_;
    cfg.n_kv_head = cfg_["llama_kv_heads"];
    cfg.position_embedding = nn::PositionEmbedding::Rotary;
    cfg.rope_theta = cfg_["rope_theta"];
    cfg.activation = nn::Activation::SwiGlu;
    cfg.ffn_hidden_size = cfg_["swiglu_ffn"];
    cfg.normalization = nn::Normalization::RmsNorm;
    cfg.linear_bias = false;
    cfg.tie_embeddings = false;
    return cfg;
  }
  // Qwen2's: LLaMA's with biases on q, k and v, and a tied head.
  nn::GptConfig qwen2_style() const {
    nn::GptConfig cfg = llama_style();
    cfg.qkv_bias = true;
    cfg.tie_embeddings = true;
    return cfg;
  }
  // The reference's rope_scaling entry `key` (Hugging Face's keys), read
  // through the table the config readers use.
  RopeScaling scaling(const std::string& key, RopeScaling::Kind kind) const {
    RopeScaling r;
    r.kind = kind;
    for (const auto& k : rope_scaling_keys(kind)) {
      if (cfg_[key].contains(k.name)) r.*k.field = cfg_[key][k.name].get<double>();
    }
    return r;
  }
  std::map<std::string, Tensor> ref_;
  // The reference's training run (its schedule, AdamW's settings, clipping
  // and accumulation over its token shard) of `model` from `weights`.
  train::Config reference_run(const nn::GptConfig& model, const std::string& weights) const {
    const auto& t = cfg_["train"];
    train::Config c;
    c.model = model;
    c.train.steps = t["steps"];
    c.train.global_batch_size = t["global_batch_size"];
    c.train.micro_batch_size = t["micro_batch_size"];
    c.train.lr = t["lr"];
    c.train.min_lr = t["min_lr"];
    c.train.warmup_steps = t["warmup_steps"];
    c.train.weight_decay = t["weight_decay"];
    c.train.beta1 = t["beta1"];
    c.train.beta2 = t["beta2"];
    c.train.eps = t["eps"];
    c.train.grad_clip = t["grad_clip"];
    c.data_train = {{ref_dir() + "/train.bin"}};
    c.init_from = ref_dir() + "/" + weights;
    return c;
  }
};

TEST_F(Gpt2Parity, LogitsLossAndEveryGradientAtStepZero) {
  nn::Gpt model(model_cfg_, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/model.safetensors");
  Tensor ids = cast(ref_.at("input_ids"), DType::I64);
  Tensor targets = cast(ref_.at("targets"), DType::I64);
  Tensor logits = model.forward(ids);
  auto got = to_double_vector(logits), want = to_double_vector(ref_.at("logits"));
  ASSERT_EQ(got.size(), want.size());
  const double worst = worst_difference(got, want);
  EXPECT_LE(worst, 1e-5) << "max |logits diff|";

  Tensor loss = cross_entropy(logits, targets);
  const double ref_loss = item(ref_.at("loss"));
  EXPECT_NEAR(item(loss), ref_loss, 1e-6 * ref_loss);
  autograd::backward({loss});

  auto grads = io::triad_to_gpt2([&] {
    nn::StateDict g;
    for (auto& [name, p] : model.named_parameters()) g[name] = p.grad();
    return g;
  }());
  int checked = 0;
  for (auto& [name, g] : grads) {
    auto a = to_double_vector(g), b = to_double_vector(ref_.at("grad." + name));
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], 1e-6 + 1e-4 * std::abs(b[i])) << name << "[" << i << "]";
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 12 * model_cfg_.n_layer + 2);
}

// Every trainable parameter's gradient (after backward) against the
// reference's entries prefix + "grad." + GPT-2's name.
void expect_gradients_match(const nn::Gpt& model, const std::map<std::string, Tensor>& ref,
                            const std::string& prefix) {
  nn::StateDict g;
  int trainable = 0;
  for (auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;  // (state: a mixture's expert biases)
    g[name] = p.grad();
    ++trainable;
  }
  int checked = 0;
  for (auto& [name, grad] : io::triad_to_gpt2(g)) {
    const auto a = to_double_vector(grad), b = to_double_vector(ref.at(prefix + "grad." + name));
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-6 + 1e-4 * std::abs(b[i])) << name << "[" << i << "]";
    ++checked;
  }
  EXPECT_EQ(checked, trainable);
  EXPECT_GT(checked, 0);
}

// A model's logits, loss and every gradient on the step-0 micro-batch
// against the reference's entries under `prefix`.
void expect_step_zero_matches(const nn::Gpt& model, const std::map<std::string, Tensor>& ref,
                              const std::string& prefix) {
  Tensor ids = cast(ref.at("input_ids"), DType::I64);
  Tensor targets = cast(ref.at("targets"), DType::I64);
  Tensor logits = model.forward(ids);
  auto got = to_double_vector(logits), want = to_double_vector(ref.at(prefix + "logits"));
  ASSERT_EQ(got.size(), want.size());
  const double worst = worst_difference(got, want);
  EXPECT_LE(worst, 1e-5) << "max |logits diff|";
  Tensor loss = cross_entropy(logits, targets);
  const double ref_loss = item(ref.at(prefix + "loss"));
  EXPECT_NEAR(item(loss), ref_loss, 1e-6 * ref_loss);
  autograd::backward({loss});
  expect_gradients_match(model, ref, prefix);
}

// Multi-token prediction's step 0 (the reference's record_step_zero with
// prediction modules): the loss is the next token's, each depth's loss is
// the reference's, and every gradient is the whole objective's.
void expect_mtp_step_zero_matches(const nn::Gpt& model, const std::map<std::string, Tensor>& ref,
                                  const std::string& prefix) {
  const Tensor ids = cast(ref.at("input_ids"), DType::I64);
  const Tensor targets = cast(ref.at("targets"), DType::I64);
  nn::ForwardContext ctx;
  ctx.mtp_stats = std::make_shared<nn::LossSums>();
  const Tensor loss = model.loss(ids, targets, ctx);
  const double ref_loss = item(ref.at(prefix + "loss"));
  EXPECT_NEAR(item(loss), ref_loss, 1e-6 * ref_loss);
  const std::vector<double> want = to_double_vector(ref.at(prefix + "mtp_losses"));
  const std::vector<double> depths = ctx.mtp_stats->host_sums(static_cast<int64_t>(want.size()));
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(depths[k], want[k], 1e-6 * want[k]) << k;
  autograd::backward({loss});
  expect_gradients_match(model, ref, prefix);
}

// Greedy generation by `cfg`'s model with the reference's generator weights
// `file` picks the reference's tokens `key` after its prompt (past seq_len:
// key/value-cache steps, then windows of seq_len tokens).
// `model`, read from the Hugging Face directory `dir`, exported again: every
// key of dir's config.json with its value, and every weight of its
// model.safetensors bit for bit under its name, nothing more; `buffer`
// names the tensors the directory holds that are no weights (left out).
void expect_exports_as_written(
    const nn::Gpt& model, const std::string& dir,
    const std::function<bool(const std::string&)>& buffer =
        [](const std::string&) { return false; },
    const std::set<std::string>& keys_apart = {}) {
  testing::TempDir out;
  io::save_hf_model(model.state_dict(), model.config(), out.file("hf"));
  auto json_of = [](const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json want = json_of(dir + "/config.json"),
                       got = json_of(out.file("hf/config.json"));
  for (const auto& [key, value] : want.items()) {
    SCOPED_TRACE(key);
    if (keys_apart.count(key)) continue;
    ASSERT_TRUE(got.contains(key));
    if (value.is_number_float()) {
      EXPECT_DOUBLE_EQ(got.at(key).get<double>(), value.get<double>());
    } else {
      EXPECT_EQ(got.at(key), value);
    }
  }
  const io::Safetensors theirs = io::load_safetensors(dir + "/model.safetensors"),
                        ours = io::load_safetensors(out.file("hf/model.safetensors"));
  size_t weights = 0;
  for (const auto& [name, t] : theirs.tensors) {
    if (buffer(name)) continue;
    ++weights;
    ASSERT_TRUE(ours.tensors.count(name)) << name;
    EXPECT_EQ(to_double_vector(ours.tensors.at(name)), to_double_vector(t)) << name;
  }
  EXPECT_EQ(ours.tensors.size(), weights);
}

// The reference's tensors with its gradients of c_attn (the weight in
// GPT-2's Conv1D layout, [in, out], and the bias), whose q's and k's heads
// (their first cfg.rope_dim rows, or all) are in Cohere's and GLM's
// interleaved order, in Triad's halves.
std::map<std::string, Tensor> with_halves_gradients(const std::map<std::string, Tensor>& ref,
                                                    const nn::GptConfig& cfg,
                                                    const std::string& prefix) {
  std::map<std::string, Tensor> out = ref;
  const int64_t D = cfg.head_dim(), Q = cfg.q_width(), KV = cfg.kv_heads() * D, r = cfg.rope_dim;
  auto halves = [&](const Tensor& rows) {
    return concat({io::interleaved_head_rows(narrow(rows, 0, 0, Q), cfg.n_head, true, r),
                   io::interleaved_head_rows(narrow(rows, 0, Q, KV), cfg.kv_heads(), true, r),
                   contiguous(narrow(rows, 0, Q + KV, KV))},
                  0);
  };
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string key = prefix + "grad.h." + std::to_string(i) + ".attn.c_attn.weight";
    out[key] = contiguous(transpose(halves(contiguous(transpose(ref.at(key), 0, 1))), 0, 1));
    const std::string bias = prefix + "grad.h." + std::to_string(i) + ".attn.c_attn.bias";
    if (ref.count(bias)) out[bias] = contiguous(halves(ref.at(bias)));
    // Command R+'s head norms, (heads, D) in Cohere's order: one vector,
    // each head's features in Triad's halves.
    for (const char* norm : {"q_norm", "k_norm"}) {
      const std::string name = prefix + "grad.h." + std::to_string(i) + ".attn." + norm + ".weight";
      auto it = ref.find(name);
      if (it == ref.end() || it->second.dim() != 2) continue;
      out[name] = io::interleaved_head_rows(reshape(contiguous(it->second), {it->second.numel()}),
                                            it->second.size(0), true);
    }
  }
  return out;
}

void expect_greedy_tokens(const nn::GptConfig& cfg, const std::string& file, const std::string& key,
                          const std::map<std::string, Tensor>& ref) {
  nn::Gpt gen(cfg, 1);
  io::load_gpt2_safetensors(gen, ref_dir() + "/" + file);
  std::vector<int64_t> prompt, tokens;
  for (double v : to_double_vector(ref.at("greedy_prompt"))) prompt.push_back(int64_t(v));
  for (double v : to_double_vector(ref.at(key))) tokens.push_back(int64_t(v));
  nn::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = static_cast<int64_t>(tokens.size());
  EXPECT_EQ(nn::generate(gen, prompt, o), tokens) << file;
}

// How far the logits of `model`'s weights under `changed` (the same
// parameters, another config) are from the reference's `prefix` logits.
double logits_away_under(const nn::GptConfig& changed, const nn::Gpt& model,
                         const std::map<std::string, Tensor>& ref, const std::string& prefix) {
  nn::Gpt other(changed, 1);
  other.load_state_dict(model.state_dict());
  return logits_away_from(other, ref, prefix);
}

// The reference's family `name` (its directory name_hf, of class `type`):
// the model read from it matches the reference's step 0 (q's and k's
// gradient rows into Triad's halves first, for a class turning them in
// interleaved pairs) and greedy tokens (name_generator's weights), and
// exports again as written. The model, for the caller's own checks.
std::unique_ptr<nn::Gpt> expect_family_matches(const std::string& name, const std::string& type,
                                               const std::map<std::string, Tensor>& ref) {
  const std::string dir = ref_dir() + "/" + name + "_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, type);
  auto model = std::make_unique<nn::Gpt>(cfg, 1);
  io::load_gpt2_safetensors(*model, dir);
  const std::string prefix = name + ".";
  expect_step_zero_matches(
      *model,
      io::weight_layout(cfg).interleaved_rotation ? with_halves_gradients(ref, cfg, prefix) : ref,
      prefix);
  expect_greedy_tokens(cfg, name + "_generator", prefix + "greedy_tokens", ref);
  expect_exports_as_written(*model, dir);
  return model;
}

// Rotary position embeddings against PyTorch written out independently
// (rotate-half, f64 angles): logits, loss, every gradient, and a greedy
// continuation past seq_len (key/value-cache steps, then sliding windows).
TEST_F(Gpt2Parity, RotaryEmbeddingsLogitsGradientsAndGreedyTokens) {
  nn::GptConfig cfg = model_cfg_;
  cfg.position_embedding = nn::PositionEmbedding::Rotary;
  cfg.rope_theta = cfg_["rope_theta"];
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/rope_model.safetensors");
  EXPECT_EQ(static_cast<int64_t>(model.named_parameters().size()), 1 + 12 * cfg.n_layer + 2);
  expect_step_zero_matches(model, ref_, "rope.");

  expect_greedy_tokens(cfg, "rope_generator.safetensors", "rope.greedy_tokens", ref_);
}

// The gated MLPs (c_fc holding both halves, at a hidden width other than
// 4C): LLaMA's SwiGLU, silu(gate) * value, against PyTorch's F.silu, and
// Gemma's GeGLU, gelu(gate) * value, against F.gelu(approximate="tanh").
TEST_F(Gpt2Parity, GatedMlpLogitsAndGradients) {
  for (const auto& [activation, name] :
       {std::pair{nn::Activation::SwiGlu, "swiglu"}, std::pair{nn::Activation::GeGlu, "geglu"}}) {
    SCOPED_TRACE(name);
    nn::GptConfig cfg = model_cfg_;
    cfg.activation = activation;
    cfg.ffn_hidden_size = cfg_["swiglu_ffn"];
    nn::Gpt model(cfg, 1);
    io::load_gpt2_safetensors(model, ref_dir() + "/" + name + "_model.safetensors");
    expect_step_zero_matches(model, ref_, std::string(name) + ".");
  }
}

// Squared ReLU's ungated MLP (model.activation relu2: Primer's and
// Nemotron-4's), relu(x)^2, against PyTorch's torch.square(F.relu(x)).
TEST_F(Gpt2Parity, SquaredReluMlpLogitsAndGradients) {
  nn::GptConfig cfg = model_cfg_;
  cfg.activation = nn::Activation::Relu2;
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/relu2_model.safetensors");
  expect_step_zero_matches(model, ref_, "relu2.");
}

// LLaMA's combination: rotary embeddings, SwiGLU, RMSNorm (written out in
// PyTorch by hand: x * rsqrt(mean(x^2) + eps) * weight), linear layers
// without biases, an untied output head (lm_head.weight) and grouped-query
// attention (4 query heads over 2 key/value heads, repeated for their
// groups as Hugging Face's LLaMA does).
TEST_F(Gpt2Parity, LlamaStyleModelLogitsAndGradients) {
  const nn::GptConfig cfg = llama_style();
  ASSERT_LT(cfg.n_kv_head, cfg.n_head);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/llama_model.safetensors");
  EXPECT_EQ(static_cast<int64_t>(model.named_parameters().size()), 1 + 6 * cfg.n_layer + 1 + 1);
  expect_step_zero_matches(model, ref_, "llama.");
  // The same weights under Hugging Face's LlamaForCausalLM names and layout
  // (q, k, v and gate, up as separate projections) load to the same model.
  nn::Gpt hf(cfg, 2);
  io::load_gpt2_safetensors(hf, ref_dir() + "/llama_hf_model.safetensors");
  expect_step_zero_matches(hf, ref_, "llama.");
}

// Multi-token prediction (DeepSeek-V3's MTP modules, written out in PyTorch
// from the paper: eh_proj over [ln_embed(Emb(t_{i+k})) | ln_hidden(h)], a
// block, ln_out and the shared head predicting t_{i+k+1}): on the
// LLaMA-style model with two modules weighed 0.3 and on GPT-2's with one
// weighed 0.1, the loss is the next token's, each depth's loss is the
// reference's, and every gradient is the whole objective's.
TEST_F(Gpt2Parity, MultiTokenPredictionLossesAndGradients) {
  for (const std::string name : {"mtp_llama", "mtp_gpt2"}) {
    SCOPED_TRACE(name);
    nn::GptConfig cfg = name == "mtp_llama" ? llama_style() : model_cfg_;
    cfg.mtp_layers = cfg_[name]["layers"];
    cfg.mtp_loss_weight = cfg_[name]["weight"];
    nn::Gpt model(cfg, 1);
    io::load_gpt2_safetensors(model, ref_dir() + "/" + name + "_model.safetensors");
    expect_mtp_step_zero_matches(model, ref_, name + ".");
  }
}

// GLM-4.5's blocks with a prediction module of their own, trained, read
// from a Glm4MoeForCausalLM directory that holds it as GLM-4.5's files do
// (layer n_layer: its block, enorm, hnorm, eh_proj, shared_head.norm and
// copies of the head and the embedding) once model.mtp_layers asks for it,
// and written back the same way (num_nextn_predict_layers 1).
TEST_F(Gpt2Parity, Glm4MoePredictionModuleReadsTrainsAndExports) {
  const std::string dir = ref_dir() + "/glm4_moe_mtp_hf";
  nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.mtp_layers, 0);  // (training them is asked for, not read)
  cfg.mtp_layers = cfg_["mtp_glm4"]["layers"];
  cfg.mtp_loss_weight = cfg_["mtp_glm4"]["weight"];
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_mtp_step_zero_matches(model, ref_, "glm4_moe_mtp.");
  expect_exports_as_written(model, dir, [](const std::string&) { return false; }, {});
  // A model asking for more modules than the file holds is told so.
  nn::GptConfig more = cfg;
  more.mtp_layers = 2;
  nn::Gpt deeper(more, 1);
  try {
    io::load_gpt2_safetensors(deeper, dir);
    ADD_FAILURE() << "two modules read from one prediction layer";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("1 prediction layer(s)"), std::string::npos) << e.what();
  }
}

// Qwen2's blocks: the LLaMA-style model with biases on q, k and v only
// (model.qkv_bias) and a tied head, loaded from Hugging Face's
// Qwen2ForCausalLM names and layout (separate q/k/v weights and biases, no
// lm_head).
TEST_F(Gpt2Parity, Qwen2StyleModelLogitsAndGradients) {
  const nn::GptConfig cfg = qwen2_style();
  nn::Gpt model(cfg, 1);
  // Per layer: two RMSNorm weights, c_attn's weight and bias, c_proj, c_fc,
  // the MLP's c_proj; plus wte and ln_f.
  EXPECT_EQ(static_cast<int64_t>(model.named_parameters().size()), 1 + 7 * cfg.n_layer + 1);
  EXPECT_EQ(model.num_parameters(), cfg.num_parameters());
  io::load_gpt2_safetensors(model, ref_dir() + "/qwen2_hf_model.safetensors");
  expect_step_zero_matches(model, ref_, "qwen2.");
  // Without model.qkv_bias the file's biases are named as the reason.
  nn::GptConfig no_bias = cfg;
  no_bias.qkv_bias = false;
  nn::Gpt plain(no_bias, 1);
  try {
    io::load_gpt2_safetensors(plain, ref_dir() + "/qwen2_hf_model.safetensors");
    FAIL() << "a Qwen2 file loaded into a model without q, k and v biases";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("set model.qkv_bias: true"), std::string::npos)
        << e.what();
  }
}

// Qwen3's blocks: the LLaMA-style model with RMSNorm over each query head
// and each key head before the rotation (model.qk_norm), heads of their own
// width (model.head_dim 12: the 4 query heads are 48 wide, d_model 32) and a
// tied head, loaded from Hugging Face's Qwen3ForCausalLM names and layout.
// Gemma's blocks: LLaMA's with GeGLU, the token embeddings times
// sqrt(d_model), RMSNorms scaling by 1 + weight (weights stored as Hugging
// Face stores them), multi-query attention and a tied head, loaded from
// GemmaForCausalLM's names.
TEST_F(Gpt2Parity, GemmaStyleModelLogitsAndGradients) {
  nn::GptConfig cfg = llama_style();
  cfg.tie_embeddings = true;
  cfg.n_kv_head = 1;
  cfg.activation = nn::Activation::GeGlu;
  cfg.embedding_multiplier = std::sqrt(static_cast<double>(cfg.d_model));
  cfg.norm_weight_offset = true;
  nn::Gpt model(cfg, 1);
  // Initialised as Gemma is: every norm's weight zero (a scale of one).
  for (const auto& [name, p] : model.named_parameters()) {
    if (name.find("ln_") == std::string::npos) continue;
    const float* w = p.data<float>();
    for (int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(w[i], 0.0f) << name << "[" << i << "]";
  }
  io::load_gpt2_safetensors(model, ref_dir() + "/gemma_hf_model.safetensors");
  expect_step_zero_matches(model, ref_, "gemma.");
}

// Gemma 3's blocks, read from a Gemma3ForCausalLM directory (config.json
// through model.hf_config's reader, then its weights): Gemma's with each
// sublayer's output normalised again (model.post_norms; Hugging Face's
// post_attention_layernorm is then the attention output's norm and
// pre_feedforward_layernorm the MLP's input's), query/key norms scaling by
// 1 + weight, heads of their own width, every second layer global
// (sliding_window_pattern) and the windowed layers turning by
// rope_local_base_freq unscaled while the global one's RoPE is scaled,
// and scores over sqrt(query_pre_attn_scalar) (27B's kind) rather than
// sqrt(head_dim): step 0 and a greedy continuation (key/value-cache steps
// past the window).
TEST_F(Gpt2Parity, Gemma3StyleModelLogitsGradientsAndGreedyTokens) {
  const std::string dir = ref_dir() + "/gemma3_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_TRUE(cfg.post_norms);
  EXPECT_TRUE(cfg.qk_norm);
  EXPECT_TRUE(cfg.norm_weight_offset);
  EXPECT_EQ(cfg.activation, nn::Activation::GeGlu);
  EXPECT_EQ(cfg.sliding_window, cfg_["mistral_window"].get<int64_t>());
  EXPECT_EQ(cfg.full_attention_layers, std::vector<int64_t>{1});
  EXPECT_EQ(cfg.rope_local_theta, cfg_["gemma3_local_theta"].get<double>());
  EXPECT_EQ(cfg.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(cfg.rope_of(0).theta, cfg.rope_local_theta);
  EXPECT_FALSE(cfg.rope_of(0).scaling.scaled());
  EXPECT_EQ(cfg.rope_of(1).theta, cfg.rope_theta);
  EXPECT_EQ(cfg.query_pre_attn_scalar, cfg_["gemma3_attn_scalar"].get<double>());
  nn::Gpt model(cfg, 1);
  // Per layer: four norms, the two head norms, c_attn, c_proj, c_fc, the
  // MLP's c_proj; plus wte and ln_f.
  EXPECT_EQ(static_cast<int64_t>(model.named_parameters().size()), 1 + 10 * cfg.n_layer + 1);
  EXPECT_EQ(model.num_parameters(), cfg.num_parameters());
  io::load_gpt2_safetensors(model, dir + "/model.safetensors");
  expect_step_zero_matches(model, ref_, "gemma3.");
  expect_greedy_tokens(cfg, "gemma3_generator.safetensors", "gemma3.greedy_tokens", ref_);
  // Without model.post_norms the file's extra norms are named as the reason.
  nn::GptConfig sans = cfg;
  sans.post_norms = false;
  nn::Gpt plain(sans, 1);
  try {
    io::load_gpt2_safetensors(plain, dir + "/model.safetensors");
    FAIL() << "a Gemma 3 file loaded into a model without post-norms";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("set model.post_norms: true"), std::string::npos)
        << e.what();
  }
}

// Gemma 2's blocks from a Gemma2ForCausalLM directory: post-norms, the
// window on every second layer, and soft caps (caps the size of the scores
// and logits, so tanh bends them) on the attention's scores and the head's
// logits: step 0 through the plain cross entropy and through the fused head
// + loss, which caps the logits in place.
TEST_F(Gpt2Parity, Gemma2StyleModelSoftCapsLogitsAndGradients) {
  const std::string dir = ref_dir() + "/gemma2_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_TRUE(cfg.post_norms);
  EXPECT_FALSE(cfg.qk_norm);
  EXPECT_EQ(cfg.full_attention_layers, std::vector<int64_t>{1});
  EXPECT_EQ(cfg.attn_logit_softcap, cfg_["gemma2_attn_softcap"].get<double>());
  EXPECT_EQ(cfg.final_logit_softcap, cfg_["gemma2_final_softcap"].get<double>());
  EXPECT_EQ(cfg.heads().softcap, cfg.attn_logit_softcap);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir + "/model.safetensors");
  expect_step_zero_matches(model, ref_, "gemma2.");
  const Tensor fused =
      model.loss(cast(ref_.at("input_ids"), DType::I64), cast(ref_.at("targets"), DType::I64));
  const double want = item(ref_.at("gemma2.loss"));
  EXPECT_NEAR(item(fused), want, 1e-6 * want);
}

TEST_F(Gpt2Parity, Qwen3StyleModelLogitsAndGradients) {
  nn::GptConfig cfg = llama_style();
  cfg.tie_embeddings = true;
  cfg.qk_norm = true;
  cfg.head_size = cfg_["qwen3_head_dim"];
  ASSERT_TRUE(cfg.heads_apart());
  nn::Gpt model(cfg, 1);
  // Per layer: two RMSNorm weights, the two head norms, c_attn, c_proj,
  // c_fc, the MLP's c_proj; plus wte and ln_f.
  EXPECT_EQ(static_cast<int64_t>(model.named_parameters().size()), 1 + 8 * cfg.n_layer + 1);
  EXPECT_EQ(model.num_parameters(), cfg.num_parameters());
  io::load_gpt2_safetensors(model, ref_dir() + "/qwen3_hf_model.safetensors");
  expect_step_zero_matches(model, ref_, "qwen3.");
  // Without model.qk_norm the file's head norms are named as the reason;
  // with heads d_model / n_head wide, the projections' shapes are.
  nn::GptConfig no_norm = cfg;
  no_norm.qk_norm = false;
  nn::Gpt plain(no_norm, 1);
  try {
    io::load_gpt2_safetensors(plain, ref_dir() + "/qwen3_hf_model.safetensors");
    FAIL() << "a Qwen3 file loaded into a model without query/key norms";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("set model.qk_norm: true"), std::string::npos) << e.what();
  }
  nn::GptConfig narrow_heads = cfg;
  narrow_heads.head_size = 0;
  nn::Gpt narrow(narrow_heads, 1);
  try {
    io::load_gpt2_safetensors(narrow, ref_dir() + "/qwen3_hf_model.safetensors");
    FAIL() << "a Qwen3 file loaded into a model with narrower heads";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("model.head_dim"), std::string::npos) << e.what();
  }
}

// YaRN (Qwen2.5's long-context RoPE scaling) on the Qwen2-style model:
// frequencies kept, ramped and slowed, and q and k scaled by the attention
// factor, against Hugging Face's rule written out in PyTorch.
TEST_F(Gpt2Parity, YarnRopeScalingLogitsAndGradients) {
  nn::GptConfig cfg = qwen2_style();
  ASSERT_EQ(cfg_["yarn_scaling"]["rope_type"], "yarn");
  cfg.rope_scaling = scaling("yarn_scaling", RopeScaling::Kind::Yarn);
  ASSERT_EQ(cfg.rope_scaling.original_seq_len, 32.0);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/yarn_model.safetensors");
  expect_step_zero_matches(model, ref_, "yarn.");
}

// longrope (Phi-3's and Phi-3.5's long context) on the LLaMA-style model: a
// pass of 16 positions over an original context of 8 takes the long factors,
// over 16 the short ones, and q and k are scaled by the attention factor,
// against Hugging Face's rule written out in PyTorch.
// Phi-4-mini's partial rotation ("partial": half of each head turned, with
// longrope's factors for its pairs) too.
TEST_F(Gpt2Parity, LongRopeScalingLogitsAndGradients) {
  for (const std::string key : {"longrope", "longrope_short", "partial"}) {
    SCOPED_TRACE(key);
    nn::GptConfig cfg = llama_style();
    if (key == "partial") cfg.rope_dim = cfg_["partial_rope_dim"];
    const auto& entry = cfg_[key + "_scaling"];
    ASSERT_EQ(entry["rope_type"], "longrope");
    cfg.rope_scaling = scaling(key + "_scaling", RopeScaling::Kind::LongRope);
    ASSERT_EQ(set_rope_factors(cfg.rope_scaling, entry["short_factor"].get<std::vector<double>>(),
                               entry["long_factor"].get<std::vector<double>>()),
              "");
    ASSERT_EQ(cfg.rope_scaling.original_seq_len, key == "longrope_short" ? 16.0 : 8.0);
    nn::Gpt model(cfg, 1);
    io::load_gpt2_safetensors(model, ref_dir() + "/" + key + "_model.safetensors");
    expect_step_zero_matches(model, ref_, key + ".");
  }
}

// The partial rotation's model from a Phi3ForCausalLM directory written as
// Phi-4-mini's files are (fused qkv_proj and gate_up_proj,
// partial_rotary_factor, longrope's three keys with the factor implied by
// the two contexts): read through model.hf_config's reader it computes
// what Hugging Face's rule does; exported again, it is the same directory,
// every weight bit for bit and every key the reference wrote.
TEST_F(Gpt2Parity, Phi4MiniDirectoryReadsAndExportsAsHuggingFacesPhi3) {
  const std::string dir = ref_dir() + "/phi4_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "phi3");
  EXPECT_EQ(cfg.rope_dim, cfg_["partial_rope_dim"].get<int64_t>());
  EXPECT_EQ(cfg.rope_scaling.kind, RopeScaling::Kind::LongRope);
  EXPECT_EQ(cfg.rope_scaling.factor, cfg_["partial_scaling"]["factor"].get<double>());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, ref_, "partial.");
  expect_exports_as_written(model, dir);
}

// GPT-NeoX's (Pythia's) blocks from a GPTNeoXForCausalLM directory written
// as Pythia's files are (query_key_value interleaved by head, the old
// buffers beside the weights): the parallel residual, the exact GELU and
// half of each head turned read to the reference's logits, gradients and
// greedy tokens (key/value-cache steps through the parallel wiring); the
// export writes the same config keys and every weight bit for bit. Without
// either departure the logits are off by more than three times the
// tolerance (GELU's tanh form, at these small weights, by 7e-5).
TEST_F(Gpt2Parity, GptNeoxDirectoryReadsAndExportsAsHuggingFacesGptNeox) {
  const std::string dir = ref_dir() + "/neox_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "gpt_neox");
  EXPECT_TRUE(cfg.parallel_residual);
  EXPECT_EQ(cfg.activation, nn::Activation::GeluErf);
  EXPECT_EQ(cfg.rope_dim, cfg_["neox_rope_dim"].get<int64_t>());
  EXPECT_FALSE(cfg.tie_embeddings);
  EXPECT_TRUE(cfg.linear_bias);
  EXPECT_EQ(cfg.normalization, nn::Normalization::LayerNorm);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, ref_, "neox.");
  expect_greedy_tokens(cfg, "neox_generator.safetensors", "neox.greedy_tokens", ref_);

  // Each departure matters: the same weights wired sequentially, or with
  // GELU's tanh form, compute other logits.
  const Tensor ids = cast(ref_.at("input_ids"), DType::I64);
  const std::vector<double> want = to_double_vector(ref_.at("neox.logits"));
  for (int change = 0; change < 2; ++change) {
    nn::GptConfig other = cfg;
    if (change == 0) other.parallel_residual = false;
    if (change == 1) other.activation = nn::Activation::Gelu;
    nn::Gpt m(other, 1);
    io::load_gpt2_safetensors(m, dir);
    const std::vector<double> got = to_double_vector(m.forward(ids));
    const double worst = worst_difference(got, want);
    EXPECT_GT(worst, 3e-5) << "change " << change;
  }

  expect_exports_as_written(model, dir, [](const std::string& name) {
    return name.find(".attention.bias") != std::string::npos ||
           name.find("masked_bias") != std::string::npos ||
           name.find("inv_freq") != std::string::npos;
  });
}

// The same Pythia-style model from torch.save's pytorch_model.bin (the
// older checkpoints' format, the mask a bool buffer), whole and in two
// shards behind pytorch_model.bin.index.json: the same logits and
// gradients.
TEST_F(Gpt2Parity, GptNeoxPytorchModelBinReadsAsItsSafetensors) {
  for (const char* dir : {"/neox_hf_bin", "/neox_hf_bin_sharded"}) {
    SCOPED_TRACE(dir);
    const nn::GptConfig cfg = io::load_hf_config(ref_dir() + dir);
    nn::Gpt model(cfg, 1);
    io::load_gpt2_safetensors(model, ref_dir() + dir);
    expect_step_zero_matches(model, ref_, "neox.");
  }
}

// torch.save's files read without Python: every storage type (the narrow
// integers widened to i32) and kind of view (transposed, a row sharing
// another tensor's storage, a slice at an offset, a scalar, an empty
// tensor) give PyTorch's values; a pickle that would call os.system is
// refused, naming the call.
TEST_F(Gpt2Parity, TorchSaveFilesReadAsTheirTensorsAndRunNoCode) {
  const io::TorchCheckpointFile file(ref_dir() + "/tensors.bin");
  const std::map<std::string, DType> types = {
      {"f32", DType::F32},     {"f64", DType::F64},        {"f16", DType::F16},
      {"bf16", DType::BF16},   {"transposed", DType::F32}, {"row_of_base", DType::F32},
      {"columns", DType::F32}, {"base", DType::F32},       {"i64", DType::I64},
      {"i32", DType::I32},     {"bool", DType::I32},       {"u8", DType::I32},
      {"i8", DType::I32},      {"scalar", DType::F32},     {"empty", DType::F32}};
  const auto tensors = file.read();
  ASSERT_EQ(tensors.size(), types.size());
  for (const auto& [name, dtype] : types) {
    SCOPED_TRACE(name);
    const Tensor& want = ref_.at("torchbin." + name);
    ASSERT_TRUE(tensors.count(name));
    const Tensor& got = tensors.at(name);
    EXPECT_EQ(got.dtype(), dtype);
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_EQ(file.shapes().at(name), want.shape());
    const std::vector<double> a = to_double_vector(got), b = to_double_vector(want);
    ASSERT_EQ(a.size(), b.size());
    // (The reference file holds f32: f64's values to its rounding.)
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i], b[i], dtype == DType::F64 ? 1e-7 * std::abs(b[i]) : 0.0) << i;
    }
  }
  EXPECT_EQ(file.read([](const std::string& n) { return n == "bf16"; }).size(), 1u);
  try {
    io::TorchCheckpointFile evil(ref_dir() + "/runs_code.bin");
    FAIL() << "a pickle calling os.system was read";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("calls 'posix.system'"), std::string::npos) << m;
    EXPECT_NE(m.find("Triad runs no code from a checkpoint"), std::string::npos) << m;
  }
}

// StableLM 2's blocks from a StableLmForCausalLM directory: LLaMA's with
// LayerNorms (their biases read and written under LLaMA's norm names), q,
// k and v biases and half of each head turned; exported again, the same
// directory.
TEST_F(Gpt2Parity, StableLmDirectoryReadsAndExportsAsHuggingFacesStableLm) {
  const std::string dir = ref_dir() + "/stablelm_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "stablelm");
  EXPECT_EQ(cfg.normalization, nn::Normalization::LayerNorm);
  EXPECT_TRUE(cfg.qkv_bias);
  EXPECT_FALSE(cfg.linear_bias);
  EXPECT_EQ(cfg.rope_dim, cfg_["neox_rope_dim"].get<int64_t>());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, ref_, "stablelm.");
  expect_exports_as_written(model, dir);
}

// StableLM 2 12B's blocks from a StableLmForCausalLM directory: the
// parallel residual on one LayerNorm and a LayerNorm without a bias on each
// query and key head, each head's weights its own (qk_layernorm, a LayerNorm
// of D per head in the file), to the reference's logits, gradients and
// greedy tokens; exported again, the same directory. With every head
// scaled by the first head's weights: not the reference's logits.
TEST_F(Gpt2Parity, StableLm12bHeadNormsReadAndExportAsHuggingFacesStableLm) {
  const auto model = expect_family_matches("stablelm12", "stablelm", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_TRUE(cfg.qk_head_layernorm);
  EXPECT_TRUE(cfg.parallel_residual && cfg.shared_norm);
  nn::StateDict first_head = model->state_dict();
  const int64_t D = cfg.head_dim();
  for (auto& [name, t] : first_head) {
    if (name.find(".attn.q_norm.weight") == std::string::npos) continue;
    std::vector<Tensor> heads(static_cast<size_t>(cfg.n_head), narrow(t, 0, 0, D));
    t = contiguous(concat(heads, 0));
  }
  nn::Gpt shared(cfg, 1);
  shared.load_state_dict(first_head);
  EXPECT_GT(logits_away_from(shared, ref_, "stablelm12."), 1e-4);
}

// Phi-2's blocks from a PhiForCausalLM directory: the parallel residual
// with one norm for both sublayers, a biased untied head, half of each head
// turned and grouped key/value heads read to the reference's logits,
// gradients (the head bias's among them) and greedy tokens (key/value-cache
// steps through the shared norm); exported again, the same directory.
// Without the head's bias the logits differ.
TEST_F(Gpt2Parity, PhiDirectoryReadsAndExportsAsHuggingFacesPhi) {
  const std::string dir = ref_dir() + "/phi_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "phi");
  EXPECT_TRUE(cfg.parallel_residual);
  EXPECT_TRUE(cfg.shared_norm);
  EXPECT_TRUE(cfg.head_bias);
  EXPECT_EQ(cfg.activation, nn::Activation::Gelu);
  EXPECT_EQ(cfg.rope_dim, cfg_["neox_rope_dim"].get<int64_t>());
  EXPECT_EQ(cfg.kv_heads(), cfg_["llama_kv_heads"].get<int64_t>());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  EXPECT_FALSE(model.state_dict().count("h.0.ln_2.weight"));
  expect_step_zero_matches(model, ref_, "phi.");
  expect_greedy_tokens(cfg, "phi_generator.safetensors", "phi.greedy_tokens", ref_);

  const Tensor ids = cast(ref_.at("input_ids"), DType::I64);
  const std::vector<double> want = to_double_vector(ref_.at("phi.logits"));
  nn::GptConfig unbiased = cfg;
  unbiased.head_bias = false;
  nn::Gpt m(unbiased, 1);
  nn::StateDict weights = model.state_dict();
  weights.erase("lm_head.bias");
  m.load_state_dict(weights);
  const std::vector<double> got = to_double_vector(m.forward(ids));
  const double worst = worst_difference(got, want);
  EXPECT_GT(worst, 1e-2);
  expect_exports_as_written(model, dir);
}

// Falcon's blocks from FalconForCausalLM directories: Falcon 7B's
// (multi-query attention, one norm for the parallel sublayers, no linear
// biases, a tied head) and the new decoder architecture's (ln_attn and
// ln_mlp, two key/value heads each grouped with its query heads in
// query_key_value, biases, an untied head) read to the reference's logits
// and gradients, the first's greedy tokens too; exported again, the same
// directories.
TEST_F(Gpt2Parity, FalconDirectoriesReadAndExportAsHuggingFacesFalcon) {
  for (const char* name : {"falcon7", "falcon40"}) {
    SCOPED_TRACE(name);
    const std::string dir = ref_dir() + "/" + name + "_hf";
    const nn::GptConfig cfg = io::load_hf_config(dir);
    const bool seven = std::string(name) == "falcon7";
    EXPECT_EQ(cfg.hf_type, "falcon");
    EXPECT_TRUE(cfg.parallel_residual);
    EXPECT_EQ(cfg.shared_norm, seven);
    EXPECT_EQ(cfg.linear_bias, !seven);
    EXPECT_EQ(cfg.tie_embeddings, seven);
    EXPECT_EQ(cfg.kv_heads(), seven ? 1 : cfg_["llama_kv_heads"].get<int64_t>());
    EXPECT_EQ(cfg.activation, nn::Activation::GeluErf);
    nn::Gpt model(cfg, 1);
    io::load_gpt2_safetensors(model, dir);
    expect_step_zero_matches(model, ref_, std::string(name) + ".");
    if (seven)
      expect_greedy_tokens(cfg, "falcon7_generator.safetensors", "falcon7.greedy_tokens", ref_);
    expect_exports_as_written(model, dir);
  }
}

// GPT-J's blocks from a GPTJForCausalLM directory: q and k turned in
// interleaved pairs by the reference (Hugging Face's rotate_every_two), read
// into Triad's halves by reordering their rows; the parallel residual with
// one norm, biases on the MLP alone and a biased head. The logits,
// gradients (q's and k's reordered as the weights are) and greedy tokens
// (key/value-cache steps) are the reference's; exported again, the same
// directory, its buffers left out. Read without the reordering, the
// logits differ.
// The load-balancing losses a mixture's layers report on the step-0
// micro-batch (training, as PyTorch computed them) against the reference's
// under `prefix`.
void expect_balance_matches(const nn::Gpt& model, const std::map<std::string, Tensor>& ref,
                            const std::string& prefix) {
  nn::ForwardContext ctx{true, 0, 0};
  ctx.moe_stats = std::make_shared<nn::MoeStats>();
  autograd::NoGradGuard no_grad;
  (void)model.forward(cast(ref.at("input_ids"), DType::I64), ctx);
  const std::vector<double> want = to_double_vector(ref.at(prefix + "balance"));
  ASSERT_EQ(ctx.moe_stats->records, static_cast<int64_t>(want.size()));
  double sum = 0;
  for (const double b : want) sum += b;
  EXPECT_NEAR(ctx.moe_stats->balance_sum, sum, 1e-5 * sum);
}

// Mixtral's blocks (Mistral's window, 4 experts of which each token takes
// the top 2, renormalised) from a MixtralForCausalLM directory: logits,
// loss, every gradient with the load-balancing loss's part (the file's
// router_aux_loss_coef), the layers' balance, greedy tokens through the
// key/value cache; exported again, the same directory. Without the loss,
// the router's gradient is not the reference's.
TEST_F(Gpt2Parity, MixtralDirectoryReadsTrainsAndExportsAsHuggingFacesMixtral) {
  const std::string dir = ref_dir() + "/mixtral_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "mixtral");
  EXPECT_EQ(cfg.moe.experts, 4);
  EXPECT_EQ(cfg.moe.top_k, 2);
  EXPECT_TRUE(cfg.moe.normalize_top_k);
  EXPECT_EQ(cfg.expert_ffn(), cfg_["moe_ffn"].get<int64_t>());
  EXPECT_DOUBLE_EQ(cfg.moe.aux_loss_coef, cfg_["moe_aux_coef"].get<double>());
  EXPECT_EQ(cfg.sliding_window, cfg_["mistral_window"].get<int64_t>());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  EXPECT_TRUE(model.state_dict().count("h.1.mlp.experts.3.c_proj.weight"));
  expect_step_zero_matches(model, ref_, "mixtral.");
  expect_balance_matches(model, ref_, "mixtral.");
  expect_greedy_tokens(cfg, "mixtral_generator", "mixtral.greedy_tokens", ref_);
  expect_exports_as_written(model, dir);

  nn::GptConfig unbalanced = cfg;
  unbalanced.moe.aux_loss_coef = 0;
  nn::Gpt plain(unbalanced, 1);
  plain.load_state_dict(model.state_dict());
  autograd::backward({cross_entropy(plain.forward(cast(ref_.at("input_ids"), DType::I64)),
                                    cast(ref_.at("targets"), DType::I64))});
  const std::vector<double> got =
      to_double_vector(plain.state_dict().at("h.0.mlp.router.weight").grad());
  const std::vector<double> want = to_double_vector(ref_.at("mixtral.grad.h.0.mlp.router.weight"));
  const double worst = worst_difference(got, want);
  EXPECT_GT(worst, 1e-4);
}

// Qwen3-MoE's blocks (Qwen3's query/key norms and wider heads; a dense
// first layer, then 5 experts of which each token takes 3, not
// renormalised) from a Qwen3MoeForCausalLM directory: logits, loss and every
// gradient; exported again, the same directory.
TEST_F(Gpt2Parity, Qwen3MoeDirectoryReadsAndExportsAsHuggingFacesQwen3Moe) {
  const std::string dir = ref_dir() + "/qwen3_moe_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "qwen3_moe");
  EXPECT_EQ(cfg.moe.experts, 5);
  EXPECT_EQ(cfg.moe.top_k, 3);
  EXPECT_FALSE(cfg.moe.normalize_top_k);
  EXPECT_EQ(cfg.moe.dense_layers, std::vector<int64_t>{0});
  EXPECT_EQ(cfg.expert_ffn(), cfg_["moe_ffn"].get<int64_t>());
  EXPECT_EQ(cfg.ffn(), cfg_["swiglu_ffn"].get<int64_t>());
  EXPECT_TRUE(cfg.qk_norm);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  EXPECT_TRUE(model.state_dict().count("h.0.mlp.c_fc.weight"));
  EXPECT_TRUE(model.state_dict().count("h.1.mlp.experts.4.c_fc.weight"));
  expect_step_zero_matches(model, ref_, "qwen3_moe.");
  expect_balance_matches(model, ref_, "qwen3_moe.");
  expect_exports_as_written(model, dir);
}

// GLM-4.5's blocks (q, k and v biases, Qwen3's query/key norms on wider
// heads, half of each head turned in halves; a dense first layer, then 8
// experts in 4 groups scored by sigmoids, each token's top 2 chosen with
// the expert biases among its best 2 groups, renormalised and scaled by
// 2.5, and an ungated shared expert two experts wide) from a
// Glm4MoeForCausalLM directory whose files hold a prediction layer besides:
// logits, loss, every gradient, the balance, greedy tokens through the
// key/value cache; exported again, the same directory less that layer.
// Without the biases the logits are not the reference's.
TEST_F(Gpt2Parity, Glm4MoeDirectoryReadsTrainsAndExportsAsHuggingFacesGlm4Moe) {
  const std::string dir = ref_dir() + "/glm4_moe_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "glm4_moe");
  EXPECT_TRUE(cfg.qkv_bias);
  EXPECT_TRUE(cfg.qk_norm);
  EXPECT_EQ(cfg.rope_dim, cfg.head_dim() / 2);
  const auto& m = cfg.moe;
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_TRUE(m.expert_bias);
  EXPECT_EQ(m.groups, 4);
  EXPECT_EQ(m.top_groups, 2);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_EQ(m.dense_layers, std::vector<int64_t>{0});
  EXPECT_EQ(m.shared_ffn_hidden_size, 2 * cfg.expert_ffn());
  EXPECT_FALSE(m.shared_gate);
  EXPECT_EQ(m.aux_loss_coef, 0.0);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  const Tensor bias = model.state_dict().at("h.1.mlp.expert_bias");
  EXPECT_EQ(bias.dtype(), DType::F32);
  expect_step_zero_matches(model, ref_, "glm4_moe.");
  expect_balance_matches(model, ref_, "glm4_moe.");
  expect_greedy_tokens(cfg, "glm4_moe_generator", "glm4_moe.greedy_tokens", ref_);
  const std::string beyond = "model.layers." + std::to_string(cfg.n_layer) + ".";
  expect_exports_as_written(model, dir,
                            [&](const std::string& name) { return name.rfind(beyond, 0) == 0; },
                            {"num_nextn_predict_layers"});

  nn::Gpt unbiased(cfg, 1);
  nn::StateDict state = model.state_dict();
  state["h.1.mlp.expert_bias"] = zeros({8}, DType::F32);
  unbiased.load_state_dict(state);
  const double worst =
      worst_difference(to_double_vector(unbiased.forward(cast(ref_.at("input_ids"), DType::I64))),
                       to_double_vector(ref_.at("glm4_moe.logits")));
  EXPECT_GT(worst, 1e-4);
}

// MiniMax-M2's blocks (one RMSNorm over all the queries and one over all
// the keys, wider heads, half of each turned in halves; 6 experts on every
// layer scored by sigmoids, each token's top 2 chosen with the expert
// biases, renormalised, unscaled) from a MiniMaxM2ForCausalLM directory
// under its files' names (block_sparse_moe, the biases beside the experts)
// holding a prediction module besides: logits, loss, every gradient, greedy
// tokens through the key/value cache, the balance; exported again, the same directory
// less that module. Without the biases the logits are not the reference's.
TEST_F(Gpt2Parity, MiniMaxM2DirectoryReadsTrainsAndExportsAsMiniMaxM2) {
  const std::string dir = ref_dir() + "/minimax_m2_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "minimax_m2");
  EXPECT_TRUE(cfg.qk_norm_full);
  EXPECT_EQ(cfg.rope_dim, cfg.head_dim() / 2);
  const auto& m = cfg.moe;
  EXPECT_EQ(m.experts, 6);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_TRUE(m.expert_bias);
  EXPECT_TRUE(m.normalize_top_k);
  EXPECT_EQ(m.groups, 1);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 1.0);
  EXPECT_TRUE(m.dense_layers.empty());
  EXPECT_EQ(m.shared_ffn_hidden_size, 0);
  EXPECT_EQ(m.aux_loss_coef, 0.0);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, ref_, "minimax_m2.");
  expect_balance_matches(model, ref_, "minimax_m2.");
  expect_greedy_tokens(cfg, "minimax_m2_generator", "minimax_m2.greedy_tokens", ref_);
  const std::string beyond = "model.layers." + std::to_string(cfg.n_layer) + ".";
  expect_exports_as_written(model, dir,
                            [&](const std::string& name) { return name.rfind(beyond, 0) == 0; },
                            {"use_mtp", "num_mtp_modules"});

  nn::StateDict state = model.state_dict();
  state["h.0.mlp.expert_bias"] = zeros({6}, DType::F32);
  state["h.1.mlp.expert_bias"] = zeros({6}, DType::F32);
  nn::Gpt unbiased(cfg, 1);
  unbiased.load_state_dict(state);
  EXPECT_GT(logits_away_from(unbiased, ref_, "minimax_m2."), 1e-4);
}

// dots.llm1's blocks (Qwen3's: query/key norms on wider heads; a dense
// first layer, then 6 experts scored by sigmoids, each token's top 3 chosen
// with the expert biases, not renormalised, scaled by 1.5, and a shared
// expert one expert wide) from a Dots1ForCausalLM directory: logits, loss,
// every gradient, the balance, greedy tokens through the key/value cache;
// exported again, the same directory.
TEST_F(Gpt2Parity, Dots1DirectoryReadsTrainsAndExportsAsHuggingFacesDots1) {
  const auto model = expect_family_matches("dots1", "dots1", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_TRUE(cfg.qk_norm);
  EXPECT_FALSE(cfg.qkv_bias);
  EXPECT_EQ(cfg.rope_dim, 0);
  EXPECT_EQ(cfg.sliding_window, 0);
  EXPECT_EQ(cfg.moe.experts, 6);
  EXPECT_EQ(cfg.moe.top_k, 3);
  EXPECT_FALSE(cfg.moe.normalize_top_k);
  EXPECT_EQ(cfg.moe.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_TRUE(cfg.moe.expert_bias);
  EXPECT_DOUBLE_EQ(cfg.moe.routed_scaling_factor, 1.5);
  EXPECT_EQ(cfg.moe.shared_ffn_hidden_size, cfg.expert_ffn());
  expect_balance_matches(*model, ref_, "dots1.");
}

// The reference's gradients of DeepSeek's rope rows (each query head's last
// qk_rope rows of q_b_proj, kv_a_proj's last qk_rope), recorded in Hugging
// Face's interleaved pairs, in Triad's halves.
std::map<std::string, Tensor> with_latent_halves_gradients(const std::map<std::string, Tensor>& ref,
                                                           const nn::GptConfig& cfg,
                                                           const std::string& prefix) {
  std::map<std::string, Tensor> out = ref;
  const auto& a = cfg.mla;
  const int64_t qk = cfg.latent_qk_dim(), r = a.qk_rope_head_dim;
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string p = prefix + "grad.h." + std::to_string(i) + ".attn.";
    const std::string q = p + (a.q_lora_rank > 0 ? "q_b_proj.weight" : "q_proj.weight");
    out[q] = io::interleaved_rows_at(ref.at(q), cfg.n_head, qk - r, r, true);
    const std::string kv = p + "kv_a_proj.weight";
    out[kv] = io::interleaved_rows_at(ref.at(kv), 1, a.kv_lora_rank, r, true);
  }
  return out;
}

// DeepSeek-V3's blocks (LLaMA's with multi-head latent attention: queries
// through a latent of 10, keys and values through one of 12, 4 heads whose
// queries and keys are 6 + 4 wide, the 4 turned in interleaved pairs and
// the key's shared by every head, values 8 wide; yarn with DeepSeek's two
// mscales, the rotation's factor their ratio and the scores times the
// second's square; a dense first layer, then DeepSeek-V3's mixture) from a
// DeepseekV3ForCausalLM directory whose files hold a prediction layer
// besides: logits, loss, every gradient, the balance, greedy tokens through
// the key/value cache; exported again, the same directory less that layer
// (its rope_scaling written as the attention factor it comes to, which reads
// back the same). Without the rope rows reordered into halves the logits
// are not the reference's.
TEST_F(Gpt2Parity, DeepseekV3DirectoryReadsTrainsAndExportsAsHuggingFacesDeepseekV3) {
  const std::string dir = ref_dir() + "/deepseek_v3_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "deepseek_v3");
  ASSERT_TRUE(cfg.latent_attention());
  EXPECT_EQ(cfg.mla, (nn::GptConfig::Mla{.kv_lora_rank = 12,
                                         .q_lora_rank = 10,
                                         .qk_nope_head_dim = 6,
                                         .qk_rope_head_dim = 4,
                                         .v_head_dim = 8,
                                         .mscale_all_dim = 0.6}));
  EXPECT_EQ(cfg.head_size, 0);
  EXPECT_EQ(cfg.head_dim(), 10);
  EXPECT_EQ(cfg.rope_scaling.kind, RopeScaling::Kind::Yarn);
  const double l = std::log(4.0);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.attention_factor, (0.08 * l + 1.0) / (0.06 * l + 1.0));
  EXPECT_EQ(cfg.moe.experts, 8);
  EXPECT_EQ(cfg.moe.groups, 4);
  EXPECT_EQ(cfg.moe.dense_layers, std::vector<int64_t>{0});
  EXPECT_EQ(cfg.moe.shared_ffn_hidden_size, cfg.expert_ffn());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, with_latent_halves_gradients(ref_, cfg, "deepseek_v3."),
                           "deepseek_v3.");
  expect_balance_matches(model, ref_, "deepseek_v3.");
  expect_greedy_tokens(cfg, "deepseek_v3_generator", "deepseek_v3.greedy_tokens", ref_);
  const std::string beyond = "model.layers." + std::to_string(cfg.n_layer) + ".";
  expect_exports_as_written(model, dir,
                            [&](const std::string& name) { return name.rfind(beyond, 0) == 0; },
                            {"num_nextn_predict_layers", "rope_scaling"});
  testing::TempDir out;
  io::save_hf_model(model.state_dict(), cfg, out.file("hf"));
  const nn::GptConfig back = io::load_hf_config(out.file("hf"));
  EXPECT_EQ(back.mla, cfg.mla);
  EXPECT_DOUBLE_EQ(back.rope_scaling.attention_factor, cfg.rope_scaling.attention_factor);
  EXPECT_DOUBLE_EQ(back.rope_scaling.factor, cfg.rope_scaling.factor);

  // The rope rows as the file holds them (interleaved), read as halves.
  nn::Gpt unturned(cfg, 1);
  nn::StateDict state = model.state_dict();
  const int64_t qk = cfg.latent_qk_dim(), r = cfg.mla.qk_rope_head_dim;
  for (const char* layer : {"h.0", "h.1"}) {
    Tensor& q = state.at(std::string(layer) + ".attn.q_b_proj.weight");
    q = io::interleaved_rows_at(q, cfg.n_head, qk - r, r, false);
  }
  unturned.load_state_dict(state);
  EXPECT_GT(logits_away_from(unturned, ref_, "deepseek_v3."), 1e-4);
}

// DeepSeek-V2-Lite's attention (queries straight from the input through
// q_proj, values wider than queries and keys, so these padded) under plain
// rope, and DeepSeek-V2's routing (a softmax over 8 experts, each token's
// top 2 among its best 2 of 4 groups, a group scored by its best expert,
// the gates times 3, not renormalised; the balance loss) from a
// DeepseekV2ForCausalLM directory: logits, loss, every gradient, the
// balance, greedy tokens through the key/value cache; exported again, the
// same directory. Groups scored by their two best (DeepSeek-V3's) route
// otherwise.
TEST_F(Gpt2Parity, DeepseekV2DirectoryReadsTrainsAndExportsAsHuggingFacesDeepseekV2) {
  const std::string dir = ref_dir() + "/deepseek_v2_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "deepseek_v2");
  EXPECT_EQ(cfg.mla, (nn::GptConfig::Mla{.kv_lora_rank = 12,
                                         .q_lora_rank = 0,
                                         .qk_nope_head_dim = 4,
                                         .qk_rope_head_dim = 4,
                                         .v_head_dim = 12}));
  EXPECT_EQ(cfg.head_dim(), 12);
  const auto& m = cfg.moe;
  EXPECT_EQ(m.score, nn::GptConfig::Moe::Score::Softmax);
  EXPECT_FALSE(m.normalize_top_k);
  EXPECT_FALSE(m.expert_bias);
  EXPECT_EQ(m.groups, 4);
  EXPECT_EQ(m.top_groups, 2);
  EXPECT_EQ(m.group_score, nn::GptConfig::Moe::GroupScore::Max);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 3.0);
  EXPECT_DOUBLE_EQ(m.aux_loss_coef, 0.05);
  EXPECT_EQ(m.aux_loss_scope, nn::GptConfig::Moe::BalanceScope::MicroBatch);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, with_latent_halves_gradients(ref_, cfg, "deepseek_v2."),
                           "deepseek_v2.");
  expect_balance_matches(model, ref_, "deepseek_v2.");
  expect_greedy_tokens(cfg, "deepseek_v2_generator", "deepseek_v2.greedy_tokens", ref_);
  expect_exports_as_written(model, dir);
  nn::GptConfig by_two = cfg;
  by_two.moe.group_score = nn::GptConfig::Moe::GroupScore::TopTwoSum;
  nn::Gpt other(by_two, 1);
  other.load_state_dict(model.state_dict());
  EXPECT_GT(logits_away_from(other, ref_, "deepseek_v2."), 1e-4);
}

// Qwen2-MoE's blocks (Qwen2's q, k and v biases; 4 experts of which each
// token takes 2, not renormalised, and a shared expert every token takes,
// weighted by its sigmoid gate) from a Qwen2MoeForCausalLM directory:
// logits, loss, every gradient with the load-balancing loss's part, the
// balance; exported again, the same directory.
TEST_F(Gpt2Parity, Qwen2MoeDirectoryReadsAndExportsAsHuggingFacesQwen2Moe) {
  const std::string dir = ref_dir() + "/qwen2_moe_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "qwen2_moe");
  EXPECT_TRUE(cfg.qkv_bias);
  EXPECT_EQ(cfg.moe.experts, 4);
  EXPECT_FALSE(cfg.moe.normalize_top_k);
  EXPECT_EQ(cfg.moe.shared_ffn_hidden_size, cfg_["moe_shared_ffn"].get<int64_t>());
  EXPECT_TRUE(cfg.moe.shared_gate);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  EXPECT_TRUE(model.state_dict().count("h.1.mlp.shared_gate.weight"));
  expect_step_zero_matches(model, ref_, "qwen2_moe.");
  expect_balance_matches(model, ref_, "qwen2_moe.");
  expect_exports_as_written(model, dir);
  // Without its gate the shared expert's output is not the reference's.
  nn::GptConfig ungated = cfg;
  ungated.moe.shared_gate = false;
  nn::Gpt m(ungated, 1);
  nn::StateDict weights = model.state_dict();
  for (const char* layer : {"h.0", "h.1"})
    weights.erase(std::string(layer) + ".mlp.shared_gate.weight");
  m.load_state_dict(weights);
  EXPECT_GT(logits_away_from(m, ref_, "qwen2_moe."), 1e-3);
}

// OLMo 2's blocks (no pre-norms, each sublayer's output normalised, one
// RMSNorm over all the queries and one over all the keys) from an
// Olmo2ForCausalLM directory: logits, loss and every gradient, greedy
// tokens through the key/value cache, the balance; exported again, the same directory.
TEST_F(Gpt2Parity, Olmo2DirectoryReadsAndExportsAsHuggingFacesOlmo2) {
  const std::string dir = ref_dir() + "/olmo2_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "olmo2");
  EXPECT_TRUE(cfg.qk_norm_full);
  EXPECT_FALSE(cfg.pre_norms);
  EXPECT_TRUE(cfg.post_norms);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  EXPECT_EQ(model.state_dict().count("h.0.ln_1.weight"), 0u);
  expect_step_zero_matches(model, ref_, "olmo2.");
  expect_greedy_tokens(cfg, "olmo2_generator", "olmo2.greedy_tokens", ref_);
  expect_exports_as_written(model, dir);
  // Per-head norms (Qwen3's) on the same weights' first head width: not
  // the reference's logits.
  nn::GptConfig per_head = cfg;
  nn::set_qk_norm(per_head, "true");
  nn::Gpt m(per_head, 1);
  nn::StateDict weights = model.state_dict();
  for (auto& [name, t] : weights) {
    if (name.find("_norm.weight") != std::string::npos && name.find(".attn.") != std::string::npos)
      t = contiguous(narrow(t, 0, 0, cfg.head_dim()));
  }
  m.load_state_dict(weights);
  EXPECT_GT(logits_away_from(m, ref_, "olmo2."), 1e-3);
}

// OLMo's blocks (LLaMA's with LayerNorms that learn nothing, q, k and v
// clamped by clip_qkv) from an OlmoForCausalLM directory, which stores no
// norms: logits, loss and every gradient (the clamped values' stopped);
// exported again, the same directory. Without the clamp, not the
// reference's logits: the clip bites.
TEST_F(Gpt2Parity, OlmoDirectoryReadsAndExportsAsHuggingFacesOlmo) {
  const std::string dir = ref_dir() + "/olmo_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "olmo");
  EXPECT_FALSE(cfg.norm_affine);
  EXPECT_FALSE(cfg.rms_norm());
  EXPECT_EQ(cfg.layer_norm_eps, 1e-5);
  EXPECT_GT(cfg.clip_qkv, 0.0);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  for (const auto& [name, t] : model.state_dict()) EXPECT_EQ(name.find("ln_"), std::string::npos);
  expect_step_zero_matches(model, ref_, "olmo.");
  expect_exports_as_written(model, dir);
  nn::GptConfig unclipped = cfg;
  unclipped.clip_qkv = 0.0;
  nn::Gpt m(unclipped, 1);
  m.load_state_dict(model.state_dict());
  EXPECT_GT(logits_away_from(m, ref_, "olmo."), 1e-3);
}

// Granite's blocks (LLaMA's with its four multipliers: embeddings times 3,
// each sublayer's output times 0.4, the scores times 1/8 in place of
// 1 / sqrt(8), the logits over 4) from a GraniteForCausalLM directory:
// logits, loss and every gradient, greedy tokens through the key/value
// cache; exported again, the same directory. Without the residual
// multiplier, or without the logits' scale, not the reference's logits.
TEST_F(Gpt2Parity, GraniteDirectoryReadsAndExportsAsHuggingFacesGranite) {
  const std::string dir = ref_dir() + "/granite_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "granite");
  EXPECT_EQ(cfg.embedding_multiplier, 3.0);
  EXPECT_EQ(cfg.residual_multiplier, 0.4);
  EXPECT_EQ(cfg.query_pre_attn_scalar, 64.0);
  EXPECT_EQ(cfg.logit_scale, 0.25);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, ref_, "granite.");
  expect_greedy_tokens(cfg, "granite_generator", "granite.greedy_tokens", ref_);
  expect_exports_as_written(model, dir);
  for (const char* plain : {"residual_multiplier", "logit_scale"}) {
    SCOPED_TRACE(plain);
    nn::GptConfig without = cfg;
    (std::string(plain) == "logit_scale" ? without.logit_scale : without.residual_multiplier) = 1.0;
    nn::Gpt m(without, 1);
    m.load_state_dict(model.state_dict());
    EXPECT_GT(logits_away_from(m, ref_, "granite."), 1e-3);
  }
}

// GraniteMoeShared's blocks (Granite's with its multipliers, 4 experts on
// every layer of which each token takes 2, renormalised, and an ungated
// shared expert) from a GraniteMoeSharedForCausalLM directory, its experts
// fused (input_linear, output_linear): logits, loss, every gradient with the
// load-balancing loss's part, the balance; exported again, the same
// directory. Without the shared expert, not the reference's logits.
TEST_F(Gpt2Parity, GraniteMoeDirectoryReadsAndExportsAsHuggingFacesGraniteMoeShared) {
  const std::string dir = ref_dir() + "/granitemoe_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "granitemoeshared");
  EXPECT_EQ(cfg.moe.experts, 4);
  EXPECT_TRUE(cfg.moe.normalize_top_k);
  EXPECT_EQ(cfg.moe.shared_ffn_hidden_size, cfg_["moe_shared_ffn"].get<int64_t>());
  EXPECT_FALSE(cfg.moe.shared_gate);
  EXPECT_EQ(cfg.residual_multiplier, 0.4);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, ref_, "granitemoe.");
  expect_balance_matches(model, ref_, "granitemoe.");
  expect_exports_as_written(model, dir);
  nn::GptConfig unshared = cfg;
  unshared.moe.shared_ffn_hidden_size = 0;
  nn::Gpt m(unshared, 1);
  nn::StateDict weights = model.state_dict();
  for (const char* layer : {"h.0", "h.1"}) {
    weights.erase(std::string(layer) + ".mlp.shared.c_fc.weight");
    weights.erase(std::string(layer) + ".mlp.shared.c_proj.weight");
  }
  m.load_state_dict(weights);
  EXPECT_GT(logits_away_from(m, ref_, "granitemoe."), 1e-3);
}

// Cohere's blocks (LLaMA's sublayers in parallel on one LayerNorm without a
// bias, q and k turned in interleaved pairs, the logits times 0.25) from a
// CohereForCausalLM directory: logits, loss and every gradient (q's and k's
// rows reordered into Triad's halves on the way in), greedy tokens through
// the key/value cache; exported again, the same directory (the rows ordered
// back). The model.safetensors alone reads the same (the model's class says
// how the rows turn); read as another class (the rows left as they are),
// not the reference's logits.
TEST_F(Gpt2Parity, CohereDirectoryReadsAndExportsAsHuggingFacesCohere) {
  const std::string dir = ref_dir() + "/cohere_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "cohere");
  EXPECT_FALSE(cfg.norm_bias);
  EXPECT_TRUE(cfg.parallel_residual && cfg.shared_norm);
  EXPECT_EQ(cfg.logit_scale, 0.25);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  for (const auto& [name, t] : model.state_dict()) EXPECT_EQ(name.find(".bias"), std::string::npos);
  expect_step_zero_matches(model, with_halves_gradients(ref_, cfg, "cohere."), "cohere.");
  expect_greedy_tokens(cfg, "cohere_generator", "cohere.greedy_tokens", ref_);
  expect_exports_as_written(model, dir);
  // The file alone, without its config.json: the model's class (Cohere's)
  // says how its rows turn, so it reads as the directory does.
  testing::TempDir copy;
  const std::string lone = copy.file("model.safetensors");
  std::filesystem::copy_file(dir + "/model.safetensors", lone);
  nn::Gpt alone(cfg, 1);
  io::load_gpt2_safetensors(alone, lone);
  for (const auto& [name, t] : model.state_dict())
    EXPECT_EQ(to_double_vector(alone.state_dict().at(name)), to_double_vector(t)) << name;
  // Read as another class's (the rows left as they are): not the
  // reference's logits. Once from a layout that says so, once from a
  // config.json beside the file that names LLaMA, which describes the file
  // and so decides over the model's class.
  const std::map<std::string, Shape> shapes = nn::gpt_parameter_shapes(cfg);
  io::WeightLayout halves = io::weight_layout(cfg);
  EXPECT_TRUE(halves.interleaved_rotation);
  halves.interleaved_rotation = false;
  nn::Gpt unordered(cfg, 1);
  unordered.load_state_dict(io::load_gpt2_state_dict(lone, shapes, nullptr, halves));
  EXPECT_GT(logits_away_from(unordered, ref_, "cohere."), 1e-3);
  std::ofstream(copy.file("config.json")) << R"({"model_type": "llama"})";
  nn::Gpt as_llama(cfg, 1);
  io::load_gpt2_safetensors(as_llama, lone);
  EXPECT_GT(logits_away_from(as_llama, ref_, "cohere."), 1e-3);
}

// Command R+'s blocks (Cohere's, with a LayerNorm on each query and key head
// whose weights are the head's own: use_qk_norm) from a CohereForCausalLM
// directory: logits, loss and every gradient (the head norms' features
// reordered into Triad's halves with their q and k rows), greedy tokens
// through the key/value cache; exported again, the same directory. With
// the norms' weights left in the file's order: not the reference's logits.
TEST_F(Gpt2Parity, CommandRPlusHeadNormsReadAndExportAsHuggingFacesCohere) {
  const auto model = expect_family_matches("command_r_plus", "cohere", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_TRUE(cfg.qk_head_layernorm);
  EXPECT_EQ(model->state_dict().at("h.0.attn.q_norm.weight").shape(), (Shape{cfg.q_width()}));
  const auto file =
      io::load_safetensors(ref_dir() + "/command_r_plus_hf/model.safetensors").tensors;
  nn::StateDict as_filed = model->state_dict();
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    for (const char* norm : {"q_norm", "k_norm"}) {
      const Tensor& w =
          file.at("model.layers." + std::to_string(i) + ".self_attn." + norm + ".weight");
      as_filed["h." + std::to_string(i) + ".attn." + norm + ".weight"] =
          reshape(contiguous(w), {w.numel()});
    }
  }
  nn::Gpt unordered(cfg, 1);
  unordered.load_state_dict(as_filed);
  EXPECT_GT(logits_away_from(unordered, ref_, "command_r_plus."), 1e-4);
}

// GLM-4's blocks from a Glm4ForCausalLM directory: q, k and v biases, half
// of each head turned in interleaved pairs (those rows of q, k and their
// biases reordered into Triad's halves on the way in), grouped key/value
// heads and four norms a block, to the reference's logits, loss, every
// gradient and greedy tokens; exported again, the same directory. Read as
// if it turned in halves: not the reference's logits.
TEST_F(Gpt2Parity, Glm4DirectoryReadsAndExportsAsHuggingFacesGlm4) {
  const auto model = expect_family_matches("glm4", "glm4", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_TRUE(cfg.qkv_bias && cfg.post_norms);
  EXPECT_EQ(cfg.rope_dim, cfg_["neox_rope_dim"].get<int64_t>());
  io::WeightLayout halves = io::weight_layout(cfg);
  EXPECT_TRUE(halves.interleaved_rotation);
  halves.interleaved_rotation = false;
  testing::TempDir copy;
  std::filesystem::copy_file(ref_dir() + "/glm4_hf/model.safetensors",
                             copy.file("model.safetensors"));
  nn::Gpt unordered(cfg, 1);
  unordered.load_state_dict(io::load_gpt2_state_dict(
      copy.file("model.safetensors"), nn::gpt_parameter_shapes(cfg), nullptr, halves));
  EXPECT_GT(logits_away_from(unordered, ref_, "glm4."), 1e-3);
}

// Helium's blocks from a HeliumForCausalLM directory: LLaMA's, whole heads
// turned in interleaved pairs (q's and k's rows and biases reordered into
// Triad's halves), q, k and v biases, to the reference's logits, loss, every
// gradient and greedy tokens; exported again, the same directory.
TEST_F(Gpt2Parity, HeliumDirectoryReadsAndExportsAsHuggingFacesHelium) {
  const auto model = expect_family_matches("helium", "helium", ref_);
  EXPECT_TRUE(model->config().qkv_bias);
  EXPECT_EQ(model->config().rope_dim, 0);
}

// Seed-OSS's blocks from a SeedOssForCausalLM directory: LLaMA's with q, k
// and v biases on heads of their own width (4 x 12 on d_model 32), to the
// reference's logits, loss, every gradient and greedy tokens; exported
// again, the same directory.
TEST_F(Gpt2Parity, SeedOssDirectoryReadsAndExportsAsHuggingFacesSeedOss) {
  const auto model = expect_family_matches("seed_oss", "seed_oss", ref_);
  EXPECT_TRUE(model->config().qkv_bias);
  EXPECT_TRUE(model->config().heads_apart());
}

// OLMo 3's blocks from an Olmo3ForCausalLM directory: OLMo 2's with a
// window on layer 0 (layer_types) and yarn turning the global layer alone,
// the windowed one unscaled at the same base, to the reference's logits,
// loss, every gradient and greedy tokens past the window; exported again,
// the same directory. With yarn on every layer: not the reference's logits.
TEST_F(Gpt2Parity, Olmo3DirectoryReadsAndExportsAsHuggingFacesOlmo3) {
  const auto model = expect_family_matches("olmo3", "olmo3", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_EQ(cfg.full_attention_layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(cfg.rope_local_theta, cfg.rope_theta);
  nn::GptConfig scaled_everywhere = cfg;
  scaled_everywhere.rope_local_theta = 0.0;
  EXPECT_GT(logits_away_under(scaled_everywhere, *model, ref_, "olmo3."), 1e-4);
}

// EXAONE 4's blocks from an Exaone4ForCausalLM directory: OLMo 2's
// sublayer norms, an RMSNorm over each query and key head, a window on
// layer 0 and the global layer 1 without rope, to the reference's logits,
// loss, every gradient and greedy tokens past the window; exported again,
// the same directory. With rope on the global layer: not the reference's.
TEST_F(Gpt2Parity, Exaone4DirectoryReadsAndExportsAsHuggingFacesExaone4) {
  const auto model = expect_family_matches("exaone4", "exaone4", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_EQ(cfg.nope_layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(cfg.full_attention_layers, (std::vector<int64_t>{1}));
  EXPECT_TRUE(cfg.qk_norm && !cfg.qk_norm_full && !cfg.pre_norms);
  nn::GptConfig turning = cfg;
  turning.nope_layers.clear();
  EXPECT_GT(logits_away_under(turning, *model, ref_, "exaone4."), 1e-3);
}

// Cohere 2's blocks (Cohere's, with a window on every layer but the global
// one, which turns nothing) from a Cohere2ForCausalLM directory: logits,
// loss and every gradient, greedy tokens through the key/value cache past
// the window; exported again, the same directory. The same model with rope
// on its global layer: not the reference's logits.
TEST_F(Gpt2Parity, Cohere2DirectoryReadsAndExportsAsHuggingFacesCohere2) {
  const auto model = expect_family_matches("cohere2", "cohere2", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_EQ(cfg.nope_layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(cfg.full_attention_layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(cfg.sliding_window, cfg_["mistral_window"].get<int64_t>());
  nn::GptConfig turning = cfg;
  turning.nope_layers.clear();
  EXPECT_GT(logits_away_under(turning, *model, ref_, "cohere2."), 1e-3);
}

// SmolLM3's blocks (LLaMA's, its second layer without rope) from a
// SmolLM3ForCausalLM directory: logits, loss and every gradient, greedy
// tokens through the key/value cache, the balance; exported again, the same directory.
// The same model with rope on every layer: not the reference's logits.
TEST_F(Gpt2Parity, Smollm3DirectoryReadsAndExportsAsHuggingFacesSmollm3) {
  const auto model = expect_family_matches("smollm3", "smollm3", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_EQ(cfg.nope_layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(cfg.sliding_window, 0);
  nn::GptConfig turning = cfg;
  turning.nope_layers.clear();
  EXPECT_GT(logits_away_under(turning, *model, ref_, "smollm3."), 1e-3);
}

// StarCoder2's blocks (the sequential block with rope, LayerNorms, biases
// on every linear layer, o_proj's too, an ungated GELU MLP, grouped
// key/value heads, a window) from a Starcoder2ForCausalLM directory:
// logits, loss and every gradient, greedy tokens through the key/value cache
// past the window; exported again, the same directory.
TEST_F(Gpt2Parity, Starcoder2DirectoryReadsAndExportsAsHuggingFacesStarcoder2) {
  const std::string dir = ref_dir() + "/starcoder2_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "starcoder2");
  EXPECT_FALSE(cfg.rms_norm());
  EXPECT_TRUE(cfg.linear_bias);
  EXPECT_EQ(cfg.activation, nn::Activation::Gelu);
  EXPECT_EQ(cfg.sliding_window, cfg_["mistral_window"].get<int64_t>());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  EXPECT_TRUE(model.state_dict().count("h.1.attn.c_proj.bias"));
  expect_step_zero_matches(model, ref_, "starcoder2.");
  expect_greedy_tokens(cfg, "starcoder2_generator", "starcoder2.greedy_tokens", ref_);
  expect_exports_as_written(model, dir);
}

// Nemotron-4's blocks (Minitron's: the sequential block, LayerNorm1P —
// a LayerNorm with its shift, scaling by 1 + weight — a squared-ReLU MLP
// as up_proj and down_proj, heads of 12 over 2 key/value heads with half
// of each turned, an untied head) from a NemotronForCausalLM directory:
// logits, loss and every gradient, greedy tokens through the key/value
// cache; exported again, the same directory. Read without the offset (the
// stored weights as the scales), not the reference's logits.
TEST_F(Gpt2Parity, NemotronDirectoryReadsAndExportsAsHuggingFacesNemotron) {
  const auto model = expect_family_matches("nemotron", "nemotron", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_EQ(cfg.activation, nn::Activation::Relu2);
  EXPECT_FALSE(cfg.rms_norm());
  EXPECT_TRUE(cfg.norm_weight_offset);
  EXPECT_TRUE(cfg.norm_biases());
  EXPECT_FALSE(cfg.linear_bias);
  EXPECT_EQ(cfg.head_dim(), cfg_["qwen3_head_dim"].get<int64_t>());
  EXPECT_EQ(cfg.rope_dim, cfg.head_dim() / 2);
  EXPECT_EQ(cfg.kv_heads(), cfg_["llama_kv_heads"].get<int64_t>());
  EXPECT_TRUE(model->state_dict().count("h.1.ln_2.bias"));
  nn::GptConfig plain = cfg;
  plain.norm_weight_offset = false;
  EXPECT_GT(logits_away_under(plain, *model, ref_, "nemotron."), 1e-3);
}

// Arcee's blocks (AFM-4.5B's: LLaMA's with an ungated squared-ReLU MLP as
// up_proj and down_proj) from an ArceeForCausalLM directory: logits, loss
// and every gradient, greedy tokens through the key/value cache; exported
// again, the same directory. Read as GELU's MLP, not the reference's logits.
TEST_F(Gpt2Parity, ArceeDirectoryReadsAndExportsAsHuggingFacesArcee) {
  const auto model = expect_family_matches("arcee", "arcee", ref_);
  const nn::GptConfig& cfg = model->config();
  EXPECT_EQ(cfg.activation, nn::Activation::Relu2);
  EXPECT_TRUE(cfg.rms_norm());
  EXPECT_EQ(cfg.rope_dim, 0);
  EXPECT_EQ(cfg.ffn(), 4 * cfg.d_model);
  nn::GptConfig gelu = cfg;
  gelu.activation = nn::Activation::Gelu;
  EXPECT_GT(logits_away_under(gelu, *model, ref_, "arcee."), 1e-3);
}

// OLMoE's blocks (pre-norms, the full query/key norms, 4 experts on every
// layer of which each token takes 2, not renormalised) from an
// OlmoeForCausalLM directory, trained with the router z-loss (its weight
// set beside the file, which has no key for it): logits, loss, every
// gradient with the load-balancing loss's and the z-loss's parts, the
// balance and the z-losses; exported again, the same directory.
TEST_F(Gpt2Parity, OlmoeDirectoryReadsAndExportsAsHuggingFacesOlmoe) {
  const std::string dir = ref_dir() + "/olmoe_hf";
  nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.moe.z_loss_coef, 0.0);
  cfg.moe.z_loss_coef = cfg_["moe_z_coef"].get<double>();
  EXPECT_EQ(cfg.hf_type, "olmoe");
  EXPECT_TRUE(cfg.qk_norm_full);
  EXPECT_TRUE(cfg.pre_norms);
  EXPECT_EQ(cfg.moe.experts, 4);
  EXPECT_FALSE(cfg.moe.normalize_top_k);
  EXPECT_EQ(cfg.expert_ffn(), cfg_["moe_ffn"].get<int64_t>());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  expect_step_zero_matches(model, ref_, "olmoe.");
  expect_balance_matches(model, ref_, "olmoe.");
  expect_exports_as_written(model, dir);
  nn::ForwardContext ctx{true, 0, 0};
  ctx.moe_stats = std::make_shared<nn::MoeStats>();
  {
    autograd::NoGradGuard no_grad;
    (void)model.forward(cast(ref_.at("input_ids"), DType::I64), ctx);
  }
  double z = 0;
  for (const double v : to_double_vector(ref_.at("olmoe.z_loss"))) z += v;
  EXPECT_NEAR(ctx.moe_stats->z_loss_sum, z, 1e-5 * z);
  // Without the z-loss the router's gradient is not the reference's.
  nn::GptConfig plain_cfg = cfg;
  plain_cfg.moe.z_loss_coef = 0;
  nn::Gpt plain(plain_cfg, 1);
  plain.load_state_dict(model.state_dict());
  const Tensor ids = cast(ref_.at("input_ids"), DType::I64);
  nn::ForwardContext train{true, 0, 0};
  autograd::backward({plain.loss(ids, cast(ref_.at("targets"), DType::I64), train)});
  const std::vector<double> got =
      to_double_vector(plain.state_dict().at("h.0.mlp.router.weight").grad());
  const std::vector<double> want = to_double_vector(ref_.at("olmoe.grad.h.0.mlp.router.weight"));
  const double worst = worst_difference(got, want);
  EXPECT_GT(worst, 1e-4);
}

TEST_F(Gpt2Parity, GptjDirectoryReadsAndExportsAsHuggingFacesGptj) {
  const std::string dir = ref_dir() + "/gptj_hf";
  const nn::GptConfig cfg = io::load_hf_config(dir);
  EXPECT_EQ(cfg.hf_type, "gptj");
  EXPECT_TRUE(cfg.shared_norm);
  EXPECT_TRUE(cfg.head_bias);
  EXPECT_TRUE(cfg.mlp_bias);
  EXPECT_FALSE(cfg.linear_bias);
  EXPECT_EQ(cfg.rope_dim, cfg_["neox_rope_dim"].get<int64_t>());
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, dir);
  const nn::StateDict weights = model.state_dict();
  // The reference's gradients of c_attn (in GPT-2's Conv1D layout, [in,
  // out]) are in GPT-J's order: compared in Triad's.
  std::map<std::string, Tensor> ref = ref_;
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string key = "gptj.grad.h." + std::to_string(i) + ".attn.c_attn.weight";
    const Tensor rows = contiguous(transpose(ref_.at(key), 0, 1));
    ref[key] =
        contiguous(transpose(io::gptj_qkv_rows_to_triad(rows, cfg.n_head, cfg.rope_dim), 0, 1));
  }
  expect_step_zero_matches(model, ref, "gptj.");
  // The generator: the same model with its weights grown as the
  // reference's greedy_continuation grows them (all but the norms 8x).
  nn::Gpt gen(cfg, 1);
  nn::StateDict grown;
  for (const auto& [name, t] : weights)
    grown[name] = name.find("ln_") != std::string::npos ? t : affine(t, 8.0);
  gen.load_state_dict(grown);
  std::vector<int64_t> prompt, tokens;
  for (double v : to_double_vector(ref_.at("greedy_prompt"))) prompt.push_back(int64_t(v));
  for (double v : to_double_vector(ref_.at("gptj.greedy_tokens"))) tokens.push_back(int64_t(v));
  nn::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = static_cast<int64_t>(tokens.size());
  EXPECT_EQ(nn::generate(gen, prompt, o), tokens);

  // Without the reordering (whole heads turned in halves from GPT-J's rows)
  // the logits are not the reference's.
  nn::Gpt plain(cfg, 1);
  nn::StateDict unordered = weights;
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string key = "h." + std::to_string(i) + ".attn.c_attn.weight";
    unordered[key] = io::triad_qkv_rows_to_gptj(weights.at(key), cfg.n_head, cfg.rope_dim);
  }
  plain.load_state_dict(unordered);
  const Tensor ids = cast(ref_.at("input_ids"), DType::I64);
  const std::vector<double> got = to_double_vector(plain.forward(ids)),
                            want = to_double_vector(ref_.at("gptj.logits"));
  const double worst = worst_difference(got, want);
  EXPECT_GT(worst, 1e-3);
  expect_exports_as_written(model, dir, [](const std::string& name) {
    return name.find(".attn.bias") != std::string::npos ||
           name.find("masked_bias") != std::string::npos;
  });

  // The same model as CodeGen writes it (q, k and v fused in qkv_proj's
  // four shards, each its heads' q, v and k rows): the same weights, and
  // exported again, the same directory.
  const std::string codegen_dir = ref_dir() + "/codegen_hf";
  const nn::GptConfig cg = io::load_hf_config(codegen_dir);
  EXPECT_EQ(cg.hf_type, "codegen");
  nn::Gpt codegen(cg, 1);
  io::load_gpt2_safetensors(codegen, codegen_dir);
  for (const auto& [name, t] : codegen.state_dict())
    EXPECT_EQ(to_double_vector(t), to_double_vector(weights.at(name))) << name;
  expect_exports_as_written(codegen, codegen_dir, [](const std::string& name) {
    return name.find("causal_mask") != std::string::npos ||
           name.find("masked_bias") != std::string::npos;
  });
}

// LLaMA 3.1's RoPE scaling on the LLaMA-style model (its four frequencies
// in all three of the rule's regions), against Hugging Face's rule written
// out in PyTorch.
TEST_F(Gpt2Parity, Llama3RopeScalingLogitsAndGradients) {
  nn::GptConfig cfg = llama_style();
  cfg.rope_scaling = scaling("llama3_scaling", RopeScaling::Kind::Llama3);
  ASSERT_EQ(cfg.rope_scaling.original_seq_len, 32.0);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/llama31_model.safetensors");
  expect_step_zero_matches(model, ref_, "llama31.");
}

// Mistral's sliding window on the LLaMA-style model (each query sees 5 of
// the 16 positions' keys): step 0, and a greedy continuation whose
// key/value-cache steps mask the keys before the window as the kernels
// skip them.
TEST_F(Gpt2Parity, SlidingWindowModelLogitsGradientsAndGreedyTokens) {
  nn::GptConfig cfg = llama_style();
  cfg.sliding_window = cfg_["mistral_window"];
  ASSERT_LT(cfg.sliding_window, cfg.seq_len);
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/mistral_model.safetensors");
  expect_step_zero_matches(model, ref_, "mistral.");
  expect_greedy_tokens(cfg, "mistral_generator.safetensors", "mistral.greedy_tokens", ref_);
}

// The window on layer 1 only, layer 0 seeing every earlier key
// (model.full_attention_layers: [0]): step 0 and a greedy continuation.
TEST_F(Gpt2Parity, WindowOnSomeLayersLogitsGradientsAndGreedyTokens) {
  nn::GptConfig cfg = llama_style();
  cfg.sliding_window = cfg_["mistral_window"];
  cfg.full_attention_layers = {0};
  nn::Gpt model(cfg, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/mixed_window_model.safetensors");
  expect_step_zero_matches(model, ref_, "mixed_window.");
  expect_greedy_tokens(cfg, "mixed_window_generator.safetensors", "mixed_window.greedy_tokens",
                       ref_);
}

// The evaluator's scores (nn/evaluate.h) of `model` on the reference's
// requests under `prefix`: each continuation's summed -log p after its
// context, contexts too long for the window cut from the left, the requests
// batched three rows at a time (padded to the longest).
void expect_scores_match(const nn::Gpt& model, const std::string& prefix,
                         const std::map<std::string, Tensor>& ref) {
  const std::vector<double> tokens = to_double_vector(ref.at(prefix + "scored_tokens"));
  const std::vector<double> lengths = to_double_vector(ref.at(prefix + "scored_lengths"));
  const std::vector<double> want = to_double_vector(ref.at(prefix + "scored_nll"));
  std::vector<nn::ContinuationRequest> requests;
  size_t at = 0;
  for (size_t r = 0; r < want.size(); ++r) {
    auto take = [&](double count) {
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < int64_t(count); ++i) ids.push_back(int64_t(tokens[at++]));
      return ids;
    };
    std::vector<int64_t> context = take(lengths[2 * r]);
    requests.push_back({context, take(lengths[2 * r + 1])});
  }
  ASSERT_EQ(at, tokens.size());
  const auto got = nn::score_continuations(model, requests, 3);
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_NEAR(got[r].nll, want[r], 1e-4 * want[r]) << prefix << "request " << r;
    EXPECT_EQ(got[r].tokens, int64_t(lengths[2 * r + 1]));
  }
}

// The evaluator's log-likelihoods against PyTorch's log_softmax: GPT-2's
// learned positions and Mistral's window over rows longer than it.
TEST_F(Gpt2Parity, ContinuationScoresArePyTorchsLogLikelihoods) {
  nn::Gpt gen(model_cfg_, 1);
  io::load_gpt2_safetensors(gen, ref_dir() + "/generator.safetensors");
  expect_scores_match(gen, "", ref_);
  nn::GptConfig cfg = llama_style();
  cfg.sliding_window = cfg_["mistral_window"];
  nn::Gpt mistral(cfg, 1);
  io::load_gpt2_safetensors(mistral, ref_dir() + "/mistral_generator.safetensors");
  expect_scores_match(mistral, "mistral.", ref_);
}

TEST_F(Gpt2Parity, GreedyGenerationPicksPyTorchsTokens) {
  nn::Gpt model(model_cfg_, 1);
  io::load_gpt2_safetensors(model, ref_dir() + "/generator.safetensors");
  std::vector<int64_t> prompt, want;
  for (double v : to_double_vector(ref_.at("greedy_prompt"))) prompt.push_back(int64_t(v));
  for (double v : to_double_vector(ref_.at("greedy_tokens"))) want.push_back(int64_t(v));
  ASSERT_GT(static_cast<int64_t>(prompt.size() + want.size()), model_cfg_.seq_len);
  nn::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = static_cast<int64_t>(want.size());
  EXPECT_EQ(nn::generate(model, prompt, o), want);
}

// With log.grad_norms: layers, each step's gradient norm block by block
// (and of the embeddings and the final norm) is PyTorch's too.
TEST_F(Gpt2Parity, TenAdamWStepsWithDecayClippingAndAccumulation) {
  train::Config c = reference_run(model_cfg_, "model.safetensors");
  c.log_grad_norms = "layers";
  train::Trainer trainer(c);
  auto want = to_double_vector(ref_.at("losses"));
  auto norms = to_double_vector(ref_.at("grad_norms"));
  const std::vector<std::string> groups = cfg_.at("layer_grad_norm_groups");
  const auto layer_norms = to_double_vector(ref_.at("layer_grad_norms"));
  ASSERT_EQ(layer_norms.size(), groups.size() * static_cast<size_t>(c.train.steps));
  for (int64_t k = 0; k < c.train.steps; ++k) {
    train::StepMetrics m = trainer.step(k);
    EXPECT_NEAR(m.loss, want[k], 1e-5 * want[k]) << "step " << k;
    EXPECT_NEAR(m.grad_norm, norms[k], 1e-4 * norms[k]) << "step " << k;
    ASSERT_EQ(m.grad_norms.size(), groups.size()) << "step " << k;
    for (size_t g = 0; g < groups.size(); ++g) {
      const double norm = layer_norms[static_cast<size_t>(k) * groups.size() + g];
      EXPECT_EQ(m.grad_norms[g].first, groups[g]);
      EXPECT_NEAR(m.grad_norms[g].second, norm, 1e-4 * norm) << "step " << k << " " << groups[g];
    }
  }
}

// train.optimizer muon on the LLaMA-style model (grouped-query c_attn: q,
// k and v of two widths; SwiGLU's gate and value): 10 steps against the
// reference's Muon written out in PyTorch, AdamW on the embeddings, head
// and norms, with the same clipping, schedule and accumulation.
TEST_F(Gpt2Parity, TenMuonStepsOnTheLlamaStyleModel) {
  train::Config c = reference_run(llama_style(), "llama_model.safetensors");
  c.train.optimizer = "muon";
  train::Trainer trainer(c);
  const auto want = to_double_vector(ref_.at("muon.losses"));
  const auto norms = to_double_vector(ref_.at("muon.grad_norms"));
  // The same run under AdamW departs from the reference's: the losses
  // below see Muon's updates.
  c.train.optimizer = "adamw";
  train::Trainer adamw(c);
  double departed = 0;
  for (int64_t k = 0; k < c.train.steps; ++k) {
    const train::StepMetrics m = trainer.step(k);
    EXPECT_NEAR(m.loss, want[k], 1e-5 * want[k]) << "step " << k;
    EXPECT_NEAR(m.grad_norm, norms[k], 1e-4 * norms[k]) << "step " << k;
    departed = std::max(departed, std::abs(adamw.step(k).loss - want[k]) / want[k]);
  }
  EXPECT_GT(departed, 1e-3);
}

}  // namespace
}  // namespace triad
