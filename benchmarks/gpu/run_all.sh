#!/usr/bin/env bash
# Everything a GPU session runs, in one call (on the lent H200 through the
# device tool; works on any machine with a CUDA GPU):
#   1. builds with TRIAD_WITH_CUDA=ON for sm_90 (TRIAD_CUDA_ARCHS) into
#      BUILD_DIR (default build-gpu), or unpacks the programs `pack` built
#      on another machine from the same sources (below),
#   2. lists the visible GPUs,
#   3. runs every test labelled gpu (`gpu_test` lines below; a test that
#      finds no GPU exits 77 and is reported as skipped, never as passed;
#      last of all, each conformance test a crash kept from a result runs
#      again on its own, below),
#   4. measures each kernel family against the device's ceilings,
#   5. trains GPT-2 124M and 350M (seq 1024, bf16) with Triad and with the
#      machine's PyTorch (bf16 autocast, torch.compile, flash attention) on
#      the same batch, reporting tokens/s and MFU, beside the planner's
#      prediction for the same run on one such GPU (impl "planner"); then 124M
#      with GPT-2's own vocabulary, with model.recompute selective and full
#      (memory saved, time spent), with bf16 moments and gradients (memory
#      saved), as a mixture of experts, 350M with its products' algorithms
#      autotuned, 350M with its MLPs' first bias gradients from the
#      GELU-derivative GEMM's epilogue, 350M with its projections' bias
#      gradients from the add-norm backward, 350M with its bias gradients
#      from the weight GEMM's epilogue (none by the column-sum kernel), both
#      models with a step that never waits for the device (--sync-free),
#      both models with their passes captured as a CUDA graph (--cuda-graph),
#      350M with every one of those switches that made it faster alone, all
#      on at once, the example trainer (triad-train) on 350M's batch, a
#      mixture of SwiGLU experts (grouped products), a mixture under an
#      expert capacity with the router z-loss, the same padded to its
#      capacity (routed on the device) and captured as a CUDA graph, and both
#      models with cuDNN's non-deterministic attention backward, then every
#      run in one table (summarize_train.py),
#   6. runs the collective benchmark through the NCCL group (one rank),
#   7. profiles Triad's memory-bound kernels of a 350M step with Nsight
#      Compute (where the machine's ncu reads the counters): each one's
#      memory and SM throughput, occupancy and what its warps wait on.
# Results go to OUT (default out/gpu; the device tool sets OUT and brings
# back at most 8 files): summary.log (what this prints),
# build.log, gpu_tests.log, kernels.jsonl, collectives_nccl.log,
# train.jsonl, torch.err, ncu.csv. Exit status: non-zero when the build or a gpu
# test fails, or a step ran out of the budget.
#
# Environment: STAGES (default "build tests kernels nccl train profile": the steps
# above to run, each timed, always in the order above; "pack" is the one
# below), SKIP_BUILD=1 (drops
# "build"; reuses BUILD_DIR), BUDGET_S (the seconds the whole script may
# take; see below), RERUN_FAILED=0 (no reruns of the tests a crashed
# suite did not finish), SKIP_TORCH=1, BATCH_124M / BATCH_350M, PEAK_TFLOPS and
# HBM_GBS (the device's dense bf16 peak and memory bandwidth: by default
# from its name, below), PREBUILT (default .gpu-prebuilt). Only the programs these
# steps run are built (not the simulator or the CPU test suite).
#
# A lent GPU's time is short (15 minutes a session, the machine's start
# included), so the GPU machine need not compile: here, on any Debian
# machine with the CUDA toolkit and no GPU,
#   STAGES=pack benchmarks/gpu/run_all.sh     # about 8 minutes on 2 cores, 10 MB
# builds the same programs (sm_90; without MPI, gzip or zstd, which the GPU
# machine lacks) into build-gpu-pack, checks every kernel's registers
# (scripts/kernel_resources.py, 1.5 minutes: a kernel of more than 64
# registers a thread must declare __launch_bounds__) and packs them into
# $PREBUILT/triad-gpu.tar.xz, stamped with a hash of the sources they were
# built from (CMakeLists.txt, cmake/, src/, include/, kernels/, tests/,
# benchmarks/, examples/; not their .py, .sh and .md files, which are never
# compiled in). The build step there unpacks the pack when its
# stamp is the sources' own and compiles only when it is not (it says
# which). So, with scripts/gpu_deps.sh run here once for the libraries the
# programs load (and for a build there),
#   run(command="BUDGET_S=540 benchmarks/gpu/run_all.sh", carry=[".deps", ".gpu-prebuilt"],
#       timeout_s=600, kind="nvidia-h200")
# (kind: the tool's first call gets an H100 unless it names the H200, the
# GPU the targets and every earlier run are of; on an H100 the script takes
# an H100's ceilings and says the targets are not its.)
# With BUDGET_S the steps run in the order above, which is the order of what
# matters most, each under a timeout of the time left (less RESERVE_S,
# default 20, for the last lines); a step that would not fit its usual time
# (NEED_* below) is skipped, and the end of summary.log names what was
# skipped for a second call (STAGES, SKIP_BUILD=1) made while the machine is
# still warm.
#
# On the lent H200 (the device tool), whose image has CUDA, CMake, ninja and
# PyTorch but not Triad's libraries: run scripts/gpu_deps.sh here once, and
# scripts/check_libstdcxx13.sh (the machine builds with GCC 13) when it may
# have to compile.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
STAGES=" ${STAGES:-build tests kernels nccl train profile} "
if [ "${SKIP_BUILD:-0}" = 1 ]; then STAGES=${STAGES// build / }; fi
want() { [[ "$STAGES" == *" $1 "* ]]; }
if want pack; then
  BUILD_DIR=${BUILD_DIR:-build-gpu-pack}
  # Only what every GPU machine has: no MPI (one GPU is a world of one), no
  # gzip or zstd (compressed text input; none of these programs reads it).
  TRIAD_CMAKE_ARGS="-DTRIAD_WITH_MPI=OFF -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON -DTRIAD_ZSTD_LIBRARY=OFF ${TRIAD_CMAKE_ARGS:-}"
fi
BUILD_DIR=${BUILD_DIR:-build-gpu}
ARCHS=${TRIAD_CUDA_ARCHS:-90}
OUT=${OUT:-out/gpu}
PEAK=${PEAK_TFLOPS:-}
HBM=${HBM_GBS:-}
PREBUILT=${PREBUILT:-.gpu-prebuilt}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/summary.log") 2>&1
tee_pid=$!
# Let tee write the last lines before the script (and the call) ends.
trap 'exec 1>&- 2>&-; wait "$tee_pid" 2>/dev/null' EXIT
status=0
stage_start=$SECONDS
took() { echo "   ($1: $((SECONDS - stage_start)) s)"; stage_start=$SECONDS; }

# The budget (BUDGET_S): seconds left for a step, the reserve kept back.
left() {
  if [ -n "${BUDGET_S:-}" ]; then
    echo $((BUDGET_S - SECONDS - ${RESERVE_S:-20}))
  else
    echo 86400
  fi
}
skipped=()
# fits NEED WHAT: whether a step of about NEED seconds fits what is left; if
# not, WHAT is named as skipped (here and at the end).
fits() {
  local l
  l=$(left)
  if [ "$l" -lt "$1" ]; then
    echo "   (skipped, ${l} s of the budget left, needs about $1 s: $2)"
    skipped+=("$2")
    return 1
  fi
}
# bounded CMD...: CMD under a timeout of the budget left (exit 124 if it
# ran out; said by the caller).
bounded() {
  local l
  l=$(left)
  [ "$l" -ge 1 ] || l=1
  timeout --kill-after=10 "$l" "$@"
}
# Typical seconds of the steps a budget skips, as the H200 took them on
# 2026-12-04 (docs/benchmarks.md): the gpu tests 159-168 s, the kernels 19 s,
# the NCCL bandwidth 8 s, one Triad training run 3-8 s, one PyTorch run
# (torch.compile included) 45-55 s; the whole script 331 s.
NEED_TESTS=${NEED_TESTS:-175}
NEED_KERNELS=${NEED_KERNELS:-25}
NEED_NCCL=${NEED_NCCL:-10}
NEED_TRIAD_RUN=${NEED_TRIAD_RUN:-10}
NEED_TORCH_RUN=${NEED_TORCH_RUN:-60}
# (Not yet timed on a GPU: 350M's start, 12 steps and its 0.7 GB of weights
# written, guessed from bench_train_gpu's runs.)
NEED_TRAINER_RUN=${NEED_TRAINER_RUN:-30}
# (Not yet timed either: ncu over bench_kernels_gpu, about 10 kernels
# profiled, guessed.)
NEED_PROFILE=${NEED_PROFILE:-60}

# A hash of the sources the programs are built from (a pack is unpacked only
# where it is the same).
stamp=$(benchmarks/gpu/source_stamp.sh)
echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)," \
  "sources $stamp, stages:$STAGES${BUDGET_S:+, budget ${BUDGET_S} s}"

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

