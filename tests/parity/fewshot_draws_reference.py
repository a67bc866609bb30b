"""Python's random.Random, and lm-evaluation-harness's few-shot draws made
with it, for fewshot_draws_parity_test.cpp.

Writes, for random seeds (0, small, past 32 bits): runs of getrandbits(k)
and of randrange(n) (which is _randbelow(n)); runs of sample(range(n), k)
on one generator, k on both sides of the size where sample() switches from
copying the population to re-drawing repeated picks; and few-shot prompts
drawn as the harness's ContextSampler.get_context draws them: one
random.Random(seed) per task, each question in order sampling its examples
from the pool (one more when the pool is the questions' own split), those
equal to the question dropped, the first `shots` kept. The pools hold
repeated items, so that dropping by equality (not by position) is tried.

usage: fewshot_draws_reference.py OUT.json
"""
import json
import os
import random
import sys


def seeds(rng):
    out = [0, 1, 1234, 2**32 - 1, 2**32, 2**40 + 5, 2**64 - 1]
    out += [rng.randrange(2**64) for _ in range(8)]
    out += [rng.randrange(2**20) for _ in range(8)]
    return out


def getrandbits_cases(rng):
    cases = []
    for seed in seeds(rng):
        gen = random.Random(seed)
        ks = [rng.randrange(0, 65) for _ in range(40)]
        cases.append({"seed": seed, "k": ks, "bits": [gen.getrandbits(k) for k in ks]})
    return cases


def randbelow_cases(rng):
    cases = []
    for seed in seeds(rng):
        gen = random.Random(seed)
        ns = []
        for _ in range(40):
            shape = rng.randrange(4)
            if shape == 0:
                n = rng.randrange(1, 100)
            elif shape == 1:  # just past a power of two: many rejections
                n = 2 ** rng.randrange(0, 40) + 1
            elif shape == 2:
                n = 2 ** rng.randrange(0, 63)
            else:
                n = rng.randrange(1, 2**63)
            ns.append(n)
        cases.append({"seed": seed, "n": ns, "values": [gen.randrange(n) for n in ns]})
    return cases


def sample_cases(rng):
    cases = []
    for seed in seeds(rng):
        gen = random.Random(seed)
        calls = []
        for _ in range(12):
            k = rng.choice([0, 1, 2, 5, 6, 7, 8, 21, 22, 30, 100])
            n = k + rng.choice([0, 1, 3, 10, 15, 16, 20, 60, 90, 300, 5000])
            calls.append({"n": n, "k": k, "picks": gen.sample(range(n), k)})
        cases.append({"seed": seed, "calls": calls})
    return cases


def harness_context(rnd, pool, doc, shots, one_more):
    """ContextSampler.get_context's draw, on docs that are dicts."""
    fewshotex = rnd.sample(pool, shots + 1 if one_more else shots)
    return [x for x in fewshotex if x != doc][:shots]


def draw_cases(rng):
    cases = []
    for case in range(60):
        seed = rng.choice([1234, 0, 42, rng.randrange(2**32), rng.randrange(2**64)])
        size = rng.choice([6, 8, 20, 30, 200, 7473])
        # Items named by a few hundred texts: repeats among the larger pools.
        pool = [{"q": "q%d" % rng.randrange(max(2, size * 9 // 10))} for _ in range(size)]
        shots = rng.choice([1, 3, 5, 5, 8])
        if shots + 1 > size:
            shots = size - 1
        own = rng.random() < 0.5  # the questions are the pool's own items
        if own:
            questions = pool[: rng.randrange(1, min(size, 40) + 1)]
            one_more = True
        else:
            # A separate split, some of whose questions equal a pool item;
            # harness tasks without a named test split still draw one more.
            questions = [
                pool[rng.randrange(size)] if rng.random() < 0.2 else {"q": "t%d" % i}
                for i in range(rng.randrange(1, 40))
            ]
            one_more = rng.random() < 0.5
        rnd = random.Random(seed)
        chosen = [[x["q"] for x in harness_context(rnd, pool, q, shots, one_more)] for q in questions]
        cases.append({
            "seed": seed,
            "pool": [x["q"] for x in pool],
            "questions": [x["q"] for x in questions],
            "shots": shots,
            "one_more": one_more,
            "chosen": chosen,
        })
    return cases


def main():
    out = sys.argv[1]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    rng = random.Random(20261204)
    reference = {
        "getrandbits": getrandbits_cases(rng),
        "randbelow": randbelow_cases(rng),
        "sample": sample_cases(rng),
        "draws": draw_cases(rng),
    }
    with open(out, "w") as f:
        json.dump(reference, f)


if __name__ == "__main__":
    main()
