#!/usr/bin/env python3
"""Tokenises a text corpus for Hydra: writes the token ids as a flat little-endian file that a
MultiModelJob reads with spec.dataset.format tokens-u16 (vocabularies up to 65,536) or
tokens-u32 (larger ones).

The tokenizer is a Hugging Face `tokenizer.json` (the `tokenizers` library from PyPI): an
existing one (--tokenizer, e.g. GPT-2's, so a pretrained checkpoint sees the ids it was trained
on), or, with --train-vocab N, a byte-level BPE tokenizer of N tokens trained on the corpus
itself (nothing is downloaded). Run it in the venv of scripts/hf-venv.sh:

  python prepare.py --corpus ../data/corpus.txt --train-vocab 512 --out work/tokens.bin
"""
import argparse
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

END_OF_TEXT = "<|endoftext|>"  # GPT-2's separator token


def train_tokenizer(corpus: Path, vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([str(corpus)], trainer)
    return tok


def encode(tok: Tokenizer, corpus: Path, batch_lines: int = 4096):
    """The corpus's token ids, a batch of lines at a time (each line keeps its newline)."""
    ids = []
    with open(corpus, encoding="utf-8") as f:
        lines = []
        for line in f:
            lines.append(line)
            if len(lines) == batch_lines:
                ids.extend(i for e in tok.encode_batch(lines) for i in e.ids)
                lines = []
        if lines:
            ids.extend(i for e in tok.encode_batch(lines) for i in e.ids)
    return ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="UTF-8 text file")
    ap.add_argument("--out", type=Path, required=True, help="token file to write")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", type=Path, help="an existing tokenizer.json")
    src.add_argument("--train-vocab", type=int, metavar="N",
                     help="train a byte-level BPE tokenizer of N tokens on the corpus; it is "
                          "saved as tokenizer.json next to --out")
    ap.add_argument("--format", choices=["auto", "tokens-u16", "tokens-u32"], default="auto",
                    help="auto: tokens-u16 when the vocabulary fits 16 bits")
    a = ap.parse_args()

    if not a.corpus.is_file():
        print(f"error: --corpus {a.corpus}: no such file", file=sys.stderr)
        return 2
    if a.tokenizer:
        if not a.tokenizer.is_file():
            print(f"error: --tokenizer {a.tokenizer}: no such file", file=sys.stderr)
            return 2
        tok = Tokenizer.from_file(str(a.tokenizer))
    else:
        if not 257 <= a.train_vocab <= 1 << 24:
            print("error: --train-vocab must be in 257..16777216 (256 bytes and more)",
                  file=sys.stderr)
            return 2
        tok = train_tokenizer(a.corpus, a.train_vocab)
    vocab = tok.get_vocab_size()
    fmt = a.format if a.format != "auto" else ("tokens-u16" if vocab <= 1 << 16 else "tokens-u32")
    if fmt == "tokens-u16" and vocab > 1 << 16:
        print(f"error: a vocabulary of {vocab} does not fit tokens-u16; use tokens-u32",
              file=sys.stderr)
        return 2

    ids = np.asarray(encode(tok, a.corpus), dtype="<u2" if fmt == "tokens-u16" else "<u4")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    ids.tofile(a.out)
    if a.train_vocab:
        tok.save(str(a.out.parent / "tokenizer.json"))
    print(f"{a.out}: {ids.size} tokens, format {fmt}, vocabulary {vocab} "
          f"(spec.dataset.format: {fmt}; spec.model.vocabSize: {vocab} or more)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
