"""GSM8K's answer extraction and exact match as lm-evaluation-harness's
gsm8k task (3.0) runs them, on random replies, for
gsm8k_answers_parity_test.cpp: its two regex filters (strict-match, the
first group of `#### (\\-?[0-9\\.\\,]+)`; flexible-extract, the last match of
`(-?[$0-9.,]{2,})|(-?[0-9]+)`, the first group that matched, stripped) and
exact_match's `regexes_to_ignore` (`,`, `\\$`, `(?s).*#### `, `\\.$`, each
through re.sub, in that order) followed by lower(). The replies are drawn
from the characters these patterns turn on, "#### " often among them.

usage: gsm8k_answers_reference.py OUT.json
"""
import json
import os
import random
import re
import sys

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]


def extract(regex, reply, group_select):
    match = regex.findall(reply)
    if not match:
        return "[invalid]"
    match = match[group_select]
    if isinstance(match, tuple):
        match = [m for m in match if m]
        match = match[0] if match else "[invalid]"
    return match.strip()


def normalize(text):
    for pattern in IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower()


def main():
    rnd = random.Random(20261204)
    alphabet = list("#### -$0123456789.,aB \n")
    cases = []
    for _ in range(20000):
        reply = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30)))
        if rnd.random() < 0.3:
            reply = reply.replace("#", "#### ", 1)
        cases.append({"reply": reply, "strict": extract(STRICT, reply, 0),
                      "flexible": extract(FLEXIBLE, reply, -1), "normalized": normalize(reply)})
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
    with open(sys.argv[1], "w") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    main()
