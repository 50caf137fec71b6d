#!/usr/bin/env python3
"""Checks the counted context-parallel bytes of a GPT run against the ring volume.

Under context parallelism (cp = n) each rank holds s/n positions of every
sample, and every attention layer passes its keys and values around the cp
ring (Megatron's ring attention). With KV = (s/n) * b * (heads/tp) * 2 * d * 4
bytes, the packed K/V block of one rank's share, a rank sends per layer and
microbatch:
  - forward: (n - 1) KV (the blocks move on n - 1 times);
  - backward: (n - 1) KV for the blocks again, and n KV for their
    gradients, which travel behind them and return to their owner;
so (3n - 2) KV in all, counted as point-to-point bytes over "cp". Under
bf16 activations (--kv-bytes 2) the K/V blocks travel in bf16, 2 bytes a
value, and their gradients in f32: (2n - 2) KV/2 + n KV. The loss adds two
4-byte all-reduces over "cp" per microbatch (the token count and the summed
shares; ring volume 2 (n - 1) / n each).

usage: check_cp_bytes.py METRICS.jsonl --layers L --micro-batch b --seq s
                         --hidden h --heads a --cp n [--tp t] --microbatches M
                         [--kv-bytes 2]
"""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("metrics")
for flag in ["layers", "micro-batch", "seq", "hidden", "heads", "cp", "microbatches"]:
    ap.add_argument("--" + flag, type=int, required=True)
ap.add_argument("--tp", type=int, default=1)
ap.add_argument("--kv-bytes", type=int, default=4, choices=[2, 4])
a = ap.parse_args()
n = a.cp
d = a.hidden // a.heads
kv = (a.seq // n) * a.micro_batch * (a.heads // a.tp) * 2 * d * 4
p2p = a.microbatches * a.layers * (
    (2 * n - 2) * kv * a.kv_bytes // 4 + n * kv)
all_reduce = a.microbatches * 2 * 4 * 2 * (n - 1) / n
ok = True
for line in open(a.metrics):
    rec = json.loads(line)
    cb = rec["comm_bytes"]
    got_p2p = cb["p2p"].get("cp", 0)
    got_ar = cb["all_reduce"].get("cp", 0)
    if got_p2p != p2p:
        print(f"FAIL step {rec['step']}: cp p2p bytes {got_p2p} != ring volume {p2p}")
        ok = False
    if abs(got_ar - all_reduce) > 1e-6:
        print(f"FAIL step {rec['step']}: cp all-reduce bytes {got_ar} != {all_reduce:.0f}")
        ok = False
print(f"cp bytes per step: p2p {p2p} ({2 * n - 2} K/V blocks of "
      f"{kv * a.kv_bytes // 4} bytes and {n} dK/dV blocks of {kv} bytes per "
      f"layer and microbatch), all-reduce {all_reduce:.0f}")
if not ok:
    sys.exit(1)
print("OK")
