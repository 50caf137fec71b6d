#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair,
# Open MPI started from the first with a hostfile (2 slots each) and an rsh
# agent that runs each daemon in its host's namespace, TCP only on the
# pair's subnet, and tessera-run as the program, in a job it did not start.
# Trains the MLP at tp 2 x dp 2 (the dp groups cross the hosts), a GPT at
# pp 2 x dp 2 (the stages sit on different hosts) and the GPT at dp 4 with
# the distributed optimizer and its parameter all-gathers left in flight
# across the hosts (--overlap-param-gather) 10 steps each, and compares each
# with the one-rank run (1e-5 relative). Cleans up whatever
# it made. Exits 77 (ctest: Skipped, label multihost) where it cannot make
# namespaces (not root, no iproute2, no permission), never 0.
#
# usage: two-hosts.sh BINDIR SOURCE_DIR
set -uo pipefail
bin=$1
src=$2
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "making network namespaces needs root"
command -v ip > /dev/null || skip "no iproute2 (ip)"
command -v mpirun > /dev/null || skip "no mpirun"

tmp=$(mktemp -d)
id=$(($$ % 250))
a=tsh$$a
b=tsh$$b
net=10.213.$id
cleanup() {
  ip netns del "$a" 2> /dev/null
  ip netns del "$b" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$a" 2> "$tmp/netns.err" || skip "ip netns add: $(cat "$tmp/netns.err")"
set -e
ip netns add "$b"
ip link add "v$$a" type veth peer name "v$$b"
ip link set "v$$a" netns "$a"
ip link set "v$$b" netns "$b"
ip -n "$a" addr add "$net.1/24" dev "v$$a"
ip -n "$b" addr add "$net.2/24" dev "v$$b"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
done
ip -n "$a" link set "v$$a" up
ip -n "$b" link set "v$$b" up

cat > "$tmp/agent.sh" <<SH
#!/bin/sh
# rsh agent: HOST COMMAND... runs COMMAND in HOST's namespace.
host=\$1
shift
case \$host in
$net.1) ns=$a ;;
$net.2) ns=$b ;;
*) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns sh -c "\$*"
SH
chmod +x "$tmp/agent.sh"
printf '%s slots=2\n%s slots=2\n' "$net.1" "$net.2" > "$tmp/hosts"

"$bin/tessera-compile" "$src/examples/mlp.mlir" --tp 2 --dp 2 \
  --micro-batch-size 8 --global-batch-size 32 -o "$tmp/mlp-tp2dp2.tsr"
"$bin/tessera-compile" "$src/examples/mlp.mlir" \
  --micro-batch-size 8 --global-batch-size 32 -o "$tmp/mlp-one.tsr"
"$bin/tessera-gen" gpt --layers 2 --hidden 64 --heads 4 --vocab 257 --seq 32 \
  -o "$tmp/gpt.mlir"
"$bin/tessera-compile" "$tmp/gpt.mlir" --pp 2 --dp 2 \
  --micro-batch-size 2 --global-batch-size 8 -o "$tmp/gpt-pp2dp2.tsr"
"$bin/tessera-compile" "$tmp/gpt.mlir" \
  --micro-batch-size 2 --global-batch-size 8 -o "$tmp/gpt-one.tsr"
"$bin/tessera-compile" "$tmp/gpt.mlir" --dp 4 --use-distributed-optimizer \
  --overlap-grad-reduce --overlap-param-gather --bucket-size 20000 \
  --micro-batch-size 1 --global-batch-size 8 -o "$tmp/gpt-dp4pg.tsr"
set +e

status=0
# run NAME ARTIFACT [ARGS...]: 4 ranks over the two hosts.
run() {
  local name=$1 artifact=$2
  shift 2
  ip netns exec "$a" timeout -k 10 120 mpirun --allow-run-as-root \
    --oversubscribe -n 4 --hostfile "$tmp/hosts" \
    --mca plm_rsh_agent "$tmp/agent.sh" --mca btl tcp,self \
    --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
    "$bin/tessera-run" "$tmp/$artifact" --steps 10 --timeout 30 \
    --metrics "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1
  local rc=$?
  echo "$name over two hosts: exit $rc"
  if [[ $rc != 0 ]]; then
    tail -n 20 "$tmp/$name.log"
    status=1
  fi
}
run mlp-tp2dp2 mlp-tp2dp2.tsr
run gpt-pp2dp2 gpt-pp2dp2.tsr --mock-data
run gpt-dp4pg gpt-dp4pg.tsr --mock-data
"$bin/tessera-run" -n 1 "$tmp/mlp-one.tsr" --steps 10 --metrics "$tmp/mlp-one.jsonl" > /dev/null &&
  "$bin/tessera-run" -n 1 "$tmp/gpt-one.tsr" --steps 10 --mock-data \
    --metrics "$tmp/gpt-one.jsonl" > /dev/null || status=1
compare="$src/test/E2E/Inputs/compare_losses.py"
python3 "$compare" --rtol 1e-5 --steps 10 "$tmp/mlp-one.jsonl" "$tmp/mlp-tp2dp2.jsonl" || status=1
python3 "$compare" --rtol 1e-5 --steps 10 "$tmp/gpt-one.jsonl" "$tmp/gpt-pp2dp2.jsonl" || status=1
python3 "$compare" --rtol 1e-5 --steps 10 "$tmp/gpt-one.jsonl" "$tmp/gpt-dp4pg.jsonl" || status=1
# Each host's ranks share its cores: 2 ranks per host on this machine's
# cores, not 4 (the node-local count, from Open MPI's environment).
grep -q "BLAS threads/rank $(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))" "$tmp/mlp-tp2dp2.log" ||
  { echo "FAIL: BLAS threads per rank are not the cores over the node's 2 ranks"; grep "BLAS threads" "$tmp/mlp-tp2dp2.log"; status=1; }
exit $status
