"""Checks triad-eval --gsm8k --fewshot-seed's prompts (its --predictions'
"prompt" of each problem) against the prompts lm-evaluation-harness's gsm8k
task builds: its ContextSampler draws each problem's examples in turn with
random.Random(seed).sample, from the few-shot split (GSM8K's train) or,
when that is the problems' own split, one more than shown, the problem
asked dropped. Exits non-zero naming the first prompt that differs.

usage: harness_gsm8k_prompts.py PROBLEMS PREDICTIONS SEED SHOTS [POOL]
"""
import json
import random
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    problems, predictions = read(sys.argv[1]), read(sys.argv[2])
    rnd, shots = random.Random(int(sys.argv[3])), int(sys.argv[4])
    pool = read(sys.argv[5]) if len(sys.argv) > 5 else problems
    same_split = len(sys.argv) <= 5
    if len(predictions) != len(problems):
        sys.exit("%d predictions for %d problems" % (len(predictions), len(problems)))
    for doc, row in zip(problems, predictions):
        drawn = rnd.sample(pool, shots + 1 if same_split else shots)
        examples = [x for x in drawn if x != doc][:shots]
        want = "".join("Question: %s\nAnswer: %s\n\n" % (x["question"], x["answer"])
                       for x in examples)
        want += "Question: %s\nAnswer:" % doc["question"]
        if row["prompt"] != want:
            sys.exit("problem %d: triad-eval asked %r, the harness %r"
                     % (row["index"], row["prompt"], want))


if __name__ == "__main__":
    main()
