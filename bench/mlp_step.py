#!/usr/bin/env python3
"""One MLP training step at several sizes on one CPU rank.

Prints one JSON object: for each size the median step time over the timed
steps, the time spent in GEMM kernels (tessera-run --profile) and their
ratio, and the same with the fusion passes off ("unfused", and
fusion_speedup = unfused step / fused step). A benchmark, not a test:
nothing is asserted.

usage: bench/mlp_step.py [--build build] [--steps 8] [--batch 64]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SIZES = [(256, 1024, 16), (512, 2048, 16), (1024, 4096, 16)]
# The pipeline flags that turn every fusion pass off (the "before").
FUSIONS_OFF = ["--fuse-bias-gelu=false", "--fuse-cross-entropy=false",
               "--fuse-add-layer-norm=false", "--fuse-bucket-optimizer=false"]

MODEL = """func.func @mlp(
    %x: tensor<?x{d}xf32> {{nn.input = "features"}},
    %t: tensor<?xi32> {{nn.input = "labels"}},
    %w1: tensor<{h}x{d}xf32> {{nn.param = "fc1.weight"}},
    %b1: tensor<{h}xf32> {{nn.param = "fc1.bias"}},
    %w2: tensor<{d}x{h}xf32> {{nn.param = "fc2.weight"}},
    %b2: tensor<{d}xf32> {{nn.param = "fc2.bias"}},
    %wh: tensor<{c}x{d}xf32> {{nn.param = "head.weight"}}) -> tensor<f32> {{
  %h = nn.linear %x, %w1, %b1 : (tensor<?x{d}xf32>, tensor<{h}x{d}xf32>, tensor<{h}xf32>) -> tensor<?x{h}xf32>
  %a = nn.gelu %h : tensor<?x{h}xf32>
  %y = nn.linear %a, %w2, %b2 : (tensor<?x{h}xf32>, tensor<{d}x{h}xf32>, tensor<{d}xf32>) -> tensor<?x{d}xf32>
  %z = nn.linear %y, %wh : (tensor<?x{d}xf32>, tensor<{c}x{d}xf32>) -> tensor<?x{c}xf32>
  %l = nn.softmax_cross_entropy %z, %t : (tensor<?x{c}xf32>, tensor<?xi32>) -> tensor<?xf32>
  %m = nn.mean %l : (tensor<?xf32>) -> tensor<f32>
  return %m : tensor<f32>
}}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for d, h, c in SIZES:
            model = os.path.join(tmp, f"mlp{d}.mlir")
            with open(model, "w") as f:
                f.write(MODEL.format(d=d, h=h, c=c))
            entry = {"features": d, "hidden": h, "classes": c, "batch": args.batch}
            for key, flags in (("fused", []), ("unfused", FUSIONS_OFF)):
                art = os.path.join(tmp, f"mlp{d}-{key}.tsr")
                subprocess.run([os.path.join(bindir, "tessera-compile"), model,
                                "--micro-batch-size", str(args.batch), "-o", art]
                               + flags, check=True)
                metrics = os.path.join(tmp, f"mlp{d}-{key}.jsonl")
                subprocess.run([os.path.join(bindir, "tessera-run"), "-n", "1", art,
                                "--steps", str(args.steps + 1), "--profile",
                                "--metrics", metrics], check=True,
                               stdout=subprocess.DEVNULL)
                lines = [json.loads(l) for l in open(metrics)][1:]  # drop warm-up
                step = statistics.median(l["step_time_s"] for l in lines)
                gemm = statistics.median(l["kernel_time_s"].get("Gemm", 0.0)
                                         for l in lines)
                kernels = statistics.median(sum(l["kernel_time_s"].values())
                                            for l in lines)
                flops = 6 * args.batch * (d * h * 2 + d * c)  # fwd + bwd of the linears
                row = {
                    "step_time_s": step, "gemm_time_s": gemm,
                    "gemm_ratio": gemm / step if step else None,
                    "kernel_time_s": kernels,
                    "gemm_gflops": flops / gemm / 1e9 if gemm else None,
                }
                if key == "fused":
                    entry.update(row)
                else:
                    entry["unfused"] = row
                    entry["fusion_speedup"] = step / entry["step_time_s"]
            results.append(entry)
    json.dump({"benchmark": "mlp_step", "ranks": 1,
               "threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
               "results": results}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
