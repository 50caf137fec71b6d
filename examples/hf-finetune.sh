#!/usr/bin/env bash
# Hugging Face in and out: make a small Llama with transformers (random
# weights: these machines download none), save it as a Hugging Face
# directory, compile it with its weights at tp 2 x dp 2, fine-tune 30 steps
# on Jane Austen's text on 4 CPU ranks, export the result, and score the
# exported model in transformers on the batch after the last step next to
# Tessera's own evaluation of it (tessera-run --eval-only). Needs the build and .venv
# (scripts/install-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
python=.venv/bin/python
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
$bin/tessera-preprocess --input examples/data/northanger_abbey_vol1.txt \
  --output-prefix "$out/austen" --append-eod > /dev/null
# A Llama with grouped-query attention, vocabulary 258 (the byte tokenizer's
# 257 rounded to divide by tp 2: no padded rows, so the export is exactly
# the trained model).
$python test/E2E/Inputs/hf_make.py --arch llama "$out/llama"
echo "== the Hugging Face directory:"
ls "$out/llama"
$bin/tessera-compile "$out/llama" --seq-length 32 --tp 2 --dp 2 \
  --sequence-parallel --micro-batch-size 2 --global-batch-size 8 \
  --make-vocab-size-divisible-by 1 -o "$out/llama.tsr"
echo "== fine-tuning 30 steps at tp 2 x dp 2:"
$bin/tessera-run -n 4 "$out/llama.tsr" --data "$out/austen" --steps 30 \
  --save "$out/ckpt" --save-interval 30 | grep -E "iteration +(1|10|20|30)/"
echo "== Tessera's evaluation of batch 31 (the forward alone):"
$bin/tessera-run -n 4 "$out/llama.tsr" --data "$out/austen" --load "$out/ckpt" \
  --eval-only --metrics "$out/m.jsonl" | grep "validation loss"
$bin/tessera-export "$out/ckpt" -o "$out/finetuned"
echo "== the exported model in transformers, on batch 31:"
$python test/E2E/Inputs/hf_loss.py --model "$out/finetuned" --data "$out/austen" \
  --iteration 31 --seq 32 --micro-batch-size 2 --global-batch-size 8 \
  --metrics "$out/m.jsonl"
