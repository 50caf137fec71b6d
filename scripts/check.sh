#!/usr/bin/env bash
# The whole test suite: installs what is missing (the Python environment of
# the Hugging Face checks, .venv, among it), builds, then runs every
# test (runtime and compiler gtests, MPI gtests on 2, 4 and 8 ranks, and the
# lit suite: dialect, pass and error tests plus the end-to-end parity runs),
# then the runtime's gtests and MPI tests again under ASan and UBSan
# (scripts/sanitize.sh). Where nvcc exists the build includes the CUDA
# backend plugin (warnings are errors) and scripts/cuda-spills.sh reports its
# kernels' registers and fails on spills; GPU tests report Skipped without a
# GPU. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/install-python.sh
bash scripts/build.sh
bash scripts/cuda-spills.sh
ctest --test-dir build --output-on-failure
bash scripts/sanitize.sh
