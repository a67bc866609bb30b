#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "triad/io/safetensors.h"
#include "triad/nn/gpt.h"

namespace triad::io {

// GPT-2 checkpoints store the Conv1D weights (attn.c_attn, attn.c_proj,
// mlp.c_fc, mlp.c_proj) as [in, out]; Triad stores every linear weight as
// [out, in]. These convert a state dict between the two layouts.
bool is_gpt2_conv1d_weight(const std::string& name);

// Public GPT-2 tensors -> Triad state dict. Accepts a "transformer." prefix
// and ignores the attention-mask buffers (".attn.bias", ".attn.masked_bias").
// "lm_head.weight" is kept: load_gpt2_state_dict drops it for a tied model
// when it is the copy of wte some exports carry, and an untied model
// (model.tie_embeddings: false) loads it as its head.
nn::StateDict gpt2_to_triad(const std::map<std::string, Tensor>& tensors);
std::map<std::string, Tensor> triad_to_gpt2(const nn::StateDict& state);

// Hugging Face LLaMA tensors (model.embed_tokens, model.layers.N.self_attn.
// {q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
// post_attention_layernorm, model.norm, lm_head) -> Triad state dict: q, k,
// v stacked into c_attn, gate and up into c_fc (Triad's SwiGLU order). Their
// rotary embeddings are the rotate-half form Triad's are. Grouped-query
// attention's narrower k_proj and v_proj stack as they are (the model needs
// the matching model.n_kv_head); an unknown tensor, or k_proj and v_proj
// that do not fit q_proj, is an IoError naming it. Gemma 2's and 3's four
// norms (pre_feedforward_layernorm present) map to ln_1, post_attn_norm,
// ln_2 and post_mlp_norm; OLMo 2's two (post_feedforward_layernorm without
// input_layernorm) to post_attn_norm and post_mlp_norm; StableLM's
// LayerNorms bring their biases too; StarCoder2's ungated mlp.c_fc and
// mlp.c_proj, and its o_proj bias, map as they are.
bool is_hf_llama(const std::map<std::string, Tensor>& tensors);
// With `interleaved_n_head` (Cohere's, GLM's), q_proj's and k_proj's rows
// (and their biases) turn in interleaved pairs, each head's first `rotated`
// rows (0: all) reordered into Triad's halves (interleaved_head_rows) for
// that many query heads (0: none reordered).
nn::StateDict hf_llama_to_triad(const std::map<std::string, Tensor>& tensors,
                                int64_t interleaved_n_head = 0, int64_t rotated = 0);
// Each of `heads` heads' first `rotated` rows (0: all) of t (a weight, a
// bias or a LoRA B, heads * D rows, `rotated` even) between rotation in
// interleaved pairs (2i, 2i + 1), Cohere's, GLM's and GPT-J's, and Triad's
// halves (i, i + r / 2): `to_halves` takes the former to the latter, else
// back; a head's other rows stay. The rows of a pair move together, so
// q . k is unchanged. A height that is not whole heads, or an odd or too
// wide rotated count, is a ShapeError.
Tensor interleaved_head_rows(const Tensor& t, int64_t heads, bool to_halves, int64_t rotated = 0);
// The same for each head's `rotated` rows from row `offset` (DeepSeek's
// latent attention turns the last qk_rope rows of each query head, and of
// kv_a_proj's one shared key); `rotated` even, at least 2.
Tensor interleaved_rows_at(const Tensor& t, int64_t heads, int64_t offset, int64_t rotated,
                           bool to_halves);
// c_attn's rows ([q | k | v] of n_head query heads and kv_heads key/value
// heads; a weight, a bias or a LoRA B) with each q and k head's first
// `rotated` rows (0: all) in interleaved pairs, as Cohere's and GLM's q_proj
// and k_proj hold them; v's as they are.
Tensor triad_qkv_rows_to_interleaved(const Tensor& t, int64_t n_head, int64_t kv_heads,
                                     int64_t rotated = 0);

// fp8 block-quantized weights (DeepSeek-V3's and Kimi K2's published files,
// quantization_config quant_method fp8): each `<name>.weight` beside a
// `<name>.weight_scale_inv` (f32, one per block of block[0] rows x
// block[1] columns, the last ones partial) becomes the weight times its
// block's scale in f32 (DeepSeek's weight_dequant; the F8_E4M3 weights are
// read as f32, exactly), and the scales are dropped. Scales without their
// weight, or of another shape, are an IoError naming them and `where`.
// Every reader of Hugging Face weights (init.from, load_gpt2_safetensors)
// does this as it reads, one block of layers at a time.
void dequantize_block_scaled(std::map<std::string, Tensor>& tensors,
                             const std::array<int64_t, 2>& block, const std::string& where);

// Hugging Face GPT-NeoX tensors (gpt_neox.embed_in, gpt_neox.layers.N.
// {input_layernorm, post_attention_layernorm, attention.query_key_value,
// attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h},
// gpt_neox.final_layer_norm, embed_out) -> Triad state dict. query_key_value
// interleaves each head's q, k and v rows ([q0 k0 v0 q1 k1 v1 ...]); c_attn
// stacks them ([q | k | v]), which takes the model's head count `n_head`.
// The attention-mask and inverse-frequency buffers of older files are left
// out; any other unknown tensor is an IoError naming it.
bool is_hf_neox(const std::map<std::string, Tensor>& tensors);
nn::StateDict hf_neox_to_triad(const std::map<std::string, Tensor>& tensors, int64_t n_head);
// c_attn's rows (a weight, a bias, or a LoRA B: rows first) between Triad's
// stack [q | k | v] and GPT-NeoX's per-head interleave, each the other's
// inverse. A height that is not 3 * n_head rows of one width is a
// ShapeError.
Tensor neox_qkv_rows_to_triad(const Tensor& t, int64_t n_head);
Tensor triad_qkv_rows_to_neox(const Tensor& t, int64_t n_head);

// Hugging Face Phi tensors (Phi-1, Phi-1.5, Phi-2: model.embed_tokens,
// model.layers.N.{input_layernorm, self_attn.{q,k,v}_proj, self_attn.dense,
// mlp.fc1, mlp.fc2}, model.final_layernorm, lm_head with its bias) -> Triad
// state dict: q, k and v (weights and biases) stacked into c_attn as for
// LLaMA; one norm per block (model.shared_norm). Told apart from LLaMA's by
// model.final_layernorm. RoPE's buffer is left out; any other unknown
// tensor is an IoError naming it.
bool is_hf_phi(const std::map<std::string, Tensor>& tensors);
nn::StateDict hf_phi_to_triad(const std::map<std::string, Tensor>& tensors);

// Hugging Face Falcon tensors (transformer.word_embeddings,
// transformer.h.N.{input_layernorm | ln_attn, ln_mlp |
// post_attention_layernorm, self_attention.query_key_value,
// self_attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h},
// transformer.ln_f, lm_head) -> Triad state dict. query_key_value groups
// its rows by key/value head (falcon_qkv_rows_to_triad), their count taken
// from its height against the `n_head` query heads of hidden_size /
// n_head each. ln_attn (or input_layernorm) is ln_1, ln_mlp (or
// post_attention_layernorm) ln_2. RoPE's buffer is left out; any other
// unknown tensor is an IoError naming it.
bool is_hf_falcon(const std::map<std::string, Tensor>& tensors);
nn::StateDict hf_falcon_to_triad(const std::map<std::string, Tensor>& tensors, int64_t n_head);
// c_attn's rows (a weight, a bias, or a LoRA B: rows first) between Triad's
// stack [q | k | v] and Falcon's grouping: for each of the `kv_heads`
// key/value heads, the n_head / kv_heads query heads that use it, then its
// key and its value ([q.. k v] per group: GPT-NeoX's per-head interleave
// when every query head has its own, Triad's stack under multi-query
// attention). Each the other's inverse; a height that is not (n_head + 2 *
// kv_heads) heads of one width is a ShapeError.
Tensor falcon_qkv_rows_to_triad(const Tensor& t, int64_t n_head, int64_t kv_heads);
Tensor triad_qkv_rows_to_falcon(const Tensor& t, int64_t n_head, int64_t kv_heads);

// Hugging Face GPT-J tensors (transformer.wte, transformer.h.N.{ln_1,
// attn.{q,k,v}_proj, attn.out_proj, mlp.fc_in, mlp.fc_out},
// transformer.ln_f, lm_head with its bias) -> Triad state dict: q, k and v
// stacked into c_attn, q's and k's rows reordered (gptj_qkv_rows_to_triad)
// for `rope_dim` rotated dimensions (0: whole heads) of the `n_head` heads.
// Told apart from GPT-2's by the absence of transformer.wpe. CodeGen's
// fused attn.qkv_proj is read too (codegen_qkv_rows_to_stack). The old
// attention-mask buffers are left out; any other unknown tensor is an
// IoError naming it.
bool is_hf_gptj(const std::map<std::string, Tensor>& tensors);
nn::StateDict hf_gptj_to_triad(const std::map<std::string, Tensor>& tensors, int64_t n_head,
                               int64_t rope_dim);
// c_attn's rows (a weight or a LoRA B: rows first, [q | k | v] of n_head
// heads each) between GPT-J's rotation, which turns each q and k head's
// first `rope_dim` dimensions (0: all) in interleaved pairs (2i, 2i + 1),
// and Triad's, which turns pairs (i, i + rope_dim / 2): the rows of each
// pair move together, so q . k, and the model, are unchanged. Each the
// other's inverse; a height that is not 3 * n_head heads is a ShapeError.
Tensor gptj_qkv_rows_to_triad(const Tensor& t, int64_t n_head, int64_t rope_dim);
Tensor triad_qkv_rows_to_gptj(const Tensor& t, int64_t n_head, int64_t rope_dim);
// CodeGen's fused qkv_proj (GPT-J's blocks; a file with attn.qkv_proj reads
// as GPT-J's otherwise does): its rows in kCodegenShards shards, each
// holding, for its n_head / kCodegenShards heads, their q rows, then their
// v rows, then their k rows, between that and [q | k | v] (the heads' order
// kept). Each the other's inverse; a height that is not 3 * n_head heads,
// or heads that do not split into the shards, is a ShapeError.
inline constexpr int64_t kCodegenShards = 4;
Tensor codegen_qkv_rows_to_stack(const Tensor& t, int64_t n_head);
Tensor stack_qkv_rows_to_codegen(const Tensor& t, int64_t n_head);

// A multimodal checkpoint's language model (Gemma 3's 4B and up): its
// tensors under language_model.model. (transformers 4.50's layout) or
// model.language_model. (later ones) renamed to model., language_model's
// lm_head to lm_head, and the vision tower's and the projector's left out.
// Tensors without those prefixes come back unchanged.
std::map<std::string, Tensor> language_model_tensors(std::map<std::string, Tensor> tensors);

// What a weight file's tensor names leave open, from the model it is read
// into:
//  - `n_head`, the query heads: GPT-NeoX's, Falcon's and GPT-J's fused or
//    interleaved projections are cut by head (0 refuses such a file);
//  - `rope_dim`, GPT-J's rotated width;
//  - `interleaved_rotation`: a file in LLaMA's names whose q_proj and k_proj
//    rows turn in interleaved pairs (Cohere's) has them reordered into
//    Triad's halves. A config.json beside the file that names its
//    model_type decides instead (true for "cohere" and "cohere2"): it describes the
//    file, where the model's class is only what the file is taken for.
struct PeftDeltas;
struct WeightLayout {
  int64_t n_head = 0;
  int64_t rope_dim = 0;
  bool interleaved_rotation = false;
  // A PEFT LoRA adapter (io/peft_adapter.h) merged into the file's weights
  // as they are read, under the file's own names, before they become
  // Triad's: every module it adapts in the blocks read must be there.
  const PeftDeltas* adapter = nullptr;
};
// `c`'s: its query heads and rotated width, and interleaved_rotation when
// the Hugging Face class holding it (hf_model_type) is Cohere's or Cohere 2's, the class
// an export writes it as (so a lone model.safetensors exported from a
// Cohere model reads back into one).
WeightLayout weight_layout(const nn::GptConfig& c);

// Loads a GPT-2 safetensors file into `model` (shapes must match its config;
// errors name the tensor and both shapes).
// The whole file is read and checked before the model changes: on an error
// it keeps its weights. (The trainer, whose model is freshly initialised,
// reads block by block instead: read_gpt2_weights below.)
void load_gpt2_safetensors(nn::Gpt& model, const std::string& path);
void save_gpt2_safetensors(const nn::Gpt& model, const std::string& path);

// The same for any layout: read a file into a full Triad state dict checked
// against `expected` (name -> full shape), and write a full state dict. A
// file in Hugging Face's LLaMA layout (is_hf_llama) is read too
// (hf_llama_to_triad), a multimodal checkpoint's language model alone
// (language_model_tensors), one in Phi's (hf_phi_to_triad), Falcon's
// (hf_falcon_to_triad, which needs `n_head`) or GPT-J's (hf_gptj_to_triad,
// which needs `n_head` and `rope_dim`, the model's), and one in
// GPT-NeoX's (hf_neox_to_triad, which
// needs `n_head`, the model's query heads: 0 refuses such a file). `path`
// is a safetensors file or torch.save's pytorch_model.bin (told apart by
// their bytes: io/torch_checkpoint.h), a sharded checkpoint's
// model.safetensors.index.json or pytorch_model.bin.index.json (its
// weight_map names each tensor's file, beside it), or a directory holding
// any of them (safetensors first). `blocks`, when given, names the
// blocks (h.N) to read: the others' tensors are neither copied out nor
// returned nor checked (a pipeline rank reads its stages' blocks; the
// embedding, position table, final norm and head are always read). The
// file's width and depth are checked either way.
//
// read_gpt2_weights reads the same in parts and hands each to `consume`
// as it is read, converted and checked: first the tensors outside the blocks,
// then each block in order. A rank that cuts its tensor-parallel shard from
// each part holds one block of the file at a time, never the whole model.
// The checks are load_gpt2_state_dict's; a part is checked before it is
// handed over, so an error in block N comes after blocks 0..N-1 were given.
//
// `layout` says what the file's names alone do not (weight_layout builds it
// from the model's config; the default reads only files that need none).
void read_gpt2_weights(const std::string& path, const std::map<std::string, Shape>& expected,
                       const std::set<int64_t>* blocks,
                       const std::function<void(nn::StateDict&&)>& consume,
                       const WeightLayout& layout = {});
nn::StateDict load_gpt2_state_dict(const std::string& path,
                                   const std::map<std::string, Shape>& expected,
                                   const std::set<int64_t>* blocks = nullptr,
                                   const WeightLayout& layout = {});
void save_gpt2_state_dict(const nn::StateDict& full, const nn::GptConfig& config,
                          const std::string& path);

// Writes save_gpt2_state_dict's file tensor by tensor, in the order
// `layout` lists Triad's names, shapes and dtypes: each Conv1D weight is
// transposed as it is written, so the caller (the trainer, gathering the
// model one tensor at a time) never holds the whole model. A SafetensorsWriter:
// unfinished, it leaves no file.
class Gpt2Writer {
 public:
  Gpt2Writer(const std::string& path, const nn::GptConfig& config,
             const std::vector<std::pair<std::string, TensorLayout>>& layout);
  void write(const std::string& name, const Tensor& t);
  void finish();

 private:
  SafetensorsWriter writer_;
};

// The block a tensor belongs to, -1 for none: "h.3.attn.c_attn.weight"
// (Triad's and GPT-2's names, also after "transformer."), and Hugging
// Face's "model.layers.3.self_attn.q_proj.weight" (after any prefix).
int64_t block_index(const std::string& name);

}  // namespace triad::io
