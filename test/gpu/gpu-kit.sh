#!/usr/bin/env bash
# scripts/gpu-kit.sh and scripts/gpu-check.sh keep working: a kit made from
# this build (not packed) and checked here.
#  1. The kit as made: its own check (the MLP on 2 CPU ranks through the
#     kit's mpirun, OpenMPI and OpenBLAS) must pass; without a GPU every GPU
#     step must say so (skipped, exit 77; gpu_step.jsonl "skipped"), with
#     one they must pass.
#  2. A rehearsal of failure: the same kit with a conformance test whose
#     tests fail, hang and crash, and a tessera-run whose cuda runs hang,
#     crash and fail, checked as if a GPU were there (GPU_CHECK_ASSUME_GPU)
#     with 5-second limits: every later step and test must still run, the
#     limits must fire, every failure must be a failure (never a skip or a
#     pass), and gpu-check.tar.gz must hold every log.
#
# usage: gpu-kit.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GPU_KIT_PACK=0 bash "$src/scripts/gpu-kit.sh" "$build" "$tmp/kit" > "$tmp/kit.log"

# 1. The kit as made.
bash "$src/scripts/gpu-check.sh" "$tmp/kit" "$tmp/out" > /dev/null || true
summary=$tmp/out/summary.txt
cat "$summary"
mkdir -p "$tmp/logs"
tar -C "$tmp/logs" -xzf "$tmp/out/gpu-check.tar.gz"
grep -q '^kit-cpu-2-ranks: *ok' "$summary" ||
  { cat "$tmp/logs/logs/kit-cpu-2-ranks.log" >&2; exit 1; }
if grep -q '^gpu listed by nvidia-smi: 0' "$tmp/out/env.txt"; then
  # Each conformance test ran in its own process, and each said no GPU.
  [[ $(grep -c '^conformance/.*skipped (exit 77' "$summary") -ge 10 ]]
  grep -q '^cuda-vs-cpu: *skipped (exit 77' "$summary"
  grep -q '"skipped"' "$tmp/out/gpu_step.jsonl"
  ! grep -E 'FAILED|TIMED OUT|NOT RUN' "$summary"
  echo "the kit works; no GPU here for the GPU checks"
else
  ! grep -E 'FAILED|TIMED OUT|NOT RUN|skipped' "$summary"
fi

# 2. The rehearsal.
kit=$tmp/kit
mv "$kit/bin/tessera-run" "$kit/bin/tessera-run.real"
cat > "$kit/bin/tessera-run" <<'SH'
#!/usr/bin/env bash
# Rehearsal: cuda runs that hang (the MLP), crash (the GPT) and fail (the
# rest); CPU runs are real.
if [[ " $* " == *" --backend cuda "* ]]; then
  case "$*" in
  *mlp.tsr*) echo "rehearsal: a cuda run that hangs"; exec sleep 600 ;;
  */gpt.tsr*) echo "rehearsal: a cuda run that crashes"; kill -SEGV $$ ;;
  *) echo "rehearsal: a cuda run that fails"; exit 3 ;;
  esac
fi
exec "$(dirname "$0")/tessera-run.real" "$@"
SH
cat > "$kit/bin/TesseraCudaConformanceTest" <<'SH'
#!/usr/bin/env bash
# Rehearsal: a conformance test whose tests fail, hang, crash and pass.
case "$*" in
*--gtest_list_tests*) printf 'Rehearsal.\n  Fails\n  Hangs\n  Crashes\n  Passes\n' ;;
*Rehearsal.Fails*) echo "rehearsal: a failing test"; exit 1 ;;
*Rehearsal.Hangs*) echo "rehearsal: a hanging test"; exec sleep 600 ;;
*Rehearsal.Crashes*) echo "rehearsal: a crashing test"; kill -SEGV $$ ;;
*Rehearsal.Passes*) echo "rehearsal: a passing test" ;;
*) exit 2 ;;
esac
SH
chmod +x "$kit/bin/tessera-run" "$kit/bin/TesseraCudaConformanceTest"
rc=0
GPU_CHECK_ASSUME_GPU=1 GPU_CHECK_STEP_LIMIT=5 \
  bash "$src/scripts/gpu-check.sh" "$kit" "$tmp/rehearsal" > "$tmp/rehearsal.log" 2>&1 || rc=$?
