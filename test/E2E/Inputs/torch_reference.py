#!/usr/bin/env python3
"""PyTorch reference training of a tessera-gen GPT, from Tessera's own init.

Usage: torch_reference.py --model X.mlir --data PREFIX --steps N
           --micro-batch-size B [--global-batch-size G] [--seed 1234]
           [--padded-vocab V] [--lr 1e-3] [--threads T] [--float64]

Trains the model of X.mlir (as emitted by tessera-gen gpt) in PyTorch on the
same initial weights and the same tokens as `tessera-run -n 1 X.tsr --data
PREFIX` and prints one JSON line per step, {"step": i, "loss": l}, the format
of tessera-run --metrics (compare the two with compare_losses.py).

 * Weights: the parameters are the function arguments of the .mlir with an
   nn.param name and an nn.init spec ("normal:<std>", "uniform:<a>",
   "zeros", "ones"). Element g (row-major index into the GLOBAL tensor) is
   initialised exactly as runtime/src/Data.cpp initParameterShard does, with
   the Philox4x32-10 stream of runtime/include/tessera/rt/Rng.h keyed by
   FNV-1a-64 of the parameter name: float(double(float(std)) * normal(g)).
   The vocabulary-indexed parameters (embedding tables, LM head) are padded
   to --padded-vocab rows (default: the vocabulary rounded up to a multiple
   of 128, as tessera-compile's pad-vocab does); the padded rows continue the
   global index and are trained like the others.
 * Data: sample g = (it - 1) * G + m * B + i (microbatch m of iteration it,
   1-based) is the S + 1 tokens of the dataset's token stream starting at
   (g * S) mod (T - S); tokens [S, B] sequence-major, labels shifted by one
   (runtime/include/tessera/rt/Data.h, IndexedDataset.cpp).
 * Model: the nn ops of the function body are interpreted one by one in
   float32 (embedding, add_position_embedding, layer_norm, rms_norm, linear, attention,
   repeat_kv, qk_norm, gelu, relu, swiglu, add, softmax_cross_entropy, token_mean, and the MoE layer's
   moe_router, moe_aux_loss, add_aux_loss, moe_capacity_drop, moe_dispatch,
   grouped_linear and moe_combine, written as Megatron's MoELayer computes
   them), so tied
   embeddings (--tie-embeddings), MoE and any number of layers work as
   emitted. The loss of
   an iteration is the mean over its microbatches; gradients are summed with
   weight 1/num_microbatches.
 * Optimizer: AdamW (torch.optim.AdamW; lr 1e-3, betas 0.9/0.999, eps 1e-8,
   bias-corrected) on Megatron's two parameter groups: weight decay
   (--weight-decay, 0.01) on matrices, none on biases and 1-D parameters;
   gradients clipped to the global norm --clip-grad (1.0; 0: off) with
   torch.nn.utils.clip_grad_norm_, whose norm each step's record carries as
   "grad_norm": tessera-compile's defaults, Megatron-LM's. --optimizer sgd:
   torch.optim.SGD with --sgd-momentum (0.9) on the same groups.
   --log-params-norm: each record's "params_norm", the parameters' global
   L2 norm after the update (Megatron's calc_params_l2_norm).
"""
import argparse
import json
import math
import re
import sys

import numpy as np

# ------------------------------------------------------------------ RNG --

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h ^= c
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def philox4x32_10(index, seed, key):
    """Philox4x32-10 of counters {lo(index), hi(index), lo(seed), hi(seed)}
    (index a uint64 array) with key {lo(key), hi(key)}; four uint64 arrays
    holding 32-bit words."""
    index = index.astype(np.uint64)
    c0 = index & _MASK32
    c1 = index >> np.uint64(32)
    c2 = np.full_like(index, seed & 0xFFFFFFFF)
    c3 = np.full_like(index, (seed >> 32) & 0xFFFFFFFF)
    k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0 = _M0 * c0  # < 2^64: no overflow
        p1 = _M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c0, c1, c2, c3 = (hi1 ^ c1 ^ np.uint64(k0), lo1,
                          hi0 ^ c3 ^ np.uint64(k1), lo0)
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def _to_unit(lo, hi):
    bits = (hi << np.uint64(32)) | lo
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def philox_uniform(seed, name, index):
    x0, x1, _, _ = philox4x32_10(index, seed, fnv1a64(name))
    return _to_unit(x0, x1)


