#!/usr/bin/env python3
"""Compares per-step losses of tessera-run --metrics files against a reference.

Usage: compare_losses.py --rtol R --steps S [--grad-norm-rtol G]
           [--first-grad-norm-rtol G1] [--params-norm-rtol P]
           [--min-decision-margin M]
           REF.jsonl RUN.jsonl [RUN.jsonl ...]

Fails (exit 1) with a line per mismatching step when any run's loss differs
from the reference's by more than R relative, when a file lacks a step, or
when the reference loss does not fall over the run (a run that learns
nothing would make the comparison meaningless).

--grad-norm-rtol G: the gradient norms ("grad_norm", the norm before
clipping that Megatron logs) must agree within G relative as well;
--first-grad-norm-rtol G1: the first step's within G1 (tighter: from the
same weights the first norm measures the backward alone, while Adam's
near-sign steps let later weights, and norms, drift by more than rounding
in a float32 run against a float64 reference);
--params-norm-rtol P: likewise the parameters' norms ("params_norm",
tessera-compile --log-params-norm). A gradient norm that is null (an fp16
iteration whose updates were skipped) must be null in both.

--exact FIELD (repeatable): the field must be equal at every step (fp16's
"loss_scale" and "skipped_iterations": every layout skips the same
iterations).

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


def values(path, steps, field="loss"):
    by_step = {}
    for rec in records(path):
        if field in rec:
            by_step[rec["step"]] = rec[field]
    missing = [s for s in range(1, steps + 1) if s not in by_step]
    if missing:
        sys.exit(f"FAIL: {path} has no {field} for steps {missing}")
    return [by_step[s] for s in range(1, steps + 1)]


def compare(run, got, ref, field, rtol, steps):
    """Prints each step where got differs from ref by more than rtol;
    returns whether any did."""
    worst = 0.0
    failed = False
    for step, (a, b) in enumerate(zip(got, ref), start=1):
        if a is None or b is None:
            if (a is None) != (b is None):
                print(f"FAIL: {run} step {step}: {field} {a!r} vs reference "
                      f"{b!r} (skipped in one only)")
                failed = True
            continue
        rel = abs(a - b) / abs(b) if b != 0 else abs(a)
        worst = max(worst, rel)
        if rel > rtol:
            print(f"FAIL: {run} step {step}: {field} {a!r} vs reference {b!r} "
                  f"(relative difference {rel:.3e} > {rtol:.0e})")
            failed = True
    label = "" if field == "loss" else f" ({field})"
    print(f"{run}: max relative difference{label} {worst:.3e} over {steps} steps")
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtol", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--grad-norm-rtol", type=float, default=None)
    ap.add_argument("--first-grad-norm-rtol", type=float, default=None)
    ap.add_argument("--params-norm-rtol", type=float, default=None)
    ap.add_argument("--min-decision-margin", type=float, default=None)
    ap.add_argument("--exact", action="append", default=[])
    ap.add_argument("reference")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()

    ref = values(args.reference, args.steps)
    extra = [(field, rtol, values(args.reference, args.steps, field))
             for field, rtol in (("grad_norm", args.grad_norm_rtol),
                                 ("params_norm", args.params_norm_rtol))
             if rtol is not None]
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
        got = values(run, args.steps)
        failed |= compare(run, got, ref, "loss", args.rtol, args.steps)
        for field, rtol, want in extra:
            got = values(run, args.steps, field)
            failed |= compare(run, got, want, field, rtol, args.steps)
        for field in args.exact:
            want = values(args.reference, args.steps, field)
            got = values(run, args.steps, field)
            bad = [s for s, (a, b) in enumerate(zip(got, want), start=1)
                   if a != b]
            if bad:
                print(f"FAIL: {run} {field} differs at steps {bad}: "
                      f"{[got[s - 1] for s in bad]} vs {[want[s - 1] for s in bad]}")
                failed = True
            else:
                print(f"{run}: {field} equal over {args.steps} steps")
        if args.first_grad_norm_rtol is not None:
            failed |= compare(run, values(run, 1, "grad_norm"),
                              values(args.reference, 1, "grad_norm"),
                              "grad_norm", args.first_grad_norm_rtol, 1)
    print(f"reference loss {ref[0]:.6f} -> {ref[-1]:.6f}")
    if failed:
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
