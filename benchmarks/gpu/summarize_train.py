#!/usr/bin/env python3
"""run_all.sh's training lines (train.jsonl) as one table.

Each Triad run is named by what it changed from the defaults, and set
against PyTorch's run and Triad's first run (run_all.sh's is at the
defaults) of the same model and batch: what a session needs to decide
whether a switch becomes a default.

    python3 benchmarks/gpu/summarize_train.py OUT/train.jsonl

--graph-estimate OUT/kernels.jsonl OUT/train.jsonl: what a CUDA graph of
each model's step could save at most, from bench_kernels_gpu's launch-gap
probe and the step's op profile.
"""
import json
import sys

# The bench's defaults: a run is named by the settings that differ.
DEFAULTS = {
    "bias_grad_epilogue": False,
    "dgelu_bias_grad_epilogue": False,
    "gelu_apart": False,
    "add_norm_bias_sums": False,
    "norm_backward_register_sums": False,
    "attention_deterministic": True,
    "attention_kernel": "auto",
    "recompute": "none",
    "moment_precision": "fp32",
    "grad_precision": "fp32",
    "vocab": 50304,
    "experts": 0,
    "activation": "gelu",
    "sync_free": False,
    "cuda_graph": False,
}


def label(run):
    """What a Triad run changed from the defaults, e.g. 'gemm-autotune 8'."""
    parts = []
    for key, default in DEFAULTS.items():
        if key not in run or run[key] == default:
            continue
        value = run[key]
        if key == "attention_deterministic":
            parts.append("attention-nondeterministic")
        elif key == "experts":
            moe = f"experts {value} top {run.get('top_k', 0)}"
            if run.get("capacity_factor"):
                moe += f" capacity {run['capacity_factor']:g}"
            if run.get("pad_to_capacity"):
                moe += " padded"
            if run.get("host_routing"):
                moe += " host-routed"
            if run.get("moe_z_loss"):
                moe += f" z-loss {run['moe_z_loss']:g}"
            parts.append(moe)
        elif value is True:
            parts.append(key.replace("_", "-"))
        else:
            parts.append(f"{key.replace('_', '-')} {value}")
    if "gemm_autotune" in run:
        tuned = run["gemm_autotune"]
        parts.append(f"gemm-autotune {tuned.get('candidates')} "
                     f"({tuned.get('changed')} of {tuned.get('problems')} products changed)")
    return ", ".join(parts) if parts else "defaults"


def read(path):
    """The JSON lines of `path` (other lines, such as log text, skipped)."""
    runs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return runs


