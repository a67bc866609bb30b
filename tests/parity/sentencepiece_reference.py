#!/usr/bin/env python3
"""Reference for Triad's SentencePiece tokenizer: Google's own library
(Debian: python3-sentencepiece) trains small models of each kind Triad reads
on a fixed corpus (made-up English sentences, the multilingual texts and
random strings of the pre-tokenisation reference), then encodes texts with
them and decodes id sequences, random ones included. Writes into OUT_DIR
one NAME.model per model and cases.json:
{"models": [{"name": ..., "vocab_size": ..., "cases": [{"text": ..., "ids": [...],
  "decoded": ...}], "decodes": [{"ids": [...], "text": ...}]}]}.

usage: sentencepiece_reference.py OUT_DIR
"""
import json
import os
import random
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_pretokenize_reference import TEXTS, random_texts  # noqa: E402

WORDS = ("the of and to in is was for on that with as by at from it an be this which or "
         "are have were had not but one all their has its been more when who they will "
         "would there can first other time into two after new some these only most then "
         "model layer tensor parallel pipeline gradient token attention training batch "
         "Hello World Paris London Tokyo 2026 42 3.14 e-mail naïve café résumé Straße "
         "ＡＢＣ１２３ ｶﾀｶﾅ ﬁne ① ² ½ ™ Ⅻ").split()

# name -> SentencePieceTrainer options: LLaMA's kind (BPE over raw text,
# byte fallback, digits apart, spaces kept), the library's default (unigram
# over NFKC with extra spaces removed), and variants of both.
MODELS = {
    "bpe_bytes": dict(model_type="bpe", vocab_size=700, byte_fallback=True,
                      normalization_rule_name="identity", remove_extra_whitespaces=False,
                      split_digits=True, user_defined_symbols=["<|im_start|>", "<|im_end|>"],
                      allow_whitespace_only_pieces=True),
    "unigram_nfkc": dict(model_type="unigram", vocab_size=500, user_defined_symbols=["\ufb01x"]),
    "bpe_nfkc_cf": dict(model_type="bpe", vocab_size=400, normalization_rule_name="nmt_nfkc_cf",
                        add_dummy_prefix=False),
    "unigram_bytes": dict(model_type="unigram", vocab_size=700, byte_fallback=True,
                          normalization_rule_name="identity", user_defined_symbols=["<sep>"],
                          control_symbols=["<ctl>"], bos_id=-1, eos_id=1, unk_id=2, pad_id=0),
}


def corpus(rng):
    lines = []
    for _ in range(4000):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) +
                     rng.choice([".", "!", "?", ",", ""]))
    lines += [t.replace("\n", " ") for t in TEXTS if t.strip()]
    lines += [t.replace("\n", " ").replace("\r", " ") for t in random_texts(100, seed=7)]
    return [line for line in lines if line.strip()]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(20261124)
    train_file = os.path.join(out, "corpus.txt")
    with open(train_file, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus(rng)) + "\n")
    texts = TEXTS + random_texts(600, seed=11) + [
        "<|im_start|>user hi<|im_end|>", "a<sep>b <sep> c", "<s></s><unk><ctl>", "\ufb01x \ufb01xed \ufb01ne fix",
        "   many    spaces   ", "\u2581already escaped\u2581", "digits 1234567890 x",
        " ".join(rng.choice(WORDS) for _ in range(60))]
    models = []
    for name, options in MODELS.items():
        prefix = os.path.join(out, name)
        spm.SentencePieceTrainer.train(input=train_file, model_prefix=prefix, num_threads=1,
                                       character_coverage=0.98, hard_vocab_limit=False,
                                       minloglevel=2, **options)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        cases = []
        for text in texts:
            ids = sp.encode(text)
            cases.append({"text": text, "ids": ids, "decoded": sp.decode(ids)})
        decodes = []
        n = sp.get_piece_size()
        for _ in range(300):
            ids = [rng.randrange(n) for _ in range(rng.randint(0, 12))]
            decodes.append({"ids": ids, "text": sp.decode(ids)})
        # Where the leading space comes off: after control, unknown and byte
        # pieces and after a lone space piece, pieces beginning with U+2581.
        control = [i for i in range(n) if sp.is_control(i)]
        spaced = [i for i in range(n) if sp.id_to_piece(i).startswith("\u2581")][:4]
        byte = [i for i in range(n) if sp.is_byte(i)][:1]
        heads = [[c] for c in control] + [[sp.unk_id()], spaced[:1], spaced[:2]] + [byte]
        for head in heads:
            for tail in ([spaced[1]], [spaced[2], spaced[3]], [spaced[0], spaced[0]]):
                ids = head + tail
                decodes.append({"ids": ids, "text": sp.decode(ids)})
        models.append({"name": name, "vocab_size": n, "cases": cases, "decodes": decodes})
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"models": models}, f, ensure_ascii=False)
    print(f"wrote {len(models)} models and {sum(len(m['cases']) for m in models)} texts to {out}")


if __name__ == "__main__":
    main()
