#!/usr/bin/env bash
# The runtime (no LLVM) and its gtests and MPI tests under AddressSanitizer
# and UndefinedBehaviorSanitizer, in build-asan/. Any out-of-bounds access,
# use after free or undefined behaviour aborts its test. Leak checking is
# off: Open MPI keeps allocations of its dlopen'd components past
# MPI_Finalize, which LeakSanitizer cannot tell from ours.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build-asan/build.ninja ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTESSERA_BUILD_COMPILER=OFF -DTESSERA_ENABLE_CUDA=OFF \
    "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
fi
cmake --build build-asan -j2
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure
