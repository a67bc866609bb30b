#!/usr/bin/env bash
# Everything a GPU session runs, in one call (on the lent H200 through the
# device tool; works on any machine with a CUDA GPU):
#   1. builds with TRIAD_WITH_CUDA=ON for sm_90 (TRIAD_CUDA_ARCHS) into
#      BUILD_DIR (default build-gpu),
#   2. lists the visible GPUs,
#   3. runs every CTest test labelled gpu (a test that finds no GPU exits 77
#      and is reported as skipped, never as passed); when the suite fails,
#      runs each of its tests again in a process of its own with
#      CUDA_LAUNCH_BLOCKING=1 (one crash cannot hide the rest), and each
#      failing one under compute-sanitizer when the toolkit has it,
#   4. measures each kernel family against the device's ceilings,
#   5. runs the collective benchmark through the NCCL group (one rank),
#   6. trains GPT-2 124M and 350M (seq 1024, bf16) with Triad and with the
#      machine's PyTorch (bf16 autocast, torch.compile, flash attention) on
#      the same batch, reporting tokens/s and MFU, beside the planner's
#      prediction for the same run on one H200 (impl "planner"); and 124M
#      with model.recompute selective and full (memory saved, time spent)
#      and with bf16 moments and gradients (memory saved).
# Results go to OUT (default out/gpu; the device tool sets OUT and brings
# back at most 8 files, so there are 7): summary.log (what this prints),
# build.log, gpu_tests.log, kernels.jsonl, collectives_nccl.log,
# train.jsonl, torch.err. Exit status: non-zero when the build or a gpu
# test fails. Environment: STAGES (default "build tests kernels nccl train":
# the steps above to run, each timed), SKIP_BUILD=1 (drops "build"; reuses
# BUILD_DIR), RERUN_FAILED=0 (no per-test reruns and sanitizer runs after a
# failing gpu suite: they can take the rest of a 10-minute call),
# SKIP_TORCH=1, BATCH_124M / BATCH_350M, PEAK_TFLOPS (default
# 989), HBM_GBS (4800). Only the programs these steps run are built (not
# the simulator or the CPU test suite).
#
# One device call may run 10 minutes. When the whole script may not fit,
# split it over two calls made within the machine's warm period (the build
# directory stays there while it is warm):
#   STAGES="build tests" benchmarks/gpu/run_all.sh
#   STAGES="kernels nccl train" benchmarks/gpu/run_all.sh
#
# On the lent H200 (the device tool), whose image has CUDA, CMake, ninja and
# PyTorch but not Triad's libraries: run scripts/gpu_deps.sh here once (and
# scripts/check_libstdcxx13.sh: the machine builds with GCC 13), then
#   run(command="benchmarks/gpu/run_all.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
ARCHS=${TRIAD_CUDA_ARCHS:-90}
OUT=${OUT:-out/gpu}
PEAK=${PEAK_TFLOPS:-989}
HBM=${HBM_GBS:-4800}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/summary.log") 2>&1
tee_pid=$!
# Let tee write the last lines before the script (and the call) ends.
trap 'exec 1>&- 2>&-; wait "$tee_pid" 2>/dev/null' EXIT
status=0
STAGES=" ${STAGES:-build tests kernels nccl train} "
if [ "${SKIP_BUILD:-0}" = 1 ]; then STAGES=${STAGES// build / }; fi
want() { [[ "$STAGES" == *" $1 "* ]]; }
stage_start=$SECONDS
took() { echo "   ($1: $((SECONDS - stage_start)) s)"; stage_start=$SECONDS; }
echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), stages:$STAGES"

