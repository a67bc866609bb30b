#!/usr/bin/env python3
"""Reference for Triad's pre-tokenisation and Unicode normalisation: the
pieces OpenAI's GPT-2 encoder splits text into (its pattern, run by the
`regex` module it was written for; Debian: python3-regex), the pieces of
LLaMA 3's, Qwen2's, GPT-4o's o200k (Phi-4-mini's) and Mistral's Tekken
patterns (as their tokenizer.json files write them),
and the text's NFC (Python's unicodedata), for hand-written multilingual
text and for random strings drawn from long-assigned Unicode blocks
(letters, digits of several scripts, combining marks, Hangul jamo and
syllables, punctuation, symbols, emoji, every kind of whitespace), with a
fixed seed. Writes OUT_FILE as JSON:
[{"text": ..., "pieces": [...], "llama3": [...], "qwen2": [...], "o200k": [...],
"tekken": [...], "nfc": ...}, ...].

usage: gpt2_pretokenize_reference.py OUT_FILE
"""
import json
import os
import random
import sys
import unicodedata

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
_CAPITALS, _SMALLS = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?" + _CAPITALS + "*" + _SMALLS + "+" + _CONTRACTION,
    r"[^\r\n\p{L}\p{N}]?" + _CAPITALS + "+" + _SMALLS + "*" + _CONTRACTION,
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
TEKKEN_PATTERN = O200K_PATTERN.replace(_CONTRACTION, "").replace(r"\p{N}{1,3}", r"\p{N}")

TEXTS = [
    "Hello world's  end!! 123abc\n\nok ",
    "It\u2019s \u201cquoted\u201d \u2014 na\u00efve caf\u00e9, isn't it? They're here; we'll see.",
    "Don't DON'T don\u2019t I'm I'M you'd 'tis '''",
    "\u00dcber gr\u00f6\u00dfe Stra\u00dfe \u2013 \u00e7a co\u00fbte 12,50\u00a0\u20ac.",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0391\u03b8\u03ae\u03bd\u03b1 2024.",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\u5168\u89d2\uff21\uff22\uff23\uff11\uff12\u3000\u7d42\u308f\u308a",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc640 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0661\u0662\u0663",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092a\u093e\u0920 \u0967\u0968\u0969 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "e\u0301 a\u0308 n\u0303o \u00bd \u00b2\u00b3 \u2167 \u2460\u2461 x\u2081",
    "emoji \U0001f600\U0001f680 \U0001f44d\U0001f3fd flags \U0001f1eb\U0001f1f7 zwj \U0001f468\u200d\U0001f469",
    "math \u2211\u222b \u03c0\u2248 3.14159 \u221e \u2264 \u2260 \U0001d400\U0001d7ce",
    "tabs\tand\nnewlines\r\n  indented\n\n\n    code()  \t \n",
    "  leading and trailing spaces   ",
    "\u2003em\u2002spaces\u2009thin\u00a0nbsp\u3000ideographic\u2028line\u2029para",
    "def f(x):\n    return x**2  # comment\n",
    "",
    " ",
    "'",
    "a'sb'tc're'",
    "I'M HERE, YOU'RE THERE, WE'LL SEE; DON'T 'S 'LL 'Ve 'ſ",
    "12345 6789012 3.14159 1,000,000 \u0661\u0662\u0663\u0664 x2y34z",
    "line one\n\n  line two \r\n\t\n   indented!!\n\n\n",
    "e\u0301 a\u0323\u0302 A\u030a\u0301 \u212b \u2126 \u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8",
    "\u0915\u093c \u0930\u093c \u00c5\u0301 o\u0308\u0304 \u0f73 \u0344 \uf900\ufa10",
    " NASA's GPT-OSS /path/to/file abc/\nfooBAR 123 camelCaseWord HTTPServer iPhone XMLHttp",
    "\u01c5ungla \u01c4UNGLA \u02b0h \u3005\u30fc\u30c6 \u0301\u0301x \u0301! A\u0301B\u0301c //\n/ a/b",
    "\u00c9COLE \u00e9cole \u00c9cole \u0391\u03b8\u0397\u039d\u0391 \u0416\u0416\u0436 I'M HERE'S",
]

# Long-assigned blocks whose characters' categories do not change between
# Unicode versions; unassigned code points (by this Python's tables) skipped.
BLOCKS = [
    (0x00A0, 0x024F), (0x0300, 0x036F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0590, 0x05FF),
    (0x0600, 0x06FF), (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x1E00, 0x1EFF),
    (0x2000, 0x206F), (0x2070, 0x209F), (0x20A0, 0x20BF), (0x2100, 0x218F), (0x2190, 0x22FF),
    (0x2460, 0x24FF), (0x2500, 0x257F), (0x3000, 0x30FF), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3),
    (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF), (0x1F300, 0x1F64F), (0x0F00, 0x0FFF),
    (0xF900, 0xFAFF), (0x1F00, 0x1FFF),
]
ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" + " " * 12 + "\n\t'.,!?-_()[]{}\"'#@$%^&*+=/\\|<>~`;:"
WHITESPACE = " \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000"
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'Re", "'x", "'LL", "'vE",
                "'\u017f", "'D"]
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0323", "\u0327", "\u030a", "\u0302", "\u0304",
             "\u093c", "\u1161", "\u11a8", "\u0345"]


def pool():
    cps = []
    for first, last in BLOCKS:
        for cp in range(first, last + 1):
            if unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co"):
                cps.append(chr(cp))
    return cps


def random_texts(count, seed=20261123):
    rng = random.Random(seed)
    unicode_pool = pool()
    out = []
    for _ in range(count):
        pieces = []
        for _ in range(rng.randint(1, 24)):
            r = rng.random()
            if r < 0.45:
                pieces.append(rng.choice(ASCII))
            elif r < 0.55:
                pieces.append(rng.choice(WHITESPACE))
            elif r < 0.62:
                pieces.append(rng.choice(CONTRACTIONS))
            elif r < 0.70:
                pieces.append(rng.choice(COMBINING))
            else:
                pieces.append(rng.choice(unicode_pool))
        out.append("".join(pieces))
    return out


def main():
    gpt2, llama3, qwen2, o200k, tekken = (
        regex.compile(p)
        for p in (GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN, O200K_PATTERN, TEKKEN_PATTERN))
    cases = [{"text": t, "pieces": gpt2.findall(t), "llama3": llama3.findall(t),
              "qwen2": qwen2.findall(t), "o200k": o200k.findall(t), "tekken": tekken.findall(t),
              "nfc": unicodedata.normalize("NFC", t)}
             for t in TEXTS + random_texts(2000)]
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    print(f"wrote {len(cases)} texts to {sys.argv[1]}")


if __name__ == "__main__":
    main()
