#!/usr/bin/env python3
"""Checks that gradient bucket reductions overlap the backward in a trace.

Usage: check_overlap_trace.py TRACE.json --microbatches M

For every rank and step: every AllReduceStart lies inside the last
microbatch's phase slice ("microbatch M-1"), none inside the step (where
only the gradient norm's scalars are all-reduced, over kinds ending in
"pp"), and
backward compute (Gemm and friends) runs after the first start and before
the last Wait: the reductions are in flight while the backward goes on.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--microbatches", type=int, required=True)
    args = ap.parse_args()
    events = [e for e in json.load(open(args.trace))["traceEvents"] if e.get("ph") == "X"]
    last = f"microbatch {args.microbatches - 1}"
    checked = 0
    for pid in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == pid]
        phases = sorted((e for e in mine if e["name"] in (last, "step")), key=lambda e: e["ts"])
        for ph in phases:
            if ph["name"] != last:
                continue
            lo, hi = ph["ts"], ph["ts"] + ph["dur"]
            inside = [e for e in mine if lo <= e["ts"] <= hi and e is not ph]
            starts = [e for e in inside if e["name"] == "AllReduceStart"]
            waits = [e for e in inside if e["name"] == "Wait"]
            if not starts or len(starts) != len(waits):
                sys.exit(f"FAIL: rank {pid}: {len(starts)} starts and {len(waits)} waits "
                         f"in '{last}' at {lo}")
            first_start = min(e["ts"] for e in starts)
            last_wait = max(e["ts"] for e in waits)
            overlapped = [e for e in inside if e["name"] not in ("AllReduceStart", "Wait", "Scale")
                          and first_start < e["ts"] < last_wait]
            if not overlapped:
                sys.exit(f"FAIL: rank {pid}: nothing computes while a bucket is in flight")
            checked += 1
        for ph in phases:
            if ph["name"] == "step":
                lo, hi = ph["ts"], ph["ts"] + ph["dur"]
                if any(e["name"] in ("AllReduce", "AllReduceStart") and lo <= e["ts"] <= hi
                       and not e.get("args", {}).get("group", "").endswith("pp")
                       for e in mine):
                    sys.exit(f"FAIL: rank {pid}: the step still all-reduces")
    if not checked:
        sys.exit("FAIL: no last-microbatch phases in the trace")
    print(f"OK: {checked} last microbatches with overlapped bucket reductions")


if __name__ == "__main__":
    main()
