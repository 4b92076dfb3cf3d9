#!/usr/bin/env python3
"""Writes model files Hydra must refuse with a clear error (tests/integration/torchscript_test.cc):
not-sequential.pt (children that do not make up forward), no-children.pt, float64.pt,
wrong-output.pt (returns hidden states, not logits), untrainable.pt (an operation without a
gradient), future-version.pt (an archive whose version
record is newer than any LibTorch reads), not-torchscript.pt (random bytes)."""
import os
import sys
import zipfile

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torchscript"))
from export_gpt import Embedding, Head  # noqa: E402


class Residual(nn.Module):
    """Its forward adds the embedding around the head: not its children in order."""

    def __init__(self, vocab: int, context: int, width: int):
        super().__init__()
        self.embed = Embedding(vocab, context, width)
        self.head = Head(width, vocab)
        self.lift = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        return self.head(x) + self.lift(x)


class ZetaHead(Head):
    """Passes its logits through Hurwitz's zeta: an operation without a derivative."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.zeta(self.lm(self.ln(x)).abs() + 2.0, 2.0)


class Bare(nn.Module):
    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(vocab, vocab))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table[idx]


def main() -> None:
    out, vocab, context, width = sys.argv[1], 256, 32, 16
    os.makedirs(out, exist_ok=True)
    save = lambda m, name: torch.jit.save(torch.jit.script(m), os.path.join(out, name))
    save(Residual(vocab, context, width), "not-sequential.pt")
    save(Bare(vocab, width), "no-children.pt")
    save(nn.Sequential(Embedding(vocab, context, width), Head(width, vocab)).double(), "float64.pt")
    save(nn.Sequential(Embedding(vocab, context, width)), "wrong-output.pt")
    save(nn.Sequential(Embedding(vocab, context, width), ZetaHead(width, vocab)),
         "untrainable.pt")
    good = os.path.join(out, "good.pt")
    save(nn.Sequential(Embedding(vocab, context, width), Head(width, vocab)), "good.pt")
    with zipfile.ZipFile(good) as src, \
            zipfile.ZipFile(os.path.join(out, "future-version.pt"), "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("/version"):
                data = b"99\n"
            dst.writestr(item, data)
    with open(os.path.join(out, "not-torchscript.pt"), "wb") as f:
        f.write(os.urandom(4096))


if __name__ == "__main__":
    main()
