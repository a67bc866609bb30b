#!/usr/bin/env bash
# Context parallelism's exchanges (parallel.cp_comm) on the CPU: the tiny
# LLaMA-style model (configs/llama_tiny.yaml: 4 query heads over 2
# key/value heads) with rows of SEQ tokens (default 2048) shared by CP
# ranks (default 2) of one OpenMP thread each, one sequence a step; and 3
# query heads (d_model 96), which only the all-gather and the ring can
# share out. With CP 4, also all-to-alls of 2 and a ring of 2
# (all_to_all+ring, parallel.cp_a2a 2). Per exchange: the step time, the
# first and last rank's forward and backward milliseconds (the balanced
# layouts should keep the ranks even) and the peak memory.
#   benchmarks/cp_exchanges.sh [BUILD_DIR] [SEQ] [CP]
# Needs data/tiny_train.bin (scripts/dev.sh train1 makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seq=${2:-2048}
cp=${3:-2}
last=$((cp - 1))
[ -f data/tiny_train.bin ] || { echo "missing data/tiny_train.bin: run scripts/dev.sh train1" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
printf '| heads (q/kv) | cp_comm | step ms | rank 0 fwd / bwd ms | rank %s fwd / bwd ms | peak GB |\n' "$last"
printf '| --- | --- | --- | --- | --- | --- |\n'
run() {  # name heads-args cp_comm
  local name=$1 heads=$2 comm=$3 tag="${1//\//-}-$3"
  local log="$work/$tag.log"
  # shellcheck disable=SC2086
  mpirun -np "$cp" --oversubscribe "${root[@]}" -x OMP_NUM_THREADS=1 "$build/examples/triad-train" \
    --config configs/llama_tiny.yaml --set data.train=data/tiny_train.bin --set train.steps=8 \
    --set model.seq_len="$seq" --set train.global_batch_size=1 --set train.micro_batch_size=1 \
    --set parallel.cp="$cp" --set parallel.cp_comm="$comm" --set log.interval=1 \
    --set output.dir="$work/$tag" $heads > "$log" 2>&1
  # The last 4 steps' mean, and each rank's forward and backward.
  local ms mem r0 r1
  ms=$(grep -o 'step     [5-8]/8 | .* \([0-9.]*\) ms |' "$log" | grep -o '[0-9.]* ms |' |
       awk '{s += $1; n++} END {printf "%.1f", s / n}')
  mem=$(grep 'step     8/8' "$log" | grep -o 'mem [0-9.]*' | awk '{print $2}')
  r0=$(grep 'rank   0 ms/step' "$log" | tail -1 | awk -F'|' '{print $1, $2}' | grep -o '[0-9.]*' |
       tail -2 | paste -sd/ -)
  r1=$(grep "rank $(printf '%3d' "$last") ms/step" "$log" | tail -1 | awk -F'|' '{print $1, $2}' | grep -o '[0-9.]*' |
       tail -2 | paste -sd/ -)
  printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$comm" "$ms" "$r0" "$r1" "$mem"
}
run 4/2 "" all_to_all
run 4/2 "" all_gather
run 4/2 "" ring
run 3/3 "--set model.n_head=3 --set model.n_kv_head=3 --set model.d_model=96" all_gather
run 3/3 "--set model.n_head=3 --set model.n_kv_head=3 --set model.d_model=96" ring
if [ "$cp" = 4 ]; then
  run 4/2 "--set parallel.cp_a2a=2" all_to_all+ring
fi
