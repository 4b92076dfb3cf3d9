#!/usr/bin/env bash
# examples/finetune end to end (README.md): prepare the tokens, train a base model to stand in
# for a pretrained one and export it, fine-tune a grid from it, export the best trial, score it
# with hydra eval and load it in Hugging Face transformers. Everything it writes goes to work/.
#   HYDRA: the hydra binary (default: build/cli/hydra of this repository)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="${HYDRA_SOURCE:-$here/../..}"
hydra="${HYDRA:-$repo/build/cli/hydra}"
work="$here/work"
py="$(bash "$repo/scripts/hf-venv.sh")"

echo "== 1. prepare: a 512-token BPE tokenizer trained on the corpus, and the corpus's tokens"
"$py" "$here/prepare.py" --corpus "$repo/examples/data/corpus.txt" --train-vocab 512 \
  --out "$work/tokens.bin"

echo "== 2. a base model (stands in for a pretrained GPT-2), exported as Hugging Face's format"
"$hydra" run "$here/pretrain.yaml" -o "$work/pretrain" --restart --progress quiet | tail -n 4
"$hydra" export "$work/pretrain" --trial base-base -o "$work/base"

echo "== 3. fine-tune a grid from it (spec.model.init)"
"$hydra" run "$here/finetune.yaml" -o "$work/finetune" --restart --progress quiet

echo "== 4. export the best trial, score it, load it in transformers"
best="$("$py" -c 'import json, sys
trials = [t for t in json.load(open(sys.argv[1]))["trials"] if t["finalValLoss"] is not None]
print(min(trials, key=lambda t: t["finalValLoss"])["name"])' "$work/finetune/results.json")"
"$hydra" export "$work/finetune" --trial "$best" -o "$work/best"
"$hydra" eval "$here/finetune.yaml" --init "$work/base/model.safetensors" --data "$work/tokens.bin"
"$hydra" eval "$here/finetune.yaml" --init "$work/best/model.safetensors" --data "$work/tokens.bin"
"$py" "$here/load.py" "$work/best" --tokenizer "$work/tokenizer.json" --data "$work/tokens.bin"
