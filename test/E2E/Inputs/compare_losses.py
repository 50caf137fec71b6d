#!/usr/bin/env python3
"""Compares per-step losses of tessera-run --metrics files against a reference.

Usage: compare_losses.py --rtol R --steps S [--min-decision-margin M]
           REF.jsonl RUN.jsonl [RUN.jsonl ...]

Fails (exit 1) with a line per mismatching step when any run's loss differs
from the reference's by more than R relative, when a file lacks a step, or
when the reference loss does not fall over the run (a run that learns
nothing would make the comparison meaningless).

--min-decision-margin M: the reference (Inputs/torch_reference.py) reports
each step's smallest margin of a discrete decision (an MoE router's top-k,
an expert's capacity drop); below M the data hold a near-tie that another
summation order, on another CPU, may decide the other way, and a loss bound
derived for rounding differences would not hold: a failure that says so.
"""
import argparse
import json
import sys


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def losses(path, steps):
    by_step = {}
    for rec in records(path):
        by_step[rec["step"]] = rec["loss"]
    missing = [s for s in range(1, steps + 1) if s not in by_step]
    if missing:
        sys.exit(f"FAIL: {path} has no loss for steps {missing}")
    return [by_step[s] for s in range(1, steps + 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtol", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--min-decision-margin", type=float, default=None)
    ap.add_argument("reference")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()

    ref = losses(args.reference, args.steps)
    if args.min_decision_margin is not None:
        margins = [(r["step"], r.get("min_decision_margin"))
                   for r in records(args.reference) if r["step"] <= args.steps]
        if any(m is None for _, m in margins):
            sys.exit(f"FAIL: {args.reference} reports no decision margins")
        step, worst = min(margins, key=lambda sm: sm[1])
        if worst < args.min_decision_margin:
            sys.exit(f"FAIL: near-tie: a decision at step {step} has margin "
                     f"{worst:.3e} < {args.min_decision_margin:.0e}; another "
                     f"summation order may decide it the other way (choose "
                     f"data or a seed without near-ties)")
        print(f"smallest decision margin {worst:.3e} (step {step})")
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
