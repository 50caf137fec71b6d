#!/usr/bin/env bash
# scripts/fuzz.sh TARGET SECONDS [LIBFUZZER_FLAGS...]
#
# Runs one libFuzzer target of fuzz/ for SECONDS under AddressSanitizer and
# UndefinedBehaviorSanitizer. Targets: artifact_loader, dataset_index,
# checkpoint_manifest, checkpoint_shard (the runtime), mlir_pipeline (the
# compiler: parse, verify, tessera-train-pipeline) and onnx_import (the ONNX
# importer).
#
# Installs clang-14 and its fuzzer runtime (Debian's clang-14,
# libclang-rt-14-dev, libomp-14-dev) when missing, configures a runtime-only
# build in build-fuzz/ (TESSERA_BUILD_FUZZERS=ON, no compiler, no CUDA; for
# mlir_pipeline, build-fuzz-mlir/ with the compiler over LLVM/MLIR 22),
# builds the target, writes the seeds (fuzz/make-seeds.sh) to B/seeds/, and
# fuzzes one process at a time, keeping the corpus in B/corpus/TARGET (new
# inputs accumulate there across runs).
# Exits non-zero on a crash, leak, timeout (10 s an input) or out-of-memory
# (2 GiB), printing the reproducer's path (under B/crashes/TARGET/) and the
# command that replays it. The log is B/logs/TARGET.log.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS [LIBFUZZER_FLAGS...]" >&2
  echo "targets: artifact_loader dataset_index checkpoint_manifest checkpoint_shard mlir_pipeline onnx_import" >&2
  exit 2
fi
target=$1
seconds=$2
shift 2
case "$target" in
  artifact_loader|dataset_index|checkpoint_manifest|checkpoint_shard|mlir_pipeline|onnx_import) ;;
  *) echo "fuzz.sh: unknown target '$target'" >&2; exit 2 ;;
esac

scripts/install-deps.sh
pkgs=(clang-14 libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz.sh: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

B=build-fuzz
compiler=(-DTESSERA_BUILD_COMPILER=OFF)
if [ "$target" = mlir_pipeline ] || [ "$target" = onnx_import ]; then
  B=build-fuzz-mlir
  compiler=(-DTESSERA_BUILD_COMPILER=ON
            -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir)
fi
if [ ! -f $B/build.ninja ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    "${compiler[@]}" -DTESSERA_ENABLE_CUDA=OFF \
    -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_FUZZERS=ON
fi
cmake --build $B -j2 --target tessera-fuzz-$target tessera-fuzz-seeds
fuzz/make-seeds.sh $B/seeds $B

corpus=$B/corpus/$target
crashes=$B/crashes/$target
mkdir -p "$corpus" "$crashes" $B/logs
log=$B/logs/$target.log
stamp=$(mktemp)
echo "fuzz.sh: $target for ${seconds}s; corpus $corpus, log $log"
set +e
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  $B/bin/tessera-fuzz-$target "$corpus" "$B/seeds/$target" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  repro=$(find "$crashes" -type f -newer "$stamp" | head -n 1)
  rm -f "$stamp"
  echo "fuzz.sh: $target FAILED (exit $rc)" >&2
  if [ -n "$repro" ]; then
    echo "fuzz.sh: reproducer: $repro" >&2
    echo "fuzz.sh: replay with: $B/bin/tessera-fuzz-$target $repro" >&2
  fi
  exit "$rc"
fi
rm -f "$stamp"
echo "fuzz.sh: $target: no crash, leak or timeout in ${seconds}s"
