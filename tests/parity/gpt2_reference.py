#!/usr/bin/env python3
"""PyTorch reference for the Triad parity test.

Builds a small random GPT-2 in plain PyTorch, writes it as GPT-2 safetensors
(Conv1D weights stored [in, out]), writes an llm.c token shard, and records
the step-0 logits, loss and every gradient, a greedy continuation of a
prompt, plus the losses of 10 AdamW steps (and of 10 steps of Muon and AdamW
on the LLaMA-style variant below)
(weight decay on 2-D tensors, global-norm clipping that triggers, warm-up +
cosine learning rate, gradient accumulation over two micro-batches). The
same for a variant with rotary position embeddings (no position table;
queries and keys turned in the rotate-half form of GPT-NeoX and LLaMA):
step-0 logits, loss and gradients, and a greedy continuation; and for a
variant with LLaMA's SwiGLU MLP of another width (c_fc holds the gate and
the value halves): step-0 logits, loss and gradients; and for LLaMA's
combination (rotary embeddings, SwiGLU, RMSNorm written out by hand, no
biases in the linear layers, an output head of its own, lm_head, not tied to
the token embedding): step-0 logits, loss and gradients. Then the other
variants main() names: RoPE scaling (LLaMA 3.1's, YaRN, linear), Mistral's
window, Qwen2's, Qwen3's, Gemma's and Gemma 3's blocks, GPT-NeoX's,
StableLM's, OLMo's, Granite's, GraniteMoE's, StarCoder2's and Cohere's. And
the evaluator's scores of continuations after contexts (the log-likelihoods
of multiple-choice benchmarks) by the generator and Mistral's.

usage: gpt2_reference.py OUT_DIR
"""
import copy
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

CFG = dict(n_layer=2, n_head=4, d_model=32, vocab_size=77, seq_len=16)
TRAIN = dict(steps=10, global_batch_size=4, micro_batch_size=2, lr=3e-3, min_lr=3e-4,
             warmup_steps=3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=0.5)
GREEDY_PROMPT, GREEDY_TOKENS = [5, 17, 3, 42, 8], 24
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


ROPE_THETA = 30.0  # large turns over 16 positions
SWIGLU_FFN = 40  # the SwiGLU variant's hidden width F
LLAMA_KV_HEADS = 2  # the LLaMA-style variant's key/value heads (grouped-query attention)
# Multi-token prediction (DeepSeek-V3's MTP): the LLaMA-style model's two
# modules, weighed 0.3, and GPT-2's one, weighed 0.1 (Megatron-LM's default).
MTP_LLAMA = {"layers": 2, "weight": 0.3}
MTP_GPT2 = {"layers": 1, "weight": 0.1}
MTP_GLM4 = {"layers": 1, "weight": 0.3}
MISTRAL_WINDOW = 5  # the Mistral-style variant's sliding window: each query sees 5 keys
QWEN3_HEAD_DIM = 12  # the Qwen3-style variant's heads: 4 x 12 = 48 wide, not d_model's 32
MOE_FFN = 24  # the mixtures' experts' hidden width
MOE_AUX_COEF = 0.1  # the Mixtral-style variant's load-balancing loss weight
MOE_SHARED_FFN = 20  # the Qwen2-MoE-style variant's shared expert's width
MOE_Z_COEF = 0.5  # the OLMoE-style variant's router z-loss weight (large: seen in the gradients)
# DeepSeek-V3-style yarn at this size: 4 original positions stretched 4x,
# its two mscales apart so that both the rotation's factor and the
# scores' are seen.
DEEPSEEK_YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4,
                     beta_fast=32, beta_slow=1, mscale=0.8, mscale_all_dim=0.6)
GEMMA3_LOCAL_THETA = 7.0  # the Gemma 3-style variant's windowed layers' RoPE base
GEMMA3_SCALING = dict(rope_type="linear", factor=2.0)  # its global layer's
GEMMA3_ATTN_SCALAR = 20.0  # its scores over sqrt(20), not sqrt(head_dim 12): 27B's kind
# The Gemma 2-style variant's soft caps, about the size of its scores and
# logits at step 0 so that tanh bends them (Gemma 2's own are 50 and 30).
GEMMA2_ATTN_SOFTCAP = 0.1
GEMMA2_FINAL_SOFTCAP = 0.5


# LLaMA 3.1's RoPE scaling for the scaled variant, at this small size: head
# dim 8 and theta 30 put its four frequencies' wavelengths (6.3, 14.7, 34.4,
# 80.6) below, between and above 32 / 4 and 32 / 1.
LLAMA3_SCALING = dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=32)


def llama3_inv_freq(inv, s):
    """Hugging Face's llama3 rule: slow long wavelengths by `factor`, keep short
    ones, interpolate between."""
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / s["low_freq_factor"], old / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s["factor"], inv)
    smooth = (old / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


# YaRN (Qwen2.5's long-context scaling) at this size: head dim 8, theta 30
# and 32 original positions put pair 0 before the ramp, pair 1 on it and
# pairs 2 and 3 past it.
YARN_SCALING = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32)


