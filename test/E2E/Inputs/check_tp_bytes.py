#!/usr/bin/env python3
"""Checks the counted tensor-parallel bytes of a GPT run against the analytic volume.

Per microbatch of b samples, s tokens and hidden h (fp32), with tp = n and a
ring all-reduce sending 2 (n-1)/n of the buffer: every transformer layer has
one all-reduce of b*s*h in the forward and one in the backward for each of
attention and MLP (seed 004); the vocab-parallel embedding adds one forward
all-reduce of b*s*h and the LM head's input one backward all-reduce; the
vocab-parallel cross-entropy adds three all-reduces of b*s (max, sum of
exponentials, target logit). Under sequence parallelism the same bytes move
as all-gather plus reduce-scatter.

usage: check_tp_bytes.py METRICS.jsonl --layers L --micro-batch b --seq s
                         --hidden h --tp n --microbatches M
"""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("metrics")
for flag in ["layers", "micro-batch", "seq", "hidden", "tp", "microbatches"]:
    ap.add_argument("--" + flag, type=int, required=True)
a = ap.parse_args()
n = a.tp
ring = 2 * (n - 1) / n
act = a.micro_batch * a.seq * a.hidden * 4
rows = a.micro_batch * a.seq * 4
per_layer = 4 * act * ring
expected = a.microbatches * (a.layers * per_layer + 2 * act * ring + 3 * rows * ring)
ok = True
for line in open(a.metrics):
    rec = json.loads(line)
    got = sum(kinds.get("tp", 0) for kinds in rec["comm_bytes"].values())
    if abs(got - expected) > 1e-6 * expected + 1:
        print(f"FAIL step {rec['step']}: tp bytes {got} != analytic {expected:.0f}")
        ok = False
print(f"tp bytes per step: analytic {expected:.0f} "
      f"({a.layers} layers x {per_layer:.0f} + embedding/LM head/loss)")
if not ok:
    sys.exit(1)
print("OK")
