#!/usr/bin/env python3
"""Compile time and peak memory of tessera-compile for GPT-3 shapes.

For each GPT-3 size (Brown et al. 2020, table 2.1; seq 2048, vocab 50257,
tied embeddings) at --tp 8, micro batch 1: the wall time and peak resident
memory of tessera-gen and, separately, of tessera-compile, plus the
per-rank arena the compiler planned, in fp32 and again under --bf16 (bf16
parameters and GEMMs, fp32 main parameters and Adam: Megatron's). Then tessera-compile at the 175B width
(hidden 12288, 96 heads) with a growing number of layers: a linear fit of
time against layers, the log-log growth exponent between successive points,
and the per-pass times of the same pipeline from `tessera-opt
--tessera-train-pipeline=... --mlir-timing`, each pass with its own growth
exponent, so a superlinear pass is named; and, at the middle and the
largest layer count, the peak memory each pass adds (tessera-opt running
the pipeline's first k passes, for every k) with its growth exponent.
Last, the 175B model in Megatron's 3-D layout (--tp 8 --pp 8 --vpp 2
--dp 16, under the interleaved schedule and under ZBV) at a growing
number of microbatches per step (24, 48, 96), with
the time's growth exponent between successive counts. And Llama 3.1 405B
(tessera-gen llama3.1-405b: 126 layers, hidden 16384, 128 heads in 8
query groups, SwiGLU 53248, vocab 128256, seq 8192) at tp 8 alone and at tp
8 x pp 14 (9 layers a stage) x dp 8 with 32, 64 and 128 microbatches, in
bf16 with sequence parallelism and the distributed optimizer. And the
175B width at 96 and 768 layers under each ZeRO stage (tp 8 x dp 8, bf16,
sequence parallelism; --data-parallel-sharding-strategy optim,
optim_grads, optim_grads_params, and ZeRO-3 with its prefetch), with the
time's growth exponent: the per-bucket passes must stay linear in the
buckets.

The compiler only works on shapes, so every size compiles in well under a
second; what this measures is how the passes scale with the op count.

Prints one JSON object. A benchmark, not a test: nothing is asserted.

usage: bench/compile_scaling.py [--build build] [--repeats 5]
           [--layers 12,24,48,96,192,384,768] [--tp 8] [--untied]
           [--pipeline-microbatches 24,48,96] [--llama-microbatches 32,64,128]
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

# name, layers, hidden, heads (paper), heads used. Heads must be a multiple
# of tp (8) and divide hidden: 125M's 12 heads become 16 (head dim 48);
# 1.3B's 24 heads do not divide 2048 (the paper's d_head 128 gives 16), we
# use 32 (head dim 64); 13B's hidden 5140 is the paper's typo for 5120.
GPT3 = [
    ("125M", 12, 768, 12, 16),
    ("350M", 24, 1024, 16, 16),
    ("760M", 24, 1536, 16, 16),
    ("1.3B", 24, 2048, 24, 32),
    ("2.7B", 32, 2560, 32, 32),
    ("6.7B", 32, 4096, 32, 32),
    ("13B", 40, 5120, 40, 40),
    ("175B", 96, 12288, 96, 96),
]
SEQ = 2048
VOCAB = 50257

TIMING_LINE = re.compile(r"^\s*([0-9.]+)\s+\(\s*[0-9.]+%\)\s+(\S.*?)\s*$")


def measure(cmd):
    """Runs cmd; returns (wall seconds, peak RSS in MiB) of that process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(err.decode(errors="replace"))
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return wall, usage.ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def repeated(cmd, repeats):
    runs = [measure(cmd) for _ in range(repeats)]
    return (statistics.median(r[0] for r in runs), max(r[1] for r in runs))


def gen_cmd(bindir, out, layers, hidden, heads, tied):
    cmd = [os.path.join(bindir, "tessera-gen"), "gpt", "--layers", str(layers),
           "--hidden", str(hidden), "--heads", str(heads), "--vocab", str(VOCAB),
           "--seq", str(SEQ), "-o", out]
    return cmd + (["--tie-embeddings"] if tied else [])