def yarn_inv_freq_and_factor(D, theta, s):
    """Hugging Face's yarn rule written out: frequencies blended from kept
    (extrapolated) to `factor` times slower (interpolated) along a linear ramp
    over the pair index between the beta_fast and beta_slow correction
    dimensions, and the attention factor 0.1 ln(factor) + 1 on cos and sin."""
    old = s["original_max_position_embeddings"]

    def correction_dim(rotations):
        return D * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.get("beta_fast", 32))), 0)
    high = min(math.ceil(correction_dim(s.get("beta_slow", 1))), D - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos = theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    inv = (1 / (s["factor"] * pos)) * (1 - extrapolation) + (1 / pos) * extrapolation
    return inv, 0.1 * math.log(s["factor"]) + 1.0


# longrope (Phi-3's long context) at this size: a factor per pair of the
# 8-wide heads; over 8 original positions a pass of 16 takes the long
# factors, over 16 the short ones (Hugging Face's rule by the pass's last
# position).
LONGROPE_SCALING = dict(rope_type="longrope", factor=4.0, original_max_position_embeddings=8,
                        short_factor=[1.0, 1.25, 2.0, 3.5], long_factor=[1.5, 2.5, 6.0, 12.0])
LONGROPE_SHORT_SCALING = dict(LONGROPE_SCALING, original_max_position_embeddings=16)
# Phi-4-mini's partial rotation at this size: the first 4 of each head's 8
# dimensions turn (2 pairs, so 2 longrope factors each).
PARTIAL_ROPE_DIM = 4
PARTIAL_LONGROPE_SCALING = dict(LONGROPE_SCALING, short_factor=[1.0, 2.5], long_factor=[1.5, 7.0])
# GPT-NeoX's partial rotation at this size: rotary_pct 0.5 of the 8-wide
# heads (Pythia's 0.25 would turn a single pair).
NEOX_ROPE_DIM = 4


def longrope_inv_freq_and_factor(D, theta, T, s):
    """Hugging Face's longrope rule written out: the long factors when the
    pass reaches past the original context (positions 0..T-1: T > original),
    else the short ones, each pair's frequency divided by its factor; cos and
    sin scaled by sqrt(1 + ln(factor) / ln(original))."""
    old = s["original_max_position_embeddings"]
    ext = torch.tensor(s["long_factor"] if T > old else s["short_factor"], dtype=torch.float64)
    inv = 1.0 / (ext * theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    return inv, math.sqrt(1 + math.log(s["factor"]) / math.log(old))


def rotate(t, theta, scaling=None):
    """Rotary embedding of t (B, NH, T, D) at positions 0..T-1, rotate-half form."""
    T, D = t.shape[-2], t.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    amplitude = 1.0
    if scaling is not None and scaling.get("rope_type") == "yarn":
        inv, amplitude = yarn_inv_freq_and_factor(D, theta, scaling)
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            # DeepSeek's: Hugging Face's attention factor from the two mscales.
            amplitude = yarn_get_mscale(scaling["factor"], scaling["mscale"]) / \
                yarn_get_mscale(scaling["factor"], scaling["mscale_all_dim"])
    elif scaling is not None and scaling.get("rope_type") == "longrope":
        inv, amplitude = longrope_inv_freq_and_factor(D, theta, T, scaling)
    elif scaling is not None and scaling.get("rope_type") == "linear":
        inv = inv / scaling["factor"]  # position interpolation
    elif scaling is not None:
        inv = llama3_inv_freq(inv, scaling)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    cos, sin = (amplitude * angle.cos()).to(t.dtype), (amplitude * angle.sin()).to(t.dtype)
    turned = torch.cat([-t[..., D // 2:], t[..., :D // 2]], dim=-1)
    return t * cos + turned * sin


def yarn_get_mscale(factor, mscale=1.0):
    """DeepSeek's (and Hugging Face's) yarn magnitude for a context `factor` times longer."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def deinterleave(t):
    """Hugging Face's apply_rotary_pos_emb_interleave's first step on t
    (..., d): pairs (2i, 2i + 1) become (i, i + d/2), ready for rotate-half."""
    shape = t.shape
    return t.reshape(*shape[:-1], shape[-1] // 2, 2).transpose(-1, -2).reshape(shape)


def rotate_interleaved(t, theta):
    """GPT-J's rotary embedding of t (B, NH, T, D): pairs (2i, 2i + 1) turn by
    position * theta^(-2i/D), as Hugging Face's rotate_every_two does."""
    T, D = t.shape[-2], t.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angle = (torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]).repeat_interleave(2, -1)
    cos, sin = angle.cos().to(t.dtype), angle.sin().to(t.dtype)
    turned = torch.stack([-t[..., 1::2], t[..., ::2]], dim=-1).flatten(-2)
    return t * cos + turned * sin


class BiaslessLayerNorm(torch.nn.Module):
    """Cohere's LayerNorm: the mean subtracted and the variance divided out,
    then a learned scale and no shift (PyTorch 1.13's LayerNorm always has
    a bias)."""
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, None, self.eps)


class HeadLayerNorm(torch.nn.Module):
    """Command R+'s query/key norm (CohereLayerNorm over (heads, D)): each
    head's mean subtracted and its variance divided out over its D
    features, then a weight for each head and feature, no shift."""
    def __init__(self, heads, D, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(heads, D))
        self.eps = eps

    def forward(self, x):  # (B, T, heads, D)
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight


class LayerNorm1P(torch.nn.LayerNorm):
    """Nemotron's LayerNorm1P: a LayerNorm (with its shift) scaling by
    1 + weight, its weights stored around 0."""
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class RmsNorm(torch.nn.Module):
    def __init__(self, C, eps=1e-5, offset=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(C))
        self.eps = eps
        self.offset = offset  # Gemma's: scale by 1 + weight, as Hugging Face's GemmaRMSNorm

    def forward(self, x):
        scale = 1.0 + self.weight if self.offset else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * scale


class Gpt(torch.nn.Module):
    def __init__(self, c, rope_theta=None, swiglu_ffn=None, rms_norm=False, bias=True,
                 tie=True, kv_heads=None, window=None, rope_scaling=None, qkv_bias=False,
                 head_dim=None, qk_norm=False, full_layers=(), geglu=False, embed_scale=None,
                 norm_offset=False, post_norms=False, rope_local_theta=None, attn_scalar=None,
                 attn_softcap=None, final_softcap=None, rope_dim=None, parallel=False,
                 gelu_exact=False, shared_norm=False, head_bias=False, mlp_bias=None,
                 interleaved_rope=False, moe=None, pre_norms=True, norm_affine=True,
                 clip_qkv=None, granite=None, norm_bias=True, logit_scale=None,
                 nope_layers=(), mla=None, mtp=None, relu2=False):
        super().__init__()
        # DeepSeek-V3's multi-token prediction: dict(layers, weight) — module
        # k (ln_embed, ln_hidden, eh_proj, a block as layer n_layer + k - 1
        # would be, ln_out) predicts the token k + 1 ahead of the next
        # through the shared head; mtp_losses gives each depth's loss.
        self.mtp_cfg = mtp
        # DeepSeek-V3's multi-head latent attention, in Hugging Face's layout
        # (each query head's rope rows, and the shared key's, interleaved):
        # dict(kv_rank, q_rank (0: q_proj from x), nope, rope, v).
        self.mla = mla
        # SmolLM3's and Cohere 2's: layers whose queries and keys turn by no
        # rotation at all.
        self.nope_layers = nope_layers
        # Granite's multipliers, as Hugging Face's Granite applies them:
        # dict(embedding, residual, attention, logits) — the token embeddings
        # times `embedding`, each sublayer's output times `residual`, the
        # scores times `attention` (not over sqrt(D)), the logits over
        # `logits`.
        self.granite = granite
        # Cohere's: LayerNorms without a shift, and the logits times
        # logit_scale.
        self.logit_scale = logit_scale
        # OLMo 2's: no norm before either sublayer (post_norms normalise
        # their outputs instead); with qk_norm="full" (OLMo 2's, OLMoE's)
        # one RMSNorm over all the queries and one over all the keys.
        self.pre_norms = pre_norms
        # OLMo's clip_qkv: q, k and v clamped to [-clip_qkv, clip_qkv].
        self.clip_qkv = clip_qkv
        # OLMo's: LayerNorms without weight or bias (norm_affine=False).
        def stream_norm():
            if rms_norm:
                return RmsNorm(C, offset=norm_offset)
            if not norm_bias:
                return BiaslessLayerNorm(C)
            if norm_offset:  # Nemotron's LayerNorm1P
                return LayerNorm1P(C, eps=1e-5)
            return torch.nn.LayerNorm(C, eps=1e-5, elementwise_affine=norm_affine)
        # A mixture of experts (Mixtral's, Qwen's): dict(experts, top_k,
        # ffn, normalize, coef, dense, shared) — the layers in `dense` keep
        # the MLP; `shared`, a width, adds Qwen2-MoE's shared expert and its
        # sigmoid gate.
        # Each forward appends every MoE layer's load-balancing loss
        # E * sum_e f_e P_e to self.aux, and its router z-loss (the mean
        # over tokens of logsumexp(logits)^2) to self.zl; `z` in the dict
        # weighs the latter.
        self.moe = moe
        self.aux = []
        self.zl = []
        # GPT-J's: q and k turn in interleaved pairs rather than halves.
        self.interleaved_rope = interleaved_rope
        # Phi-2's: the parallel sublayers both read ln_1's output (no ln_2).
        self.shared_norm = shared_norm
        # GPT-NeoX's (Pythia's): both sublayers read the block's input, and
        # the MLP's GELU is the exact (erf) form rather than tanh's.
        self.parallel, self.gelu_exact = parallel, gelu_exact
        # Squared ReLU's (Primer's, Nemotron-4's) ungated MLP: relu(x)^2.
        self.relu2 = relu2
        # Phi-4-mini's partial rotation: each head's first rope_dim dimensions
        # turn (as Hugging Face's Phi3 splits q and k), the rest pass through.
        self.rope_dim = rope_dim
        # Gemma 2's soft caps: scores and logits pass through cap * tanh(x / cap).
        self.attn_softcap, self.final_softcap = attn_softcap, final_softcap
        # Gemma 2's and 3's query_pre_attn_scalar: scores over sqrt(this), not sqrt(D).
        self.attn_scalar = attn_scalar
        # Gemma 2's and 3's: each sublayer's output normalised again.
        self.post_norms = post_norms
        # Gemma 3's: the windowed layers turn by a base of their own, unscaled.
        self.rope_local_theta = rope_local_theta
        self.embed_scale = embed_scale  # Gemma's sqrt(d_model) on the token embeddings
        self.geglu = geglu  # the gated MLP's gate: GELU (tanh) instead of silu
        self.window = window
        self.full_layers = full_layers  # layers exempt from the window
        self.rope_scaling = rope_scaling
        C, L = c["d_model"], c["n_layer"]
        self.c = c
        self.kv_heads = kv_heads or c["n_head"]
        # Each head's width: d_model / n_head unless set apart (Qwen3's).
        self.D = head_dim or C // c["n_head"]
        self.qk_norm = qk_norm
        Q = c["n_head"] * self.D  # the query heads' width
        KV = self.kv_heads * self.D  # k's and v's width
        self.rope_theta = rope_theta
        self.swiglu_ffn = swiglu_ffn
        self.wte = torch.nn.Embedding(c["vocab_size"], C)
        if rope_theta is None:
            self.wpe = torch.nn.Embedding(c["seq_len"], C)
        self.h = torch.nn.ModuleList()

        def make_block(layer):
            b = torch.nn.Module()
            if pre_norms:
                b.ln_1 = stream_norm()
            b.attn = torch.nn.Module()
            if mla is not None:
                NH, qk = c["n_head"], mla["nope"] + mla["rope"]
                if mla["q_rank"]:
                    b.attn.q_a_proj = torch.nn.Linear(C, mla["q_rank"], bias=False)
                    b.attn.q_a_norm = RmsNorm(mla["q_rank"])
                    b.attn.q_b_proj = torch.nn.Linear(mla["q_rank"], NH * qk, bias=False)
                else:
                    b.attn.q_proj = torch.nn.Linear(C, NH * qk, bias=False)
                b.attn.kv_a_proj = torch.nn.Linear(C, mla["kv_rank"] + mla["rope"], bias=False)
                b.attn.kv_a_norm = RmsNorm(mla["kv_rank"])
                b.attn.kv_b_proj = torch.nn.Linear(mla["kv_rank"], NH * (mla["nope"] + mla["v"]),
                                                   bias=False)
                b.attn.c_proj = torch.nn.Linear(NH * mla["v"], C, bias=bias)
            else:
                b.attn.c_attn = torch.nn.Linear(C, Q + 2 * KV, bias=bias or qkv_bias)
                b.attn.c_proj = torch.nn.Linear(Q, C, bias=bias)
            if qk_norm == "full":  # OLMo 2's RMSNorm over all queries, all keys
                b.attn.q_norm = RmsNorm(Q, offset=norm_offset)
                b.attn.k_norm = RmsNorm(KV, offset=norm_offset)
            elif qk_norm == "head_layernorm":  # Command R+'s, a weight per head
                b.attn.q_norm = HeadLayerNorm(c["n_head"], self.D)
                b.attn.k_norm = HeadLayerNorm(self.kv_heads, self.D)
            elif qk_norm:  # Qwen3's RMSNorm over each query head and each key head
                b.attn.q_norm = RmsNorm(self.D, offset=norm_offset)
                b.attn.k_norm = RmsNorm(self.D, offset=norm_offset)
            if post_norms:
                b.post_attn_norm = RmsNorm(C, offset=norm_offset)
                b.post_mlp_norm = RmsNorm(C, offset=norm_offset)
            if not shared_norm and pre_norms:
                b.ln_2 = stream_norm()
            b.mlp = torch.nn.Module()
            if moe is not None and layer not in moe.get("dense", ()):
                b.mlp.router = torch.nn.Linear(C, moe["experts"], bias=False)
                b.mlp.experts = torch.nn.ModuleList()
                for _e in range(moe["experts"]):
                    ex = torch.nn.Module()
                    ex.c_fc = torch.nn.Linear(C, 2 * moe["ffn"], bias=False)
                    ex.c_proj = torch.nn.Linear(moe["ffn"], C, bias=False)
                    b.mlp.experts.append(ex)
                if moe.get("sigmoid"):  # DeepSeek-V3's biases for choosing (set below)
                    b.mlp.register_buffer("expert_bias", torch.zeros(moe["experts"]))
                if moe.get("shared"):
                    b.mlp.shared = torch.nn.Module()
                    b.mlp.shared.c_fc = torch.nn.Linear(C, 2 * moe["shared"], bias=False)
                    b.mlp.shared.c_proj = torch.nn.Linear(moe["shared"], C, bias=False)
                    if moe.get("shared_gate", True):  # (GraniteMoeShared's has none)
                        b.mlp.shared_gate = torch.nn.Linear(C, 1, bias=False)
            elif swiglu_ffn is None:  # (Falcon's has no biases, GPT-J's only these)
                mb = bias if mlp_bias is None else mlp_bias
                b.mlp.c_fc = torch.nn.Linear(C, 4 * C, bias=mb)
                b.mlp.c_proj = torch.nn.Linear(4 * C, C, bias=mb)
            else:
                b.mlp.c_fc = torch.nn.Linear(C, 2 * swiglu_ffn, bias=bias)
                b.mlp.c_proj = torch.nn.Linear(swiglu_ffn, C, bias=bias)
            return b

        for layer in range(L):
            self.h.append(make_block(layer))
        self.ln_f = stream_norm()
        if not tie:  # Phi-2's has a bias
            self.lm_head = torch.nn.Linear(C, c["vocab_size"], bias=head_bias)
        if mtp is not None:
            self.mtp = torch.nn.ModuleList()
            for k in range(1, mtp["layers"] + 1):
                m = torch.nn.Module()
                m.ln_embed, m.ln_hidden = stream_norm(), stream_norm()
                m.eh_proj = torch.nn.Linear(2 * C, C, bias=False)
                m.block = make_block(L + k - 1)
                m.ln_out = stream_norm()
                self.mtp.append(m)
        g = torch.Generator().manual_seed(20241121)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if "ln_" in name or "_norm" in name:
                    one = 0.0 if norm_offset else 1.0  # an offset norm's weight 0 scales by 1
                    p.copy_(one + 0.1 * torch.randn(p.shape, generator=g)) if name.endswith("weight") \
                        else p.copy_(0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for name, buf in self.named_buffers():  # (after the weights: theirs stay the same)
            if name.endswith("expert_bias"):
                with torch.no_grad():
                    buf.copy_(0.05 * torch.randn(buf.shape, generator=g))

    def moe_forward(self, mlp, x):
        """The experts' weighted sum for x (B, T, C), as Mixtral's sparse MoE
        block computes it (expert by expert, each output added into its
        tokens' rows in expert order); the layer's balance loss to self.aux."""
        B, T, C = x.shape
        E, k = self.moe["experts"], self.moe["top_k"]
        h = x.reshape(-1, C)
        logits = mlp.router(h).float()
        self.zl.append((torch.logsumexp(logits, dim=-1) ** 2).mean())
        if self.moe.get("sigmoid"):
            # DeepSeek-V3's (GLM-4.5's) router: sigmoid scores; the experts
            # chosen by score plus bias among the top_groups best groups (a
            # group's score the sum of its two best), the gates the unbiased
            # scores of those chosen, renormalised and scaled. (Hugging
            # Face's fills the other groups' experts with 0 rather than
            # -inf: the same while every biased score is positive, as here.)
            scores = logits.sigmoid()
            choice = scores + mlp.expert_bias
            G = self.moe.get("groups", 1)
            if G > 1:
                group = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
                keep = torch.zeros_like(group).scatter_(
                    1, group.topk(self.moe["top_groups"], dim=-1)[1], 1.0)
                keep = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
                choice = choice.masked_fill(~keep, float("-inf"))
            chosen = choice.topk(k, dim=-1)[1]
            top = scores.gather(1, chosen)
            if self.moe["normalize"]:
                top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
            top = top * self.moe.get("scale", 1.0)
            probs = scores / scores.sum(dim=-1, keepdim=True)  # (the balance loss's)
        else:
            probs = logits.softmax(dim=-1)
            G = self.moe.get("groups", 1)
            if G > 1:
                # DeepSeek-V2's group_limited_greedy, as Hugging Face's
                # DeepseekV2Moe: a group scored by its best probability, the
                # other groups' experts filled with 0.
                group = probs.view(-1, G, E // G).max(dim=-1).values
                keep = torch.zeros_like(group).scatter_(
                    1, group.topk(self.moe["top_groups"], dim=-1)[1], 1.0)
                keep = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
                top, chosen = probs.masked_fill(~keep, 0.0).topk(k, dim=-1)
            else:
                top, chosen = probs.topk(k, dim=-1)
            if self.moe["normalize"]:
                top = top / top.sum(dim=-1, keepdim=True)
            top = top * self.moe.get("scale", 1.0)
        out = torch.zeros_like(h)
        load = torch.zeros(E)
        for e in range(E):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            load[e] = rows.numel()
            if rows.numel() == 0:
                continue
            ex = mlp.experts[e]
            gate, up = ex.c_fc(h[rows]).chunk(2, dim=-1)
            out.index_add_(0, rows, ex.c_proj(F.silu(gate) * up) * top[rows, slot, None])
        self.aux.append(E * (load / (h.shape[0] * k) * probs.mean(dim=0)).sum())
        if hasattr(mlp, "shared"):  # as Qwen2MoeSparseMoeBlock adds it
            gate, up = mlp.shared.c_fc(h).chunk(2, dim=-1)
            shared = mlp.shared.c_proj(F.silu(gate) * up)
            if hasattr(mlp, "shared_gate"):
                shared = torch.sigmoid(mlp.shared_gate(h)) * shared
            out = out + shared
        return out.view(B, T, C)

    def attention(self, b, x, layer, layer_mask):
        """Block b's attention (c_attn's heads) on x (B, T, C), before c_proj."""
        B, T = x.shape[0], x.shape[1]
        NH, NKV, D = self.c["n_head"], self.kv_heads, self.D
        qkv = b.attn.c_attn(b.ln_1(x) if self.pre_norms else x)
        if self.clip_qkv is not None:  # as Hugging Face's Olmo does, before any norm
            qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
        q, k, v = qkv.split([NH * D, NKV * D, NKV * D], dim=2)
        if self.qk_norm == "full":  # as Hugging Face's Olmo2 does, before the split
            q, k = b.attn.q_norm(q), b.attn.k_norm(k)
        q, k, v = q.view(B, T, NH, D), k.view(B, T, NKV, D), v.view(B, T, NKV, D)
        # As Qwen3 and Command R+ do, on each head before the rotation.
        if self.qk_norm and self.qk_norm != "full":
            q, k = b.attn.q_norm(q), b.attn.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.rope_theta is not None and layer not in self.nope_layers:
            theta, scaling = self.rope_theta, self.rope_scaling
            if self.rope_local_theta is not None and layer not in self.full_layers:
                theta, scaling = self.rope_local_theta, None
            R = self.rope_dim or D
            if self.interleaved_rope:
                q = torch.cat([rotate_interleaved(q[..., :R], theta), q[..., R:]], dim=-1)
                k = torch.cat([rotate_interleaved(k[..., :R], theta), k[..., R:]], dim=-1)
            else:
                q = torch.cat([rotate(q[..., :R], theta, scaling), q[..., R:]], dim=-1)
                k = torch.cat([rotate(k[..., :R], theta, scaling), k[..., R:]], dim=-1)
        # Grouped-query attention as Hugging Face's LLaMA runs it: each
        # key/value head repeated for the NH / NKV query heads after it.
        k, v = (t.repeat_interleave(NH // NKV, dim=1) for t in (k, v))
        if self.granite is not None:  # as GraniteAttention scales its scores
            att = (q @ k.transpose(-2, -1)) * self.granite["attention"]
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.attn_scalar or D)
        if self.attn_softcap is not None:  # as Hugging Face's Gemma2Attention does
            att = torch.tanh(att / self.attn_softcap) * self.attn_softcap
        att = att.masked_fill(~layer_mask, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, NH * D)

    def latent_attention(self, attn, h, layer_mask):
        """DeepSeek-V3's attention on h (B, T, C) as Hugging Face's
        DeepseekV3Attention computes it, before o_proj (c_proj): queries and
        the key/value latent, each head's [nope | rope] query and key (the
        rope parts de-interleaved and turned, the key's shared by every
        head), scores over sqrt(nope + rope) times yarn's mscale_all_dim
        factor squared."""
        m, B, T, NH = self.mla, h.shape[0], h.shape[1], self.c["n_head"]
        n, r, vd = m["nope"], m["rope"], m["v"]
        qs = attn.q_b_proj(attn.q_a_norm(attn.q_a_proj(h))) if m["q_rank"] else attn.q_proj(h)
        q_pass, q_rot = qs.view(B, T, NH, n + r).transpose(1, 2).split([n, r], dim=-1)
        k_pass, k_rot = attn.kv_a_proj(h).split([m["kv_rank"], r], dim=-1)
        kv = attn.kv_b_proj(attn.kv_a_norm(k_pass)).view(B, T, NH, n + vd).transpose(1, 2)
        k_pass, v = kv.split([n, vd], dim=-1)
        k_rot = k_rot.view(B, 1, T, r)
        q_rot = rotate(deinterleave(q_rot), self.rope_theta, self.rope_scaling)
        k_rot = rotate(deinterleave(k_rot), self.rope_theta, self.rope_scaling)
        q = torch.cat([q_pass, q_rot], dim=-1)
        k = torch.cat([k_pass, k_rot.expand(B, NH, T, r)], dim=-1)
        scale = (n + r) ** -0.5
        s = self.rope_scaling
        if s is not None and s.get("mscale_all_dim"):
            scale *= yarn_get_mscale(s["factor"], s["mscale_all_dim"]) ** 2
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(~layer_mask, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, NH * vd)

    def forward(self, idx):
        return self.head(self.ln_f(self.hidden(idx)))

    def masks(self, T):
        """Every layer's causal mask, and the windowed layers' (the window's
        when there is one)."""
        full_mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        mask = full_mask
        if self.window is not None:  # query i sees keys i - window + 1 .. i
            offset = torch.arange(T)[:, None] - torch.arange(T)[None, :]
            mask = mask & (offset < self.window)
        return full_mask, mask

    def token_embeddings(self, idx):
        x = self.wte(idx)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        if self.granite is not None:
            x = x * self.granite["embedding"]
        return x

    def hidden(self, idx):
        """The last block's output (before ln_f)."""
        self.aux, self.zl = [], []
        T = idx.shape[1]
        x = self.token_embeddings(idx)
        if self.rope_theta is None:
            x = x + self.wpe(torch.arange(T))
        full_mask, mask = self.masks(T)
        for layer, b in enumerate(self.h):
            x = self.block_forward(b, x, layer, full_mask if layer in self.full_layers else mask)
        return x

    def block_forward(self, b, x, layer, layer_mask):
        if self.mla is not None:
            y = self.latent_attention(b.attn, b.ln_1(x), layer_mask)
        else:
            y = self.attention(b, x, layer, layer_mask)
        post_attn = b.post_attn_norm if self.post_norms else (lambda t: t)
        post_mlp = b.post_mlp_norm if self.post_norms else (lambda t: t)
        attn_out = post_attn(b.attn.c_proj(y))
        resid = 1.0 if self.granite is None else self.granite["residual"]
        if resid != 1.0:  # as GraniteDecoderLayer scales each sublayer's output
            attn_out = attn_out * resid
        # Sequential: the MLP reads the attention's sum; parallel: x
        # (through ln_1 again under the shared norm, as Phi's blocks).
        if not self.pre_norms:  # OLMo 2's: the MLP reads the attention's sum itself
            mlp_in = x + attn_out
        elif self.shared_norm:
            mlp_in = b.ln_1(x)
        else:
            mlp_in = b.ln_2(x) if self.parallel else b.ln_2(x + attn_out)
        x = x + attn_out
        if hasattr(b.mlp, "router"):
            return x + resid * post_mlp(self.moe_forward(b.mlp, mlp_in))
        if self.swiglu_ffn is None:
            form = "none" if self.gelu_exact else "tanh"
            h = b.mlp.c_fc(mlp_in)
            act = torch.square(F.relu(h)) if self.relu2 else F.gelu(h, approximate=form)
            return x + resid * post_mlp(b.mlp.c_proj(act))
        gate, value = b.mlp.c_fc(mlp_in).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.geglu else F.silu(gate)
        return x + resid * post_mlp(b.mlp.c_proj(act * value))

    def head(self, normed):
        """Logits from the final norm's output (ln_f's, or a prediction
        module's ln_out)."""
        head = self.wte.weight if not hasattr(self, "lm_head") else self.lm_head.weight
        logits = normed @ head.t()
        if hasattr(self, "lm_head") and self.lm_head.bias is not None:
            logits = logits + self.lm_head.bias
        if self.final_softcap is not None:  # as Gemma2ForCausalLM does
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        if self.granite is not None:  # as GraniteForCausalLM does
            logits = logits / self.granite["logits"]
        if self.logit_scale is not None:  # as CohereForCausalLM does
            logits = logits * self.logit_scale
        return logits

    def mtp_losses(self, idx, y):
        """DeepSeek-V3's multi-token prediction as its paper writes it: module
        k's input at position i is eh_proj([ln_embed(Emb(t_{i+k})) |
        ln_hidden(h^{k-1}_i)]), its block's output h^k_i goes through ln_out
        and the shared head to predict t_{i+k+1}; positions without that
        token score nothing. Each depth's mean cross entropy."""
        T, V, L = idx.shape[1], self.c["vocab_size"], self.c["n_layer"]
        full_mask, mask = self.masks(T)
        h, losses = self.hidden(idx), []
        for k, m in enumerate(self.mtp, start=1):
            ahead = torch.cat([idx[:, k:], torch.zeros_like(idx[:, :k])], dim=1)
            x = m.eh_proj(torch.cat([m.ln_embed(self.token_embeddings(ahead)), m.ln_hidden(h)], -1))
            layer = L + k - 1
            h = self.block_forward(m.block, x, layer,
                                   full_mask if layer in self.full_layers else mask)
            target = torch.cat([y[:, k:], torch.full_like(y[:, :k], -100)], dim=1)
            losses.append(F.cross_entropy(self.head(m.ln_out(h)).reshape(-1, V), target.reshape(-1),
                                          ignore_index=-100))
        return losses

def gpt2_layout(name, t):
    t = t.detach().contiguous()
    return t.t().contiguous() if name.endswith(CONV1D) else t


def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def lr_at(step):
    t = TRAIN
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    if step >= t["steps"]:
        return t["min_lr"]
    progress = (step - t["warmup_steps"]) / (t["steps"] - t["warmup_steps"])
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1 + math.cos(math.pi * progress))


def save_model(model, path):
    save_safetensors(path, {n: gpt2_layout(n, p) for n, p in model.named_parameters()})


def llama_projections(model, b, p):
    """Block b's q, k, v and o projections and its dense MLP's gate, up and
    down under LLaMA's names at prefix p, each (out, in); an ungated MLP
    (Nemotron's, Arcee's) as up and down alone."""
    C, KV = model.c["n_head"] * model.D, model.kv_heads * model.D  # q's width, k's and v's
    q, k, v = b.attn.c_attn.weight.split([C, KV, KV], 0)
    t = {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
         p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": b.attn.c_proj.weight,
         p + "mlp.down_proj.weight": b.mlp.c_proj.weight}
    if model.swiglu_ffn is None:
        t[p + "mlp.up_proj.weight"] = b.mlp.c_fc.weight
    else:
        gate, up = b.mlp.c_fc.weight.split(model.swiglu_ffn, 0)
        t.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up})
    return t


def save_hf_llama(model, path):
    """A LLaMA-style model under Hugging Face's LlamaForCausalLM (or, with
    q, k and v biases, Qwen2ForCausalLM; with query/key norms,
    Qwen3ForCausalLM) names and layout: q, k, v and gate, up as separate
    (out, in) projections; no lm_head when tied."""
    C, KV = model.c["n_head"] * model.D, model.kv_heads * model.D  # q's width, k's and v's
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight}
    if hasattr(model, "lm_head"):
        t["lm_head.weight"] = model.lm_head.weight
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        if b.attn.c_attn.bias is not None:
            bq, bk, bv = b.attn.c_attn.bias.split([C, KV, KV], 0)
            t.update({p + "self_attn.q_proj.bias": bq, p + "self_attn.k_proj.bias": bk,
                      p + "self_attn.v_proj.bias": bv})
        if model.post_norms:  # Gemma 2's and 3's names for the four norms
            t.update({p + "post_attention_layernorm.weight": b.post_attn_norm.weight,
                      p + "pre_feedforward_layernorm.weight": b.ln_2.weight,
                      p + "post_feedforward_layernorm.weight": b.post_mlp_norm.weight})
        elif not model.shared_norm:  # (StableLM 2 12B's parallel blocks share one)
            t[p + "post_attention_layernorm.weight"] = b.ln_2.weight
        t[p + "input_layernorm.weight"] = b.ln_1.weight
        t.update(llama_projections(model, b, p))
        if model.qk_norm == "head_layernorm":  # StableLM 2 12B's, a LayerNorm for each head
            for which in ("q", "k"):
                norm = getattr(b.attn, which + "_norm")
                for h in range(norm.weight.shape[0]):
                    t[p + f"self_attn.{which}_layernorm.norms.{h}.weight"] = norm.weight[h]
        elif model.qk_norm:
            t.update({p + "self_attn.q_norm.weight": b.attn.q_norm.weight,
                      p + "self_attn.k_norm.weight": b.attn.k_norm.weight})
        # StableLM's LayerNorms: their shifts too.
        for ours, theirs in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
            if getattr(getattr(b, ours, None), "bias", None) is not None:
                t[p + theirs + ".bias"] = getattr(b, ours).bias
    if getattr(model.ln_f, "bias", None) is not None:
        t["model.norm.bias"] = model.ln_f.bias
    save_safetensors(path, t)


def save_hf_moe_weights(model, path, mixtral):
    """A mixture of experts under Mixtral's names (block_sparse_moe.gate,
    experts.E.w1 the gate, w3 up, w2 down) or Qwen3-MoE's (mlp.gate,
    experts.E.gate_proj, up_proj, down_proj), dense layers under LLaMA's."""
    save_safetensors(path, hf_moe_tensors(model, mixtral))


def hf_moe_tensors(model, mixtral):
    """save_hf_moe_weights' tensors by name."""
    F_ = model.moe["ffn"]
    C, KV = model.c["n_head"] * model.D, model.kv_heads * model.D
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight}
    if hasattr(model, "lm_head"):
        t["lm_head.weight"] = model.lm_head.weight
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        q, k, v = b.attn.c_attn.weight.split([C, KV, KV], 0)
        if b.attn.c_attn.bias is not None:  # Qwen2-MoE's
            bq, bk, bv = b.attn.c_attn.bias.split([C, KV, KV], 0)
            t.update({p + "self_attn.q_proj.bias": bq, p + "self_attn.k_proj.bias": bk,
                      p + "self_attn.v_proj.bias": bv})
        t.update({p + "input_layernorm.weight": b.ln_1.weight,
                  p + "post_attention_layernorm.weight": b.ln_2.weight,
                  p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                  p + "self_attn.v_proj.weight": v,
                  p + "self_attn.o_proj.weight": b.attn.c_proj.weight})
        if model.qk_norm:
            t.update({p + "self_attn.q_norm.weight": b.attn.q_norm.weight,
                      p + "self_attn.k_norm.weight": b.attn.k_norm.weight})
        if not hasattr(b.mlp, "router"):
            gate, up = b.mlp.c_fc.weight.split(model.swiglu_ffn, 0)
            t.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                      p + "mlp.down_proj.weight": b.mlp.c_proj.weight})
            continue
        moe = p + ("block_sparse_moe." if mixtral else "mlp.")
        t[moe + "gate.weight"] = b.mlp.router.weight
        if hasattr(b.mlp, "shared_gate"):
            gate, up = b.mlp.shared.c_fc.weight.split(model.moe["shared"], 0)
            t.update({moe + "shared_expert.gate_proj.weight": gate,
                      moe + "shared_expert.up_proj.weight": up,
                      moe + "shared_expert.down_proj.weight": b.mlp.shared.c_proj.weight,
                      moe + "shared_expert_gate.weight": b.mlp.shared_gate.weight})
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for e, ex in enumerate(b.mlp.experts):
            gate, up = ex.c_fc.weight.split(F_, 0)
            x = f"{moe}experts.{e}."
            t.update({x + names[0] + ".weight": gate, x + names[1] + ".weight": up,
                      x + names[2] + ".weight": ex.c_proj.weight})
    return t


