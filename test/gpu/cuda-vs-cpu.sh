#!/usr/bin/env bash
# The MLP, a 2-layer GPT (with dropout) and a 2-layer mixture-of-experts
# GPT (4 experts, top-2, capacity factor 1.5) trained 10 Adam steps on one
# GPU with the cuda backend and on the CPU, from the same artifact: the
# losses must agree within 1e-4 relative at every step (the GPT in bf16
# with the distributed optimizer within 1e-2). Needs a GPU: without one it
# exits 77, which ctest reports as Skipped (label "gpu").
#
# usage: cuda-vs-cpu.sh BINDIR SOURCE_DIR          compile, then check
#        cuda-vs-cpu.sh --prepare BINDIR SOURCE_DIR DIR
#                                                  compile the artifacts and
#                                                  the data into DIR only
#        cuda-vs-cpu.sh --check BINDIR SOURCE_DIR DIR
#                                                  check with DIR's (needs
#                                                  only tessera-run: what a
#                                                  GPU machine without the
#                                                  compiler runs, see
#                                                  scripts/gpu-kit.sh)
set -euo pipefail
mode=all
case "${1:-}" in
--prepare | --check) mode=${1#--}; shift ;;
esac
bin=$1
src=$2

prepare() {
  local dir=$1
  mkdir -p "$dir"
  "$bin/tessera-compile" "$src/examples/mlp.mlir" --micro-batch-size 32 \
    --global-batch-size 64 -o "$dir/mlp.tsr"
  "$bin/tessera-preprocess" --input "$src/examples/data/northanger_abbey_vol1.txt" \
    --output-prefix "$dir/austen" --append-eod > /dev/null
  "$bin/tessera-gen" gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
    --dropout 0.1 -o "$dir/gpt.mlir"
  "$bin/tessera-compile" "$dir/gpt.mlir" --micro-batch-size 4 \
    --global-batch-size 8 -o "$dir/gpt.tsr"
  # bf16 mixed precision with the distributed optimizer (one Adam kernel per
  # bucket, the Cast kernels, bf16 GEMMs): both backends take the same bf16
  # operands, but their f32 sums differ in order and a result may round to
  # the neighbouring bf16 value on its way into the next GEMM, hence the
  # looser bound.
  "$bin/tessera-compile" "$dir/gpt.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --bf16 --use-distributed-optimizer -o "$dir/gpt-bf16.tsr"
  "$bin/tessera-gen" gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
    --num-experts 4 --moe-router-topk 2 --moe-expert-capacity-factor 1.5 \
    -o "$dir/moe.mlir"
  "$bin/tessera-compile" "$dir/moe.mlir" --micro-batch-size 4 \
    --global-batch-size 8 -o "$dir/moe.tsr"
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

check() {
  local dir=$1
  if ! "$bin/tessera-run" -n 1 "$dir/mlp.tsr" --steps 10 --backend cuda \
       --metrics "$out/mlp-cuda.jsonl" > "$out/mlp-cuda.log" 2> "$out/err.log"; then
    if grep -q "no GPU to run on" "$out/err.log"; then
      echo "SKIPPED: $(cat "$out/err.log")"
      return 77
    fi
    cat "$out/err.log" >&2
    return 1
  fi
  "$bin/tessera-run" -n 1 "$dir/mlp.tsr" --steps 10 \
    --metrics "$out/mlp-cpu.jsonl" > /dev/null
  for backend in cpu cuda; do
    for model in moe gpt gpt-bf16; do
      "$bin/tessera-run" -n 1 "$dir/$model.tsr" --steps 10 --backend $backend \
        --data "$dir/austen" --metrics "$out/$model-$backend.jsonl" > /dev/null
    done
  done
  local compare="$src/test/E2E/Inputs/compare_losses.py"
  python3 "$compare" --rtol 1e-4 --steps 10 "$out/mlp-cpu.jsonl" "$out/mlp-cuda.jsonl"
  python3 "$compare" --rtol 1e-4 --steps 10 "$out/gpt-cpu.jsonl" "$out/gpt-cuda.jsonl"
  python3 "$compare" --rtol 1e-2 --steps 10 \
    "$out/gpt-bf16-cpu.jsonl" "$out/gpt-bf16-cuda.jsonl"
  python3 "$compare" --rtol 1e-4 --steps 10 "$out/moe-cpu.jsonl" "$out/moe-cuda.jsonl"
}

case $mode in
prepare) prepare "$3" ;;
check) check "$3" ;;
all)
  prepare "$out/artifacts"
  check "$out/artifacts"
  ;;
esac
