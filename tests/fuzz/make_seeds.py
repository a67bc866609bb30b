#!/usr/bin/python3
"""Writes the fuzz targets' seed inputs into tests/fuzz/corpus/<target>/seed-*.

Valid (or nearly valid) inputs of each kind, small, so the fuzzer starts
from the formats' structure rather than from nothing. Run from anywhere with
Debian's python3 (python3-torch for the torch.save seeds); the output is
checked in, so the test suite does not need this script. Inputs that fuzzing
found wrong are kept beside the seeds under other names (finding-*) and are
never rewritten here.
"""
import io
import json
import os
import pathlib
import gzip
import re
import shutil
import struct
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (folder / f"seed-{name}").write_bytes(data)


def safetensors_file(tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def safetensors_seeds():
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, 7)
    write("safetensors", "f32", safetensors_file({"w": ("F32", [2, 3], f32)}))
    write("safetensors", "mixed", safetensors_file({
        "a.weight": ("BF16", [2, 2], struct.pack("<4H", 0x3F80, 0xBF80, 0x4000, 0)),
        "b.bias": ("F16", [3], struct.pack("<3H", 0x3C00, 0xC000, 0x7BFF)),
        "ids": ("I64", [2], struct.pack("<2q", 5, -1)),
        "n": ("I32", [], struct.pack("<i", 9)),
        "q": ("F8_E4M3", [4], bytes([0x38, 0xB8, 0x7E, 0x01])),
        "d": ("F64", [1, 1], struct.pack("<d", 2.5)),
    }, metadata={"format": "pt"}))
    write("safetensors", "empty", safetensors_file({}))


def torch_seeds():
    try:
        import torch
    except ImportError:
        print("no torch: torch_checkpoint seeds not written", file=sys.stderr)
        return
    torch.manual_seed(0)
    base = torch.randn(3, 4)
    state = {"w": base, "wt": base.t(), "row": base[1], "b": torch.randn(4).to(torch.bfloat16),
             "h": torch.randn(2, 2).half(), "steps": torch.tensor([3, 4], dtype=torch.int64),
             "mask": torch.tensor([True, False]), "d": torch.randn(2, dtype=torch.float64)}
    buf = io.BytesIO()
    torch.save(state, buf)
    write("torch_checkpoint", "state_dict", buf.getvalue())
    buf = io.BytesIO()
    torch.save({"x": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, buf)
    write("torch_checkpoint", "small", buf.getvalue())


def hf_config_seeds():
    write("hf_config", "gpt2", json.dumps({
        "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128,
        "vocab_size": 300, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}))
    write("hf_config", "llama", json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160,
        "vocab_size": 300, "max_position_embeddings": 256, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}))
    write("hf_config", "mixtral", json.dumps({
        "model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "vocab_size": 300, "max_position_embeddings": 256, "num_local_experts": 4,
        "num_experts_per_tok": 2, "sliding_window": 64, "router_aux_loss_coef": 0.01}))
    write("hf_config", "deepseek_v3", json.dumps({
        "model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "intermediate_size": 128, "moe_intermediate_size": 32,
        "vocab_size": 300, "max_position_embeddings": 256, "kv_lora_rank": 32,
        "q_lora_rank": 48, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
        "first_k_dense_replace": 1, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
                         "beta_slow": 1}}))
    write("hf_config", "gemma3", json.dumps({
        "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": 300, "max_position_embeddings": 256,
        "sliding_window": 32, "sliding_window_pattern": 6, "query_pre_attn_scalar": 16,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}))


def tokenizer_seeds():
    fixtures = ROOT / "tests" / "data" / "fixtures"
    write("hf_tokenizer", "bpe", (fixtures / "tokenizer.json").read_bytes())
    write("hf_tokenizer", "chat_model", (fixtures / "chat_model" / "tokenizer.json").read_bytes())
    write("sentencepiece", "bpe", (fixtures / "sentencepiece_bpe.model").read_bytes())


def jinja_seeds():
    source = (ROOT / "tests" / "parity" / "jinja_reference.py").read_text()
    start = source.index("TEMPLATES = {")
    end = source.index("\n}\n", start) + 3
    scope = {}
    exec(source[start:end], scope)  # the dict literal alone: no jinja2 needed
    for name, template in scope["TEMPLATES"].items():
        write("jinja", re.sub(r"[^a-z0-9_]", "_", name.lower()), template)


