#!/usr/bin/env bash
# triad-tokenize with SentencePiece models against Google's library on real
# text: the repository's own docs and sources (about 2.3 MB, 52K lines),
# one document per non-empty line. python3-sentencepiece trains a BPE model
# of LLaMA's kind (8,000 pieces, byte fallback, digits apart, spaces kept)
# and a unigram model (8,000 pieces, NFKC, the library's defaults), encodes
# every line, and the ids must equal Triad's, token for token; then the
# times (wall clock, the whole command for Triad: reading, encoding,
# writing the Megatron dataset). bpe_json is the BPE model converted to a
# Hugging Face tokenizer.json (LLaMA 2's legacy form) over the lines that do
# not hold <s>, </s> or <unk>.
#   benchmarks/tokenize_sentencepiece.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
PY=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
find docs src include tests examples benchmarks \( -name '*.md' -o -name '*.cpp' -o -name '*.h' \
  -o -name '*.py' \) | sort | xargs cat >"$work/corpus.txt"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; commit $(git rev-parse --short HEAD)"
echo "corpus: $(wc -c <"$work/corpus.txt") bytes, $(wc -l <"$work/corpus.txt") lines"
"$PY" - "$work" <<'PY'
import sys
import sentencepiece as spm
w = sys.argv[1]
common = dict(input=w + "/corpus.txt", vocab_size=8000, num_threads=2, minloglevel=2,
              max_sentence_length=100000)
spm.SentencePieceTrainer.train(model_prefix=w + "/bpe", model_type="bpe", byte_fallback=True,
                               normalization_rule_name="identity", remove_extra_whitespaces=False,
                               split_digits=True, allow_whitespace_only_pieces=True, **common)
spm.SentencePieceTrainer.train(model_prefix=w + "/unigram", model_type="unigram", **common)
# The BPE model as transformers converts it (LLaMA 2's legacy tokenizer.json),
# and the lines without an added token's text (which Hugging Face matches in
# raw text and SentencePiece does not).
sys.path.insert(0, "tests/parity")
import json
from sentencepiece_reference import hf_tokenizer_json, user_defined_ids
sp = spm.SentencePieceProcessor(model_file=w + "/bpe.model")
with open(w + "/bpe_json.tokenizer.json", "w", encoding="utf-8") as f:
    json.dump(hf_tokenizer_json(sp, True, user_defined_ids(w + "/bpe.model")), f,
              ensure_ascii=False)
lines = open(w + "/corpus.txt", encoding="utf-8").read().split("\n")
with open(w + "/corpus_plain.txt", "w", encoding="utf-8") as f:
    f.write("\n".join(l for l in lines if not any(t in l for t in ("<s>", "</s>", "<unk>"))))
PY
printf "%-8s %8s %10s %10s %10s %s\n" model tokens "triad 1w" "triad 2w" "library" same
for m in bpe unigram bpe_json; do
  tokenizer="$work/$m.model" corpus="$work/corpus.txt"
  if [ $m = bpe_json ]; then tokenizer="$work/$m.tokenizer.json" corpus="$work/corpus_plain.txt"; fi
  t=()
  for workers in 1 2; do
    s=$EPOCHREALTIME
    "$B/examples/triad-tokenize" --input "$corpus" --output "$work/$m" --format megatron \
      --documents lines --tokenizer "$tokenizer" --workers $workers >/dev/null
    t+=("$s:$EPOCHREALTIME")
  done
  "$PY" - "$work" "$m" "$corpus" "${t[@]}" <<'PY'
import sys, time
import numpy as np
import sentencepiece as spm
w, m, corpus = sys.argv[1:4]
t1, t2 = (float(b) - float(a) for a, b in (t.split(":") for t in sys.argv[4:6]))
lines = [l for l in open(corpus, encoding="utf-8").read().split("\n") if l]
sp = spm.SentencePieceProcessor(model_file=f"{w}/{m.removesuffix('_json')}.model")
start = time.time()
ids = sp.encode(lines)
lib = time.time() - start
ref = np.array([i for x in ids for i in x], dtype=np.uint16)
ours = np.fromfile(f"{w}/{m}.bin", dtype=np.uint16)
same = ref.shape == ours.shape and bool((ref == ours).all())
print(f"{m:<8} {len(ref):>8} {t1:>9.2f}s {t2:>9.2f}s {lib:>9.2f}s {same}")
if not same:
    sys.exit(f"{m}: Triad's tokens differ from the library's")
PY
done