def save_hf_olmo2(model, directory):
    """An OLMo 2-style model (no pre-norms, post-norms, query/key norms
    over all the heads) as an Olmo2ForCausalLM directory: LLaMA's names but
    for the norms, post_attention_layernorm the attention output's and
    post_feedforward_layernorm the MLP's. With a window, as OLMo 3's; with
    norms on each head, as EXAONE 4's."""
    os.makedirs(directory, exist_ok=True)
    F_ = model.swiglu_ffn
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight,
         "lm_head.weight": model.lm_head.weight}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        t.update(llama_projections(model, b, p))
        t.update({p + "self_attn.q_norm.weight": b.attn.q_norm.weight,
                  p + "self_attn.k_norm.weight": b.attn.k_norm.weight,
                  p + "post_attention_layernorm.weight": b.post_attn_norm.weight,
                  p + "post_feedforward_layernorm.weight": b.post_mlp_norm.weight})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2",
              "hidden_size": CFG["d_model"], "intermediate_size": F_,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "attention_bias": False,
              "tie_word_embeddings": False}
    if model.qk_norm is True:  # EXAONE 4's: head norms, the global layers without rope
        config.update({"architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4",
                       "head_dim": model.D, "sliding_window": model.window,
                       "layer_types": ["full_attention" if i in model.nope_layers
                                       else "sliding_attention" for i in range(CFG["n_layer"])]})
    elif model.window is not None:  # OLMo 3's: windows on the layers layer_types names
        config.update({"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3",
                       "sliding_window": model.window,
                       # (yarn's betas written out, as OLMo 3's files do)
                       "rope_scaling": dict(model.rope_scaling, beta_fast=32.0, beta_slow=1.0),
                       "layer_types": ["full_attention" if i in model.full_layers
                                       else "sliding_attention" for i in range(CFG["n_layer"])]})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_olmo(model, directory):
    """An OLMo-style model (LLaMA's blocks, LayerNorms without weights) as
    an OlmoForCausalLM directory: LLaMA's names, and no norms at all."""
    os.makedirs(directory, exist_ok=True)
    F_ = model.swiglu_ffn
    t = {"model.embed_tokens.weight": model.wte.weight, "lm_head.weight": model.lm_head.weight}
    for i, b in enumerate(model.h):
        t.update(llama_projections(model, b, f"model.layers.{i}."))
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["OlmoForCausalLM"], "model_type": "olmo",
              "hidden_size": CFG["d_model"], "intermediate_size": F_,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rope_theta": ROPE_THETA, "attention_bias": False, "clip_qkv": model.clip_qkv,
              "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_granite(model, directory):
    """A Granite-style model (LLaMA's blocks with its four multipliers) as a
    GraniteForCausalLM directory: LLaMA's names."""
    os.makedirs(directory, exist_ok=True)
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight}
    if hasattr(model, "lm_head"):
        t["lm_head.weight"] = model.lm_head.weight
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        t.update(llama_projections(model, b, p))
        t.update({p + "input_layernorm.weight": b.ln_1.weight,
                  p + "post_attention_layernorm.weight": b.ln_2.weight})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    g = model.granite
    config = {"architectures": ["GraniteForCausalLM"], "model_type": "granite",
              "hidden_size": CFG["d_model"], "intermediate_size": model.swiglu_ffn,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "attention_bias": False,
              "mlp_bias": False, "embedding_multiplier": g["embedding"],
              "residual_multiplier": g["residual"], "attention_multiplier": g["attention"],
              "logits_scaling": g["logits"], "tie_word_embeddings": not hasattr(model, "lm_head")}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_granitemoe(model, directory):
    """A GraniteMoeShared-style model (Granite's blocks and multipliers, a
    mixture on every layer, an ungated shared expert) as a
    GraniteMoeSharedForCausalLM directory: the experts fused as
    ParallelExperts holds them, input_linear (E, 2F, C) of each expert's
    [gate | up], output_linear (E, C, F); the router as router.layer."""
    os.makedirs(directory, exist_ok=True)
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight}
    C, KV = model.c["n_head"] * model.D, model.kv_heads * model.D
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        q, k, v = b.attn.c_attn.weight.split([C, KV, KV], 0)
        mlp = b.mlp
        t.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                  p + "self_attn.v_proj.weight": v,
                  p + "self_attn.o_proj.weight": b.attn.c_proj.weight,
                  p + "input_layernorm.weight": b.ln_1.weight,
                  p + "post_attention_layernorm.weight": b.ln_2.weight,
                  p + "block_sparse_moe.router.layer.weight": mlp.router.weight,
                  p + "block_sparse_moe.input_linear.weight":
                      torch.stack([e.c_fc.weight for e in mlp.experts]),
                  p + "block_sparse_moe.output_linear.weight":
                      torch.stack([e.c_proj.weight for e in mlp.experts]),
                  p + "shared_mlp.input_linear.weight": mlp.shared.c_fc.weight,
                  p + "shared_mlp.output_linear.weight": mlp.shared.c_proj.weight})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    g = model.granite
    config = {"architectures": ["GraniteMoeSharedForCausalLM"], "model_type": "granitemoeshared",
              "hidden_size": CFG["d_model"], "intermediate_size": model.moe["ffn"],
              "shared_intermediate_size": model.moe["shared"],
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "attention_bias": False,
              "num_local_experts": model.moe["experts"], "num_experts_per_tok": model.moe["top_k"],
              "output_router_logits": False, "router_aux_loss_coef": model.moe["coef"],
              "embedding_multiplier": g["embedding"], "residual_multiplier": g["residual"],
              "attention_multiplier": g["attention"], "logits_scaling": g["logits"],
              "tie_word_embeddings": True}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_starcoder2(model, directory):
    """A StarCoder2-style model (the sequential block with rope, LayerNorms,
    biases on every linear layer, an ungated GELU MLP, grouped key/value
    heads, a window) as a Starcoder2ForCausalLM directory: LLaMA's attention
    names with biases, the MLP's as mlp.c_fc and mlp.c_proj."""
    os.makedirs(directory, exist_ok=True)
    C, KV = model.c["n_head"] * model.D, model.kv_heads * model.D
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight,
         "model.norm.bias": model.ln_f.bias, "lm_head.weight": model.lm_head.weight}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            q, k, v = getattr(b.attn.c_attn, kind).split([C, KV, KV], 0)
            t.update({p + "self_attn.q_proj." + kind: q, p + "self_attn.k_proj." + kind: k,
                      p + "self_attn.v_proj." + kind: v,
                      p + "self_attn.o_proj." + kind: getattr(b.attn.c_proj, kind),
                      p + "mlp.c_fc." + kind: getattr(b.mlp.c_fc, kind),
                      p + "mlp.c_proj." + kind: getattr(b.mlp.c_proj, kind),
                      p + "input_layernorm." + kind: getattr(b.ln_1, kind),
                      p + "post_attention_layernorm." + kind: getattr(b.ln_2, kind)})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2",
              "hidden_size": CFG["d_model"], "intermediate_size": 4 * CFG["d_model"],
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "gelu_pytorch_tanh",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "norm_epsilon": 1e-5, "rope_theta": ROPE_THETA, "sliding_window": model.window,
              "use_bias": True, "residual_dropout": 0.0, "embedding_dropout": 0.0,
              "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_nemotron(model, directory):
    """A Nemotron-style model (the sequential block, LayerNorm1P, a
    squared-ReLU MLP of 4C, part of each head turned, grouped key/value
    heads, no linear biases) as a NemotronForCausalLM directory: LLaMA's
    attention names, the MLP's as up_proj and down_proj, the norms'
    weights (around 0) and biases."""
    os.makedirs(directory, exist_ok=True)
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight,
         "model.norm.bias": model.ln_f.bias, "lm_head.weight": model.lm_head.weight}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        t.update(llama_projections(model, b, p))
        for kind in ("weight", "bias"):
            t[p + "input_layernorm." + kind] = getattr(b.ln_1, kind)
            t[p + "post_attention_layernorm." + kind] = getattr(b.ln_2, kind)
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["NemotronForCausalLM"], "model_type": "nemotron",
              "hidden_size": CFG["d_model"], "intermediate_size": 4 * CFG["d_model"],
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "head_dim": model.D,
              "hidden_act": "relu2", "vocab_size": CFG["vocab_size"],
              "max_position_embeddings": CFG["seq_len"], "norm_eps": 1e-5,
              "rope_theta": ROPE_THETA, "partial_rotary_factor": model.rope_dim / model.D,
              "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
              "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_arcee(model, directory):
    """An Arcee-style model (LLaMA's blocks with an ungated squared-ReLU MLP
    of 4C) as an ArceeForCausalLM directory: LLaMA's names, the MLP's as
    up_proj and down_proj."""
    os.makedirs(directory, exist_ok=True)
    save_hf_llama(model, os.path.join(directory, "model.safetensors"))
    write_llama_config(model, directory, "ArceeForCausalLM", "arcee",
                       intermediate_size=4 * CFG["d_model"], hidden_act="relu2",
                       rope_scaling=None, attention_bias=False, mlp_bias=False)