# A GPU machine without Debian's development packages (and no network): the
# .deb files scripts/gpu_deps.sh fetched into .deps/debs (carried along) are
# unpacked into a private prefix, never into /, and found from there.
if compgen -G ".deps/debs/*.deb" >/dev/null; then
  DEPS=${DEPS_PREFIX:-/tmp/triad-deps}
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  for deb in .deps/debs/*.deb; do dpkg -x "$deb" "$DEPS"; done
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  export CMAKE_PREFIX_PATH="$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/$multiarch:$DEPS/usr/lib/$multiarch/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== dependencies unpacked into $DEPS"
fi
# cuDNN (its fused attention): /usr/local/cuda's, else the wheel PyTorch
# brings (nvidia-cudnn), found through CUDNN_ROOT.
if [ -z "${CUDNN_ROOT:-}" ] && [ ! -e /usr/local/cuda/include/cudnn_graph.h ]; then
  CUDNN_ROOT=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
if [ -n "${CUDNN_ROOT:-}" ]; then
  export CUDNN_ROOT
  export LD_LIBRARY_PATH="$CUDNN_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== cuDNN from $CUDNN_ROOT"
fi
# Without MPI the build has a world of one rank (all one GPU can test).
if ! command -v mpirun >/dev/null 2>&1; then
  TRIAD_CMAKE_ARGS="-DTRIAD_WITH_MPI=OFF ${TRIAD_CMAKE_ARGS:-}"
fi

if want build; then
  echo "== build ($BUILD_DIR, sm_$ARCHS)"
  # TRIAD_USE_CUDNN is given every time: a build directory kept from an
  # earlier call may hold the OFF of that call's fallback below.
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIAD_WITH_CUDA=ON \
    -DTRIAD_CUDA_ARCHS="$ARCHS" -DTRIAD_USE_CUDNN="${TRIAD_USE_CUDNN:-ON}" \
    ${TRIAD_CMAKE_ARGS:-} >"$OUT/build.log" 2>&1 || {
    tail -20 "$OUT/build.log"; exit 1; }
  grep "triad: TRIAD_WITH_CUDA" "$OUT/build.log"
  if grep -q "cuDNN 9 not found" "$OUT/build.log"; then
    grep "cuDNN 9 not found" "$OUT/build.log"
    # What the cuDNN that was offered holds, for the next attempt.
    [ -n "${CUDNN_ROOT:-}" ] && find "$CUDNN_ROOT" -maxdepth 2 \( -name "*.h" -o -name "*.so*" \) | head -20
  fi
  targets=(triad-devices triad-plan triad_gpu_tests bench_kernels_gpu bench_collectives bench_train_gpu)
  grep -q "NCCL=ON" "$OUT/build.log" && targets+=(triad_collectives_nccl_tests)
  if ! cmake --build "$BUILD_DIR" -j "$(nproc)" -t "${targets[@]}" >>"$OUT/build.log" 2>&1; then
    grep -E "error|Error" "$OUT/build.log" | head -40
    # A cuDNN whose headers this code does not build against should not cost
    # the whole GPU session: say so and build the rest without it. Only a
    # failed cuDNN source counts (ninja's progress lines name them too).
    grep -qE "^FAILED: .*cudnn_attention" "$OUT/build.log" || exit 1
    echo "== the cuDNN attention did not build: rebuilding with TRIAD_USE_CUDNN=OFF"
    status=1
    { cmake -S . -B "$BUILD_DIR" -DTRIAD_USE_CUDNN=OFF &&
      cmake --build "$BUILD_DIR" -j "$(nproc)" -t "${targets[@]}"; } \
      >>"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | tail -40; exit 1; }
  fi
  echo "built"
  cp "$OUT/build.log" "$BUILD_DIR/run_all_build.log"  # for later calls' stages
  took build
fi
# What the build has (its configure summary), also in a later call.
build_log="$OUT/build.log"
[ -f "$build_log" ] || build_log="$BUILD_DIR/run_all_build.log"

echo "== devices"
"$BUILD_DIR/examples/triad-devices" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>/dev/null

if want tests; then
echo "== gpu tests"
gpu_log="$OUT/gpu_tests.log"
# (-V: every test's output, passing or not: the notes of the GEMM variants
# and the bf16 runs are the record even when nothing fails.)
if ! ctest --test-dir "$BUILD_DIR" -L gpu -V -j 1 --timeout 900 >"$gpu_log" 2>&1; then
  status=1
  tests_failed=1
  grep -oE "\[  FAILED  \] [^ ]+" "$gpu_log" | sort -u
fi
grep -E "\[ note \] (bf16, |gemm |verified |simt: |tensor_core: |cudnn: )" "$gpu_log" | sed 's/^[0-9]*: //'
if [ "${tests_failed:-0}" = 1 ] && [ "${RERUN_FAILED:-1}" = 1 ]; then
  tests=$("$BUILD_DIR/tests/triad_gpu_tests" --gtest_list_tests 2>/dev/null |
    awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}')
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  echo "== each gpu test in its own process (CUDA_LAUNCH_BLOCKING=1)" >>"$gpu_log"
  for t in $tests; do
    if CUDA_LAUNCH_BLOCKING=1 timeout 600 "$BUILD_DIR/tests/triad_gpu_tests" --gtest_filter="$t" \
      >>"$gpu_log" 2>&1; then
      echo "ok      $t"
    else
      echo "FAILED  $t"
      if [ -n "$sanitizer" ]; then
        echo "== compute-sanitizer: $t" >>"$gpu_log"
        timeout 600 "$sanitizer" --tool memcheck --print-limit 20 \
          "$BUILD_DIR/tests/triad_gpu_tests" --gtest_filter="$t" 2>&1 | tail -80 >>"$gpu_log"
      fi
    fi
  done
fi
# (ctest's line per test and its total; not the tests' own output.)
grep -E "^ *[0-9]+/[0-9]+ Test +#|tests passed|tests failed" "$gpu_log" | head -20
took tests
fi

if want kernels; then
echo "== kernels (B 8, T 1024, C 768, bf16)"
"$BUILD_DIR/benchmarks/bench_kernels_gpu" --hbm-gbs "$HBM" --peak-tflops "$PEAK" \
  >"$OUT/kernels.jsonl" || status=1  # (log lines on stderr stay out of the JSON)
cat "$OUT/kernels.jsonl"
took kernels
fi

if want nccl; then
echo "== NCCL collectives (world size 1: local in-place bandwidth only)"
"$BUILD_DIR/benchmarks/bench_collectives" --backend nccl --max-bytes 256M \
  >"$OUT/collectives_nccl.log" 2>&1 || status=1
tail -25 "$OUT/collectives_nccl.log"
took nccl
fi

if want train; then
echo "== training (seq 1024, bf16)"
: >"$OUT/train.jsonl"
: >"$OUT/torch.err"
for preset in 124m 350m; do
  # 16 sequences of 1024 tokens for both: a training micro-batch that fits
  # either model (350M: about 25 GB) and amortises the optimizer step.
  if [ "$preset" = 124m ]; then batch=${BATCH_124M:-16}; else batch=${BATCH_350M:-16}; fi
  # What the planner predicts for this run on one H200 (fused attention),
  # beside what it measures: the cost model's check on this GPU.
  model_file=configs/gpt2_124m.yaml
  [ "$preset" = 350m ] && model_file=configs/models/gpt2_350m.yaml
  if [ -x "$BUILD_DIR/examples/triad-plan" ]; then
    "$BUILD_DIR/examples/triad-plan" predict --model "$model_file" \
      --cluster configs/clusters/hgx_h200.yaml --gpus 1 --global-batch "$batch" --tp 1 --pp 1 \
      --micro-batch "$batch" --attention flash --json 2>>"$OUT/torch.err" |
      sed "s/^{/{\"impl\":\"planner\",\"preset\":\"$preset\",/" | tee -a "$OUT/train.jsonl"
  fi
  # (--profile-steps: three more steps with the device's time per op, where
  # the step's time goes, in the same JSON line as "op_profile".)
  "$BUILD_DIR/benchmarks/bench_train_gpu" --preset $preset --batch "$batch" --seq 1024 \
    --precision bf16 --peak-tflops "$PEAK" --profile-steps 3 | tee -a "$OUT/train.jsonl" ||
    status=1
  # GPT-2's own vocabulary (50257, odd): linear_cross_entropy's padded
  # logits rows should keep it at the padded 50304's speed.
  if [ "$preset" = 124m ]; then
    "$BUILD_DIR/benchmarks/bench_train_gpu" --preset $preset --batch "$batch" --seq 1024 \
      --precision bf16 --peak-tflops "$PEAK" --vocab 50257 | tee -a "$OUT/train.jsonl" || status=1
    # Activation recomputation: the device memory it saves (peak_memory_gib
    # against the run above) and the time it costs (tokens/s).
    for recompute in selective full; do
      "$BUILD_DIR/benchmarks/bench_train_gpu" --preset $preset --batch "$batch" --seq 1024 \
        --precision bf16 --peak-tflops "$PEAK" --recompute $recompute |
        tee -a "$OUT/train.jsonl" || status=1
    done
    # bf16 optimizer moments and gradients (train.moment_precision,
    # train.grad_precision): the device memory they save and their speed.
    "$BUILD_DIR/benchmarks/bench_train_gpu" --preset $preset --batch "$batch" --seq 1024 \
      --precision bf16 --peak-tflops "$PEAK" --moment-precision bf16 --grad-precision bf16 |
      tee -a "$OUT/train.jsonl" || status=1
    # A mixture of 8 experts, top 2, in every layer (model.moe): tokens/s
    # and MFU against the dense model's at twice its MLP FLOPs per token
    # (each layer's routing waits for the host once).
    "$BUILD_DIR/benchmarks/bench_train_gpu" --preset $preset --batch "$batch" --seq 1024 \
      --precision bf16 --peak-tflops "$PEAK" --experts 8 --top-k 2 --profile-steps 2 |
      tee -a "$OUT/train.jsonl" || status=1
  fi
  # cuDNN's faster, non-deterministic attention backward (what PyTorch's
  # flash attention does), when this build has cuDNN.
  if grep -q "cuDNN=ON" "$build_log" 2>/dev/null; then
    "$BUILD_DIR/benchmarks/bench_train_gpu" --preset $preset --batch "$batch" --seq 1024 \
      --precision bf16 --peak-tflops "$PEAK" --attention-nondeterministic |
      tee -a "$OUT/train.jsonl" || status=1
  fi
  if [ "${SKIP_TORCH:-0}" != 1 ]; then
    python3 benchmarks/gpu/train_gpu_torch.py --preset $preset --batch "$batch" --seq 1024 \
      --peak-tflops "$PEAK" 2>>"$OUT/torch.err" | tee -a "$OUT/train.jsonl" ||
      tail -5 "$OUT/torch.err"
  fi
done
took train
fi
echo "== done, status $status"
exit $status
