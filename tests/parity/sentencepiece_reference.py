#!/usr/bin/env python3
"""Reference for Triad's SentencePiece tokenizer: Google's own library
(Debian: python3-sentencepiece) trains small models of each kind Triad reads
on a fixed corpus (made-up English sentences, the multilingual texts and
random strings of the pre-tokenisation reference), then encodes texts with
them and decodes id sequences, random ones included. Writes into OUT_DIR
one NAME.model per model, for the LLaMA-like BPE model also the
tokenizer.json transformers would convert it to (NAME.FORM.tokenizer.json,
FORM legacy or metaspace), and cases.json:
{"models": [{"name": ..., "vocab_size": ..., "cases": [{"text": ..., "ids": [...],
  "decoded": ...}], "decodes": [{"ids": [...], "text": ...}],
  "tokenizer_json": [FORM, ...] (where written)}]}.

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


def varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def user_defined_ids(model_file):
    """The ids of the model's user-defined pieces (type 4), read from the
    ModelProto's wire format (field 1: the pieces, each with its type in
    field 3; the library's Python API does not say)."""
    data = open(model_file, "rb").read()
    at, index, out = 0, 0, []
    while at < len(data):
        key, at = varint(data, at)
        if key & 7 == 0:
            _, at = varint(data, at)
            continue
        if key & 7 == 5:
            at += 4
            continue
        if key & 7 == 1:
            at += 8
            continue
        length, at = varint(data, at)
        if key >> 3 == 1:  # a SentencePiece message
            piece, end, kind = data[at:at + length], 0, 1
            while end < len(piece):
                k, end = varint(piece, end)
                if k & 7 == 0:
                    v, end = varint(piece, end)
                    if k >> 3 == 3:
                        kind = v
                elif k & 7 == 5:
                    end += 4
                else:
                    n, end = varint(piece, end)
                    end += n
            if kind == 4:
                out.append(index)
            index += 1
        at += length
    return out


def hf_tokenizer_json(sp, legacy, user_defined=()):
    """The tokenizer.json transformers' LlamaConverter writes for a
    SentencePiece BPE model with byte fallback: the vocabulary by id, merges
    for every split of a piece into two pieces, ordered by the merged
    piece's score (highest first), then by the halves' ids; legacy: a Prepend
    and a Replace normaliser and no pre-tokeniser, else a Metaspace
    pre-tokeniser prepending to the text's first piece only. The control,
    unknown and user-defined pieces (the ids `user_defined`) are added
    tokens matched in the raw text."""
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    merges = []
    for piece, i in vocab.items():
        local = [(piece[:k], piece[k:], sp.get_score(i)) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: m[2], reverse=True)
    added = [{"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False,
              "special": sp.is_control(i) or sp.is_unknown(i)}
             for i in range(n) if sp.is_control(i) or sp.is_unknown(i) or i in user_defined]
    space = "\u2581"
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": space},
            {"type": "Replace", "pattern": {"String": " "}, "content": space}]} if legacy else None,
        "pre_tokenizer": None if legacy else {
            "type": "Metaspace", "replacement": space, "prepend_scheme": "first", "split": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": space}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": sp.id_to_piece(sp.unk_id()),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[m[0], m[1]] for m in merges]}}


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
        entry = {"name": name, "vocab_size": n, "cases": cases, "decodes": decodes}
        if name == "bpe_bytes":
            # LLaMA 2's kind as transformers converts it (Hugging Face's
            # tokenizer.json), in both of its forms.
            entry["tokenizer_json"] = []
            for form in ("legacy", "metaspace"):
                path = os.path.join(out, f"{name}.{form}.tokenizer.json")
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(hf_tokenizer_json(sp, form == "legacy", user_defined_ids(
                        prefix + ".model")), f, ensure_ascii=False)
                entry["tokenizer_json"].append(form)
        models.append(entry)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"models": models}, f, ensure_ascii=False)
    print(f"wrote {len(models)} models and {sum(len(m['cases']) for m in models)} texts to {out}")


if __name__ == "__main__":
    main()
