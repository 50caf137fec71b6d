#!/usr/bin/env python3
"""Checks that a resumed run logged exactly what the uninterrupted one did.

Usage: compare_metrics.py REF.jsonl RUN.jsonl FIELD [FIELD ...]

Every step of RUN (tessera-run --metrics) must be in REF with every FIELD
equal (as parsed from the JSON: the same float, the same null); prints
"steps A-B: FIELD ... equal", or a FAIL line per difference and exits 1.
"""
import json
import sys


def by_step(path):
    with open(path) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    ref, run, fields = by_step(sys.argv[1]), by_step(sys.argv[2]), sys.argv[3:]
    if not run:
        sys.exit(f"FAIL: {sys.argv[2]} has no steps")
    failed = False
    for step in sorted(run):
        if step not in ref:
            print(f"FAIL: step {step} is not in {sys.argv[1]}")
            failed = True
            continue
        for field in fields:
            a, b = run[step].get(field, "<missing>"), ref[step].get(field, "<missing>")
            if a != b:
                print(f"FAIL: step {step}: {field} {a!r} vs {b!r}")
                failed = True
    if failed:
        sys.exit(1)
    print(f"steps {min(run)}-{max(run)}: {' '.join(fields)} equal")


if __name__ == "__main__":
    main()
