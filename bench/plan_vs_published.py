#!/usr/bin/env python3
"""tessera-plan against published Megatron-LM runs.

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21), Table 1: GPT models from 1.7B to 1T
parameters (sequence 2048, vocabulary 51200) on 32 to 3072 A100 80GB GPUs
(DGX A100 nodes of 8), each with its tensor- and pipeline-parallel sizes,
batch size and the teraFLOP/s per GPU it achieved. The paper counts FLOPs
as 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration (activation
recomputation included: four passes over each layer).

For each row this runs tessera-plan for that model and GPU count twice:
  - restricted to the published tp and pp with full recompute (the paper's
    runs recompute every layer), without the distributed optimizer (which
    came later) and under Megatron's schedules (1F1B, or interleaved with
    vpp; not the zero-bubble ZB-H1), the planner choosing micro-batch size
    and vpp: is the
    published layout feasible, and what does the planner predict for it, in
    the paper's FLOP count;
  - unrestricted: the published layout's rank among all feasible ones, and
    the planner's best layout with its prediction.

A benchmark, not a test: nothing is asserted. Prints one JSON object
(and --text a table).

The H100 rows: the Megatron-LM README's strong scaling of GPT-3 175B on
H100s (MFU 47% at 96 GPUs, 42% at 4608), whose layouts are not given in
text: the planner's best layout and its MFU against the published MFU, as
Tessera would run it, with the overlaps Megatron's run used
(--tp-comm-overlap and --overlap-param-gather, which Tessera plans and
runs), and without the tensor-parallel one (tessera-plan
--no-tp-comm-overlap, as Tessera planned before it had it).

usage: bench/plan_vs_published.py [--build build]
           [--cluster examples/clusters/dgx-a100-80gb.json]
           [--h100-cluster examples/clusters/dgx-h100.json] [--rows 1.7B,1T]
           [--no-h100] [--text]
"""
import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# Table 1 of Narayanan et al. (SC'21): name, heads, hidden, layers, tp, pp,
# GPUs, batch, achieved teraFLOP/s per GPU.
TABLE1 = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SEQ, VOCAB = 2048, 51200

# The Megatron-LM README's H100 results (its model table is an image; the
# text gives the strong scaling of its GPT-3 175B, vocabulary 131072, batch
# 1152, from 96 to 4608 H100 GPUs: MFU 47% to 42%). The layouts are not in
# the text, so these rows compare the planner's best MFU only. Name, heads,
# hidden, layers, GPUs, batch, MFU.
H100 = [
    ("GPT-3 175B", 96, 12288, 96, 96, 1152, 0.47),
    ("GPT-3 175B", 96, 12288, 96, 4608, 1152, 0.42),
]
H100_VOCAB = 131072
# Megatron-LM today: overlapped fp32 gradient reductions, 16-bit activations
# (Tessera's defaults under bf16 too; said for the record).
MEGATRON_H100 = ["--activations", "bf16"]


