#!/usr/bin/env python3
"""What ptxas gives each kernel in kernels/*.cu: registers, spills, stack.

A GPU refuses a launch whose block needs more registers than an SM has
(65536): a kernel of more than 64 registers a thread cannot run 1024
threads a block. The simulator checks every launch against the kernel's
__launch_bounds__, and ptxas fits a bounded kernel's registers to its
bound; a kernel with no bound is where such a launch would first fail, on
a GPU. So this compiles each kernel file again (with the flags of the
build's compile_commands.json, for its first architecture) under
--resource-usage, and exits 1 when a kernel without __launch_bounds__ uses
more than 64 registers. It also lists the kernels that spill to local
memory or keep a stack frame, and with --all every kernel.

    scripts/kernel_resources.py [--build DIR] [--all] [--jobs N]

It needs a CUDA build (TRIAD_WITH_CUDA=ON, as scripts/dev.sh build makes
where nvcc is) and nvcc; no GPU. About 3 minutes on 2 cores.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+a?)'")
REGISTERS = re.compile(r"Used (\d+) registers")
STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
# A kernel's declaration: `__global__ void [__launch_bounds__(...)] name(`.
DECLARED = re.compile(r"__global__\s+void\s+(__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(")


def kernel_commands(build):
    """(source, argv) of each kernels/*.cu the library compiles, its object
    sent to a temporary file and --resource-usage added."""
    path = os.path.join(build, "compile_commands.json")
    if not os.path.exists(path):
        sys.exit(f"kernel_resources.py: no {path} (configure a CUDA build there first)")
    commands = []
    for entry in json.load(open(path, encoding="utf-8")):
        source = entry["file"]
        if not source.endswith(".cu") or f"{os.sep}kernels{os.sep}" not in source:
            continue
        argv = shlex.split(entry["command"])
        if "-o" not in argv:
            continue
        out = os.path.join(tempfile.gettempdir(),
                           f"kernel_resources_{os.getpid()}_{os.path.basename(source)}.o")
        argv[argv.index("-o") + 1] = out
        argv.insert(1, "--resource-usage")
        commands.append((source, entry["directory"], argv, out))
    if not commands:
        sys.exit(f"kernel_resources.py: {path} compiles no kernels/*.cu (TRIAD_WITH_CUDA=OFF?)")
    # (Each source once: the first target that compiles it.)
    seen, unique = set(), []
    for c in commands:
        if c[0] not in seen:
            seen.add(c[0])
            unique.append(c)
    return unique


def compile_one(command):
    source, directory, argv, out = command
    run = subprocess.run(argv, cwd=directory, capture_output=True, text=True)
    if os.path.exists(out):
        os.remove(out)
    if run.returncode != 0:
        sys.exit(f"kernel_resources.py: compiling {source} failed:\n{run.stderr[-4000:]}")
    return source, run.stdout + run.stderr


def demangle(names):
    run = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = run.stdout.splitlines()
    return lines if len(lines) == len(names) else names


def bounded_kernels(source):
    """The names of the kernels of `source` that declare __launch_bounds__,
    and of all its kernels."""
    text = open(source, encoding="utf-8").read()
    bounded, every = set(), set()
    for m in DECLARED.finditer(text):
        every.add(m.group(2))
        if m.group(1):
            bounded.add(m.group(2))
    return bounded, every


def parse(source, log):
    """One row per kernel (the first architecture compiled): source,
    mangled name, registers, stack frame, spill stores, spill loads."""
    rows, current, arch = [], None, None
    for line in log.splitlines():
        m = ENTRY.search(line)
        if m:
            if arch is None:
                arch = m.group(2)
            current = m.group(1) if m.group(2) == arch else None
            row = None
            continue
        if current is None:
            continue
        m = STACK.search(line)
        if m:
            row = [source, current, None, int(m.group(1)), int(m.group(2)), int(m.group(3))]
            continue
        m = REGISTERS.search(line)
        if m and row is not None:
            row[2] = int(m.group(1))
            rows.append(row)
            current = None
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--all", action="store_true", help="list every kernel")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    commands = kernel_commands(args.build)
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for source, log in pool.map(compile_one, commands):
            rows.extend(parse(source, log))
    if not rows:
        sys.exit("kernel_resources.py: ptxas reported no kernels (no --resource-usage output)")
    names = demangle([r[1] for r in rows])
    unbounded = []
    print("| registers | stack | spills (stores/loads) | file | kernel |")
    print("| --- | --- | --- | --- | --- |")
    declared = {}
    for row, name in sorted(zip(rows, names), key=lambda p: (-p[0][2], p[1])):
        source, _, regs, stack, stores, loads = row
        if source not in declared:
            declared[source] = bounded_kernels(source)
        bounded, every = declared[source]
        # The kernel's own name: the identifier before its template
        # arguments or parameters.
        plain = re.sub(r"^void ", "", name.replace("(anonymous namespace)", "anonymous"))
        base = re.split(r"[<(]", plain)[0].split("::")[-1]
        if base not in every:
            sys.exit(f"kernel_resources.py: kernel {name} not found declared in {source}")
        over = regs > 64 and base not in bounded
        if over:
            unbounded.append((regs, name, source))
        if args.all or over or stack or stores or loads:
            print(f"| {regs}{' (no bound)' if over else ''} | {stack} | {stores}/{loads} | "
                  f"{os.path.relpath(source)} | {name[:140]} |")
    print(f"{len(rows)} kernels; {len(unbounded)} above 64 registers without __launch_bounds__")
    for regs, name, source in unbounded:
        # (Registers are given a warp at a time, in eights a thread.)
        most = 65536 // ((regs + 7) // 8 * 8 * 32) * 32
        print(f"error: {os.path.relpath(source)}: {name} uses {regs} registers a thread and "
              f"declares no __launch_bounds__: a block of more than {most} threads cannot "
              f"launch (give it a bound, which the simulator checks every launch against)")
    sys.exit(1 if unbounded else 0)


if __name__ == "__main__":
    main()