def save_hf_cohere(model, directory):
    """A Cohere-style model (LLaMA's sublayers in parallel on one LayerNorm
    without a bias, q and k turned in interleaved pairs, the logits scaled)
    as a CohereForCausalLM directory: LLaMA's names, q_proj's and k_proj's
    rows as the reference turns them. With a window, as a
    Cohere2ForCausalLM one: its global layers (the window's full ones) have
    no rotation."""
    os.makedirs(directory, exist_ok=True)
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        t.update(llama_projections(model, b, p))
        t[p + "input_layernorm.weight"] = b.ln_1.weight
        if model.qk_norm == "head_layernorm":  # Command R+'s, (heads, D)
            t[p + "self_attn.q_norm.weight"] = b.attn.q_norm.weight
            t[p + "self_attn.k_norm.weight"] = b.attn.k_norm.weight
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["CohereForCausalLM"], "model_type": "cohere",
              "hidden_size": CFG["d_model"], "intermediate_size": model.swiglu_ffn,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "layer_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "attention_bias": False,
              "logit_scale": model.logit_scale,
              "use_qk_norm": model.qk_norm == "head_layernorm",
              "tie_word_embeddings": True}
    if model.window is not None:
        assert tuple(model.full_layers) == tuple(model.nope_layers)
        del config["use_qk_norm"]
        config.update({"architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2",
                       "sliding_window": model.window,
                       "layer_types": ["full_attention" if i in model.full_layers
                                       else "sliding_attention" for i in range(CFG["n_layer"])]})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def write_llama_config(model, directory, architecture, model_type, **keys):
    """directory/config.json for a LLaMA-style model of class `architecture`:
    its widths, heads (head_dim written), SwiGLU, RMSNorm's eps, RoPE's base
    and an untied head, then `keys`."""
    config = {"architectures": [architecture], "model_type": model_type,
              "hidden_size": CFG["d_model"], "intermediate_size": model.swiglu_ffn,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "head_dim": model.D, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "tie_word_embeddings": False}
    config.update(keys)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_glm4(model, directory):
    """A GLM-4-style model (LLaMA's blocks with q, k and v biases, part of
    each head turned in interleaved pairs, and four norms a block) as a
    Glm4ForCausalLM directory: q_proj, k_proj and v_proj with their biases
    (rows as the reference turns them), gate_up_proj fused, and GLM-4's
    names for the norms."""
    os.makedirs(directory, exist_ok=True)
    C, KV = model.c["n_head"] * model.D, model.kv_heads * model.D
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight,
         "lm_head.weight": model.lm_head.weight}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        q, k, v = b.attn.c_attn.weight.split([C, KV, KV], 0)
        bq, bk, bv = b.attn.c_attn.bias.split([C, KV, KV], 0)
        t.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                  p + "self_attn.v_proj.weight": v, p + "self_attn.q_proj.bias": bq,
                  p + "self_attn.k_proj.bias": bk, p + "self_attn.v_proj.bias": bv,
                  p + "self_attn.o_proj.weight": b.attn.c_proj.weight,
                  p + "mlp.gate_up_proj.weight": b.mlp.c_fc.weight,
                  p + "mlp.down_proj.weight": b.mlp.c_proj.weight,
                  p + "input_layernorm.weight": b.ln_1.weight,
                  p + "post_self_attn_layernorm.weight": b.post_attn_norm.weight,
                  p + "post_attention_layernorm.weight": b.ln_2.weight,
                  p + "post_mlp_layernorm.weight": b.post_mlp_norm.weight})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    write_llama_config(model, directory, "Glm4ForCausalLM", "glm4",
                       partial_rotary_factor=model.rope_dim / model.D, attention_bias=True)


def deepseek_moe_keys(model):
    """The config.json keys of a DeepSeek-style mixture: its experts, the
    shared ones, the dense first layers and the routing's numbers."""
    F_ = model.moe["ffn"]
    return dict(n_routed_experts=model.moe["experts"], num_experts_per_tok=model.moe["top_k"],
                moe_intermediate_size=F_, n_shared_experts=model.moe["shared"] // F_,
                first_k_dense_replace=len(model.moe["dense"]),
                norm_topk_prob=model.moe["normalize"], routed_scaling_factor=model.moe["scale"],
                n_group=model.moe["groups"], topk_group=model.moe["top_groups"])


def save_hf_deepseek_moe(model, directory, architecture, model_type, prediction_layers=0,
                         **keys):
    """A model with DeepSeek-V3's mixture (a dense first layer, then a
    sigmoid router over experts with its e_score_correction_bias, and a
    shared expert) as a Hugging Face directory of class `architecture`, its
    blocks under LLaMA's names; with `prediction_layers`, that many
    multi-token-prediction layers after the model's own (as GLM-4.5's files
    hold), which readers skip. A model with prediction modules of its own
    (mtp) writes them as DeepSeek-V3's files do: each a layer after the
    model's, its block under the layers' names beside enorm, hnorm, eh_proj,
    shared_head.norm and copies of the head (shared_head.head) and the
    embedding (embed_tokens)."""
    os.makedirs(directory, exist_ok=True)
    F_, C = model.moe["ffn"], CFG["d_model"]
    own = len(model.h)
    modules = list(model.mtp) if model.mtp_cfg is not None else []
    for m in modules:  # (their blocks written as the layers after the model's)
        model.h.append(m.block)
    try:
        t = hf_moe_tensors(model, mixtral=False)
        for i, b in enumerate(model.h):
            if not hasattr(b.mlp, "router"):
                continue
            p = f"model.layers.{i}.mlp."
            t[p + "gate.e_score_correction_bias"] = b.mlp.expert_bias
            gate, up = b.mlp.shared.c_fc.weight.split(model.moe["shared"], 0)
            t.update({p + "shared_experts.gate_proj.weight": gate,
                      p + "shared_experts.up_proj.weight": up,
                      p + "shared_experts.down_proj.weight": b.mlp.shared.c_proj.weight})
    finally:
        while len(model.h) > own:
            del model.h[len(model.h) - 1]
    for k, m in enumerate(modules):
        p = f"model.layers.{own + k}."
        t.update({p + "enorm.weight": m.ln_embed.weight, p + "hnorm.weight": m.ln_hidden.weight,
                  p + "eh_proj.weight": m.eh_proj.weight,
                  p + "shared_head.norm.weight": m.ln_out.weight,
                  p + "shared_head.head.weight": model.lm_head.weight,
                  p + "embed_tokens.weight": model.wte.weight})
    g = torch.Generator().manual_seed(7)
    for extra in range(prediction_layers):
        mtp = f"model.layers.{CFG['n_layer'] + extra}."
        t.update({mtp + "eh_proj.weight": torch.randn(C, 2 * C, generator=g),
                  mtp + "enorm.weight": torch.ones(C), mtp + "hnorm.weight": torch.ones(C),
                  mtp + "self_attn.q_proj.weight": torch.randn(C, C, generator=g)})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    write_llama_config(model, directory, architecture, model_type, **deepseek_moe_keys(model),
                       **keys)


def save_hf_glm4_moe(model, directory):
    """A GLM-4.5-style model (LLaMA's blocks with q, k and v biases, Qwen3's
    query/key norms, half of each head turned in halves; DeepSeek-V3's
    mixture) as a Glm4MoeForCausalLM directory with a prediction layer."""
    save_hf_deepseek_moe(model, directory, "Glm4MoeForCausalLM", "glm4_moe", prediction_layers=1,
                         partial_rotary_factor=model.rope_dim / model.D, attention_bias=True,
                         use_qk_norm=True, num_nextn_predict_layers=1)


def save_hf_glm4_moe_mtp(model, directory):
    """The GLM-4.5-style model with its own prediction module, written as
    GLM-4.5's files hold theirs (num_nextn_predict_layers)."""
    save_hf_deepseek_moe(model, directory, "Glm4MoeForCausalLM", "glm4_moe",
                         partial_rotary_factor=model.rope_dim / model.D, attention_bias=True,
                         use_qk_norm=True, num_nextn_predict_layers=model.mtp_cfg["layers"])


def save_hf_dots1(model, directory):
    """A dots.llm1-style model (Qwen3's blocks; DeepSeek-V3's mixture) as a
    Dots1ForCausalLM directory."""
    save_hf_deepseek_moe(model, directory, "Dots1ForCausalLM", "dots1", attention_bias=False,
                         sliding_window=None, max_window_layers=CFG["n_layer"])


def save_hf_deepseek_v3(model, directory):
    """A DeepSeek-V3-style model (LLaMA's blocks with latent attention;
    DeepSeek-V3's mixture) as a DeepseekV3ForCausalLM directory holding a
    multi-token-prediction layer besides: the attention under Hugging
    Face's names, its rope rows interleaved as the reference holds them."""
    save_hf_deepseek(model, directory, "DeepseekV3ForCausalLM", "deepseek_v3")


def save_hf_deepseek_v2(model, directory):
    """A DeepSeek-V2-style model (LLaMA's blocks with latent attention;
    softmax routing, groups scored by their best expert, scaled gates) as a
    DeepseekV2ForCausalLM directory."""
    save_hf_deepseek(model, directory, "DeepseekV2ForCausalLM", "deepseek_v2")


def save_hf_deepseek(model, directory, architecture, model_type):
    """save_hf_deepseek_v3's and save_hf_deepseek_v2's directory of class
    `architecture`."""
    os.makedirs(directory, exist_ok=True)
    v3 = model_type == "deepseek_v3"
    m, F_, C = model.mla, model.moe["ffn"], CFG["d_model"]
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight,
         "lm_head.weight": model.lm_head.weight}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        a, sa = b.attn, p + "self_attn."
        t.update({p + "input_layernorm.weight": b.ln_1.weight,
                  p + "post_attention_layernorm.weight": b.ln_2.weight,
                  sa + "kv_a_proj_with_mqa.weight": a.kv_a_proj.weight,
                  sa + "kv_a_layernorm.weight": a.kv_a_norm.weight,
                  sa + "kv_b_proj.weight": a.kv_b_proj.weight,
                  sa + "o_proj.weight": a.c_proj.weight})
        if m["q_rank"]:
            t.update({sa + "q_a_proj.weight": a.q_a_proj.weight,
                      sa + "q_a_layernorm.weight": a.q_a_norm.weight,
                      sa + "q_b_proj.weight": a.q_b_proj.weight})
        else:
            t[sa + "q_proj.weight"] = a.q_proj.weight
        if not hasattr(b.mlp, "router"):
            gate, up = b.mlp.c_fc.weight.split(model.swiglu_ffn, 0)
            t.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                      p + "mlp.down_proj.weight": b.mlp.c_proj.weight})
            continue
        x = p + "mlp."
        t[x + "gate.weight"] = b.mlp.router.weight
        if v3:
            t[x + "gate.e_score_correction_bias"] = b.mlp.expert_bias
        for e, ex in enumerate(b.mlp.experts):
            gate, up = ex.c_fc.weight.split(F_, 0)
            t.update({f"{x}experts.{e}.gate_proj.weight": gate,
                      f"{x}experts.{e}.up_proj.weight": up,
                      f"{x}experts.{e}.down_proj.weight": ex.c_proj.weight})
        gate, up = b.mlp.shared.c_fc.weight.split(model.moe["shared"], 0)
        t.update({x + "shared_experts.gate_proj.weight": gate,
                  x + "shared_experts.up_proj.weight": up,
                  x + "shared_experts.down_proj.weight": b.mlp.shared.c_proj.weight})
    if v3:  # a multi-token-prediction layer, which readers skip
        g = torch.Generator().manual_seed(7)
        mtp = f"model.layers.{CFG['n_layer']}."
        t.update({mtp + "eh_proj.weight": torch.randn(C, 2 * C, generator=g),
                  mtp + "enorm.weight": torch.ones(C), mtp + "hnorm.weight": torch.ones(C)})
        keys = dict(rope_interleave=True, num_nextn_predict_layers=1)
    else:
        keys = dict(topk_method="group_limited_greedy", scoring_func="softmax",
                    aux_loss_alpha=model.moe["coef"], seq_aux=False)
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    write_llama_config(model, directory, architecture, model_type,
                       head_dim=m["rope"], kv_lora_rank=m["kv_rank"],
                       q_lora_rank=m["q_rank"] or None, qk_nope_head_dim=m["nope"],
                       qk_rope_head_dim=m["rope"], v_head_dim=m["v"],
                       rope_scaling=model.rope_scaling, attention_bias=False,
                       **deepseek_moe_keys(model), **keys)


def save_hf_minimax_m2(model, directory):
    """A MiniMax-M2-style model (LLaMA's blocks with query/key norms over
    all the heads, half of each head turned in halves; experts on every
    layer chosen by biased sigmoid scores, renormalised) as a
    MiniMaxM2ForCausalLM directory under the names its files use (Mixtral's
    block_sparse_moe, the biases beside the experts), holding a
    multi-token-prediction module besides, which readers skip."""
    os.makedirs(directory, exist_ok=True)
    C = CFG["d_model"]
    t = hf_moe_tensors(model, mixtral=True)
    for i, b in enumerate(model.h):
        t[f"model.layers.{i}.block_sparse_moe.e_score_correction_bias"] = b.mlp.expert_bias
    g = torch.Generator().manual_seed(7)
    mtp = f"model.layers.{CFG['n_layer']}."
    t.update({mtp + "eh_proj.weight": torch.randn(C, 2 * C, generator=g),
              mtp + "enorm.weight": torch.ones(C), mtp + "hnorm.weight": torch.ones(C)})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    write_llama_config(model, directory, "MiniMaxM2ForCausalLM", "minimax_m2",
                       intermediate_size=model.moe["ffn"], num_local_experts=model.moe["experts"],
                       num_experts_per_tok=model.moe["top_k"], rotary_dim=model.rope_dim,
                       partial_rotary_factor=model.rope_dim / model.D, use_qk_norm=True,
                       qk_norm_type="per_layer", scoring_func="sigmoid", use_routing_bias=True,
                       attn_type_list=[1] * CFG["n_layer"], output_router_logits=False,
                       router_jitter_noise=0.0, use_mtp=True, num_mtp_modules=1)


def save_hf_helium(model, directory):
    """A Helium-style model (LLaMA's blocks turning q and k in interleaved
    pairs, q, k and v biases under attention_bias) as a HeliumForCausalLM
    directory: LLaMA's names, rows as the reference turns them."""
    os.makedirs(directory, exist_ok=True)
    save_hf_llama(model, os.path.join(directory, "model.safetensors"))
    write_llama_config(model, directory, "HeliumForCausalLM", "helium",
                       attention_bias=model.h[0].attn.c_attn.bias is not None, mlp_bias=False)


