#!/usr/bin/env python3
"""Data-parallel gradient traffic and overlap on the GPT (CPU ranks).

For dp = 2 and 4, with plain bucketed all-reduce, with the distributed
optimizer (ZeRO-1: reduce-scatter + all-gather), with the reductions
overlapped with the last backward (--overlap-grad-reduce), and in bf16 mixed
precision (--bf16: f32 gradients, bf16 parameters, with the distributed
optimizer; and --grad-reduce-in-bf16), prints one JSON object with, per
configuration:
  - the counted dp bytes per step (rank 0) next to the theoretical minimum
    (padding excluded): 2 (d - 1) / d x gradient bytes for an all-reduce,
    (d - 1) / d x (gradient + parameter bytes) for reduce-scatter plus
    all-gather (the two are equal in fp32), and their ratio;
  - the step time (median) and the time rank 0 spends in dp collectives
    (--profile: AllReduce, ReduceScatter, AllGather, and for overlap the
    Wait that completes the started reductions);
  - for overlap, the hidden fraction 1 - exposed / sync: `sync` is the
    collective time of the same buckets reduced in the step, `exposed` the
    time the overlapped run still waits for them;
  - with the distributed optimizer and --overlap-grad-reduce, without and
    with --overlap-param-gather: the parameter all-gather's time (AllGather
    in the step, or ParamSyncStart in the step plus the ParamSyncWait that
    the next forward spends finishing it) and its hidden fraction 1 -
    exposed / sync, `sync` the run without --overlap-param-gather;
  - ZeRO-3 (--data-parallel-sharding-strategy optim_grads_params, with
    --overlap-grad-reduce), without and with --overlap-param-gather (the
    prefetch: each bucket's gather started under the previous bucket's
    readers): the gathers' time (AllGather) and the prefetch's hidden
    fraction 1 - exposed / sync, where exposed is the prefetch run's dp
    collective time (AllGatherStart and the Waits included) less the
    gradient reductions' time of the run without it.
A benchmark, not a test: nothing is asserted. On this machine the ranks
share 2 cores and Open MPI's non-blocking collectives progress only inside
MPI calls (no progress thread), so little of the reduction can hide behind
compute; on GPUs with NCCL streams the same IR overlaps for real.

usage: bench/dp_buckets.py [--build build] [--steps 6] [--hidden 256]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

DP_OPS = ("AllReduce", "ReduceScatter", "AllGather", "AllReduceStart", "Wait",
          "ReduceScatterStart", "ParamSyncStart", "ParamSyncWait", "AllGatherStart")
GATHER_OPS = ("AllGather", "ParamSyncStart", "ParamSyncWait")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--bucket-size", type=int, default=500000)
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    root = os.path.join(os.path.dirname(__file__), "..")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "austen")
        subprocess.run([os.path.join(bindir, "tessera-preprocess"), "--input",
                        os.path.join(root, "examples", "data", "northanger_abbey_vol1.txt"),
                        "--output-prefix", data, "--append-eod"],
                       check=True, stdout=subprocess.DEVNULL)
        model = os.path.join(tmp, "gpt.mlir")
        subprocess.run([os.path.join(bindir, "tessera-gen"), "gpt", "--layers", str(args.layers),
                        "--hidden", str(args.hidden), "--heads", "4", "--vocab", "257",
                        "--seq", str(args.seq), "-o", model], check=True)
        for dp in (2, 4):
            for mode in ("allreduce", "distributed", "overlap", "bf16-distributed",
                         "bf16-grad-bf16", "distributed-overlap",
                         "distributed-overlap-param-gather", "zero3-overlap",
                         "zero3-overlap-param-gather"):
                name = f"dp{dp}-{mode}"
                flags = ["--dp", str(dp), "--micro-batch-size", "2",
                         "--global-batch-size", str(8 * dp), "--bucket-size", str(args.bucket_size)]
                if mode.startswith("bf16"):
                    flags.append("--bf16")
                if mode == "bf16-grad-bf16":
                    flags.append("--grad-reduce-in-bf16")
                if mode.endswith("distributed") or mode.startswith("distributed"):
                    flags.append("--use-distributed-optimizer")
                if mode.startswith("zero3"):
                    flags += ["--data-parallel-sharding-strategy", "optim_grads_params"]
                if "overlap" in mode:
                    flags.append("--overlap-grad-reduce")
                if mode.endswith("param-gather"):
                    flags.append("--overlap-param-gather")
                art = os.path.join(tmp, name + ".tsr")
                subprocess.run([os.path.join(bindir, "tessera-compile"), model, *flags, "-o", art],
                               check=True)
                buckets = json.loads(subprocess.run(
                    [os.path.join(bindir, "tessera-compile"), model, *flags, "--emit=buckets"],
                    check=True, capture_output=True, text=True).stdout)
                metrics = os.path.join(tmp, name + ".jsonl")
                subprocess.run([os.path.join(bindir, "tessera-run"), "-n", str(dp), art,
                                "--data", data, "--steps", str(args.steps + 1), "--profile",
                                "--metrics", metrics], check=True, stdout=subprocess.DEVNULL)
                lines = [json.loads(l) for l in open(metrics)][1:]
                cb = lines[-1]["comm_bytes"]
                counted = sum(cb.get(k, {}).get("dp", 0)
                              for k in ("all_reduce", "reduce_scatter", "all_gather"))
                size = {"f32": 4, "bf16": 2}
                grad_bytes = sum(b["numel_unpadded"] * size[b["grad_dtype"]]
                                 for b in buckets["buffers"])
                param_bytes = sum(b["numel_unpadded"] * size[b["param_dtype"]]
                                  for b in buckets["buffers"])
                if mode.startswith("zero3"):
                    # Every microbatch gathers the parameters twice (the
                    # forward's and the backward's) and reduce-scatters the
                    # gradients (ZeRO-2's per-microbatch reduction); the
                    # output layer's bucket, read by adjacent forward and
                    # backward ops, is gathered once, so the count comes
                    # out under this figure.
                    micro = 8 * dp // (2 * dp)
                    minimum = micro * (dp - 1) * (grad_bytes + 2 * param_bytes) / dp
                elif "distributed" in mode:
                    minimum = (dp - 1) * (grad_bytes + param_bytes) / dp
                else:
                    minimum = 2 * (dp - 1) * grad_bytes / dp
                comm = statistics.median(
                    sum(l["kernel_time_s"].get(op, 0.0) for op in DP_OPS) for l in lines)
                results.append({
                    "config": name, "dp": dp, "buckets": sum(len(b["buckets"]) for b in buckets["buffers"]),
                    "grad_bytes": grad_bytes, "dp_bytes_per_step": counted,
                    "theoretical_min_bytes": minimum,
                    "bytes_over_min": counted / minimum if minimum else None,
                    "step_time_s": statistics.median(l["step_time_s"] for l in lines),
                    "dp_comm_time_s": comm,
                    "param_gather_time_s": statistics.median(
                        sum(l["kernel_time_s"].get(op, 0.0) for op in GATHER_OPS)
                        for l in lines) if "distributed" in mode or "zero3" in mode
                    else None,
                })
        by = {r["config"]: r for r in results}
        for dp in (2, 4):
            sync, ov = by[f"dp{dp}-allreduce"], by[f"dp{dp}-overlap"]
            ov["hidden_fraction"] = (1 - ov["dp_comm_time_s"] / sync["dp_comm_time_s"]
                                     if sync["dp_comm_time_s"] else None)
            sync = by[f"dp{dp}-distributed-overlap"]
            pg = by[f"dp{dp}-distributed-overlap-param-gather"]
            pg["param_gather_hidden_fraction"] = (
                1 - pg["param_gather_time_s"] / sync["param_gather_time_s"]
                if sync["param_gather_time_s"] else None)
            sync = by[f"dp{dp}-zero3-overlap"]
            pf = by[f"dp{dp}-zero3-overlap-param-gather"]
            reductions = sync["dp_comm_time_s"] - sync["param_gather_time_s"]
            exposed = pf["dp_comm_time_s"] - reductions
            pf["param_gather_exposed_s"] = exposed
            pf["param_gather_hidden_fraction"] = (
                1 - exposed / sync["param_gather_time_s"]
                if sync["param_gather_time_s"] else None)
    json.dump({"benchmark": "dp_buckets", "hidden": args.hidden, "layers": args.layers,
               "seq": args.seq, "bucket_size": args.bucket_size, "results": results},
              sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
