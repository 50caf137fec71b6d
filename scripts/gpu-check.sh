#!/usr/bin/env bash
# The CUDA backend's GPU checks, run on a GPU machine from a kit made here
# by scripts/gpu-kit.sh (that machine needs CUDA 13's runtime, cuBLAS and
# NCCL, as the toolkit or as the nvidia-* Python wheels, and python3; not
# the compiler, MPI or OpenBLAS, which the kit brings):
#   0. env: nvidia-smi, the GPU, its driver, the CUDA libraries a cuda run
#      actually loads;
#   1. kit-cpu-2-ranks: the kit itself (the MLP on 2 CPU ranks);
#   2. conformance/<test>: TesseraCudaConformanceTest, every kernel against
#      the CPU backend, one process per test (a device fault poisons only
#      its own CUDA context);
#   3. cuda-vs-cpu: test/gpu/cuda-vs-cpu.sh --check, the MLP, a GPT, the GPT
#      in bf16 and an MoE GPT trained 10 steps on each backend, every run
#      and comparison on its own (and the MLP once with NCCL at one rank);
#   4. gpu_step: bench/gpu_step.py --artifacts, tokens/s, MFU and GEMM share
#      of a GPT step in bf16 and fp32, beside PyTorch on the same GPU (one
#      JSON line per configuration, written as it finishes);
#   5. compute-sanitizer-memcheck: the failed conformance tests under
#      compute-sanitizer, if the budget leaves time.
# Every step has a time limit (`timeout`) and runs whatever failed before
# it; a step that exits 77 (no GPU) where nvidia-smi lists a GPU is a
# failure, not a skip. OUT_DIR ($OUT where the device tool sets it) gets
# summary.txt (one line per step: its verdict and seconds), gpu_step.jsonl,
# env.txt and gpu-check.tar.gz, which holds every log and metrics file.
# Exits non-zero if any step failed.
#
# usage: scripts/gpu-check.sh [KIT] [OUT_DIR]   (KIT: the directory or its
#        .tar.xz; default .gpu-kit.tar.xz)
#   e.g. with the device tool: run scripts/gpu-kit.sh here, then
#        run(command="bash scripts/gpu-check.sh .gpu-kit.tar.xz $OUT",
#            carry=[".gpu-kit.tar.xz"])
# Environment: GPU_CHECK_BUDGET (seconds, default 330): no step starts
# after it, and gpu_step gets what remains; GPU_CHECK_STEP_LIMIT (default
# 120) bounds each conformance test and each run of cuda-vs-cpu.sh;
# GPU_CHECK_ASSUME_GPU=1 acts as if nvidia-smi listed a GPU (the CPU-only
# rehearsal in test/gpu/gpu-kit.sh); GPU_CHECK_STEPS (default
# "kit,conformance,cuda-vs-cpu,gpu_step") picks the steps, for a second run
# on what little device time is left: "sanitizer" adds the whole
# conformance suite under compute-sanitizer; GPU_STEP_ARGS adds arguments
# to gpu_step.py (e.g. "--sizes 2048:16:4 --precisions fp32").
set -uo pipefail
t_start=$SECONDS
src=$(cd "$(dirname "$0")/.." && pwd)
kit=${1:-$src/.gpu-kit.tar.xz}
if [[ $kit == *.tar.xz ]]; then
  unpacked=$(mktemp -d)
  tar -C "$unpacked" -xJf "$kit" || { echo "gpu-check: cannot unpack $kit" >&2; exit 1; }
  kit=$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d | head -n 1)
fi
kit=$(cd "$kit" && pwd)
out=${2:-${OUT:-$src/gpu-check-out}}
mkdir -p "$out"
logs=$out/logs
rm -rf "$logs"
mkdir -p "$logs"
budget=${GPU_CHECK_BUDGET:-330}
steps=",${GPU_CHECK_STEPS:-kit,conformance,cuda-vs-cpu,gpu_step},"
wanted() { [[ $steps == *",$1,"* ]]; }
step_limit=${GPU_CHECK_STEP_LIMIT:-120}

# OpenMPI from the kit (mpirun forks the ranks with this environment).
export OPAL_PREFIX=$kit/usr
export PMIX_INSTALL_PREFIX=$kit/usr/lib/x86_64-linux-gnu/pmix2
export PATH=$kit/usr/bin:$kit/bin:$PATH
# NCCL says why it fails (not only that it did).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
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

gpu_listed=0
if [[ ${GPU_CHECK_ASSUME_GPU:-0} == 1 ]] || nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu_listed=1
fi

