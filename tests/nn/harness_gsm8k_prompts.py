"""Checks triad-eval --gsm8k's prompts (its --predictions' "prompt" of each
problem) against the prompts lm-evaluation-harness's gsm8k task builds.

Its ContextSampler draws each problem's examples in turn with
random.Random(seed).sample, from the few-shot split (GSM8K's train) or,
when that is the problems' own split, one more than shown, the problem
asked dropped (--seed; without it the first SHOTS examples, the problem
itself skipped, as triad-eval takes them). With --chat, the conversation
fewshot_context builds under --apply_chat_template (a system message with
--system, the examples as one user turn or, with --multiturn, a user and
an assistant turn each), written out in ChatML as the chat fixture's
template writes it, the assistant's turn opened. Exits non-zero naming
the first prompt that differs.

usage: harness_gsm8k_prompts.py PROBLEMS PREDICTIONS SHOTS [--seed S]
           [--pool FILE] [--chat] [--multiturn] [--system TEXT]
"""
import argparse
import json
import random
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def question(doc):
    return "Question: %s\nAnswer:" % doc["question"]


def chatml(messages):
    text = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in messages)
    return text + "<|im_start|>assistant\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("problems")
    ap.add_argument("predictions")
    ap.add_argument("shots", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--pool")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--multiturn", action="store_true")
    ap.add_argument("--system")
    a = ap.parse_args()
    problems, predictions = read(a.problems), read(a.predictions)
    pool = read(a.pool) if a.pool else problems
    rnd = random.Random(a.seed) if a.seed is not None else None
    if len(predictions) != len(problems):
        sys.exit("%d predictions for %d problems" % (len(predictions), len(problems)))
    for index, (doc, row) in enumerate(zip(problems, predictions)):
        if a.shots == 0:
            examples = []
        elif rnd is not None:
            drawn = rnd.sample(pool, a.shots if a.pool else a.shots + 1)
            examples = [x for x in drawn if x != doc][: a.shots]
        else:
            examples = [x for k, x in enumerate(pool) if a.pool or k != index][: a.shots]
        plain = "".join(question(x) + " " + x["answer"] + "\n\n" for x in examples)
        if not a.chat:
            want = plain + question(doc)
        else:
            messages = [{"role": "system", "content": a.system}] if a.system else []
            if a.multiturn:
                for x in examples:
                    messages += [{"role": "user", "content": question(x)},
                                 {"role": "assistant", "content": x["answer"]}]
                messages.append({"role": "user", "content": question(doc)})
            else:
                messages.append({"role": "user", "content": plain + question(doc)})
            want = chatml(messages)
        if row["prompt"] != want:
            sys.exit("problem %d: triad-eval asked %r, the harness %r"
                     % (row["index"], row["prompt"], want))


if __name__ == "__main__":
    main()