# The programs the steps run, under BUILD_DIR (all that a pack holds).
programs=(examples/triad-devices examples/triad-plan examples/triad-train tests/triad_gpu_tests
          benchmarks/bench_kernels_gpu benchmarks/bench_collectives benchmarks/bench_train_gpu)
compile() {
  echo "== build ($BUILD_DIR, sm_$ARCHS)"
  # TRIAD_USE_CUDNN is given every time: a build directory kept from an
  # earlier call may hold the OFF of that call's fallback below.
  # shellcheck disable=SC2086
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
  # (The NCCL suite exists only where NCCL was found; a pack then holds it.)
  grep -q "NCCL=ON" "$OUT/build.log" && programs+=(tests/triad_collectives_nccl_tests)
  local targets=("${programs[@]##*/}")
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
  rm -f "$BUILD_DIR/unpacked"
  cp "$OUT/build.log" "$BUILD_DIR/run_all_build.log"  # for later calls' stages
}

if want build || want pack; then
  pack="$PREBUILT/triad-gpu.tar.xz"
  if want build && ! want pack && [ -f "$pack" ] && [ "$(cat "$PREBUILT/stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "== build: unpacking $pack (made from these sources, $stamp)"
    mkdir -p "$BUILD_DIR"
    tar -C "$BUILD_DIR" -xJf "$pack" || exit 1
    touch "$BUILD_DIR/unpacked"
    grep "triad: TRIAD_WITH_CUDA" "$BUILD_DIR/run_all_build.log"
    cp "$BUILD_DIR/run_all_build.log" "$OUT/build.log"
  else
    if want build && [ -f "$pack" ]; then
      echo "== $pack was made from other sources ($(cat "$PREBUILT/stamp" 2>/dev/null)," \
        "these are $stamp): compiling"
    fi
    compile
  fi
  if want pack; then
    # What the simulator cannot see: a kernel with no __launch_bounds__
    # whose registers would refuse a large block on the GPU (and the
    # kernels that spill), from ptxas, before a GPU's time is spent on it.
    echo "== kernel resources (scripts/kernel_resources.py: registers, spills)"
    python3 scripts/kernel_resources.py --build "$BUILD_DIR" >"$BUILD_DIR/kernel_resources.md" || {
      grep -E "^(error|kernel_resources)" "$BUILD_DIR/kernel_resources.md"; exit 1; }
    tail -1 "$BUILD_DIR/kernel_resources.md"
    mkdir -p "$PREBUILT"
    rm -f "$pack" "$PREBUILT/stamp"
    # (One solid stream: the programs share most of their bytes, the library's.)
    XZ_OPT=-9 tar -C "$BUILD_DIR" -cJf "$pack" run_all_build.log "${programs[@]}" || exit 1
    echo "$stamp" >"$PREBUILT/stamp"
    echo "== packed $(du -h "$pack" | cut -f1) into $pack (sources $stamp); carry $PREBUILT and .deps"
  fi
  took build
fi
# Programs unpacked from a pack (in this call or, with SKIP_BUILD=1, an
# earlier one) look for the CUDA runtime and NCCL where the packing machine
# had them; here, also the toolkit's folder, then PyTorch's NCCL wheel.
if [ -f "$BUILD_DIR/unpacked" ]; then
  nccl_wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null || true)
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64${nccl_wheel:+:$nccl_wheel}"
  echo "== programs from a pack: the CUDA runtime and NCCL also from /usr/local/cuda/lib64${nccl_wheel:+ and $nccl_wheel}"
