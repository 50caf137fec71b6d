#!/usr/bin/env bash
# scripts/gpu-kit.sh and scripts/gpu-check.sh keep working: a kit made from
# this build (not packed) and checked here. The kit's own check (the MLP on
# 2 CPU ranks through the kit's mpirun, OpenMPI and OpenBLAS) must pass;
# without a GPU the GPU checks must report that (exit 77, gpu_step.json
# "skipped"), with one they must pass.
#
# usage: gpu-kit.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GPU_KIT_PACK=0 bash "$src/scripts/gpu-kit.sh" "$build" "$tmp/kit" > "$tmp/kit.log"
bash "$src/scripts/gpu-check.sh" "$tmp/kit" "$tmp/out" > /dev/null || true
cat "$tmp/out/summary.txt"
grep -qx "kit-cpu-2-ranks: exit 0" "$tmp/out/summary.txt" ||
  { cat "$tmp/out/kit.log" >&2; exit 1; }
if grep -qx "conformance: exit 77" "$tmp/out/summary.txt"; then
  grep -qx "cuda-vs-cpu: exit 77" "$tmp/out/summary.txt"
  grep -q '"skipped"' "$tmp/out/gpu_step.json"
  echo "the kit works; no GPU here for the GPU checks"
else
  ! grep -v ": exit 0$" "$tmp/out/summary.txt"
fi