def train_config_seeds():
    for name in ["gpt_tiny.yaml", "gpt_tiny_3d.yaml", "llama_tiny.yaml", "deepseek_v3_tiny.yaml",
                 "mixtral_tiny.yaml", "gemma3_tiny.yaml"]:
        write("train_config", name.replace(".yaml", ""), (ROOT / "configs" / name).read_bytes())


def indexed_dataset_seeds():
    # The target's .bin is 16 * (first byte) bytes: 16 * ord('M') = 1232 here.
    def index(code, lengths, pointers, docs):
        out = b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, code)
        out += struct.pack("<QQ", len(lengths), len(docs))
        out += struct.pack(f"<{len(lengths)}i", *lengths)
        out += struct.pack(f"<{len(pointers)}q", *pointers)
        out += struct.pack(f"<{len(docs)}q", *docs)
        return out
    write("indexed_dataset", "u16", index(8, [3, 5, 2], [0, 6, 16], [0, 1, 3]))
    write("indexed_dataset", "i32", index(4, [4, 4], [0, 16], [0, 2]))
    write("indexed_dataset", "empty", index(8, [], [], [0]))


def text_input_seeds():
    text = "The quick brown fox.\nSecond line, caf\u00e9 \u2581 \U0001f600\n\n".encode()
    write("text_input", "plain", text)
    write("text_input", "gzip", gzip.compress(text, mtime=0))
    write("text_input", "gzip_members",
          gzip.compress(text[:10], mtime=0) + gzip.compress(text[10:], mtime=0))
    if shutil.which("zstd"):
        zst = subprocess.run(["zstd", "-q", "-c"], input=text, stdout=subprocess.PIPE,
                             check=True).stdout
        write("text_input", "zstd", zst)


def choice_questions_seeds():
    fixtures = ROOT / "tests" / "data" / "fixtures"
    for name in ["choice_questions", "mmlu_questions", "winogrande_questions",
                 "short_choice_questions", "truthfulqa_questions",
                 "mmlu_pro_questions"]:
        write("choice_questions", name, (fixtures / f"{name}.jsonl").read_bytes())


def last_word_texts_seeds():
    fixtures = ROOT / "tests" / "data" / "fixtures"
    write("last_word_texts", "lambada", (fixtures / "lambada_texts.jsonl").read_bytes())
    write("last_word_texts", "unicode", "\n".join(json.dumps({"text": t}, ensure_ascii=a) for t, a in [
        ("caf\u00e9 au lait  \tna\u00efve", False),
        ("e\u0301 then \u4f60\u597d \U0001f600", True),
        ("one two", False)]) + "\n")


def math_problems_seeds():
    fixtures = ROOT / "tests" / "data" / "fixtures"
    write("math_problems", "gsm8k", (fixtures / "gsm8k_problems.jsonl").read_bytes())
    write("math_problems", "edges", "\n".join(json.dumps(p, ensure_ascii=a) for p, a in [
        ({"question": "Pay $1,234.50?", "answer": "So $1,234.50.\n#### 1,234.5"}, True),
        ({"question": "Two marks?", "answer": "#### 3\n#### -4.", "id": 2}, False),
        ({"question": "caf\u00e9 Question: \u4f60", "answer": "#### \u0037"}, False)]) + "\n")


def encode_seeds():
    write("encode", "english", "Hello, world! It's 2024: the <|endoftext|> token.\n\tTabs  and   spaces")
    write("encode", "multilingual",
          "caf\u00e9 na\u00efve \u4f60\u597d\u4e16\u754c \u0645\u0631\u062d\u0628\u0627 "
          "\U0001f600\U0001f44d\u200d e\u0301 \u2581x")
    write("encode", "bytes", bytes([0xff, 0xfe, 0x41, 0xc3, 0x28, 0xe2, 0x82, 0x0a, 0xf0, 0x9f]))
    write("encode", "code", "def f(x):\n    return x**2  # square\n\r\n\n\n  \n")


# A target reading several files takes them joined by this line
# (tests/fuzz/fuzz_input.h, kPartSeparator).
SEPARATOR = b"\n--8<--\n"


def parts(*files):
    return SEPARATOR.join(f.encode() if isinstance(f, str) else f for f in files)


