#!/usr/bin/env python3
"""Trains a TorchScript model in Python exactly as the MultiModelJob says, for comparison with
Hydra's C++ executors (tests/integration/torchscript_test.cc).

Input: a JSON file with the module path, the token file (text format: one byte per token), the
start offsets of every step's windows (from Hydra's own TrainWindowOffsets), the context length
and the AdamW settings. AdamW's weight decay applies to parameters of 2 or more dimensions, as
in Hydra. Prints a JSON list of the per-step training losses.
Optionally, --check-state FILE loads a state dict Hydra wrote (model.pt) into the module and
prints the loss of the first window with those weights instead.
"""
import argparse
import json

import torch
from torch.nn import functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--check-state", help="a state dict written by Hydra to load and evaluate")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    torch.manual_seed(0)
    model = torch.jit.load(cfg["model"])
    model.train()
    data = torch.tensor(list(open(cfg["data"], "rb").read()), dtype=torch.long)
    t = cfg["context"]

    def batch(offsets):
        w = torch.stack([data[o:o + t + 1] for o in offsets])
        return w[:, :t], w[:, 1:]

    def loss_of(x, y):
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    if a.check_state:
        model.load_state_dict(torch.load(a.check_state))
        with torch.no_grad():
            print(json.dumps(loss_of(*batch(cfg["offsets"][0])).item()))
        return
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]},
         {"params": rest, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    losses = []
    for offsets in cfg["offsets"]:
        loss = loss_of(*batch(offsets))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(json.dumps(losses))


if __name__ == "__main__":
    main()