fi
# What the build has (its configure summary), also in a later call.
build_log="$OUT/build.log"
[ -f "$build_log" ] || build_log="$BUILD_DIR/run_all_build.log"

if want tests || want kernels || want nccl || want train || want profile; then
  echo "== devices"
  "$BUILD_DIR/examples/triad-devices" 2>&1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>/dev/null
# The device's ceilings (the kernels' bandwidth, MFU's peak) and the
# planner's cluster, by the GPU's name: the device tool lends H100s as well
# as H200s, and a number against the wrong ceiling misleads. #7's targets
# (50% MFU on 350M, 1.1x PyTorch) are an H200's: a run elsewhere says so.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
h100=configs/clusters/dgx_h100.yaml
case "$gpu_name" in
  *H200*) hbm=4800 peak=989 cluster=configs/clusters/hgx_h200.yaml ;;
  *H100*PCIe*) hbm=2000 peak=756 cluster=$h100 ;;
  *H100*NVL*) hbm=3900 peak=835 cluster=$h100 ;;
  *H100*) hbm=3350 peak=989 cluster=$h100 ;;  # SXM, HBM3
  *) hbm=4800 peak=989 cluster=configs/clusters/hgx_h200.yaml
    echo "== unknown GPU '${gpu_name:-none seen}': an H200's ceilings assumed (PEAK_TFLOPS, HBM_GBS)" ;;
