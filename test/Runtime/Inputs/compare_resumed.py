#!/usr/bin/env python3
"""Compares a resumed run's losses with the run that never stopped.

usage: compare_resumed.py --first K --last S [--rtol R] REF.jsonl RUN.jsonl
                          [--shards DIR_A DIR_B]

RUN.jsonl (tessera-run --metrics of a run resumed with --load) must hold
exactly the steps K..S, each loss equal to REF.jsonl's (the uninterrupted
run) within R relative (default 0: exactly the same value). With --shards,
every rank_*.bin of the two checkpoint directories must be byte-identical
(parameters, optimizer state and iteration, bit for bit). Prints one line
per check and "OK"; exits 1 on a mismatch.
"""
import argparse
import filecmp
import json
import os
import sys


def losses(path):
    by_step = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            by_step[rec["step"]] = rec["loss"]
    return by_step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--first", type=int, required=True)
    ap.add_argument("--last", type=int, required=True)
    ap.add_argument("--rtol", type=float, default=0.0)
    ap.add_argument("--shards", nargs=2, metavar="DIR")
    ap.add_argument("reference")
    ap.add_argument("run")
    a = ap.parse_args()

    ref, got = losses(a.reference), losses(a.run)
    want = list(range(a.first, a.last + 1))
    failed = False
    if sorted(got) != want:
        print(f"FAIL: {a.run} has steps {sorted(got)}, expected {want}")
        failed = True
    worst = 0.0
    for step in want:
        if step not in got or step not in ref:
            continue
        rel = abs(got[step] - ref[step]) / abs(ref[step])
        worst = max(worst, rel)
        if rel > a.rtol:
            print(f"FAIL: step {step}: loss {got[step]!r} vs {ref[step]!r} "
                  f"(relative difference {rel:.3e} > {a.rtol:.0e})")
            failed = True
    kind = "identical" if a.rtol == 0 else f"within {a.rtol:g}"
    print(f"{os.path.basename(a.run)}: steps {a.first}..{a.last} {kind} "
          f"(max relative difference {worst:.3e})")
    if a.shards:
        names = sorted(n for n in os.listdir(a.shards[0]) if n.startswith("rank_"))
        other = sorted(n for n in os.listdir(a.shards[1]) if n.startswith("rank_"))
        if not names or names != other:
            print(f"FAIL: shard files differ: {names} vs {other}")
            failed = True
        for n in names:
            if n in other and not filecmp.cmp(os.path.join(a.shards[0], n),
                                              os.path.join(a.shards[1], n),
                                              shallow=False):
                print(f"FAIL: {n} differs")
                failed = True
        print(f"shards: {len(names)} files byte-identical"
              if not failed else "shards: mismatch")
    if failed:
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
