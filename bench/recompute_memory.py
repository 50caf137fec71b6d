#!/usr/bin/env python3
"""Activation memory per transformer layer, Tessera against Korthikanti et al.

"Reducing Activation Recomputation in Large Transformer Models" (2022)
counts the bytes a GPT layer keeps for its backward with 16-bit
activations and 1-byte dropout masks (Table 2):

  no recompute   sbh(34 + 5as/h)          tp t: sbh(10 + 24/t + 5as/(ht))
                                           tp t + sequence parallel: that / t
  selective      34 sbh                    tp t: sbh(10 + 24/t);  + sp: 34 sbh/t
  full           2 sbh                     + sp: 2 sbh / t

For each configuration this compiles the same GPT with L and 4L layers
(tessera-gen gpt -> tessera-compile --emit=memory) and takes rank 0's
peak activation bytes: their difference over 3L is what one layer keeps
across the backward. (Over 3L rather than L: a packing of values of
mixed sizes, as bf16 activations and their f32 copies are, that leaves
holes would move the peak from one layer count to the next; the memory
plan's greedy-by-size pass now closes them.) It prints the paper's
figure, the figure the paper's accounting gives for Tessera's choices,
and the measured one.

Tessera's choices, which the "expected" column applies to the paper's terms:
- activations are fp32 (4 bytes; also under --bf16 alone, where only
  parameters and GEMM operands are 16-bit), so each 2-byte term doubles;
  with --activations-dtype bf16 (this script's --activations bf16: it
  compiles with --bf16 --activations-dtype bf16) they are 2 bytes as in
  the paper;
- dropout keeps no mask: it is regenerated from the counter-based RNG in
  the backward (the paper's two sbh mask terms are 0);
- nn.attention keeps no s x s scores, softmax or dropout output: its
  backward recomputes them from the QKV projection (the paper's 5as/h term
  is 0, with or without selective recompute);
- under sequence parallelism, without recompute, the all-gathered inputs of
  the QKV and fc1 weight gradients are kept whole (selective recompute
  gathers the shard again in the backward, as Megatron always does), so
  "none" there is expected above the paper's accounting;
- full recompute keeps each layer's input, in the activation dtype.

A benchmark, not a test: nothing is asserted. Prints one JSON object.

usage: bench/recompute_memory.py [--build build] [--hidden 512] [--heads 8]
           [--seq 512] [--micro-batch 2] [--layers 2] [--tp 2]
           [--activations f32|bf16]
"""
import argparse
import json
import os
import subprocess
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1"],
}


def paper_bytes(kind, s, b, h, a, t, sp):
    """Korthikanti et al., Table 2: bytes per layer, 16-bit activations."""
    sbh = s * b * h
    attn = 5 * a * s / h
    if kind == "full":
        return 2 * sbh / (t if sp else 1)
    if kind == "selective":
        attn = 0.0
    if sp:
        return sbh * (34 + attn) / t
    return sbh * (10 + 24 / t + attn / t)


def expected_bytes(kind, s, b, h, a, t, sp, width):
    """The paper's accounting for Tessera: `width`-byte activations (the
    paper's terms are 2-byte), no masks, no s x s term."""
    sbh = s * b * h
    scale = width / 2
    if kind == "full":
        return scale * 2 * sbh / (t if sp else 1)
    # 34 = 10 replicated (2 of them masks) + 24 split.
    if sp:
        return scale * sbh * (34 - 2) / t
    return scale * sbh * (10 - 2 + 24 / t)


def peak_activations(bindir, tmp, layers, args, tp, sp, kind):
    model = os.path.join(tmp, f"gpt{layers}.mlir")
    if not os.path.exists(model):
        subprocess.run([os.path.join(bindir, "tessera-gen"), "gpt",
                        "--layers", str(layers), "--hidden", str(args.hidden),
                        "--heads", str(args.heads), "--vocab", "1024",
                        "--seq", str(args.seq), "--dropout", "0.1", "-o", model],
                       check=True)
    cmd = [os.path.join(bindir, "tessera-compile"), model,
           "--micro-batch-size", str(args.micro_batch),
           "--global-batch-size", str(args.micro_batch), "--tp", str(tp),
           "--emit=memory"] + RECOMPUTE[kind]
    if args.activations == "bf16":
        cmd += ["--bf16", "--activations-dtype", "bf16"]
    if sp:
        cmd.append("--sequence-parallel")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ranks"][0]["peak_activations"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2,
                    help="L: the per-layer bytes are (peak(4L) - peak(L)) / 3L")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--activations", choices=("f32", "bf16"), default="f32",
                    help="bf16: compile with --bf16 --activations-dtype bf16")
    args = ap.parse_args()
    width = 2 if args.activations == "bf16" else 4
    bindir = os.path.join(args.build, "bin")
    s, b, h, a = args.seq, args.micro_batch, args.hidden, args.heads
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tp, sp in [(1, False), (args.tp, False), (args.tp, True)]:
            for kind in ("none", "selective", "full"):
                lo = peak_activations(bindir, tmp, args.layers, args, tp, sp, kind)
                hi = peak_activations(bindir, tmp, 4 * args.layers, args, tp, sp,
                                      kind)
                measured = (hi - lo) / (3 * args.layers)
                paper = paper_bytes(kind, s, b, h, a, tp, sp)
                expected = expected_bytes(kind, s, b, h, a, tp, sp, width)
                rows.append({
                    "tp": tp, "sequence_parallel": sp, "recompute": kind,
                    "paper_bytes_per_layer": round(paper),
                    "paper_sbh": round(paper / (s * b * h), 3),
                    "expected_bytes_per_layer": round(expected),
                    "measured_bytes_per_layer": round(measured),
                    "measured_sbh": round(measured / (s * b * h), 3),
                    "measured_over_expected": round(measured / expected, 4),
                })
    print(json.dumps({"activations": args.activations,
                      "model": {"hidden": h, "heads": a, "seq": s,
                                "micro_batch": b, "layers": [args.layers,
                                                             4 * args.layers]},
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
