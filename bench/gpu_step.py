#!/usr/bin/env python3
"""GPT training step on one GPU, Tessera's cuda backend beside PyTorch's.

For each size and precision (bf16: bf16 parameters and GEMMs on tensor
cores with f32 accumulation and bf16 activations, Megatron's, --bf16's
defaults; bf16-casts: the same with the Cast kernels instead of the casts
folded into the activation kernels (--fuse-casts=false); bf16-f32act: f32
activations (--activations-dtype f32), against both of which PyTorch runs
as in bf16; fp16: bf16's parameters and GEMMs in f16 with a
dynamic loss scale starting at 65536, which the data here never overflow,
so every timed step updates; fp32: f32 GEMMs, TF32 off),
tessera-gen gpt -> tessera-compile -> tessera-run -n 1 --backend cuda on the
Northanger Abbey tokens (tessera-preprocess): W warm-up steps, then the
median step time over S timed steps gives tokens/s (micro batch x seq /
step) and TFLOP/s from the compiler's FLOP count of a step (the artifact's
flops_per_step, which tessera-run reports as tflops_per_rank). MFU is that
against the GPU's dense bf16 peak (--peak-tflops: 989 for the H100 SXM, the
figure Megatron-LM's reports use, also the H200's). A second run with
--profile gives the per-opcode share of the step (profiling synchronises
after every kernel) and the GEMM share (Gemm, Attention and AttentionGrad,
and the experts' GroupedLinear(Grad), whose work is cuBLASLt calls).

The same GPT (Megatron's GPTModel as tessera-gen emits it: learned
positions, pre-LayerNorm blocks with fused QKV, GELU MLP of 4 x hidden,
biases, an untied output layer over the vocabulary padded to 128) is also
trained in PyTorch on the same GPU, same shapes and optimizer (AdamW with
Megatron's no-decay group, gradients clipped to norm 1.0, as tessera-compile
defaults to): eager, and
torch.compile'd where that works (--torch-compile), with bf16 autocast for
bf16, fp16 autocast and torch.amp.GradScaler(init_scale=65536) for fp16,
and TF32 off for fp32. Its attention is
torch.nn.functional.scaled_dot_product_attention (flash or memory-efficient
kernels), what a PyTorch user runs. Its TFLOP/s use the same FLOP count
as Tessera's, so the two MFUs compare directly; tessera_vs_torch is the
ratio of tokens/s (Tessera over PyTorch eager, and over compiled).

Every configuration, and every run in it, records its own result: a run
that fails or outlasts --run-limit gives {"error": ...} with the end of its
output, and the next one runs. One JSON line per configuration is printed
(and flushed) as it finishes, then a summary line. --budget S stops
starting new runs after S seconds (each configuration then says what it
did not run; the summary counts them as not_run, not as errors).
Exits 1 if any run failed. Without a GPU it prints {"benchmark": "gpu_step",
"skipped": "<why>"} and exits 0: a benchmark, not a test.

usage: bench/gpu_step.py [--build build] [--steps 10] [--warmup 3]
           [--sizes 1024:16:4,2048:16:4] [--seq 1024] [--micro-batch 8]
           [--peak-tflops 989] [--precisions bf16,fp32]
           [--torch / --no-torch] [--torch-compile / --no-torch-compile]
           [--run-limit 150] [--budget SECONDS]
           [--prepare DIR | --artifacts DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VOCAB = 257
PADDED_VOCAB = 384  # tessera-compile pads the vocabulary to a multiple of 128
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GEMM_OPS = ("Gemm", "Attention", "AttentionGrad", "GroupedLinear",
            "GroupedLinearGrad")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def tail(text, lines=12):
    return "\n".join(text.strip().splitlines()[-lines:])


def bounded(cmd, limit):
    """Runs cmd with stdout and stderr together; (exit status, output).
    A run past `limit` seconds is killed and reported as exit 124."""
    try:
        proc = subprocess.run(cmd, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=limit)
        return proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return 124, out + f"\n(killed after {limit} s)"


def megatron_flops(batch, seq, layers, hidden, vocab):
    """Megatron-LM's FLOPs of one training step without recompute
    (Narayanan et al. 2021, with 3 passes instead of 4)."""
    return 72 * batch * seq * layers * hidden ** 2 * (
        1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


# ------------------------------------------------------------- PyTorch --

def torch_step(spec, seq, micro_batch, warmup, steps, compile_too):
    """Trains the GPT of spec (hidden:heads:layers:precision) in PyTorch on
    random tokens; prints one JSON object."""
    hidden, heads, layers, precision = spec.split(":")
    hidden, heads, layers = int(hidden), int(heads), int(layers)
    result = {"torch": None}
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - report whatever stops the import
        print(json.dumps({"error": f"import torch: {e}"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False"}))
        return
    result["torch"] = torch.__version__
    result["device"] = torch.cuda.get_device_name(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)

        def forward(self, x):  # x: [b, s, h]
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, -1).unbind(2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, hidden))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(PADDED_VOCAB, hidden)
            self.pos = nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(hidden, eps=1e-5)
            self.out = nn.Linear(hidden, PADDED_VOCAB, bias=False)

        def forward(self, tokens, labels):
            x = self.emb(tokens) + self.pos.weight[: tokens.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            logits = self.out(self.ln(x)).float()
            return F.cross_entropy(logits.view(-1, PADDED_VOCAB),
                                   labels.view(-1))

    def measure(compiled):
        torch.manual_seed(1234)
        model = GPT().cuda()
        # tessera-compile's default optimizer: AdamW, no decay on biases
        # and norms, gradients clipped to norm 1.0.
        named = list(model.named_parameters())
        opt = torch.optim.AdamW(
            [{"params": [p for n, p in named if p.ndim > 1 and not n.endswith("bias")],
              "weight_decay": 0.01},
             {"params": [p for n, p in named if not (p.ndim > 1 and not n.endswith("bias"))],
              "weight_decay": 0.0}], lr=1e-4)
        fn = torch.compile(model) if compiled else model
        scaler = torch.amp.GradScaler("cuda", init_scale=65536.0,
                                      enabled=precision == "fp16")
        gen = torch.Generator(device="cuda").manual_seed(1)
        tokens = torch.randint(0, VOCAB, (micro_batch, seq + 1), device="cuda",
                               generator=gen)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        times = []
        t_first = time.time()
        for i in range(warmup + steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.float16
                                if precision == "fp16" else torch.bfloat16,
                                enabled=precision != "fp32"):
                loss = fn(x, y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            if i == 0:
                first = time.time() - t_first
        step = statistics.median(times[warmup:])
        return {"step_s": round(step, 5),
                "tokens_per_s": round(micro_batch * seq / step, 1),
                "first_step_s": round(first, 2),
                "final_loss": round(float(loss), 4),
                "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}

    for name, compiled in (("eager", False), ("compiled", True)):
        if compiled and not compile_too:
            continue
        try:
            result[name] = measure(compiled)
        except Exception as e:  # noqa: BLE001 - one mode's failure is a result
            result[name] = {"error": f"{type(e).__name__}: {tail(str(e), 6)}"}
        # Print what is known after each mode: a kill during torch.compile
        # still leaves the eager figures on the last line.
        print(json.dumps(result), flush=True)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ------------------------------------------------------------- Tessera --

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
                    help="dense bf16 peak of the GPU (H100 SXM, H200: 989)")
    ap.add_argument("--precisions", default="bf16,fp32",
                    help="bf16 (tessera-compile --bf16), bf16-casts (the same "
                         "with --fuse-casts=false), bf16-f32act (--bf16 "
                         "--activations-dtype f32), fp16 (--fp16) and/or fp32")
    ap.add_argument("--torch", action=argparse.BooleanOptionalAction,
                    default=True, help="also train the GPT in PyTorch")
    ap.add_argument("--torch-compile", action=argparse.BooleanOptionalAction,
                    default=True, help="also with torch.compile")
    ap.add_argument("--run-limit", type=float, default=150,
                    help="seconds one run may take before it is killed")
    ap.add_argument("--budget", type=float, default=0,
                    help="start no run after this many seconds (0: no limit)")
    ap.add_argument("--text", default=os.path.join(REPO, "examples", "data",
                                                   "northanger_abbey_vol1.txt"))
    ap.add_argument("--prepare", metavar="DIR",
                    help="only compile the artifacts and the data into DIR "
                         "(for a GPU machine without the compiler: "
                         "scripts/gpu-kit.sh)")
    ap.add_argument("--artifacts", metavar="DIR",
                    help="use DIR's artifacts and data (from --prepare): "
                         "needs only tessera-run")
    ap.add_argument("--torch-config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_config:
        torch_step(args.torch_config, args.seq, args.micro_batch, args.warmup,
                   args.steps, args.torch_compile)
        return
    bindir = os.path.join(args.build, "bin")
    tool = lambda name: os.path.join(bindir, name)
    configs = []
    for size in args.sizes.split(","):
        for precision in args.precisions.split(","):
            if precision not in ("fp32", "bf16", "bf16-casts", "bf16-f32act",
                                 "fp16"):
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
            flags = {"fp32": [], "bf16": ["--bf16"],
                     "bf16-casts": ["--bf16", "--fuse-casts=false"],
                     "bf16-f32act": ["--bf16", "--activations-dtype", "f32"],
                     "fp16": ["--fp16", "--initial-loss-scale", "65536"]}[precision]
            compile_cmd = [tool("tessera-compile"), mlir, "--micro-batch-size",
                           str(args.micro_batch), "--global-batch-size",
                           str(args.micro_batch)] + flags
            run(compile_cmd + ["-o", artifact(d, hidden, precision)])
            # The memory plan of the same compile (--emit=memory), reported
            # with the run: the GPU's arena is laid out by it.
            with open(artifact(d, hidden, precision) + ".memory.json", "w") as f:
                subprocess.run(compile_cmd + ["--emit=memory"], stdout=f,
                               check=True)

    if args.prepare:
        prepare(args.prepare)
        return
    start = time.time()
    within_budget = lambda: not args.budget or time.time() - start < args.budget
    summary = {"benchmark": "gpu_step", "summary": True, "seq": args.seq,
               "micro_batch": args.micro_batch,
               "peak_tflops": args.peak_tflops, "configs": 0, "errors": 0,
               "not_run": 0}
    with tempfile.TemporaryDirectory() as tmp:
        d = args.artifacts or tmp
        if not args.artifacts:
            prepare(d)
        data = os.path.join(d, "austen")
        for hidden, heads, layers, precision in configs:
            t_config = time.time()
            art = artifact(d, hidden, precision)
            entry = {"benchmark": "gpu_step", "hidden": hidden, "heads": heads,
                     "layers": layers, "precision": precision, "seq": args.seq,
                     "micro_batch": args.micro_batch}
            summary["configs"] += 1
            flops = None
            # Tessera: the timed run.
            if not within_budget():
                entry["tessera"] = {"error": "not run: --budget spent"}
            else:
                metrics = os.path.join(tmp, f"m{hidden}-{precision}.jsonl")
                rc, out = bounded(
                    [tool("tessera-run"), "-n", "1", art, "--backend", "cuda",
                     "--data", data, "--steps", str(args.warmup + args.steps),
                     "--timeout", "60", "--metrics", metrics], args.run_limit)
                if rc != 0 and "no GPU to run on" in out:
                    print(json.dumps({"benchmark": "gpu_step",
                                      "skipped": tail(out, 3)}), flush=True)
                    return
                if rc != 0:
                    entry["tessera"] = {"error": f"exit {rc}: {tail(out)}"}
                else:
                    lines = [json.loads(l) for l in open(metrics)][args.warmup:]
                    step = statistics.median(l["step_time_s"] for l in lines)
                    tflops = statistics.median(l["tflops_per_rank"] for l in lines)
                    flops = statistics.median(
                        l["tflops_per_rank"] * l["step_time_s"] for l in lines) * 1e12
                    entry["tessera"] = {
                        "step_s": round(step, 5),
                        "tokens_per_s": round(args.micro_batch * args.seq / step, 1),
                        "tflops": round(tflops, 2),
                        "mfu_vs_bf16_peak": round(tflops / args.peak_tflops, 4),
                        "final_loss": lines[-1]["loss"],
                    }
                    plan = os.path.join(art + ".memory.json")
                    if os.path.exists(plan):
                        r0 = json.load(open(plan))["ranks"][0]
                        entry["tessera"]["memory_plan_mib"] = {
                            k: round(r0[k] / 2**20, 1) for k in
                            ("peak_activations", "total")}
            # Tessera: the profiled run (per-opcode shares).
            if "error" in entry["tessera"] or not within_budget():
                pass
            else:
                pmetrics = os.path.join(tmp, f"p{hidden}-{precision}.jsonl")
                rc, out = bounded(
                    [tool("tessera-run"), "-n", "1", art, "--backend", "cuda",
                     "--data", data, "--steps", str(args.warmup + 2),
                     "--timeout", "60", "--metrics", pmetrics, "--profile"],
                    args.run_limit)
                if rc != 0:
                    entry["tessera"]["profile_error"] = f"exit {rc}: {tail(out)}"
                else:
                    last = [json.loads(l) for l in open(pmetrics)][-1]
                    kernels = last.get("kernel_time_s", {})
                    total = sum(kernels.values()) or 1.0
                    entry["tessera"]["gemm_share"] = round(
                        sum(v for k, v in kernels.items() if k in GEMM_OPS) / total, 4)
                    entry["tessera"]["op_share"] = {
                        k: round(v / total, 4) for k, v in
                        sorted(kernels.items(), key=lambda kv: -kv[1])[:8]}
            # PyTorch on the same GPU.
            if args.torch and not within_budget():
                entry["torch"] = {"error": "not run: --budget spent"}
            elif args.torch:
                cmd = [sys.executable, os.path.abspath(__file__), "--torch-config",
                       f"{hidden}:{heads}:{layers}:{precision}", "--seq",
                       str(args.seq), "--micro-batch", str(args.micro_batch),
                       "--warmup", str(args.warmup), "--steps", str(args.steps),
                       "--torch-compile" if args.torch_compile else
                       "--no-torch-compile"]
                rc, out = bounded(cmd, args.run_limit)
                objects = [l for l in out.splitlines() if l.startswith("{")]
                entry["torch"] = json.loads(objects[-1]) if objects else {}
                if rc != 0:
                    entry["torch"]["exit"] = f"exit {rc}: {tail(out, 6)}"
                if flops is None:
                    flops = megatron_flops(args.micro_batch, args.seq, layers,
                                           hidden, PADDED_VOCAB)
                    entry["torch"]["flops"] = "Megatron-LM's formula"
                for mode in ("eager", "compiled"):
                    r = entry["torch"].get(mode)
                    if not isinstance(r, dict) or "step_s" not in r:
                        continue
                    r["tflops"] = round(flops / r["step_s"] / 1e12, 2)
                    r["mfu_vs_bf16_peak"] = round(r["tflops"] / args.peak_tflops, 4)
                    t = entry.get("tessera", {})
                    if "tokens_per_s" in t:
                        entry[f"tessera_vs_torch_{mode}"] = round(
                            t["tokens_per_s"] / r["tokens_per_s"], 3)
            entry["elapsed_s"] = round(time.time() - t_config, 1)
            text = json.dumps(entry)
            budget_skips = text.count("not run: --budget spent")
            summary["not_run"] += budget_skips
            if text.count('"error"') > budget_skips or any(
                    f'"{k}"' in text for k in ("exit", "profile_error")):
                summary["errors"] += 1
            print(json.dumps(entry), flush=True)
    summary["elapsed_s"] = round(time.time() - start, 1)
    print(json.dumps(summary), flush=True)
    sys.exit(1 if summary["errors"] else 0)


if __name__ == "__main__":
    main()
