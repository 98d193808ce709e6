#!/usr/bin/env python3
"""tests/data/gen_bpe_refs.py - a small GPT-2-format BPE vocabulary and the
reference encodings tests/check_tokens.c compares cli/tokenizer.c with.

Writes, beside this script, tests/data/bpe/:
  vocab.json   {"token": id} in GPT-2's format: the 256 byte tokens first
               (ids 0..255, in the order of GPT-2's bytes_to_unicode), then
               one token per merge, then <|endoftext|>
  merges.txt   "#version: 0.2", then one merge "a b" per line by rank
  refs.json    [{"text": ..., "ids": [...]}]: texts and their encodings

The merges are learnt here by plain BPE training (the most frequent
adjacent pair within pre-tokenized words, ties broken by the smaller pair)
on the fixed text below, so nothing is downloaded.  The encoder is GPT-2's
encoder.py algorithm (bytes_to_unicode, the lowest-ranked pair merged
everywhere until none has a rank), with the pre-tokenization pattern
approximated as cli/tokenizer.h documents: \\p{L} = ASCII letters and every
non-ASCII character, \\p{N} = ASCII digits, \\s = [ \\t\\n\\v\\f\\r].

Run: python3 tests/data/gen_bpe_refs.py  (Python 3 standard library only)
"""
import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "bpe")
N_MERGES = 120

TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog didn't care; the fox
wasn't there. They're sure we've seen them, and I'm told you'll find they'd
gone. In 1984, 42 foxes ran 3.14159 miles -- then 2024 more!
  Indented lines,	tabs, and    runs of spaces   matter.
Cafe, cafe, CAFE: the rain in Spain stays mainly in the plain.
There is the theory of the thing, and then there is the thing itself.
"""

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "the theory of the thing",
    "didn't they'd you'll we've I'm it's 'tis 'S",
    "  two leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\nand a blank line\n",
    "numbers 1984 and 3.14159 and 2024!!",
    "punctuation: (a), [b], {c}; \"quoted\" -- dashes...",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber \u65e5\u672c\u8a9e \U0001F600 end",
    "mixed123abc 456def ?!x",
    "   ",
    "\n",
    "There is the thing itself.\r\nWindows line.",
    "",
]

S = r"[ \t\n\x0b\x0c\r]"
NOT_S = r"[^ \t\n\x0b\x0c\r]"
L = r"[A-Za-z\u0080-\U0010FFFF]"
N = r"[0-9]"
OTHER = r"[^ \t\n\x0b\x0c\rA-Za-z0-9\u0080-\U0010FFFF]"
PAT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?" + L + r"+| ?" + N + r"+| ?" + OTHER +
                 r"+|" + S + r"+(?!" + NOT_S + r")|" + S + r"+")


def bytes_to_unicode():
    """GPT-2's map: printable Latin-1 bytes as themselves, the rest from U+0100."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) +
          list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, dict(zip(bs, [chr(c) for c in cs]))


BYTE_ORDER, BYTE_ENCODER = bytes_to_unicode()


def words(text):
    return ["".join(BYTE_ENCODER[b] for b in w.encode("utf-8")) for w in PAT.findall(text)]


def train(text, n_merges):
    """Plain BPE training over the pre-tokenized words."""
    corpus = {}
    for w in words(text):
        corpus[tuple(w)] = corpus.get(tuple(w), 0) + 1
    merges = []
    for _ in range(n_merges):
        pairs = {}
        for w, c in corpus.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        new = {}
        for w, c in corpus.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        corpus = new
    return merges


def bpe(token, ranks):
    """GPT-2's Encoder.bpe: merge the lowest-ranked pair everywhere, repeat."""
    word = tuple(token)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new_word.extend(word[i:])
                break
            new_word.extend(word[i:j])
            i = j
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
    return word


def encode(text, encoder, ranks):
    return [encoder[p] for w in words(text) for p in bpe(w, ranks)]


def main():
    os.makedirs(OUT, exist_ok=True)
    merges = train(TRAIN_TEXT, N_MERGES)
    encoder = {BYTE_ENCODER[b]: i for i, b in enumerate(BYTE_ORDER)}
    for a, b in merges:
        if a + b not in encoder:
            encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    ranks = {m: i for i, m in enumerate(merges)}
    with open(os.path.join(OUT, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(os.path.join(OUT, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(a + " " + b + "\n")
    refs = [{"text": t, "ids": encode(t, encoder, ranks)} for t in TEXTS + [TRAIN_TEXT]]
    with open(os.path.join(OUT, "refs.json"), "w", encoding="utf-8") as f:
        json.dump(refs, f, ensure_ascii=True, indent=0)
    print("wrote %s: %d tokens, %d merges, %d reference texts" %
          (OUT, len(encoder), len(merges), len(refs)))


if __name__ == "__main__":
    main()
