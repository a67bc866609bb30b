"""triad-eval --choices on MMLU-Pro's lines as lm-evaluation-harness's
leaderboard_mmlu_pro asks them: each question after the first SHOTS of the
few-shot file (its first_n sampler, with --fewshot-seed too), each example
"<question>\\nA. <option>\\n...Answer:<letter>\\n\\n", and each letter scored
right after "Answer:" (target_delimiter ""): one byte, one token, for the
byte-level model. Checks every --predictions "context" and token count.

Usage: mmlu_pro_prompts.py TRIAD_EVAL RUN_DIR QUESTIONS WORK_DIR
"""
import json
import os
import string
import subprocess
import sys

triad_eval, run, questions, work = sys.argv[1:]
os.makedirs(work, exist_ok=True)
with open(questions) as f:
    lines = [line for line in f if line.strip()]
# The first two lines a validation split to take examples from, the rest
# the questions asked.
pool, test = os.path.join(work, "validation.jsonl"), os.path.join(work, "test.jsonl")
with open(pool, "w") as f:
    f.writelines(lines[:2])
with open(test, "w") as f:
    f.writelines(lines[2:])
predictions = os.path.join(work, "mmlu_pro.jsonl")
subprocess.run([triad_eval, "--run", run, "--choices", test, "--fewshot", "2",
                "--fewshot-from", pool, "--fewshot-seed", "1234", "--predictions",
                predictions], check=True, capture_output=True)


def text(doc):
    out = doc["question"] + "\n"
    for i, option in enumerate(doc["options"]):
        out += "%s. %s\n" % (string.ascii_uppercase[i], option)
    return out + "Answer:"


shown = [json.loads(line) for line in lines[:2]]
docs = [json.loads(line) for line in lines[2:]]
with open(predictions) as f:
    rows = [json.loads(line) for line in f]
shots = "".join(text(d) + d["answer"] + "\n\n" for d in shown)
for doc, row in zip(docs, rows):
    if row["context"] != shots + text(doc):
        sys.exit("question %d: triad-eval asked %r" % (row["index"], row["context"]))
    if row["tokens"] != [1] * len(doc["options"]):
        sys.exit("question %d: the letters took %s tokens" % (row["index"], row["tokens"]))
    if row["answer"] != string.ascii_uppercase.index(doc["answer"]):
        sys.exit("question %d: answer %d" % (row["index"], row["answer"]))
if len(rows) != len(docs):
    sys.exit("%d predictions for %d questions" % (len(rows), len(docs)))
print("mmlu-pro prompts agree")