status=0
: > "$out/summary.txt"
# verdict NAME RC SECONDS [LIMIT]: one line in summary.txt (and stdout).
verdict() {
  local v="ok"
  if [[ $2 == 124 || $2 == 137 ]]; then
    v="TIMED OUT (limit ${4:-?} s)"
  elif [[ $2 == 77 && $gpu_listed == 1 ]]; then
    v="FAILED (exit 77, 'no GPU', but nvidia-smi lists one)"
  elif [[ $2 == 77 ]]; then
    v="skipped (exit 77: no GPU)"
  elif [[ $2 != 0 ]]; then
    v="FAILED (exit $2)"
  fi
  [[ $2 == 0 || ($2 == 77 && $gpu_listed == 0) ]] || status=1
  printf '%-40s %s  [%s s]\n' "$1:" "$v" "$3" | tee -a "$out/summary.txt"
}
left() { echo $((budget - (SECONDS - t_start))); }
# step NAME LIMIT CMD...: CMD bounded by LIMIT seconds, its output in
# logs/NAME.log, its verdict in summary.txt; skipped once the budget is
# spent. Returns CMD's exit status.
step() {
  local name=$1 limit=$2
  shift 2
  if (($(left) <= 0)); then
    printf '%-40s %s\n' "$name:" "NOT RUN (budget of $budget s spent)" | tee -a "$out/summary.txt"
    status=1
    return 1
  fi
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$logs/${name//\//_}.log" 2>&1
  local rc=$?
  verdict "$name" $rc $((SECONDS - t0)) "$limit"
  return $rc
}

# 0. What this machine is: the GPU, its driver, and the CUDA libraries that
# a cuda run actually loads (LD_DEBUG), as the logs' first page.
{
  echo "date: $(date -u)"
  echo "kit: $kit"
  echo "gpu listed by nvidia-smi: $gpu_listed"
  echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
  nvidia-smi -L 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
    --format=csv 2>&1
  echo "python3: $(command -v python3) $(python3 --version 2>&1)"
  echo "libraries tessera-run and the cuda plugin resolve:"
  ldd "$kit/bin/tessera-run" "$kit/bin/libTesseraBackend_cuda.so" 2>&1 |
    grep -E 'cuda|cublas|nccl|not found|:$'
  echo "libraries a cuda run loads (LD_DEBUG=libs), and its banner:"
  LD_DEBUG=libs timeout -k 5 $((step_limit < 60 ? step_limit : 60)) \
    "$kit/bin/tessera-run" -n 1 \
    "$kit/cuda-vs-cpu/mlp.tsr" --steps 1 --backend cuda --timeout 30 2>&1 |
    grep -E 'calling init: .*(libcuda|libcudart|libcublas|libnccl)|tessera-run' |
    sed 's/^ *[0-9]*: *//' | sort -u
} > "$out/env.txt" 2>&1
cp "$out/env.txt" "$logs/env.txt"
nvidia-smi > "$logs/nvidia-smi.txt" 2>&1

# 1. The kit itself: the MLP on the CPU backend over 2 ranks (mpirun, MPI
# and OpenBLAS from the kit), so that a kit problem is not taken for a GPU
# one.
wanted kit &&
  step kit-cpu-2-ranks 90 tessera-run -n 2 "$kit/mlp-dp2.tsr" --steps 2 --timeout 60

# 2. Conformance, one process per test.
conformance=$kit/bin/TesseraCudaConformanceTest
tests=$(timeout -k 5 60 "$conformance" --gtest_list_tests 2> "$logs/conformance-list.log" |
  awk '/^[^ ]/ {suite = $1} /^  [^ ]/ {print suite $1}')
failed_tests=()
if ! wanted conformance; then
  :
elif [[ -z $tests ]]; then
  step conformance "$step_limit" "$conformance"
else
  for t in $tests; do
    step "conformance/${t#*.}" "$step_limit" "$conformance" --gtest_filter="$t" ||
      failed_tests+=("$t")
  done
fi

# 3. Both backends end to end, every run on its own.
if wanted cuda-vs-cpu; then
  cvc_limit=$(($(left) - 120))
  ((cvc_limit > 8 * step_limit)) && cvc_limit=$((8 * step_limit))
  ((cvc_limit > 60)) || cvc_limit=60
  step cuda-vs-cpu "$cvc_limit" env TESSERA_RUN_LIMIT="$step_limit" \
    bash "$src/test/gpu/cuda-vs-cpu.sh" --check "$kit/bin" "$src" \
    "$kit/cuda-vs-cpu" "$logs/cuda-vs-cpu"
fi

# The sanitizer's share of the budget (step 5): where a conformance test
# failed, or where the whole suite was asked for.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
reserve=10
if [[ -n $sanitizer ]] && { ((${#failed_tests[@]})) || wanted sanitizer; }; then
  reserve=120
fi

# 4. The benchmark, beside PyTorch, with what is left of the budget.
if wanted gpu_step; then
  bench_budget=$(($(left) - reserve))
  ((bench_budget > 30)) || bench_budget=30
  # shellcheck disable=SC2086  # GPU_STEP_ARGS is a list of arguments
  step gpu_step $((bench_budget + 200)) python3 "$src/bench/gpu_step.py" \
    --build "$kit" --artifacts "$kit/gpu-step" --budget "$bench_budget" \
    --run-limit 150 ${GPU_STEP_ARGS:-}
  grep '^{' "$logs/gpu_step.log" > "$out/gpu_step.jsonl"
  not_run=$(grep -o '"not_run": [0-9]*' "$out/gpu_step.jsonl" | grep -o '[0-9]*$')
  [[ ${not_run:-0} == 0 ]] ||
    echo "gpu_step: $not_run runs not started (budget spent; see gpu_step.jsonl)" |
    tee -a "$out/summary.txt"
fi

# 5. The conformance test under compute-sanitizer (memcheck names the
# kernel and the out-of-bounds or misaligned access), if time remains: the
# failed tests, or every test with GPU_CHECK_STEPS=...,sanitizer.
if [[ -n $sanitizer ]] && (($(left) > 30)); then
  filter=""
  if ((${#failed_tests[@]})); then
    filter=$(IFS=:; echo "${failed_tests[*]}")
  elif wanted sanitizer; then
    filter="*"
  fi
  [[ -z $filter ]] ||
    step compute-sanitizer-memcheck $(($(left) - 10)) "$sanitizer" --tool memcheck \
      --error-exitcode 1 "$conformance" --gtest_filter="$filter"
fi

echo "total: $((SECONDS - t_start)) s" | tee -a "$out/summary.txt"
cp "$out/summary.txt" "$logs/"
tar -C "$out" -czf "$out/gpu-check.tar.gz" logs
rm -rf "$logs"
exit $status
