#!/usr/bin/env bash
# The compiler tools (tessera-opt, tessera-compile, tessera-gen,
# tessera-translate, tessera-plan) and
# tessera-run / tessera-preprocess built with AddressSanitizer and
# UndefinedBehaviorSanitizer into build-asan-compiler/, then the whole lit
# suite run with them (dialect, pass and error tests and the end-to-end
# runs). Any out-of-bounds access, use after free or undefined behaviour
# fails its test. Not part of CI (a full compiler build takes long on two
# cores): run it before landing a big change to the compiler.
# Leak checking is off, as in scripts/sanitize.sh (Open MPI's components).
# Usage: scripts/sanitize-compiler.sh [LIT_FLAGS...] (e.g. --filter Transforms)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
B=build-asan-compiler
if [ ! -f $B/build.ninja ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTESSERA_ENABLE_CUDA=OFF \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
    "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
    "-DCMAKE_C_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
    "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined"
fi
cmake --build $B -j2 --target tessera-opt tessera-compile tessera-gen tessera-translate \
  tessera-plan tessera-run tessera-preprocess
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  /usr/lib/llvm-22/bin/lit -sv "$@" $B/test
