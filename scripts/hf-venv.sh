#!/usr/bin/env bash
# Sets up, once, the Python venv of the Hugging Face tools (cached outside the repo in
# ${HYDRA_HF_VENV:-~/.cache/hydra/hf-venv}) and prints its python:
#   - transformers: the GPT-2 checkpoint tests (tests/integration/hf_gpt2_test.cc) compare Hydra
#     with it; examples/finetune/ loads exported models with it,
#   - tokenizers: examples/finetune/prepare.py trains a BPE tokenizer and tokenises a corpus.
# Built on Debian's python3 with its site packages, so it uses Debian's python3-torch (1.13, the
# version of build/'s LibTorch): transformers 4.40 is the last line that supports torch < 2.
# A stamp file records what is installed, so later runs skip pip; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh

VENV="${HYDRA_HF_VENV:-$HOME/.cache/hydra/hf-venv}"
REQUIREMENTS=(
  "transformers==4.40.2"
  "tokenizers==0.19.1"
  "safetensors==0.4.3"
  "huggingface-hub==0.23.4"
)

pinned_venv hf-venv "$VENV" /usr/bin/python3 .hydra-hf-stamp --system-site-packages \
  "${REQUIREMENTS[@]}"
"$VENV/bin/python" -c "import torch, transformers, tokenizers" || {
  echo "hf-venv: $VENV cannot import torch, transformers and tokenizers" >&2
  exit 1
}
echo "$VENV/bin/python"
