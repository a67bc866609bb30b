#include "triad/parallel/tensor/gpt.h"

#include <algorithm>
#include <cmath>

#include "triad/autograd/checkpoint.h"
#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/core/rng.h"
#include "triad/nn/documents.h"
#include "triad/nn/init.h"
#include "triad/ops.h"
#include "triad/optim/clip.h"
#include "triad/parallel/context/all_gather.h"
#include "triad/parallel/context/ring.h"
#include "triad/parallel/context/ulysses.h"
#include "triad/parallel/expert/dispatch.h"
#include "triad/parallel/tensor/mappings.h"

namespace triad::tp {
namespace {

// A named container so the TP model keeps GPT-2's parameter names.
class Container : public nn::Module {
 public:
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

}  // namespace

StagePlan StagePlan::whole(int64_t n_layer) {
  StagePlan p;
  for (int64_t i = 0; i < n_layer; ++i) p.layers.push_back(i);
  return p;
}

TensorParallelGpt::TensorParallelGpt(const nn::GptConfig& cfg, uint64_t seed,
                                     dist::ProcessGroupPtr group, bool sequence_parallel)
    : TensorParallelGpt(cfg, seed, std::move(group), sequence_parallel,
                        StagePlan::whole(cfg.n_layer)) {}

TensorParallelGpt::TensorParallelGpt(const nn::GptConfig& cfg, uint64_t seed,
                                     dist::ProcessGroupPtr group, bool sequence_parallel,
                                     StagePlan plan, dist::ProcessGroupPtr experts,
                                     dist::ProcessGroupPtr context, cp::Exchange exchange,
                                     cp::Hierarchy hierarchy)
    : cfg_(cfg),
      group_(std::move(group)),
      sp_(sequence_parallel),
      exchange_(exchange),
      hierarchy_(std::move(hierarchy)),
      plan_(std::move(plan)) {
  if (experts && experts->size() > 1) expert_group_ = std::move(experts);
  if (context && context->size() > 1) cp_ = std::move(context);
  build(seed);
}

TensorParallelGpt::TensorParallelGpt(const nn::GptConfig& cfg, uint64_t seed,
                                     dist::ProcessGroupPtr group, bool sequence_parallel,
                                     StagePlan plan,
                                     std::shared_ptr<VocabParallelEmbedding> embedding,
                                     dist::ProcessGroupPtr experts, dist::ProcessGroupPtr context,
                                     cp::Exchange exchange, cp::Hierarchy hierarchy)
    : cfg_(cfg),
      group_(std::move(group)),
      sp_(sequence_parallel),
      exchange_(exchange),
      hierarchy_(std::move(hierarchy)),
      plan_(std::move(plan)) {
  if (experts && experts->size() > 1) expert_group_ = std::move(experts);
  if (context && context->size() > 1) cp_ = std::move(context);
  if (!embedding || !plan_.head || plan_.embedding || !cfg_.head_reads_token_embedding()) {
    throw ValueError(
        "TensorParallelGpt: a shared token embedding goes only to a last stage without the "
        "embedding whose head is tied to it or whose prediction modules read it (embedding " +
        std::string(embedding ? "given" : "missing") + ", head " + (plan_.head ? "yes" : "no") +
        ", first stage " + (plan_.embedding ? "yes" : "no") + ", tie_embeddings " +
        (cfg_.tie_embeddings ? "true" : "false") + ", mtp_layers " +
        std::to_string(cfg_.mtp_layers) + ")");
  }
  build(seed, std::move(embedding));
}

void TensorParallelGpt::require(bool held, const char* what) const {
  if (!held)
    throw ValueError(std::string("TensorParallelGpt: this pipeline stage does not hold ") + what);
}

void TensorParallelGpt::build(uint64_t seed, std::shared_ptr<VocabParallelEmbedding> embedding) {
  cfg_.validate();
  const int t = group_->size();
  if (cfg_.n_head % t != 0) {
    throw ConfigError("model.n_head (" + std::to_string(cfg_.n_head) +
                      ") must be divisible by parallel.tp (" + std::to_string(t) + ")");
  }
  if (!cfg_.kv_heads_fit(t)) {
    // A key/value head is never split across ranks (Megatron-LM's rule);
    // unlike Megatron-LM, fewer heads than ranks are shared.
    throw ConfigError("model.n_kv_head (" + std::to_string(cfg_.kv_heads()) + ") " +
                      cfg_.kv_heads_rule(t, "parallel.tp"));
  }
  if (sp_ && cfg_.seq_len % t != 0) {
    throw ConfigError("model.seq_len (" + std::to_string(cfg_.seq_len) +
                      ") must be divisible by parallel.tp (" + std::to_string(t) +
                      ") with sequence parallelism");
  }
  for (int64_t i : plan_.layers) {
    if (i < 0 || i >= cfg_.n_layer) {
      throw ValueError("stage plan: layer " + std::to_string(i) + " is outside [0, " +
                       std::to_string(cfg_.n_layer) + ")");
    }
  }
  const int64_t a2a = hierarchy_.a2a ? hierarchy_.a2a->size() : 1;
  if (cp_) cp::check_context_parallel(cfg_, t, cp_->size(), sp_, exchange_, a2a);
  exchange_ = cp::resolve_exchange(exchange_, cfg_, t, cp_ ? cp_->size() : 1);
  if (cp_ && exchange_ == cp::Exchange::AllToAllRing) {
    // The context-parallel group's members: the all-to-all's, the ring
    // position's a2a consecutive ones; the ring's, those at the all-to-all
    // rank's place in every position (dist::MeshShape::context_a2a_groups,
    // context_ring_groups).
    bool fits = hierarchy_.defined() && a2a * hierarchy_.ring->size() == cp_->size();
    const std::vector<int>& all = cp_->members();
    for (int i = 0; fits && i < a2a; ++i) {
      fits = hierarchy_.a2a->members()[static_cast<size_t>(i)] ==
             all[static_cast<size_t>(hierarchy_.ring->rank() * a2a + i)];
    }
    for (int j = 0; fits && j < hierarchy_.ring->size(); ++j) {
      fits = hierarchy_.ring->members()[static_cast<size_t>(j)] ==
             all[static_cast<size_t>(j * a2a + hierarchy_.a2a->rank())];
    }
    if (!fits) {
      throw ValueError(
          "TensorParallelGpt: parallel.cp_comm all_to_all+ring needs the context-parallel "
          "group's all-to-all groups (blocks of a2a consecutive ranks) and ring groups (the "
          "ranks a2a apart; dist::DeviceMesh::cp_a2a and cp_ring)" +
          (hierarchy_.defined() ? ", got groups of " + std::to_string(a2a) + " and " +
                                      std::to_string(hierarchy_.ring->size()) + " ranks at rank " +
                                      std::to_string(cp_->rank()) + " of " +
                                      std::to_string(cp_->size()) + " laid out otherwise"
                                : std::string()));
    }
  }
  bool dense_mlps = false;
  for (int64_t i : plan_.layers) dense_mlps = dense_mlps || !cfg_.moe_layer(i);
  if (dense_mlps && cfg_.ffn() % t != 0) {
    throw ConfigError("model.ffn_hidden_size (" + std::to_string(cfg_.ffn()) +
                      ") must be divisible by parallel.tp (" + std::to_string(t) + ")");
  }
  const bool gated = cfg_.gated_mlp();
  const int64_t C = cfg_.d_model;
  if (expert_group_) {
    if (cfg_.moe.experts == 0) {
      throw ConfigError("parallel.ep (" + std::to_string(expert_group_->size()) +
                        ") shares a mixture's experts out, but the model has none (model.moe)");
    }
    experts_ = std::make_shared<ep::ExpertParallel>(cfg_.moe.experts, expert_group_);
  }
  if (plan_.embedding || (plan_.head && cfg_.head_reads_token_embedding())) {
    wte_ = register_module("wte", embedding ? std::move(embedding)
                                            : std::make_shared<VocabParallelEmbedding>(
                                                  cfg_.vocab_size, C, group_, sp_));
    specs_["wte.weight"] = wte_->spec();
  }
  if (plan_.embedding && !cfg_.rotary()) {
    wpe_ = register_module("wpe", std::make_shared<nn::Embedding>(cfg_.seq_len, C));
    // Under sequence parallelism each rank looks up only its positions.
    specs_["wpe.weight"] = ShardSpec::replicated(sp_);
  }
  // Layer i's modules (a block of the model's kind, as nn::Block builds
  // one) and their shard specs, under the names prefix p.
  const auto make_layer = [&](int64_t i, const std::string& p) {
    auto block = std::make_shared<Container>();
    Layer L;
    if (cfg_.pre_norms) {
      L.ln_1 = block->add("ln_1", nn::stream_norm(cfg_));
    }
    auto attn = block->add("attn", std::make_shared<Container>());
    const bool b = cfg_.linear_bias, mb = cfg_.mlp_biases();
    // [q | k | v] split block by block at whole heads: a rank holds its
    // query heads and the key/value heads they use (with fewer key/value
    // heads than ranks, the one head, shared with the ranks next to it).
    const int64_t q = cfg_.q_width(), kv = cfg_.kv_heads() * cfg_.head_dim(), hd = cfg_.head_dim();
    if (cfg_.latent_attention()) {
      L.latent = std::make_shared<nn::LatentProjections>(cfg_, cfg_.n_head / t, i);
      for (const auto& [name, layer] : L.latent->layers()) attn->add(name, layer);
    } else {
      L.c_attn = attn->add("c_attn", std::make_shared<ColumnParallelLinear>(
                                         C, std::vector<int64_t>{q, kv, kv}, group_, sp_,
                                         cfg_.c_attn_bias(), std::vector<int64_t>{hd, hd, hd}));
    }
    L.attn_proj = attn->add(
        "c_proj", std::make_shared<RowParallelLinear>(cfg_.attn_out_width(), C, group_, sp_, b));
    if (cfg_.qk_head_layernorm) {
      // Command R+'s (model.qk_norm: head_layernorm): each rank the weights
      // of its own query and key/value heads.
      L.q_head_norm = attn->add(
          "q_norm", std::make_shared<nn::HeadLayerNorm>(cfg_.n_head / t, hd, cfg_.layer_norm_eps));
      L.k_head_norm = attn->add("k_norm", std::make_shared<nn::HeadLayerNorm>(
                                              cfg_.kv_heads_per_rank(t), hd, cfg_.layer_norm_eps));
    } else if (cfg_.qk_norm) {
      // Per head: the heads' width, on every rank. Full (model.qk_norm:
      // full): the whole queries' and keys' widths, on every rank, each
      // normalising the gathered projections.
      auto norm = [&](int64_t width) {
        return std::make_shared<nn::LayerNorm>(width, cfg_.layer_norm_eps, DType::F32, true,
                                               cfg_.norm_weight_offset);
      };
      L.q_norm = attn->add("q_norm", norm(cfg_.q_norm_width()));
      L.k_norm = attn->add("k_norm", norm(cfg_.k_norm_width()));
    }
    if (cfg_.pre_norms && !cfg_.shared_norm) {
      L.ln_2 = block->add("ln_2", nn::stream_norm(cfg_));
    }
    if (cfg_.moe_layer(i)) {
      // Every expert split as the MLP is (c_fc's rows by half when gated,
      // c_proj's columns); the router whole on every rank.
      L.moe = block->add("mlp", std::make_shared<nn::MoeMlp>(cfg_, i, t, experts_, group_->rank()));
      if (cp_) {
        // Its balance counts every chunk of the micro-batch's sequences, and
        // a capacity chooses among all of them.
        L.moe->set_chunks(
            {cp_->size(),
             [g = cp_](std::vector<double>& v) {
               Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}, DType::F64);
               g->all_reduce(t, dist::ReduceOp::Sum)->wait();
               v = to_double_vector(t);
             },
             cp_->rank(),
             [g = cp_](const std::vector<double>& v) {
               const auto n = static_cast<int64_t>(v.size());
               Tensor all = empty({n * g->size()}, DType::F64);
               g->all_gather(from_vector(v, {n}, DType::F64), all)->wait();
               return to_double_vector(all);
             },
             [layout = layout()](int64_t T, int64_t r) { return cp::chunk_runs(T, r, layout); },
             [g = cp_](const Tensor& t) { return gather_from_sequence_region(t, g); },
             [layout = layout()](const Tensor& t) { return cp::to_sequence_order(t, 1, layout); }});
      }
    } else {
      auto mlp = block->add("mlp", std::make_shared<Container>());
      // SwiGLU's c_fc holds [gate | value]: each half split over the ranks,
      // so a rank's shard is its gate and value columns (the full tensor
      // keeps one process's layout).
      L.c_fc = mlp->add("c_fc", std::make_shared<ColumnParallelLinear>(C, cfg_.fc_width(), group_,
                                                                       sp_, gated ? 2 : 1, mb));
      L.mlp_proj =
          mlp->add("c_proj", std::make_shared<RowParallelLinear>(cfg_.ffn(), C, group_, sp_, mb));
    }
    if (cfg_.post_norms) {
      // On the row-parallel layers' reduced outputs: the whole width, and
      // under sequence parallelism this rank's tokens, as ln_1 and ln_2.
      L.post_attn_norm = block->add("post_attn_norm", nn::stream_norm(cfg_));
      L.post_mlp_norm = block->add("post_mlp_norm", nn::stream_norm(cfg_));
    }
    L.module = block;
    for (const char* ln : nn::block_norms(cfg_)) {
      if (cfg_.norm_weights()) specs_[p + ln + ".weight"] = ShardSpec::replicated(sp_);
      if (cfg_.norm_biases()) specs_[p + ln + ".bias"] = ShardSpec::replicated(sp_);
    }
    if (cfg_.qk_head_layernorm) {
      // Split as c_attn's q and k blocks are, at whole heads (a shared
      // key/value head's weights with it: their gradient summed over the
      // ranks sharing it).
      specs_[p + "attn.q_norm.weight"] = ShardSpec::along(0);
      specs_[p + "attn.k_norm.weight"] = ShardSpec::along_blocks(0, {kv}, {hd});
    } else if (cfg_.qk_norm) {
      // Replicated, each rank normalising its own heads: their gradients
      // are partial sums over the ranks, with or without sequence
      // parallelism. Full norms see every head on every rank: their
      // gradients are whole, the same on each.
      specs_[p + "attn.q_norm.weight"] = ShardSpec::replicated(!cfg_.qk_norm_full);
      specs_[p + "attn.k_norm.weight"] = ShardSpec::replicated(!cfg_.qk_norm_full);
    }
    if (L.latent) {
      // The up-projections' rows are whole heads, in head order: each rank
      // its heads'. The layers before them see every rank's input alike,
      // but each rank's heads send back only their part of the gradient:
      // partial sums, with or without sequence parallelism.
      for (const auto& [name, shape] : nn::latent_attention_shapes(cfg_, cfg_.n_head)) {
        const bool heads = name.rfind("q_b_proj.", 0) == 0 || name.rfind("q_proj.", 0) == 0 ||
                           name.rfind("kv_b_proj.", 0) == 0;
        specs_[p + "attn." + name] = heads ? ShardSpec::along(0) : ShardSpec::replicated(true);
        // LoRA's adapters: B split as its layer's rows are, A whole; their
        // gradients partial as the layer's are.
        const std::string layer = "attn." + name.substr(0, name.rfind('.'));
        if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
            cfg_.lora_on(layer)) {
          specs_[p + layer + ".lora_a"] = ShardSpec::replicated(true);
          specs_[p + layer + ".lora_b"] = heads ? ShardSpec::along(0) : ShardSpec::replicated(true);
        }
      }
    } else {
      specs_[p + "attn.c_attn.weight"] = L.c_attn->weight_spec();
    }
    specs_[p + "attn.c_proj.weight"] = L.attn_proj->weight_spec();
    if (L.moe) {
      // The router's gradient: the same on every rank, or under sequence
      // parallelism each rank's tokens' part.
      specs_[p + "mlp.router.weight"] = ShardSpec::replicated(sp_);
      // The expert biases: the same on every rank, never a gradient.
      if (cfg_.moe.expert_bias) specs_[p + "mlp.expert_bias"] = ShardSpec::replicated();
      const int64_t first = experts_ ? experts_->first() : 0;
      const int64_t count = experts_ ? experts_->count() : cfg_.moe.experts;
      // Their LoRA adapters split with them (B's rows as c_fc's, A's
      // columns as c_proj's); the whole A of c_fc and B of c_proj take
      // partial gradients, as a column- and a row-parallel layer's do.
      const auto expert_specs = [&](const std::string& x) {
        specs_[x + "c_fc.weight"] = ShardSpec::along(0, gated ? 2 : 1);
        specs_[x + "c_proj.weight"] = ShardSpec::along(1);
        if (cfg_.lora_on("mlp.c_fc")) {
          specs_[x + "c_fc.lora_a"] = ColumnParallelLinear::lora_a_spec();
          specs_[x + "c_fc.lora_b"] = ShardSpec::along(0, gated ? 2 : 1);
        }
        if (cfg_.lora_on("mlp.c_proj")) {
          specs_[x + "c_proj.lora_a"] = ShardSpec::along(1);
          specs_[x + "c_proj.lora_b"] = RowParallelLinear::lora_b_spec();
        }
      };
      for (int64_t e = first; e < first + count; ++e)
        expert_specs(p + "mlp.experts." + std::to_string(e) + ".");
      // The shared expert split as the experts are; its gate whole, as the
      // router.
      if (cfg_.moe.shared_ffn_hidden_size > 0) expert_specs(p + "mlp.shared.");
      if (cfg_.moe.shared_gate) specs_[p + "mlp.shared_gate.weight"] = ShardSpec::replicated(sp_);
    } else {
      specs_[p + "mlp.c_fc.weight"] = L.c_fc->weight_spec();
      specs_[p + "mlp.c_proj.weight"] = L.mlp_proj->weight_spec();
    }
    if (L.c_attn && cfg_.c_attn_bias()) specs_[p + "attn.c_attn.bias"] = L.c_attn->bias_spec();
    if (b) specs_[p + "attn.c_proj.bias"] = L.attn_proj->bias_spec();
    if (mb && !L.moe) {
      specs_[p + "mlp.c_fc.bias"] = L.c_fc->bias_spec();
      specs_[p + "mlp.c_proj.bias"] = L.mlp_proj->bias_spec();
    }
    // LoRA adapters, split with their layers.
    const int64_t r = cfg_.lora.rank;
    const double scale = cfg_.lora.rank > 0 ? cfg_.lora_scale() : 0.0;
    for (const auto& [name, column] :
         {std::pair{"attn.c_attn", L.c_attn.get()}, std::pair{"mlp.c_fc", L.c_fc.get()}}) {
      if (!cfg_.lora_on(name) || !column) continue;
      column->enable_lora(r, scale, cfg_.lora_dropout(i, name));
      specs_[p + name + ".lora_a"] = ColumnParallelLinear::lora_a_spec();
      specs_[p + name + ".lora_b"] = column->lora_b_spec();
    }
    for (const auto& [name, row] :
         {std::pair{"attn.c_proj", L.attn_proj.get()}, std::pair{"mlp.c_proj", L.mlp_proj.get()}}) {
      if (!cfg_.lora_on(name) || !row) continue;
      row->enable_lora(r, scale, cfg_.lora_dropout(i, name));
      specs_[p + name + ".lora_a"] = row->lora_a_spec();
      specs_[p + name + ".lora_b"] = RowParallelLinear::lora_b_spec();
    }
    layers_[i] = L;
    return block;
  };
  auto h = register_module("h", std::make_shared<Container>());
  for (int64_t i : plan_.layers)
    h->add(std::to_string(i), make_layer(i, "h." + std::to_string(i) + "."));
  if (plan_.head) {
    ln_f_ = register_module("ln_f", nn::stream_norm(cfg_));
    if (cfg_.norm_weights()) specs_["ln_f.weight"] = ShardSpec::replicated(sp_);
    if (cfg_.norm_biases()) specs_["ln_f.bias"] = ShardSpec::replicated(sp_);
    if (cfg_.tie_embeddings) {
      head_ = wte_;
    } else {
      head_ = register_module("lm_head", std::make_shared<VocabParallelEmbedding>(
                                             cfg_.vocab_size, C, group_, sp_, cfg_.head_bias));
      specs_["lm_head.weight"] = head_->spec();
      if (cfg_.head_bias) specs_["lm_head.bias"] = head_->spec();
    }
    // Multi-token prediction's modules beside the head: each one's block
    // split as the others are (layer n_layer + k - 1), its norms and
    // eh_proj whole on every rank, which reads its own tokens under
    // sequence parallelism (partial gradients then) and all of them
    // alike otherwise.
    if (cfg_.mtp_layers > 0) {
      auto mtp = register_module("mtp", std::make_shared<Container>());
      for (int64_t k = 1; k <= cfg_.mtp_layers; ++k) {
        const std::string p = "mtp." + std::to_string(k - 1) + ".";
        auto module = std::make_shared<Container>();
        Mtp m;
        m.ln_embed = module->add("ln_embed", nn::stream_norm(cfg_));
        m.ln_hidden = module->add("ln_hidden", nn::stream_norm(cfg_));
        m.eh_proj = module->add("eh_proj", std::make_shared<nn::Linear>(2 * C, C, false));
        m.layer = cfg_.n_layer + k - 1;
        module->add("block", make_layer(m.layer, p + "block."));
        m.ln_out = module->add("ln_out", nn::stream_norm(cfg_));
        for (const char* ln : {"ln_embed", "ln_hidden", "ln_out"}) {
          if (cfg_.norm_weights()) specs_[p + ln + ".weight"] = ShardSpec::replicated(sp_);
          if (cfg_.norm_biases()) specs_[p + ln + ".bias"] = ShardSpec::replicated(sp_);
        }
        specs_[p + "eh_proj.weight"] = ShardSpec::replicated(sp_);
        mtp->add(std::to_string(k - 1), module);
        mtp_.push_back(m);
      }
    }
  }
  std::vector<int64_t> layer_ids;  // (the model's blocks: not the prediction modules')
  for (const auto& [i, L] : layers_)
    if (i < cfg_.n_layer) layer_ids.push_back(i);
  full_shapes_ =
      nn::gpt_parameter_shapes(cfg_, layer_ids, wte_ != nullptr, plan_.embedding, ln_f_ != nullptr);
  // Experts other ranks of the expert-parallel group hold.
  for (auto it = full_shapes_.begin(); it != full_shapes_.end();) {
    if (is_expert(it->first) && !specs_.count(it->first)) {
      others_experts_.insert(*it);
      it = full_shapes_.erase(it);
    } else {
      ++it;
    }
  }
  // Layout-independent initialisation: cut each rank's shard from the full
  // initial value, a pure function of (seed, name, full shape), one tensor
  // at a time (a rank never holds more than one full tensor beyond its own
  // shards).
  for (const auto& [name, shape] : full_shapes_) {
    const Tensor full = nn::init_parameter(name, shape, nn::gpt_init_rule(name, shape, cfg_), seed);
    Tensor p = parameter(name, "TensorParallelGpt");
    copy_(p, specs_.at(name).cut(full, group_->rank(), group_->size()));
  }
}

