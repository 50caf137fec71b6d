#!/usr/bin/env python3
"""tessera-plan's predictions against step times measured on this machine.

The one check of the planner against hardware that runs here: the CPU
backend on 2 ranks (one core each) as a "cluster" of two devices. The
cluster file is written from two measurements on this machine, not from a
data sheet:
  - peak: the FLOP/s one rank reaches on the model itself (tessera-run -n 1,
    the compiler's FLOP count over the median step time), with GEMM
    efficiency max 1 and half size 0, so "peak" means "what this model's
    GEMMs reach";
  - the memory-bound ops' bandwidth and the link between the ranks: the
    --hbm and --link flags (defaults measured once with the bench's own
    model: see docs/ARCHITECTURE.md section 4d).
Then --top of the layouts tessera-plan ranks for 2 ranks, spread evenly
over its whole ranking (best and worst included), are compiled from the
planner's own flags and trained for a few steps with tessera-run -n 2, and
the bench prints predicted and measured step times per layout, their
ratio, the largest error and the rank correlation of the two orders
(Spearman).

A benchmark, not a test: nothing is asserted. Prints one JSON object.

usage: bench/plan_vs_measured.py [--build build] [--hidden 512] [--layers 4]
           [--seq 256] [--batch 16] [--steps 6] [--top 16]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def median_step(bindir, art, data, steps, ranks, metrics):
    subprocess.run([os.path.join(bindir, "tessera-run"), "-n", str(ranks), art,
                    "--data", data, "--steps", str(steps), "--threads", "1",
                    "--metrics", metrics], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    lines = [json.loads(line) for line in open(metrics)]
    # The first two steps warm up (page faults, BLAS buffers).
    return statistics.median(x["step_time_s"] for x in lines[2:]), lines


def spearman(a, b):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--hbm", type=float, default=10.0,
                    help="GB/s of the memory-bound ops")
    ap.add_argument("--link", type=float, default=5.0,
                    help="GB/s between the two ranks (MPI over shared memory)")
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    result = {"benchmark": "plan_vs_measured", "model": vars(args).copy()}
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "austen")
        subprocess.run([os.path.join(bindir, "tessera-preprocess"), "--input",
                        os.path.join(REPO, "examples", "data",
                                     "northanger_abbey_vol1.txt"),
                        "--output-prefix", prefix, "--append-eod"], check=True,
                       stdout=subprocess.DEVNULL)
        data = prefix + "_text_document"
        model = os.path.join(tmp, "gpt.mlir")
        subprocess.run([os.path.join(bindir, "tessera-gen"), "gpt", "--layers",
                        str(args.layers), "--hidden", str(args.hidden), "--heads",
                        str(args.heads), "--vocab", str(args.vocab), "--seq",
                        str(args.seq), "-o", model], check=True)
        # The peak: one rank, the whole batch in one microbatch.
        one = os.path.join(tmp, "one.tsr")
        subprocess.run([os.path.join(bindir, "tessera-compile"), model,
                        "--micro-batch-size", str(args.batch),
                        "--global-batch-size", str(args.batch), "-o", one],
                       check=True)
        step1, lines = median_step(bindir, one, data, args.steps, 1,
                                   os.path.join(tmp, "one.jsonl"))
        tflops = statistics.median(x["tflops_per_rank"] for x in lines[2:])
        cluster = {
            "name": "this machine: 2 ranks, one core each",
            "gpus_per_node": 2, "nodes": 1, "memory_gib": 8,
            "peak_tflops": {"bf16": tflops, "fp32": tflops},
            "hbm_bandwidth_gb_per_s": args.hbm,
            "intra_node": {"bandwidth_gb_per_s": args.link, "latency_us": 5},
            "inter_node": {"bandwidth_gb_per_s": args.link, "latency_us": 5},
            "gemm_efficiency": {"max": 1.0, "half_size": 1e-9},
        }
        cluster_file = os.path.join(tmp, "cpu.json")
        json.dump(cluster, open(cluster_file, "w"))
        result["one_rank"] = {"step_seconds": step1, "tflops": tflops}
        out = subprocess.run([os.path.join(bindir, "tessera-plan"), model,
                              "--global-batch-size", str(args.batch),
                              "--cluster", cluster_file, "--fp32", "--top",
                              "100000", "--verify-top", "0"],
                             check=True, capture_output=True, text=True).stdout
        ranked_all = json.loads(out)["ranked"]
        # --top layouts spread evenly over the whole ranking (the best and
        # the worst included), so the check covers different kinds of layout.
        n = min(args.top, len(ranked_all))
        picks = sorted({round(i * (len(ranked_all) - 1) / max(1, n - 1))
                        for i in range(n)})
        ranked = [ranked_all[i] for i in picks]
        result["feasible_layouts"] = len(ranked_all)
        rows = []
        for i, layout in enumerate(ranked):
            art = os.path.join(tmp, f"l{i}.tsr")
            flags = [f for f in layout["flags"].split() if f]
            subprocess.run([os.path.join(bindir, "tessera-compile"), model] +
                           flags + ["-o", art], check=True)
            measured, _ = median_step(bindir, art, data, args.steps, 2,
                                      os.path.join(tmp, f"l{i}.jsonl"))
            rows.append({"planner_rank": picks[i] + 1, "flags": layout["flags"],
                         "predicted_s": round(layout["step_seconds"], 4),
                         "measured_s": round(measured, 4),
                         "ratio": round(layout["step_seconds"] / measured, 3)})
        result["layouts"] = rows
        result["spearman"] = round(spearman([r["predicted_s"] for r in rows],
                                            [r["measured_s"] for r in rows]), 3)
        best = min(rows, key=lambda r: r["measured_s"])
        result["measured_best"] = best["flags"]
        result["measured_best_planner_rank"] = best["planner_rank"]
        result["max_relative_error"] = round(
            max(abs(r["ratio"] - 1) for r in rows), 3)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
