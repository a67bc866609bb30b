"""triad-eval's text measures recomputed from its own loss and token count:
bits per byte over the file's bytes, and the word perplexity over its words
counted as lm-evaluation-harness counts them (Python's re.split on \\s+),
for each file and for the files together.

Usage: eval_text_measures.py TRIAD_EVAL RUN_DIR TOKENIZER TEXT...
"""
import json
import math
import re
import subprocess
import sys

triad_eval, run, tokenizer, *texts = sys.argv[1:]
args = [triad_eval, "--run", run, "--tokenizer", tokenizer, "--bos-token", "<|endoftext|>",
        "--json"]
for t in texts:
    args += ["--text", t]
report = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def close(a, b, what):
    if abs(a - b) > 1e-9 * max(1.0, abs(b)):
        sys.exit(f"{what}: triad-eval says {a}, its loss and tokens give {b}")


nll_all = bytes_all = words_all = 0
for t in texts:
    r = report["text"][t]
    data = open(t, "rb").read()
    words = len(re.split(r"\s+", data.decode("utf-8")))
    nll = r["loss"] * r["tokens"]
    if r["words"] != words:
        sys.exit(f"{t}: {r['words']} words, re.split counts {words}")
    close(r["bits_per_byte"], nll / math.log(2) / len(data), f"{t} bits per byte")
    close(r["word_perplexity"], math.exp(nll / words), f"{t} word perplexity")
    nll_all, bytes_all, words_all = nll_all + nll, bytes_all + len(data), words_all + words
if len(texts) > 1:
    r = report["text_all"]
    close(r["word_perplexity"], math.exp(nll_all / words_all), "all text word perplexity")
    close(r["bits_per_byte"], nll_all / math.log(2) / bytes_all, "all text bits per byte")
print("text measures agree:", json.dumps(report["text"]))