Tensor TensorParallelGpt::parameter(const std::string& name, const char* caller) const {
  const Tensor* p = find_parameter(name);
  if (p == nullptr) {
    throw ValueError(std::string(caller) + ": '" + name + "' is not a parameter of this model");
  }
  return *p;
}

void TensorParallelGpt::load_full_state_dict(const nn::StateDict& full) {
  nn::StateDict mine;
  for (const auto& [name, shape] : full_shapes()) {
    auto it = full.find(name);
    if (it == full.end()) throw ValueError("load_full_state_dict: missing '" + name + "'");
    mine.emplace(name, it->second);
  }
  load_full_tensors(mine);
}

bool TensorParallelGpt::is_expert(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

void TensorParallelGpt::load_full_tensors(const nn::StateDict& part) {
  // Every tensor is checked before any parameter changes.
  for (const auto& [name, t] : part) {
    auto it = full_shapes_.find(name);
    if (it == full_shapes_.end()) {
      if (auto other = others_experts_.find(name); other != others_experts_.end()) {
        if (t.shape() != other->second) {
          throw ShapeError("load_full_state_dict: '" + name + "' has shape " +
                           shape_str(t.shape()) + ", expected " + shape_str(other->second));
        }
        continue;  // another expert-parallel rank's
      }
      throw ValueError("load_full_tensors: '" + name + "' is not a parameter of this model");
    }
    if (t.shape() != it->second) {
      throw ShapeError("load_full_state_dict: '" + name + "' has shape " + shape_str(t.shape()) +
                       ", expected " + shape_str(it->second));
    }
  }
  for (const auto& [name, t] : part) {
    if (others_experts_.count(name)) continue;
    Tensor p = parameter(name, "load_full_tensors");
    copy_(p, specs_.at(name).cut(t, group_->rank(), group_->size()));
  }
}

Tensor TensorParallelGpt::join(const std::string& name, const Tensor& p, bool on_host) const {
  const ShardSpec& spec = specs_.at(name);
  const Shape& shape = full_shapes_.at(name);
  Tensor full;
  if (!spec.split || group_->size() == 1) {
    full = spec.split ? spec.assemble({p}, shape) : p;
  } else {
    Tensor flat = reshape(contiguous(p).detach(), {p.numel()}).detach();
    Tensor all = empty({p.numel() * group_->size()}, p.dtype(), p.device());
    group_->all_gather(flat, all)->wait();
    std::vector<Tensor> shards;
    for (int r = 0; r < group_->size(); ++r) {
      shards.push_back(reshape(narrow(all, 0, r * p.numel(), p.numel()), p.shape()).detach());
    }
    full = spec.assemble(shards, shape);
  }
  // A copy never shares the parameter's storage; on the host the tensor
  // leaves the device as soon as it is joined.
  if (on_host && !full.device().is_cpu())
    return to_device(contiguous(full), Device::cpu()).detach();
  return spec.split ? full : clone(p).detach();  // (assemble makes a new tensor)
}

nn::StateDict TensorParallelGpt::full_state_dict(bool on_host) const {
  autograd::NoGradGuard ng;
  nn::StateDict out;
  for (const auto& [name, p] : named_parameters()) {
    if (!is_expert(name) || !expert_group_) out[name] = join(name, p, on_host);
  }
  // Every expert (the group's ranks in the same, name, order).
  std::map<std::string, Shape> experts = others_experts_;
  for (const auto& [name, shape] : full_shapes_) {
    if (is_expert(name) && expert_group_) experts.emplace(name, shape);
  }
  for (const auto& [name, shape] : experts) out[name] = full_tensor(name, on_host);
  return out;
}

Tensor TensorParallelGpt::full_tensor(const std::string& name, bool on_host) const {
  autograd::NoGradGuard ng;
  if (!expert_group_ || !is_expert(name))
    return join(name, parameter(name, "full_tensor"), on_host);
  // An expert under expert parallelism: its holder's tensor-parallel group
  // joins it, and the holder sends it to the other ranks of its
  // expert-parallel group (every rank of which has the same position in its
  // own tensor-parallel group).
  const auto other = others_experts_.find(name);
  const bool mine = other == others_experts_.end();
  if (mine && !full_shapes_.count(name))
    throw ValueError("full_tensor: '" + name + "' is not a parameter of this model");
  const Shape& shape = mine ? full_shapes_.at(name) : other->second;
  const size_t at = name.find(".mlp.experts.") + std::string(".mlp.experts.").size();
  const int64_t expert = std::stoll(name.substr(at));
  const int holder = static_cast<int>(expert / experts_->count());
  const auto params = parameters();
  const DType dtype = params.empty() ? DType::F32 : params.front().dtype();
  const Device device = params.empty() ? Device::cpu() : params.front().device();
  Tensor t = mine ? contiguous(join(name, parameter(name, "full_tensor"), false)).detach()
                  : empty(shape, dtype, device);
  expert_group_->broadcast(t, holder)->wait();
  return on_host && !t.device().is_cpu() ? to_device(t, Device::cpu()).detach() : t;
}

void TensorParallelGpt::reduce_partial_grads() const {
  autograd::NoGradGuard ng;
  const int size = group_->size();
  if (size == 1) return;
  // Every partial gradient goes into one flat buffer (per dtype) summed by
  // one all-reduce: a model has a few such tensors per layer (under
  // sequence parallelism every norm and row-parallel bias), each far too
  // small to be worth a collective of its own.
  struct Slot {
    Tensor grad;  // this rank's part of the buffer, as the gradient's view
    int64_t at;   // where it lies in the buffer
  };
  struct Buffer {
    std::vector<Slot> slots;
    int64_t numel = 0;
    Device device = Device::cpu();
  };
  std::map<DType, Buffer> buffers;
  for (const auto& [name, p] : named_parameters()) {
    const ShardSpec& spec = specs_.at(name);
    Tensor g = p.grad();
    if (!g.defined() || (!spec.partial_grad && !spec.shares_blocks(size))) continue;
    if (!g.is_contiguous()) {  // (the sums are written back through views)
      throw ValueError("reduce_partial_grads: the gradient of '" + name + "' is not contiguous");
    }
    Buffer& b = buffers[g.dtype()];
    b.device = g.device();
    if (spec.partial_grad) {
      b.slots.push_back({reshape(g, {g.numel()}), b.numel});
      b.numel += g.numel();
      continue;
    }
    // A shared key/value head's gradient is a partial sum over the ranks
    // sharing it (each saw its own query heads): every rank puts its pieces
    // in their places among all the shared heads' rows, the rest zeros.
    int64_t rows = 0;
    const auto pieces = spec.shared_pieces(group_->rank(), size, &rows);
    const int64_t row = g.numel() / g.size(0);
    for (const auto& piece : pieces) {
      b.slots.push_back({reshape(narrow(g, 0, piece.shard_at, piece.width), {piece.width * row}),
                         b.numel + piece.shared_at * row});
    }
    b.numel += rows * row;
  }
  for (auto& [dtype, b] : buffers) {
    Tensor flat = zeros({b.numel}, dtype, b.device);
    for (const Slot& s : b.slots) {
      Tensor into = narrow(flat, 0, s.at, s.grad.numel());
      copy_(into, s.grad);
    }
    group_->all_reduce(flat, dist::ReduceOp::Sum)->wait();
    for (Slot& s : b.slots) copy_(s.grad, narrow(flat, 0, s.at, s.grad.numel()));
  }
}

bool TensorParallelGpt::reduces_after_backward(const std::string& name) const {
  // (A group of one has no partial sums: reduce_partial_grads does nothing,
  // and the data-parallel buckets need not wait for it.)
  if (group_->size() == 1) return false;
  const ShardSpec& spec = specs_.at(name);
  return spec.partial_grad || spec.shares_blocks(group_->size());
}

std::vector<std::pair<int64_t, int64_t>> TensorParallelGpt::repeated_elements(
    const std::string& name) const {
  return specs_.at(name).repeated_elements(full_shapes_.at(name), group_->rank(), group_->size());
}

Tensor TensorParallelGpt::grad_norm_squared(bool count_embedding) const {
  return norm_squared(count_embedding, /*of_grads=*/true);
}

Tensor TensorParallelGpt::param_norm_squared(bool count_embedding) const {
  return norm_squared(count_embedding, /*of_grads=*/false);
}

Tensor TensorParallelGpt::norm_squares(const optim::NormGroups& groups, bool of_grads,
                                       bool count_embedding) const {
  return norm_squared(count_embedding, of_grads, &groups);
}

Tensor TensorParallelGpt::norm_squared(bool count_embedding, bool of_grads,
                                       const optim::NormGroups* groups) const {
  autograd::NoGradGuard ng;
  const size_t G = groups ? groups->size() : 1;
  // Each group's tensors by how they are summed.
  // (Experts: this rank's block's split tensors, and their whole ones —
  // LoRA's c_fc A and c_proj B — the same on every tensor-parallel rank.)
  std::vector<std::vector<Tensor>> split(G), replicated(G), experts(G), whole_experts(G);
  Device device = Device::cpu();
  for (const auto& [name, p] : named_parameters()) {
    device = p.device();
    // The gradients there are, or the values of the parameters training
    // updates (a frozen one has neither a gradient nor a step).
    Tensor g = of_grads ? p.grad() : (p.requires_grad() ? p : Tensor());
    if (!g.defined() || (!count_embedding && name == "wte.weight")) continue;
    const size_t at_group = groups ? groups->of(name) : 0;
    if (expert_group_ && is_expert(name)) {  // this rank's block of the experts
      (specs_.at(name).split ? experts : whole_experts)[at_group].push_back(g);
      continue;
    }
    if (!specs_.at(name).split) {
      replicated[at_group].push_back(g);
      continue;
    }
    // A shared key/value head counts once, on the first rank holding it.
    std::vector<Tensor>& into = split[at_group];
    const auto repeated = repeated_elements(name);
    if (repeated.empty()) {
      into.push_back(g);
      continue;
    }
    const Tensor flat = reshape(g, {g.numel()});
    int64_t at = 0;
    for (const auto& [begin, end] : repeated) {
      if (begin > at) into.push_back(narrow(flat, 0, at, begin - at));
      at = end;
    }
    if (g.numel() > at) into.push_back(narrow(flat, 0, at, g.numel() - at));
  }
  // Split parameters' squares are summed over the group where they live
  // (NCCL on a GPU), replicated ones added once; nothing is read here.
  const int64_t n = static_cast<int64_t>(G);
  const Tensor split_t = optim::grouped_sum_of_squares(split, device);
  Tensor s = split_t.defined() ? reshape(split_t, {n}).detach() : zeros({n}, DType::F64, device);
  Tensor whole_e;  // the experts' whole tensors, summed over the blocks: added once
  if (expert_group_) {
    // The experts' squares summed over the expert-parallel group (each rank
    // holds its own block), in one reduction: their shards' before the
    // tensor-parallel sum, their whole tensors' after it.
    auto squares = [&](const std::vector<std::vector<Tensor>>& of) {
      const Tensor t = optim::grouped_sum_of_squares(of, device);
      return t.defined() ? reshape(t, {n}).detach() : zeros({n}, DType::F64, device);
    };
    Tensor e = concat({squares(experts), squares(whole_experts)}, 0);
    expert_group_->all_reduce(e, dist::ReduceOp::Sum)->wait();
    s = add(s, narrow(e, 0, 0, n)).detach();
    whole_e = contiguous(narrow(e, 0, n, n));
  }
  group_->all_reduce(s, dist::ReduceOp::Sum)->wait();
  if (whole_e.defined()) s = add(s, whole_e).detach();
  const Tensor replicated_t = optim::grouped_sum_of_squares(replicated, device);
  return replicated_t.defined() ? add(s, reshape(replicated_t, {n})).detach() : s;
}

void TensorParallelGpt::scale_grads(double coef) const {
  autograd::NoGradGuard ng;
  for (const auto& [name, p] : named_parameters()) {
    Tensor g = p.grad();
    if (g.defined()) scale_(g, coef);
  }
}

double TensorParallelGpt::grad_norm() const {
  return std::sqrt(item(grad_norm_squared()));
}

double TensorParallelGpt::param_norm() const {
  return std::sqrt(item(param_norm_squared()));
}

double TensorParallelGpt::clip_grad_norm(double max_norm) const {
  const double norm = grad_norm();
  const double coef = optim::clip_coefficient(norm, max_norm);
  if (coef < 1.0) scale_grads(coef);
  return norm;
}

Tensor TensorParallelGpt::embed(const Tensor& ids, const nn::ForwardContext& ctx) const {
  require(plan_.embedding, "the embeddings");
  if (ids.dim() != 2)
    throw ShapeError("TensorParallelGpt: token ids must be (B, T), got " + shape_str(ids.shape()));
  if (ids.size(1) > cfg_.seq_len) {
    throw ShapeError("TensorParallelGpt: sequence length " + std::to_string(ids.size(1)) +
                     " exceeds model.seq_len " + std::to_string(cfg_.seq_len));
  }
  // Under context parallelism this rank's tokens of the sequence.
  const std::vector<cp::Run> runs = chunk_runs(ids.size(1), "the token ids");
  if (cp_) require_chunk_positions(ctx, ids.size(0), ids.size(1) / cp_->size());
  const Tensor chunk_ids = cp_ ? contiguous(cp::take_runs(ids, 1, runs)) : ids;
  return embed_chunk(chunk_ids, ctx);
}

Tensor TensorParallelGpt::embed_chunk(const Tensor& ids, const nn::ForwardContext& ctx) const {
  const int64_t T = ids.size(1);
  int64_t first = 0, count = T;
  if (sp_) {
    if (T % group_->size() != 0) {
      throw ShapeError("sequence parallelism: sequence length " + std::to_string(T) +
                       " must be divisible by tp " + std::to_string(group_->size()));
    }
    count = T / group_->size();
    first = group_->rank() * count;
  }
  fence(wte_.get());
  fence(wpe_.get());
  if (!wpe_) {  // rotary embeddings: the attention layers take the positions
    return site_dropout(nn::scale_token_embeddings(cfg_, wte_->forward(ids)), ctx, 0, "embed");
  }
  Tensor positions;
  if (ctx.positions.defined()) {  // per token, within its document
    if (ctx.positions.shape() != ids.shape()) {
      throw ShapeError("TensorParallelGpt: document positions " + shape_str(ctx.positions.shape()) +
                       " for ids " + shape_str(ids.shape()));
    }
    positions = sp_ ? narrow(ctx.positions, 1, first, count) : ctx.positions;
  } else {
    positions = arange(first, count, DType::I64, ids.device());  // (made on the device)
  }
  Tensor x = add(nn::scale_token_embeddings(cfg_, wte_->forward(ids)), wpe_->forward(positions));
  return site_dropout(x, ctx, 0, "embed");
}

Tensor TensorParallelGpt::block(int64_t i, const Tensor& x, const nn::ForwardContext& ctx) const {
  auto it = layers_.find(i);
  if (it == layers_.end()) {
    throw ValueError("TensorParallelGpt: this pipeline stage does not hold layer " +
                     std::to_string(i));
  }
  fence(it->second.module.get());
  auto added = [](const nn::Block::Stream& s) {
    return s.pending.defined() ? add(s.base, s.pending) : s.base;
  };
  if (!recomputed(i)) return added(block_stream(i, {x, Tensor()}, ctx));
  // By value: the recomputation runs in backward, after this frame.
  return autograd::checkpoint(
      [this, i, ctx, added](const Tensor& in) {
        return added(block_stream(i, {in, Tensor()}, ctx));
      },
      x, it->second.module->parameters());
}

bool TensorParallelGpt::recomputed(int64_t i) const {
  const auto& mine = plan_.layers;
  return cfg_.recomputes(std::find(mine.begin(), mine.end(), i) - mine.begin());
}

Tensor TensorParallelGpt::blocks(const std::vector<int64_t>& layers, const Tensor& x,
                                 const nn::ForwardContext& ctx) const {
  nn::Block::Stream s{x, Tensor()};
  auto added = [&s] {
    if (s.pending.defined()) s = {add(s.base, s.pending), Tensor()};
    return s.base;
  };
  for (int64_t i : layers) {
    auto it = layers_.find(i);
    if (it == layers_.end() || recomputed(i)) {
      // (block() names a layer this stage does not hold.)
      s.base = block(i, added(), ctx);
      continue;
    }
    fence(it->second.module.get());
    s = block_stream(i, s, ctx);
  }
  return added();
}

nn::Block::Stream TensorParallelGpt::block_stream(int64_t i, const nn::Block::Stream& in,
                                                  const nn::ForwardContext& ctx) const {
  auto it = layers_.find(i);
  if (it == layers_.end())
    throw ValueError("TensorParallelGpt: this pipeline stage does not hold layer " +
                     std::to_string(i));
  const Layer& L = it->second;
  // The stream's pending add (the previous block's MLP's) runs in ln_1.
  Tensor x = in.base, normed;  // (no ln_1 without model.pre_norms)
  if (in.pending.defined() && L.ln_1) {
    const AddNorm a = L.ln_1->forward_add(in.base, in.pending);
    x = a.sum;
    normed = a.norm;
  } else {
    if (in.pending.defined()) x = add(in.base, in.pending);
    normed = L.ln_1 ? L.ln_1->forward(x) : x;
  }
  const int64_t chunk = sp_ ? x.size(1) * group_->size() : x.size(1);
  if (cp_) require_chunk_positions(ctx, x.size(0), chunk);
  const nn::DropoutDraw draw = ctx.draw();
  // The whole sequence, local heads. Latent attention enters the region
  // itself (its first layers are on every rank), then makes its heads.
  Tensor qkv =
      L.latent ? L.latent->qkv(enter_heads(normed), draw) : L.c_attn->forward(normed, draw);
  // (model.clip_qkv: elementwise, so each rank clamps its own heads.)
  if (cfg_.clip_qkv > 0) qkv = clamp(qkv, -cfg_.clip_qkv, cfg_.clip_qkv);
  const int64_t t = group_->size();
  const AttentionHeads heads =
      AttentionHeads{cfg_.n_head / t, cfg_.kv_heads_per_rank(t)}.with_softcap(
          cfg_.attn_logit_softcap);  // this rank's
  if (L.q_norm && cfg_.qk_norm_full) {
    qkv = full_query_key_norm(L, qkv, heads);
  } else if (L.q_norm) {
    qkv = nn::norm_query_key_heads(qkv, heads, *L.q_norm, *L.k_norm);
  } else if (L.q_head_norm) {
    qkv = nn::norm_query_key_heads(qkv, heads, *L.q_head_norm, *L.k_head_norm);
  }
  if (cfg_.rotary_at(i)) {
    nn::GptConfig::Rope rope = cfg_.rope_of(i);
    // The row reaches past this chunk: longrope's factors are the whole
    // row's, as one process takes them.
    if (cp_) rope.scaling = rope.scaling.with_positions_up_to(chunk * cp_->size());
    qkv = rotary_embedding(qkv, heads, ctx.positions, 0, rope.theta, rope.scaling);
  }
  Tensor core = attention(qkv, ctx.attention_heads(heads, cfg_.window_of(i)),
                          ctx.attention_starts(cfg_.window_of(i) > 0));
  if (L.latent) core = L.latent->values(core);
  // This rank's share of the MLP's output, before the group sums it.
  auto mlp_share = [&](const Tensor& in) {
    if (L.moe) return moe_share(L, in, ctx);
    return cfg_.fused_gelu()
               ? L.mlp_proj->partial_after_gelu(L.c_fc->forward_gelu(in, draw), draw)
               : L.mlp_proj->partial(
                     nn::unfused_activation(cfg_.activation, L.c_fc->forward(in, draw)), draw);
  };
  // The group's sum of it (reduce-scattered along the sequence under
  // sequence parallelism), with c_proj's bias.
  auto mlp_reduce = [&](const Tensor& share) {
    if (!L.moe) return L.mlp_proj->reduce(share);
    if (group_->size() == 1) return share;
    return sp_ ? reduce_scatter_to_sequence_region(share, group_)
               : reduce_from_region(share, group_);
  };
  // The parallel residual (model.parallel_residual) sums both sublayers'
  // shares and reduces them in one collective instead of two (GPT-NeoX's
  // way), unless something acts on each sublayer's output alone: dropout or
  // post-norms.
  // The MLP's input beside the attention: ln_2's, or ln_1's under
  // model.shared_norm.
  auto parallel_input = [&] { return L.ln_2 ? L.ln_2->forward(x) : normed; };
  if (!cfg_.pre_norms) {
    // OLMo 2's blocks: the sublayers read the residual stream itself.
    Tensor a = site_dropout(L.attn_proj->forward(core, draw), ctx, i, "attn.resid");
    const Tensor h = add(x, nn::to_residual(cfg_, L.post_attn_norm->forward(a)));
    Tensor m = mlp_reduce(mlp_share(h));
    m = site_dropout(m, ctx, i, "mlp.resid");
    return {add(h, nn::to_residual(cfg_, L.post_mlp_norm->forward(m))), Tensor()};
  }
  if (cfg_.reduces_sublayers_at_once()) {
    const Tensor shares = add(L.attn_proj->partial(core, draw), mlp_share(parallel_input()));
    // (mlp_proj is null for experts.)
    return {add(x, nn::to_residual(cfg_, L.attn_proj->reduce(shares, L.mlp_proj.get()))), Tensor()};
  }
  Tensor a = L.attn_proj->forward(core, draw);
  a = site_dropout(a, ctx, i, "attn.resid");
  if (L.post_attn_norm) a = L.post_attn_norm->forward(a);
  a = nn::to_residual(cfg_, a);
  // Sequential: the attention's residual add and ln_2 as one op, the MLP
  // reading the sum; parallel: ln_2 of x.
  AddNorm h;
  if (cfg_.parallel_residual) {
    h = {add(x, a), parallel_input()};
  } else {
    h = L.ln_2->forward_add(x, a);
  }
  Tensor m = mlp_reduce(mlp_share(h.norm));
  m = site_dropout(m, ctx, i, "mlp.resid");
  if (L.post_mlp_norm) m = L.post_mlp_norm->forward(m);
  return {h.sum, nn::to_residual(cfg_, m)};  // added by the next ln_1, or by the caller
}

Tensor TensorParallelGpt::enter_heads(const Tensor& x) const {
  if (group_->size() == 1) return x;
  return sp_ ? gather_from_sequence_region(x, group_) : copy_to_region(x, group_);
}

Tensor TensorParallelGpt::full_query_key_norm(const Layer& L, const Tensor& qkv,
                                              const AttentionHeads& heads) const {
  const int64_t D = cfg_.head_dim(), q = heads.q * D, kv = heads.kv * D;
  if (group_->size() == 1) return nn::norm_query_key(qkv, q, kv, *L.q_norm, *L.k_norm);
  // Each norm spans every rank's heads: the queries and keys are gathered
  // (one all-gather of each rank's [q | k], ranks in head order),
  // normalised whole on every rank alike, and each rank keeps its own
  // heads' part. Backward, the parts' gradients are gathered (one
  // all-gather), the norms' backward runs whole (their weights' gradients
  // the same on every rank) and each rank keeps its part of the input's.
  const int64_t t = group_->size(), B = qkv.size(0), T = qkv.size(1);
  const Tensor by_rank =  // (B, T, t, q + kv): rank r's [q_r | k_r] at r
      reshape(gather_from_region(narrow(qkv, 2, 0, q + kv), group_), {B, T, t, q + kv});
  // The ranks' parts of `width` at `offset` side by side, normalised whole,
  // as (B, T, t, width) again. With fewer key/value heads than ranks, each
  // head is held by `share` ranks in a row: the keys' norm reads the first
  // one's copy of every head and gives each holder the normalised head
  // (whose gradient, summed over the holders, goes to the first; the
  // head's weights sum their ranks' gradients: reduce_partial_grads).
  auto normed = [&](int64_t offset, int64_t width, const nn::LayerNorm& norm, int64_t share) {
    const int64_t heads = t / share;
    Tensor parts = narrow(by_rank, 3, offset, width);
    if (share > 1) parts = narrow(reshape(contiguous(parts), {B, T, heads, share, width}), 3, 0, 1);
    const Tensor whole = reshape(contiguous(parts), {B, T, heads * width});
    Tensor out = reshape(norm.forward(whole), {B, T, heads, 1, width});
    if (share > 1) out = expand(out, {B, T, heads, share, width});
    return reshape(contiguous(out), {B, T, t, width});
  };
  const int64_t kv_share = cfg_.kv_heads() < t ? t / cfg_.kv_heads() : 1;
  const Tensor both =
      reshape(concat({normed(0, q, *L.q_norm, 1), normed(q, kv, *L.k_norm, kv_share)}, 3),
              {B, T, t * (q + kv)});
  return concat({scatter_to_region(both, group_), narrow(qkv, 2, q + kv, kv)}, 2);
}

Tensor TensorParallelGpt::moe_share(const Layer& L, const Tensor& in,
                                    const nn::ForwardContext& ctx) const {
  // Every rank routes the whole sequence alike: under sequence parallelism
  // each routes its own tokens and the scores are gathered (their
  // gradient, whole on every rank, sliced back), and the experts see the
  // gathered tokens. The gates' gradient is the sum of each rank's partial
  // outputs' part, hence all-reduced.
  nn::MoeMlp::Scores scores = L.moe->route(in);
  const int64_t t = group_->size();
  if (t == 1) return L.moe->experts(in, scores, ctx);
  if (sp_) {
    const int64_t B = in.size(0), T = in.size(1);
    auto gather = [&](const Tensor& s) {
      const int64_t n = s.size(1);
      return reshape(gather_from_sequence_region_replicated(reshape(s, {B, T, n}), group_),
                     {-1, n});
    };
    scores.probs = gather(scores.probs);
    if (scores.shared_gate.defined()) scores.shared_gate = gather(scores.shared_gate);
    if (scores.logits.defined()) scores.logits = gather(scores.logits);  // (the z-loss's)
  }
  const Tensor tokens = sp_ ? gather_from_sequence_region(in, group_) : copy_to_region(in, group_);
  return L.moe->experts(tokens, scores, ctx,
                        [this](const Tensor& gates) { return copy_to_region(gates, group_); });
}

Tensor TensorParallelGpt::head_loss(const Tensor& hidden, const Tensor& targets) const {
  require(plan_.head, "the output head");
  fence(ln_f_.get());
  return head_loss_after(*ln_f_, hidden, targets);
}

Tensor TensorParallelGpt::head_loss_after(const nn::LayerNorm& norm, const Tensor& hidden,
                                          const Tensor& targets, Tensor* z_loss,
                                          double expected_grad) const {
  // Checked where they are read anyway (host targets; device ones are the
  // caller's): the shards see only their own vocabulary, so a target past
  // the whole of it would silently score 0 on every rank.
  if (targets.device().is_cpu()) {
    const Tensor t = contiguous(cast(targets, DType::I64));
    const int64_t* p = t.data<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (p[i] != -100 && (p[i] < 0 || p[i] >= cfg_.vocab_size)) {
        throw ValueError("TensorParallelGpt: target " + std::to_string(p[i]) + " at row " +
                         std::to_string(i) + " is outside [0, " + std::to_string(cfg_.vocab_size) +
                         ") (-100: ignored)");
      }
    }
  } else if (Backend& be = backend_for(targets); be.capturing(targets.device())) {
    // Inside a CUDA graph's capture: checked on the device as they are
    // counted (the count itself unused here), a bad one reported by
    // cuda::Graph::check after the replay.
    Tensor unused = empty({}, DType::F32, targets.device());
    be.inverse_target_count(contiguous(targets), -100, cfg_.vocab_size, unused,
                            "TensorParallelGpt");
  }
  fence(head_.get());
  Tensor y = nn::scale_for_head(cfg_, norm.forward(hidden));
  const RegionInput in = enter_region(y, group_, sp_);
  if (!cp_) {
    return vocab_parallel_linear_cross_entropy(
        in.input, head_->weight(), targets, head_->vocab_start(), head_->valid_rows(), group_,
        cfg_.final_logit_softcap, in.comm, head_->bias(), z_loss, expected_grad,
        z_loss ? cfg_.z_loss_coef : 0.0);
  }
  // Context parallelism: this rank's chunk of the targets; its mean loss
  // over them, weighed by its share of the sequence's scored targets,
  // times P (the group's mean is then the whole mean); a z-loss alike.
  if (targets.dim() != 2)
    throw ShapeError("TensorParallelGpt: targets must be (B, T), got " +
                     shape_str(targets.shape()));
  const std::vector<cp::Run> runs = chunk_runs(targets.size(1), "the targets");
  if (!targets.device().is_cpu()) {
    // Targets on a device (inside a CUDA graph's capture they cannot be
    // read here): the chunk and its share formed there, in f64 as the
    // host's (integer counts, one division), the share then rounded to the
    // loss's dtype as scale() rounds it. The chunk's gradient is not
    // written ahead (its share is not known here): the backward computes
    // it from the gradient that arrives, the same value the host's path
    // writes ahead.
    const Tensor all = cast(targets, DType::I64);
    const Tensor mine = contiguous(cp::take_runs(all, 1, runs));
    Backend& be = backend_for(all);
    auto scored = [&](const Tensor& t) {
      Tensor ignored = empty(t.shape(), DType::F64, t.device());
      be.binary(BinaryOp::Eq, cast(t, DType::F64), full(t.shape(), -100.0, DType::F64, t.device()),
                ignored);
      be.affine(ignored, -1.0, 1.0, ignored);
      return sum(ignored);
    };
    const Tensor total = scored(all), here = scored(mine);
    // (No target scored anywhere: a share of 0, here / 1.)
    Tensor none = empty({}, DType::F64, total.device());
    be.binary(BinaryOp::Eq, total, zeros({}, DType::F64, total.device()), none);
    const Tensor share = div(scale(here, static_cast<double>(cp_->size())), add(total, none));
    const Tensor loss = vocab_parallel_linear_cross_entropy(
        in.input, head_->weight(), mine, head_->vocab_start(), head_->valid_rows(), group_,
        cfg_.final_logit_softcap, in.comm, head_->bias(), z_loss, 0.0,
        z_loss ? cfg_.z_loss_coef : 0.0);
    if (z_loss) *z_loss = mul(*z_loss, cast(share, z_loss->dtype()));
    return mul(loss, cast(share, loss.dtype()));
  }
  const Tensor all = contiguous(cast(targets, DType::I64));
  const Tensor mine = contiguous(cp::take_runs(all, 1, runs));
  auto scored = [](const Tensor& t) {
    const int64_t* p = t.data<int64_t>();
    int64_t n = 0;
    for (int64_t i = 0; i < t.numel(); ++i) n += p[i] != -100;
    return n;
  };
  const int64_t total = scored(all), here = scored(mine);
  const double share =
      total ? static_cast<double>(here * cp_->size()) / static_cast<double>(total) : 0.0;
  // (The chunk's loss is scaled by its share below: its gradient too, the
  // arriving gradient times the share in the loss's dtype, which is what
  // is written ahead.)
  const double ahead =
      stat_dtype(in.input.dtype()) == DType::F64
          ? expected_grad * share
          : static_cast<double>(static_cast<float>(expected_grad) * static_cast<float>(share));
  const Tensor loss = vocab_parallel_linear_cross_entropy(
      in.input, head_->weight(), mine, head_->vocab_start(), head_->valid_rows(), group_,
      cfg_.final_logit_softcap, in.comm, head_->bias(), z_loss, ahead,
      z_loss ? cfg_.z_loss_coef : 0.0);
  if (z_loss) *z_loss = scale(*z_loss, share);
  return scale(loss, share);
}