esac
HBM=${HBM:-$hbm}
PEAK=${PEAK:-$peak}
echo "== ceilings: ${HBM} GB/s of memory bandwidth, ${PEAK} TFLOP/s dense bf16${gpu_name:+ ($gpu_name)};" \
  "planner cluster $cluster"
[[ "$gpu_name" == *H200* ]] ||
  echo "   (not an H200: the targets of 50% MFU on 350M and 1.1x PyTorch are an H200's)"
fi

if want tests && fits "$NEED_TESTS" "STAGES=tests"; then
echo "== gpu tests"
gpu_log="$OUT/gpu_tests.log"
: >"$gpu_log"
# gpu_test NAME COMMAND...: one test of the CTest label gpu (tests/CMakeLists.txt's
# triad_gpu_test; a test there checks that these lines name every one of
# them with its command), its whole output kept: the notes of the GEMM
# variants and the bf16 runs are the record even when nothing fails.
gpu_test() {
  local name=$1 rc
  shift
  echo "== $name: $*" >>"$gpu_log"
  bounded "$@" >>"$gpu_log" 2>&1
  rc=$?
  case $rc in
    0) echo "passed   $name" ;;
    77) echo "skipped  $name (no GPU)" ;;
    124 | 137) echo "TIMEOUT  $name (the budget ran out)"; status=1; tests_failed=1 ;;
    *) echo "FAILED   $name (exit $rc)"; status=1; tests_failed=1 ;;
  esac
}
gpu_test gpu.devices "$BUILD_DIR/examples/triad-devices" --require
gpu_test gpu.conformance "$BUILD_DIR/tests/triad_gpu_tests"
if [ -x "$BUILD_DIR/tests/triad_collectives_nccl_tests" ]; then
  gpu_test gpu.nccl_collectives "$BUILD_DIR/tests/triad_collectives_nccl_tests"
fi
grep -oE "\[  FAILED  \] [^ ]+" "$gpu_log" | sort -u
grep -E "\[ note \] (bf16, |gemm |verified |simt: |tensor_core: |cudnn: )" "$gpu_log"
took tests
fi

if want kernels && fits "$NEED_KERNELS" "STAGES=kernels"; then
echo "== kernels (B 8, T 1024, C 768, bf16)"
# (log lines on stderr stay out of the JSON)
bounded "$BUILD_DIR/benchmarks/bench_kernels_gpu" --hbm-gbs "$HBM" --peak-tflops "$PEAK" \
  >"$OUT/kernels.jsonl" || status=1
cat "$OUT/kernels.jsonl"
took kernels
fi

# bench_train ARGS...: one Triad training run, its JSON line into train.jsonl.
bench_train() {
  fits "$NEED_TRIAD_RUN" "bench_train_gpu $*" || return 0
  bounded "$BUILD_DIR/benchmarks/bench_train_gpu" --seq 1024 --precision bf16 \
    --peak-tflops "$PEAK" "$@" | tee -a "$OUT/train.jsonl"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "   (failed: bench_train_gpu $*)"; status=1; }
}
batch_of() { if [ "$1" = 124m ]; then echo "${BATCH_124M:-16}"; else echo "${BATCH_350M:-16}"; fi; }

