#!/usr/bin/env python3
"""Checks a pipeline's tessera-run --trace against its planned schedule.

usage: pipeline_trace.py TRACE.json SCHEDULE.json --steps S

SCHEDULE.json is tessera-compile --emit=schedule for the same configuration
(pp only: world rank = pp rank). Per rank and step (a step ends with the
"step" phase slice) the phase track's compute slices ("F c<chunk> mb<m>",
"B c<chunk> mb<m>") must be exactly the schedule's order for that pp rank:
every (chunk, microbatch) once forward and once backward, in that order.
Prints, for FileCheck:
  ranks, tracks
  rank 0 order <op><chunk>.<mb> ...  (the first step as traced)
  per rank: steps S, complete True, matches schedule True
  p2p: every rank has send and recv slices, every send/recv slice lies
       inside a phase of the same kind ("send:..."/"recv:..."), every
       rank has "p2p wait" slices, and rank 0's sends per step.
"""
import argparse
import json
import re
import sys

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("schedule")
ap.add_argument("--steps", type=int, required=True)
a = ap.parse_args()

ev = [e for e in json.load(open(a.trace))["traceEvents"] if e["ph"] == "X"]
sched = json.load(open(a.schedule))
ranks = sorted({e["pid"] for e in ev})
print("ranks", ranks)
print("tracks", sorted({e["cat"] for e in ev}))
COMPUTE = re.compile(r"^([FB]) c(\d+) mb(\d+)$")


def fmt(order):
    return " ".join(f"{op}{c}.{m}" for op, c, m in order)


def steps_of(rank):
    """The F/B phase slices of each step, in time order."""
    phases = sorted((e for e in ev if e["pid"] == rank and e["cat"] == "phase"),
                    key=lambda e: e["ts"])
    steps, cur = [], []
    for e in phases:
        if e["name"] == "step":
            steps.append(cur)
            cur = []
            continue
        m = COMPUTE.match(e["name"])
        if m:
            cur.append((m.group(1), int(m.group(2)), int(m.group(3))))
    if cur:
        steps.append(cur)  # compute after the last "step": an error
    return steps


ok = True
for rank in ranks:
    want = [(o["op"], o["chunk"], o["microbatch"])
            for r in sched["ranks"] if r["pp_rank"] == rank for o in r["order"]]
    steps = steps_of(rank)
    expected_set = sorted((op, c, m) for op in "FB"
                          for c in range(sched["vpp"])
                          for m in range(sched["micro_batches"]))
    complete = all(sorted(s) == expected_set for s in steps)
    matches = bool(want) and all(s == want for s in steps)
    if rank == 0 and steps:
        print("rank 0 order", fmt(steps[0]))
    print(f"rank {rank}: steps {len(steps)}, complete {complete}, matches schedule {matches}")
    if not matches:
        for i, s in enumerate(steps):
            if s != want:
                print(f"  step {i + 1}: traced   {fmt(s)}")
                print(f"  step {i + 1}: schedule {fmt(want)}")
                break
    ok &= len(steps) == a.steps and complete and matches

# p2p
send_recv_inside = True
has = True
for rank in ranks:
    mine = [e for e in ev if e["pid"] == rank]
    phases = [e for e in mine if e["cat"] == "phase"]
    p2p = [e for e in mine if e["cat"] == "p2p"]
    sends = [e for e in p2p if e["name"].startswith("send\u2192pp")]
    recvs = [e for e in p2p if e["name"].startswith("recv\u2190pp")]
    waits = [e for e in p2p if e["name"] == "p2p wait"]
    has &= bool(sends) and bool(recvs) and bool(waits)
    for e, kind in [(s, "send:") for s in sends] + [(r, "recv:") for r in recvs]:
        send_recv_inside &= any(
            p["name"].startswith(kind) and p["ts"] - 1e-3 <= e["ts"]
            and e["ts"] + e["dur"] <= p["ts"] + p["dur"] + 1e-3 for p in phases)
    if rank == 0:
        print("rank 0 sends per step", len(sends) / a.steps,
              "peers", sorted({e["name"] for e in p2p if e["name"] != "p2p wait"}))
print("p2p send, recv and wait slices on every rank", has)
print("send/recv slices inside send:/recv: phases", send_recv_inside)
ok &= has and send_recv_inside
if not ok:
    sys.exit(1)
print("OK")