def philox_normal(seed, name, index):
    """Box-Muller as Rng.h: sqrt(-2 ln(1 - u1)) * cos(2 pi u2), in double
    with the C library's log and cos (math module) for bit-exactness."""
    x0, x1, x2, x3 = philox4x32_10(index, seed, fnv1a64(name))
    u1 = _to_unit(x0, x1)
    u2 = _to_unit(x2, x3)
    two_pi = 6.283185307179586476925286766559
    log, cos, sqrt = math.log, math.cos, math.sqrt
    return np.array([sqrt(-2.0 * log(1.0 - a)) * cos(two_pi * b)
                     for a, b in zip(u1.tolist(), u2.tolist())],
                    dtype=np.float64)


def init_param(spec, name, shape, seed):
    """initParameterShard of one whole (unsharded) tensor."""
    n = int(np.prod(shape)) if shape else 1
    kind, _, arg = spec.partition(":")
    if kind == "zeros":
        return np.zeros(shape, np.float32)
    if kind == "ones":
        return np.ones(shape, np.float32)
    scale = float(np.float32(float(arg)))  # Buffer.init_scale is a float
    idx = np.arange(n, dtype=np.uint64)
    if kind == "normal":
        vals = scale * philox_normal(seed, name, idx)
    elif kind == "uniform":
        vals = scale * (2.0 * philox_uniform(seed, name, idx) - 1.0)
    else:
        raise SystemExit(f"unknown init spec '{spec}' of parameter {name}")
    return vals.astype(np.float32).reshape(shape)


# ----------------------------------------------------------------- .mlir --

_ARG = re.compile(r"%(arg\d+)\s*:\s*tensor<([^>]*)>\s*(\{[^}]*\})?")
_ATTR_STR = r'{}\s*=\s*"([^"]*)"'
_OP = re.compile(r"^\s*%(\w+(?:\s*,\s*%\w+)*)\s*=\s*nn\.(\w+)\s+([^{:]*?)\s*(\{[^}]*\})?\s*:\s*(.*)$")


def parse_shape(text):
    dims = text.split("x")[:-1]  # the last entry is the element type
    return [None if d == "?" else int(d) for d in dims]


def parse_model(path):
    text = open(path).read()
    m = re.search(r"func\.func\s+@(\w+)\((.*?)\)\s*->", text, re.S)
    if not m:
        raise SystemExit(f"{path}: no func.func")
    args = {}
    for a in _ARG.finditer(m.group(2)):
        attrs = a.group(3) or ""
        entry = {"shape": parse_shape(a.group(2))}
        for key in ("nn.param", "nn.init", "nn.input"):
            s = re.search(_ATTR_STR.format(re.escape(key)), attrs)
            if s:
                entry[key] = s.group(1)
        args[a.group(1)] = entry
    body = text[m.end():]
    ops = []
    for line in body.splitlines():
        o = _OP.match(line)
        if o:
            attrs = o.group(4) or ""
            ints = dict(re.findall(r"([\w.]+)\s*=\s*(-?\d+)\s*:\s*i64", attrs))
            floats = dict(re.findall(r"([\w.]+)\s*=\s*(-?[\d.eE+-]+)\s*:\s*f(?:32|64)", attrs))
            strings = dict(re.findall(r"([\w.]+)\s*=\s*\"([^\"]*)\"", attrs))
            ops.append({"results": re.findall(r"(\w+)", o.group(1)),
                        "result": o.group(1), "op": o.group(2),
                        "operands": re.findall(r"%(\w+)", o.group(3)),
                        "ints": {k: int(v) for k, v in ints.items()},
                        "floats": {k: float(v) for k, v in floats.items()},
                        "strings": strings})
        r = re.match(r"^\s*return\s+%(\w+)", line)
        if r:
            return args, ops, r.group(1)
    raise SystemExit(f"{path}: no return")


# ------------------------------------------------------------------ data --