Tensor TensorParallelGpt::site_dropout(const Tensor& x, const nn::ForwardContext& ctx,
                                       int64_t layer, const char* site) const {
  const double p = cfg_.dropout;
  if (!ctx.training || p == 0.0) return x;
  const uint64_t stream = nn::site_stream(site, layer);
  const int64_t t = sp_ ? group_->size() : 1;
  if (!ctx.pieces && t == 1) {
    return nn::sequence_dropout(x, p, ctx.seed, stream, ctx.call, nullptr, ctx.calls);
  }
  // The tokens this rank holds of the micro-batch's sequences (context
  // parallelism's chunk; sequence parallelism's slice of it) draw those
  // tokens' elements of one process's mask.
  if (x.dim() != 3) {
    throw ShapeError("TensorParallelGpt: dropout at " + std::string(site) + " of " +
                     shape_str(x.shape()) + " (expected (B, T, C))");
  }
  const int64_t local = x.size(1);
  nn::SequencePieces held =
      ctx.pieces ? *ctx.pieces : nn::SequencePieces{local * t, {{0, local * t}}};
  if (t > 1) held = held.slice(group_->rank() * local, local);
  return nn::sequence_dropout(x, p, ctx.seed, stream, ctx.call, &held, ctx.calls);
}

nn::ForwardContext TensorParallelGpt::with_documents(const Tensor& ids,
                                                     const nn::ForwardContext& ctx) const {
  nn::ForwardContext out = ctx;
  if (cfg_.needs_attention_starts()) {  // (no parameter walk on every forward otherwise)
    const auto params = parameters();
    out = nn::with_documents(cfg_, ids, ctx, params.empty() ? Device::cpu() : params[0].device());
  }
  return chunked(ids, out);
}