def gpt2_bpe_seeds():
    # GPT-2's byte alphabet (every byte a token of its own) and a few merges.
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra, alphabet = 0, []
    for b in range(256):
        if b in printable:
            alphabet.append(chr(b))
        else:
            alphabet.append(chr(256 + extra))
            extra += 1
    merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("l", "l"), ("o", "\u0120")]
    vocab = {c: i for i, c in enumerate(alphabet)}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    text = "#version: 0.2\n" + "".join(f"{l} {r}\n" for l, r in merges)
    write("gpt2_bpe", "alphabet", parts(json.dumps(vocab), text))
    write("gpt2_bpe", "small", parts(json.dumps({"a": 0, "b": 1, "ab": 2}), "a b\n"))


def token_shard_seeds():
    def shard(tokens, count=None):
        header = struct.pack("<3i", 20240520, 1, len(tokens) if count is None else count)
        return header + bytes(1024 - 12) + struct.pack(f"<{len(tokens)}H", *tokens)
    write("token_shard", "gpt2", shard([50256, 15496, 11, 995, 0, 50256]))
    write("token_shard", "past_vocab", shard([1, 65535, 50257]))
    write("token_shard", "empty", shard([]))


def model_chat_template_seeds():
    fixtures = ROOT / "tests" / "data" / "fixtures"
    config = json.loads((fixtures / "chat_model" / "tokenizer_config.json").read_text())
    write("model_chat_template", "chatml", json.dumps(config))
    write("model_chat_template", "named", json.dumps({
        "bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "{{ tools }}"},
                          {"name": "default", "template": config["chat_template"]}]}))
    write("model_chat_template", "llama3", json.dumps({
        "bos_token": "<|begin_of_text|>", "chat_template":
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
        "\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}"}))


def sft_documents_seeds():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And?"},
            {"role": "assistant", "content": "Bye <|im_end|>"}]
    lines = [{"messages": chat, "tools": [{"type": "function", "function": {"name": "f"}}]},
             {"prompt": "Two plus two?", "response": " Four."},
             {"messages": chat[1:3]}]
    write("sft_documents", "mixed", "".join(json.dumps(line) + "\n" for line in lines))
    write("sft_documents", "pairs", '{"prompt": "a", "response": "b"}\n\n{"prompt": "", "response": ""}\n')