def read_tokens(prefix):
    """The token stream of a Megatron indexed dataset (sequence order)."""
    dtypes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
              6: np.float64, 7: np.float32, 8: np.uint16}
    for p in (prefix, prefix + "_text_document"):
        try:
            f = open(p + ".idx", "rb")
        except FileNotFoundError:
            continue
        with f:
            head = f.read(34)
            assert head[:9] == b"MMIDIDX\x00\x00", "not a Megatron .idx"
            dtype = dtypes[head[17]]
            n = int.from_bytes(head[18:26], "little")
            sizes = np.frombuffer(f.read(4 * n), dtype=np.int32)
            pointers = np.frombuffer(f.read(8 * n), dtype=np.int64)
        data = np.fromfile(p + ".bin", dtype=dtype)
        item = np.dtype(dtype).itemsize
        return np.concatenate([data[q // item:q // item + s]
                               for q, s in zip(pointers, sizes)]).astype(np.int64)
    raise SystemExit(f"no indexed dataset at {prefix}(.idx|_text_document.idx)")


def sample_batch(stream, seq, gs):
    span = len(stream) - seq
    sample = np.stack([stream[(g * seq) % span:(g * seq) % span + seq + 1]
                       for g in gs], axis=1)  # [S + 1, B]
    return sample[:-1], sample[1:]


# ----------------------------------------------------------------- model --

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--micro-batch-size", type=int, required=True)
    ap.add_argument("--global-batch-size", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--padded-vocab", type=int, default=None,
                    help="rows of the vocabulary-indexed parameters "
                         "(default: vocab rounded up to a multiple of 128)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--sgd-momentum", type=float, default=0.9)
    ap.add_argument("--log-params-norm", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--float64", action="store_true",
                    help="compute in float64 (a check of float32 rounding)")
    args = ap.parse_args()
    # The margins of the current step's discrete decisions (see below).
    margins = []

    import torch
    import torch.nn.functional as F
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.float64 else torch.float32

    params_spec, ops, ret = parse_model(args.model)
    unknown = sorted({o["op"] for o in ops} - {
        "embedding", "add_position_embedding", "layer_norm", "rms_norm", "linear",
        "rotary_embedding",
        "attention", "repeat_kv", "qk_norm", "gelu", "relu", "swiglu", "add",
        "softmax_cross_entropy",
        "token_mean", "moe_router", "moe_aux_loss", "add_aux_loss",
        "moe_dispatch", "grouped_linear", "moe_combine", "moe_capacity_drop"})
    if unknown:
        raise SystemExit(f"unsupported nn ops: {', '.join(unknown)}")

    # Vocabulary-indexed parameters: embedding tables and the LM head (the
    # linear whose result feeds softmax_cross_entropy).
    vocab = None
    vocab_params = set()
    producer = {o["result"]: o for o in ops}
    for o in ops:
        if o["op"] == "embedding":
            vocab = o["ints"]["vocab_size"]
            vocab_params.add(o["operands"][1])
        if o["op"] == "softmax_cross_entropy":
            head = producer.get(o["operands"][0])
            if head and head["op"] == "linear":
                vocab_params.update(head["operands"][1:])
    padded = args.padded_vocab or (
        (vocab + 127) // 128 * 128 if vocab else None)

    weights = {}
    for arg, spec in params_spec.items():
        if "nn.param" not in spec:
            continue
        shape = list(spec["shape"])
        if arg in vocab_params:
            if shape[0] not in (vocab, padded):
                raise SystemExit(f"{spec['nn.param']}: {shape[0]} rows, "
                                 f"expected vocab {vocab}")
            shape[0] = padded
        w = init_param(spec.get("nn.init", "zeros"), spec["nn.param"], shape,
                       args.seed)
        weights[arg] = torch.tensor(w, dtype=dtype, requires_grad=True)
    inputs = {spec["nn.input"]: arg for arg, spec in params_spec.items()
              if "nn.input" in spec}
    seq = params_spec[inputs["tokens"]]["shape"][0]

    def forward(tokens, labels):
        env = dict(weights)
        env[inputs["tokens"]] = tokens
        env[inputs["labels"]] = labels
        for o in ops:
            x = [env[v] for v in o["operands"]]
            op = o["op"]
            if op == "embedding":
                y = F.embedding(x[0], x[1])
            elif op == "add_position_embedding":
                y = x[0] + x[1][:x[0].shape[0], None, :]
            elif op == "layer_norm":
                y = F.layer_norm(x[0], x[0].shape[-1:], x[1], x[2], eps=1e-5)
            elif op == "rms_norm":
                # Megatron's RMSNorm (Hugging Face's LlamaRMSNorm).
                eps = o["floats"].get("eps", 1e-5)
                y = x[0] * torch.rsqrt(x[0].pow(2).mean(-1, keepdim=True) + eps) * x[1]
            elif op == "rotary_embedding":
                # Rotary embeddings as Hugging Face's Llama computes them:
                # inv_freq from the base, cos/sin of positions x inv_freq
                # repeated over both halves, q * cos + rotate_half(q) * sin
                # on each head's first rotary_dim features of q and k.
                a, rot = o["ints"]["num_heads"], o["ints"]["rotary_dim"]
                base = o["floats"].get("base", 10000.0)
                s, b, f = x[0].shape
                d = f // (3 * a)
                inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.int64).to(dtype) / rot))
                factor = o["floats"].get("scaling_factor")
                if factor:
                    # Llama 3.1's scaling (Hugging Face's
                    # _compute_llama3_parameters): low/high frequency
                    # factors 1 and 4 over an original context of 8192.
                    old, low, high = 8192.0, 1.0, 4.0
                    wavelen = 2 * math.pi / inv_freq
                    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
                    smooth = (old / wavelen - low) / (high - low)
                    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
                    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
                    inv_freq = torch.where(medium, smoothed, scaled)
                freqs = torch.outer(torch.arange(s, dtype=dtype), inv_freq)
                emb = torch.cat((freqs, freqs), dim=-1)
                cos, sin = emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]
                qkv = x[0].view(s, b, a, 3, d)

                def rotate_half(t):
                    t1, t2 = t[..., :rot // 2], t[..., rot // 2:]
                    return torch.cat((-t2, t1), dim=-1)

                def rope(t):
                    r = t[..., :rot]
                    return torch.cat((r * cos + rotate_half(r) * sin, t[..., rot:]), dim=-1)
                y = torch.stack((rope(qkv[:, :, :, 0]), rope(qkv[:, :, :, 1]),
                                 qkv[:, :, :, 2]), dim=3).reshape(s, b, f)
            elif op == "linear":
                # A stacked [k, out, in] weight (SwiGLU's gate and up) is
                # the [k * out, in] matrix of its projections in order.
                w = x[1].reshape(-1, x[1].shape[-1])
                y = F.linear(x[0], w, x[2].reshape(-1) if len(x) > 2 else None)
            elif op == "qk_norm":
                # Qwen 3's q_norm and k_norm (Hugging Face's Qwen3RMSNorm)
                # over each query and key head's features; values as they
                # are.
                a, g = o["ints"]["num_heads"], o["ints"]["num_query_groups"]
                eps = o["floats"].get("eps", 1e-5)
                s, b, f = x[0].shape
                r = a // g
                d = f // (a + 2 * g)
                grouped = x[0].view(s, b, g, r + 2, d)

                def rms(t, w):
                    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w
                y = torch.cat((rms(grouped[:, :, :, :r], x[1]),
                               rms(grouped[:, :, :, r:r + 1], x[2]),
                               grouped[:, :, :, r + 1:]), dim=3).reshape(s, b, f)
            elif op == "repeat_kv":
                # Grouped-query attention: linear_qkv's features per query
                # group [q (r heads) | k | v]; each group's k and v repeated
                # for its r query heads (Hugging Face's repeat_kv: expand,
                # then reshape), laid out head-major [q | k | v] per head.
                a, g = o["ints"]["num_heads"], o["ints"]["num_query_groups"]
                s, b, f = x[0].shape
                r = a // g
                d = f // (a + 2 * g)
                grouped = x[0].view(s, b, g, r + 2, d)
                q = grouped[:, :, :, :r]
                k = grouped[:, :, :, r:r + 1].expand(s, b, g, r, d)
                v = grouped[:, :, :, r + 1:].expand(s, b, g, r, d)
                y = torch.stack((q, k, v), dim=4).reshape(s, b, a * 3 * d)
            elif op == "attention":
                a = o["ints"]["num_heads"]
                s, b, f = x[0].shape
                d = f // (3 * a)
                qkv = x[0].view(s, b, a, 3, d).permute(3, 1, 2, 0, 4)  # [3,B,A,S,D]
                q, k, v = qkv[0], qkv[1], qkv[2]
                scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
                if o["ints"].get("causal", 1):
                    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
                    scores = scores.masked_fill(mask, float("-inf"))
                ctx = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B,A,S,D]
                y = ctx.permute(2, 0, 1, 3).reshape(s, b, a * d)
            elif op == "gelu":
                y = F.gelu(x[0], approximate=o["strings"].get("approximate", "none"))
            elif op == "relu":
                y = F.relu(x[0])
            elif op == "swiglu":
                # Hugging Face's LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
                # with act_fn = SiLU, the gate projection first.
                gate, up = x[0].chunk(2, dim=-1)
                y = F.silu(gate) * up
            elif op == "add":
                y = x[0] + x[1]
            elif op == "softmax_cross_entropy":
                z = x[0]
                y = F.cross_entropy(
                    z.reshape(-1, z.shape[-1]), x[1].reshape(-1),
                    ignore_index=o["ints"].get("ignore_index", -100),
                    reduction="none").view(x[1].shape)
            elif op == "token_mean":
                valid = x[1] != -100
                y = (x[0] * valid).sum() / valid.sum().clamp(min=1)
            # Mixture of experts, as Megatron's MoELayer computes it: top-k
            # then softmax (moe_router_pre_softmax False), the
            # load-balancing loss through MoEAuxLossAutoScaler, tokens
            # permuted expert-major by a stable argsort, one GEMM per expert.
            elif op == "moe_router":
                k = o["ints"]["topk"]
                if x[0].shape[-1] > k:
                    # The decision's margin: the k-th logit over the next.
                    ranked = torch.topk(x[0].detach(), k + 1, dim=-1).values
                    gaps = ranked[..., k - 1] - ranked[..., k]
                    # Exact ties (identical rows: the same token first in two
                    # samples) are decided alike by any implementation.
                    if (gaps > 0).any():
                        margins.append(gaps[gaps > 0].min().item())
                top, idx = torch.topk(x[0], k, dim=-1)
                y = (torch.softmax(top, dim=-1), idx)
            elif op == "moe_aux_loss":
                e = x[0].shape[-1]
                scores = torch.softmax(x[0].reshape(-1, e), dim=-1)
                counts = torch.bincount(x[1].reshape(-1), minlength=e).to(scores.dtype)
                t, k = scores.shape[0], x[1].shape[-1]
                y = (scores.sum(0) * counts).sum() * (e * o["floats"]["coeff"] / (k * t * t))
            elif op == "add_aux_loss":
                y = AuxLossScaler.apply(x[0], x[1])
            elif op == "moe_capacity_drop":
                # Each expert keeps its ceil(T k / E * factor) most probable
                # choices (ties to the earlier token) or its first ones.
                e_n = o["ints"]["num_experts"]
                k = x[1].shape[-1]
                flat_p, flat_i = x[0].reshape(-1), x[1].reshape(-1)
                cap = math.ceil(flat_i.numel() / e_n * o["floats"]["capacity_factor"])
                keep = torch.ones_like(flat_i, dtype=torch.bool)
                for e in range(e_n):
                    sel = (flat_i == e).nonzero().flatten().tolist()
                    if len(sel) > cap:
                        if o["strings"].get("drop_policy", "probs") == "probs":
                            sel = sorted(sel, key=lambda c: (-flat_p[c].item(), c))
                            # The last kept probability over the first
                            # dropped (exact ties go to the earlier token in
                            # any implementation).
                            gap = flat_p[sel[cap - 1]].item() - flat_p[sel[cap]].item()
                            if gap > 0:
                                margins.append(gap)
                        keep[sel[cap:]] = False
                y = ((flat_p * keep).view(x[0].shape),
                     torch.where(keep, flat_i, torch.full_like(flat_i, -1)).view(x[1].shape))
            elif op == "moe_dispatch":
                flat = x[1].reshape(-1)
                valid = (flat >= 0).nonzero().flatten()
                order = valid[torch.sort(flat[valid], stable=True).indices]
                k = x[1].shape[-1]
                rows = x[0].reshape(-1, x[0].shape[-1])[order // k]
                pad = torch.zeros(flat.numel() - rows.shape[0], rows.shape[1],
                                  dtype=rows.dtype)
                y = (torch.cat([rows, pad]),
                     torch.bincount(flat[valid], minlength=o["ints"]["num_experts"]))
            elif op == "grouped_linear":
                # Rows past the experts' (dropped choices) give zeros.
                n = int(x[1].sum())
                parts = torch.split(x[0][:n], x[1].tolist())
                # A stacked [experts, k, out, in] weight (SwiGLU experts) is
                # each expert's [k * out, in] matrix.
                w = x[2].reshape(x[2].shape[0], -1, x[2].shape[-1])
                y = torch.cat([p @ w[e].t() for e, p in enumerate(parts)] +
                              [x[0].new_zeros(x[0].shape[0] - n, w.shape[1])])
            elif op == "moe_combine":
                flat = x[2].reshape(-1)
                valid = (flat >= 0).nonzero().flatten()
                order = valid[torch.sort(flat[valid], stable=True).indices]
                unperm = torch.zeros_like(x[0]).index_copy(
                    0, order, x[0][:order.numel()])
                k = x[2].shape[-1]
                y = (unperm.view(-1, k, x[0].shape[-1]) *
                     x[1].reshape(-1, k, 1)).sum(1).view(*x[1].shape[:-1], -1)
            if isinstance(y, tuple):
                for name, v in zip(o["results"], y):
                    env[name] = v
            else:
                env[o["result"]] = y
        return env[ret]

    class AuxLossScaler(torch.autograd.Function):
        """Megatron's MoEAuxLossAutoScaler: the auxiliary loss gets the
        main loss's gradient scale, 1 / the number of microbatches."""

        @staticmethod
        def forward(ctx, activation, aux):
            ctx.save_for_backward(aux)
            return activation

        @staticmethod
        def backward(ctx, grad):
            (aux,) = ctx.saved_tensors
            return grad, torch.ones_like(aux) / nmb

    # Megatron's get_param_groups: no decay on biases and 1-D parameters.
    names = {arg: spec["nn.param"] for arg, spec in params_spec.items()
             if "nn.param" in spec}
    decay = [w for arg, w in weights.items()
             if not names[arg].endswith(".bias") and w.dim() > 1]
    no_decay = [w for arg, w in weights.items()
                if names[arg].endswith(".bias") or w.dim() <= 1]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(groups, lr=args.lr, momentum=args.sgd_momentum)
    else:
        opt = torch.optim.AdamW(groups, lr=args.lr,
                                betas=(args.beta1, args.beta2), eps=args.eps)
    stream = read_tokens(args.data)
    b = args.micro_batch_size
    gb = args.global_batch_size or b
    if gb % b:
        raise SystemExit("global batch size must be a multiple of the micro batch")
    nmb = gb // b
    for it in range(1, args.steps + 1):
        margins.clear()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(nmb):
            gs = [(it - 1) * gb + m * b + i for i in range(b)]
            tok, lab = sample_batch(stream, seq, gs)
            loss = forward(torch.from_numpy(tok), torch.from_numpy(lab))
            (loss / nmb).backward()
            total += loss.item()
        grad_norm = None
        if args.clip_grad > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(
                list(weights.values()), args.clip_grad))
        opt.step()
        record = {"step": it, "loss": total / nmb}
        if grad_norm is not None:
            record["grad_norm"] = grad_norm
        if args.log_params_norm:
            with torch.no_grad():
                record["params_norm"] = math.sqrt(sum(
                    float(w.double().pow(2).sum()) for w in weights.values()))
        if margins:
            # The smallest margin of the step's discrete decisions (router
            # top-k, capacity drops): how far the data is from a near-tie
            # that another summation order could decide the other way.
            record["min_decision_margin"] = min(margins)
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
