#!/usr/bin/env bash
# Fuzzes the readers of untrusted input (tests/fuzz/: safetensors and
# torch.save files, config.json, tokenizer.json, SentencePiece models, chat
# templates, training configs, indexed datasets) with libFuzzer, under
# AddressSanitizer and UBSan.
#
#   scripts/fuzz.sh [TARGET...] [-- SECONDS]    # default: every target, 60 s each
#
# Builds build-fuzz/ with clang (the library too, instrumented), then runs
# each target from its checked-in corpus (tests/fuzz/corpus/TARGET/) and the
# inputs earlier runs found (build-fuzz/corpus/TARGET/). An input that
# crashes, hangs (25 s), needs more than 2 GB or lets an exception other than
# triad::Error escape is saved as build-fuzz/findings/TARGET-*; once it is
# fixed, copy it into tests/fuzz/corpus/TARGET/ so the test suite's replay
# (fuzz.TARGET) keeps it fixed. Needs clang, libFuzzer and libomp
# (apt-get install clang libomp-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR_FUZZ:-build-fuzz}
jobs=${JOBS:-$(nproc)}
seconds=60
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) seconds=${2:?"-- needs the seconds per target"}; shift 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  read -r -a targets < <(sed -n 's/^set(TRIAD_FUZZ_TARGETS \(.*\))$/\1/p' tests/fuzz/CMakeLists.txt)
fi
flags="-g -O1 -Wno-pass-failed -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTRIAD_BUILD_FUZZERS=ON -DTRIAD_BUILD_TESTS=OFF -DTRIAD_BUILD_BENCHMARKS=OFF \
  -DTRIAD_WITH_CUDA=OFF -DTRIAD_WITH_MPI=OFF \
  "-DCMAKE_CXX_FLAGS=$flags -fsanitize=fuzzer-no-link" \
  "-DCMAKE_EXE_LINKER_FLAGS=$flags" "-DCMAKE_SHARED_LINKER_FLAGS=$flags" >/dev/null
cmake --build "$dir" -j "$jobs" --target "${targets[@]/#/fuzz_}"
mkdir -p "$dir/findings"
status=0
for t in "${targets[@]}"; do
  mkdir -p "$dir/corpus/$t"
  echo "== $t: $seconds s"
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$dir/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/findings/$t-" \
    "$dir/corpus/$t" "tests/fuzz/corpus/$t" || status=1
done
exit $status
