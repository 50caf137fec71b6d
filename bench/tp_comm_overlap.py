#!/usr/bin/env python3
"""Tensor-parallel communication pipelined with the GEMMs (--tp-comm-overlap).

The GPT at tp 2 (and tp 4) with sequence parallelism, without and with
--tp-comm-overlap, in fp32 and bf16, run with --profile; prints one JSON
object with, per configuration:
  - the step time (median over the steps after the first) and the counted
    tp bytes per step (all-gather + reduce-scatter + all-reduce);
  - the time in the sequence-parallel collectives (AllGather,
    ReduceScatter) and in the GEMMs (Gemm), and with the overlap in the
    fused instructions (AllGatherGemm, GemmReduceScatter);
  - for the overlapped run, the hidden fraction of the collectives it fused:
      comm    = their time unfused: the unfused run's AllGather +
                ReduceScatter less what the overlapped run still spends in
                those (the embeddings' gather, which no GEMM reads);
      gemms   = the fused GEMMs' time: the unfused run's Gemm less the
                overlapped run's;
      exposed = the fused instructions' time less `gemms`;
      hidden  = 1 - exposed / comm (1: every transfer ran under a GEMM).
A benchmark, not a test: nothing is asserted. On this machine the ranks are
processes on 2 shared cores and Open MPI moves a shared-memory message with
the CPU inside MPI calls (no progress thread, no copy engine): a transfer
cannot run under a GEMM on the same core, so the fraction says what the
ring's structure gains here (no rank waits for the whole gather before its
first GEMM), not what NCCL's separate stream gains on a GPU.

usage: bench/tp_comm_overlap.py [--build build] [--steps 6] [--hidden 256]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

COLLECTIVES = ("AllGather", "ReduceScatter")
FUSED = ("AllGatherGemm", "GemmReduceScatter")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4)
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
        for tp in (2, 4):
            for dtype in ("fp32", "bf16"):
                for overlap in (False, True):
                    name = f"tp{tp}-{dtype}" + ("-overlap" if overlap else "")
                    flags = ["--tp", str(tp), "--sequence-parallel",
                             "--micro-batch-size", str(args.micro_batch_size),
                             "--global-batch-size", str(args.micro_batch_size),
                             "--make-vocab-size-divisible-by", "128"]
                    if dtype == "bf16":
                        flags.append("--bf16")
                    if overlap:
                        flags.append("--tp-comm-overlap")
                    art = os.path.join(tmp, name + ".tsr")
                    subprocess.run([os.path.join(bindir, "tessera-compile"), model, *flags,
                                    "-o", art], check=True)
                    metrics = os.path.join(tmp, name + ".jsonl")
                    subprocess.run([os.path.join(bindir, "tessera-run"), "-n", str(tp), art,
                                    "--data", data, "--steps", str(args.steps + 1), "--profile",
                                    "--metrics", metrics], check=True, stdout=subprocess.DEVNULL)
                    lines = [json.loads(l) for l in open(metrics)][1:]

                    def median(ops):
                        return statistics.median(
                            sum(l["kernel_time_s"].get(op, 0.0) for op in ops) for l in lines)
                    cb = lines[-1]["comm_bytes"]
                    results.append({
                        "config": name, "tp": tp, "dtype": dtype, "overlap": overlap,
                        "step_time_s": statistics.median(l["step_time_s"] for l in lines),
                        "tp_bytes_per_step": sum(cb.get(k, {}).get("tp", 0)
                                                 for k in ("all_gather", "reduce_scatter",
                                                           "all_reduce")),
                        "collective_time_s": median(COLLECTIVES),
                        "gemm_time_s": median(("Gemm",)),
                        "fused_time_s": median(FUSED),
                    })
        by = {r["config"]: r for r in results}
        for r in results:
            if not r["overlap"]:
                continue
            base = by[r["config"].replace("-overlap", "")]
            comm = base["collective_time_s"] - r["collective_time_s"]
            gemms = base["gemm_time_s"] - r["gemm_time_s"]
            exposed = r["fused_time_s"] - gemms
            r["fused_comm_time_s"] = comm
            r["fused_gemm_time_s"] = gemms
            r["exposed_comm_time_s"] = exposed
            r["hidden_fraction"] = 1 - exposed / comm if comm > 0 else None
            r["step_speedup"] = base["step_time_s"] / r["step_time_s"]
    json.dump({"benchmark": "tp_comm_overlap", "hidden": args.hidden, "layers": args.layers,
               "seq": args.seq, "micro_batch_size": args.micro_batch_size,
               "note": "CPU ranks over Open MPI shared memory: transfers are CPU copies "
                       "inside MPI calls and cannot run under a GEMM on the same core",
               "results": results}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
