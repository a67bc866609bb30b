#!/usr/bin/env python3
"""PyTorch counterpart of bench_train_gpu on the same GPU: the same GPT-2
shaped model (tied head, tanh GELU, vocab 50304) and the same step (forward,
backward, clipping, AdamW) on the same batch, with bf16 autocast,
torch.compile and PyTorch's flash attention (scaled_dot_product_attention,
causal). One JSON line out, the same keys as bench_train_gpu.

usage: train_gpu_torch.py --preset 124m --batch 16 --seq 1024 [--no-compile]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_gpt import Gpt  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="124m", choices=["124m", "350m", "tiny"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    L, C, NH = {"124m": (12, 768, 12), "350m": (24, 1024, 16), "tiny": (2, 128, 4)}[a.preset]
    V, T, B = 50304, a.seq, a.batch
    dev = torch.device("cuda")
    torch.manual_seed(1)
    model = Gpt(L, C, NH, V, T, flash=True).to(dev)

    def loss_fn(idx, targets):
        logits = model(idx)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_fn = loss_fn if a.no_compile else torch.compile(loss_fn)
    i = torch.arange(B * T, dtype=torch.int64)
    idx = ((i * 2654435761) % 50257).view(B, T).to(dev)
    tgt = (((i + 1) * 2654435761) % 50257).view(B, T).to(dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss = loss.item()
    secs = time.perf_counter() - t0
    tokens_per_s = a.steps * B * T / secs
    flops_per_token = 72.0 * L * C * C * (1.0 + T / (6.0 * C) + V / (12.0 * L * C))
    tflops = tokens_per_s * flops_per_token / 1e12
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "compile": not a.no_compile,
                      "preset": a.preset, "precision": "bf16-autocast", "batch": B, "seq": T,
                      "params": sum(p.numel() for p in model.parameters()),
                      "tokens_per_s": tokens_per_s, "step_ms": secs * 1e3 / a.steps,
                      "model_tflops": tflops, "mfu": tflops / a.peak_tflops, "loss": loss,
                      "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}))


if __name__ == "__main__":
    main()
