#!/usr/bin/env python3
"""GPT training throughput of one Tessera rank against PyTorch, same model.

For each size, Tessera (tessera-gen gpt -> tessera-compile -> tessera-run
-n 1) and PyTorch train the identical model on the same tokens with the same
number of threads, one after the other in this run:

  pre-LayerNorm GPT, learned position embeddings; per layer LN -> QKV linear
  (bias, head-major fused [seq, batch, heads, 3, head_dim] layout) -> causal
  softmax(q k^T / sqrt(d)) v -> proj linear (bias) -> residual, LN -> fc1
  (4h, bias) -> exact-erf GELU -> fc2 (bias) -> residual; final LN; untied LM
  head without bias over the vocabulary padded to 384 (257 -> multiple of
  128, the embedding padded alike); mean token cross-entropy; tessera-
  compile's default optimizer, Megatron's: AdamW (lr 1e-3, betas
  0.9/0.999, eps 1e-8, weight decay 0.01 on all but biases and LayerNorm
  weights) after clipping the gradients to a global norm of 1.0 (PyTorch:
  torch.optim.AdamW with two parameter groups and clip_grad_norm_); fp32;
  activations [seq, batch, hidden]; Megatron's init.

--arch llama: the Llama architecture instead (tessera-gen gpt
--normalization RMSNorm --disable-bias-linear --swiglu
--position-embedding-type rope --group-query-attention --num-query-groups
heads/4 or 1): per layer RMSNorm -> grouped QKV linear (Megatron's
per-group [q (4 heads) | k | v] layout) -> RoPE on q and k (rotate-half,
base 10000) -> each group's k, v repeated for its heads -> causal
attention -> proj -> residual, RMSNorm -> fc1 (gate and up stacked, FFN
int(4h x 2/3 / 64) x 64) -> silu(gate) * up -> fc2 -> residual; no biases,
no position table. PyTorch writes it as Hugging Face's LlamaDecoderLayer
does (RoPE before repeating k and v).

Losses: each side initialises the weights with its own generator (same
distributions, different numbers), so the first and last losses printed
are not comparable step by step; a jump in both at the same step is the
data (at hidden 256 the step-7 batch lifts the loss to 7.27 in Tessera and
in PyTorch started from Tessera's weights alike).
test/E2E/gpt-vs-torch.test is the check on shared weights (1e-5).

Tokens: tessera-preprocess turns examples/data/northanger_abbey_vol1.txt
into a Megatron indexed dataset; tessera-run reads it with --data and the
PyTorch side reads the same .bin/.idx with numpy and samples the token
stream by the runtime's rule (sample g = the seq + 1 tokens from
(g * seq) mod (T - seq)); the tokens do not change the speed.

Threads: T BLAS threads for tessera-run (--threads T) and, for PyTorch,
torch.set_num_threads(T) with OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = T.
Debian's torch runs its OpenMP pool next to a pthreads OpenBLAS; with T > 1
libgomp's default spin-waiting fights the BLAS threads for the cores, so for
T > 1 PyTorch is also run with OMP_WAIT_POLICY=passive and both numbers are
reported (torch_tokens_per_s is the default environment).

Timing: W warm-up steps, then the median step time over S timed steps, for
both; tokens/s = micro batch x seq / median step time. Each configuration
runs R rounds, Tessera and PyTorch alternating, and the best round's median
counts (the machine may be shared; the 1-minute load average before and
after is reported). A separate Tessera run with --profile gives the
per-opcode share of the mean step (profiling synchronises after every
kernel), and one PyTorch run under torch.autograd.profiler gives PyTorch's
per-op self time for comparison, as shares of the summed op self time (the
profiler's own overhead inflates the profiled step).

GEMM bound: the profile also gives Tessera's GEMM seconds per step and
gemm_bound_ratio = PyTorch's step / those seconds (passive PyTorch for
T > 1), the ratio Tessera would reach if nothing but its GEMMs took time.
Both sides call the same sgemm for the same shapes, so it bounds the
ratio.

Fusions: each size is also compiled with the fusion passes turned off
(FUSIONS_OFF: bias-GELU, cross-entropy statistics, residual add + layer norm,
one optimizer kernel per bucket), run in the same rounds; the row gives its
tokens/s and fusion_speedup = unfused step / fused step, and the profile
section gives the unfused per-opcode shares too (tessera_profile_unfused).
--no-unfused skips it.

OpenBLAS kernels: both sides run the same OpenBLAS, with the kernels it
picks (or the environment's OPENBLAS_CORETYPE). --blas-core NAME runs both
on the kernels NAME (tessera-run --blas-core, OPENBLAS_CORETYPE for
PyTorch), e.g. SkylakeX on an AVX-512 CPU that the installed OpenBLAS
predates; "openblas_kernels" reports what each side ran.

Prints one JSON object. A benchmark, not a test: nothing is asserted.

usage: bench/gpt_vs_torch.py [--build build] [--threads 1,2] [--steps 5]
           [--warmup 2] [--rounds 2] [--sizes 256:4:2,512:8:2,1024:16:2]
           [--seq 128] [--micro-batch 8] [--python /usr/bin/python3]
           [--blas-core NAME]
"""
import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

