#!/usr/bin/env python3
"""Each pipeline rank's order of F, B and W phases in a tessera-run --trace.

Reads the phase slices ("F c0 mb3", "B c0 mb3", "W c0 mb3") of the last
step on every rank and prints "rank r: F0 F1 B0 W0 ..." in time order.
Checks that every microbatch's F, B and W run once, in that order, and
prints OK. Also counts the p2p waits inside W slices on the ranks that
send B's input gradient back (all but the first): the runtime leaves those
sends in flight while W computes, so there are none, whatever the timing
(a wait is only recorded where a batch is completed), except in an
iteration's last W, which ends the schedule and completes the batch.

usage: check_zb_trace.py TRACE --pp P --microbatches M
"""
import argparse
import json
import re
import sys

PHASE = re.compile(r"^([FBW]) c(\d+) mb(\d+)$")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--microbatches", type=int, required=True)
    args = ap.parse_args()
    events = [e for e in json.load(open(args.trace))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "phase"]
    ranks = sorted({e["pid"] for e in events})
    if len(ranks) != args.pp:
        sys.exit(f"expected {args.pp} ranks in the trace, found {len(ranks)}")
    waits = [e for e in json.load(open(args.trace))["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") == "p2p" and e.get("name") == "p2p wait"]
    ok = True
    inside_w = 0
    for rank in ranks:
        mine = sorted((e for e in events if e["pid"] == rank), key=lambda e: e["ts"])
        steps = [e["ts"] for e in mine if e["name"] == "step"]
        if len(steps) < 2:
            sys.exit(f"rank {rank}: fewer than two steps in the trace")
        # The phases between the last two step phases: the last iteration.
        last = [e for e in mine if steps[-2] < e["ts"] < steps[-1]]
        order = []
        for e in last:
            m = PHASE.match(e["name"])
            if m:
                order.append(m.group(1) + m.group(3))
        print(f"rank {rank}: " + " ".join(order))
        if rank != ranks[0]:
            # (The iteration's last W ends the schedule, which completes
            # the open batch inside it.)
            ws = [e for e in mine if e["name"].startswith("W ")]
            last_ws = {max((w for w in ws if w["ts"] < t), key=lambda w: w["ts"])["ts"]
                       for t in steps if any(w["ts"] < t for w in ws)}
            for w in (w for w in ws if w["ts"] not in last_ws):
                inside_w += sum(1 for x in waits if x["pid"] == rank and
                                w["ts"] <= x["ts"] <= w["ts"] + w["dur"])
        for mb in range(args.microbatches):
            seq = [o[0] for o in order if int(o[1:]) == mb]
            if seq != ["F", "B", "W"]:
                print(f"rank {rank} microbatch {mb}: phases {seq}, expected F B W")
                ok = False
    print(f"p2p waits inside W on ranks {ranks[1]}..{ranks[-1]}: {inside_w}")
    ok &= inside_w == 0
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