def compile_cmd(bindir, model, out, tp, extra=()):
    return [os.path.join(bindir, "tessera-compile"), model, "--tp", str(tp),
            "--micro-batch-size", "1", "--global-batch-size", "1", "-o",
            out] + list(extra)


def arena(bindir, artifact):
    """The per-rank arena and its persistent part from --print-summary."""
    text = subprocess.run([os.path.join(bindir, "tessera-run"), "--print-summary",
                           artifact], check=True, capture_output=True,
                          text=True).stdout
    m = re.search(r"arena (\d+) bytes \(persistent (\d+)\)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def params(layers, hidden, tied, padded_vocab):
    per_layer = 12 * hidden * hidden + 13 * hidden
    emb = padded_vocab * hidden + SEQ * hidden
    head = 0 if tied else padded_vocab * hidden
    return layers * per_layer + emb + 2 * hidden + head


def pass_times(bindir, model, tp, repeats):
    """Median per-pass wall seconds from tessera-opt --mlir-timing."""
    opt = os.path.join(bindir, "tessera-opt")
    cmd = [opt, model,
           f"--tessera-train-pipeline=tp={tp} micro-batch-size=1 global-batch-size=1",
           "--mlir-timing", "-o", os.devnull]
    samples = []
    for _ in range(repeats):
        err = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
        times = {}
        for line in err.splitlines():
            m = TIMING_LINE.match(line)
            if m and m.group(2) != "Total":
                times[m.group(2)] = float(m.group(1))
        samples.append(times)
    return {k: statistics.median(s.get(k, 0.0) for s in samples) for k in samples[0]}


PASSES = [
    ("AttachMeshPass", "--tessera-attach-mesh=tp={tp}"),
    ("SetBatchPass", "--tessera-set-batch=micro-batch-size=1 global-batch-size=1"),
    ("PadVocabPass", "--tessera-pad-vocab"),
    ("TPPartitionPass", "--tessera-tp-partition"),
    ("AutodiffPass", "--tessera-autodiff"),
    ("DPGradAllReducePass", "--tessera-dp-grad-allreduce"),
    ("OptimizerPass", "--tessera-optimizer"),
    ("LowerToRTPass", "--tessera-lower-to-rt"),
]


def rss_by_pass(bindir, model, tp):
    """Peak RSS of tessera-opt running the pipeline's first k passes, for
    every k: the increase at pass k is (an upper bound of) what that pass
    keeps, since MLIR never frees uniqued attributes and types."""
    opt = os.path.join(bindir, "tessera-opt")
    out, prev = {}, measure([opt, model, "-o", os.devnull])[1]
    out["(startup + parse: total RSS)"] = round(prev, 1)
    for k in range(1, len(PASSES) + 1):
        flags = [f.format(tp=tp) for _, f in PASSES[:k]]
        rss = measure([opt, model] + flags + ["-o", os.devnull])[1]
        out[PASSES[k - 1][0]] = round(rss - prev, 1)
        prev = rss
    return out


def linear_fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    icpt = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - icpt - slope * x) ** 2 for x, y in zip(xs, ys))
    return slope, icpt, 1 - ss_res / ss_tot if ss_tot else 1.0


