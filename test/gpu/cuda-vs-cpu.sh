#!/usr/bin/env bash
# The MLP, a 2-layer GPT (with dropout) and a 2-layer mixture-of-experts
# GPT (4 experts, top-2, capacity factor 1.5) trained 10 Adam steps on one
# GPU with the cuda backend and on the CPU, from the same artifact: the
# losses must agree within 1e-4 relative at every step (the GPT in bf16
# with the distributed optimizer within 1e-2, also with
# --overlap-param-gather through NCCL at one rank, and with ZeRO-3's
# parameter shards through NCCL at one rank, saved at the end; the
# Llama-shaped and the MoE GPT in bf16, the Llama-shaped one also with the
# Cast kernels in place of the folded casts, and the GPT in fp16 with
# dynamic loss scaling, within 1e-2 too). Needs a GPU: without one it
# exits 77, which ctest reports as Skipped (label "gpu").
#
# Every run and every comparison runs and reports its own result, whatever
# failed before it: one line each on stdout ("mlp cuda: ok (2.1 s)",
# "gpt compare: FAILED (exit 1)"), its output in LOGDIR. Every run is
# bounded twice: tessera-run --timeout (the watchdog names the stuck
# instruction, or NCCL's set-up) and an outer `timeout` (a hang the
# watchdog cannot see). A cuda run that fails is run once more with
# --profile, which synchronises after every instruction, so that its log
# names the faulting opcode rather than the step's last synchronize(). One
# more run, "mlp cuda nccl", makes the NCCL communicators at one rank
# (TESSERA_NCCL_ONE_RANK=1; one-rank runs need none otherwise), so that an
# NCCL problem shows as such.
#
# usage: cuda-vs-cpu.sh BINDIR SOURCE_DIR          compile, then check
#        cuda-vs-cpu.sh --prepare BINDIR SOURCE_DIR DIR
#                                                  compile the artifacts and
#                                                  the data into DIR only
#        cuda-vs-cpu.sh --check BINDIR SOURCE_DIR DIR [LOGDIR]
#                                                  check with DIR's (needs
#                                                  only tessera-run: what a
#                                                  GPU machine without the
#                                                  compiler runs, see
#                                                  scripts/gpu-kit.sh); logs
#                                                  and metrics stay in LOGDIR
# Exits 0 when everything passed, 77 when the first cuda run found no GPU,
# else 1. TESSERA_RUN_LIMIT (seconds, default 180) bounds each run.
set -uo pipefail
mode=all
case "${1:-}" in
--prepare | --check) mode=${1#--}; shift ;;
esac
bin=$1
src=$2
limit=${TESSERA_RUN_LIMIT:-180}

prepare() {
  local dir=$1
  set -e
  mkdir -p "$dir"
  "$bin/tessera-compile" "$src/examples/mlp.mlir" --micro-batch-size 32 \
    --global-batch-size 64 -o "$dir/mlp.tsr"
  "$bin/tessera-preprocess" --input "$src/examples/data/northanger_abbey_vol1.txt" \
    --output-prefix "$dir/austen" --append-eod > /dev/null
  "$bin/tessera-gen" gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
    --dropout 0.1 -o "$dir/gpt.mlir"
  "$bin/tessera-compile" "$dir/gpt.mlir" --micro-batch-size 4 \
    --global-batch-size 8 -o "$dir/gpt.tsr"
  # bf16 mixed precision with the distributed optimizer (one Adam kernel per
  # bucket, bf16 GEMMs, and --bf16's bf16 activations: the GEMMs write bf16
  # results, the activation kernels load and store bf16 themselves): both
  # backends take the same bf16 operands, but their f32 sums differ in order and a result may round to
  # the neighbouring bf16 value on its way into the next GEMM, hence the
  # looser bound.
  "$bin/tessera-compile" "$dir/gpt.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --bf16 --use-distributed-optimizer -o "$dir/gpt-bf16.tsr"
  # The same with the parameter all-gathers left in flight after the step
  # and finished in the next forward (--overlap-param-gather), run on the
  # GPU through NCCL at one rank: the started all-gather on NCCL's stream and
  # the compute stream's wait for it.
  "$bin/tessera-compile" "$dir/gpt.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --bf16 --use-distributed-optimizer --overlap-grad-reduce \
    --overlap-param-gather -o "$dir/gpt-bf16-pg.tsr"
  # ZeRO-3 at one rank (--data-parallel-sharding-strategy optim_grads_params):
  # the parameters live only in their bucket shards (param_shard buffers),
  # each phase gathers a bucket before its readers through NCCL, the next
  # one started under the current one (--overlap-param-gather: NCCL's
  # all-gather start and the compute stream's wait), and the run ends with
  # a checkpoint save, which gathers the shards into the host staging
  # through the arena's transient region.
  "$bin/tessera-compile" "$dir/gpt.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --bf16 --data-parallel-sharding-strategy optim_grads_params \
    --overlap-grad-reduce --overlap-param-gather --bucket-size 200000 \
    -o "$dir/gpt-bf16-z3.tsr"
  "$bin/tessera-gen" gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
    --num-experts 4 --moe-router-topk 2 --moe-expert-capacity-factor 1.5 \
    -o "$dir/moe.mlir"
  "$bin/tessera-compile" "$dir/moe.mlir" --micro-batch-size 4 \
    --global-batch-size 8 -o "$dir/moe.tsr"
  # RMSNorm (fused with the residual add), no linear biases, RoPE, SwiGLU,
  # grouped-query attention, QK-norm, SGD with momentum, gradient clipping and the
  # parameter norm.
  "$bin/tessera-gen" gpt --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 64 \
    --normalization RMSNorm --disable-bias-linear --position-embedding-type rope \
    --swiglu --group-query-attention --num-query-groups 2 --qk-layernorm \
    -o "$dir/rms.mlir"
  "$bin/tessera-compile" "$dir/rms.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --optimizer sgd --lr 0.05 --log-params-norm \
    -o "$dir/rms.tsr"
  # bf16 activations (--bf16's default): every activation stored and
  # passed between ops in bf16, on the Llama-shaped model (RMSNorm, SwiGLU
  # and repeat_kv loading and storing bf16, RoPE rotating bf16 in place,
  # QK-norm reading bf16 values) and on the MoE GPT (dispatch, grouped
  # GEMMs and combine on bf16 rows); and the Llama-shaped one with the Cast
  # kernels around each f32 kernel instead (--fuse-casts=false), which
  # tells a fault of the folded kernels from one of bf16 activations.
  "$bin/tessera-compile" "$dir/rms.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --bf16 -o "$dir/rms-bf16act.tsr"
  "$bin/tessera-compile" "$dir/rms.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --bf16 --fuse-casts=false -o "$dir/rms-bf16casts.tsr"
  "$bin/tessera-compile" "$dir/moe.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --bf16 -o "$dir/moe-bf16act.tsr"
  # fp16 with dynamic loss scaling: the f16 GEMMs and casts, and the
  # overflow check (from a scale of 2^16 most steps are taken; from
  # Megatron's 2^32 the first ten would all be skipped).
  "$bin/tessera-compile" "$dir/gpt.mlir" --micro-batch-size 4 \
    --global-batch-size 8 --fp16 --initial-loss-scale 65536 --hysteresis 1 \
    -o "$dir/gpt-fp16.tsr"
  set +e
}

failed=0
# result NAME RC SECONDS: one line on stdout.
result() {
  local verdict="ok"
  if [[ $2 == 124 || $2 == 137 ]]; then
    verdict="TIMED OUT (after $limit s)"
  elif [[ $2 != 0 ]]; then
    verdict="FAILED (exit $2)"
  fi
  [[ $2 == 0 ]] || failed=1
  printf '%s: %s (%s s)\n' "$1" "$verdict" "$3"
}

# run NAME BACKEND MODEL [ARGS...]: one training run of 10 steps into
# $logs/NAME.{log,jsonl}; returns its exit status.
run() {
  local name=$1 backend=$2 model=$3
  shift 3
  local data=()
  [[ $model == mlp ]] || data=(--data "$dir/austen")
  local t0=$SECONDS
  timeout -k 10 "$limit" "$bin/tessera-run" -n 1 "$dir/$model.tsr" --steps 10 \
    --backend "$backend" --timeout 60 "${data[@]}" \
    --metrics "$logs/$name.jsonl" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  result "$name" $rc $((SECONDS - t0))
  if [[ $rc != 0 && $backend == cuda && " $* " != *" --profile "* ]]; then
    # Once more with every instruction synchronised: the log names the
    # opcode that faulted.
    t0=$SECONDS
    timeout -k 10 "$limit" "$bin/tessera-run" -n 1 "$dir/$model.tsr" --steps 2 \
      --backend cuda --timeout 60 --profile "${data[@]}" \
      --metrics "$logs/$name-profile.jsonl" "$@" > "$logs/$name-profile.log" 2>&1
    local prc=$?
    printf '%s (rerun with --profile, diagnosis only): exit %s (%s s)\n' \
      "$name" $prc $((SECONDS - t0))
    tail -n 5 "$logs/$name-profile.log" | sed 's/^/    /'
  fi
  return $rc
}

compare() {
  local name=$1 rtol=$2 t0=$SECONDS
  python3 "$src/test/E2E/Inputs/compare_losses.py" --rtol "$rtol" --steps 10 \
    "$logs/$name-cpu.jsonl" "$logs/$name-cuda.jsonl" > "$logs/$name-compare.log" 2>&1
  local rc=$?
  result "$name compare (rtol $rtol)" $rc $((SECONDS - t0))
  [[ $rc == 0 ]] || sed 's/^/    /' "$logs/$name-compare.log"
}

check() {
  dir=$1
  logs=$2
  mkdir -p "$logs"
  run mlp-cuda cuda mlp
  if [[ $? != 0 ]] && grep -q "no GPU to run on" "$logs/mlp-cuda.log"; then
    echo "SKIPPED: $(grep "no GPU to run on" "$logs/mlp-cuda.log" | head -n 1)"
    return 77
  fi
  [[ -s $logs/mlp-cuda.log ]] && tail -n 3 "$logs/mlp-cuda.log" | sed 's/^/    /'
  TESSERA_NCCL_ONE_RANK=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN} \
    run mlp-cuda-nccl cuda mlp
  run mlp-cpu cpu mlp
  compare mlp 1e-4
  for model in gpt gpt-bf16 moe rms; do
    run "$model-cpu" cpu "$model"
    run "$model-cuda" cuda "$model"
  done
  compare gpt 1e-4
  compare gpt-bf16 1e-2
  run gpt-bf16-pg-cpu cpu gpt-bf16-pg
  TESSERA_NCCL_ONE_RANK=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN} \
    run gpt-bf16-pg-cuda cuda gpt-bf16-pg
  compare gpt-bf16-pg 1e-2
  run gpt-bf16-z3-cpu cpu gpt-bf16-z3 --save "$logs/gpt-bf16-z3-cpu.ckpt"
  TESSERA_NCCL_ONE_RANK=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN} \
    run gpt-bf16-z3-cuda cuda gpt-bf16-z3 --save "$logs/gpt-bf16-z3-cuda.ckpt"
  compare gpt-bf16-z3 1e-2
  compare moe 1e-4
  compare rms 1e-4
  for model in rms-bf16act rms-bf16casts moe-bf16act gpt-fp16; do
    run "$model-cpu" cpu "$model"
    run "$model-cuda" cuda "$model"
  done
  compare rms-bf16act 1e-2
  compare rms-bf16casts 1e-2
  compare moe-bf16act 1e-2
  compare gpt-fp16 1e-2
  return $failed
}

case $mode in
prepare) prepare "$3" ;;
check)
  if [[ -n ${4:-} ]]; then
    check "$3" "$4"
  else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    check "$3" "$tmp"
    rc=$?
    # No LOGDIR to keep them: the failures' logs go to stderr.
    if [[ $rc == 1 ]]; then
      for f in "$tmp"/*.log; do echo "== $f" >&2; tail -n 20 "$f" >&2; done
    fi
    exit $rc
  fi
  ;;
all)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  prepare "$tmp/artifacts" || exit 1
  check "$tmp/artifacts" "$tmp/logs"
  rc=$?
  if [[ $rc == 1 ]]; then
    for f in "$tmp"/logs/*.log; do echo "== $f" >&2; tail -n 20 "$f" >&2; done
  fi
  exit $rc
  ;;
esac
