#!/usr/bin/env bash
# The demo: a 2-layer GPT (hidden 128, 4 heads, seq 64, byte vocabulary)
# trained on Jane Austen's Northanger Abbey (examples/data) with tensor
# parallelism 2 x data parallelism 2 on 4 local CPU ranks, 30 Adam steps;
# then the same model on one rank, and a step-by-step comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
$bin/tessera-preprocess --input examples/data/northanger_abbey_vol1.txt \
  --output-prefix "$out/austen" --append-eod
$bin/tessera-gen gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
  -o "$out/gpt.mlir"
# The vocabulary pads to 512 in both builds (divisible-by x tp), so they
# train the same model.
$bin/tessera-compile "$out/gpt.mlir" --tp 2 --dp 2 --micro-batch-size 8 \
  --global-batch-size 32 --make-vocab-size-divisible-by 256 --lr 1e-3 \
  -o "$out/gpt-tp2-dp2.tsr"
$bin/tessera-compile "$out/gpt.mlir" --micro-batch-size 8 \
  --global-batch-size 32 --make-vocab-size-divisible-by 512 --lr 1e-3 \
  -o "$out/gpt-1rank.tsr"
$bin/tessera-run -n 4 "$out/gpt-tp2-dp2.tsr" --data "$out/austen" --steps 30 \
  --metrics "$out/tp2dp2.jsonl"
$bin/tessera-run -n 1 "$out/gpt-1rank.tsr" --data "$out/austen" --steps 30 \
  --metrics "$out/r1.jsonl" > /dev/null
python3 test/E2E/Inputs/compare_losses.py --rtol 1e-5 --steps 30 \
  "$out/r1.jsonl" "$out/tp2dp2.jsonl"
