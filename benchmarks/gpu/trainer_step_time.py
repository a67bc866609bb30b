#!/usr/bin/env python3
"""The example trainer's step time, beside bench_train_gpu's (run_all.sh).

bench_train_gpu times the model's step alone. triad-train is what a user
runs: it also draws each batch from a token file, reads the loss and the
gradient norm every step, logs and writes metrics.jsonl. run_all.sh runs it
on GPT-2 350M's batch and puts its step time in the same table.

    trainer_step_time.py shard PATH --tokens N [--vocab V] [--seed S]
        random tokens in llm.c's shard format (what data.train reads)
    trainer_step_time.py summary METRICS_JSONL --preset P --batch B --seq T [--skip K]
                                 [--cuda-graph]
        one JSON line for train.jsonl: the median period of metrics.jsonl's
        steps after the first K (warm-up: attention and GEMM choices), each
        the wall clock from the step before's line to its own, as
        {"impl": "triad-train", "step_ms", "tokens_per_s", ...}; with
        --cuda-graph (a run with train.cuda_graph) "cuda_graph": true too
"""
import argparse
import json
import random
import statistics
import struct
import sys

SHARD_MAGIC = 20240520  # include/triad/data/token_shard.h
SHARD_VERSION = 1
HEADER_INTS = 256  # 1024 bytes


def write_shard(path, tokens, vocab, seed):
    if tokens <= 0 or tokens >= 2**31:
        sys.exit(f"--tokens {tokens}: expected 1 to 2^31 - 1 (the header's int32 count)")
    if not 1 <= vocab <= 65536:
        sys.exit(f"--vocab {vocab}: expected 1 to 65536 (tokens are 16-bit)")
    rng = random.Random(seed)
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, tokens
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        chunk = 1 << 16
        for start in range(0, tokens, chunk):
            n = min(chunk, tokens - start)
            f.write(struct.pack(f"<{n}H", *(rng.randrange(vocab) for _ in range(n))))


def summary(path, preset, batch, seq, skip, cuda_graph=False):
    steps = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                steps.append(json.loads(line))
    # Each step's period: from the line before it to its own (elapsed_s,
    # seconds since the run began), the wall clock a user waits. Not
    # step_ms, the host's time in the step's call: on a GPU the optimizer's
    # work queued last is waited for outside it (by the next step, or a
    # log.interval summary), so it can miss the step's own optimizer.
    times = [s.get("elapsed_s") for s in steps]
    if any(not isinstance(t, (int, float)) or t < 0 for t in times):
        sys.exit(f"{path}: a step without elapsed_s (metrics.jsonl from a triad-train that "
                 "predates it?)")
    timed = [1e3 * (times[i] - times[i - 1]) for i in range(max(skip, 1), len(times))]
    if not timed:
        sys.exit(f"{path}: {len(steps)} steps, none after the first {skip} with a step time")
    step_ms = statistics.median(timed)
    out = {"impl": "triad-train", "preset": preset, "batch": batch, "seq": seq,
           "step_ms": step_ms, "tokens_per_s": batch * seq / (step_ms / 1e3),
           "steps_timed": len(timed), "loss": steps[-1].get("loss")}
    if cuda_graph:
        out["cuda_graph"] = True
    if "peak_memory_bytes" in steps[-1]:
        out["peak_memory_gib"] = steps[-1]["peak_memory_bytes"] / 2**30
    print(json.dumps(out, sort_keys=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    shard = sub.add_parser("shard")
    shard.add_argument("path")
    shard.add_argument("--tokens", type=int, required=True)
    shard.add_argument("--vocab", type=int, default=50257)
    shard.add_argument("--seed", type=int, default=1)
    summ = sub.add_parser("summary")
    summ.add_argument("metrics")
    summ.add_argument("--preset", required=True)
    summ.add_argument("--batch", type=int, required=True)
    summ.add_argument("--seq", type=int, required=True)
    summ.add_argument("--skip", type=int, default=3)
    summ.add_argument("--cuda-graph", action="store_true",
                      help="the run had train.cuda_graph on (its row says so)")
    args = parser.parse_args()
    if args.command == "shard":
        write_shard(args.path, args.tokens, args.vocab, args.seed)
    else:
        summary(args.metrics, args.preset, args.batch, args.seq, args.skip, args.cuda_graph)


if __name__ == "__main__":
    main()
