#!/usr/bin/env python3
"""Scores a tessera-export'ed ONNX model in onnxruntime.

Usage: onnx_loss.py --model FILE.onnx --data PREFIX --iteration N --seq S
           --micro-batch-size B --global-batch-size G
           [--metrics tessera.jsonl --rtol 1e-5]

Runs FILE.onnx (onnxruntime, CPU) on Tessera's iteration N batch, drawn as
tessera-run draws it (see hf_loss.py): the graph's first input gets the
tokens [B, S], a second input the labels (the next tokens). The loss is
the mean over the microbatches of the token-mean cross entropy of the
graph's logits output [B, S, V] (computed here in float64, as Tessera's
loss is defined), or, for a graph without logits, its scalar loss output
(which must then be that same loss of the labels it is given). Prints
{"step": N, "loss": l}; with --metrics, compares l with the loss
tessera-run logged at iteration N (the weights exported after N - 1 steps,
the same batch) and prints OK within --rtol, else fails.
"""
import argparse
import json
import os
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(__file__))
from logged_loss import add_arguments, check  # noqa: E402
from torch_reference import read_tokens, sample_batch  # noqa: E402


def cross_entropy(logits, labels):
    """Token-mean cross entropy of [B, S, V] logits, in float64."""
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(z)), labels.reshape(-1)].mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    args = ap.parse_args()
    options = ort.SessionOptions()
    # Tessera computes in f32 without fused approximations; so does the
    # graph as written.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(args.model, options,
                                   providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    outputs = session.get_outputs()
    logits_at = next((i for i, o in enumerate(outputs) if len(o.shape) == 3), None)
    loss_at = next((i for i, o in enumerate(outputs) if len(o.shape) == 0), None)
    if logits_at is None and loss_at is None:
        sys.exit(f"{args.model}: no logits [B, S, V] or scalar loss output")
    stream = read_tokens(args.data)
    b, g = args.micro_batch_size, args.global_batch_size
    first = (args.iteration - 1) * g
    losses = []
    for m in range(g // b):
        gs = range(first + m * b, first + (m + 1) * b)
        tokens, labels = sample_batch(stream, args.seq, gs)  # [S, B]
        feed = {}
        for i, (inp, value) in enumerate(zip(inputs, (tokens.T, labels.T))):
            dtype = np.int32 if inp.type == "tensor(int32)" else np.int64
            feed[inp.name] = np.ascontiguousarray(value).astype(dtype)
        out = session.run(None, feed)
        if logits_at is not None:
            losses.append(cross_entropy(out[logits_at], labels.T))
        else:
            losses.append(float(out[loss_at]))
    loss = float(np.mean(losses))
    print(json.dumps({"step": args.iteration, "loss": loss}))
    if args.metrics:
        check(args.metrics, args.iteration, loss, args.rtol, "onnxruntime")


if __name__ == "__main__":
    main()
