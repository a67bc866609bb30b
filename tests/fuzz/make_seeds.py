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
    write("text_input", "gzip", gzip.compress(text))
    write("text_input", "gzip_members", gzip.compress(text[:10]) + gzip.compress(text[10:]))
    if shutil.which("zstd"):
        zst = subprocess.run(["zstd", "-q", "-c"], input=text, stdout=subprocess.PIPE,
                             check=True).stdout
        write("text_input", "zstd", zst)


def choice_questions_seeds():
    fixtures = ROOT / "tests" / "data" / "fixtures"
    for name in ["choice_questions", "mmlu_questions", "winogrande_questions",
                 "short_choice_questions"]:
        write("choice_questions", name, (fixtures / f"{name}.jsonl").read_bytes())


def encode_seeds():
    write("encode", "english", "Hello, world! It's 2024: the <|endoftext|> token.\n\tTabs  and   spaces")
    write("encode", "multilingual",
          "caf\u00e9 na\u00efve \u4f60\u597d\u4e16\u754c \u0645\u0631\u062d\u0628\u0627 "
          "\U0001f600\U0001f44d\u200d e\u0301 \u2581x")
    write("encode", "bytes", bytes([0xff, 0xfe, 0x41, 0xc3, 0x28, 0xe2, 0x82, 0x0a, 0xf0, 0x9f]))
    write("encode", "code", "def f(x):\n    return x**2  # square\n\r\n\n\n  \n")


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
    encode_seeds()
    for folder in sorted(CORPUS.iterdir()):
        print(f"{folder.name}: {len(list(folder.iterdir()))} files")


if __name__ == "__main__":
    main()