nn::ForwardContext TensorParallelGpt::chunked(const Tensor& ids,
                                              const nn::ForwardContext& whole) const {
  nn::ForwardContext out = whole;
  if (!cp_) return out;
  // The attention sees the whole sequences (their first keys stay whole);
  // everything else this rank's chunk, at its own positions.
  if (ids.dim() != 2)
    throw ShapeError("TensorParallelGpt: token ids must be (B, T), got " + shape_str(ids.shape()));
  const int64_t B = ids.size(0);
  const std::vector<cp::Run> runs = chunk_runs(ids.size(1), "the token ids");
  if (out.positions.defined()) {
    out.positions = contiguous(cp::take_runs(out.positions, 1, runs));
  } else if (!ids.device().is_cpu()) {
    // Ids on a device (inside a CUDA graph's capture nothing can be
    // uploaded): the chunk's positions made there, the same values.
    const Tensor row = arange(0, ids.size(1), DType::I64, ids.device());
    const Tensor rows = make_view(row, {B, ids.size(1)}, {0, 1}, row.offset());
    out.positions = contiguous(cp::take_runs(rows, 1, runs));
  } else {
    const int64_t count = ids.size(1) / cp_->size();
    std::vector<int64_t> pos;
    pos.reserve(static_cast<size_t>(B * count));
    for (int64_t b = 0; b < B; ++b)
      for (const auto& [first, n] : runs)
        for (int64_t t = 0; t < n; ++t) pos.push_back(first + t);
    out.positions = from_vector(pos, {B, count}, DType::I64);
  }
  // Dropout draws the whole sequences' masks at the micro-batch's call (see
  // site_dropout and ForwardContext::draw()).
  auto pieces = std::make_shared<nn::SequencePieces>();
  pieces->row_length = ids.size(1);
  pieces->runs.assign(runs.begin(), runs.end());
  out.pieces = std::move(pieces);
  return out;
}

