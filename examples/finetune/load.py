#!/usr/bin/env python3
"""Loads a model Hydra exported (`hydra export`, or the model.safetensors + config.json a
finished gpt2 trial leaves next to its checkpoints) with Hugging Face transformers, prints its
loss on the first window of a token file and a greedy continuation decoded by tokenizer.json.
Run it in the venv of scripts/hf-venv.sh:

  python load.py work/best --tokenizer work/tokenizer.json --data work/tokens.bin
"""
import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="the token file prepare.py wrote")
    ap.add_argument("--prompt", default="The ")
    ap.add_argument("--tokens", type=int, default=40, help="tokens to generate")
    a = ap.parse_args()

    model = GPT2LMHeadModel.from_pretrained(a.model_dir).eval()
    tok = Tokenizer.from_file(str(a.tokenizer))
    context = model.config.n_positions
    dtype = "<u2" if model.config.vocab_size <= 1 << 16 else "<u4"
    window = torch.from_numpy(np.fromfile(a.data, dtype=dtype, count=context + 1).astype(np.int64))
    with torch.no_grad():
        loss = model(window[None, :-1], labels=window[None, :-1]).loss.item()
        ids = torch.tensor([tok.encode(a.prompt).ids])
        for _ in range(a.tokens):
            logits = model(ids[:, -context:]).logits[0, -1]
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    print(json.dumps({"model": str(a.model_dir), "parameters": model.num_parameters(),
                      "firstWindowLoss": loss}))
    print(tok.decode(ids[0].tolist()))


if __name__ == "__main__":
    main()
