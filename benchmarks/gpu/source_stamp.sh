#!/usr/bin/env bash
# Prints a hash of the sources Triad's programs are built from (the files
# under CMakeLists.txt, cmake/, src/, include/, kernels/, tests/,
# benchmarks/ and examples/, by path and content; not the Python, shell and
# Markdown files there, which are read from the tree when they run and are
# never compiled in). run_all.sh stamps a pack of programs with it and
# unpacks one only where the sources hash the same.
#   benchmarks/gpu/source_stamp.sh [REPO]   # default: this script's repository
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
find CMakeLists.txt cmake src include kernels tests benchmarks examples -type f \
  ! -path '*/__pycache__/*' ! -name '*.py' ! -name '*.pyc' ! -name '*.sh' ! -name '*.md' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum |
  sha256sum | cut -c1-16
