#!/usr/bin/env bash
# Fetches, on this (Debian) machine, the .deb files of the libraries Triad
# builds against into .deps/debs/ (git-ignored), for a GPU machine that has
# CUDA, CMake and a compiler but none of these and no network: name `.deps`
# in the device tool's `carry`, and benchmarks/gpu/run_all.sh unpacks them
# into a private prefix there (never into /). MPI is not carried: without it
# the GPU build has a world of one rank, which is all one GPU can test.
#   scripts/gpu_deps.sh            # about 15 MB
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
          libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev
          libgtest-dev libgmock-dev
          libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5)
mkdir -p .deps/debs
cd .deps/debs
# apt-get download writes as the _apt user when it can; a root-owned folder
# only makes it warn and write as root.
apt-get download "${PACKAGES[@]}" 2>&1 | grep -v "unsandboxed" || true
ls -1 *.deb | wc -l | xargs echo "debs:"
du -sh .