cp::Layout TensorParallelGpt::layout() const {
  if (!cp_) return {};
  return cp::layout_of(exchange_, cp_->size(), hierarchy_.a2a ? hierarchy_.a2a->size() : 1);
}

std::vector<cp::Run> TensorParallelGpt::chunk_runs(int64_t T, const char* what) const {
  if (!cp_) return {{0, T}};
  const int64_t P = cp_->size(), t = sp_ ? group_->size() : 1;
  const cp::Layout runs = layout();
  if (T % (P * t) != 0 || T % runs.row_multiple() != 0) {
    throw ShapeError("context parallelism: " + std::string(what) + "' sequence length " +
                     std::to_string(T) + " must be divisible by parallel.cp (" + std::to_string(P) +
                     ")" +
                     (sp_ ? " times parallel.tp (" + std::to_string(t) + ", sequence parallelism)"
                          : std::string()) +
                     (runs.ring > 1 ? " and by " + std::to_string(2 * runs.ring) +
                                          " (two half-chunks each of the ring's " +
                                          std::to_string(runs.ring) + " positions)"
                                    : std::string()));
  }
  return cp::chunk_runs(T, cp_->rank(), runs);
}

void TensorParallelGpt::require_chunk_positions(const nn::ForwardContext& ctx, int64_t B,
                                                int64_t chunk) const {
  if (!ctx.positions.defined() || ctx.positions.shape() != Shape{B, chunk}) {
    throw ValueError(
        "TensorParallelGpt: under context parallelism the forward context must come from "
        "with_documents(ids, ctx), which gives this rank's chunk its positions (B " +
        std::to_string(B) + " x " + std::to_string(chunk) + ")");
  }
}

