#!/usr/bin/env python3
"""Runs a command that is expected to fail, with a hard time limit.

Prints the command's stdout and stderr (merged), then "exit code N",
"within LIMIT s: True|False" and "leftover processes: K", the number of
processes still alive afterwards whose command line contains MARKER (say
the artifact's path): every rank of the job must be gone once it returns.
Exits 0 however the command ended, so FileCheck decides.

usage: run_bounded.py --limit SECONDS --marker MARKER -- COMMAND...
"""
import argparse
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--limit", type=float, required=True)
ap.add_argument("--marker", required=True)
ap.add_argument("command", nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.command[1:] if a.command[:1] == ["--"] else a.command

start = time.monotonic()
# Its own session, so that on a hang the whole job (mpirun and every rank)
# can be killed.
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     start_new_session=True)
try:
    out, _ = p.communicate(timeout=a.limit)
    within = True
except subprocess.TimeoutExpired:
    os.killpg(p.pid, 9)
    out, _ = p.communicate()
    within = False
elapsed = time.monotonic() - start
sys.stdout.write(out.decode(errors="replace"))


def leftovers():
    me = os.getpid()
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.marker.encode() in arg for arg in argv):
            n += 1
    return n


# mpirun has reaped its ranks when it returns; allow a moment all the same.
left = leftovers()
for _ in range(20):
    if left == 0:
        break
    time.sleep(0.1)
    left = leftovers()
print(f"exit code {p.returncode}")
print(f"within {a.limit:g} s: {within}")
print(f"leftover processes: {left}")
print(f"elapsed {elapsed:.1f} s", file=sys.stderr)
