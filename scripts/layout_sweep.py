#!/usr/bin/env python3
"""Random layouts against one process: a differential search for bugs.

Each trial draws a small model with a random mix of features (position
embedding, activation, norms, biases, grouped-query and latent attention,
query/key norms, sliding windows, soft caps, multipliers, a mixture of
experts, multi-token prediction, the z-loss, LoRA, Muon, bf16, dropout,
packed documents, recomputation, the weights' average, a batch-size ramp) and a random
(tp, pp, dp, cp, ep) layout of at most --max-ranks ranks with its options
(sequence parallelism, schedule, virtual stages, stage balancing, ZeRO-1,
small buckets, context parallelism's exchange, the mesh's rank order; on
the simulator, --device sim, a captured step: train.cuda_graph, a mixture
under a capacity padded to it, a dropless one sized on the device; an
attention kernel by name). Both start from the same
weights; the layout's per-step losses and gradient norms must be one
process's (fp32: relative --tolerance; bf16: losses within 0.5% and norms
within 10%, as the CTest suites hold them). With --resume the layout
trains the first half and checkpoints, and a second layout (one process
included) resumes from there, resharding as it loads. With --export the
model is written out in Hugging Face's layout (triad-export) and the layout
runs it from there (model.hf_config and init.from, the architecture as
config.json says it): its first step's loss and its evaluations before and
after must be the model's. A layout the config
refuses is counted, with its message, as refused; any other failure, or
losses that part, is a finding.

Dropout (the model's and LoRA's) is drawn in every layout: each draws one
process's masks (docs/parallelism.md).

    scripts/layout_sweep.py --trials 20 --seed 1 [--resume | --export] [--work /tmp/sweep]
    scripts/layout_sweep.py --seed 1 --only 7 [the same mode]     # trial 7 again

The CTest suites check chosen combinations step by step
(tests/train/parallel_end_to_end.cmake); this looks between them.
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun_prefix():
    cmd = ["mpirun", "--oversubscribe", "-x", "OMP_NUM_THREADS=1"]
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--mca", "pml", "ob1"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


# model.moe's keys that train a mixture rather than shape it (no Hugging
# Face config holds them all), which --export passes beside config.json.
MOE_TRAINING_KEYS = ("capacity_factor", "drop_policy", "aux_loss_coef", "aux_loss_scope",
                     "z_loss_coef", "bias_update_rate")

# Hugging Face's families as Triad's keys (docs/models.md), for --export:
# random mixes seldom fit a class.
LLAMA = {"model.position_embedding": "rope", "model.rope_theta": 500,
         "model.normalization": "rmsnorm", "model.linear_bias": "false",
         "model.activation": "swiglu"}
# Latent attention's widths, with the query latent's (0: none).
MLA = ("{kv_lora_rank: 32, q_lora_rank: %d, qk_nope_head_dim: 16, qk_rope_head_dim: 8, "
       "v_head_dim: 16}")
FAMILIES = {
    "llama": dict(LLAMA),
    "mistral": dict(LLAMA, **{"model.sliding_window": 24}),
    "qwen2": dict(LLAMA, **{"model.qkv_bias": "true"}),
    "qwen3": dict(LLAMA, **{"model.qk_norm": "true"}),
    "olmo2": dict(LLAMA, **{"model.qk_norm": "full", "model.post_norms": "true",
                            "model.pre_norms": "false"}),
    "mixtral": dict(LLAMA, **{"model.moe": "{experts: 4, top_k: 2, ffn_hidden_size: 96}"}),
    "gemma": dict(LLAMA, **{"model.activation": "geglu", "model.norm_weight_offset": "true",
                            "model.embedding_multiplier": 8, "model.tie_embeddings": "true"}),
    "gpt_neox": {"model.position_embedding": "rope", "model.rope_theta": 500,
                 "model.activation": "gelu_erf", "model.parallel_residual": "true",
                 "model.tie_embeddings": "false", "model.rope_dim": 8},
    "phi": {"model.position_embedding": "rope", "model.rope_theta": 500,
            "model.parallel_residual": "true", "model.shared_norm": "true",
            "model.head_bias": "true", "model.tie_embeddings": "false", "model.rope_dim": 8},
    "nemotron": {"model.position_embedding": "rope", "model.rope_theta": 500,
                 "model.activation": "relu2", "model.norm_weight_offset": "true",
                 "model.linear_bias": "false", "model.tie_embeddings": "false",
                 "model.rope_dim": 8},
    "cohere": dict(LLAMA, **{"model.normalization": "layernorm", "model.norm_bias": "false",
                             "model.parallel_residual": "true", "model.shared_norm": "true",
                             "model.logit_scale": 0.5, "model.tie_embeddings": "true"}),
    # Latent attention with DeepSeek-V3's mixture (sigmoid scores, expert
    # biases, groups, a shared expert) and with DeepSeek-V2's (a softmax,
    # unnormalised, scaled).
    "deepseek_v3": dict(LLAMA, **{
        "model.tie_embeddings": "false", "model.mla": MLA % 48,
        "model.moe": "{experts: 4, top_k: 2, ffn_hidden_size: 96, dense_layers: [0], "
                     "shared_ffn_hidden_size: 96, score: sigmoid, expert_bias: true, "
                     "bias_update_rate: 0.01, groups: 2, top_groups: 1, "
                     "routed_scaling_factor: 2.5, aux_loss_coef: 0}"}),
    "deepseek_v2": dict(LLAMA, **{
        "model.tie_embeddings": "false", "model.mla": MLA % 48,
        "model.moe": "{experts: 4, top_k: 2, ffn_hidden_size: 96, shared_ffn_hidden_size: 96, "
                     "normalize_top_k: false, routed_scaling_factor: 2.0, aux_loss_coef: 0.01}"}),
    "starcoder2": {"model.position_embedding": "rope", "model.rope_theta": 500,
                   "model.sliding_window": 24, "model.tie_embeddings": "true"},
}


def draw_family(rng):
    """A model of one of FAMILIES, with its head and layer counts."""
    s = {"model.n_head": rng.choice([4, 8]), "model.d_model": 64,
         "model.n_layer": rng.choice([4, 6, 8]), "model.seq_len": 64,
         "model.vocab_size": rng.choice([256, 300, 509])}
    name = rng.choice(sorted(FAMILIES))
    s.update(FAMILIES[name])
    if (s.get("model.normalization") == "rmsnorm" and "model.qk_norm" not in s and
            "model.mla" not in s):
        s["model.n_kv_head"] = rng.choice([s["model.n_head"], 2, 1])
    if rng.random() < 0.3:
        s["model.recompute"] = "full"
    return s, "model.moe" in s


def draw_model(rng, mixtures=False):
    """A feature mix as --set overrides, with its head and layer counts
    (mixtures: always a mixture of experts, LoRA more often)."""
    s = {}
    n_head = rng.choice([4, 8])
    s["model.n_head"] = n_head
    s["model.d_model"] = 64
    s["model.n_layer"] = rng.choice([4, 6, 8])
    s["model.seq_len"] = 64
    s["model.vocab_size"] = rng.choice([256, 300, 509])
    llama = mixtures or rng.random() < 0.6
    if llama:
        s["model.position_embedding"] = "rope"
        s["model.rope_theta"] = 500
        s["model.normalization"] = "rmsnorm"
        s["model.linear_bias"] = "false"
        s["model.activation"] = rng.choice(["swiglu", "geglu", "relu2", "gelu"])
        s["model.tie_embeddings"] = rng.choice(["true", "false"])
        s["model.n_kv_head"] = rng.choice([n_head, n_head // 2, 2, 1])
        if rng.random() < 0.3:
            s["model.qkv_bias"] = "true"
        r = rng.random()
        if r < 0.2:
            s["model.qk_norm"] = "full"
        elif r < 0.4:
            s["model.qk_norm"] = "true"
        if rng.random() < 0.25:
            s["model.sliding_window"] = rng.choice([8, 24])
            if rng.random() < 0.5:
                s["model.full_attention_layers"] = "[1]"
        if rng.random() < 0.15:
            s["model.nope_layers"] = "[0]"
        if rng.random() < 0.15:
            s["model.head_dim"] = 8
        if rng.random() < 0.2:
            s["model.post_norms"] = "true"
        if rng.random() < 0.1:
            s["model.mlp_bias"] = "true"
        r = rng.random()
        if r < 0.05:
            s["model.rope_scaling"] = "{type: linear, factor: 2}"
        elif r < 0.1:
            s["model.rope_scaling"] = ("{type: llama3, factor: 8, low_freq_factor: 1, "
                                       "high_freq_factor: 4, original_max_position_embeddings: 32}")
        elif r < 0.15:
            s["model.rope_scaling"] = "{type: yarn, factor: 2, original_max_position_embeddings: 32}"
        if "model.full_attention_layers" in s and rng.random() < 0.5:
            s["model.rope_local_theta"] = 100
        if rng.random() < 0.1:
            s["model.query_pre_attn_scalar"] = 24
    else:
        s["model.activation"] = rng.choice(["gelu", "gelu_erf"])
    if rng.random() < 0.2:
        s["model.attn_logit_softcap"] = 20
    if rng.random() < 0.2:
        s["model.final_logit_softcap"] = 15
    if rng.random() < 0.2:
        s["model.z_loss_coef"] = 0.01
    moe = llama and (mixtures or rng.random() < 0.3)
    if moe:
        top_k = rng.choice([1, 2])
        extra = ""
        if rng.random() < 0.4:
            # Dropping by position: dropping the least probable flips where
            # two assignments' probabilities tie within rounding (another
            # layout's summation order), which parts the runs by design.
            extra += ", capacity_factor: 1.25, drop_policy: position"
        if rng.random() < 0.3:
            extra += ", shared_ffn_hidden_size: 64"
            if rng.random() < 0.5:
                extra += ", shared_gate: true"
        if rng.random() < 0.3:
            extra += ", score: sigmoid, expert_bias: true, bias_update_rate: 0.01"
            if rng.random() < 0.5:
                extra += ", groups: 2, top_groups: 1"
                if rng.random() < 0.5:
                    extra += ", group_score: max"
        if rng.random() < 0.15:
            extra += ", dense_layers: [0]"
        if rng.random() < 0.2:
            extra += ", aux_loss_scope: sequence"
        if rng.random() < 0.2:
            extra += ", z_loss_coef: 0.001"
        if rng.random() < 0.15:
            extra += ", normalize_top_k: false, routed_scaling_factor: 2.5"
        s["model.moe"] = ("{experts: 4, top_k: %d, ffn_hidden_size: 96, aux_loss_coef: 0.01%s}" %
                          (top_k, extra))
        s.pop("model.mlp_bias", None)  # (the experts have none: refused)
    mtp = llama and rng.random() < 0.15
    if mtp:
        s["model.mtp_layers"] = 1
    # Latent attention, in a mixture too (DeepSeek-V2's and V3's blocks),
    # without what it replaces (model.mla refuses those).
    mla = llama and rng.random() < (0.25 if mixtures else 0.15)
    if mla:
        s["model.mla"] = MLA % rng.choice([0, 48])
        for k in ("model.n_kv_head", "model.head_dim", "model.qk_norm", "model.qkv_bias",
                  "model.query_pre_attn_scalar"):
            s.pop(k, None)
    if rng.random() < 0.15:
        s["model.parallel_residual"] = "true"
    if not mla and rng.random() < 0.1:
        s["model.clip_qkv"] = 0.5
    if rng.random() < 0.1:
        s["model.norm_affine"] = "false"
    if rng.random() < 0.15:
        s["model.residual_multiplier"] = 0.7
        s["model.logit_scale"] = 0.5
        s["model.embedding_multiplier"] = 3
    if rng.random() < 0.15:
        s["model.dropout"] = 0.1
    if not mtp and rng.random() < (0.4 if mixtures else 0.15):
        # In a mixture, half the time on the experts too (each its own
        # adapters, each row dropping out its assignment's mask).
        # (Under latent attention its key/value latent's projections in
        # place of c_attn.)
        attention = "attn.kv_a_proj, attn.kv_b_proj" if mla else "attn.c_attn"
        targets = (", targets: [%s, mlp.c_fc, mlp.c_proj]" % attention
                   if moe and rng.random() < 0.5 else "")
        s["model.lora"] = "{rank: 4, alpha: 8, dropout: %s%s}" % (
            rng.choice(["0.0", "0.1"]), targets)
    elif rng.random() < 0.2:
        s["train.optimizer"] = "muon"
    r = rng.random()
    if r < 0.05:
        s["train.precision"] = "fp16"
    elif r < 0.15:
        s["train.precision"] = "bf16"
        if rng.random() < 0.5:
            s["train.grad_precision"] = "bf16"
    elif r < 0.25:
        s["train.moment_precision"] = "bf16"
    if rng.random() < 0.2:
        s["train.ema_decay"] = 0.9
    if rng.random() < 0.1:
        s["train.rampup_batch_size"] = "[4, 4, 16]"  # 4, then 8 sequences a step
    if rng.random() < 0.1:
        s["train.grad_clip"] = 0  # (the default 1.0 clips these runs' norms of about 2)
    if rng.random() < 0.1:
        s["train.lr_scale"] = '{"h.*.mlp.*": 2}'
    if rng.random() < 0.1:
        s["train.no_weight_decay"] = "[wte.weight]"
    if "model.lora" not in s and rng.random() < 0.1:
        s["train.freeze"] = '["h.0.attn.*"]'
    if rng.random() < 0.1:
        s["train.warmup_init"] = 0.0001
    r = rng.random()
    if r < 0.2:
        s["model.recompute"] = "full"
        if rng.random() < 0.3:
            s["model.recompute_layers"] = 1
    elif r < 0.35:
        s["model.recompute"] = "selective"
    if rng.random() < 0.3:
        s["data.eod_token"] = 10
        s["data.reset_attention_mask"] = "true"
        s["data.reset_position_ids"] = rng.choice(["true", "false"])
        s["data.eod_mask_loss"] = rng.choice(["true", "false"])
        s["train.loss_average"] = rng.choice(["tokens", "microbatches"])
        if rng.random() < 0.3:
            s["data.packing"] = rng.choice(["documents", "best_fit"])
        if rng.random() < 0.2:
            s["data.fim_rate"] = 0.5
            s["data.fim_tokens"] = "[11, 12, 13]"
    return s, moe


def draw_layout(rng, model, moe, max_ranks, allow_one=False):
    """A layout as --set overrides and its rank count."""
    n_head, n_layer = model["model.n_head"], model["model.n_layer"]
    for _ in range(100):
        tp = rng.choice([1, 1, 2, 4])
        pp = rng.choice([1, 1, 2, 4])
        cp = rng.choice([1, 1, 1, 2])
        dp = rng.choice([1, 1, 2, 4])
        ranks = tp * pp * cp * dp
        if (ranks == 1 and not allow_one) or ranks > max_ranks or n_head % (tp * cp):
            continue
        if "train.rampup_batch_size" in model and dp * cp > 2:  # 4 sequences at first
            continue
        if pp > n_layer:
            continue
        if n_layer % pp and rng.random() < 0.7:
            continue
        s = {"parallel.tp": tp, "parallel.pp": pp, "parallel.dp": dp, "parallel.cp": cp}
        if tp > 1 and rng.random() < 0.6:
            s["parallel.sequence_parallel"] = "true"
        if pp > 1:
            schedule = rng.choice(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-auto", "zb-v"])
            s["parallel.schedule"] = schedule
            if schedule in ("interleaved", "zb-v"):
                s["parallel.vpp"] = 2
            if n_layer % (pp * s.get("parallel.vpp", 1)) or rng.random() < 0.2:
                s["parallel.stage_layers"] = "auto"
        if schedule_takes_budget(s) and rng.random() < 0.3:
            s["parallel.zb_max_in_flight"] = 2 * pp - 1
        if tp > 1 and pp > 1 and "parallel.sequence_parallel" not in s:
            s["parallel.pipeline_scatter_gather"] = rng.choice(["true", "false"])
        if dp > 1 and rng.random() < 0.5:
            s["parallel.zero"] = 1
            s["parallel.overlap_param_gather"] = rng.choice(["true", "false"])
        if dp > 1 and rng.random() < 0.3:
            s["parallel.bucket_mb"] = 0.01
        if cp > 1:
            s["parallel.cp_comm"] = rng.choice(["auto", "all_to_all", "all_gather", "ring"])
        if moe and dp * cp > 1 and rng.random() < 0.5:  # (ep may span the context ranks)
            s["parallel.ep"] = 4 if dp * cp % 4 == 0 and rng.random() < 0.3 else 2
        return s, ranks
    raise RuntimeError("no layout drawn")


def schedule_takes_budget(layout):
    return layout.get("parallel.schedule") in ("zb-auto", "zb-v")


def sets(overrides):
    out = []
    for k, v in overrides.items():
        out += ["--set", "%s=%s" % (k, v)]
    return out


def run(cmd, log, env=None):
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n\n")
        f.flush()
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=1800,
                           env=dict(os.environ, **(env or {})))
    return p.returncode


def metrics(out_dir):
    """The trained steps' rows, and the validation losses by step (0: before
    the first)."""
    rows, val = [], {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "loss" in row:
                rows.append(row)
            if "val_loss" in row:
                val[row.get("step", 0)] = row["val_loss"]
    return rows, val


def config_refusal(path):
    """The config error a failed run logged, or None for any other failure."""
    with open(path) as f:
        text = re.sub(r"\x1b\[[0-9;]*m", "", f.read())
    for line in text.splitlines():
        m = re.search(r"\[error\] (.*)", line)
        if m and re.match(r"(model|parallel|train|data|init|eval|log|checkpoint)\.", m.group(1)):
            return m.group(1)
    return None


def last_lines(path, n=12):
    with open(path) as f:
        return "".join(f.readlines()[-n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--only", type=int, metavar="TRIAL",
                    help="run that trial of the seed's draws alone (a finding again)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-ranks", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--resume", action="store_true",
                    help="train the first half on one layout, resume the second on another")
    ap.add_argument("--export", action="store_true",
                    help="export each model to Hugging Face's layout (triad-export) and run the "
                    "layout from the export (model.hf_config and init.from): its evaluation "
                    "and first loss must be the model's")
    ap.add_argument("--device", choices=["cpu", "sim"], default="cpu",
                    help="sim: the layouts run device: cuda on the CPU simulator of the CUDA "
                    "backend (triad-train-sim, a CUDA build's), against one CPU process")
    ap.add_argument("--moe", action="store_true",
                    help="every model a mixture of experts (LoRA, on the experts half the "
                    "time, drawn more often)")
    ap.add_argument("--wide-heads", type=float, default=0.12, metavar="P",
                    help="with --device sim, the chance a trial's heads are 192 or 256 wide "
                         "(above the tensor cores' 128)")
    ap.add_argument("--half", type=float, default=0.0, metavar="P",
                    help="with --device sim, the chance an fp32 trial runs in bf16 (both runs)")
    ap.add_argument("--work", default="/tmp/triad_layout_sweep")
    ap.add_argument("--train", default=os.path.join(ROOT, "build/examples/triad-train"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build/tests/cli/tiny.bin"))
    a = ap.parse_args()
    if a.resume and a.export:
        sys.exit("layout_sweep: --resume and --export are separate modes")
    export = os.path.join(os.path.dirname(a.train), "triad-export")
    sim = os.path.join(ROOT, "build/tests/triad-train-sim")
    if a.device == "sim" and not os.path.exists(sim):
        sys.exit("layout_sweep: %s does not exist (a CUDA build makes it)" % sim)
    for path in (a.train, a.data) + ((export,) if a.export else ()):
        if not os.path.exists(path):
            sys.exit("layout_sweep: %s does not exist (build first: ./scripts/dev.sh build)" % path)
    mpirun = mpirun_prefix()
    rng = random.Random(a.seed)
    config = os.path.join(ROOT, "configs/gpt_tiny.yaml")
    counts = {"matched": 0, "parted": 0, "refused": 0, "findings": 0}
    steps = 1 if a.export else a.steps
    for trial in range(a.trials if a.only is None else a.only + 1):
        # (--export: half of them from a family, random mixes seldom fitting
        # a class.)
        model, moe = (draw_family(rng) if a.export and rng.random() < 0.5 else
                      draw_model(rng, a.moe))
        if a.export:
            # What a Hugging Face config does not hold: LoRA's adapters
            # (exported merged) and the run's dropout.
            model = {k: v for k, v in model.items() if k not in ("model.lora", "model.dropout")}
        layout, ranks = draw_layout(rng, model, moe, a.max_ranks)
        # Drawn from a generator of their own, so that a seed's models and
        # layouts stay what they were: the mesh's rank order, and on the
        # simulator a captured step (train.cuda_graph; a mixture under a
        # capacity then routes on the device, padded to it).
        more = random.Random(a.seed * 100003 + trial)
        if sum(layout["parallel." + d] > 1 for d in ("tp", "dp", "pp")) > 1 and more.random() < 0.3:
            layout["parallel.order"] = more.choice(["tp-pp-dp", "dp-tp-pp", "pp-tp-dp"])
        if a.device == "sim" and more.random() < 0.4:
            if not moe:
                layout["train.cuda_graph"] = "true"
            elif "capacity_factor" in model.get("model.moe", "") and (
                    layout["parallel.cp"] == 1 or "dropout: 0.1" not in model.get("model.lora", "")):
                # (Under context parallelism padding refuses LoRA dropout on
                # the experts' adapters, by name; from 2026-12-07 it takes
                # the rest, which the seeds before drew uncaptured.)
                layout["train.cuda_graph"] = "true"
                layout["model.moe.pad_to_capacity"] = "true"
            elif ("capacity_factor" not in model.get("model.moe", "")
                  and layout.get("parallel.ep", 1) == 1
                  and ("mlp.c_fc" not in model.get("model.lora", "")
                       or "dropout: 0.0" in model.get("model.lora", ""))):
                # A dropless mixture, its rows grouped and its products
                # sized on the device (from 2026-12-08; not under expert
                # parallelism, nor with LoRA dropout on its experts, which
                # the config refuses by name).
                layout["train.cuda_graph"] = "true"
        if a.device == "sim" and more.random() < a.wide_heads and "model.mla" not in model:
            # Heads wider than the tensor cores' 128 (Gemma's 256, latent
            # attention's 192): the SIMT kernels with two lanes a row.
            model["model.head_dim"] = more.choice([192, 256])
        if (a.device == "sim" and a.half > 0 and more.random() < a.half
                and "train.precision" not in model
                and "bias_update_rate" not in model.get("model.moe", "")):
            # Half precision on the simulator: the tensor-core attention
            # (and cuDNN's) under auto, at every width they take. (Not with
            # a mixture's bias updates: their sign follows each expert's
            # load, so a token another layout's rounding routes elsewhere
            # can turn a bias, and the runs part by design; seed 1700, trial
            # 15.)
            model["train.precision"] = "bf16"
        if a.device == "sim" and more.random() < 0.3 and "model.mla" not in model:
            # One attention kernel by name rather than the faster one timed:
            # those it can run (tensor cores and cuDNN take half precision,
            # head dims of a multiple of 16 and of 8; cuDNN neither a soft
            # cap nor documents' masks).
            # A half-precision kernel drawn for an fp32 model makes the
            # trial bf16 (both runs).
            head_dim = model.get("model.head_dim", model["model.d_model"] // model["model.n_head"])
            kernels = ["simt"]
            kernels += ["tensor_core"] if head_dim % 16 == 0 else []
            kernels += (["cudnn"] if head_dim % 8 == 0 and "model.attn_logit_softcap" not in model
                        and "data.reset_attention_mask" not in model
                        and layout["parallel.cp"] == 1 else [])
            kernel = more.choice(kernels)
            layout["model.attention_kernel"] = kernel
            if kernel != "simt" and model.get("train.precision") not in ("bf16", "fp16"):
                model["train.precision"] = "bf16"
        if a.resume:
            # (Drawn with the rest, whatever the runs do: a trial's draws
            # depend on the seed and the trial's number alone, so --only
            # can repeat it.)
            second, second_ranks = draw_layout(rng, model, moe, a.max_ranks, allow_one=True)
        if a.only is not None and trial != a.only:
            continue
        work = os.path.join(a.work, "trial_%03d" % trial)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        base = [a.train, "--config", config, "--set", "data.train=" + a.data,
                "--set", "train.micro_batch_size=2", "--set", "log.interval=1",
                "--set", "train.global_batch_size=8", "--set", "data.val=" + a.data,
                "--set", "eval.interval=%d" % steps, "--set", "eval.batches=2"]
        if a.export:
            base += ["--set", "eval.at_start=true"]
        what = " ".join("%s=%s" % kv for kv in list(model.items()) + list(layout.items()))
        # Shared starting weights, then one process, then the layout.
        init = os.path.join(work, "init")
        rc = run(base + sets(model) + ["--set", "train.steps=1", "--set", "eval.at_start=false",
                                       "--set", "output.dir=" + init],
                 os.path.join(work, "init.log"))
        if rc != 0:
            why = config_refusal(os.path.join(work, "init.log"))
            if why is None:
                counts["findings"] += 1
                print("trial %d FINDING: the model failed: %s\n%s" %
                      (trial, what, last_lines(os.path.join(work, "init.log"))))
            else:
                counts["refused"] += 1
                print("trial %d refused (model): %s\n  %s" % (trial, what, why))
            continue
        start = sets(model) + ["--set", "init.from=" + os.path.join(init, "model.safetensors")]
        layout_base, layout_start = base, start
        if a.export:
            # The layout runs the model as its export describes it: the
            # architecture from config.json, the training settings as given.
            hf = os.path.join(work, "hf")
            log = os.path.join(work, "export.log")
            if run([export, "--run", init, "--output", hf], log) != 0:
                counts["refused"] += 1
                print("trial %d refused (export): %s\n  %s" % (trial, what, last_lines(log, 1).strip()))
                continue
            kept = ("model.recompute", "model.seq_len", "model.z_loss_coef")
            layout_start = sets({k: v for k, v in model.items()
                                 if not k.startswith("model.") or k in kept})
            # A mixture's training settings (config.json holds its shape
            # and router): laid over what the export's config reads.
            training = [kv for kv in re.findall(r"(\w+): ([^,}]+)", model.get("model.moe", ""))
                        if kv[0] in MOE_TRAINING_KEYS]
            if training:
                layout_start += ["--set", "model.moe={%s}" %
                                 ", ".join("%s: %s" % kv for kv in training)]
            layout_start += ["--set", "model.hf_config=" + hf, "--set", "init.from=" + hf]
            # (Its config file sets no model key: those beside hf_config
            # would override config.json's.)
            plain = os.path.join(work, "no_model.yaml")
            with open(config) as f, open(plain, "w") as o:
                o.write(re.sub(r"(?ms)^model:\n(?:[ #].*?\n|\n)*", "", f.read()))
            layout_base = [a.train, "--config", plain] + base[3:]
        ref = os.path.join(work, "reference")
        rc = run(base + start + ["--set", "train.steps=%d" % steps, "--set", "output.dir=" + ref] +
                 (["--set", "train.lr_decay_steps=%d" % steps] if a.resume else []),
                 os.path.join(work, "ref.log"))
        if rc != 0:
            counts["findings"] += 1
            print("trial %d FINDING: one process failed: %s\n%s" %
                  (trial, what, last_lines(os.path.join(work, "ref.log"))))
            continue
        out = os.path.join(work, "layout")
        # With --resume the layout trains the first half and checkpoints, and
        # a second layout resumes from there (resharding as it loads).
        halves = [(layout, ranks, steps)]
        if a.resume:
            halves = [(layout, ranks, steps // 2), (second, second_ranks, steps)]
            what += " -> " + " ".join("%s=%s" % kv for kv in second.items())
        failed = False
        for half, (flags, n, until) in enumerate(halves):
            log = os.path.join(work, "layout%d.log" % half)
            cmd = layout_base + layout_start + sets(flags) + ["--set", "train.steps=%d" % until,
                                                       "--set", "output.dir=" + out]
            env = None
            if a.device == "sim":
                cmd = [sim] + cmd[1:] + ["--set", "device=cuda"]
                env = {"TRIAD_SIM_DEVICES": str(n)}
            if a.resume:
                cmd += ["--set", "checkpoint.dir=" + os.path.join(work, "ck"),
                        "--set", "checkpoint.resume=auto", "--set", "train.lr_decay_steps=%d" % steps]
            launch = mpirun + ["-x", "TRIAD_SIM_DEVICES", "-np", str(n)] if n > 1 else []
            rc = run(launch + cmd, log, env)
            if rc != 0:
                failed = True
                why = config_refusal(log)
                if why is None:
                    counts["findings"] += 1
                    print("trial %d FINDING: the layout failed: %s\n%s" % (trial, what, last_lines(log, 30)))
                else:
                    counts["refused"] += 1
                    print("trial %d refused (layout): %s\n  %s" % (trial, what, why))
                break
        if failed:
            continue
        (a_rows, a_val), (b_rows, b_val) = metrics(ref), metrics(out)
        if a.resume:
            a_rows, b_rows = a_rows[steps // 2:], b_rows[-(steps - steps // 2):]
        # Mixed precision at the tolerance the CTest suites give it: losses
        # within 0.5%, gradient norms within 10%.
        half = model.get("train.precision") in ("bf16", "fp16")
        tolerance = {"loss": 5e-3 if half else a.tolerance, "grad_norm": 0.1 if half else a.tolerance}
        if a.device == "sim" and not half:
            tolerance["grad_norm"] = 10 * a.tolerance  # (the CUDA suites' 1e-4)
        tolerance["val_loss"] = tolerance["loss"]
        # An export is compared on its forward passes (the training
        # objective's extra terms, a mixture's balance, are the run's).
        keys = ("loss", "val_loss") if a.export else ("loss", "grad_norm", "val_loss")
        # fp16's dynamic loss scaling: a step that overflows on one side only
        # (a rank's backward starts from the scale over its own micro-batches,
        # so a layout with fewer of them per rank overflows sooner) skips that
        # side's update, and the runs part there by design. They are compared
        # up to that step.
        parted = None
        if model.get("train.precision") == "fp16":
            for i, (x, y) in enumerate(zip(a_rows, b_rows)):
                if bool(x.get("skipped")) != bool(y.get("skipped")):
                    parted = i
                    break
        if parted is not None:
            last = a_rows[parted].get("step", parted + 1)
            a_rows, b_rows = a_rows[:parted], b_rows[:parted]
            a_val = {k: v for k, v in a_val.items() if k < last}
            b_val = {k: v for k, v in b_val.items() if k < last}
        worst = 0.0
        # Every evaluation the one process made must be the layout's at the
        # same step (with --export also the one before the first step; with
        # --resume the first half's closing one has no counterpart).
        if len(a_rows) != len(b_rows) or (not a_val and parted is None) or any(
                s not in b_val for s in a_val):
            worst = float("inf")
        else:
            a_rows += [{"val_loss": a_val[s]} for s in sorted(a_val)]
            b_rows += [{"val_loss": b_val[s]} for s in sorted(a_val)]
        for x, y in zip(a_rows, b_rows):
            for key in keys:
                if key in x:
                    # (A non-finite value is written as null.)
                    want = x[key] if x[key] is not None else float("nan")
                    got = y.get(key)
                    got = got if got is not None else float("nan")
                    d = abs(want - got) / max(abs(want), 1e-12)
                    d = d / tolerance[key] if d == d else float("inf")
                    worst = max(worst, d)
        if worst <= 1 and parted is not None:
            counts["parted"] += 1
            print("trial %d matched until fp16 loss scaling parted the runs at step %d (an overflow "
                  "on one side only; worst %.2f of the tolerance before it): %s"
                  % (trial, last, worst, what))
        elif worst <= 1:
            counts["matched"] += 1
            print("trial %d matched (worst %.2f of the tolerance): %s" % (trial, worst, what))
        else:
            counts["findings"] += 1
            print("trial %d FINDING: %.1f times the tolerance: %s\n  one process %s\n  layout      %s"
                  % (trial, worst, what, [r["loss"] for r in a_rows if "loss" in r],
                     [r["loss"] for r in b_rows if "loss" in r]))
        sys.stdout.flush()
    print("%(matched)d matched, %(parted)d parted by fp16 loss scaling, %(refused)d refused, "
          "%(findings)d findings" % counts)
    return 1 if counts["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
