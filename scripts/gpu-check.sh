#!/usr/bin/env bash
# The CUDA backend's GPU checks, run on a GPU machine from a kit made here
# by scripts/gpu-kit.sh (that machine needs CUDA 13's runtime, cuBLAS and
# NCCL, as the toolkit or as the nvidia-* Python wheels, and python3; not
# the compiler, MPI or OpenBLAS, which the kit brings):
#   1. TesseraCudaConformanceTest: every kernel, CUDA against CPU;
#   2. test/gpu/cuda-vs-cpu.sh --check: the MLP, a GPT, the GPT in bf16 and
#      an MoE GPT trained 10 steps on each backend;
#   3. bench/gpu_step.py --artifacts: tokens/s, MFU and GEMM share of a GPT
#      step in fp32 and bf16.
# Each one's output goes to OUT_DIR ($OUT where the device tool sets it):
# kit.log, conformance.log, cuda-vs-cpu.log, gpu_step.json, nvidia-smi.txt and
# summary.txt (one line per check with its exit status). Exits non-zero if
# any check failed; 77 from a check means it found no GPU.
#
# usage: scripts/gpu-check.sh [KIT] [OUT_DIR]   (KIT: the directory or its
#        .tar.xz; default .gpu-kit.tar.xz)
#   e.g. with the device tool: run scripts/gpu-kit.sh here, then
#        run(command="bash scripts/gpu-check.sh .gpu-kit.tar.xz $OUT",
#            carry=[".gpu-kit.tar.xz"])
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
kit=${1:-$src/.gpu-kit.tar.xz}
if [[ $kit == *.tar.xz ]]; then
  unpacked=$(mktemp -d)
  tar -C "$unpacked" -xJf "$kit" || exit 1
  kit=$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d | head -n 1)
fi
kit=$(cd "$kit" && pwd)
out=${2:-${OUT:-$src/gpu-check-out}}
mkdir -p "$out"

# OpenMPI from the kit (mpirun forks the ranks with this environment).
export OPAL_PREFIX=$kit/usr
export PMIX_INSTALL_PREFIX=$kit/usr/lib/x86_64-linux-gnu/pmix2
export PATH=$kit/usr/bin:$kit/bin:$PATH
# CUDA's libraries: the toolkit's, then the Python wheels' (nvidia/*/lib).
cuda=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import glob, site, sys
for p in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for d in glob.glob(p + "/nvidia/*/lib") + glob.glob(p + "/nvidia/*/*/lib"):
        print(d)' 2>/dev/null | sort -u); do
  [[ -d $d ]] && cuda=$cuda:$d
done
export LD_LIBRARY_PATH=$kit/lib$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

{
  echo "kit: $kit"
  echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
  nvidia-smi 2>&1 || true
  echo "tessera-run's libraries:"
  ldd "$kit/bin/tessera-run" "$kit/bin/libTesseraBackend_cuda.so" 2>&1
} > "$out/nvidia-smi.txt"

status=0
summary() {
  echo "$1: exit $2" >> "$out/summary.txt"
  [[ $2 == 0 ]] || status=1
}
: > "$out/summary.txt"

# The kit itself first: the MLP on the CPU backend over 2 ranks (mpirun,
# MPI and OpenBLAS from the kit), so that a kit problem is not taken for a
# GPU one.
tessera-run -n 2 "$kit/mlp-dp2.tsr" --steps 2 > "$out/kit.log" 2>&1
summary kit-cpu-2-ranks $?
"$kit/bin/TesseraCudaConformanceTest" > "$out/conformance.log" 2>&1
summary conformance $?
bash "$src/test/gpu/cuda-vs-cpu.sh" --check "$kit/bin" "$src" \
  "$kit/cuda-vs-cpu" > "$out/cuda-vs-cpu.log" 2>&1
summary cuda-vs-cpu $?
# bench/gpu_step.py runs $BUILD/bin/tessera-run: the kit is laid out so.
python3 "$src/bench/gpu_step.py" --build "$kit" --artifacts "$kit/gpu-step" \
  > "$out/gpu_step.json" 2> "$out/gpu_step.err"
summary gpu_step $?
cat "$out/summary.txt"
exit $status