def save_hf_seed_oss(model, directory):
    """A Seed-OSS-style model (LLaMA's blocks with q, k and v biases, heads
    of their own width) as a SeedOssForCausalLM directory: LLaMA's names."""
    os.makedirs(directory, exist_ok=True)
    save_hf_llama(model, os.path.join(directory, "model.safetensors"))
    write_llama_config(model, directory, "SeedOssForCausalLM", "seed_oss", attention_bias=True,
                       attention_out_bias=False, mlp_bias=False, residual_dropout=0.0,
                       attention_dropout=0.0)


def save_hf_smollm3(model, directory):
    """A SmolLM3-style model (LLaMA's blocks, some layers without rope) as a
    SmolLM3ForCausalLM directory: LLaMA's names, and no_rope_layers flagging
    each layer (1: rope, 0: none)."""
    os.makedirs(directory, exist_ok=True)
    save_hf_llama(model, os.path.join(directory, "model.safetensors"))
    write_llama_config(model, directory, "SmolLM3ForCausalLM", "smollm3", attention_bias=False,
                       mlp_bias=False, use_sliding_window=False, sliding_window=None,
                       no_rope_layers=[0 if i in model.nope_layers else 1
                                       for i in range(CFG["n_layer"])],
                       tie_word_embeddings=True)


