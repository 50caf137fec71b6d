#!/usr/bin/env python3
"""Per-rank model-state memory against Megatron's bytes-per-parameter table.

For fp32 parameters and for bf16 mixed precision (--bf16, f32 gradients;
and --grad-reduce-in-bf16), without and with the distributed optimizer
(ZeRO-1), with the gradients sharded too (ZeRO-2,
--data-parallel-sharding-strategy optim_grads) and with the parameters
sharded too (ZeRO-3, optim_grads_params), at dp = 1, 2, 4 and 8, compiles
a GPT (tessera-gen gpt, default 4 layers, hidden
256) and reads tessera-compile --emit=memory: the bytes of parameters,
gradients, main parameters and optimizer state on rank 0, divided by the
number of parameters. Next to it, the figure of the bytes-per-parameter
table in Megatron's distributed-optimizer guide
(docs/api-guide/dist_optimizer.md), d the dp size:
  fp32 params, fp32 grads:  16, or 8 + 8/d with the distributed optimizer
  bf16 params, fp32 grads:  18, or 6 + 12/d
  bf16 params, bf16 grads:  16, or 4 + 12/d
and for ZeRO-2 the ZeRO paper's (Rajbhandari et al. 2020, Figure 1) with
the gradients over d too: fp32 4 + 12/d, bf16 2 + 16/d (fp32 gradients),
bf16 gradients 2 + 14/d (the paper's 2 + (2 + 12)/d), and for ZeRO-3
everything over d: fp32 16/d, bf16 18/d, bf16 gradients 16/d (the paper's
(2 + 2 + 12)/d)
(the row of bf16 gradients counted the same way, 2 + 2 + 4 fp32 main params + 8 Adam:
Megatron's table has no bf16-gradient row; its fp16-gradient row, 20 or
4 + 16/d, also counts fp32 main gradients, which Tessera does not keep).
The measured figure is slightly above it with the distributed optimizer:
the buckets are padded to lcm(d, 128) and every parameter starts at a
multiple of 64 elements. Also printed: the arena the runtime allocates
(tessera-run --print-summary, which equals the plan's total) and the peak of
transient activations from the plan (under ZeRO-3 it holds the gathered
parameter buckets too), and, for --bf16 with f32 activations
(--activations-dtype f32, precision "bf16-f32act": the same model state),
what bf16 activations, --bf16's default, save. A benchmark, not a test: nothing is
asserted (test/Tools/emit-memory.test checks the table on the MLP).

usage: bench/dp_memory.py [--build build] [--hidden 256] [--layers 4]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def megatron_table(precision, d, distributed, zero2=False, zero3=False):
    # f32 activations change no model state.
    precision = "bf16" if precision == "bf16-f32act" else precision
    if zero3:
        return {"fp32": 16 / d, "bf16": 18 / d, "bf16-grads": 16 / d}[precision]
    if zero2:
        return {"fp32": 4 + 12 / d, "bf16": 2 + 16 / d, "bf16-grads": 2 + 14 / d}[precision]
    if precision == "fp32":
        return 8 + 8 / d if distributed else 16
    if precision == "bf16":
        return 6 + 12 / d if distributed else 18
    return 4 + 12 / d if distributed else 16  # bf16 grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    # A bucket of ~1/13 of this GPT (Megatron's default, max(40M, 1M x dp)
    # elements, is many buckets of a billion-parameter model but one of
    # this one; ZeRO-2 holds one or two buckets' whole gradients at a time).
    ap.add_argument("--bucket-size", type=int, default=250000)
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "gpt.mlir")
        subprocess.run([os.path.join(bindir, "tessera-gen"), "gpt", "--layers", str(args.layers),
                        "--hidden", str(args.hidden), "--heads", "4", "--vocab", "257",
                        "--seq", str(args.seq), "-o", model], check=True)
        numel = None
        for precision, flags in (("fp32", []), ("bf16", ["--bf16"]),
                                 ("bf16-f32act", ["--bf16", "--activations-dtype", "f32"]),
                                 ("bf16-grads", ["--bf16", "--grad-reduce-in-bf16"])):
            for strategy in ("no_shard", "optim", "optim_grads", "optim_grads_params"):
                distributed = strategy != "no_shard"
                for d in (1, 2, 4, 8):
                    common = [model, *flags, "--dp", str(d), "--micro-batch-size", "2",
                              "--global-batch-size", str(2 * d),
                              "--bucket-size", str(args.bucket_size),
                              "--data-parallel-sharding-strategy", strategy]
                    mem = json.loads(subprocess.run(
                        [os.path.join(bindir, "tessera-compile"), *common, "--emit=memory"],
                        check=True, capture_output=True, text=True).stdout)["ranks"][0]
                    if numel is None:
                        buckets = json.loads(subprocess.run(
                            [os.path.join(bindir, "tessera-compile"), *common, "--emit=buckets"],
                            check=True, capture_output=True, text=True).stdout)
                        numel = sum(b["numel_unpadded"] for b in buckets["buffers"])
                    art = os.path.join(tmp, "m.tsr")
                    subprocess.run([os.path.join(bindir, "tessera-compile"), *common, "-o", art],
                                   check=True)
                    summary = subprocess.run([os.path.join(bindir, "tessera-run"),
                                              "--print-summary", art],
                                             check=True, capture_output=True, text=True).stdout
                    arena = int(re.search(r"arena (\d+) bytes", summary).group(1))
                    state = (mem["params"] + mem["grads"] + mem["main_params"]
                             + mem["optimizer_state"])
                    results.append({
                        "precision": precision, "strategy": strategy,
                        "distributed_optimizer": distributed,
                        "dp": d, "params": mem["params"], "grads": mem["grads"],
                        "main_params": mem["main_params"],
                        "optimizer_state": mem["optimizer_state"],
                        "bytes_per_param": round(state / numel, 4),
                        "megatron_bytes_per_param": round(megatron_table(
                            precision, d, distributed, strategy == "optim_grads",
                            strategy == "optim_grads_params"), 4),
                        "peak_activations": mem["peak_activations"],
                        "planned_total": mem["total"], "runtime_arena": arena,
                    })
    json.dump({"benchmark": "dp_memory", "hidden": args.hidden, "layers": args.layers,
               "seq": args.seq, "bucket_size": args.bucket_size, "num_params": numel, "results": results},
              sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