if want train; then
echo "== training (seq 1024, bf16${gpu_name:+, $gpu_name})"
: >"$OUT/train.jsonl"
: >"$OUT/torch.err"
# First what the targets are measured on, for both models; then the rest.
for preset in 124m 350m; do
  # 16 sequences of 1024 tokens for both: a training micro-batch that fits
  # either model (350M: about 25 GB) and amortises the optimizer step.
  batch=$(batch_of $preset)
  # What the planner predicts for this run on one of this GPU (its
  # cluster file; fused attention), beside what it measures: the cost
  # model's check on this GPU.
  model_file=configs/gpt2_124m.yaml
  [ "$preset" = 350m ] && model_file=configs/models/gpt2_350m.yaml
  if [ -x "$BUILD_DIR/examples/triad-plan" ]; then
    "$BUILD_DIR/examples/triad-plan" predict --model "$model_file" \
      --cluster "$cluster" --gpus 1 --global-batch "$batch" --tp 1 --pp 1 \
      --micro-batch "$batch" --attention flash --json 2>>"$OUT/torch.err" |
      sed "s/^{/{\"impl\":\"planner\",\"preset\":\"$preset\",/" | tee -a "$OUT/train.jsonl"
  fi
  # (--profile-steps: three more steps with the device's time per op, where
  # the step's time goes, in the same JSON line as "op_profile".)
  bench_train --preset $preset --batch "$batch" --profile-steps 3
  if [ "${SKIP_TORCH:-0}" != 1 ] && fits "$NEED_TORCH_RUN" "PyTorch $preset"; then
    PYTHONUNBUFFERED=1 bounded python3 benchmarks/gpu/train_gpu_torch.py --preset $preset \
      --batch "$batch" --seq 1024 --peak-tflops "$PEAK" 2>>"$OUT/torch.err" |
      tee -a "$OUT/train.jsonl"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "   (PyTorch $preset failed)"; tail -5 "$OUT/torch.err"; }
  fi
done
# 350M with every product's algorithm timed among cuBLASLt's first 8
# candidates (cuda::GemmSettings::autotune; once per distinct product, in
# the warm-up): "gemm_autotune" in its JSON line says how many products
# another algorithm won and the time of one call of each before and after.
bench_train --preset 350m --batch "$(batch_of 350m)" --gemm-autotune 8 --profile-steps 3
# 350M with the MLPs' first bias gradients from the GELU-derivative
# products' epilogue (DGELU_BGRAD, sums in f32), not the column-sum kernel:
# its profile's gelu_linear_input_grad_bias_sums against the default run's
# gelu_linear_input_grad plus the 4C-wide sum_rows_into calls.
bench_train --preset 350m --batch "$(batch_of 350m)" --dgelu-bias-grad-epilogue --profile-steps 3
# 350M with the output projections' bias gradients from the add-norm
# backward's sums (cuda::set_add_norm_bias_sums), not the column-sum kernel:
# its layer_norm_backward_dx_sums against the default run's
# layer_norm_backward plus the C-wide sum_rows_into calls.
bench_train --preset 350m --batch "$(batch_of 350m)" --add-norm-bias-sums --profile-steps 3
# 350M with its bias gradients from the weight gradients' GEMM epilogue
# (BGRADB), not the column-sum kernel: on 2026-12-04 it cost 0.6 ms a step.
bench_train --preset 350m --batch "$(batch_of 350m)" --bias-grad-epilogue
# Both models with a step that never waits for the device (--sync-free:
# clipping's coefficient read by the AdamW kernels, the loss read after the
# timed steps), as PyTorch's loop runs: the default reads the norm and the
# loss each step, as triad-train does.
for preset in 124m 350m; do
  bench_train --preset $preset --batch "$(batch_of $preset)" --sync-free
done
# Both models with their forward and backward passes captured once and
# replayed as one launch a step (--cuda-graph): what the launch gaps and
# the graph estimate above predict it saves.
for preset in 124m 350m; do
  bench_train --preset $preset --batch "$(batch_of $preset)" --cuda-graph
