#!/usr/bin/env bash
# The README's two quick-start commands:
#   scripts/dev.sh train   install what is missing, build, train configs/gpt_tiny_3d.yaml on 8 ranks
#   scripts/dev.sh test    install what is missing, build, run the whole test suite
# Also: scripts/dev.sh train1 (the same model in one process) | deps | build | bench
#   | sanitize (AddressSanitizer and UBSan build in build-asan, CPU only, every suite;
#     SANITIZE_THREADS=1 adds ThreadSanitizer in build-tsan, SANITIZE_SIM=1 UBSan on the simulator)
# Environment: BUILD_DIR (default build), TRIAD_CMAKE_ARGS (extra cmake flags),
#   TRIAD_CUDA_ARCHS (default 80;90 where a GPU is present, 90 where none is).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=$(nproc)

PACKAGES=(build-essential cmake ninja-build pkg-config
          libspdlog-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
          libeigen3-dev nlohmann-json3-dev libcli11-dev libopenmpi-dev openmpi-bin
          python3 python3-torch python3-numpy python3-regex python3-sentencepiece python3-jinja2)
# Wanted but not needed: compressed text input (gzip, Zstandard). A build
# without them refuses such files by name, and their tests skip.
OPTIONAL_PACKAGES=(zlib1g-dev libzstd-dev)

missing_of() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

deps() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  local apt=(env DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends)
  local missing optional
  mapfile -t missing < <(missing_of "${PACKAGES[@]}")
  mapfile -t optional < <(missing_of "${OPTIONAL_PACKAGES[@]}")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    $sudo apt-get update -q
    "${apt[@]}" "${missing[@]}"
  fi
  if [ ${#optional[@]} -gt 0 ]; then
    # From the package cache if it has them, else after an update; without
    # either (no network), the build goes on without them.
    echo "installing (optional): ${optional[*]}"
    "${apt[@]}" "${optional[@]}" ||
      { $sudo apt-get update -q && "${apt[@]}" "${optional[@]}"; } ||
      echo "warning: could not install ${optional[*]}: compressed text input stays off"
  fi
}

# The CUDA architectures to build for: the default pair where a GPU is
# present; without one the kernels only have to compile and link (their tests
# run on the simulator), and sm_90 alone does that in half of nvcc's time —
# sm_80 compiles the same source (the kernels' one __CUDA_ARCH__ test splits
# below 800). TRIAD_CUDA_ARCHS, or -DTRIAD_CUDA_ARCHS in TRIAD_CMAKE_ARGS, wins.
cuda_archs() {
  if [ -n "${TRIAD_CUDA_ARCHS:-}" ]; then
    echo "$TRIAD_CUDA_ARCHS"
  elif compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    echo "80;90"
  else
    echo "90"
  fi
}

build() {
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DTRIAD_CUDA_ARCHS=$(cuda_archs)" \
    ${TRIAD_CMAKE_ARGS:-}
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

tiny_data() {
  mkdir -p data
  if [ ! -f data/tiny_train.bin ]; then
    "$BUILD_DIR/examples/triad-corpus" --output data/tiny.txt --bytes 2000000 --seed 1
    "$BUILD_DIR/examples/triad-tokenize" --input data/tiny.txt --output data/tiny_train.bin
  fi
  if [ ! -f data/tiny_val.bin ]; then  # validation text: another seed of the same grammar
    "$BUILD_DIR/examples/triad-corpus" --output data/tiny_val.txt --bytes 200000 --seed 2
    "$BUILD_DIR/examples/triad-tokenize" --input data/tiny_val.txt --output data/tiny_val.bin
  fi
}

# sanitized DIR CUDA FLAGS [CTEST ARGS...]: a Debug build in DIR with the
# sanitizer FLAGS (TRIAD_WITH_CUDA=CUDA), then its tests.
sanitized() {
  local dir=$1 cuda=$2 flags=$3
  # shellcheck disable=SC2086
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTRIAD_WITH_CUDA="$cuda" \
    "-DTRIAD_CUDA_ARCHS=$(cuda_archs)" \
    -DCMAKE_CXX_FLAGS="-O1 -g $flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$flags" ${TRIAD_CMAKE_ARGS:-}
  cmake --build "$dir" -j "$JOBS"
  UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --timeout 3600 "${@:4}"
}

case "${1:-}" in
  deps) deps ;;
  build) deps; build ;;
  train)
    # The tiny GPT on a 3D layout of 8 ranks (tp 2, pp 2, dp 2) on this machine.
    deps; build; tiny_data
    mpirun=(mpirun -np 8 --oversubscribe -x OMP_NUM_THREADS=1)
    [ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
    "${mpirun[@]}" "$BUILD_DIR/examples/triad-train" --config configs/gpt_tiny_3d.yaml "${@:2}"
    echo "a sample from the trained model:"
    "$BUILD_DIR/examples/triad-generate" --run out/gpt_tiny_3d --prompt "The " --tokens 200
    ;;
  train1)
    # The same model in one process.
    deps; build; tiny_data
    "$BUILD_DIR/examples/triad-train" --config configs/gpt_tiny.yaml --set data.val=data/tiny_val.bin \
      --set eval.interval=100 --set eval.batches=8 "${@:2}"
    ;;
  test)
    deps; build
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900
    ;;
  bench)
    deps; build
    benchmarks/run_cpu_benchmarks.sh "$BUILD_DIR"
    ;;
  sanitize)
    # Every suite under AddressSanitizer and UBSan (any finding fails its
    # test). CPU only: the CUDA simulator switches stacks under ASan's feet.
    # Not part of `test` (on 2 cores the build alone takes about 15 minutes).
    deps
    # (Leak checking off: MPI and OpenMP keep their allocations to exit.)
    ASAN_OPTIONS=detect_leaks=0 sanitized "${BUILD_DIR_ASAN:-build-asan}" OFF \
      "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    # SANITIZE_THREADS=1: also ThreadSanitizer (build-tsan, CPU only) over
    # the unit suites, which hold the threads Triad starts (the NCCL
    # watchdog's, background checkpoint writes, SIGTERM during them, the
    # tokenizer's workers), and the collectives, data- and pipeline-parallel
    # suites on 2 ranks. One OpenMP thread: libgomp is not built for TSan.
    if [ "${SANITIZE_THREADS:-0}" = 1 ]; then
      export TSAN_OPTIONS="suppressions=$PWD/scripts/tsan.supp" OMP_NUM_THREADS=1
      sanitized "${BUILD_DIR_TSAN:-build-tsan}" OFF "-fsanitize=thread" -L unit -E '^CpuParallelFor[.]'
      ctest --test-dir "${BUILD_DIR_TSAN:-build-tsan}" --output-on-failure -j "$JOBS" --timeout 3600 \
        -R '^mpi[.](collectives[.]np|data_parallel[.]dp|pipeline[.]pp)2$'
      unset TSAN_OPTIONS OMP_NUM_THREADS
    fi
    # SANITIZE_SIM=1: also the CUDA backend's kernels and host code on the
    # simulator under UBSan alone (CTest label sim).
    if [ "${SANITIZE_SIM:-0}" = 1 ]; then
      sanitized "${BUILD_DIR_UBSAN_SIM:-build-ubsan-sim}" ON \
        "-fsanitize=undefined -fno-sanitize-recover=undefined" -L sim
    fi
    ;;
  *)
    echo "usage: $0 train|train1|test|deps|build|bench|sanitize" >&2
    exit 2
    ;;
esac
