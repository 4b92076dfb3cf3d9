#!/usr/bin/env python3
"""Exports a small GPT-style language model as TorchScript for `hydra run` / a MultiModelJob.

Hydra trains any model whose top-level children run in order (an nn.Sequential): here the
token+position embedding, the transformer blocks and the head are the children, so Hydra can
cut the model into shards between any two of them. The module takes [batch, time] token ids
and returns [batch, time, vocab] logits.

    python3 examples/torchscript/export_gpt.py --out examples/torchscript/gpt.pt

Then `hydra run examples/torchscript/sweep.yaml` trains a grid of it; each trial's trained
weights are in <output>/checkpoints/<trial>/model.pt:

    model = torch.jit.load("examples/torchscript/gpt.pt")
    model.load_state_dict(torch.load("hydra-runs/ts-sweep/checkpoints/<trial>/model.pt"))
"""
import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F


class Embedding(nn.Module):
    def __init__(self, vocab: int, context: int, width: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        return self.tokens(idx) + self.positions(pos)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context)).bool())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // h)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.lm = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(x))


def gpt(layers: int, width: int, heads: int, context: int, vocab: int) -> nn.Sequential:
    stages = [Embedding(vocab, context, width)]
    stages += [Block(width, heads, context) for _ in range(layers)]
    stages.append(Head(width, vocab))
    model = nn.Sequential(*stages)
    for name, p in model.named_parameters():  # GPT-2's initialisation
        if p.dim() >= 2:
            nn.init.normal_(p, 0.0, 0.02)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the TorchScript file")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    ap.add_argument("--width", type=int, default=128, help="hidden width (default 128)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--context", type=int, default=128, help="tokens per sequence (default 128)")
    ap.add_argument("--vocab", type=int, default=256, help="vocabulary (default 256: bytes)")
    ap.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model = gpt(a.layers, a.width, a.heads, a.context, a.vocab)
    torch.jit.save(torch.jit.script(model), a.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: {len(model)} stages, {n} parameters")


if __name__ == "__main__":
    main()
