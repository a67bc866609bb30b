#!/usr/bin/env bash
# Multi-token prediction's cost on the CPU (model.mtp_layers): the tiny
# LLaMA-style model (configs/llama_tiny.yaml, 4 layers) with 0, 1 and 2
# prediction modules, one process, rows of SEQ tokens (default 512), 4 a
# step. Per depth count: the step time (the mean of steps 5-8), the peak
# memory, the parameters, and what the planner (triad-plan predict on the
# LLaMA 3.2 1B's shape, hgx_h200) says a step costs on 8 GPUs, with its
# balanced stages.
#   benchmarks/mtp_overhead.sh [BUILD_DIR] [SEQ]
# Needs data/tiny_train.bin (scripts/dev.sh train1 makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seq=${2:-512}
[ -f data/tiny_train.bin ] || { echo "missing data/tiny_train.bin: run scripts/dev.sh train1" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '| mtp_layers | step ms | peak GB | parameters | planned step on 8 H200 (tp 2, pp 4) |\n'
printf '| --- | --- | --- | --- | --- |\n'
for depth in 0 1 2; do
  log="$work/mtp$depth.log"
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$build/examples/triad-train" \
    --config configs/llama_tiny.yaml --set data.train=data/tiny_train.bin --set train.steps=8 \
    --set model.seq_len="$seq" --set train.global_batch_size=4 --set train.micro_batch_size=4 \
    --set model.mtp_layers="$depth" --set log.interval=1 --set output.dir="$work/mtp$depth" \
    > "$log" 2>&1
  ms=$(grep -o 'step     [5-8]/8 | .* \([0-9.]*\) ms |' "$log" | grep -o '[0-9.]* ms |' |
       awk '{s += $1; n++} END {printf "%.1f", s / n}')
  mem=$(grep 'step     8/8' "$log" | grep -o 'mem [0-9.]*' | awk '{print $2}')
  params=$(grep -o '([0-9.]*[MKB]* parameters)' "$log" | head -1 | tr -d '()' | awk '{print $1}')
  # The planner on a larger model of the same kind (LLaMA 3.2 1B's shape).
  cat > "$work/model$depth.yaml" <<YAML
model: {n_layer: 16, n_head: 32, n_kv_head: 8, d_model: 2048, ffn_hidden_size: 8192,
        vocab_size: 128256, seq_len: 4096, position_embedding: rope, activation: swiglu,
        normalization: rmsnorm, linear_bias: false, tie_embeddings: true, mtp_layers: $depth}
YAML
  plan=$("$build/examples/triad-plan" predict --model "$work/model$depth.yaml" \
           --cluster configs/clusters/hgx_h200.yaml --gpus 8 --global-batch 64 --tp 2 --pp 4 \
           --micro-batch 1 --attention flash --stage-layers auto 2>&1 |
         grep -o 'step [0-9.]* s\|stages=\[[0-9,]*\]' | paste -sd' ' - || true)
  printf '| %s | %s | %s | %s | %s |\n' "$depth" "$ms" "$mem" "${params:-?}" "${plan:-?}"
done
