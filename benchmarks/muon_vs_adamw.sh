#!/usr/bin/env bash
# Muon against AdamW on the tiny LLaMA-style model (configs/llama_tiny.yaml,
# 300 steps, one process): the validation loss each reaches at the same
# learning rate and schedule, and the optimizer's milliseconds per step.
#   benchmarks/muon_vs_adamw.sh [BUILD_DIR]
# Needs data/tiny_train.bin and data/tiny_val.bin (scripts/dev.sh train1
# makes them).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
for f in data/tiny_train.bin data/tiny_val.bin; do
  [ -f "$f" ] || { echo "missing $f: run scripts/dev.sh train1 once to make it" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '| optimizer | final train loss | val loss | optimizer ms/step | step ms |\n'
printf '| --- | --- | --- | --- | --- |\n'
for opt in adamw muon; do
  "$build/examples/triad-train" --config configs/llama_tiny.yaml --set data.train=data/tiny_train.bin \
    --set data.val=data/tiny_val.bin --set eval.interval=300 --set eval.batches=8 \
    --set train.optimizer=$opt --set output.dir="$work/$opt" > "$work/$opt.log" 2>&1
  train=$(grep -o 'step   300/300 | loss [0-9.]*' "$work/$opt.log" | awk '{print $NF}')
  val=$(grep -o 'val loss [0-9.]*' "$work/$opt.log" | tail -1 | awk '{print $NF}')
  ms=$(grep 'step   300/300 | loss' "$work/$opt.log" | grep -o '[0-9.]* ms |' | awk '{print $1}')
  optimizer=$(grep 'ms/step' "$work/$opt.log" | tail -1 | grep -o 'optimizer [0-9.]*' | awk '{print $2}')
  printf '| %s | %s | %s | %s | %s |\n' "$opt" "$train" "$val" "$optimizer" "$ms"
done
