#!/usr/bin/env python3
"""Compares the evaluation lines of tessera-run --metrics files.

Usage: compare_eval.py --rtol R [--training TRAIN.jsonl] REF.jsonl
           [RUN.jsonl ...]

Each file's evaluation lines ({"eval_iteration": it, "eval_loss": l,
"eval_batches": [{"batch": b, "loss": l_b}, ...]}, from --eval-iters or
--eval-only) must score the same batches as REF's, each within R relative
of REF's. With --training, the first batch REF scored after iteration it
(batch it + 1) must also equal within R the loss TRAIN logged at iteration
it + 1 (that iteration reads that batch and reports its loss before
updating: the same forward, with the same weights when TRAIN resumed from
the checkpoint REF evaluated). Prints OK or fails naming the batch.
"""
import argparse
import json
import sys


def evaluations(path):
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "eval_batches" in r:
                out.append(r)
    if not out:
        sys.exit(f"{path}: no evaluation lines")
    return out


def close(a, b, rtol):
    return abs(a - b) <= rtol * abs(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtol", type=float, required=True)
    ap.add_argument("--training")
    ap.add_argument("reference")
    ap.add_argument("runs", nargs="*")
    args = ap.parse_args()
    ref = evaluations(args.reference)
    failures = []
    for path in args.runs:
        run = evaluations(path)
        if [e["eval_iteration"] for e in run] != [e["eval_iteration"] for e in ref]:
            failures.append(f"{path}: evaluates after iterations "
                            f"{[e['eval_iteration'] for e in run]}, the reference after "
                            f"{[e['eval_iteration'] for e in ref]}")
            continue
        for e, r in zip(run, ref):
            if len(e["eval_batches"]) != len(r["eval_batches"]):
                failures.append(f"{path}: {len(e['eval_batches'])} batches after "
                                f"iteration {e['eval_iteration']}, the reference "
                                f"{len(r['eval_batches'])}")
                continue
            for b, rb in zip(e["eval_batches"], r["eval_batches"]):
                if b["batch"] != rb["batch"]:
                    failures.append(f"{path}: batch {b['batch']} where the reference "
                                    f"scored {rb['batch']}")
                elif not close(b["loss"], rb["loss"], args.rtol):
                    failures.append(f"{path}: batch {b['batch']}: {b['loss']:.9g} vs "
                                    f"{rb['loss']:.9g}")
    if args.training:
        trained = {}
        with open(args.training) as f:
            for line in f:
                r = json.loads(line)
                if "step" in r:
                    trained[r["step"]] = r["loss"]
        for e in ref:
            for b in e["eval_batches"]:
                if b["batch"] != e["eval_iteration"] + 1:
                    continue
                if b["batch"] not in trained:
                    failures.append(f"{args.training}: no iteration {b['batch']}")
                elif not close(b["loss"], trained[b["batch"]], args.rtol):
                    failures.append(f"batch {b['batch']}: evaluated {b['loss']:.9g}, "
                                    f"trained on {trained[b['batch']]:.9g}")
    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