def summarize(runs):
    """The table's lines."""
    def key(r):
        return (r.get("preset"), r.get("batch"), r.get("seq"))

    torch = {key(r): r for r in runs if r.get("impl") == "pytorch"}
    # Each model and batch's first Triad run (run_all.sh's is at the
    # defaults): what the runs after it change.
    first = {}
    for r in runs:
        if r.get("impl") == "triad":
            first.setdefault(key(r), r)
    # The host's work on a step's path, where the run reports it: products
    # that asked cuBLASLt for an algorithm, and blocks the allocator asked
    # the device for (a mixture's new shapes every step make both).
    lines = ["| model | batch | run | tokens/s | MFU | step ms | vs PyTorch | vs the first run "
             "| GEMM queries / cudaMallocs a step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        impl = r.get("impl")
        if impl == "planner":  # (a prediction for the model's first run)
            r = dict(r, batch=r.get("micro_batch"), step_ms=1e3 * r.get("step_time_s", 0.0))
        k = key(r)
        name = {"pytorch": "PyTorch", "planner": "the planner's prediction",
                "triad-train": "triad-train (the example trainer)"}.get(impl) or label(r)
        if impl == "triad-train" and r.get("cuda_graph"):
            name = "triad-train (the example trainer, train.cuda_graph)"
        tps = r.get("tokens_per_s", 0.0)
        if impl == "triad-train" and "mfu" not in r and k in first:
            # (The same model and batch as the first run: its MFU at this pace.)
            base = first[k]
            if base.get("tokens_per_s"):
                r = dict(r, mfu=base.get("mfu", 0.0) * tps / base["tokens_per_s"])
        vs_torch = vs_first = ""
        measured = impl in ("triad", "triad-train")
        if measured and k in torch and torch[k].get("tokens_per_s"):
            vs_torch = f"{tps / torch[k]['tokens_per_s']:.4f}x"
        if measured and k in first and first[k] is not r and first[k].get("tokens_per_s"):
            vs_first = f"{100.0 * (tps / first[k]['tokens_per_s'] - 1.0):+.2f}%"
        host = ""
        if "gemm_queries_per_step" in r and "system_allocs_per_step" in r:
            host = f"{r['gemm_queries_per_step']:g} / {r['system_allocs_per_step']:g}"
        lines.append(f"| {r.get('preset')} | {r.get('batch')} | {name} | {tps / 1e3:.1f}k | "
                     f"{100.0 * r.get('mfu', 0.0):.2f}% | {r.get('step_ms', 0.0):.2f} | "
                     f"{vs_torch} | {vs_first} | {host} |")
    return lines


# The switches a default could become: bench_train_gpu's flags, each named
# by its key in the run's JSON line ("--" and the key with dashes), and the
# autotuning's, which also takes its count of candidates.
SWITCHES = ("gemm_autotune", "dgelu_bias_grad_epilogue", "add_norm_bias_sums",
            "norm_backward_register_sums", "bias_grad_epilogue", "gelu_apart", "sync_free",
            "cuda_graph")


def switch_flags(run):
    """The flags of the switches `run` has on."""
    flags = []
    for key in SWITCHES:
        if key == "gemm_autotune" and key in run:
            flags.append(f"--gemm-autotune {run[key].get('candidates')}")
        elif key != "gemm_autotune" and run.get(key):
            flags.append("--" + key.replace("_", "-"))
    return flags


def helpful_switches(runs, preset, min_gain_pct):
    """The flags of the switches that each, alone, made `preset`'s run at
    least min_gain_pct percent faster than its first run (the defaults):
    what run_all.sh runs together, once, to measure them as defaults."""
    triad = [r for r in runs if r.get("impl") == "triad" and r.get("preset") == preset]
    if not triad:
        return []
    base = triad[0]
    if label(base) != "defaults" or not base.get("tokens_per_s"):
        return []
    flags = []
    for r in triad[1:]:
        if r.get("batch") != base.get("batch") or r.get("seq") != base.get("seq"):
            continue
        on = switch_flags(r)
        # Alone: one switch on, and nothing else changed from the defaults.
        others = label({k: v for k, v in r.items() if k not in SWITCHES})
        if len(on) != 1 or others != "defaults" or on[0] in flags:
            continue
        gain = 100.0 * (r.get("tokens_per_s", 0.0) / base["tokens_per_s"] - 1.0)
        if gain >= min_gain_pct:
            flags.append(on[0])
    return flags


def graph_estimate(kernels, runs):
    """What a CUDA graph of each model's step could save, at most: the
    step's backend calls (its op profile's; each queues one launch or more)
    times what the launch-gap probe's device spends a launch from the
    stream beyond what it spends from a graph. A line per model with a
    profiled run (its first)."""
    gap = {k.get("kernel"): k for k in kernels}
    stream, graph = gap.get("launch_gap_stream"), gap.get("launch_gap_graph")
    if not stream or not graph or "us_per_launch" not in stream or "us_per_launch" not in graph:
        return ["(no launch-gap rows among the kernels' lines: no estimate)"]
    saved_us = stream["us_per_launch"] - graph["us_per_launch"]
    note = ""
    if stream.get("device_waited_for_host"):
        note = " (the device waited for the host's queueing: the stream's figure is the host's pace)"
    profiled = {}
    for r in runs:
        if r.get("impl") == "triad" and "op_profile" in r:
            profiled.setdefault((r.get("preset"), r.get("batch")), r)
    lines = []
    for (preset, batch), r in profiled.items():
        calls = sum(op.get("calls_per_step", 0.0) for op in r["op_profile"].get("ops", []))
        ms = calls * saved_us / 1e3
        step = r.get("step_ms", 0.0)
        share = f" ({100.0 * ms / step:.2f}%)" if step > 0 else ""
        host = ""
        queued = r.get("host_queue_ms", {}).get("forward_backward")
        phases = r.get("phases_ms", {})
        if queued is not None and "forward" in phases and "backward" in phases:
            host = (f" (the host queued its passes in {queued:.2f} ms of the device's "
                    f"{phases['forward'] + phases['backward']:.2f})")
        lines.append(f"{preset} batch {batch}: {calls:.0f} backend calls a step x "
                     f"({stream['us_per_launch']:.2f} - {graph['us_per_launch']:.2f}) us a launch "
                     f"= up to {ms:.2f} ms of its {step:.2f} ms step{share} from a CUDA graph{note}"
                     f"{host}")
    return lines or ["(no profiled Triad run: no estimate)"]


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--graph-estimate":
        print("\n".join(graph_estimate(read(args[1]), read(args[2]))))
        return
    if len(args) >= 3 and args[0] == "--helpful-switches":
        # --helpful-switches PRESET [--min-gain PCT] TRAIN_JSONL
        preset, rest = args[1], args[2:]
        min_gain = 0.2
        if len(rest) == 3 and rest[0] == "--min-gain":
            min_gain, rest = float(rest[1]), rest[2:]
        if len(rest) == 1:
            print(" ".join(helpful_switches(read(rest[0]), preset, min_gain)))
            return
    if len(args) != 1:
        sys.exit("usage: summarize_train.py TRAIN_JSONL\n"
                 "       summarize_train.py --helpful-switches PRESET [--min-gain PCT] TRAIN_JSONL\n"
                 "       summarize_train.py --graph-estimate KERNELS_JSONL TRAIN_JSONL")
    print("\n".join(summarize(read(args[0]))))


if __name__ == "__main__":
    main()