Tensor TensorParallelGpt::attention(const Tensor& qkv, const AttentionHeads& heads,
                                    const Tensor& starts) const {
  if (!cp_) return causal_attention(qkv, heads, starts);
  if (exchange_ == cp::Exchange::Ring) return cp::ring_attention(qkv, heads, starts, cp_);
  if (exchange_ == cp::Exchange::AllGather)
    return cp::all_gather_attention(qkv, heads, starts, cp_, true);
  if (exchange_ == cp::Exchange::AllToAllRing)
    return cp::hierarchical_attention(qkv, heads, starts, hierarchy_);
  const Tensor whole = cp::sequence_to_heads(qkv, heads, cp_);
  const Tensor y = causal_attention(whole, cp::heads_kept(heads, cp_), starts);
  return cp::heads_to_sequence(y, qkv.size(2) / heads.fused(), cp_);
}

Tensor TensorParallelGpt::loss(const Tensor& ids, const Tensor& targets,
                               const nn::ForwardContext& in) const {
  const nn::ForwardContext ctx = with_documents(ids, in);
  Tensor x = embed(ids, ctx);
  x = blocks(plan_.layers, x, ctx);
  return head_objective(x, ids, targets, ctx);
}

Tensor TensorParallelGpt::head_objective(const Tensor& hidden, const Tensor& ids,
                                         const Tensor& targets,
                                         const nn::ForwardContext& ctx) const {
  require(plan_.head, "the output head");
  fence(ln_f_.get());
  // A training step's loss gets ctx.loss_grad as its gradient, written with
  // the loss where the vocabulary is whole on this rank; the z-loss joins
  // that gradient inside the head's op, and only its value is recorded.
  const bool z = cfg_.z_loss_coef > 0 && ctx.training;
  Tensor z_loss;
  const Tensor loss = head_loss_after(*ln_f_, hidden, targets, z ? &z_loss : nullptr,
                                      ctx.training ? ctx.loss_grad : 0.0);
  if (z && ctx.z_loss_stats) ctx.z_loss_stats->record({z_loss});
  if (mtp_.empty() || !ctx.training) return loss;
  return nn::with_mtp_losses(cfg_, loss, mtp_losses(hidden, ids, targets, ctx), ctx);
}

