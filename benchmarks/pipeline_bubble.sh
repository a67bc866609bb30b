#!/usr/bin/env bash
# Measured pipeline bubble vs. the simulator's prediction for the same
# schedule, on a balanced toy model (8 equal layers, no TP): triad-train runs
# each schedule on 2 CPU ranks (one per core) and reports the measured
# bubble per step; triad-plan simulates the schedule with each stage's mean
# forward, backward and weight-gradient times measured in the run's trace
# (every rank's; the last stage carries the head). "peak MB" is the median over
# the same steps of metrics.jsonl's peak_memory_bytes (the largest rank's
# most bytes of tensors held at once: weights, gradients, AdamW state,
# activations).
#   benchmarks/pipeline_bubble.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
PY=/usr/bin/python3
MPIRUN=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
work=$(mktemp -d)
"$B/examples/triad-corpus" --output "$work/c.txt" --bytes 400000 >/dev/null
"$B/examples/triad-tokenize" --input "$work/c.txt" --output "$work/c.bin" >/dev/null
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; commit $(git rev-parse --short HEAD)"
printf "%-12s %3s %3s %3s %10s %10s %8s\n" schedule p v m measured simulated "peak MB"
for spec in "1f1b 1 4" "1f1b 1 8" "gpipe 1 8" "zb-h1 1 8" "zb-auto 1 8" "interleaved 2 8" "zb-v 2 8"; do
  set -- $spec
  kind=$1; v=$2; m=$3
  out=$work/$kind-$v-$m
  "${MPIRUN[@]}" -np 2 "$B/examples/triad-train" --config configs/gpt_tiny.yaml --set data.train="$work/c.bin" \
    --set model.n_layer=8 --set train.steps=12 --set train.global_batch_size=$((m * 2)) --set train.micro_batch_size=2 \
    --set parallel.pp=2 --set parallel.vpp=$v --set parallel.schedule=$kind --set output.dir="$out" >/dev/null 2>&1
  read -r measured tf tb tw peak < <("$PY" - "$out" "$kind" "$v" <<'PY'
import json, re, sys, statistics
d, kind, v, p = sys.argv[1], sys.argv[2], int(sys.argv[3]), 2
steps = [json.loads(l) for l in open(d + "/metrics.jsonl")][2:]   # skip warm-up steps
bubble = statistics.median(s["bubble_fraction"] for s in steps)
ev = [e for e in json.load(open(d + "/trace.json"))["traceEvents"] if e.get("ph") == "X"]
def stage(rank, chunk):  # the V placement for zb-v, the loop for the others
    return (rank if chunk == 0 else 2 * p - 1 - rank) if kind == "zb-v" else chunk * p + rank
def means(cat):  # per stage, comma-separated
    by = {}
    for e in ev:
        if e["cat"] != cat: continue
        c = re.search(r" c(\d+)$", e["name"])
        by.setdefault(stage(e["pid"], int(c.group(1)) if c else 0), []).append(e["dur"])
    return [sum(x) / len(x) for _, x in sorted(by.items())] if by else [0.0] * (p * v)
tf, tb, tw = means("forward"), means("backward"), means("weight-grad")
peak = statistics.median(s["peak_memory_bytes"] for s in steps) / 1e6
csv = lambda xs: ",".join(f"{x:.1f}" for x in xs)
print(bubble, csv(tf), csv(b + w for b, w in zip(tb, tw)), csv(tw) if any(tw) else "-", peak)
PY
)
  wopt=()
  [ "$tw" != "-" ] && wopt=(--tw "$tw")
  sim=$("$B/examples/triad-plan" schedule --kind "$kind" --p 2 --v "$v" --m "$m" --tf "$tf" --tb "$tb" \
        "${wopt[@]}" | sed -n 's/.*bubble \([0-9.]*\)%.*/\1/p')
  printf "%-12s %3s %3s %3s %9.1f%% %9.1f%% %8.2f\n" "$kind" 2 "$v" "$m" "$("$PY" -c "print(100 * $measured)")" "$sim" "$peak"
done
rm -rf "$work"
