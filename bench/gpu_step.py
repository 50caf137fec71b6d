#!/usr/bin/env python3
"""GPT training step on one GPU with the cuda backend: tokens/s, MFU, GEMM share.

For each size and precision (fp32, and --bf16: bf16 parameters and GEMMs
on tensor cores with f32 accumulation, Megatron's), tessera-gen gpt ->
tessera-compile -> tessera-run -n 1 --backend cuda on the Northanger Abbey
tokens (tessera-preprocess): W warm-up steps, then the median step time over S timed steps gives
tokens/s (micro batch x seq / step) and TFLOP/s from the compiler's FLOP
count of a step (the artifact's flops_per_step, which tessera-run reports
as tflops_per_rank). MFU is that against H100's dense bf16 peak of
989 TFLOP/s (the figure Megatron-LM's reports use; an fp32 run without
TF32 is bounded by the far lower fp32 peak, which this also reports). A
second run with --profile gives the per-opcode share of the step (profiling
synchronises after every kernel) and the GEMM share (Gemm, Attention and
AttentionGrad, and the experts' GroupedLinear(Grad), whose work is
cuBLASLt calls).

Without a GPU it prints {"skipped": "<why>"} and exits 0: a benchmark, not
a test. Prints one JSON object.

usage: bench/gpu_step.py [--build build] [--steps 10] [--warmup 3]
           [--sizes 1024:16:4,2048:16:4] [--seq 1024] [--micro-batch 8]
           [--peak-tflops 989] [--precisions fp32,bf16]
           [--prepare DIR | --artifacts DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

VOCAB = 257
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GEMM_OPS = ("Gemm", "Attention", "AttentionGrad", "GroupedLinear",
            "GroupedLinearGrad")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sizes", default="1024:16:4,2048:16:4",
                    help="hidden:heads:layers, comma-separated")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="dense bf16 peak of the GPU (H100 SXM: 989)")
    ap.add_argument("--precisions", default="fp32,bf16",
                    help="fp32 and/or bf16 (tessera-compile --bf16)")
    ap.add_argument("--text", default=os.path.join(REPO, "examples", "data",
                                                   "northanger_abbey_vol1.txt"))
    ap.add_argument("--prepare", metavar="DIR",
                    help="only compile the artifacts and the data into DIR "
                         "(for a GPU machine without the compiler: "
                         "scripts/gpu-kit.sh)")
    ap.add_argument("--artifacts", metavar="DIR",
                    help="use DIR's artifacts and data (from --prepare): "
                         "needs only tessera-run")
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    tool = lambda name: os.path.join(bindir, name)
    configs = []
    for size in args.sizes.split(","):
        for precision in args.precisions.split(","):
            if precision not in ("fp32", "bf16"):
                raise SystemExit(f"--precisions: unknown precision '{precision}'")
            hidden, heads, layers = (int(x) for x in size.split(":"))
            configs.append((hidden, heads, layers, precision))
    artifact = lambda d, hidden, precision: os.path.join(
        d, f"gpt{hidden}-{precision}.tsr")

    def prepare(d):
        os.makedirs(d, exist_ok=True)
        run([tool("tessera-preprocess"), "--input", args.text, "--output-prefix",
             os.path.join(d, "austen"), "--append-eod"])
        for hidden, heads, layers, precision in configs:
            mlir = os.path.join(d, f"gpt{hidden}.mlir")
            run([tool("tessera-gen"), "gpt", "--layers", str(layers), "--hidden",
                 str(hidden), "--heads", str(heads), "--vocab", str(VOCAB),
                 "--seq", str(args.seq), "-o", mlir])
            run([tool("tessera-compile"), mlir, "--micro-batch-size",
                 str(args.micro_batch), "--global-batch-size",
                 str(args.micro_batch), "-o", artifact(d, hidden, precision)] +
                (["--bf16"] if precision == "bf16" else []))

    if args.prepare:
        prepare(args.prepare)
        return
    result = {"benchmark": "gpu_step", "seq": args.seq,
              "micro_batch": args.micro_batch, "peak_tflops": args.peak_tflops,
              "configs": []}
    with tempfile.TemporaryDirectory() as tmp:
        d = args.artifacts or tmp
        if not args.artifacts:
            prepare(d)
        data = os.path.join(d, "austen")
        for hidden, heads, layers, precision in configs:
            art = artifact(d, hidden, precision)
            entry = {"hidden": hidden, "heads": heads, "layers": layers,
                     "precision": precision}
            steps = args.warmup + args.steps
            metrics = os.path.join(tmp, f"m{hidden}-{precision}.jsonl")
            proc = subprocess.run(
                [tool("tessera-run"), "-n", "1", art, "--backend", "cuda",
                 "--data", data, "--steps", str(steps), "--metrics", metrics],
                text=True, capture_output=True)
            if proc.returncode != 0:
                if "no GPU to run on" in proc.stderr:
                    print(json.dumps({"benchmark": "gpu_step",
                                      "skipped": proc.stderr.strip()}))
                    return
                raise SystemExit(proc.stderr)
            lines = [json.loads(l) for l in open(metrics)][args.warmup:]
            step = statistics.median(l["step_time_s"] for l in lines)
            tflops = statistics.median(l["tflops_per_rank"] for l in lines)
            entry.update({
                "step_s": round(step, 5),
                "tokens_per_s": round(args.micro_batch * args.seq / step, 1),
                "tflops": round(tflops, 2),
                "mfu_vs_bf16_peak": round(tflops / args.peak_tflops, 4),
                "final_loss": lines[-1]["loss"],
            })
            pmetrics = os.path.join(tmp, f"p{hidden}-{precision}.jsonl")
            run([tool("tessera-run"), "-n", "1", art, "--backend", "cuda",
                 "--data", data, "--steps", str(args.warmup + 2), "--metrics",
                 pmetrics, "--profile"])
            last = [json.loads(l) for l in open(pmetrics)][-1]
            kernels = last.get("kernel_time_s", {})
            total = sum(kernels.values()) or 1.0
            entry["gemm_share"] = round(
                sum(v for k, v in kernels.items() if k in GEMM_OPS) / total, 4)
            entry["op_share"] = {k: round(v / total, 4) for k, v in
                                 sorted(kernels.items(), key=lambda kv: -kv[1])[:8]}
            result["configs"].append(entry)
    print(json.dumps(result, indent=1))

if __name__ == "__main__":
    main()