def save_hf_olmoe(model, directory):
    """An OLMoE-style model (pre-norm blocks, query/key norms over all the
    heads, experts on every layer) as an OlmoeForCausalLM directory."""
    os.makedirs(directory, exist_ok=True)
    save_hf_moe_weights(model, os.path.join(directory, "model.safetensors"), mixtral=False)
    config = {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
              "hidden_size": CFG["d_model"], "intermediate_size": model.moe["ffn"],
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "attention_bias": False,
              "num_experts": model.moe["experts"], "num_experts_per_tok": model.moe["top_k"],
              "norm_topk_prob": model.moe["normalize"], "output_router_logits": False,
              "router_aux_loss_coef": model.moe["coef"], "clip_qkv": None,
              "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_mixtral(model, directory):
    """A Mixtral-style model as a MixtralForCausalLM directory."""
    os.makedirs(directory, exist_ok=True)
    save_hf_moe_weights(model, os.path.join(directory, "model.safetensors"), mixtral=True)
    config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
              "hidden_size": CFG["d_model"], "intermediate_size": model.moe["ffn"],
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "sliding_window": model.window,
              "num_local_experts": model.moe["experts"],
              "num_experts_per_tok": model.moe["top_k"], "output_router_logits": False,
              "router_aux_loss_coef": model.moe["coef"], "router_jitter_noise": 0.0,
              "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_qwen_moe(model, directory, model_type):
    """A Qwen3-MoE-style model as a Qwen3MoeForCausalLM directory, or a
    Qwen2-MoE-style one (q, k and v biases, a gated shared expert) as a
    Qwen2MoeForCausalLM one."""
    os.makedirs(directory, exist_ok=True)
    save_hf_moe_weights(model, os.path.join(directory, "model.safetensors"), mixtral=False)
    qwen2 = model_type == "qwen2_moe"
    architecture = "Qwen2MoeForCausalLM" if qwen2 else "Qwen3MoeForCausalLM"
    config = {"architectures": [architecture], "model_type": model_type,
              "hidden_size": CFG["d_model"], "intermediate_size": model.swiglu_ffn,
              "moe_intermediate_size": model.moe["ffn"], "num_hidden_layers": CFG["n_layer"],
              "num_attention_heads": CFG["n_head"], "num_key_value_heads": model.kv_heads,
              "hidden_act": "silu", "vocab_size": CFG["vocab_size"],
              "max_position_embeddings": CFG["seq_len"], "rms_norm_eps": 1e-5,
              "rope_theta": ROPE_THETA, "num_experts": model.moe["experts"],
              "num_experts_per_tok": model.moe["top_k"],
              "norm_topk_prob": model.moe["normalize"], "decoder_sparse_step": 1,
              "mlp_only_layers": list(model.moe.get("dense", ())), "output_router_logits": False,
              "router_aux_loss_coef": model.moe["coef"], "use_sliding_window": False,
              "sliding_window": CFG["seq_len"], "max_window_layers": CFG["n_layer"],
              "tie_word_embeddings": not hasattr(model, "lm_head")}
    if qwen2:
        config["shared_expert_intermediate_size"] = model.moe["shared"]
    else:
        config.update(head_dim=model.D, attention_bias=False)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_gemma(model, directory, architecture, model_type, **keys):
    """A Gemma 2/3-style model as a Hugging Face directory: its weights under
    LLaMA's names (save_hf_llama) and a config.json with the keys every such
    test model shares, plus `keys`."""
    os.makedirs(directory, exist_ok=True)
    save_hf_llama(model, os.path.join(directory, "model.safetensors"))
    config = {"architectures": [architecture], "model_type": model_type,
              "hidden_size": CFG["d_model"], "intermediate_size": SWIGLU_FFN,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": LLAMA_KV_HEADS, "hidden_activation": "gelu_pytorch_tanh",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "sliding_window": MISTRAL_WINDOW,
              "attention_bias": False, "tie_word_embeddings": True}
    config.update(keys)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_phi3(model, directory, scaling, rope_dim):
    """A LLaMA-style model as a Phi3ForCausalLM directory, as Phi-4-mini's
    files are written: q, k and v fused into qkv_proj and gate and up into
    gate_up_proj; partial_rotary_factor the share of each head that turns;
    longrope as its three keys (type and the two lists), the factor implied
    by max_position_embeddings over original_max_position_embeddings."""
    os.makedirs(directory, exist_ok=True)
    t = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.ln_f.weight,
         "lm_head.weight": model.lm_head.weight}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": b.ln_1.weight,
                  p + "post_attention_layernorm.weight": b.ln_2.weight,
                  p + "self_attn.qkv_proj.weight": b.attn.c_attn.weight,
                  p + "self_attn.o_proj.weight": b.attn.c_proj.weight,
                  p + "mlp.gate_up_proj.weight": b.mlp.c_fc.weight,
                  p + "mlp.down_proj.weight": b.mlp.c_proj.weight})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    original = scaling["original_max_position_embeddings"]
    config = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
              "hidden_size": CFG["d_model"], "intermediate_size": SWIGLU_FFN,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": LLAMA_KV_HEADS, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"],
              "max_position_embeddings": int(scaling["factor"] * original),
              "original_max_position_embeddings": original, "rms_norm_eps": 1e-5,
              "rope_theta": ROPE_THETA,
              "rope_scaling": {"type": "longrope", "short_factor": scaling["short_factor"],
                               "long_factor": scaling["long_factor"]},
              "partial_rotary_factor": rope_dim / model.D, "sliding_window": None,
              "tie_word_embeddings": False, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
              "attention_dropout": 0.0}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_neox(model, directory, rope_dim):
    """A GPT-NeoX-style model as a GPTNeoXForCausalLM directory, as Pythia's
    files are written: query_key_value's rows interleaved by head (each
    head's q, k and v rows together), LayerNorms and biases throughout,
    embed_out the untied head; rotary_pct the share of each head that
    turns. The buffers older files carry (the causal mask, masked_bias and
    RoPE's inverse frequencies) are written too, as readers must skip them."""
    os.makedirs(directory, exist_ok=True)
    C, NH, T = CFG["d_model"], CFG["n_head"], CFG["seq_len"]
    D = C // NH
    t = {"gpt_neox.embed_in.weight": model.wte.weight, "embed_out.weight": model.lm_head.weight,
         "gpt_neox.final_layer_norm.weight": model.ln_f.weight,
         "gpt_neox.final_layer_norm.bias": model.ln_f.bias}
    names = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm",
             "attn.c_attn": "attention.query_key_value", "attn.c_proj": "attention.dense",
             "mlp.c_fc": "mlp.dense_h_to_4h", "mlp.c_proj": "mlp.dense_4h_to_h"}
    for i, b in enumerate(model.h):
        p = f"gpt_neox.layers.{i}."
        for ours, theirs in names.items():
            module = b
            for part in ours.split("."):
                module = getattr(module, part)
            for kind in ("weight", "bias"):
                v = getattr(module, kind)
                if ours == "attn.c_attn":  # [q | k | v] -> per head [q_h k_h v_h]
                    v = v.reshape(3, NH, D, -1).transpose(0, 1).reshape(v.shape)
                t[p + theirs + "." + kind] = v
        t[p + "attention.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        t[p + "attention.masked_bias"] = torch.tensor(-1e9)
        t[p + "attention.rotary_emb.inv_freq"] = 1.0 / (
            ROPE_THETA ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    # The same weights as torch.save writes them (the older checkpoints'
    # pytorch_model.bin, Pythia's intermediate steps), whole and in two
    # shards with their index; the causal mask as the bool buffer those
    # files hold.
    t = {n: (v.detach().bool() if n.endswith(".attention.bias") else v.detach().clone())
         for n, v in t.items()}
    bin_dir, sharded_dir = directory + "_bin", directory + "_bin_sharded"
    for d in (bin_dir, sharded_dir):
        os.makedirs(d, exist_ok=True)
    torch.save(t, os.path.join(bin_dir, "pytorch_model.bin"))
    names = sorted(t)
    shards = {"pytorch_model-00001-of-00002.bin": names[: len(names) // 2],
              "pytorch_model-00002-of-00002.bin": names[len(names) // 2:]}
    for file, part in shards.items():
        torch.save({n: t[n] for n in part}, os.path.join(sharded_dir, file))
    with open(os.path.join(sharded_dir, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: file for file, part in shards.items()
                                                  for n in part}}, f)
    config = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
              "hidden_size": C, "intermediate_size": 4 * C, "num_hidden_layers": CFG["n_layer"],
              "num_attention_heads": NH, "hidden_act": "gelu", "rotary_pct": rope_dim / D,
              "rotary_emb_base": ROPE_THETA, "max_position_embeddings": T,
              "layer_norm_eps": 1e-5, "use_parallel_residual": True, "attention_bias": True,
              "rope_scaling": None, "hidden_dropout": 0.0, "attention_dropout": 0.0,
              "vocab_size": CFG["vocab_size"], "tie_word_embeddings": False}
    for d in (directory, bin_dir, sharded_dir):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)


class RunsCode:
    """What a hostile checkpoint holds: an object whose unpickling calls
    os.system."""

    def __reduce__(self):
        return (os.system, ("echo this checkpoint ran code",))


def save_torch_files(out, ref):
    """torch.save files for the reader of PyTorch checkpoints: a state dict
    of every storage type and kind of view (a transposed weight, a row of
    another tensor sharing its storage, an offset slice), their values in
    ref as f64 under torchbin.<name>; and a file whose pickle would run
    code."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(4, 6, generator=g)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "f64": torch.randn(7, generator=g, dtype=torch.float64),
        "f16": torch.randn(2, 3, generator=g).half(),
        "bf16": torch.randn(5, 2, generator=g).bfloat16(),
        "transposed": base.t(),
        "row_of_base": base[2],
        "columns": base[:, 1:4],
        "base": base,
        "i64": torch.tensor([[-3, 7], [2 ** 40, 0]]),
        "i32": torch.tensor([5, -9], dtype=torch.int32),
        "bool": torch.tensor([[True, False, True]]),
        "u8": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "i8": torch.tensor([-128, 5, 127], dtype=torch.int8),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    torch.save(tensors, os.path.join(out, "tensors.bin"))
    for name, t in tensors.items():
        ref["torchbin." + name] = t.double()
    torch.save({"w": torch.ones(2), "payload": RunsCode()}, os.path.join(out, "runs_code.bin"))


def save_hf_stablelm(model, directory, rope_dim):
    """A StableLM-style model as a StableLmForCausalLM directory, as
    StableLM 2's files are written: LLaMA's names (save_hf_llama) with the
    LayerNorms' biases, use_qkv_bias, and partial_rotary_factor the share of
    each head that turns; StableLM 2 12B's parallel blocks and LayerNorm on
    each query and key head when the model has them."""
    os.makedirs(directory, exist_ok=True)
    save_hf_llama(model, os.path.join(directory, "model.safetensors"))
    config = {"architectures": ["StableLmForCausalLM"], "model_type": "stablelm",
              "hidden_size": CFG["d_model"], "intermediate_size": SWIGLU_FFN,
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": LLAMA_KV_HEADS, "hidden_act": "silu",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "layer_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "rope_scaling": None,
              "partial_rotary_factor": rope_dim / model.D,
              "use_qkv_bias": model.h[0].attn.c_attn.bias is not None,
              "qk_layernorm": model.qk_norm == "head_layernorm",
              "use_parallel_residual": model.parallel, "hidden_dropout": 0.0,
              "attention_dropout": 0.0, "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_phi(model, directory, rope_dim):
    """A Phi-2-style model as a PhiForCausalLM directory, as Phi-2's files
    are written: q_proj, k_proj and v_proj with their biases, dense, fc1 and
    fc2, one input_layernorm a block, final_layernorm, lm_head with its bias;
    partial_rotary_factor the share of each head that turns."""
    os.makedirs(directory, exist_ok=True)
    Q, KV = model.c["n_head"] * model.D, model.kv_heads * model.D
    t = {"model.embed_tokens.weight": model.wte.weight,
         "model.final_layernorm.weight": model.ln_f.weight,
         "model.final_layernorm.bias": model.ln_f.bias,
         "lm_head.weight": model.lm_head.weight, "lm_head.bias": model.lm_head.bias}
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            q, k, v = getattr(b.attn.c_attn, kind).split([Q, KV, KV], 0)
            t.update({p + "self_attn.q_proj." + kind: q, p + "self_attn.k_proj." + kind: k,
                      p + "self_attn.v_proj." + kind: v,
                      p + "self_attn.dense." + kind: getattr(b.attn.c_proj, kind),
                      p + "mlp.fc1." + kind: getattr(b.mlp.c_fc, kind),
                      p + "mlp.fc2." + kind: getattr(b.mlp.c_proj, kind),
                      p + "input_layernorm." + kind: getattr(b.ln_1, kind)})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["PhiForCausalLM"], "model_type": "phi",
              "hidden_size": CFG["d_model"], "intermediate_size": 4 * CFG["d_model"],
              "num_hidden_layers": CFG["n_layer"], "num_attention_heads": CFG["n_head"],
              "num_key_value_heads": model.kv_heads, "hidden_act": "gelu_new",
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "layer_norm_eps": 1e-5, "rope_theta": ROPE_THETA, "rope_scaling": None,
              "partial_rotary_factor": rope_dim / model.D, "qk_layernorm": False,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
              "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_falcon(model, directory, new_architecture):
    """A Falcon-style model as a FalconForCausalLM directory, as Falcon's
    files are written: query_key_value's rows grouped by key/value head (each
    group's query heads, then its key and its value), self_attention.dense,
    mlp.dense_h_to_4h and dense_4h_to_h; the norms input_layernorm (one for
    both sublayers, Falcon 7B's) or ln_attn and ln_mlp (the new decoder
    architecture's two); no lm_head when tied."""
    os.makedirs(directory, exist_ok=True)
    C, NH, KV, D = CFG["d_model"], CFG["n_head"], model.kv_heads, model.D
    t = {"transformer.word_embeddings.weight": model.wte.weight,
         "transformer.ln_f.weight": model.ln_f.weight, "transformer.ln_f.bias": model.ln_f.bias}
    if hasattr(model, "lm_head"):
        t["lm_head.weight"] = model.lm_head.weight
    for i, b in enumerate(model.h):
        p = f"transformer.h.{i}."
        for kind in ("weight", "bias"):
            v = getattr(b.attn.c_attn, kind)
            if v is None:
                continue
            q, k, val = v.split([NH * D, KV * D, KV * D], 0)
            rest = v.shape[1:]
            groups = torch.cat([q.reshape(KV, NH // KV, D, *rest), k.reshape(KV, 1, D, *rest),
                                val.reshape(KV, 1, D, *rest)], dim=1)
            t[p + "self_attention.query_key_value." + kind] = groups.reshape(v.shape)
            for ours, theirs in ((b.attn.c_proj, "self_attention.dense"),
                                 (b.mlp.c_fc, "mlp.dense_h_to_4h"),
                                 (b.mlp.c_proj, "mlp.dense_4h_to_h")):
                t[p + theirs + "." + kind] = getattr(ours, kind)
        norms = (("ln_1", "input_layernorm"),) if model.shared_norm else \
            (("ln_1", "ln_attn"), ("ln_2", "ln_mlp"))
        for ours, theirs in norms:
            for kind in ("weight", "bias"):
                t[p + theirs + "." + kind] = getattr(getattr(b, ours), kind)
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["FalconForCausalLM"], "model_type": "falcon",
              "hidden_size": C, "num_hidden_layers": CFG["n_layer"], "num_attention_heads": NH,
              "multi_query": KV == 1, "new_decoder_architecture": new_architecture,
              "parallel_attn": True, "bias": b.attn.c_proj.bias is not None, "alibi": False,
              "vocab_size": CFG["vocab_size"], "max_position_embeddings": CFG["seq_len"],
              "layer_norm_epsilon": 1e-5, "rope_theta": ROPE_THETA,
              "hidden_dropout": 0.0, "attention_dropout": 0.0,
              "tie_word_embeddings": not hasattr(model, "lm_head")}
    if new_architecture:
        config["num_kv_heads"] = KV
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_gptj(model, directory, rope_dim):
    """A GPT-J-style model as a GPTJForCausalLM directory, as GPT-J's files
    are written: q_proj, k_proj and v_proj without biases (their rotated
    dimensions in the interleaved pairs the model turns), out_proj, fc_in
    and fc_out with theirs, one ln_1 a block, lm_head with its bias; and the
    old files' attention-mask buffers."""
    os.makedirs(directory, exist_ok=True)
    C, T = CFG["d_model"], CFG["seq_len"]
    t = {"transformer.wte.weight": model.wte.weight, "transformer.ln_f.weight": model.ln_f.weight,
         "transformer.ln_f.bias": model.ln_f.bias, "lm_head.weight": model.lm_head.weight,
         "lm_head.bias": model.lm_head.bias}
    for i, b in enumerate(model.h):
        p = f"transformer.h.{i}."
        q, k, v = b.attn.c_attn.weight.split([C, C, C], 0)
        t.update({p + "attn.q_proj.weight": q, p + "attn.k_proj.weight": k,
                  p + "attn.v_proj.weight": v, p + "attn.out_proj.weight": b.attn.c_proj.weight,
                  p + "attn.bias": torch.tril(torch.ones(T, T)).view(1, 1, T, T),
                  p + "attn.masked_bias": torch.tensor(-1e9)})
        for kind in ("weight", "bias"):
            t.update({p + "ln_1." + kind: getattr(b.ln_1, kind),
                      p + "mlp.fc_in." + kind: getattr(b.mlp.c_fc, kind),
                      p + "mlp.fc_out." + kind: getattr(b.mlp.c_proj, kind)})
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    config = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": C,
              "n_layer": CFG["n_layer"], "n_head": CFG["n_head"], "n_positions": T,
              "n_inner": None, "rotary_dim": rope_dim, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
              "attn_pdrop": 0.0, "vocab_size": CFG["vocab_size"], "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def save_hf_codegen(model, directory, rope_dim):
    """The GPT-J-style model as a CodeGenForCausalLM directory: GPT-J's
    names with q, k and v fused in qkv_proj's 4 shards, each holding its
    heads' q rows, then their v rows, then their k rows."""
    os.makedirs(directory, exist_ok=True)
    save_hf_gptj(model, directory, rope_dim)
    t = {}
    with open(os.path.join(directory, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name, h in header.items():
        a, b = h["data_offsets"]
        t[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(h["shape"])
    C, S = CFG["d_model"], 4
    for i in range(CFG["n_layer"]):
        p = f"transformer.h.{i}.attn."
        q, k, v = (t.pop(p + x + "_proj.weight").reshape(S, C // S, C) for x in "qkv")
        t[p + "qkv_proj.weight"] = torch.cat([q, v, k], dim=1).reshape(3 * C, C)
        t[p + "causal_mask"] = t.pop(p + "bias")
    save_safetensors(os.path.join(directory, "model.safetensors"), t)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    config.update({"architectures": ["CodeGenForCausalLM"], "model_type": "codegen",
                   "n_ctx": CFG["seq_len"]})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def greedy_continuation(model, embedding_growth=8.0):
    """Greedy continuation of GREEDY_PROMPT, past seq_len (the window slides
    over the last seq_len tokens), by the model with its weights made 8x
    larger (small random weights predict one token forever) and its token
    embedding `embedding_growth` times (Gemma 3's, times sqrt(d_model) and
    read back by the tied head past post-normed blocks, grown 8x make the
    model repeat its last token)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" not in name:
                p.mul_(embedding_growth if name == "wte.weight" else 8.0)
    seq = list(GREEDY_PROMPT)
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            window = torch.tensor([seq[-CFG["seq_len"]:]])
            seq.append(int(model(window)[0, -1].argmax()))
    greedy = seq[len(GREEDY_PROMPT):]
    assert len(set(greedy)) >= 4, f"the greedy reference is too uniform: {greedy}"
    return greedy


# (context, continuation) lengths of the scored requests: the last two do
# not fit the window (seq_len + 1 = 17 tokens) and lose context tokens.
SCORED_REQUESTS = [(1, 1), (4, 6), (9, 3), (1, 16), (20, 5), (30, 12)]


def continuation_scores(model, prefix, ref):
    """Each request's -sum log p of its continuation after its context, the
    model reading the last seq_len + 1 tokens less the final one (Triad's
    evaluator's rule), for random requests SCORED_REQUESTS shapes; under
    prefix: the tokens, each request's lengths, and the scores."""
    g = torch.Generator().manual_seed(11)
    T, V = CFG["seq_len"], CFG["vocab_size"]
    tokens, nll = [], []
    with torch.no_grad():
        for c, n in SCORED_REQUESTS:
            seq = torch.randint(0, V, (c + n,), generator=g)
            tokens.append(seq)
            full = seq[-(T + 1):]
            logp = F.log_softmax(model(full[None, :-1])[0].double(), dim=-1)
            nll.append(-logp[-n:].gather(1, full[-n:, None]).sum().item())
    ref[prefix + "scored_tokens"] = torch.cat(tokens).float()
    ref[prefix + "scored_lengths"] = torch.tensor(SCORED_REQUESTS, dtype=torch.float32)
    ref[prefix + "scored_nll"] = torch.tensor(nll, dtype=torch.float64)


def record_step_zero(model, x, y, prefix, ref):
    """The logits, loss and every gradient of one micro-batch, under prefix
    (a mixture's gradients those of the loss plus coef times its layers'
    balance losses, which are recorded too; with multi-token prediction
    those of the loss plus weight / depths times the depths' losses, also
    recorded)."""
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, CFG["vocab_size"]), y.reshape(-1))
    objective = loss
    if model.moe is not None:
        objective = loss + model.moe["coef"] * sum(model.aux) + \
            model.moe.get("z", 0.0) * sum(model.zl)
        ref[prefix + "balance"] = torch.stack([a.detach() for a in model.aux])
        ref[prefix + "z_loss"] = torch.stack([z.detach() for z in model.zl])
    if model.mtp_cfg is not None:  # the objective gains weight / depths times their sum
        depths = model.mtp_losses(x, y)
        objective = objective + model.mtp_cfg["weight"] / len(depths) * sum(depths)
        ref[prefix + "mtp_losses"] = torch.stack([d.detach() for d in depths])
    objective.backward()
    ref[prefix + "logits"], ref[prefix + "loss"] = logits, loss.reshape(1)
    for n, p in model.named_parameters():  # (an expert no token chose: zeros, as Triad's)
        ref[prefix + "grad." + n] = gpt2_layout(n, p.grad if p.grad is not None
                                                else torch.zeros_like(p))


def record_family(model, name, save, out, x, y, ref):
    """`model` under `name`: its Hugging Face directory out/name_hf (`save`),
    step 0 recorded under name., then a greedy continuation
    (name.greedy_tokens) by the weights it leaves, saved as
    out/name_generator."""
    save(model, os.path.join(out, name + "_hf"))
    record_step_zero(model, x, y, name + ".", ref)
    ref[name + ".greedy_tokens"] = torch.tensor(greedy_continuation(model), dtype=torch.float32)
    save(model, os.path.join(out, name + "_generator"))


def newton_schulz(g, steps=5):
    """Muon's quintic Newton-Schulz iteration, on the wide orientation."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = g.size(0) > g.size(1)
    x = g.T if tall else g
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * (s @ s)) @ x
    return x.T if tall else x


def train_muon(model, seqs, momentum=0.95):
    """TRAIN's run with Muon on the blocks' matrices (Nesterov momentum, each
    of c_attn's q, k and v and of SwiGLU's c_fc's gate and value halves
    orthogonalised apart, update scaled by 0.2 sqrt(max(rows, cols)) to
    AdamW's RMS, decoupled decay) and AdamW on the rest. Returns the losses
    and gradient norms."""
    C = CFG["d_model"]
    hidden = [(n, p) for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2]
    rest = [(n, p) for n, p in model.named_parameters() if not (n.startswith("h.") and p.dim() == 2)]
    adam = torch.optim.AdamW([{"params": [p for n, p in rest if p.dim() >= 2],
                               "weight_decay": TRAIN["weight_decay"]},
                              {"params": [p for n, p in rest if p.dim() < 2], "weight_decay": 0.0}],
                             lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]),
                             eps=TRAIN["eps"], foreach=False)
    bufs = {n: torch.zeros_like(p) for n, p in hidden}

    def blocks(name, rows):
        if name.endswith("attn.c_attn.weight"):
            return [C, (rows - C) // 2, (rows - C) // 2]
        if name.endswith("c_fc.weight"):
            return [rows // 2, rows // 2]
        return [rows]

    G, b, V = TRAIN["global_batch_size"], TRAIN["micro_batch_size"], CFG["vocab_size"]
    losses, norms = [], []
    for step in range(TRAIN["steps"]):
        total = 0.0
        for m in range(G // b):
            x, y = seqs(step, m * b, b)
            l = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
            (l / (G // b)).backward()
            total += l.item() / (G // b)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["grad_clip"])
        lr = lr_at(step)
        for group in adam.param_groups:
            group["lr"] = lr
        adam.step()
        with torch.no_grad():
            for n, p in hidden:
                g = p.grad
                bufs[n].mul_(momentum).add_(g)
                u = g + momentum * bufs[n]
                parts = [newton_schulz(part) * 0.2 * math.sqrt(max(part.shape))
                         for part in u.split(blocks(n, u.size(0)), 0)]
                p.mul_(1 - lr * TRAIN["weight_decay"])
                p.add_(torch.cat(parts, 0), alpha=-lr)
        model.zero_grad(set_to_none=True)
        losses.append(total)
        norms.append(float(norm))
    return losses, norms


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Gpt(CFG)
    save_model(model, os.path.join(out, "model.safetensors"))

    # The greedy continuation, by the generator (written with its grown weights).
    gen = Gpt(CFG)
    greedy = greedy_continuation(gen)
    save_model(gen, os.path.join(out, "generator.safetensors"))

    G, b, T, V = TRAIN["global_batch_size"], TRAIN["micro_batch_size"], CFG["seq_len"], CFG["vocab_size"]
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, V, (TRAIN["steps"] * G * T + 1,), generator=g)
    with open(os.path.join(out, "train.bin"), "wb") as f:
        header = [20240520, 1, tokens.numel()] + [0] * 253
        f.write(struct.pack("<256i", *header))
        f.write(tokens.to(torch.int16).numpy().astype("uint16").tobytes())

    def seqs(step, first, count):
        rows = [tokens[(step * G + first + j) * T:(step * G + first + j) * T + T + 1] for j in range(count)]
        s = torch.stack(rows)
        return s[:, :-1], s[:, 1:]

    # Step 0: logits, loss and gradients of the first micro-batch.
    x, y = seqs(0, 0, b)
    ref = {"input_ids": x.float(), "targets": y.float()}
    record_step_zero(model, x, y, "", ref)
    model.zero_grad(set_to_none=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"],
                            foreach=False)
    losses, norms, layer_norms = [], [], []
    accum = G // b
    for step in range(TRAIN["steps"]):
        total = 0.0
        for m in range(accum):
            x, y = seqs(step, m * b, b)
            l = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
            (l / accum).backward()
            total += l.item() / accum
        # log.grad_norms: layers: each block's parameters together, the rest
        # by their first name part; groups in the order of their names.
        squares = {}
        for n, p in model.named_parameters():
            parts = n.split(".")
            key = ".".join(parts[:2]) if parts[0] in ("h", "mtp") else parts[0]
            squares[key] = squares.get(key, 0.0) + float(p.grad.double().pow(2).sum())
        layer_names = sorted(squares)
        layer_norms.append([math.sqrt(squares[k]) for k in layer_names])
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["grad_clip"])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        norms.append(float(norm))
    assert max(norms) > TRAIN["grad_clip"], "clipping must trigger in the reference run"
    # The rotary variant: step-0 logits, loss and gradients on the same
    # micro-batch, and a greedy continuation; the SwiGLU variant's step 0.
    x, y = seqs(0, 0, b)
    rope = Gpt(CFG, ROPE_THETA)
    save_model(rope, os.path.join(out, "rope_model.safetensors"))
    record_step_zero(rope, x, y, "rope.", ref)
    ref["rope.greedy_tokens"] = torch.tensor(greedy_continuation(rope), dtype=torch.float32)
    save_model(rope, os.path.join(out, "rope_generator.safetensors"))
    swiglu = Gpt(CFG, swiglu_ffn=SWIGLU_FFN)
    save_model(swiglu, os.path.join(out, "swiglu_model.safetensors"))
    record_step_zero(swiglu, x, y, "swiglu.", ref)
    geglu = Gpt(CFG, swiglu_ffn=SWIGLU_FFN, geglu=True)
    save_model(geglu, os.path.join(out, "geglu_model.safetensors"))
    record_step_zero(geglu, x, y, "geglu.", ref)
    relu2 = Gpt(CFG, relu2=True)
    save_model(relu2, os.path.join(out, "relu2_model.safetensors"))
    record_step_zero(relu2, x, y, "relu2.", ref)
    llama = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                kv_heads=LLAMA_KV_HEADS)
    save_model(llama, os.path.join(out, "llama_model.safetensors"))
    save_hf_llama(llama, os.path.join(out, "llama_hf_model.safetensors"))
    # 10 steps of Muon (the blocks' matrices) and AdamW (the rest) from it.
    muon_losses, muon_norms = train_muon(copy.deepcopy(llama), seqs)
    ref["muon.losses"] = torch.tensor(muon_losses, dtype=torch.float64)
    ref["muon.grad_norms"] = torch.tensor(muon_norms, dtype=torch.float64)
    record_step_zero(llama, x, y, "llama.", ref)
    # Multi-token prediction on the LLaMA-style model and on GPT-2's: the
    # loss (the next token's), each depth's and the gradients of the whole
    # objective.
    for name, mtp, kwargs in (
            ("mtp_llama", MTP_LLAMA, dict(rope_theta=ROPE_THETA, swiglu_ffn=SWIGLU_FFN,
                                          rms_norm=True, bias=False, tie=False,
                                          kv_heads=LLAMA_KV_HEADS)),
            ("mtp_gpt2", MTP_GPT2, {})):
        predicting = Gpt(CFG, mtp=mtp, **kwargs)
        save_model(predicting, os.path.join(out, name + "_model.safetensors"))
        record_step_zero(predicting, x, y, name + ".", ref)
    # LLaMA 3.1's: the LLaMA-style model with RoPE scaling, step 0.
    llama31 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                  kv_heads=LLAMA_KV_HEADS, rope_scaling=LLAMA3_SCALING)
    save_model(llama31, os.path.join(out, "llama31_model.safetensors"))
    record_step_zero(llama31, x, y, "llama31.", ref)
    # Mistral's: the LLaMA-style model with a sliding window, step 0 and a
    # greedy continuation (key/value-cache steps past the window, then
    # windows of seq_len tokens).
    mistral = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                  kv_heads=LLAMA_KV_HEADS, window=MISTRAL_WINDOW)
    save_model(mistral, os.path.join(out, "mistral_model.safetensors"))
    record_step_zero(mistral, x, y, "mistral.", ref)
    ref["mistral.greedy_tokens"] = torch.tensor(greedy_continuation(mistral), dtype=torch.float32)
    save_model(mistral, os.path.join(out, "mistral_generator.safetensors"))
    continuation_scores(mistral, "mistral.", ref)
    # The same window on layer 1 only (layer 0 sees every earlier key): local
    # and global attention interleaved, step 0 and a greedy continuation.
    mixed = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                kv_heads=LLAMA_KV_HEADS, window=MISTRAL_WINDOW, full_layers=(0,))
    save_model(mixed, os.path.join(out, "mixed_window_model.safetensors"))
    record_step_zero(mixed, x, y, "mixed_window.", ref)
    ref["mixed_window.greedy_tokens"] = torch.tensor(greedy_continuation(mixed),
                                                     dtype=torch.float32)
    save_model(mixed, os.path.join(out, "mixed_window_generator.safetensors"))
    # Qwen2's: the LLaMA-style model with biases on q, k and v only and a
    # tied head, step 0, from Hugging Face's Qwen2ForCausalLM layout.
    qwen2 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                kv_heads=LLAMA_KV_HEADS, qkv_bias=True)
    save_hf_llama(qwen2, os.path.join(out, "qwen2_hf_model.safetensors"))
    record_step_zero(qwen2, x, y, "qwen2.", ref)
    # Qwen2.5's long context: the Qwen2-style model with YaRN, step 0.
    yarn = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
               kv_heads=LLAMA_KV_HEADS, qkv_bias=True, rope_scaling=YARN_SCALING)
    save_model(yarn, os.path.join(out, "yarn_model.safetensors"))
    record_step_zero(yarn, x, y, "yarn.", ref)
    # Phi-3's long context: the LLaMA-style model with longrope, its long
    # factors and then its short ones, step 0; Phi-4-mini's: half of each
    # head turned (PARTIAL_ROPE_DIM), with longrope's factors for its pairs.
    for key, scaling, rope_dim in (("longrope", LONGROPE_SCALING, None),
                                   ("longrope_short", LONGROPE_SHORT_SCALING, None),
                                   ("partial", PARTIAL_LONGROPE_SCALING, PARTIAL_ROPE_DIM)):
        phi = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                  kv_heads=LLAMA_KV_HEADS, rope_scaling=scaling, rope_dim=rope_dim)
        save_model(phi, os.path.join(out, key + "_model.safetensors"))
        record_step_zero(phi, x, y, key + ".", ref)
        if rope_dim is not None:  # also as Phi-4-mini's own files are written
            save_hf_phi3(phi, os.path.join(out, "phi4_hf"), scaling, rope_dim)
    # Qwen3's: the LLaMA-style model with RMSNorm over each query and key
    # head, heads of their own width and a tied head, step 0, from Hugging
    # Face's Qwen3ForCausalLM layout.
    qwen3 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                kv_heads=LLAMA_KV_HEADS, head_dim=QWEN3_HEAD_DIM, qk_norm=True)
    save_hf_llama(qwen3, os.path.join(out, "qwen3_hf_model.safetensors"))
    record_step_zero(qwen3, x, y, "qwen3.", ref)
    # Gemma's: the LLaMA-style model with GeGLU, token embeddings times
    # sqrt(d_model), norms scaling by 1 + weight, one key/value head and a
    # tied head, step 0, from Hugging Face's GemmaForCausalLM layout (the
    # same names as LLaMA's).
    gemma = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True, kv_heads=1,
                geglu=True, embed_scale=math.sqrt(CFG["d_model"]), norm_offset=True)
    save_hf_llama(gemma, os.path.join(out, "gemma_hf_model.safetensors"))
    record_step_zero(gemma, x, y, "gemma.", ref)

    # Gemma 3's: Gemma's blocks with each sublayer's output normalised again,
    # query/key norms scaling by 1 + weight, heads of their own width, the
    # window on every second layer, whose RoPE base is its own and
    # unscaled while the global layer's is scaled (linear), scores over
    # sqrt(query_pre_attn_scalar) rather than sqrt(head_dim); step 0 and a
    # greedy continuation, from a Gemma3ForCausalLM directory (config.json
    # and weights).
    gemma3 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                 kv_heads=LLAMA_KV_HEADS, head_dim=QWEN3_HEAD_DIM, qk_norm=True, geglu=True,
                 embed_scale=math.sqrt(CFG["d_model"]), norm_offset=True, post_norms=True,
                 window=MISTRAL_WINDOW, full_layers=(1,), rope_local_theta=GEMMA3_LOCAL_THETA,
                 rope_scaling=GEMMA3_SCALING, attn_scalar=GEMMA3_ATTN_SCALAR)
    save_hf_gemma(gemma3, os.path.join(out, "gemma3_hf"), "Gemma3ForCausalLM", "gemma3_text",
                  head_dim=QWEN3_HEAD_DIM, rope_local_base_freq=GEMMA3_LOCAL_THETA,
                  rope_scaling=GEMMA3_SCALING, sliding_window_pattern=2,
                  query_pre_attn_scalar=GEMMA3_ATTN_SCALAR, attn_logit_softcapping=None,
                  final_logit_softcapping=None)
    record_step_zero(gemma3, x, y, "gemma3.", ref)
    ref["gemma3.greedy_tokens"] = torch.tensor(greedy_continuation(gemma3, embedding_growth=2.0),
                                              dtype=torch.float32)
    save_hf_llama(gemma3, os.path.join(out, "gemma3_generator.safetensors"))

    # Gemma 2's: Gemma's blocks with post-norms, the window on every second
    # layer, and soft caps on the attention's scores and the head's logits;
    # step 0, from a Gemma2ForCausalLM directory (config.json and weights).
    gemma2 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                 kv_heads=LLAMA_KV_HEADS, geglu=True, embed_scale=math.sqrt(CFG["d_model"]),
                 norm_offset=True, post_norms=True, window=MISTRAL_WINDOW, full_layers=(1,),
                 attn_softcap=GEMMA2_ATTN_SOFTCAP, final_softcap=GEMMA2_FINAL_SOFTCAP)
    save_hf_gemma(gemma2, os.path.join(out, "gemma2_hf"), "Gemma2ForCausalLM", "gemma2",
                  head_dim=CFG["d_model"] // CFG["n_head"],
                  query_pre_attn_scalar=CFG["d_model"] // CFG["n_head"],
                  attn_logit_softcapping=GEMMA2_ATTN_SOFTCAP,
                  final_logit_softcapping=GEMMA2_FINAL_SOFTCAP)
    record_step_zero(gemma2, x, y, "gemma2.", ref)

    # GPT-NeoX's (Pythia's): the parallel residual, the exact GELU, half of
    # each head turned, LayerNorms and biases, an untied head; step 0 and a
    # greedy continuation, from a GPTNeoXForCausalLM directory.
    neox = Gpt(CFG, ROPE_THETA, tie=False, rope_dim=NEOX_ROPE_DIM, parallel=True,
               gelu_exact=True)
    save_hf_neox(neox, os.path.join(out, "neox_hf"), NEOX_ROPE_DIM)
    record_step_zero(neox, x, y, "neox.", ref)
    ref["neox.greedy_tokens"] = torch.tensor(greedy_continuation(neox), dtype=torch.float32)
    save_model(neox, os.path.join(out, "neox_generator.safetensors"))

    # StableLM 2's: LLaMA's blocks with LayerNorms (scale and shift), q, k
    # and v biases and half of each head turned; step 0, from a
    # StableLmForCausalLM directory.
    stablelm = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, bias=False, tie=False, kv_heads=LLAMA_KV_HEADS,
                   qkv_bias=True, rope_dim=NEOX_ROPE_DIM)
    save_hf_stablelm(stablelm, os.path.join(out, "stablelm_hf"), NEOX_ROPE_DIM)
    record_step_zero(stablelm, x, y, "stablelm.", ref)
    # StableLM 2 12B's: the parallel blocks on one LayerNorm, and a
    # LayerNorm without a bias on each query and key head, each head's
    # weights its own (qk_layernorm); step 0 and a greedy continuation,
    # from a StableLmForCausalLM directory.
    stablelm12 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, bias=False, tie=False, kv_heads=LLAMA_KV_HEADS,
                     rope_dim=NEOX_ROPE_DIM, parallel=True, shared_norm=True,
                     qk_norm="head_layernorm")
    record_family(stablelm12, "stablelm12",
                  lambda m, d: save_hf_stablelm(m, d, NEOX_ROPE_DIM), out, x, y, ref)

    # Phi-2's: the parallel residual with one norm for both sublayers, a
    # biased untied head, half of each head turned, grouped key/value heads;
    # step 0 and a greedy continuation, from a PhiForCausalLM directory.
    phi2 = Gpt(CFG, ROPE_THETA, tie=False, kv_heads=LLAMA_KV_HEADS, rope_dim=NEOX_ROPE_DIM,
               parallel=True, shared_norm=True, head_bias=True)
    save_hf_phi(phi2, os.path.join(out, "phi_hf"), NEOX_ROPE_DIM)
    record_step_zero(phi2, x, y, "phi.", ref)
    ref["phi.greedy_tokens"] = torch.tensor(greedy_continuation(phi2), dtype=torch.float32)
    save_model(phi2, os.path.join(out, "phi_generator.safetensors"))

    # Falcon 7B's: multi-query attention, the parallel residual with one
    # norm, the exact GELU, no linear biases, a tied head; and Falcon 40B's
    # new decoder architecture: two norms (ln_attn, ln_mlp), grouped
    # key/value heads (here with biases and an untied head). Step 0 of each,
    # a greedy continuation of the first, from FalconForCausalLM directories.
    falcon7 = Gpt(CFG, ROPE_THETA, bias=False, kv_heads=1, parallel=True, shared_norm=True,
                  gelu_exact=True)
    save_hf_falcon(falcon7, os.path.join(out, "falcon7_hf"), new_architecture=False)
    record_step_zero(falcon7, x, y, "falcon7.", ref)
    ref["falcon7.greedy_tokens"] = torch.tensor(greedy_continuation(falcon7), dtype=torch.float32)
    save_model(falcon7, os.path.join(out, "falcon7_generator.safetensors"))
    # GPT-J's: q and k turned in interleaved pairs on half of each head (at
    # its fixed base of 10000), the parallel residual with one norm, biases
    # on the MLP alone, a biased untied head; step 0 and a greedy
    # continuation, from a GPTJForCausalLM directory.
    gptj = Gpt(CFG, 10000.0, bias=False, mlp_bias=True, tie=False, rope_dim=NEOX_ROPE_DIM,
               parallel=True, shared_norm=True, head_bias=True, interleaved_rope=True)
    save_hf_gptj(gptj, os.path.join(out, "gptj_hf"), NEOX_ROPE_DIM)
    save_hf_codegen(gptj, os.path.join(out, "codegen_hf"), NEOX_ROPE_DIM)
    record_step_zero(gptj, x, y, "gptj.", ref)
    ref["gptj.greedy_tokens"] = torch.tensor(greedy_continuation(gptj), dtype=torch.float32)

    falcon40 = Gpt(CFG, ROPE_THETA, tie=False, kv_heads=LLAMA_KV_HEADS, parallel=True,
                   gelu_exact=True)
    save_hf_falcon(falcon40, os.path.join(out, "falcon40_hf"), new_architecture=True)
    record_step_zero(falcon40, x, y, "falcon40.", ref)

    # Mixtral's: Mistral's blocks (LLaMA's with a window) whose MLPs are 4
    # experts of width MOE_FFN, each token taking the top 2 renormalised,
    # with the load-balancing loss in the gradients; step 0 and a greedy
    # continuation, from a MixtralForCausalLM directory.
    mixtral_moe = dict(experts=4, top_k=2, ffn=MOE_FFN, normalize=True, coef=MOE_AUX_COEF)
    mixtral = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                  kv_heads=LLAMA_KV_HEADS, window=MISTRAL_WINDOW, moe=mixtral_moe)
    record_family(mixtral, "mixtral", save_hf_mixtral, out, x, y, ref)
    # Qwen3-MoE's: Qwen3's blocks, a dense first layer (mlp_only_layers) and
    # then 5 experts of which each token takes 3, not renormalised
    # (norm_topk_prob false), no load-balancing loss (router_aux_loss_coef
    # 0); step 0, from a
    # Qwen3MoeForCausalLM directory.
    qwen3_moe = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                    kv_heads=LLAMA_KV_HEADS, head_dim=QWEN3_HEAD_DIM, qk_norm=True,
                    moe=dict(experts=5, top_k=3, ffn=MOE_FFN, normalize=False, coef=0.0,
                             dense=(0,)))
    save_hf_qwen_moe(qwen3_moe, os.path.join(out, "qwen3_moe_hf"), "qwen3_moe")
    record_step_zero(qwen3_moe, x, y, "qwen3_moe.", ref)
    # Qwen2-MoE's: Qwen2's blocks (q, k and v biases), 4 experts of which
    # each token takes 2, not renormalised, and a shared expert of width
    # MOE_SHARED_FFN every token takes, weighted by its sigmoid gate; the
    # load-balancing loss in the gradients; step 0, from a
    # Qwen2MoeForCausalLM directory.
    qwen2_moe = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                    kv_heads=LLAMA_KV_HEADS, qkv_bias=True,
                    moe=dict(experts=4, top_k=2, ffn=MOE_FFN, normalize=False, coef=0.05,
                             shared=MOE_SHARED_FFN))
    save_hf_qwen_moe(qwen2_moe, os.path.join(out, "qwen2_moe_hf"), "qwen2_moe")
    record_step_zero(qwen2_moe, x, y, "qwen2_moe.", ref)
    # GLM-4.5's: LLaMA's blocks with q, k and v biases, Qwen3's query/key
    # norms on heads of their own width, half of each head turned in halves;
    # a dense first layer, then 8 experts in 4 groups scored by sigmoids,
    # each token's top 2 chosen with the expert biases among its best 2
    # groups, renormalised and scaled by 2.5, and an ungated shared expert
    # of two experts' width; step 0 and a greedy continuation, from a
    # Glm4MoeForCausalLM directory holding a prediction layer besides.
    glm4_moe = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                   kv_heads=LLAMA_KV_HEADS, qkv_bias=True, head_dim=QWEN3_HEAD_DIM, qk_norm=True,
                   rope_dim=QWEN3_HEAD_DIM // 2,
                   moe=dict(experts=8, top_k=2, ffn=MOE_FFN, normalize=True, coef=0.0,
                            dense=(0,), sigmoid=True, scale=2.5, groups=4, top_groups=2,
                            shared=2 * MOE_FFN, shared_gate=False))
    record_family(glm4_moe, "glm4_moe", save_hf_glm4_moe, out, x, y, ref)
    # The same with a prediction module of its own, trained (multi-token
    # prediction), read from and written to its Glm4MoeForCausalLM
    # directory: step 0 of the whole objective.
    glm4_moe_mtp = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                       kv_heads=LLAMA_KV_HEADS, qkv_bias=True, head_dim=QWEN3_HEAD_DIM,
                       qk_norm=True, rope_dim=QWEN3_HEAD_DIM // 2,
                       moe=dict(experts=8, top_k=2, ffn=MOE_FFN, normalize=True, coef=0.0,
                                dense=(0,), sigmoid=True, scale=2.5, groups=4, top_groups=2,
                                shared=2 * MOE_FFN, shared_gate=False),
                       mtp=MTP_GLM4)
    save_hf_glm4_moe_mtp(glm4_moe_mtp, os.path.join(out, "glm4_moe_mtp_hf"))
    record_step_zero(glm4_moe_mtp, x, y, "glm4_moe_mtp.", ref)
    # dots.llm1's: Qwen3's blocks with DeepSeek-V3's mixture: 6 experts in
    # one group (no limit), each token's top 3 chosen with the biases, not
    # renormalised, scaled by 1.5, and a shared expert one expert wide;
    # step 0 and a greedy continuation, from a Dots1ForCausalLM directory.
    dots1 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                kv_heads=LLAMA_KV_HEADS, head_dim=QWEN3_HEAD_DIM, qk_norm=True,
                moe=dict(experts=6, top_k=3, ffn=MOE_FFN, normalize=False, coef=0.0,
                         dense=(0,), sigmoid=True, scale=1.5, groups=1, top_groups=1,
                         shared=MOE_FFN, shared_gate=False))
    record_family(dots1, "dots1", save_hf_dots1, out, x, y, ref)

    # MiniMax-M2's: LLaMA's blocks with one RMSNorm over all the queries
    # and one over all the keys, heads of their own width, half of each
    # turned in halves; 6 experts on every layer scored by sigmoids, each
    # token's top 2 chosen with the expert biases, renormalised, unscaled,
    # no shared expert; step 0 and a greedy continuation, from a
    # MiniMaxM2ForCausalLM directory holding a prediction module besides.
    minimax_m2 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                     kv_heads=LLAMA_KV_HEADS, head_dim=QWEN3_HEAD_DIM, qk_norm="full",
                     rope_dim=QWEN3_HEAD_DIM // 2,
                     moe=dict(experts=6, top_k=2, ffn=MOE_FFN, normalize=True, coef=0.0,
                              sigmoid=True, scale=1.0, groups=1, top_groups=1))
    record_family(minimax_m2, "minimax_m2", save_hf_minimax_m2, out, x, y, ref)

    # DeepSeek-V3's: LLaMA's blocks with multi-head latent attention (4
    # heads whose queries and keys are 6 + 4 wide, 4 turned in interleaved
    # pairs, values 8 wide, through latents of 10 and 12; yarn with
    # DeepSeek's two mscales, the scores scaled by the second) and
    # DeepSeek-V3's mixture (a dense first layer, 8 experts in 4 groups,
    # the top 2 among the best 2 groups, renormalised, scaled by 2.5, one
    # shared expert); step 0 and a greedy continuation, from a
    # DeepseekV3ForCausalLM directory holding a prediction layer besides.
    deepseek_v3 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                      rope_scaling=DEEPSEEK_YARN,
                      mla=dict(kv_rank=12, q_rank=10, nope=6, rope=4, v=8),
                      moe=dict(experts=8, top_k=2, ffn=MOE_FFN, normalize=True, coef=0.0,
                               dense=(0,), sigmoid=True, scale=2.5, groups=4, top_groups=2,
                               shared=MOE_FFN, shared_gate=False))
    record_family(deepseek_v3, "deepseek_v3", save_hf_deepseek_v3, out, x, y, ref)
    # DeepSeek-V2-Lite's attention (queries straight from the input, wider
    # values than queries and keys: 4 + 4 against 12) under plain rope, and
    # DeepSeek-V2's routing: a softmax over 8 experts, each token's top 2
    # among its best 2 of 4 groups (a group scored by its best expert), not
    # renormalised but times 3, the balance loss at 0.05, and a shared
    # expert two experts wide; step 0 and a greedy continuation, from a
    # DeepseekV2ForCausalLM directory.
    deepseek_v2 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                      mla=dict(kv_rank=12, q_rank=0, nope=4, rope=4, v=12),
                      moe=dict(experts=8, top_k=2, ffn=MOE_FFN, normalize=False, coef=0.05,
                               dense=(0,), scale=3.0, groups=4, top_groups=2,
                               shared=2 * MOE_FFN, shared_gate=False))
    record_family(deepseek_v2, "deepseek_v2", save_hf_deepseek_v2, out, x, y, ref)

    # OLMo 2's: no norm before either sublayer, each sublayer's output
    # normalised, one RMSNorm over all the queries and one over all the keys
    # before the rotation, grouped key/value heads, an untied head; step 0
    # and a greedy continuation, from an Olmo2ForCausalLM directory.
    olmo2 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                kv_heads=LLAMA_KV_HEADS, qk_norm="full", post_norms=True, pre_norms=False)
    record_family(olmo2, "olmo2", save_hf_olmo2, out, x, y, ref)
    # OLMo 3's: OLMo 2's blocks with a window on layer 0, yarn turning the
    # global layer 1 alone (the windowed one turns unscaled at the same
    # base); step 0 and a greedy continuation past the window, from an
    # Olmo3ForCausalLM directory.
    olmo3 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                kv_heads=LLAMA_KV_HEADS, qk_norm="full", post_norms=True, pre_norms=False,
                window=MISTRAL_WINDOW, full_layers=(1,), rope_scaling=YARN_SCALING,
                rope_local_theta=ROPE_THETA)
    record_family(olmo3, "olmo3", save_hf_olmo2, out, x, y, ref)
    # EXAONE 4's: OLMo 2's sublayer norms with an RMSNorm over each query
    # and key head, a window on layer 0, the global layer 1 without rope;
    # step 0 and a greedy continuation past the window, from an
    # Exaone4ForCausalLM directory.
    exaone4 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                  kv_heads=LLAMA_KV_HEADS, qk_norm=True, post_norms=True, pre_norms=False,
                  window=MISTRAL_WINDOW, full_layers=(1,), nope_layers=(1,))
    record_family(exaone4, "exaone4", save_hf_olmo2, out, x, y, ref)
    # OLMo's (the first): LLaMA's blocks with LayerNorms that learn nothing
    # (no weight, no bias), q, k and v clamped (clip_qkv), grouped key/value
    # heads, an untied head; step 0 from an OlmoForCausalLM directory.
    olmo = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=False, bias=False, tie=False,
               kv_heads=LLAMA_KV_HEADS, norm_affine=False)
    # Its clip_qkv where it bites: the 70th percentile of the first layer's
    # |q|, |k| and |v| on this batch, so that some values of every layer are
    # clamped and their gradients stopped.
    with torch.no_grad():
        first = olmo.h[0].attn.c_attn(olmo.h[0].ln_1(olmo.wte(x))).abs().flatten()
        olmo.clip_qkv = float(f"{first.quantile(0.7).item():.3g}")
    save_hf_olmo(olmo, os.path.join(out, "olmo_hf"))
    record_step_zero(olmo, x, y, "olmo.", ref)
    # Granite's: LLaMA's blocks with its four multipliers (embeddings times
    # 3, each sublayer's output times 0.4, scores times 1/8 rather than
    # 1/sqrt(8), logits over 4), grouped key/value heads, a tied head; step 0
    # and a greedy continuation, from a GraniteForCausalLM directory.
    granite = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                  kv_heads=LLAMA_KV_HEADS,
                  granite=dict(embedding=3.0, residual=0.4, attention=0.125, logits=4.0))
    record_family(granite, "granite", save_hf_granite, out, x, y, ref)
    # GraniteMoeShared's: Granite's blocks and multipliers with 4 experts on
    # every layer of which each token takes 2, renormalised (the softmax of
    # the chosen logits), the load-balancing loss, and an ungated shared
    # expert; step 0, from a GraniteMoeSharedForCausalLM directory.
    granitemoe = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                     kv_heads=LLAMA_KV_HEADS,
                     moe=dict(experts=4, top_k=2, ffn=MOE_FFN, normalize=True, coef=MOE_AUX_COEF,
                              shared=MOE_SHARED_FFN, shared_gate=False),
                     granite=dict(embedding=3.0, residual=0.4, attention=0.125, logits=4.0))
    save_hf_granitemoe(granitemoe, os.path.join(out, "granitemoe_hf"))
    record_step_zero(granitemoe, x, y, "granitemoe.", ref)
    # StarCoder2's: the sequential block with rope on whole heads,
    # LayerNorms, biases on every linear layer, an ungated GELU (tanh) MLP
    # of 4C, grouped key/value heads, Mistral's window, an untied head; step
    # 0 and a greedy continuation (the window through the key/value cache),
    # from a Starcoder2ForCausalLM directory.
    starcoder2 = Gpt(CFG, ROPE_THETA, rms_norm=False, bias=True, tie=False,
                     kv_heads=LLAMA_KV_HEADS, window=MISTRAL_WINDOW)
    record_family(starcoder2, "starcoder2", save_hf_starcoder2, out, x, y, ref)
    # Nemotron-4's (Minitron's): the sequential block, LayerNorm1P (scale by
    # 1 + weight, and shift), a squared-ReLU MLP of 4C, heads of 12 over 2
    # key/value heads with half of each turned, no linear biases, an untied
    # head; step 0 and a greedy continuation, from a NemotronForCausalLM
    # directory.
    nemotron = Gpt(CFG, ROPE_THETA, bias=False, tie=False, kv_heads=LLAMA_KV_HEADS,
                   head_dim=QWEN3_HEAD_DIM, rope_dim=QWEN3_HEAD_DIM // 2, norm_offset=True,
                   relu2=True)
    record_family(nemotron, "nemotron", save_hf_nemotron, out, x, y, ref)
    # Arcee's (AFM-4.5B's): LLaMA's blocks (RMSNorm, rope on whole heads, 2
    # key/value heads, no biases, an untied head) with that ungated
    # squared-ReLU MLP of 4C; step 0 and a greedy continuation, from an
    # ArceeForCausalLM directory.
    arcee = Gpt(CFG, ROPE_THETA, rms_norm=True, bias=False, tie=False,
                kv_heads=LLAMA_KV_HEADS, relu2=True)
    record_family(arcee, "arcee", save_hf_arcee, out, x, y, ref)
    # Cohere's: LLaMA's attention and SwiGLU MLP in parallel on one
    # LayerNorm without a bias, q and k turned in interleaved pairs, grouped
    # key/value heads, a tied head, the logits times 0.25; step 0 and a
    # greedy continuation, from a CohereForCausalLM directory.
    cohere = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=False, bias=False, tie=True,
                 kv_heads=LLAMA_KV_HEADS, parallel=True, shared_norm=True,
                 interleaved_rope=True, norm_bias=False, logit_scale=0.25)
    record_family(cohere, "cohere", save_hf_cohere, out, x, y, ref)
    # Command R+'s: Cohere's blocks with a LayerNorm on each query and key
    # head, each head's weights its own (use_qk_norm), before the
    # interleaved rotation; step 0 and a greedy continuation, from a
    # CohereForCausalLM directory.
    plus = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=False, bias=False, tie=True,
               kv_heads=LLAMA_KV_HEADS, parallel=True, shared_norm=True,
               interleaved_rope=True, norm_bias=False, logit_scale=0.25,
               qk_norm="head_layernorm")
    record_family(plus, "command_r_plus", save_hf_cohere, out, x, y, ref)
    # GLM-4's: LLaMA's blocks with q, k and v biases, half of each head
    # turned in interleaved pairs, grouped key/value heads, an untied head
    # and each sublayer's output normalised again; step 0 and a greedy
    # continuation, from a Glm4ForCausalLM directory.
    glm4 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
               kv_heads=LLAMA_KV_HEADS, qkv_bias=True, rope_dim=NEOX_ROPE_DIM,
               interleaved_rope=True, post_norms=True)
    record_family(glm4, "glm4", save_hf_glm4, out, x, y, ref)
    # Helium's: LLaMA's blocks (grouped key/value heads, an untied head)
    # turning whole heads in interleaved pairs, with q, k and v biases;
    # step 0 and a greedy continuation, from a HeliumForCausalLM directory.
    helium = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                 kv_heads=LLAMA_KV_HEADS, qkv_bias=True, interleaved_rope=True)
    record_family(helium, "helium", save_hf_helium, out, x, y, ref)
    # Seed-OSS's: LLaMA's blocks (grouped key/value heads, an untied head)
    # with q, k and v biases on heads of their own width; step 0 and a
    # greedy continuation, from a SeedOssForCausalLM directory.
    seed_oss = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                   kv_heads=LLAMA_KV_HEADS, qkv_bias=True, head_dim=QWEN3_HEAD_DIM)
    record_family(seed_oss, "seed_oss", save_hf_seed_oss, out, x, y, ref)
    # Cohere 2's: Cohere's blocks with a window on every layer but the
    # global one (layer 1), which turns nothing; step 0 and a greedy
    # continuation, from a Cohere2ForCausalLM directory.
    cohere2 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=False, bias=False, tie=True,
                  kv_heads=LLAMA_KV_HEADS, parallel=True, shared_norm=True,
                  interleaved_rope=True, norm_bias=False, logit_scale=0.25,
                  window=MISTRAL_WINDOW, full_layers=(1,), nope_layers=(1,))
    record_family(cohere2, "cohere2", save_hf_cohere, out, x, y, ref)
    # SmolLM3's: LLaMA's blocks (grouped key/value heads, a tied head) with
    # the second layer turning nothing; step 0 and a greedy continuation,
    # from a SmolLM3ForCausalLM directory.
    smollm3 = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=True,
                  kv_heads=LLAMA_KV_HEADS, nope_layers=(1,))
    record_family(smollm3, "smollm3", save_hf_smollm3, out, x, y, ref)
    # OLMoE's: pre-norm blocks with those query/key norms and 4 experts on
    # every layer of which each token takes 2, not renormalised, with the
    # load-balancing loss and the router z-loss (OLMoE trained with both);
    # step 0, from an OlmoeForCausalLM directory.
    olmoe = Gpt(CFG, ROPE_THETA, SWIGLU_FFN, rms_norm=True, bias=False, tie=False,
                kv_heads=LLAMA_KV_HEADS, qk_norm="full",
                moe=dict(experts=4, top_k=2, ffn=MOE_FFN, normalize=False, coef=0.05,
                         z=MOE_Z_COEF))
    save_hf_olmoe(olmoe, os.path.join(out, "olmoe_hf"))
    record_step_zero(olmoe, x, y, "olmoe.", ref)

    save_torch_files(out, ref)

    ref["greedy_prompt"] = torch.tensor(GREEDY_PROMPT, dtype=torch.float32)
    ref["greedy_tokens"] = torch.tensor(greedy, dtype=torch.float32)
    continuation_scores(gen, "", ref)
    ref["losses"] = torch.tensor(losses, dtype=torch.float64)
    ref["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    ref["layer_grad_norms"] = torch.tensor(layer_norms, dtype=torch.float64)
    save_safetensors(os.path.join(out, "reference.safetensors"), ref)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model": CFG, "train": TRAIN, "rope_theta": ROPE_THETA, "swiglu_ffn": SWIGLU_FFN,
                   "layer_grad_norm_groups": layer_names,
                   "llama_kv_heads": LLAMA_KV_HEADS, "mistral_window": MISTRAL_WINDOW,
                   "mtp_llama": MTP_LLAMA, "mtp_gpt2": MTP_GPT2, "mtp_glm4": MTP_GLM4,
                   "llama3_scaling": LLAMA3_SCALING, "yarn_scaling": YARN_SCALING,
                   "longrope_scaling": LONGROPE_SCALING,
                   "longrope_short_scaling": LONGROPE_SHORT_SCALING,
                   "partial_scaling": PARTIAL_LONGROPE_SCALING, "partial_rope_dim": PARTIAL_ROPE_DIM,
                   "qwen3_head_dim": QWEN3_HEAD_DIM, "gemma3_local_theta": GEMMA3_LOCAL_THETA,
                   "gemma3_attn_scalar": GEMMA3_ATTN_SCALAR,
                   "gemma2_attn_softcap": GEMMA2_ATTN_SOFTCAP,
                   "gemma2_final_softcap": GEMMA2_FINAL_SOFTCAP,
                   "neox_rope_dim": NEOX_ROPE_DIM, "moe_ffn": MOE_FFN,
                   "moe_aux_coef": MOE_AUX_COEF,
                   "moe_shared_ffn": MOE_SHARED_FFN, "moe_z_coef": MOE_Z_COEF}, f)
    print("losses", " ".join(f"{v:.6f}" for v in losses))


if __name__ == "__main__":
    main()
