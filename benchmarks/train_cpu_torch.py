#!/usr/bin/env python3
"""PyTorch-CPU counterpart of bench_train_cpu: the same GPT-2 shaped model,
the same step (forward, backward, clipping, AdamW), one JSON line out.

usage: train_cpu_torch.py [--layers 6 --d-model 384 --heads 6 --vocab 8192 --seq 256 --batch 8]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import Gpt  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = Gpt(a.layers, a.d_model, a.heads, a.vocab, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    x, y = idx[:, :-1], idx[:, 1:]

    def step():
        loss = F.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    secs = time.perf_counter() - t0
    tps = a.steps * a.batch * a.seq / secs
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * params + 12 * a.layers * a.d_model * a.seq
    print(json.dumps({"impl": "pytorch-" + torch.__version__, "threads": torch.get_num_threads(),
                      "params": params, "tokens_per_s": tps, "step_ms": 1000 * secs / a.steps,
                      "model_gflops": tps * flops_per_token / 1e9, "loss": loss}))


if __name__ == "__main__":
    main()
