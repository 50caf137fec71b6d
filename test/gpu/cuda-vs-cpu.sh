#!/usr/bin/env bash
# The MLP, a 2-layer GPT (with dropout) and a 2-layer mixture-of-experts
# GPT (4 experts, top-2, capacity factor 1.5) trained 10 Adam steps on one
# GPU with the cuda backend and on the CPU, from the same artifact: the
# losses must agree within 1e-4 relative at every step (the GPT in bf16
# with the distributed optimizer within 1e-2). Needs a GPU: without one it
# exits 77, which ctest reports as Skipped (label "gpu").
#
# usage: cuda-vs-cpu.sh BINDIR SOURCE_DIR
set -euo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin/tessera-compile" "$src/examples/mlp.mlir" --micro-batch-size 32 \
  --global-batch-size 64 -o "$tmp/mlp.tsr"
if ! "$bin/tessera-run" -n 1 "$tmp/mlp.tsr" --steps 10 --backend cuda \
     --metrics "$tmp/mlp-cuda.jsonl" > "$tmp/mlp-cuda.log" 2> "$tmp/err.log"; then
  if grep -q "no GPU to run on" "$tmp/err.log"; then
    echo "SKIPPED: $(cat "$tmp/err.log")"
    exit 77
  fi
  cat "$tmp/err.log" >&2
  exit 1
fi
"$bin/tessera-run" -n 1 "$tmp/mlp.tsr" --steps 10 \
  --metrics "$tmp/mlp-cpu.jsonl" > /dev/null

"$bin/tessera-preprocess" --input "$src/examples/data/northanger_abbey_vol1.txt" \
  --output-prefix "$tmp/austen" --append-eod > /dev/null
"$bin/tessera-gen" gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
  --dropout 0.1 -o "$tmp/gpt.mlir"
"$bin/tessera-compile" "$tmp/gpt.mlir" --micro-batch-size 4 \
  --global-batch-size 8 -o "$tmp/gpt.tsr"
# bf16 mixed precision with the distributed optimizer (one Adam kernel per
# bucket, the Cast kernels): the bf16 roundings of slightly different f32
# values may differ by an ulp, hence the looser bound.
"$bin/tessera-compile" "$tmp/gpt.mlir" --micro-batch-size 4 \
  --global-batch-size 8 --bf16 --use-distributed-optimizer -o "$tmp/gpt-bf16.tsr"
"$bin/tessera-gen" gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
  --num-experts 4 --moe-router-topk 2 --moe-expert-capacity-factor 1.5 \
  -o "$tmp/moe.mlir"
"$bin/tessera-compile" "$tmp/moe.mlir" --micro-batch-size 4 \
  --global-batch-size 8 -o "$tmp/moe.tsr"
for backend in cpu cuda; do
  "$bin/tessera-run" -n 1 "$tmp/moe.tsr" --steps 10 --backend $backend \
    --data "$tmp/austen" --metrics "$tmp/moe-$backend.jsonl" > /dev/null
  "$bin/tessera-run" -n 1 "$tmp/gpt.tsr" --steps 10 --backend $backend \
    --data "$tmp/austen" --metrics "$tmp/gpt-$backend.jsonl" > /dev/null
  "$bin/tessera-run" -n 1 "$tmp/gpt-bf16.tsr" --steps 10 --backend $backend \
    --data "$tmp/austen" --metrics "$tmp/gpt-bf16-$backend.jsonl" > /dev/null
done

python3 "$src/test/E2E/Inputs/compare_losses.py" --rtol 1e-4 --steps 10 \
  "$tmp/mlp-cpu.jsonl" "$tmp/mlp-cuda.jsonl"
python3 "$src/test/E2E/Inputs/compare_losses.py" --rtol 1e-4 --steps 10 \
  "$tmp/gpt-cpu.jsonl" "$tmp/gpt-cuda.jsonl"
python3 "$src/test/E2E/Inputs/compare_losses.py" --rtol 1e-2 --steps 10 \
  "$tmp/gpt-bf16-cpu.jsonl" "$tmp/gpt-bf16-cuda.jsonl"
python3 "$src/test/E2E/Inputs/compare_losses.py" --rtol 1e-4 --steps 10 \
  "$tmp/moe-cpu.jsonl" "$tmp/moe-cuda.jsonl"
