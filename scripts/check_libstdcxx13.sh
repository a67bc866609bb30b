#!/usr/bin/env bash
# Compiles every C++ source of a build (its compile_commands.json, default
# build-ci/, so the CUDA kernels too through the simulator's rewritten
# copies) against GCC 13's C++ library headers, syntax only, and lists the
# files that fail. The lent GPU machine builds with GCC 13, whose headers no
# longer bring in <cstdint> or <cstdio> by the way, while Debian bookworm's
# GCC 12 does: a missing include there fails the GPU call's build (it did
# once, in the first GPU session). Run it before a GPU call.
#
# Needs the network once: libstdc++-13-dev comes from Debian trixie into
# CACHE (default /tmp/triad-libstdcxx13), never into /. Exit status: the
# number of failing files (0: all compile).
#   scripts/check_libstdcxx13.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-ci}
CACHE=${CACHE:-/tmp/triad-libstdcxx13}
[ -f "$BUILD_DIR/compile_commands.json" ] || {
  echo "no $BUILD_DIR/compile_commands.json: configure that build first" >&2
  exit 1
}
headers="$CACHE/root/usr/include"
if [ ! -d "$headers/c++/13" ]; then
  mkdir -p "$CACHE/lists/partial" "$CACHE/debs"
  echo "deb http://deb.debian.org/debian trixie main" >"$CACHE/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$CACHE/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$CACHE/lists" -q)
  apt-get "${apt_opts[@]}" update >/dev/null
  (cd "$CACHE/debs" && apt-get "${apt_opts[@]}" download libstdc++-13-dev 2>&1 | grep -v "^W:" || true)
  dpkg -x "$CACHE"/debs/libstdc++-13-dev_*.deb "$CACHE/root"
fi
python3 - "$BUILD_DIR/compile_commands.json" "$headers" "$(nproc)" <<'EOF'
import concurrent.futures, json, os, shlex, shutil, subprocess, sys, tempfile, threading

commands, headers, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
# A precompiled header (CMake's cmake_pch.hxx beside its .gch) was built
# against this machine's library: GCC would take the .gch and mix the two.
# Each is read from a copy without its .gch instead, parsed anew.
pch_copies = tempfile.mkdtemp(prefix="triad-pch-")
pch_lock = threading.Lock()

def without_pch(args):
    out = []
    for i, a in enumerate(args):
        if i > 0 and args[i - 1] == "-include" and a.endswith("cmake_pch.hxx"):
            copy = os.path.join(pch_copies, a.strip("/").replace("/", "_"))
            with pch_lock:
                if not os.path.exists(copy):
                    shutil.copyfile(a, copy)
            a = copy
        out.append(a)
    return out
extra = ["-nostdinc++", "-isystem", f"{headers}/c++/13",
         "-isystem", f"{headers}/x86_64-linux-gnu/c++/13", "-fsyntax-only"]

def check(entry):
    args = shlex.split(entry["command"])
    if not args[0].endswith(("c++", "g++")):
        return None  # nvcc: its sources are checked through the simulator's copies
    if "-o" in args:
        at = args.index("-o")
        del args[at:at + 2]
    args = without_pch(args)
    run = subprocess.run(args[:1] + extra + args[1:], cwd=entry["directory"],
                         capture_output=True, text=True)
    return entry["file"], run.returncode, run.stderr

failed = checked = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for result in pool.map(check, json.load(open(commands))):
        if result is None:
            continue
        checked += 1
        name, code, err = result
        if code != 0:
            failed += 1
            print(f"FAILED {name}")
            print("\n".join(l for l in err.splitlines() if "error" in l)[:2000])
shutil.rmtree(pch_copies, ignore_errors=True)
print(f"{checked} files compiled against libstdc++ 13, {failed} failed")
sys.exit(min(failed, 100))
EOF
