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

With --chunks 2 (the V-shaped schedules, zbv and dualpipev), a phase of
chunk 1 prints with a ' ("F0'"), every (microbatch, chunk) is checked,
and the p2p waits inside W are counted on every rank (all of them send,
and their sends stay in flight), except in the first rank's chunk-0 W's:
stage 0's B is only the receive of its input gradient, which its W waits
for).

usage: check_zb_trace.py TRACE --pp P --microbatches M [--chunks 2]
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
    ap.add_argument("--chunks", type=int, default=1)
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
                order.append(m.group(1) + m.group(3) +
                             ("'" * int(m.group(2)) if args.chunks > 1 else ""))
        print(f"rank {rank}: " + " ".join(order))
        if rank != ranks[0] or args.chunks > 1:
            # (The iteration's last W ends the schedule, which completes
            # the open batch inside it.)
            ws = [e for e in mine if e["name"].startswith("W ") and
                  not (rank == ranks[0] and e["name"].startswith("W c0 "))]
            last_ws = {max((w for w in ws if w["ts"] < t), key=lambda w: w["ts"])["ts"]
                       for t in steps if any(w["ts"] < t for w in ws)}
            for w in (w for w in ws if w["ts"] not in last_ws):
                inside_w += sum(1 for x in waits if x["pid"] == rank and
                                w["ts"] <= x["ts"] <= w["ts"] + w["dur"])
        for mb in range(args.microbatches):
            for chunk in range(args.chunks):
                mark = "'" * chunk
                seq = [o[0] for o in order
                       if o[1:].rstrip("'") == str(mb) and o.count("'") == chunk]
                if seq != ["F", "B", "W"]:
                    print(f"rank {rank} microbatch {mb}{mark}: phases {seq}, "
                          "expected F B W")
                    ok = False
    first = ranks[0] if args.chunks > 1 else ranks[1]
    print(f"p2p waits inside W on ranks {first}..{ranks[-1]}: {inside_w}")
    ok &= inside_w == 0
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
