#!/usr/bin/env bash
# examples/finetune/run.sh end to end in a scratch copy of the example: prepare, pretrain and
# export a base, fine-tune a grid from it, export the best, eval, load in transformers. Checks
# that the fine-tuned model scores better than its base under hydra eval and that transformers
# loaded it. Skipped (77) without the Hugging Face venv unless HYDRA_HF_PYTHON names one.
#   finetune_example_test.sh SOURCE_DIR HYDRA_BINARY
set -euo pipefail
src="$1" hydra="$2"
if [ -z "${HYDRA_HF_PYTHON:-}" ] && [ ! -x "$HOME/.cache/hydra/hf-venv/bin/python" ]; then
  echo "SKIP: no Hugging Face venv (scripts/hf-venv.sh)"
  exit 77
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp -r "$src/examples/finetune" "$scratch/finetune"
rm -rf "$scratch/finetune/work"
HYDRA_SOURCE="$src" HYDRA="$hydra" bash "$scratch/finetune/run.sh" >"$scratch/out.txt" 2>&1 || {
  cat "$scratch/out.txt"
  exit 1
}
cat "$scratch/out.txt"
work="$scratch/finetune/work"
for f in tokenizer.json tokens.bin base/model.safetensors base/config.json best/model.safetensors \
  best/config.json; do
  [ -s "$work/$f" ] || { echo "FAIL: $f missing"; exit 1; }
done
mapfile -t losses < <(grep -o '^loss [0-9.]*' "$scratch/out.txt" | cut -d' ' -f2)
[ "${#losses[@]}" -eq 2 ] || { echo "FAIL: want two hydra eval losses"; exit 1; }
awk -v base="${losses[0]}" -v best="${losses[1]}" 'BEGIN { exit !(best < base) }' ||
  { echo "FAIL: the fine-tuned model (${losses[1]}) is not better than its base (${losses[0]})"; exit 1; }
grep -q '"firstWindowLoss"' "$scratch/out.txt" || { echo "FAIL: transformers did not load it"; exit 1; }
echo "PASS: base ${losses[0]} -> fine-tuned ${losses[1]} nats/token"
