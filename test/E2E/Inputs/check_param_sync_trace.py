#!/usr/bin/env python3
"""Checks that parameter all-gathers overlap the next forward in a trace.

Usage: check_param_sync_trace.py TRACE.json --buckets K

tessera-compile --overlap-param-gather (Megatron's overlap_param_gather):
for every rank and every step followed by another iteration, the step
starts K gathers (ParamSyncStart) and the next iteration's first
microbatch ("microbatch 0") finishes them (K ParamSyncWait), with forward
compute (a kernel of the compute track) between its first and its last
wait: the gathers of the buckets the forward reads later are in flight
while it computes. No step may contain a ParamSyncWait.
"""
import argparse
import json
import sys


def inside(e, slice_):
    return slice_["ts"] <= e["ts"] and e["ts"] + e["dur"] <= slice_["ts"] + slice_["dur"] + 1e-3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--buckets", type=int, required=True)
    args = ap.parse_args()
    events = [e for e in json.load(open(args.trace))["traceEvents"] if e.get("ph") == "X"]
    ranks = sorted({e["pid"] for e in events})
    checked = 0
    for pid in ranks:
        mine = [e for e in events if e["pid"] == pid]
        phases = sorted((e for e in mine if e["name"] in ("step", "microbatch 0")),
                        key=lambda e: e["ts"])
        for step, nxt in zip(phases, phases[1:]):
            if step["name"] != "step":
                continue
            if nxt["name"] != "microbatch 0":
                sys.exit(f"FAIL: rank {pid}: the step at {step['ts']} is followed by {nxt['name']}")
            starts = [e for e in mine if e["name"] == "ParamSyncStart" and inside(e, step)]
            if len(starts) != args.buckets:
                sys.exit(f"FAIL: rank {pid}: the step at {step['ts']} starts {len(starts)} "
                         f"gathers, expected {args.buckets}")
            if any(e["name"] == "ParamSyncWait" and inside(e, step) for e in mine):
                sys.exit(f"FAIL: rank {pid}: the step at {step['ts']} waits for a gather")
            waits = sorted((e for e in mine if e["name"] == "ParamSyncWait" and inside(e, nxt)),
                           key=lambda e: e["ts"])
            if len(waits) != args.buckets:
                sys.exit(f"FAIL: rank {pid}: microbatch 0 at {nxt['ts']} has {len(waits)} "
                         f"waits, expected {args.buckets}")
            first_end = waits[0]["ts"] + waits[0]["dur"]
            last = waits[-1]["ts"]
            if not any(e.get("cat") == "compute" and first_end <= e["ts"] and
                       e["ts"] + e["dur"] <= last for e in mine):
                sys.exit(f"FAIL: rank {pid}: nothing computes between the first and the "
                         f"last wait of microbatch 0 at {nxt['ts']}")
            checked += 1
    steps = checked // max(1, len(ranks))
    if checked == 0 or checked != steps * len(ranks):
        sys.exit(f"FAIL: {checked} step/forward pairs over {len(ranks)} ranks")
    print(f"OK: {len(ranks)} ranks x {steps} steps, {args.buckets} bucket gathers each "
          f"finished under the next forward")


if __name__ == "__main__":
    main()
