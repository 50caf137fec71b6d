#!/usr/bin/env bash
# The demo: compile the MLP for tp=2 x dp=2 and train it for 20 Adam steps on
# 4 local CPU ranks, next to the same model on one rank.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
out=$(mktemp -d)
$bin/tessera-compile examples/mlp.mlir --tp 2 --dp 2 --micro-batch-size 16 \
  --global-batch-size 64 --optimizer adam --lr 1e-3 -o "$out/mlp-tp2-dp2.tsr"
$bin/tessera-compile examples/mlp.mlir --micro-batch-size 64 \
  --global-batch-size 64 --optimizer adam --lr 1e-3 -o "$out/mlp-1rank.tsr"
$bin/tessera-run -n 4 "$out/mlp-tp2-dp2.tsr" --steps 20 --metrics "$out/tp2dp2.jsonl"
$bin/tessera-run -n 1 "$out/mlp-1rank.tsr" --steps 20 --metrics "$out/r1.jsonl" > /dev/null
python3 test/E2E/Inputs/compare_losses.py --rtol 1e-5 --steps 20 \
  "$out/r1.jsonl" "$out/tp2dp2.jsonl"
rm -rf "$out"
