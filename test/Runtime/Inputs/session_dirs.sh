#!/usr/bin/env bash
# The Open MPI session directory bases tessera-run gives each mpirun
# (runtime/src/launcher/Mpirun.cpp): under TMPDIR/tessera-run.<uid>, one
# base <host>.<pid> per launch, held by a flock on its lock file for as long
# as the job runs. A launch removes this host's bases whose lock it can take
# (with what a killed mpirun left in them), keeps those whose lock is held
# and other hosts', and makes none when the user chose a base
# (OMPI_MCA_orte_tmpdir_base).
#
# usage: session_dirs.sh LOGDIR ARTIFACT   (tessera-run on PATH)
set -euo pipefail
logs=$1
artifact=$2
rm -rf "$logs"
mkdir -p "$logs"
# A short TMPDIR of its own: a base longer than 64 bytes is not made.
tmp=$(mktemp -d /tmp/tsd.XXXXXX)
export TMPDIR=$tmp
unset OMPI_MCA_orte_tmpdir_base
parent=$tmp/tessera-run.$(id -u)
host=$(hostname)
ended=$parent/$host.999999998
held=$parent/$host.999999999
other=$parent/otherhost.5
mkdir -m 700 "$parent"
mkdir -m 700 "$ended" "$held" "$other"
touch "$ended/lock" "$held/lock" "$other/lock"
mkdir "$ended/ompi.$host.left-by-a-killed-mpirun"
# This shell holds the live launch's lock (until it exits).
exec 9> "$held/lock"
flock -n 9
trap 'rm -rf "$tmp"' EXIT

tessera-run -n 2 "$artifact" --steps 2 > "$logs/run.log"
[[ -e $ended ]] && echo "ended base: kept" || echo "ended base: removed"
[[ -e $held ]] && echo "held base: kept" || echo "held base: removed"
[[ -e $other ]] && echo "other host's base: kept" || echo "other host's base: removed"
own=$(find "$parent" -mindepth 1 -maxdepth 1 -name "$host.*" ! -path "$held")
echo "own bases: $(echo "$own" | grep -c .)"
echo "own base's lock: $(ls "$own")"
echo "session directories left in it: $(find "$own" -mindepth 1 -name 'ompi.*' | wc -l)"

# The next launch removes the first one's base; with the user's own base
# it makes none.
OMPI_MCA_orte_tmpdir_base=$tmp/user tessera-run -n 2 "$artifact" --steps 2 > "$logs/run2.log"
[[ -e $own ]] && echo "first launch's base after the user-based one: kept" ||
  echo "first launch's base after the user-based one: removed"
echo "bases made with the user's own: $(find "$parent" -mindepth 1 -maxdepth 1 -name "$host.*" ! -path "$held" | grep -c . || true)"
tessera-run -n 2 "$artifact" --steps 2 > "$logs/run3.log"
[[ -e $own ]] && echo "first launch's base after the next: kept" ||
  echo "first launch's base after the next: removed"
