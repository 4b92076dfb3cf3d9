#!/usr/bin/env python3
"""Hugging Face transformers' side of Hydra's GPT-2 checkpoint tests
(tests/integration/hf_gpt2_test.cc). Runs in the test venv (scripts/hf-venv.sh).

  make DIR ...        a small random GPT2LMHeadModel, written with save_pretrained
  logits DIR ...      its logits for a JSON list of token lists, as raw little-endian float32
  eval DIR ...        {"loss", "tokens"}: mean next-token cross-entropy over non-overlapping
                      windows of context + 1 tokens (the last partial window dropped)
  train DIR CONFIG    per-step training losses of a plain PyTorch AdamW loop over given windows
"""
import argparse
import json

import numpy as np
import torch
from torch.nn import functional as F
from transformers import GPT2Config, GPT2LMHeadModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FORMATS = {"text": "u1", "tokens-u16": "<u2", "tokens-u32": "<u4"}


def load(directory):
    model = GPT2LMHeadModel.from_pretrained(directory, torch_dtype=torch.float32)
    model.eval()  # no dropout (the configs set none anyway)
    return model


def tokens_of(path, fmt):
    return torch.from_numpy(np.fromfile(path, dtype=FORMATS[fmt]).astype(np.int64))


def make(a):
    torch.manual_seed(a.seed)
    config = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, n_positions=a.positions,
                        vocab_size=a.vocab, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():  # LayerNorms start at (1, 0) and biases at 0: move every tensor
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.to(DTYPES[a.dtype]).save_pretrained(a.dir, safe_serialization=True)


def logits(a):
    model = load(a.dir)
    with torch.no_grad():
        out = model(torch.tensor(json.load(open(a.tokens)), dtype=torch.long)).logits
    out.to(torch.float32).numpy().astype("<f4").tofile(a.out)


def evaluate(a):
    model = load(a.dir)
    data = tokens_of(a.data, a.format)
    window = a.context + 1
    windows = data.numel() // window
    w = data[: windows * window].view(windows, window)
    total = 0.0
    with torch.no_grad():
        for i in range(0, windows, 8):
            x, y = w[i:i + 8, :-1], w[i:i + 8, 1:]
            out = model(x).logits
            total += F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1),
                                     reduction="sum").item()
    print(json.dumps({"loss": total / (windows * a.context), "tokens": windows * a.context}))


def train(a):
    cfg = json.load(open(a.config))
    model = load(a.dir)
    data = tokens_of(cfg["data"], cfg["format"])
    t = cfg["context"]
    params = list(model.parameters())  # lm_head.weight is wte.weight: listed once
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    losses = []
    for offsets in cfg["offsets"]:
        w = torch.stack([data[o:o + t + 1] for o in offsets])
        out = model(w[:, :t]).logits
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), w[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if a.save:
        model.save_pretrained(a.save, safe_serialization=True)
    print(json.dumps(losses))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    for flag, default in [("layers", 2), ("embd", 32), ("heads", 4), ("positions", 64),
                          ("vocab", 300), ("seed", 0)]:
        m.add_argument("--" + flag, type=int, default=default)
    m.add_argument("--dtype", choices=list(DTYPES), default="float32")
    lg = sub.add_parser("logits")
    lg.add_argument("dir")
    lg.add_argument("--tokens", required=True, help="JSON file: a list of equal-length lists")
    lg.add_argument("--out", required=True)
    e = sub.add_parser("eval")
    e.add_argument("dir")
    e.add_argument("--data", required=True)
    e.add_argument("--format", choices=list(FORMATS), required=True)
    e.add_argument("--context", type=int, required=True)
    tr = sub.add_parser("train")
    tr.add_argument("dir")
    tr.add_argument("config")
    tr.add_argument("--save", help="write the trained model here")
    a = ap.parse_args()
    {"make": make, "logits": logits, "eval": evaluate, "train": train}[a.command](a)


if __name__ == "__main__":
    main()
