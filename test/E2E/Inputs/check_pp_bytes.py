#!/usr/bin/env python3
"""Checks the counted pipeline bytes of a run against the analytic volume.

The metrics are rank 0's, and a rank's p2p counter counts the bytes it sends
(isend; receives are not counted). Rank 0 is the first pipeline stage and,
with vpp = v chunks, holds virtual stages 0, p, 2p, ..., (v-1)p of the p*v
(p > 1, so never the last one). Per step and microbatch it therefore sends
one activation [seq, micro_batch, hidden] f32 forward from each of its v
chunks and one gradient of that shape backward from each chunk but the
first (virtual stage 0 has no predecessor):

    p2p["pp"] = (2v - 1) * M * seq * micro_batch * hidden * 4

(per rank pair and direction the volume is M activations, so a pp = 2 pair
exchanges 2 * M * act bytes per step, half of them counted on each side).
Under tensor parallelism every tp rank sends the whole activation (no
scatter/gather optimisation). Nothing else travels point to point, and
nothing but the gradient norm is all-reduced over "pp": with clipping on
(tessera-compile's default) each step all-reduces --norm-reduces scalars
(the sums of squares of the parameters no other axis splits), each counted
as a ring all-reduce of 4 bytes over the --pp ranks, 2 (p-1)/p * 4.

With --tied-vocab V (the padded vocabulary of a tied-embedding model) the
word embedding's gradient, [V/tp, hidden] f32 on rank 0, is all-reduced once
per step over the two-rank embedding group (first and last stage); a ring
all-reduce of n ranks is counted as 2 (n-1)/n of its buffer, so exactly the
buffer for n = 2. Without it no "embedding" bytes may be counted.

usage: check_pp_bytes.py METRICS.jsonl --micro-batch b --seq s --hidden h
                         --microbatches M [--vpp v] [--tp t] [--tied-vocab V]
                         [--pp p] [--norm-reduces K]
"""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("metrics")
for flag in ["micro-batch", "seq", "hidden", "microbatches"]:
    ap.add_argument("--" + flag, type=int, required=True)
ap.add_argument("--vpp", type=int, default=1)
ap.add_argument("--tp", type=int, default=1)
ap.add_argument("--tied-vocab", type=int, default=0)
ap.add_argument("--pp", type=int, default=2)
ap.add_argument("--norm-reduces", type=int, default=1)
a = ap.parse_args()

act = a.seq * a.micro_batch * a.hidden * 4
p2p = (2 * a.vpp - 1) * a.microbatches * act
embedding = a.tied_vocab // a.tp * a.hidden * 4 if a.tied_vocab else 0
norm = a.norm_reduces * (2 * (a.pp - 1) * 4 // a.pp)
ok = True
steps = 0
for line in open(a.metrics):
    rec = json.loads(line)
    steps += 1
    cb = rec["comm_bytes"]
    checks = {
        "p2p pp": (cb["p2p"].get("pp"), p2p),
        "all_reduce pp": (cb["all_reduce"].get("pp"), norm),
        "embedding all_reduce": (cb["all_reduce"].get("embedding", 0), embedding),
    }
    for kind in ["all_gather", "reduce_scatter"]:
        checks[kind + " pp"] = (cb[kind].get("pp"), 0)
    for group, got in cb["p2p"].items():
        if group != "pp":
            checks["p2p " + group] = (got, 0)
    for what, (got, want) in checks.items():
        if got != want:
            print(f"FAIL step {rec['step']}: {what} bytes {got} != analytic {want}")
            ok = False
if steps == 0:
    sys.exit(f"FAIL: {a.metrics} has no steps")
print(f"rank 0 sends {p2p} p2p bytes per step ({2 * a.vpp - 1} x {a.microbatches} "
      f"x {act}), embedding all-reduce {embedding}")
if not ok:
    sys.exit(1)
print("OK")