done
# 350M with the LayerNorm backward's column sums in each lane's registers
# (cuda::set_norm_backward_register_sums), not its warp's shared memory:
# its layer_norm_backward against the default run's (bench_kernels_gpu's
# *_register_sums rows time the kernel alone; last of the switches, as the
# newest, should the budget run out).
bench_train --preset 350m --batch "$(batch_of 350m)" --norm-backward-register-sums --profile-steps 3
# 350M with the MLPs' first products' GELU out of their epilogue (bias
# alone in it, then the GELU kernel: cuda::GemmSettings::gelu_epilogue
# false): its linear_bias against the default run's linear_bias_gelu, less
# the gelu_forward calls it adds.
bench_train --preset 350m --batch "$(batch_of 350m)" --gelu-apart --profile-steps 3
# 350M with every switch above that made it faster alone (by at least
# MIN_GAIN_PCT, default 0.2%, against its first run), all on at once: the
# step the defaults would give with them, measured in this call, so that
# making them the defaults needs no second one.
best=$(python3 benchmarks/gpu/summarize_train.py --helpful-switches 350m \
  --min-gain "${MIN_GAIN_PCT:-0.2}" "$OUT/train.jsonl")
if [ "$(grep -o -- "--" <<<"$best" | wc -l)" -ge 2 ]; then
  echo "   (350M with every switch that made it faster alone: $best)"
  # shellcheck disable=SC2086
  bench_train --preset 350m --batch "$(batch_of 350m)" $best --profile-steps 3
else
  echo "   (fewer than two switches made 350M faster alone${best:+ ($best)}: no run of them together)"
fi
# The example trainer on 350M's batch (benchmarks/gpu/trainer_350m.yaml, 12
# steps of random tokens): what a user of triad-train gets, the batches
# drawn from a file and the loss and the norm read every step, beside
# bench_train_gpu's step (the table's "triad-train" row, against the first
# 350M run). Its files stay out of OUT (only 8 come back).
if [ ! -x "$BUILD_DIR/examples/triad-train" ]; then
  echo "   (no triad-train in $BUILD_DIR: a pack from before it joined; the trainer's row left out)"
else
  # Twice: as configured, and with its passes captured (train.cuda_graph).
  for graph in false true; do
    fits "$NEED_TRAINER_RUN" "triad-train 350m (train.cuda_graph $graph)" || continue
    trainer_dir="$BUILD_DIR/trainer_run"
    rm -rf "$trainer_dir" && mkdir -p "$trainer_dir"
    batch=$(batch_of 350m)
    graph_flag=""
    [ "$graph" = true ] && graph_flag="--cuda-graph"
    python3 benchmarks/gpu/trainer_step_time.py shard "$trainer_dir/tokens.bin" \
      --tokens $((14 * batch * 1025)) --vocab 50257 &&
      bounded "$BUILD_DIR/examples/triad-train" --config benchmarks/gpu/trainer_350m.yaml \
        --set train.global_batch_size="$batch" --set train.micro_batch_size="$batch" \
        --set train.cuda_graph=$graph \
        --set data.train="$trainer_dir/tokens.bin" --set output.dir="$trainer_dir/out" \
        --set log.peak_tflops="$PEAK" >"$trainer_dir/train.log" 2>&1 &&
      python3 benchmarks/gpu/trainer_step_time.py summary "$trainer_dir/out/metrics.jsonl" \
        --preset 350m --batch "$batch" --seq 1024 $graph_flag | tee -a "$OUT/train.jsonl"
    [ "${PIPESTATUS[0]}" = 0 ] || {
      echo "   (triad-train 350m, train.cuda_graph $graph, failed)"
      tail -5 "$trainer_dir/train.log"
      status=1
    }
  done
fi
batch=$(batch_of 124m)
# GPT-2's own vocabulary (50257, odd): linear_cross_entropy's padded logits
# rows and zero-padded weight copy keep it near the padded 50304's speed
# (2026-12-04: 31.4 ms against 30.5; 50.0 ms before the weight copy).
bench_train --preset 124m --batch "$batch" --vocab 50257 --profile-steps 2
# Activation recomputation: the device memory it saves (peak_memory_gib
# against the first run) and the time it costs (tokens/s).
for recompute in selective full; do
  bench_train --preset 124m --batch "$batch" --recompute $recompute