# The pipeline flags that turn every fusion pass off (the "before").
FUSIONS_OFF = ["--fuse-bias-gelu=false", "--fuse-cross-entropy=false",
               "--fuse-add-layer-norm=false", "--fuse-bucket-optimizer=false"]
VOCAB = 257
PADDED_VOCAB = 384  # Megatron's padding: 257 -> a multiple of 128
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


# ---------------------------------------------------------------- PyTorch --

def llama_groups(heads):
    """--arch llama's query groups: 4 query heads a group (1 group below 4)."""
    return max(1, heads // 4)


def llama_ffn(hidden):
    """Megatron's --swiglu FFN default: int(4 h x 2/3 / 64) x 64."""
    return int(4 * hidden * 2 / 3 / 64) * 64


def read_tokens(prefix):
    """The token stream of a Megatron indexed dataset: the reader of the
    PyTorch reference the lit tests use (test/E2E/Inputs/torch_reference.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "test", "E2E", "Inputs"))
    from torch_reference import read_tokens as reference_reader
    return reference_reader(prefix)


def torch_worker(cfg):
    """Trains the model with PyTorch; prints step times as JSON."""
    import math
    import time
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg.get("seed", 1234))
    L, H, A = cfg["layers"], cfg["hidden"], cfg["heads"]
    S, B, V = cfg["seq"], cfg["batch"], PADDED_VOCAB
    D = H // A
    std = 0.02
    out_std = std / math.sqrt(2.0 * L)
    llama = cfg.get("arch") == "llama"
    G = llama_groups(A)
    R = A // G
    FF = llama_ffn(H)

    def linear(i, o, bias=True, init_std=std):
        m = nn.Linear(i, o, bias=bias)
        nn.init.normal_(m.weight, 0.0, init_std)
        if bias:
            nn.init.zeros_(m.bias)
        return m

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(H, eps=1e-5)
            self.qkv = linear(H, 3 * H)
            self.proj = linear(H, H, init_std=out_std)
            self.ln2 = nn.LayerNorm(H, eps=1e-5)
            self.fc1 = linear(H, 4 * H)
            self.fc2 = linear(4 * H, H, init_std=out_std)
            self.register_buffer(
                "mask", torch.triu(torch.ones(S, S, dtype=torch.bool), 1))

        def forward(self, h):
            # [S, B, A, 3, D] -> q, k, v as [B*A, S, D]
            qkv = self.qkv(self.ln1(h)).view(S, B, A, 3, D).permute(3, 1, 2, 0, 4)
            q = qkv[0].reshape(B * A, S, D)
            k = qkv[1].reshape(B * A, S, D)
            v = qkv[2].reshape(B * A, S, D)
            scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(D))
            p = torch.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1)
            ctx = torch.bmm(p, v).view(B, A, S, D).permute(2, 0, 1, 3).reshape(S, B, H)
            h = h + self.proj(ctx)
            return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))

    class RMSNorm(nn.Module):
        # Hugging Face's LlamaRMSNorm (torch 1.13 has no nn.RMSNorm).
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat((torch.outer(torch.arange(S).float(), inv_freq),) * 2, dim=-1)
    cos, sin = emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]

    def rope(t):  # [S, B, heads, D], Hugging Face's rotate_half
        t1, t2 = t[..., :D // 2], t[..., D // 2:]
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin

    class LlamaLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.qkv = linear(H, (A + 2 * G) * D, bias=False)
            self.proj = linear(A * D, H, bias=False, init_std=out_std)
            self.fc1 = linear(H, 2 * FF, bias=False)
            self.fc2 = linear(FF, H, bias=False, init_std=out_std)
            self.register_buffer(
                "mask", torch.triu(torch.ones(S, S, dtype=torch.bool), 1))

        def forward(self, h):
            qkv = self.qkv(self.n1(h)).view(S, B, G, R + 2, D)
            q = rope(qkv[:, :, :, :R].reshape(S, B, A, D))
            k = rope(qkv[:, :, :, R]).repeat_interleave(R, dim=2)
            v = qkv[:, :, :, R + 1].repeat_interleave(R, dim=2)
            q, k, v = (t.permute(1, 2, 0, 3).reshape(B * A, S, D) for t in (q, k, v))
            scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(D))
            p = torch.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1)
            ctx = torch.bmm(p, v).view(B, A, S, D).permute(2, 0, 1, 3).reshape(S, B, H)
            h = h + self.proj(ctx)
            gate, up = self.fc1(self.n2(h)).chunk(2, dim=-1)
            return h + self.fc2(F.silu(gate) * up)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Parameter(torch.empty(V, H).normal_(0.0, std))
            self.wpe = None if llama else nn.Parameter(torch.empty(S, H).normal_(0.0, std))
            self.layers = nn.ModuleList([LlamaLayer() if llama else Layer()
                                         for _ in range(L)])
            self.ln_f = RMSNorm() if llama else nn.LayerNorm(H, eps=1e-5)
            self.head = linear(H, V, bias=False)

        def forward(self, tokens, labels):
            h = F.embedding(tokens, self.wte)
            if self.wpe is not None:
                h = h + self.wpe[:, None, :]
            for layer in self.layers:
                h = layer(h)
            logits = self.head(self.ln_f(h))
            return F.cross_entropy(logits.view(-1, V), labels.reshape(-1),
                                   ignore_index=-100)

    model = GPT()
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and not n.endswith("bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    stream = read_tokens(cfg["data"])
    span = len(stream) - S

    def batch(step):  # step counts from 0
        starts = [((step * B + b) * S) % span for b in range(B)]
        sample = np.stack([stream[s:s + S + 1] for s in starts], axis=1)  # [S+1, B]
        t = torch.from_numpy(sample)
        return t[:-1].contiguous(), t[1:].contiguous()

    def step(i):
        tokens, labels = batch(i)
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    times, losses = [], []
    total = cfg["warmup"] + cfg["steps"]
    for i in range(total):
        t0 = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - t0)
    result = {"step_time_s": times, "loss": losses,
              "openblas_kernels": openblas_core()}
    if cfg.get("profile"):
        from torch.autograd import profiler
        t0 = time.perf_counter()
        with profiler.profile() as prof:
            for i in range(total, total + cfg["profile"]):
                step(i)
        result["profile_step_s"] = (time.perf_counter() - t0) / cfg["profile"]
        self_us = {}
        for e in prof.key_averages():
            self_us[e.key] = self_us.get(e.key, 0.0) + e.self_cpu_time_total
        result["op_self_s"] = {k: v / 1e6 / cfg["profile"] for k, v in self_us.items()}
    json.dump(result, sys.stdout)


# ---------------------------------------------------------------- driver --

def openblas_core():
    """The OpenBLAS core this process runs (torch's OpenBLAS), or None."""
    for name in ("libopenblas.so.0", "libopenblas.so"):
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return None


def torch_python(requested):
    candidates = [requested] if requested else ["/usr/bin/python3", sys.executable]
    for py in candidates:
        if py and os.path.exists(py) and subprocess.run(
                [py, "-c", "import torch, numpy"], capture_output=True).returncode == 0:
            return py
    raise SystemExit("no python with torch and numpy (tried %s); use --python"
                     % ", ".join(c for c in candidates if c))


def run_torch(python, cfg, passive=False):
    env = dict(os.environ)
    if cfg.get("blas_core"):
        env["OPENBLAS_CORETYPE"] = cfg["blas_core"]
    t = str(cfg["threads"])
    env.update(OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, MKL_NUM_THREADS=t)
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "passive"
    out = subprocess.run([python, os.path.abspath(__file__), "--torch-worker",
                          json.dumps(cfg)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


TESSERA_KERNELS = {}  # the OpenBLAS core tessera-run's banner names


def run_tessera(bindir, art, data, steps, threads, metrics, profile=False,
                blas_core=None):
    cmd = [os.path.join(bindir, "tessera-run"), "-n", "1", art, "--data", data,
           "--steps", str(steps), "--threads", str(threads), "--metrics", metrics]
    if profile:
        cmd.append("--profile")
    if blas_core:
        cmd += ["--blas-core", blas_core]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    m = re.search(r"\| OpenBLAS \S+ \((\w+) kernels\)", out)
    if m:
        TESSERA_KERNELS["core"] = m.group(1)
    return [json.loads(line) for line in open(metrics)]


def shares(seconds, step, top=None):
    """Per-op share of the step, largest first; the rest of the step is
    'unaccounted' (executor overhead, data loading, Python for PyTorch)."""
    items = sorted(seconds.items(), key=lambda kv: -kv[1])
    out = {k: round(v / step, 4) for k, v in (items[:top] if top else items) if v > 0}
    if top and len(items) > top:
        out["(other ops)"] = round(sum(v for _, v in items[top:]) / step, 4)
    out["(unaccounted)"] = round(1 - sum(v for _, v in items) / step, 4)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating rounds per configuration; the best median counts")
    ap.add_argument("--sizes", default="256:4:2,512:8:2,1024:16:2",
                    help="hidden:heads:layers, comma-separated")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--python", default=None,
                    help="Python with torch (default /usr/bin/python3, then this one)")
    ap.add_argument("--text", default=os.path.join(REPO, "examples", "data",
                                                   "northanger_abbey_vol1.txt"))
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--blas-core", default=None,
                    help="OpenBLAS kernels for both sides (OPENBLAS_CORETYPE)")
    ap.add_argument("--no-unfused", action="store_true",
                    help="skip the run with the fusion passes off")
    ap.add_argument("--arch", choices=["gpt", "llama"], default="gpt",
                    help="GPT-2/3 layers, or Llama's (RMSNorm, GQA, RoPE, SwiGLU, "
                         "no biases)")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        torch_worker(json.loads(args.torch_worker))
        return

    bindir = os.path.join(args.build, "bin")
    python = torch_python(args.python)
    threads = [int(t) for t in args.threads.split(",")]
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes.split(",")]
    S, B = args.seq, args.micro_batch
    tokens_per_step = S * B
    total = args.warmup + args.steps
    torch_version = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True).stdout.strip()

    load_before = os.getloadavg()[0]
    results = []
    torch_kernels = None
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "austen")
        subprocess.run([os.path.join(bindir, "tessera-preprocess"), "--input", args.text,
                        "--output-prefix", prefix, "--append-eod"],
                       check=True, stdout=subprocess.DEVNULL)
        data = prefix + "_text_document"
        for hidden, heads, layers in sizes:
            model = os.path.join(tmp, f"gpt{hidden}.mlir")
            art = os.path.join(tmp, f"gpt{hidden}.tsr")
            arch_flags = []
            if args.arch == "llama":
                arch_flags = ["--normalization", "RMSNorm", "--disable-bias-linear",
                              "--swiglu", "--position-embedding-type", "rope"]
                if llama_groups(heads) != heads:
                    arch_flags += ["--group-query-attention", "--num-query-groups",
                                   str(llama_groups(heads))]
            subprocess.run([os.path.join(bindir, "tessera-gen"), "gpt",
                            "--layers", str(layers), "--hidden", str(hidden),
                            "--heads", str(heads), "--vocab", str(VOCAB),
                            "--seq", str(S), *arch_flags, "-o", model], check=True)
            compile_cmd = [os.path.join(bindir, "tessera-compile"), model,
                           "--micro-batch-size", str(B), "--global-batch-size", str(B),
                           "--optimizer", "adam", "--lr", "1e-3"]
            subprocess.run(compile_cmd + ["-o", art], check=True)
            unfused = None
            if not args.no_unfused:
                unfused = os.path.join(tmp, f"gpt{hidden}-unfused.tsr")
                subprocess.run(compile_cmd + FUSIONS_OFF + ["-o", unfused],
                               check=True)
            if args.arch == "llama":
                d, g, ff = hidden // heads, llama_groups(heads), llama_ffn(hidden)
                params = (layers * (hidden * (heads + 2 * g) * d + hidden * hidden
                                    + 3 * hidden * ff + 2 * hidden)
                          + 2 * PADDED_VOCAB * hidden + hidden)
            else:
                params = (layers * (12 * hidden * hidden + 13 * hidden)
                          + 2 * PADDED_VOCAB * hidden + S * hidden + 2 * hidden)
            entry = {"hidden": hidden, "heads": heads, "layers": layers, "seq": S,
                     "micro_batch": B, "padded_vocab": PADDED_VOCAB, "params": params,
                     "threads": {}}
            cfg = {"arch": args.arch,
                   "layers": layers, "hidden": hidden, "heads": heads, "seq": S,
                   "batch": B, "data": data, "warmup": args.warmup,
                   "steps": args.steps, "blas_core": args.blas_core}
            for t in threads:
                # Rounds alternate the two, so a burst of load from another
                # process hits both; the best round's median is reported.
                ts_rounds, tr_rounds, trp_rounds, tu_rounds = [], [], [], []
                for r in range(args.rounds):
                    if unfused:
                        ulines = run_tessera(bindir, unfused, data, total, t,
                                             os.path.join(tmp, f"u{hidden}-{t}-{r}.jsonl"),
                                             blas_core=args.blas_core)
                        tu_rounds.append(statistics.median(
                            l["step_time_s"] for l in ulines[args.warmup:]))
                    lines = run_tessera(bindir, art, data, total, t,
                                        os.path.join(tmp, f"m{hidden}-{t}-{r}.jsonl"),
                                        blas_core=args.blas_core)
                    ts_rounds.append(statistics.median(
                        l["step_time_s"] for l in lines[args.warmup:]))
                    tr = run_torch(python, dict(cfg, threads=t))
                    tr_rounds.append(statistics.median(tr["step_time_s"][args.warmup:]))
                    torch_kernels = tr.get("openblas_kernels")
                    if t > 1:
                        trp = run_torch(python, dict(cfg, threads=t), passive=True)
                        trp_rounds.append(statistics.median(trp["step_time_s"][args.warmup:]))
                ts_step, tr_step = min(ts_rounds), min(tr_rounds)
                row = {
                    "tessera_tokens_per_s": round(tokens_per_step / ts_step, 1),
                    "torch_tokens_per_s": round(tokens_per_step / tr_step, 1),
                    "ratio": round(tr_step / ts_step, 3),
                    "tessera_step_s_rounds": [round(x, 4) for x in ts_rounds],
                    "torch_step_s_rounds": [round(x, 4) for x in tr_rounds],
                    "tessera_loss_first_last": [round(lines[0]["loss"], 4),
                                                round(lines[-1]["loss"], 4)],
                    "torch_loss_first_last": [round(tr["loss"][0], 4),
                                              round(tr["loss"][-1], 4)],
                }
                if unfused:
                    tu_step = min(tu_rounds)
                    row["tessera_unfused_tokens_per_s"] = round(tokens_per_step / tu_step, 1)
                    row["unfused_ratio"] = round(tr_step / tu_step, 3)
                    row["fusion_speedup"] = round(tu_step / ts_step, 3)
                    row["tessera_unfused_step_s_rounds"] = [round(x, 4) for x in tu_rounds]
                if t > 1:
                    trp_step = min(trp_rounds)
                    row["torch_passive_tokens_per_s"] = round(tokens_per_step / trp_step, 1)
                    row["ratio_vs_torch_passive"] = round(trp_step / ts_step, 3)
                    row["torch_passive_step_s_rounds"] = [round(x, 4) for x in trp_rounds]
                entry["threads"][str(t)] = row

            if not args.no_profile:
                t = max(threads)
                for key, artifact in (("tessera_profile", art),
                                      ("tessera_profile_unfused", unfused)):
                    if not artifact:
                        continue
                    lines = run_tessera(bindir, artifact, data, total, t,
                                        os.path.join(tmp, f"p{hidden}.jsonl"),
                                        profile=True, blas_core=args.blas_core)
                    timed = lines[args.warmup:]
                    # Means (not medians) so that the shares add up to the step.
                    step = statistics.mean(l["step_time_s"] for l in timed)
                    ops = {k: statistics.mean(l["kernel_time_s"].get(k, 0.0)
                                              for l in timed)
                           for k in timed[0]["kernel_time_s"]}
                    entry[key] = {"threads": t, "step_s": round(step, 4),
                                  "opcode_share": shares(ops, step)}
                    if key == "tessera_profile" and ops.get("Gemm"):
                        # The ratio Tessera would reach if everything but its
                        # GEMMs took no time: the same BLAS on both sides
                        # bounds the comparison by the GEMM time.
                        row = entry["threads"][str(t)]
                        torch_step = tokens_per_step / row.get(
                            "torch_passive_tokens_per_s", row["torch_tokens_per_s"])
                        entry[key]["gemm_s"] = round(ops["Gemm"], 4)
                        entry[key]["gemm_bound_ratio"] = round(torch_step / ops["Gemm"], 3)
                tr = run_torch(python, dict(cfg, threads=t, steps=0, profile=3),
                               passive=t > 1)
                tr_step = tr["profile_step_s"]
                # The autograd profiler's own overhead is large next to small
                # ops, so PyTorch's shares are of the summed op self time.
                self_total = sum(tr["op_self_s"].values())
                op_share = shares(tr["op_self_s"], self_total, top=12)
                op_share.pop("(unaccounted)", None)
                entry["torch_profile"] = {
                    "threads": t, "omp_wait_policy": "passive" if t > 1 else "default",
                    "profiled_step_s": round(tr_step, 4),
                    "op_self_time_s": round(self_total, 4),
                    "op_share_of_self_time": op_share}
            results.append(entry)
            print(f"gpt_vs_torch: hidden {hidden} done", file=sys.stderr)

    json.dump({"benchmark": "gpt_vs_torch", "arch": args.arch, "ranks": 1,
               "torch": torch_version,
               "torch_python": python, "warmup_steps": args.warmup,
               "timed_steps": args.steps, "rounds": args.rounds,
               "statistic": "median step time of the best round",
               "loadavg_1min_before_after": [round(load_before, 2),
                                             round(os.getloadavg()[0], 2)],
               "cores": os.cpu_count(),
               "openblas_kernels": {"tessera": TESSERA_KERNELS.get("core"),
                                    "torch": torch_kernels},
               "ratio": "tessera tokens/s / torch tokens/s (> 1: Tessera faster)",
               "results": results}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
