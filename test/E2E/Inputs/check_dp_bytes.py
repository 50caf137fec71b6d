#!/usr/bin/env python3
"""Checks the data-parallel gradient traffic of a run against its buckets.

Usage: check_dp_bytes.py METRICS.jsonl BUCKETS.json [--pp-rank R]

With d data-parallel ranks, a ring all-reduce of B bytes sends 2 (d - 1) / d
B per rank; the distributed optimizer's reduce-scatter plus all-gather send
the same. The counted dp bytes of every step must equal that volume over the
padded buckets of the rank's buffers (--emit=buckets), and the ratio to the
theoretical minimum over the gradients alone (padding excluded) is printed.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("buckets")
    ap.add_argument("--pp-rank", type=int, default=0)
    args = ap.parse_args()
    layout = json.load(open(args.buckets))
    d = layout["dp"]
    bufs = [b for b in layout["buffers"] if b["pp_rank"] == args.pp_rank]
    padded = sum(b["numel"] for b in bufs) * 4
    unpadded = sum(b["numel_unpadded"] for b in bufs) * 4
    expect = 2 * (d - 1) * padded // d
    minimum = 2 * (d - 1) * unpadded / d
    steps = 0
    for line in open(args.metrics):
        rec = json.loads(line)
        cb = rec["comm_bytes"]
        got = sum(cb.get(k, {}).get("dp", 0)
                  for k in ("all_reduce", "reduce_scatter", "all_gather"))
        if got != expect:
            sys.exit(f"FAIL: step {rec['step']}: {got} dp bytes, expected {expect} "
                     f"(2 (d-1)/d x {padded} padded bucket bytes, d = {d})")
        steps += 1
    if steps == 0:
        sys.exit("FAIL: no steps in " + args.metrics)
    print(f"dp bytes per step {expect}, minimum {minimum:.0f}, "
          f"ratio {expect / minimum:.4f} over {steps} steps")
    print("OK")


if __name__ == "__main__":
    main()