done
# bf16 optimizer moments and gradients (train.moment_precision,
# train.grad_precision): the device memory they save and their speed.
bench_train --preset 124m --batch "$batch" --moment-precision bf16 --grad-precision bf16
# A mixture of 8 experts, top 2, in every layer (model.moe): tokens/s and
# MFU against the dense model's at twice its MLP FLOPs per token. Dropless:
# its rows grouped and its experts' products sized on the device (Triad's
# grouped kernels, no wait); then routed on the host, a wait a layer and
# cuBLASLt's products on each expert's rows (--host-routing, the way before
# 2026-12-08); then captured as a CUDA graph.
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --profile-steps 2
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --host-routing --profile-steps 2
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --cuda-graph
# The same with SwiGLU experts (--activation swiglu), on the device and
# routed on the host (there two grouped products over their rows,
# grouped_linear with host counts, no split or concat).
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --activation swiglu \
  --profile-steps 2
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --activation swiglu \
  --host-routing --profile-steps 2
# The same under an expert capacity (1.25 balanced shares) with the router
# z-loss: both are chosen and computed on the device and read in the
# layer's one copy (N x k scores and one value, not N x E matrices).
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --capacity-factor 1.25 \
  --moe-z-loss 0.001 --profile-steps 2
# The same padded to its capacity (model.moe.pad_to_capacity): routed on
# the device with no wait, every expert's products one shape each step;
# then captured as a CUDA graph.
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --capacity-factor 1.25 \
  --moe-z-loss 0.001 --pad-to-capacity --profile-steps 2
bench_train --preset 124m --batch "$batch" --experts 8 --top-k 2 --capacity-factor 1.25 \
  --moe-z-loss 0.001 --pad-to-capacity --cuda-graph
# cuDNN's faster, non-deterministic attention backward (what PyTorch's
# flash attention does), when this build has cuDNN.
if grep -q "cuDNN=ON" "$build_log" 2>/dev/null; then
  for preset in 124m 350m; do
    bench_train --preset $preset --batch "$(batch_of $preset)" --attention-nondeterministic
  done
fi
# Every run in one table, each against PyTorch and its model's first
# (default) run: what decides whether a switch becomes a default.
echo "== training runs side by side"
python3 benchmarks/gpu/summarize_train.py "$OUT/train.jsonl" ||
  echo "   (summarize_train.py failed; train.jsonl holds every run)"
# What a CUDA graph of each step could save at most (bench_kernels_gpu's
# launch-gap probe times the profiled runs' backend calls a step).
if [ -s "$OUT/kernels.jsonl" ]; then
  echo "== what a CUDA graph of the step could save"
  python3 benchmarks/gpu/summarize_train.py --graph-estimate "$OUT/kernels.jsonl" "$OUT/train.jsonl" ||
    echo "   (summarize_train.py --graph-estimate failed)"
fi
took train
fi

# The NCCL group at world size 1 says least (local bandwidth only): last.
if want nccl && fits "$NEED_NCCL" "STAGES=nccl"; then
echo "== NCCL collectives (world size 1: local in-place bandwidth only)"
bounded "$BUILD_DIR/benchmarks/bench_collectives" --backend nccl --max-bytes 256M \
  >"$OUT/collectives_nccl.log" 2>&1 || status=1
tail -25 "$OUT/collectives_nccl.log"
took nccl
fi