std::vector<Tensor> TensorParallelGpt::mtp_losses(const Tensor& hidden, const Tensor& ids,
                                                  const Tensor& targets,
                                                  const nn::ForwardContext& ctx) const {
  require(plan_.head && wte_ != nullptr, "the output head and the token embedding");
  if (ids.dim() != 2)
    throw ShapeError("TensorParallelGpt: token ids must be (B, T), got " + shape_str(ids.shape()));
  // The whole sequences' ids ahead and targets (nn::mtp_ahead,
  // nn::mtp_targets); under context parallelism this rank's chunk of the
  // ids is embedded, and head_loss_after takes its chunk of the targets.
  const Tensor docs =
      cfg_.resets_documents() ? nn::document_starts_of(ids, cfg_.eod_token) : Tensor();
  const std::vector<cp::Run> runs = chunk_runs(ids.size(1), "the token ids");
  std::vector<Tensor> out;
  Tensor h = hidden;
  for (size_t i = 0; i < mtp_.size(); ++i) {
    const Mtp& m = mtp_[i];
    const int64_t k = static_cast<int64_t>(i) + 1;
    Tensor ahead = nn::mtp_ahead(ids, k);
    if (cp_) ahead = contiguous(cp::take_runs(ahead, 1, runs));
    fence(wte_.get());
    const Tensor e = site_dropout(nn::scale_token_embeddings(cfg_, wte_->forward(ahead)), ctx,
                                  m.layer, "mtp.embed");
    if (e.shape() != h.shape()) {
      throw ShapeError("TensorParallelGpt: multi-token prediction's embeddings " +
                       shape_str(e.shape()) + " beside hidden " + shape_str(h.shape()));
    }
    for (const nn::Module* part : {static_cast<const nn::Module*>(m.ln_embed.get()),
                                   static_cast<const nn::Module*>(m.ln_hidden.get()),
                                   static_cast<const nn::Module*>(m.eh_proj.get()),
                                   static_cast<const nn::Module*>(m.ln_out.get())})
      fence(part);
    const Tensor x =
        m.eh_proj->forward(concat({m.ln_embed->forward(e), m.ln_hidden->forward(h)}, 2));
    h = block(m.layer, x, ctx);
    // (Each depth's loss gets nn::with_mtp_losses's weight as its gradient.)
    const double expected =
        ctx.training ? nn::mtp_loss_grad(cfg_, static_cast<int64_t>(mtp_.size()), ctx.loss_grad,
                                         stat_dtype(head_->weight().dtype()))
                     : 0.0;
    out.push_back(
        head_loss_after(*m.ln_out, h, nn::mtp_targets(targets, docs, k), nullptr, expected));
  }
  return out;
}