summary=$tmp/rehearsal/summary.txt
echo "rehearsal:"
cat "$summary"
fail() { echo "rehearsal: $*" >&2; cat "$tmp/rehearsal.log" >&2; exit 1; }
[[ $rc == 1 ]] || fail "gpu-check.sh exited $rc, not 1"
grep -q '^kit-cpu-2-ranks: *ok' "$summary" || fail "the kit's own check failed"
grep -q '^conformance/Fails: *FAILED (exit 1)' "$summary" || fail "Fails"
grep -q '^conformance/Hangs: *TIMED OUT (limit 5 s)' "$summary" || fail "Hangs"
grep -q '^conformance/Crashes: *FAILED (exit 139)' "$summary" || fail "Crashes"
grep -q '^conformance/Passes: *ok' "$summary" || fail "Passes after them"
grep -q '^cuda-vs-cpu: *FAILED (exit 1)' "$summary" || fail "cuda-vs-cpu"
grep -q '^gpu_step: *FAILED' "$summary" || fail "gpu_step"
mkdir -p "$tmp/rlogs"
tar -C "$tmp/rlogs" -xzf "$tmp/rehearsal/gpu-check.tar.gz"
l=$tmp/rlogs/logs
for f in env.txt summary.txt kit-cpu-2-ranks.log conformance_Fails.log \
  conformance_Hangs.log conformance_Crashes.log conformance_Passes.log \
  cuda-vs-cpu.log gpu_step.log cuda-vs-cpu/mlp-cuda.log \
  cuda-vs-cpu/mlp-cuda-profile.log cuda-vs-cpu/gpt-cuda-profile.log \
  cuda-vs-cpu/mlp-cpu.jsonl cuda-vs-cpu/moe-cpu.jsonl cuda-vs-cpu/moe-compare.log; do
  [[ -f $l/$f ]] || fail "the archive lacks $f"
done
grep -q 'rehearsal: a hanging test' "$l/conformance_Hangs.log" || fail "Hangs' log"
# cuda-vs-cpu ran every run after the first failure: the hang and the
# crash were bounded and rerun with --profile, the CPU runs trained.
v=$l/cuda-vs-cpu.log
grep -q '^mlp-cuda: TIMED OUT' "$v" || fail "mlp-cuda"
grep -q '^mlp-cuda-nccl: TIMED OUT' "$v" || fail "mlp-cuda-nccl"
grep -q '^gpt-cuda: FAILED (exit 139)' "$v" || fail "gpt-cuda"
grep -q '^gpt-cuda (rerun with --profile' "$v" || fail "gpt-cuda's rerun"
grep -q '^moe-cuda: FAILED (exit 3)' "$v" || fail "moe-cuda"
for m in mlp gpt gpt-bf16 gpt-bf16-pg moe rms; do
  grep -q "^$m-cpu: ok" "$v" || fail "$m-cpu"
  grep -q "^$m compare (rtol [0-9e.-]*): FAILED" "$v" || fail "$m compare"
done
# gpu_step recorded every configuration, each with its own error.
[[ $(grep -c '"hidden"' "$tmp/rehearsal/gpu_step.jsonl") == 4 ]] || fail "gpu_step's lines"
[[ $(grep -c '"tessera": {"error": "exit 3' "$tmp/rehearsal/gpu_step.jsonl") == 4 ]] ||
  fail "gpu_step's errors"
grep -q '"summary": true' "$tmp/rehearsal/gpu_step.jsonl" || fail "gpu_step's summary"
echo "rehearsal: every failure was caught, bounded and logged"