# Nsight Compute's view of the kernels of Triad's own that a 350M step
# spends most of its memory-bound time in (the norms, the bias gradients'
# column sums, AdamW and the gradient norm), and Triad's tensor-core
# attention (what packed documents run): bench_kernels_gpu at 350M's
# width and batch, each kernel's second call (the first is its warm-up)
# profiled once, with the clocks left alone (METHOD.md). ncu.csv holds, per
# kernel: its DRAM and SM throughput against the peak, registers and
# occupancy, and the warp states its time went to. Where ncu cannot read
# the counters (gVisor) it says so and the step ends.
if want profile && fits "$NEED_PROFILE" "STAGES=profile"; then
  ncu=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
  if [ -z "$ncu" ]; then
    echo "== Nsight Compute: no ncu on this machine"
  else
    echo "== Nsight Compute: the memory-bound kernels of a 350M step (ncu.csv)"
    report=$(mktemp -d)/kernels
    # (ncu's own messages only, not the bench's JSON lines or its log.)
    bounded "$ncu" --clock-control none -f -o "$report" \
      --kernel-id "::regex:^(ln_|reduce_columns|adamw|sum_squares|sum_partials|attn_(forward|dq|dkdv)_tc):2" \
      --section SpeedOfLight --section LaunchStats --section Occupancy \
      --section WarpStateStats --section MemoryWorkloadAnalysis \
      "$BUILD_DIR/benchmarks/bench_kernels_gpu" --iters 1 --no-sweep --batch 16 \
      --d-model 1024 --heads 16 --hbm-gbs "$HBM" --peak-tflops "$PEAK" 2>&1 |
      grep -E "^==(PROF|ERROR|WARNING)==" | grep -v "Profiling \"" | head -20
    if [ -f "$report.ncu-rep" ]; then
      "$ncu" --import "$report.ncu-rep" --csv --page details >"$OUT/ncu.csv" 2>&1 || status=1
      echo "   $(grep -c '"Duration"' "$OUT/ncu.csv") kernels profiled"
      # Each kernel's time and DRAM throughput at a glance.
      python3 - "$OUT/ncu.csv" <<'PY' || true
import csv, sys
shown = ("Duration", "DRAM Throughput", "Compute (SM) Throughput", "Achieved Occupancy",
         "Registers Per Thread")
seen = {}
for r in csv.DictReader(open(sys.argv[1])):
    # The kernel's own name (no namespaces, return type or parameters)
    # with its template arguments, shortened.
    full = r.get("Kernel Name", "").replace("(anonymous namespace)", "").split("(")[0]
    base, _, args = full.partition("<")
    name = base.split("::")[-1].split(" ")[-1] + (("<" + args)[:40] if args else "")
    if r.get("Metric Name") in shown:
        value = (r.get("Metric Value", "") + " " + r.get("Metric Unit", "")).strip()
        seen.setdefault((r.get("ID"), name), {})[r["Metric Name"]] = value
for (_, name), m in seen.items():
    print(f"   {name}: " + ", ".join(f"{k} {v}" for k, v in m.items()))
PY
    else
      echo "   (no report: ncu could not profile here)"
    fi
  fi
  took profile
fi

# Last, with what the budget leaves: the conformance tests that the suite
# did not take to a result (a crash or a sticky CUDA error ends the
# process, hiding the tests after it), each again in a process of its own
# with CUDA_LAUNCH_BLOCKING=1, and those that fail there under
# compute-sanitizer when the toolkit has it. (A test that failed on its own
# terms already said why in gpu_tests.log.)
if [ "${tests_failed:-0}" = 1 ] && [ "${RERUN_FAILED:-1}" = 1 ]; then
  echo "== conformance tests the suite did not finish, each in its own process"
  finished=$(grep -oE '^\[ +(OK|FAILED) +\] [^ ,]+' "$gpu_log" | awk '{print $NF}' | sort -u)
  tests=$("$BUILD_DIR/tests/triad_gpu_tests" --gtest_list_tests 2>/dev/null |
    awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}')
  sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer ||
    ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)}
  echo "== the tests the suite did not finish, one at a time (CUDA_LAUNCH_BLOCKING=1)" >>"$gpu_log"
  for t in $tests; do
    grep -qxF "$t" <<<"$finished" && continue
    fits 30 "the rest of the reruns, from $t" || break
    if CUDA_LAUNCH_BLOCKING=1 bounded "$BUILD_DIR/tests/triad_gpu_tests" --gtest_filter="$t" \
      >>"$gpu_log" 2>&1; then
      echo "ok      $t"
    else
      echo "FAILED  $t"
      if [ -n "$sanitizer" ] && fits 60 "compute-sanitizer on $t"; then
        echo "== compute-sanitizer: $t" >>"$gpu_log"
        bounded "$sanitizer" --tool memcheck --print-limit 20 \
          "$BUILD_DIR/tests/triad_gpu_tests" --gtest_filter="$t" 2>&1 | tail -80 >>"$gpu_log"
      fi
    fi
  done
fi

if [ ${#skipped[@]} -gt 0 ]; then
  status=1
  echo "== skipped for the budget (run them in a second call, SKIP_BUILD=1):"
  printf '   %s\n' "${skipped[@]}"
fi
echo "== done, status $status, $SECONDS s"
exit $status
