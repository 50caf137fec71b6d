#!/usr/bin/env python3
"""Compares per-step losses of tessera-run --metrics files against a reference.

Usage: compare_losses.py --rtol R --steps S REF.jsonl RUN.jsonl [RUN.jsonl ...]

Fails (exit 1) with a line per mismatching step when any run's loss differs
from the reference's by more than R relative, when a file lacks a step, or
when the reference loss does not fall over the run (a run that learns
nothing would make the comparison meaningless).
"""
import argparse
import json
import sys


def losses(path, steps):
    by_step = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            by_step[rec["step"]] = rec["loss"]
    missing = [s for s in range(1, steps + 1) if s not in by_step]
    if missing:
        sys.exit(f"FAIL: {path} has no loss for steps {missing}")
    return [by_step[s] for s in range(1, steps + 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtol", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("reference")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()

    ref = losses(args.reference, args.steps)
    if not ref[-1] < ref[0]:
        sys.exit(f"FAIL: reference loss does not fall: {ref[0]} -> {ref[-1]}")
    failed = False
    for run in args.runs:
        got = losses(run, args.steps)
        worst = 0.0
        for step, (a, b) in enumerate(zip(got, ref), start=1):
            rel = abs(a - b) / abs(b)
            worst = max(worst, rel)
            if rel > args.rtol:
                print(f"FAIL: {run} step {step}: loss {a!r} vs reference {b!r} "
                      f"(relative difference {rel:.3e} > {args.rtol:.0e})")
                failed = True
        print(f"{run}: max relative difference {worst:.3e} over {args.steps} steps")
    print(f"reference loss {ref[0]:.6f} -> {ref[-1]:.6f}")
    if failed:
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
