#!/usr/bin/env bash
# Reports the CUDA backend's register use and spills: compiles its kernel
# files (runtime/src/backends/cuda/*.cu) with ptxas's resource report for each target architecture (80 and 90,
# or $CUDA_ARCHS) and prints one line per architecture with the number of
# kernels, the most registers any uses, and every kernel that spills.
# Exits 1 if any kernel spills (the build itself only warns, -warn-spills).
# Does nothing (exit 0) where nvcc is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
if [ ! -x "$nvcc" ]; then
  echo "cuda-spills: no nvcc at $nvcc, nothing to report"
  exit 0
fi
gen=build/runtime/include
[ -d "$gen" ] || gen=$(mktemp -d)
status=0
for arch in ${CUDA_ARCHS:-80 90}; do
  report=""
  for cu in runtime/src/backends/cuda/*.cu; do
    report+=$("$nvcc" -std=c++17 -O3 -arch=sm_$arch -Xptxas=-v -c \
      -I runtime/include -I runtime/src/backends/cuda -I "$gen" -o /dev/null \
      "$cu" 2>&1)$'\n'
  done
  kernels=$(grep -c "Compiling entry function" <<<"$report" || true)
  maxreg=$(grep -o "Used [0-9]* registers" <<<"$report" |
           awk '{ if ($2 > m) m = $2 } END { print m + 0 }')
  spilling=$(awk '/Compiling entry function/ { name = $0 }
                  /bytes spill stores/ {
                    match($0, /[0-9]+ bytes spill stores/); st = substr($0, RSTART) + 0
                    match($0, /[0-9]+ bytes spill loads/); ld = substr($0, RSTART) + 0
                    if (st > 0 || ld > 0) print name }' \
             <<<"$report" | sed "s/.*function '\(.*\)' for.*/\1/" | c++filt)
  if [ -n "$spilling" ]; then
    echo "cuda-spills: sm_$arch: $kernels kernels, up to $maxreg registers; SPILLING:"
    echo "$spilling" | sed 's/^/  /'
    status=1
  else
    echo "cuda-spills: sm_$arch: $kernels kernels, up to $maxreg registers, no spills"
  fi
done
exit $status
