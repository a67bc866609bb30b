"""The GPT-2 model of the PyTorch baselines (benchmarks/train_cpu_torch.py and
benchmarks/gpu/train_gpu_torch.py), shaped like Triad's: pre-LayerNorm
blocks, learned positions, tanh GELU, biases, head tied to the token
embedding, and initialised as Triad initialises it (src/nn/init.cpp:
weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 L)), biases
zero, norms one), so both start from the same loss (about ln V) rather than
PyTorch's N(0, 1) embeddings, whose tied logits start the loss near 180.
`flash=True` uses PyTorch's fused causal attention
(scaled_dot_product_attention), otherwise the explicit masked softmax."""
import math

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, C, NH, flash):
        super().__init__()
        self.NH, self.flash = NH, flash
        self.ln_1 = torch.nn.LayerNorm(C)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C)
        self.c_fc = torch.nn.Linear(C, 4 * C)
        self.mlp_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = (q @ k.transpose(-2, -1) / math.sqrt(C // self.NH)).masked_fill(~mask, float("-inf"))
            y = att.softmax(-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, L, C, NH, V, T, flash=False):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.wpe = torch.nn.Embedding(T, C)
        self.h = torch.nn.ModuleList(Block(C, NH, flash) for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                torch.nn.init.zeros_(p)
            elif ".ln_" in name or name.startswith("ln_"):
                torch.nn.init.ones_(p)
            elif name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                torch.nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))
            else:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()
