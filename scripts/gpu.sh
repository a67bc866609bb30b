#!/usr/bin/env bash
# Everything a GPU session runs, in one call (used on the lent H200 through
# the device tool; works on any machine with a CUDA GPU):
#   1. builds with TRIAD_WITH_CUDA=ON for the local GPU's architecture
#      (TRIAD_CUDA_ARCHS, default 90) into BUILD_DIR (default build-gpu),
#   2. lists the visible GPUs (triad-devices),
#   3. runs every CTest test labelled gpu (a test that finds no GPU exits 77
#      and is reported as skipped, never as passed),
#   4. runs each GPU benchmark script in benchmarks/gpu/ (when that folder
#      exists), writing its output under OUT (default out/gpu).
# Logs of every step go to OUT (on the device machine the tool sets OUT, so
# they come back with the run).
# Exit status: non-zero when the build or any gpu test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
ARCHS=${TRIAD_CUDA_ARCHS:-90}
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=$(nproc)

echo "== build ($BUILD_DIR, sm_$ARCHS)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIAD_WITH_CUDA=ON \
  -DTRIAD_CUDA_ARCHS="$ARCHS" ${TRIAD_CMAKE_ARGS:-} 2>&1 | tee "$OUT/configure.log" | tail -3
cmake --build "$BUILD_DIR" -j "$JOBS" 2>&1 | tee "$OUT/build.log" | tail -3

echo "== devices"
"$BUILD_DIR/examples/triad-devices" 2>&1 | tee "$OUT/devices.log" || true

echo "== gpu tests"
status=0
ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure -j 1 --timeout 900 \
  --output-junit "$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" || status=1

if [ -d benchmarks/gpu ]; then
  for bench in benchmarks/gpu/*.sh; do
    [ -e "$bench" ] || continue
    name=$(basename "$bench" .sh)
    echo "== benchmark $name"
    BUILD_DIR="$BUILD_DIR" OUT="$OUT" bash "$bench" 2>&1 | tee "$OUT/bench_$name.log" || status=1
  done
fi
exit $status
