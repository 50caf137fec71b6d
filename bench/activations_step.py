#!/usr/bin/env python3
"""bf16 activations on one CPU rank: step time, Cast kernels and memory.

For a GPT (Megatron's GPTModel as tessera-gen emits it, GPT-2's vocabulary
of 50257) and a Llama-shaped model (RMSNorm, SwiGLU, RoPE, grouped-query
attention, no biases, a 32000 vocabulary), each compiled three ways:

  bf16-f32act    tessera-compile --bf16 --activations-dtype f32 (bf16
                 parameters and GEMMs, f32 activations between the ops);
  bf16-casts     --bf16 --fuse-casts=false (bf16 activations made of Cast
                 kernels around f32 kernels);
  bf16           --bf16 (its default: bf16 activations, the casts folded
                 into the kernels that load and store 16 bits themselves);

it prints one JSON object with, per model and form: the median step time
over --repeats runs of --steps timed steps (after --warmup), the Cast
kernels in a microbatch of the artifact's program, and the compiler's
planned peak of activations (--emit=memory). A benchmark, not a test:
nothing is asserted. The folded and the cast forms train bit-identically
(test/E2E/bf16-activations.test); this measures what the fold saves.

usage: bench/activations_step.py [--build build] [--layers 4] [--hidden 256]
                                 [--seq 256] [--micro-batch 4]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

FORMS = {
    "bf16-f32act": ["--bf16", "--activations-dtype", "f32"],
    "bf16-casts": ["--bf16", "--fuse-casts=false"],
    "bf16": ["--bf16"],
}


def models(args):
    common = ["--layers", str(args.layers), "--hidden", str(args.hidden),
              "--seq", str(args.seq)]
    return {
        "gpt": common + ["--heads", str(args.heads), "--vocab", "50257"],
        "llama": common + ["--heads", str(args.heads),
                           "--group-query-attention", "--num-query-groups",
                           str(max(1, args.heads // 4)), "--vocab", "32000",
                           "--normalization", "RMSNorm",
                           "--disable-bias-linear", "--swiglu",
                           "--position-embedding-type", "rope"],
    }


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def microbatch_casts(mlir):
    """The rt.cast ops of the microbatch function of an rt-level module."""
    body = re.search(r"func\.func @microbatch\(.*?\n  }\n", mlir, re.S)
    return len(re.findall(r"^\s*rt\.cast ", body.group(0), re.M)) if body else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    tool = lambda name: os.path.join(bindir, name)
    out = {"layers": args.layers, "hidden": args.hidden, "seq": args.seq,
           "micro_batch": args.micro_batch, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "austen")
        run([tool("tessera-preprocess"), "--input",
             os.path.join(REPO, "examples", "data", "northanger_abbey_vol1.txt"),
             "--output-prefix", data, "--append-eod"])
        for name, gen in models(args).items():
            model = os.path.join(tmp, name + ".mlir")
            run([tool("tessera-gen"), "gpt", *gen, "-o", model])
            forms = {}
            for form, flags in FORMS.items():
                base = [tool("tessera-compile"), model, *flags,
                        "--micro-batch-size", str(args.micro_batch)]
                art = os.path.join(tmp, f"{name}-{form}.tsr")
                run(base + ["-o", art])
                mem = json.loads(run(base + ["--emit=memory"]).stdout)
                casts = microbatch_casts(run(base + ["--emit=mlir"]).stdout)
                medians = []
                for r in range(args.repeats):
                    metrics = os.path.join(tmp, f"{name}-{form}-{r}.jsonl")
                    run([tool("tessera-run"), "-n", "1", art, "--data", data,
                         "--steps", str(args.warmup + args.steps),
                         "--metrics", metrics])
                    with open(metrics) as f:
                        steps = [json.loads(l) for l in f if l.strip()]
                    medians.append(statistics.median(
                        s["step_time_s"] for s in steps[args.warmup:]))
                forms[form] = {
                    "step_s": round(statistics.median(medians), 5),
                    "step_s_runs": [round(m, 5) for m in medians],
                    "microbatch_casts": casts,
                    "peak_activations_mb": round(
                        mem["ranks"][0]["peak_activations"] / 1e6, 1),
                }
            base = forms["bf16-f32act"]["step_s"]
            for form in ("bf16-casts", "bf16"):
                forms[form]["vs_f32act"] = round(forms[form]["step_s"] / base,
                                                 3)
            out["models"][name] = forms
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
