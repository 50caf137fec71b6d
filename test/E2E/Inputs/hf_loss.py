#!/usr/bin/env python3
"""Scores a tessera-export'ed model in Hugging Face transformers.

Usage: hf_loss.py --model DIR --data PREFIX --iteration N --seq S
           --micro-batch-size B --global-batch-size G
           [--metrics tessera.jsonl --rtol 1e-5]

Loads DIR with transformers' AutoModelForCausalLM.from_pretrained (float32)
and computes the loss of Tessera's iteration N batch: the mean over its
microbatches of the token-mean cross entropy, samples drawn as tessera-run
draws them (sample g = (N - 1) G + m B + i, the S + 1 tokens of the token
stream from (g S) mod (T - S); see torch_reference.py). Prints {"step": N,
"loss": l}. With --metrics, compares l with the loss tessera-run logged at
iteration N (computed with the weights of the checkpoint exported after
N - 1 steps: the same batch, not yet trained on) and prints OK when they
agree within --rtol, else fails.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from logged_loss import add_arguments, check  # noqa: E402
from torch_reference import read_tokens, sample_batch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, torch_dtype=torch.float32)
    model.eval()
    stream = read_tokens(args.data)
    b, g = args.micro_batch_size, args.global_batch_size
    first = (args.iteration - 1) * g
    losses = []
    with torch.no_grad():
        for m in range(g // b):
            gs = range(first + m * b, first + (m + 1) * b)
            tokens, labels = sample_batch(stream, args.seq, gs)  # [S, B]
            ids = torch.from_numpy(np.ascontiguousarray(tokens.T))
            logits = model(input_ids=ids).logits  # [B, S, V]
            target = torch.from_numpy(np.ascontiguousarray(labels.T))
            losses.append(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).double(),
                target.reshape(-1)).item())
    loss = float(np.mean(losses))
    print(json.dumps({"step": args.iteration, "loss": loss,
                      "architecture": type(model).__name__}))
    if args.metrics:
        check(args.metrics, args.iteration, loss, args.rtol, "transformers")


if __name__ == "__main__":
    main()