def paper_flops(batch, layers, hidden, recompute=True):
    """The paper's FLOPs per iteration (with recomputation: 96, else 72)."""
    f = 96 if recompute else 72
    return f * batch * SEQ * layers * hidden ** 2 * (
        1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


# How the published runs reduced gradients and kept activations (Megatron-LM
# 2021: gradients all-reduced in 16 bits after the backward, activations in
# 16 bits, tensor-parallel collectives apart from the GEMMs); Tessera's own
# defaults differ (overlapped fp32 reductions, --tp-comm-overlap), and
# tessera-plan models either.
MEGATRON_2021 = ["--no-overlap-grad-reduce", "--grad-reduce-in-bf16", "--no-tp-comm-overlap",
                 "--activations", "bf16"]


def run_plan(bindir, cluster, row, extra):
    name, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    nodes = gpus // 8
    cmd = [os.path.join(bindir, "tessera-plan"), "gpt", "--layers", str(layers),
           "--hidden", str(hidden), "--heads", str(heads), "--seq", str(SEQ),
           "--vocab", str(VOCAB), "--global-batch-size", str(batch),
           "--cluster", cluster, "--nodes", str(nodes)] + MEGATRON_2021 + extra
    start = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - start
    try:
        return json.loads(out.stdout), wall, out.stderr.strip()
    except json.JSONDecodeError:
        return None, wall, out.stderr.strip()


def why(best, published, tp, pp):
    """What the planner's best layout changes, in words."""
    if best["tp"] == tp and best["pp"] == pp and best["cp"] == 1 and \
            best["recompute"] == "full":
        return "the published tp and pp with full recompute"
    reasons = []
    if best["recompute"] == "none":
        reasons.append("no recompute: it fits in %.0f GiB without it, saving "
                       "the forward run again in each backward" % best["memory_gib"])
    elif best["recompute"] == "selective":
        reasons.append("selective instead of full recompute: keeping sequence "
                       "parallelism's shards (gathered again in the backward) "
                       "fits in %.0f GiB without running each layer's forward "
                       "twice" % best["memory_gib"])
    if best["tp"] != tp:
        reasons.append("tp %d instead of %d: less tensor-parallel communication "
                       "and larger GEMMs per GPU" % (best["tp"], tp)
                       if best["tp"] < tp else "tp %d instead of %d" % (best["tp"], tp))
    if best.get("sharding_strategy") == "optim_grads":
        reasons.append("ZeRO-2 (not in 2021's Megatron) shards the optimizer "
                       "state and the gradients over dp %d" % best["dp"])
    elif best["distributed_optimizer"] and not published.get("distributed_optimizer"):
        reasons.append("the distributed optimizer (not in 2021's Megatron) shards "
                       "the optimizer state over dp %d" % best["dp"])
    if best["pp"] != pp:
        reasons.append("pp %d instead of %d" % (best["pp"], pp))
    if best["vpp"] > 1:
        reasons.append("interleaved schedule (vpp %d): bubble %.3f"
                       % (best["vpp"], best["bubble"]))
    if best.get("schedule") == "zb-h1":
        reasons.append("zero-bubble schedule ZB-H1 (not in Megatron-LM): "
                       "bubble %.3f" % best["bubble"])
    if best["cp"] > 1:
        reasons.append("context parallelism cp %d" % best["cp"])
    return "; ".join(reasons)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--cluster", default=os.path.join(
        REPO, "examples", "clusters", "dgx-a100-80gb.json"))
    ap.add_argument("--rows", default="", help="names, comma-separated")
    ap.add_argument("--h100-cluster", default=os.path.join(
        REPO, "examples", "clusters", "dgx-h100.json"))
    ap.add_argument("--no-h100", action="store_true")
    ap.add_argument("--text", action="store_true")
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    wanted = set(args.rows.split(",")) if args.rows else None
    rows = []
    for row in TABLE1:
        name, heads, hidden, layers, tp, pp, gpus, batch, published = row
        if wanted and name not in wanted:
            continue
        entry = {"model": name, "gpus": gpus, "batch": batch,
                 "published": {"tp": tp, "pp": pp, "dp": gpus // (tp * pp),
                               "tflops_per_gpu": published}}
        fixed, wall_fixed, err = run_plan(
            bindir, args.cluster, row,
            ["--tp", str(tp), "--pp", str(pp), "--cp", "1", "--recompute",
             "full", "--distributed-optimizer", "0", "--schedule", "1f1b",
             "--top", "1"])
        if not fixed or not fixed["ranked"]:
            entry["published_layout_feasible"] = False
            entry["error"] = err
            rows.append(entry)
            continue
        best_fixed = fixed["ranked"][0]
        predicted = paper_flops(batch, layers, hidden) / (
            best_fixed["step_seconds"] * gpus) / 1e12
        entry["published_layout_feasible"] = True
        entry["published_layout"] = {
            k: best_fixed[k] for k in ("micro_batch", "vpp",
                                       "distributed_optimizer",
                                       "step_seconds", "memory_gib",
                                       "bubble")
            if k in best_fixed}
        entry["predicted_tflops_per_gpu"] = round(predicted, 1)
        entry["relative_error"] = round(predicted / published - 1, 4)
        free, wall_free, err = run_plan(
            bindir, args.cluster, row, ["--top", "100000", "--verify-top", "0"])
        entry["search_seconds"] = round(wall_free, 2)
        entry["candidates"] = free["candidates"] if free else 0
        if free and free["ranked"]:
            rank = next((i + 1 for i, r in enumerate(free["ranked"])
                         if r["tp"] == tp and r["pp"] == pp and r["cp"] == 1
                         and r["recompute"] == "full"
                         and not r["distributed_optimizer"]), None)
            best = free["ranked"][0]
            entry["published_layout_rank"] = rank
            entry["feasible_layouts"] = len(free["ranked"])
            entry["best"] = {k: best[k] for k in (
                "tp", "cp", "pp", "vpp", "dp", "micro_batch", "recompute",
                "distributed_optimizer", "sharding_strategy", "schedule", "step_seconds", "mfu", "bubble",
                "memory_gib")}
            entry["best"]["speedup_over_published_layout"] = round(
                best_fixed["step_seconds"] / best["step_seconds"], 3)
            entry["why"] = why(best, best_fixed, tp, pp)
        rows.append(entry)
    h100_rows = []
    for name, heads, hidden, layers, gpus, batch, mfu in H100:
        if args.no_h100:
            break
        cmd = [os.path.join(bindir, "tessera-plan"), "gpt", "--layers", str(layers),
               "--hidden", str(hidden), "--heads", str(heads), "--seq", str(SEQ),
               "--vocab", str(H100_VOCAB), "--global-batch-size", str(batch),
               "--cluster", args.h100_cluster, "--nodes", str(gpus // 8),
               "--top", "1", "--verify-top", "1"] + MEGATRON_H100
        start = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True)
        entry = {"model": name, "gpus": gpus, "batch": batch, "published_mfu": mfu,
                 "search_seconds": round(time.time() - start, 2)}
        # The same without the tensor-parallel overlap.
        without = subprocess.run(cmd + ["--no-tp-comm-overlap", "--verify-top", "0"],
                                 capture_output=True, text=True)
        try:
            w = json.loads(without.stdout)["ranked"][0]
            entry["without_tp_comm_overlap_mfu"] = round(w["mfu"], 4)
            entry["without_tp_comm_overlap_error"] = round(w["mfu"] / mfu - 1, 4)
        except (json.JSONDecodeError, IndexError, KeyError):
            pass
        try:
            best = json.loads(out.stdout)["ranked"][0]
            entry["best"] = {k: best[k] for k in (
                "tp", "cp", "pp", "vpp", "dp", "micro_batch", "recompute",
                "distributed_optimizer", "sharding_strategy", "schedule", "step_seconds", "mfu", "memory_gib")}
            entry["predicted_mfu"] = round(best["mfu"], 4)
            entry["relative_error"] = round(best["mfu"] / mfu - 1, 4)
        except (json.JSONDecodeError, IndexError, KeyError):
            entry["error"] = out.stderr.strip()
        h100_rows.append(entry)
    result = {"cluster": os.path.basename(args.cluster), "rows": rows,
              "h100_cluster": os.path.basename(args.h100_cluster),
              "h100_rows": h100_rows}
    if args.text:
        print(f"{'model':>7} {'GPUs':>5} {'tp':>3} {'pp':>3} {'published':>9} "
              f"{'predicted':>9} {'error':>7} {'rank':>5}  best layout")
        for e in rows:
            p = e["published"]
            if not e.get("published_layout_feasible"):
                print(f"{e['model']:>7} {e['gpus']:>5} {p['tp']:>3} {p['pp']:>3} "
                      f"{p['tflops_per_gpu']:>9} {'infeasible':>9}")
                continue
            b = e.get("best", {})
            print(f"{e['model']:>7} {e['gpus']:>5} {p['tp']:>3} {p['pp']:>3} "
                  f"{p['tflops_per_gpu']:>9} {e['predicted_tflops_per_gpu']:>9} "
                  f"{e['relative_error']*100:>6.1f}% {str(e.get('published_layout_rank')):>5}  "
                  f"tp {b.get('tp')} cp {b.get('cp')} pp {b.get('pp')} vpp {b.get('vpp')} "
                  f"mb {b.get('micro_batch')} {b.get('recompute')} "
                  f"x{b.get('speedup_over_published_layout')}")
        for e in h100_rows:
            b = e.get("best", {})
            print(f"H100 {e['model']} on {e['gpus']} GPUs: published MFU "
                  f"{e['published_mfu']}, planner's best {e.get('predicted_mfu')} "
                  f"({e.get('relative_error', 0)*100:.1f}%) with tp {b.get('tp')} "
                  f"cp {b.get('cp')} pp {b.get('pp')} vpp {b.get('vpp')} dp {b.get('dp')} "
                  f"mb {b.get('micro_batch')} {b.get('recompute')}; without "
                  f"--tp-comm-overlap {e.get('without_tp_comm_overlap_mfu')} "
                  f"({e.get('without_tp_comm_overlap_error', 0)*100:.1f}%)")
        sys.stdout.flush()
    else:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