def exponent(x0, y0, x1, y1):
    """Growth exponent k of y ~ x^k between two points (1 = linear)."""
    if y0 <= 0 or y1 <= 0 or x0 == x1:
        return None
    return round(math.log(y1 / y0) / math.log(x1 / x0), 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--repeats", type=int, default=5,
                    help="runs per measurement; the median time is reported")
    ap.add_argument("--layers", default="12,24,48,96,192,384,768",
                    help="layer counts of the 175B-width sweep")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pipeline-microbatches", default="24,48,96",
                    type=lambda v: [int(x) for x in v.split(",")],
                    help="microbatches per step of the 175B tp8 x pp8 (vpp 2) "
                         "x dp16 compiles (global batch 16 x each)")
    ap.add_argument("--llama-microbatches", default="32,64,128",
                    type=lambda s: [int(x) for x in s.split(",")],
                    help="microbatches per step of Llama 3.1 405B at tp 8 x "
                         "pp 14 x dp 8")
    ap.add_argument("--untied", action="store_true",
                    help="separate LM head (GPT-3 ties it to the embedding)")
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    tied = not args.untied
    sweep_layers = [int(x) for x in args.layers.split(",")]
    padded_vocab = -(-VOCAB // (128 * args.tp)) * 128 * args.tp

    models = []
    sweep = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, layers, hidden, paper_heads, heads in GPT3:
            model = os.path.join(tmp, f"gpt3-{name}.mlir")
            art = os.path.join(tmp, f"gpt3-{name}.tsr")
            gen_t, gen_m = repeated(gen_cmd(bindir, model, layers, hidden, heads, tied),
                                    args.repeats)
            comp_t, comp_m = repeated(compile_cmd(bindir, model, art, args.tp),
                                      args.repeats)
            arena_b, persistent_b = arena(bindir, art)
            # Megatron's precision (--bf16: bf16 parameters and GEMMs, fp32
            # main parameters and Adam): its own compile time and arena.
            art16 = os.path.join(tmp, f"gpt3-{name}-bf16.tsr")
            comp16_t, comp16_m = repeated(
                compile_cmd(bindir, model, art16, args.tp, ["--bf16"]),
                args.repeats)
            arena16_b, persistent16_b = arena(bindir, art16)
            models.append({
                "model": name, "layers": layers, "hidden": hidden,
                "heads": heads, "paper_heads": paper_heads,
                "params": params(layers, hidden, tied, padded_vocab),
                "gen_time_s": round(gen_t, 4), "gen_peak_rss_mib": round(gen_m, 1),
                "compile_time_s": round(comp_t, 4),
                "compile_peak_rss_mib": round(comp_m, 1),
                "mlir_bytes": os.path.getsize(model),
                "artifact_bytes": os.path.getsize(art),
                "rank_arena_gib": round(arena_b / 2**30, 2) if arena_b else None,
                "rank_persistent_gib": round(persistent_b / 2**30, 2) if persistent_b else None,
                "bf16_compile_time_s": round(comp16_t, 4),
                "bf16_compile_peak_rss_mib": round(comp16_m, 1),
                "bf16_rank_arena_gib": round(arena16_b / 2**30, 2) if arena16_b else None,
                "bf16_rank_persistent_gib":
                    round(persistent16_b / 2**30, 2) if persistent16_b else None,
            })

        have_opt = os.path.exists(os.path.join(bindir, "tessera-opt"))
        for layers in sweep_layers:
            model = os.path.join(tmp, f"gpt-175b-width-{layers}.mlir")
            art = os.path.join(tmp, f"gpt-175b-width-{layers}.tsr")
            subprocess.run(gen_cmd(bindir, model, layers, 12288, 96, tied), check=True)
            comp_t, comp_m = repeated(compile_cmd(bindir, model, art, args.tp),
                                      args.repeats)
            entry = {"layers": layers, "compile_time_s": round(comp_t, 4),
                     "compile_peak_rss_mib": round(comp_m, 1)}
            if have_opt:
                entry["pass_time_s"] = {k: round(v, 4) for k, v in
                                        pass_times(bindir, model, args.tp,
                                                   args.repeats).items()}
            sweep.append(entry)

    # Linear fit over the brief's range (<= 96 layers, GPT-3 175B's depth)
    # and over the whole sweep; a linear compiler fits both with one slope.
    def fit(points, key):
        xs = [p["layers"] for p in points]
        slope, icpt, r2 = linear_fit(xs, [p[key] for p in points])
        return {"slope_per_layer": round(slope, 6), "intercept": round(icpt, 4),
                "r2": round(r2, 4), "layers": xs}

    small = [p for p in sweep if p["layers"] <= 96]
    growth = []
    for a, b in zip(sweep, sweep[1:]):
        g = {"layers": [a["layers"], b["layers"]],
             "time_exponent": exponent(a["layers"], a["compile_time_s"],
                                       b["layers"], b["compile_time_s"]),
             "rss_exponent": exponent(a["layers"], a["compile_peak_rss_mib"],
                                      b["layers"], b["compile_peak_rss_mib"])}
        if "pass_time_s" in a:
            g["pass_time_exponent"] = {
                k: exponent(a["layers"], a["pass_time_s"][k], b["layers"],
                            b["pass_time_s"].get(k, 0.0))
                for k in a["pass_time_s"] if k not in ("Rest",)}
        growth.append(g)

    # Passes whose time grows faster than linearly over the sweep's upper
    # half (where fixed costs no longer hide the growth).
    superlinear = []
    if len(sweep) >= 2 and "pass_time_s" in sweep[0]:
        hi = sweep[-1]
        mid = sweep[(len(sweep) - 1) // 2]
        total = sum(hi["pass_time_s"].values())
        for k, v in sorted(hi["pass_time_s"].items(), key=lambda kv: -kv[1]):
            e = exponent(mid["layers"], mid["pass_time_s"].get(k, 0.0),
                         hi["layers"], v)
            if e is not None and e > 1.3 and v > 0.05 * total:
                superlinear.append({"pass": k, "exponent": e,
                                    "layers": [mid["layers"], hi["layers"]],
                                    "time_s": [mid["pass_time_s"][k], v],
                                    "share_at_max_layers": round(v / total, 3)})

    # Where the memory goes: peak RSS added by each pass at the middle and
    # the largest layer count of the sweep, and its growth exponent.
    memory = None
    if have_opt and len(sweep) >= 2:
        with tempfile.TemporaryDirectory() as tmp:
            mem = {}
            for layers in (sweep[(len(sweep) - 1) // 2]["layers"], sweep[-1]["layers"]):
                model = os.path.join(tmp, f"gpt-175b-width-{layers}.mlir")
                subprocess.run(gen_cmd(bindir, model, layers, 12288, 96, tied), check=True)
                mem[layers] = rss_by_pass(bindir, model, args.tp)
        (l0, m0), (l1, m1) = sorted(mem.items())
        memory = {"layers": [l0, l1], "added_rss_mib": {
            k: {"mib": [m0[k], m1[k]],
                "exponent": exponent(l0, m0[k], l1, m1[k]) if m0[k] > 1 and m1[k] > 1 else None}
            for k in m0}}

    # The 175B model in the full 3-D layout (tp 8, pp 8 with vpp 2, dp 16:
    # 1024 ranks) with a growing number of microbatches per step, default
    # flags (every verifier on), under the interleaved schedule and the
    # V-shaped ZBV (whose verification runs the non-blocking model): the
    # schedule and its verification must grow no worse than linearly in
    # microbatches.
    pipeline = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "gpt3-175B.mlir")
        subprocess.run(gen_cmd(bindir, model, 96, 12288, 96, tied), check=True)
        for schedule in ("interleaved", "zbv"):
            for micro in args.pipeline_microbatches:
                art = os.path.join(tmp, f"pp-{schedule}-{micro}.tsr")
                cmd = [os.path.join(bindir, "tessera-compile"), model, "--tp", "8",
                       "--pp", "8", "--vpp", "2", "--dp", "16",
                       "--schedule", schedule, "--micro-batch-size", "1",
                       "--global-batch-size", str(16 * micro), "-o", art]
                t, m = repeated(cmd, args.repeats)
                pipeline.append({"schedule": schedule, "microbatches": micro,
                                 "compile_time_s": round(t, 4),
                                 "compile_peak_rss_mib": round(m, 1)})
    for a, b in zip(pipeline, pipeline[1:]):
        if a["schedule"] == b["schedule"]:
            b["time_exponent_vs_previous"] = exponent(
                a["microbatches"], a["compile_time_s"], b["microbatches"],
                b["compile_time_s"])

    # Llama 3.1 405B (the preset's published shapes), bf16 with sequence
    # parallelism and the distributed optimizer: tp 8 alone, and tp 8 x
    # pp 14 x dp 8 at a growing number of microbatches.
    llama = {"model": "llama3.1-405b"}
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "llama3.1-405b.mlir")
        t, m = measure([os.path.join(bindir, "tessera-gen"), "llama3.1-405b",
                        "-o", model])
        llama["gen_time_s"] = round(t, 4)
        llama["gen_peak_rss_mib"] = round(m, 1)
        common = ["--bf16", "--sequence-parallel", "--use-distributed-optimizer",
                  "--micro-batch-size", "1"]
        art = os.path.join(tmp, "tp8.tsr")
        cmd = [os.path.join(bindir, "tessera-compile"), model, "--tp", "8",
               "--global-batch-size", "1", *common, "-o", art]
        t, m = repeated(cmd, args.repeats)
        total, persistent = arena(bindir, art)
        llama["tp8"] = {"compile_time_s": round(t, 4),
                        "compile_peak_rss_mib": round(m, 1),
                        "arena_gib": round(total / 2**30, 2) if total else None,
                        "persistent_gib": round(persistent / 2**30, 2)
                        if persistent else None}
        points = []
        for micro in args.llama_microbatches:
            art = os.path.join(tmp, f"3d-{micro}.tsr")
            cmd = [os.path.join(bindir, "tessera-compile"), model, "--tp", "8",
                   "--pp", "14", "--dp", "8",
                   "--global-batch-size", str(8 * micro), *common, "-o", art]
            t, m = repeated(cmd, args.repeats)
            points.append({"microbatches": micro, "compile_time_s": round(t, 4),
                           "compile_peak_rss_mib": round(m, 1)})
        for a, b in zip(points, points[1:]):
            b["time_exponent_vs_previous"] = exponent(
                a["microbatches"], a["compile_time_s"], b["microbatches"],
                b["compile_time_s"])
        llama["tp8_pp14_dp8"] = points

    # The ZeRO stages at the 175B width: every per-bucket rewrite (the
    # optimizer's shards, ZeRO-2's reductions, ZeRO-3's gathers) linear in
    # the buckets (96 -> 768 layers: 8x the buckets).
    zero = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (96, 768):
            model = os.path.join(tmp, f"gpt-{layers}.mlir")
            subprocess.run(gen_cmd(bindir, model, layers, 12288, 96, tied),
                           check=True)
            for name, flags in (
                    ("optim", ["--data-parallel-sharding-strategy", "optim"]),
                    ("optim_grads", ["--data-parallel-sharding-strategy", "optim_grads"]),
                    ("optim_grads_params",
                     ["--data-parallel-sharding-strategy", "optim_grads_params"]),
                    ("optim_grads_params_prefetch",
                     ["--data-parallel-sharding-strategy", "optim_grads_params",
                      "--overlap-grad-reduce", "--overlap-param-gather"])):
                art = os.path.join(tmp, f"{name}-{layers}.tsr")
                cmd = [os.path.join(bindir, "tessera-compile"), model, "--tp", "8",
                       "--dp", "8", "--micro-batch-size", "1",
                       "--global-batch-size", "16", "--bf16",
                       "--sequence-parallel", *flags, "-o", art]
                t, m = repeated(cmd, args.repeats)
                zero.append({"strategy": name, "layers": layers,
                             "compile_time_s": round(t, 4),
                             "compile_peak_rss_mib": round(m, 1)})
    for a in zero:
        for b in zero:
            if b["strategy"] == a["strategy"] and (a["layers"], b["layers"]) == (96, 768):
                b["time_exponent_vs_96"] = exponent(
                    a["layers"], a["compile_time_s"], b["layers"], b["compile_time_s"])

    result = {
        "benchmark": "compile_scaling",
        "tp": args.tp, "micro_batch": 1, "seq": SEQ, "vocab": VOCAB,
        "padded_vocab": padded_vocab, "tied_embeddings": tied,
        "repeats": args.repeats,
        "gpt3": models,
        "layer_sweep": {
            "hidden": 12288, "heads": 96, "points": sweep,
            "linear_fit_time_le96": fit(small, "compile_time_s") if len(small) >= 2 else None,
            "linear_fit_time_all": fit(sweep, "compile_time_s") if len(sweep) >= 2 else None,
            "growth": growth,
            "superlinear_passes": superlinear,
            "rss_by_pass": memory,
        },
        "pipeline_175b_tp8_pp8_vpp2_dp16": pipeline,
        "llama3_1_405b": llama,
        "zero_stages_175b_width_tp8_dp8": zero,
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
