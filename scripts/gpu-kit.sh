#!/usr/bin/env bash
# Packs what the CUDA backend's GPU checks need into one directory, for a
# GPU machine that has CUDA, cuBLAS and NCCL but neither the compiler's
# LLVM/MLIR nor MPI or OpenBLAS (the `device` tool's machines: see
# docs/ARCHITECTURE.md section 9). Everything that needs the compiler runs
# here; the kit holds only what runs there:
#   bin/  tessera-run, the cuda plugin and TesseraCudaConformanceTest (the
#         plugin next to both, where they look for it);
#   lib/  their shared libraries other than glibc's, libstdc++'s and
#         CUDA's (OpenMPI, OpenBLAS, gfortran, ...);
#   usr/  OpenMPI's runtime (mpirun, its components and help files) and
#         PMIx's, relocated with OPAL_PREFIX and PMIX_INSTALL_PREFIX;
#   cuda-vs-cpu/, gpu-step/  the artifacts and data of
#         test/gpu/cuda-vs-cpu.sh and bench/gpu_step.py (--prepare), and
#         mlp-dp2.tsr, which checks the kit itself (2 ranks, CPU backend).
# scripts/gpu-check.sh runs the checks from it there.
#
# usage: scripts/gpu-kit.sh [BUILD_DIR] [KIT_DIR]   (default: build .gpu-kit)
# makes KIT_DIR and KIT_DIR.tar.xz, which is what a GPU machine is sent
# (GPU_KIT_PACK=0: the directory only).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
kit=${2:-$src/.gpu-kit}

conformance=$build/unittests/TesseraCudaConformanceTest
plugin=$build/lib/libTesseraBackend_cuda.so
for f in "$build/bin/tessera-run" "$plugin" "$conformance"; do
  [[ -x $f || -f $f ]] || { echo "gpu-kit: $f is missing (build with the CUDA backend first)" >&2; exit 1; }
done

rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib"
cp "$build/bin/tessera-run" "$plugin" "$conformance" "$kit/bin/"

# Shared libraries: what ldd resolves, but glibc (the machine's own is
# newer), libstdc++/libgcc (likewise) and CUDA's (cudart, cuBLASLt, NCCL:
# the machine's, found by gpu-check.sh).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcudart|libcublas|libnccl|libcuda\.)'
libs() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    while read -r name path; do
      [[ $name =~ $skip ]] || echo "$path"
    done
}
# OpenMPI's runtime under a prefix of its own (OPAL_PREFIX=$kit/usr), laid
# out as under /usr so that every path it derives from the prefix exists.
# One machine, one rank per GPU: the components for networks (libfabric,
# UCX, PSM, verbs) stay behind with their libraries; OpenMPI skips what it
# does not find.
ompi=/usr/lib/x86_64-linux-gnu/openmpi
components=$kit/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
mkdir -p "$kit/usr/bin" "$components" "$kit/usr/share"
cp /usr/bin/orterun /usr/bin/orted "$kit/usr/bin/"
ln -s orterun "$kit/usr/bin/mpirun"
network='libfabric|libuc[pmst]|libpsm|libibverbs|librdmacm|libefa|libinfinipath'
for f in "$ompi"/lib/openmpi3/*; do
  if [[ $f == *.so ]] && ldd "$f" | grep -qE "$network"; then
    continue
  fi
  cp "$f" "$components/"
done
cp -r /usr/share/openmpi "$kit/usr/share/"
# PMIx, which OpenMPI's runtime uses, with its own components and help
# files (PMIX_INSTALL_PREFIX=$kit/usr/lib/x86_64-linux-gnu/pmix2).
pmix=/usr/lib/x86_64-linux-gnu/pmix2
mkdir -p "$kit$pmix"
cp -r "$pmix/lib" "$pmix/share" "$kit$pmix/"

{
  for f in "$kit"/bin/* "$components"/*.so "$kit"/usr/bin/orte* \
    "$kit$pmix"/lib/pmix/*.so; do
    libs "$f"
  done
} | sort -u | while read -r path; do
  cp -L "$path" "$kit/lib/"
done

# The artifacts and data, compiled here.
bash "$src/test/gpu/cuda-vs-cpu.sh" --prepare "$build/bin" "$src" "$kit/cuda-vs-cpu"
# Every precision gpu_step.py knows, so that GPU_STEP_ARGS can pick any.
python3 "$src/bench/gpu_step.py" --build "$build" --precisions bf16,bf16-casts,bf16-f32act,fp16,fp32 \
  --prepare "$kit/gpu-step"
rm -f "$kit"/cuda-vs-cpu/*.mlir "$kit"/gpu-step/*.mlir
# gpu-check.sh's check of the kit itself: 2 ranks on the CPU backend.
"$build/bin/tessera-compile" "$src/examples/mlp.mlir" --dp 2 \
  --micro-batch-size 16 --global-batch-size 64 -o "$kit/mlp-dp2.tsr"

# What travels: the device tool carries at most 64 MiB with the tree, and
# OpenBLAS alone is 36 MB; xz makes the whole kit about 10 MB.
if [[ ${GPU_KIT_PACK:-1} == 0 ]]; then
  echo "gpu-kit: $kit ($(du -sh "$kit" | cut -f1)), not packed"
  exit 0
fi
tar -C "$(dirname "$kit")" -cJf "$kit.tar.xz" "$(basename "$kit")"
echo "gpu-kit: $kit ($(du -sh "$kit" | cut -f1)), packed as $kit.tar.xz ($(du -sh "$kit.tar.xz" | cut -f1))"
