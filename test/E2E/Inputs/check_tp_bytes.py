#!/usr/bin/env python3
"""Checks the counted tensor-parallel bytes of a GPT run against the analytic volume.

Per microbatch of b samples, s tokens and hidden h (fp32) with tp = n, a ring
all-reduce sends 2 (n-1)/n of its buffer and an all-gather or reduce-scatter
(n-1)/n of the full buffer. With act = b*s*h*4 bytes:
  - every transformer layer: one all-reduce of act in the forward and one in
    the backward for each of attention and MLP (Megatron's f and g), i.e.
    4 act ring; under sequence parallelism the same bytes as all-gathers
    plus reduce-scatters;
  - the vocab-parallel embedding: one forward all-reduce of act;
  - the LM head's input: a backward all-reduce of act (sequence parallel:
    all-gather forward + reduce-scatter backward, the same bytes);
  - the vocab-parallel cross-entropy: three all-reduces of b*s*4 bytes;
  - sequence parallel only: the all-gather that undoes the embeddings'
    scatter in the backward, and, once per step after accumulation, the
    all-reduce of the gradients of the layer norms (2 per layer + final, 2h
    each) and row-parallel biases (2 per layer, h each), which only see
    their sequence shard.

usage: check_tp_bytes.py METRICS.jsonl --layers L --micro-batch b --seq s
                         --hidden h --tp n --microbatches M [--sequence-parallel]
"""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("metrics")
for flag in ["layers", "micro-batch", "seq", "hidden", "tp", "microbatches"]:
    ap.add_argument("--" + flag, type=int, required=True)
ap.add_argument("--sequence-parallel", action="store_true")
a = ap.parse_args()
n, L, h = a.tp, a.layers, a.hidden
ring = 2 * (n - 1) / n
half = (n - 1) / n
act = a.micro_batch * a.seq * h * 4
rows = a.micro_batch * a.seq * 4
if a.sequence_parallel:
    gather_scatter = L * 4 * act * ring + act * ring + act * half
    params = ((2 * L + 1) * 2 * h + 2 * L * h) * 4
    all_reduce = act * ring + 3 * rows * ring
    per_step = params * ring  # accumulated, then reduced once per step
else:
    gather_scatter = 0
    all_reduce = L * 4 * act * ring + 2 * act * ring + 3 * rows * ring
    per_step = 0
expected = {"all_reduce": a.microbatches * all_reduce + per_step,
            "gather_scatter": a.microbatches * gather_scatter}
ok = True
for line in open(a.metrics):
    rec = json.loads(line)
    cb = rec["comm_bytes"]
    got = {"all_reduce": cb["all_reduce"].get("tp", 0),
           "gather_scatter": cb["all_gather"].get("tp", 0) + cb["reduce_scatter"].get("tp", 0)}
    for kind in expected:
        if abs(got[kind] - expected[kind]) > 1e-6 * expected[kind] + 1:
            print(f"FAIL step {rec['step']}: tp {kind} bytes {got[kind]} != analytic {expected[kind]:.0f}")
            ok = False
print(f"tp bytes per step: all-reduce {expected['all_reduce']:.0f}, "
      f"all-gather + reduce-scatter {expected['gather_scatter']:.0f} "
      f"(per layer {L and 4 * act * ring:.0f})")
if not ok:
    sys.exit(1)
print("OK")