def peft_adapter_seeds():
    def f32(rows, cols):
        return ("F32", [rows, cols], struct.pack(f"<{rows * cols}f", *[0.5 + i for i in range(rows * cols)]))
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "bias": "none", "fan_in_fan_out": True,
              "target_modules": ["c_attn"], "task_type": "CAUSAL_LM"}
    weights = safetensors_file({
        "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight": f32(2, 4),
        "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight": f32(6, 2),
        "base_model.model.h.1.mlp.c_fc.lora_A.weight": f32(2, 3),
        "base_model.model.h.1.mlp.c_fc.lora_B.weight": f32(5, 2)}, metadata={"format": "pt"})
    write("peft_adapter", "gpt2", parts(json.dumps(config), weights))
    llama = dict(config, fan_in_fan_out=False, use_rslora=True, target_modules=["q_proj"])
    write("peft_adapter", "llama", parts(json.dumps(llama), safetensors_file({
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
            ("BF16", [2, 2], struct.pack("<4H", 0x3F80, 0xBF80, 0x4000, 0)),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": f32(3, 2)})))


def checkpoint_seeds():
    def fnv1a64(data):
        h = 0xcbf29ce484222325
        for b in data:
            h = ((h ^ b) * 0x100000001b3) % (1 << 64)
        return h
    rank = safetensors_file({"model.wte": ("F32", [2, 3], struct.pack("<6f", *range(6))),
                             "optim.step": ("I64", [], struct.pack("<q", 5))},
                            metadata={"next_step": "5", "applied_steps": "5"})
    manifest = {"format": "triad-checkpoint-1", "step": 5, "config": "model: {}\n",
                "layout": {"tensor_parallel": "1", "pipeline_parallel": "1"},
                "checksums": {"rank_0.safetensors": str(fnv1a64(rank))}}
    write("checkpoint", "fnv1a", parts(json.dumps(manifest), "step_5\n", rank))
    words = dict(manifest, checksum="words64", val_loss=2.5)
    write("checkpoint", "words64", parts(json.dumps(words), "step_5", rank))


def checkpoint_metadata_seeds():
    placement = {"tp_rank": 1, "tp_size": 2, "pp_rank": 0, "dp_rank": 0, "params": {
        "wte": {"split": True, "dim": 0, "groups": 1, "padded": 0, "shape": [8, 4]},
        "h.0.attn.c_attn.weight": {"split": True, "dim": 0, "groups": 3, "padded": 0,
                                   "shape": [12, 4], "blocks": [4, 4, 4]},
        "ln_f.weight": {"split": False, "dim": -1, "groups": 1, "padded": 0, "shape": [4]}},
        "zero_segments": [["wte", 0, 16], ["ln_f.weight", 0, 4, True]]}
    write("checkpoint_metadata", "placement", json.dumps(placement))
    write("checkpoint_metadata", "spike_window",
          json.dumps({"losses": [3.5, 3.25, 3.0], "grad_norms": [1.0, 0.5, 0.75]}))
    write("checkpoint_metadata", "loss_scaler",
          json.dumps({"scale": 65536.0, "clean_streak": 3, "skipped_steps": 1, "hysteresis_left": 2}))
    write("checkpoint_metadata", "attention_choices", json.dumps([
        {"dtype": "bf16", "deterministic": True, "batch": 4, "seq_len": 1024, "d_model": 768,
         "n_head": 12, "kernel": "cudnn", "triad_ms": 1.5, "cudnn_ms": 1.25},
        {"dtype": "fp16", "deterministic": False, "batch": 1, "seq_len": 7, "d_model": 64,
         "n_head": 2, "kernel": "triad", "forward_only": True}]))


def planner_seeds():
    configs = ROOT / "configs"
    for cluster, model, run in [("hgx_h200", "falcon_7b", "16 32"),
                                ("dgx_a100_selene", "mixtral_8x7b", "8 16"),
                                ("dgx_h100", "gpt2_350m", "4 16")]:
        if not (configs / "models" / f"{model}.yaml").exists():
            continue
        write("planner", f"{cluster}-{model}", parts(
            (configs / "clusters" / f"{cluster}.yaml").read_text(),
            (configs / "models" / f"{model}.yaml").read_text(), run))
    write("planner", "tiny", parts(
        "gpus_per_node: 4\ngpu: {peak_tflops: 100, memory_gib: 16, memory_bandwidth_gbs: 900}\n"
        "intra_node: {bandwidth_gbs: 100}\ninter_node: {bandwidth_gbs: 25, latency_us: 5}\n",
        "n_layer: 4\nn_head: 4\nd_model: 256\nvocab_size: 1000\nseq_len: 512\n", "8 32"))


def hf_weights_seeds():
    # Tiny models in Hugging Face's names: config.json, then model.safetensors.
    import random
    rng = random.Random(0)

    def f32(*shape):
        n = 1
        for d in shape:
            n *= d
        return ("F32", list(shape), struct.pack(f"<{n}f", *(rng.uniform(-0.1, 0.1) for _ in range(n))))

    h, v, f = 8, 16, 16
    llama = {"model.embed_tokens.weight": f32(v, h), "model.norm.weight": f32(h),
             "lm_head.weight": f32(v, h)}
    for i in range(2):
        p = f"model.layers.{i}."
        llama.update({p + "input_layernorm.weight": f32(h),
                      p + "post_attention_layernorm.weight": f32(h),
                      p + "self_attn.q_proj.weight": f32(h, h),
                      p + "self_attn.k_proj.weight": f32(4, h),
                      p + "self_attn.v_proj.weight": f32(4, h),
                      p + "self_attn.o_proj.weight": f32(h, h),
                      p + "mlp.gate_proj.weight": f32(f, h), p + "mlp.up_proj.weight": f32(f, h),
                      p + "mlp.down_proj.weight": f32(h, f)})
    write("hf_weights", "llama", parts(json.dumps({
        "model_type": "llama", "hidden_size": h, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": f,
        "vocab_size": v, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False}), safetensors_file(llama)))
    gpt2 = {"wte.weight": f32(v, h), "wpe.weight": f32(32, h), "ln_f.weight": f32(h),
            "ln_f.bias": f32(h)}
    for i in range(2):
        p = f"h.{i}."
        gpt2.update({p + "ln_1.weight": f32(h), p + "ln_1.bias": f32(h),
                     p + "ln_2.weight": f32(h), p + "ln_2.bias": f32(h),
                     p + "attn.c_attn.weight": f32(h, 3 * h), p + "attn.c_attn.bias": f32(3 * h),
                     p + "attn.c_proj.weight": f32(h, h), p + "attn.c_proj.bias": f32(h),
                     p + "mlp.c_fc.weight": f32(h, 4 * h), p + "mlp.c_fc.bias": f32(4 * h),
                     p + "mlp.c_proj.weight": f32(4 * h, h), p + "mlp.c_proj.bias": f32(h)})
    neox = {"gpt_neox.embed_in.weight": f32(v, h), "gpt_neox.final_layer_norm.weight": f32(h),
            "gpt_neox.final_layer_norm.bias": f32(h), "embed_out.weight": f32(v, h)}
    for i in range(2):
        p = f"gpt_neox.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            neox.update({p + norm + ".weight": f32(h), p + norm + ".bias": f32(h)})
        neox.update({p + "attention.query_key_value.weight": f32(3 * h, h),
                     p + "attention.query_key_value.bias": f32(3 * h),
                     p + "attention.dense.weight": f32(h, h), p + "attention.dense.bias": f32(h),
                     p + "mlp.dense_h_to_4h.weight": f32(4 * h, h),
                     p + "mlp.dense_h_to_4h.bias": f32(4 * h),
                     p + "mlp.dense_4h_to_h.weight": f32(h, 4 * h),
                     p + "mlp.dense_4h_to_h.bias": f32(h)})
    write("hf_weights", "gpt_neox", parts(json.dumps({
        "model_type": "gpt_neox", "hidden_size": h, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 4 * h, "vocab_size": v,
        "max_position_embeddings": 32, "rotary_pct": 0.5, "use_parallel_residual": True,
        "layer_norm_eps": 1e-5, "tie_word_embeddings": False}), safetensors_file(neox)))
    phi = {"model.embed_tokens.weight": f32(v, h), "model.final_layernorm.weight": f32(h),
           "model.final_layernorm.bias": f32(h), "lm_head.weight": f32(v, h),
           "lm_head.bias": f32(v)}
    for i in range(2):
        p = f"model.layers.{i}."
        phi.update({p + "input_layernorm.weight": f32(h), p + "input_layernorm.bias": f32(h),
                    p + "mlp.fc1.weight": f32(4 * h, h), p + "mlp.fc1.bias": f32(4 * h),
                    p + "mlp.fc2.weight": f32(h, 4 * h), p + "mlp.fc2.bias": f32(h),
                    p + "self_attn.dense.weight": f32(h, h), p + "self_attn.dense.bias": f32(h)})
        for proj in ("q_proj", "k_proj", "v_proj"):
            phi.update({p + f"self_attn.{proj}.weight": f32(h, h),
                        p + f"self_attn.{proj}.bias": f32(h)})
    write("hf_weights", "phi", parts(json.dumps({
        "model_type": "phi", "hidden_size": h, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 4 * h, "vocab_size": v,
        "max_position_embeddings": 32, "partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5,
        "hidden_act": "gelu_new", "tie_word_embeddings": False}), safetensors_file(phi)))
    # The LLaMA model again, sharded: layer 1 in the second shard.
    first = {k: t for k, t in llama.items() if ".layers.1." not in k}
    second = {k: t for k, t in llama.items() if ".layers.1." in k}
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in second})
    write("hf_weights", "llama_sharded", parts(json.dumps({
        "model_type": "llama", "hidden_size": h, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": f,
        "vocab_size": v, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False}), safetensors_file(first),
        json.dumps({"metadata": {}, "weight_map": weight_map}), safetensors_file(second)))
    write("hf_weights", "gpt2", parts(json.dumps({
        "model_type": "gpt2", "n_embd": h, "n_layer": 2, "n_head": 2, "n_positions": 32,
        "vocab_size": v, "layer_norm_epsilon": 1e-5}), safetensors_file(gpt2)))


def main():
    safetensors_seeds()
    torch_seeds()
    hf_config_seeds()
    tokenizer_seeds()
    jinja_seeds()
    train_config_seeds()
    indexed_dataset_seeds()
    text_input_seeds()
    choice_questions_seeds()
    last_word_texts_seeds()
    math_problems_seeds()
    encode_seeds()
    gpt2_bpe_seeds()
    token_shard_seeds()
    model_chat_template_seeds()
    sft_documents_seeds()
    peft_adapter_seeds()
    checkpoint_seeds()
    checkpoint_metadata_seeds()
    planner_seeds()
    hf_weights_seeds()
    for folder in sorted(CORPUS.iterdir()):
        print(f"{folder.name}: {len(list(folder.iterdir()))} files")


if __name__ == "__main__":
    main()
