#!/usr/bin/env python3
"""Measured pipeline bubble and activation memory against the analytic ones.

For each configuration (pp, vpp, schedule) and number of microbatches M a small GPT
(tessera-gen gpt, default 8 layers, hidden 256, 4 heads, seq 128, micro
batch 2, byte vocabulary padded to 384) is compiled (tessera-compile --pp P
[--vpp V], 1F1B for vpp 1, interleaved otherwise) and trained for a few
steps on Northanger Abbey with tessera-run --trace; a configuration may
name its schedule (pp:vpp:zb-h1: the zero-bubble ZB-H1, backwards split
into B and W; pp:2:zbv and pp:2:dualpipev: the V-shaped ZBV and DualPipeV,
two chunks per rank placed as a V, B and W apart; DualPipeV only where M >=
2 pp). From the trace, per rank and step:

  window = first compute phase slice ("F c.. mb..", "B c.. mb..",
           "W c.. mb..") start
           to last compute phase slice end in that step
  busy   = total duration of those slices minus the "p2p wait" slices
           inside them (a stage's receive completes at the start of the
           function that consumes it, so waiting for the previous stage
           shows up inside its phase slice)
  bubble = (window - busy) / busy

averaged over ranks (bubble_measured); the reported value is the median
over the steps after the first (warm-up). This per-rank window leaves out a
stage's idle time before its first and after its last slice of the step
(a later stage starts late, an earlier one finishes early), which the
analytic figure counts, so it comes out below it for equal stages;
bubble_measured_global_window takes the window over all ranks of the step
instead (their clocks are lined up by a barrier) and is the one comparable
with the analytic figure. Printed next to them: Megatron's analytic bubble
(p-1)/m (1F1B) or (p-1)/(v*m) (interleaved), ZB-H1's (p-1)/(3m), the
V-shaped schedules' simulated (p-1)/(6m) (F = B = W per chunk: each rank
idles (p-1) F while the first microbatch goes down the V and back), and
the compiler's own figure
(--emit=schedule's bubble_fraction). The analytic numbers assume equal stage
times and free communication; here the last stage also runs the LM head and
the loss, and every step pays point-to-point latency.

Memory: per pp rank, tessera-compile --emit=memory's saved_activations and
in_flight (microbatches whose activations a chunk holds at once, per chunk),
next to the schedule's own count (simulating --emit=schedule's order: peak
per chunk and peak of the sum over chunks) and the bound: under 1F1B stage r
holds at most min(p - r, M) microbatches (the first stage p), under the
interleaved schedule at most min(2 (p - r - 1) + (v - 1) p + 1, v M)
chunk-microbatches (Megatron's warm-up plus one), under ZB-H1 min(p, M) on
every rank (a slot is held until its W), under ZBV min(2p, 2M) and under
DualPipeV 2p + 1 chunk-microbatches on every rank. With vpp > 1 the plan
sizes each chunk for its own peak, so sum(in_flight) can exceed the
schedule's simultaneous peak (schedule_in_flight_total): slots the plan
reserves but the schedule never fills at the same time.

CAVEAT: on a small machine (this one has 2 cores) the ranks oversubscribe
the cores: pp = 4 runs 4 single-threaded ranks on 2 cores, and a waiting rank
polls MPI while a computing rank could use the core, so per-slice times are
stretched by time-slicing and the measured bubbles are inflated (and noisy)
compared with one core per rank. Compare configurations, not absolutes.

Prints one JSON object. A benchmark, not a test: nothing is asserted.

usage: bench/pipeline_bubble.py [--build build] [--steps 6]
           [--configs 2:1,4:1,2:2,4:2,2:1:zb-h1,4:1:zb-h1,2:2:zbv,4:2:zbv,
                      2:2:dualpipev,4:2:dualpipev] [--mult 1,2,4]
           [--layers 8]
           [--hidden 256] [--heads 4] [--seq 128] [--micro-batch 2]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
COMPUTE = re.compile(r"^([FBW]) c(\d+) mb(\d+)$")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def measured_bubble(trace_path):
    """Bubbles of the steps after the first, from a tessera-run --trace.

    Per rank and step: lo/hi = start of the first and end of the last
    compute phase slice, busy = their summed durations less the p2p waits
    inside them. "rank window": (hi - lo - busy) / busy, averaged over ranks;
    "global window": the same with lo/hi taken over all ranks of that step
    (the ranks' clocks are lined up by a barrier), which counts a stage's
    idle time before its first and after its last slice, as the analytic
    figure does. Median over steps 2..S (step 1 warms up).
    """
    ev = [e for e in json.load(open(trace_path))["traceEvents"] if e["ph"] == "X"]
    ranks = sorted({e["pid"] for e in ev})
    spans = {}  # step -> {rank: (lo, hi, busy)}
    for rank in ranks:
        mine = sorted((e for e in ev if e["pid"] == rank), key=lambda e: e["ts"])
        step_ends = [e["ts"] + e["dur"] for e in mine
                     if e["cat"] == "phase" and e["name"] == "step"]
        waits = [e for e in mine if e["cat"] == "p2p" and e["name"] == "p2p wait"]
        begin = float("-inf")
        for step, end in enumerate(step_ends, start=1):
            slices = [e for e in mine if e["cat"] == "phase" and COMPUTE.match(e["name"])
                      and begin <= e["ts"] < end]
            begin = end
            if not slices:
                continue
            busy = sum(e["dur"] for e in slices)
            for w in waits:
                if any(s["ts"] <= w["ts"] and w["ts"] + w["dur"] <= s["ts"] + s["dur"] + 1e-3
                       for s in slices):
                    busy -= w["dur"]
            spans.setdefault(step, {})[rank] = (
                min(e["ts"] for e in slices), max(e["ts"] + e["dur"] for e in slices), busy)
    full = {s: v for s, v in sorted(spans.items()) if len(v) == len(ranks)}
    later = {s: v for s, v in full.items() if s > 1} or full
    # Mean duration of each kind of phase (F, B, W) over the later steps,
    # p2p waits inside them excluded as above.
    kinds = {}
    for rank in ranks:
        mine = [e for e in ev if e["pid"] == rank]
        waits = [e for e in mine if e["cat"] == "p2p" and e["name"] == "p2p wait"]
        first_step_end = min((e["ts"] + e["dur"] for e in mine
                              if e["cat"] == "phase" and e["name"] == "step"),
                             default=float("-inf"))
        for e in mine:
            m = COMPUTE.match(e["name"]) if e["cat"] == "phase" else None
            if not m or e["ts"] < first_step_end:
                continue
            d = e["dur"] - sum(w["dur"] for w in waits
                               if e["ts"] <= w["ts"] and w["ts"] + w["dur"] <= e["ts"] + e["dur"] + 1e-3)
            kinds.setdefault(m.group(1), []).append(d)
    rank_window, global_window, last = [], [], None
    for step, per in later.items():
        lo = min(v[0] for v in per.values())
        hi = max(v[1] for v in per.values())
        rank_window.append(statistics.mean((h - l - b) / b for l, h, b in per.values()))
        global_window.append(statistics.mean((hi - lo - b) / b for _, _, b in per.values()))
        last = [round((h - l - b) / b, 4) for l, h, b in per.values()]
    return {
        "rank_window": statistics.median(rank_window),
        "global_window": statistics.median(global_window),
        "rank_window_per_step": [round(x, 4) for x in rank_window],
        "rank_window_per_rank_last_step": last,
        "phase_us": {k: round(statistics.mean(v), 1) for k, v in sorted(kinds.items())},
    }


def schedule_in_flight(order, vpp):
    """Peak microbatches held per chunk and in total, replaying the order
    (a microbatch is held until its backward, or its W when there are W's)."""
    held = [0] * vpp
    peak = [0] * vpp
    total = 0
    split = any(o["op"] == "W" for o in order)
    for o in order:
        c = o["chunk"]
        held[c] += 1 if o["op"] == "F" else -1 if o["op"] == ("W" if split else "B") else 0
        peak[c] = max(peak[c], held[c])
        total = max(total, sum(held))
    return peak, total


def in_flight_bound(p, v, r, m, schedule):
    if schedule == "zb-h1":
        return min(p, m)
    if schedule == "zbv":
        return min(2 * p, 2 * m)
    if schedule == "dualpipev":
        return 2 * p + 1
    if v == 1:
        return min(p - r, m)
    return min(2 * (p - r - 1) + (v - 1) * p + 1, v * m)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--configs", default="2:1,4:1,2:2,4:2,2:1:zb-h1,4:1:zb-h1,"
                    "2:2:zbv,4:2:zbv,2:2:dualpipev,4:2:dualpipev",
                    help="pp:vpp[:schedule] (schedule: zb-h1, zbv, dualpipev; "
                         "default 1f1b for vpp 1, else interleaved)")
    ap.add_argument("--mult", default="1,2,4",
                    help="microbatches per step as multiples of pp")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=2)
    args = ap.parse_args()
    bindir = os.path.join(os.path.abspath(args.build), "bin")
    tool = lambda name: os.path.join(bindir, name)
    configs = []
    for c in args.configs.split(","):
        parts = c.split(":")
        configs.append((int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else ""))
    mults = [int(x) for x in args.mult.split(",")]
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "austen")
        run([tool("tessera-preprocess"), "--input",
             os.path.join(REPO, "examples", "data", "northanger_abbey_vol1.txt"),
             "--output-prefix", data, "--append-eod"], stdout=subprocess.DEVNULL)
        model = os.path.join(tmp, "gpt.mlir")
        run([tool("tessera-gen"), "gpt", "--layers", str(args.layers), "--hidden",
             str(args.hidden), "--heads", str(args.heads), "--vocab", "257",
             "--seq", str(args.seq), "-o", model])
        for p, v, kind in configs:
            for k in mults:
                m = k * p
                if kind == "dualpipev" and m < 2 * p:
                    continue  # (DualPipeV needs 2 pp microbatches)
                name = (f"pp{p}" + (f"_vpp{v}" if v > 1 else "") +
                        (f"_{kind}" if kind else "") + f"_m{m}")
                flags = ["--pp", str(p), "--vpp", str(v),
                         *(["--schedule", kind] if kind else []),
                         "--micro-batch-size", str(args.micro_batch),
                         "--global-batch-size", str(m * args.micro_batch),
                         "--make-vocab-size-divisible-by", "128"]
                art = os.path.join(tmp, name + ".tsr")
                run([tool("tessera-compile"), model, *flags, "-o", art])
                # --emit reports go to stdout (they do not honour -o).
                sched = json.loads(run([tool("tessera-compile"), model, *flags,
                                        "--emit=schedule"], capture_output=True,
                                       text=True).stdout)
                memory = json.loads(run([tool("tessera-compile"), model, *flags,
                                         "--emit=memory"], capture_output=True,
                                        text=True).stdout)
                trace = os.path.join(tmp, name + ".json")
                metrics = os.path.join(tmp, name + ".jsonl")
                run([tool("tessera-run"), "-n", str(p), art, "--data", data,
                     "--steps", str(args.steps), "--trace", trace,
                     "--metrics", metrics], stdout=subprocess.DEVNULL, env=env)
                step_times = [json.loads(l)["step_time_s"] for l in open(metrics)][1:]
                bubble = measured_bubble(trace)
                order = {r["pp_rank"]: r["order"] for r in sched["ranks"]}
                stages = []
                for r in sorted(memory["ranks"], key=lambda r: r["pp_rank"]):
                    pr = r["pp_rank"]
                    peak, total = schedule_in_flight(order[pr], v)
                    stages.append({
                        "pp_rank": pr,
                        "saved_activations": r["saved_activations"],
                        "in_flight": r["in_flight"],
                        "schedule_in_flight_per_chunk": peak,
                        "schedule_in_flight_total": total,
                        "bound": in_flight_bound(p, v, pr, m, kind),
                    })
                if kind == "zb-h1":
                    t = bubble["phase_us"]
                    f, b, w = t.get("F", 0), t.get("B", 0), t.get("W", 0)
                    analytic = (p - 1) / (3 * m)
                    measured_costs = (p - 1) * (f + b - w) / (m * (f + b + w)) if f + b + w else None
                elif kind in ("zbv", "dualpipev"):
                    analytic = (p - 1) / (6 * m)
                    measured_costs = None
                else:
                    analytic = (p - 1) / (v * m)
                    measured_costs = None
                results.append({
                    "config": name, "pp": p, "vpp": v, "microbatches": m,
                    "schedule": sched["schedule"],
                    "bubble_measured": round(bubble["rank_window"], 4),
                    "bubble_measured_global_window": round(bubble["global_window"], 4),
                    "bubble_analytic": round(analytic, 4),
                    "bubble_analytic_measured_costs":
                        round(measured_costs, 4) if measured_costs is not None else None,
                    "phase_us_mean": bubble["phase_us"],
                    "bubble_compiler": sched["bubble_fraction"],
                    "bubble_measured_per_step": bubble["rank_window_per_step"],
                    "bubble_measured_per_rank_last_step": bubble["rank_window_per_rank_last_step"],
                    "step_time_s_median": statistics.median(step_times) if step_times else None,
                    "stages": stages,
                })
    json.dump({"benchmark": "pipeline_bubble", "cores": os.cpu_count(),
               "model": {"layers": args.layers, "hidden": args.hidden,
                         "heads": args.heads, "seq": args.seq,
                         "micro_batch": args.micro_batch, "padded_vocab": 384},
               "steps": args.steps,
               "threads": env["OPENBLAS_NUM_THREADS"],
               "load_avg_1min": [load_before, os.getloadavg()[0]],
               "wall_s": round(time.monotonic() - started, 1),
               "note": "ranks oversubscribe the cores when pp > cores: measured bubbles are inflated",
               "results": results}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
