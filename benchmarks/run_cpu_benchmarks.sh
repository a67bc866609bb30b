#!/usr/bin/env bash
# CPU benchmarks in one run: GEMM GFLOP/s (Triad vs OpenBLAS vs Eigen), then
# training tokens/s of the fixed GPT (6 layers, d_model 384, 6 heads, vocab
# 8192, seq 256, batch 8) in Triad and in PyTorch-CPU, and the two targets:
# Triad >= 2x PyTorch tokens/s, Triad model FLOP/s >= 50% of the sgemm rate.
# Last, a mixture's host routing per layer and micro-batch (bench_routing),
# and the head's cross entropy written with its gradient in one call against
# two (bench_cross_entropy).
#   benchmarks/run_cpu_benchmarks.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
PY=/usr/bin/python3
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
"$BUILD_DIR/benchmarks/bench_gemm" --benchmark_min_time=0.5 --benchmark_format=json > /tmp/triad_gemm.json
"$PY" - <<'PYEOF'
import json
runs = json.load(open("/tmp/triad_gemm.json"))["benchmarks"]
for r in runs:
    print(f"{r['name']:<50} {r['GFLOP/s']:8.1f} GFLOP/s")
PYEOF
TRIAD=$("$BUILD_DIR/benchmarks/bench_train_cpu" --steps 5 --warmup 2)
TORCH=$("$PY" benchmarks/train_cpu_torch.py --steps 5 --warmup 2)
echo "$TRIAD"
echo "$TORCH"
"$PY" - "$TRIAD" "$TORCH" <<'PYEOF'
import json, sys
t, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
gemm = json.load(open("/tmp/triad_gemm.json"))["benchmarks"]
sgemm = max(r["GFLOP/s"] for r in gemm if r["name"].startswith("BM_OpenBlasThreadedSgemm"))
speedup = t["tokens_per_s"] / p["tokens_per_s"]
frac = t["model_gflops"] / sgemm
print(f"tokens/s: triad {t['tokens_per_s']:.0f}, pytorch {p['tokens_per_s']:.0f} -> {speedup:.2f}x (target >= 2x)")
print(f"model FLOP/s: triad {t['model_gflops']:.1f} GFLOP/s = {100*frac:.0f}% of sgemm {sgemm:.1f} (target >= 50%)")
PYEOF
"$BUILD_DIR/benchmarks/bench_routing" --tokens 4096 --repeat 10
"$BUILD_DIR/benchmarks/bench_cross_entropy" --benchmark_min_time=0.5 --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true