Tensor TensorParallelGpt::logits(const Tensor& ids, const nn::ForwardContext& in) const {
  autograd::NoGradGuard ng;
  require(plan_.head, "the output head");
  const nn::ForwardContext ctx = with_documents(ids, in);
  Tensor x = embed(ids, ctx);
  x = blocks(plan_.layers, x, ctx);
  return head_logits(x);
}

Tensor TensorParallelGpt::head_logits(const Tensor& hidden, int64_t start, int64_t length) const {
  autograd::NoGradGuard ng;
  require(plan_.head, "the output head");
  if (hidden.dim() != 3) {
    throw ShapeError("TensorParallelGpt::head_logits: hidden is " + shape_str(hidden.shape()) +
                     ", expected (B, T, C)");
  }
  const int64_t T =
      (sp_ ? hidden.size(1) * group_->size() : hidden.size(1)) * (cp_ ? cp_->size() : 1);
  if (length < 0) length = T - start;
  if (start < 0 || length < 1 || start + length > T) {
    throw ValueError("TensorParallelGpt::head_logits: positions [" + std::to_string(start) + ", " +
                     std::to_string(start + length) + ") are not inside the sequence's " +
                     std::to_string(T));
  }
  fence(ln_f_.get());
  fence(head_.get());
  Tensor y = nn::scale_for_head(cfg_, ln_f_->forward(hidden));
  if (sp_) y = all_gather_along(y, 1, group_);
  // (The ranks' tokens in rank order, then in the sequence's.)
  if (cp_) y = cp::to_sequence_order(all_gather_along(y, 1, cp_), 1, layout());
  // Only the positions asked for reach the head.
  Tensor local = linear(contiguous(narrow(y, 1, start, length)), head_->weight(), head_->bias());
  Tensor all = all_gather_along(local, -1, group_);
  Tensor out = contiguous(narrow(all, -1, 0, cfg_.vocab_size));
  return cfg_.final_logit_softcap > 0 ? soft_cap(out, cfg_.final_logit_softcap) : out;
}

}  // namespace triad::tp
