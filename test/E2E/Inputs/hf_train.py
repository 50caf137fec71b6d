#!/usr/bin/env python3
"""Trains a tessera-export'ed model in Hugging Face transformers.

Usage: hf_train.py --model DIR --data PREFIX --steps N --seq S
           --micro-batch-size B --global-batch-size G [--lr 1e-3]
           [--beta1 0.9] [--beta2 0.999] [--eps 1e-8] [--weight-decay 0.01]
           [--clip-grad 1.0] [--float64]

The independent reference for Tessera's Llama family: transformers' own
model class (LlamaForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM,
GPT2LMHeadModel), loaded with AutoModelForCausalLM.from_pretrained from the
export of Tessera's initial weights (`tessera-run --steps 0 --save` then
tessera-export), trained on the samples tessera-run draws (see
torch_reference.py) with what tessera-compile's defaults are, Megatron-LM's:
torch.optim.AdamW on two parameter groups (weight decay on matrices, none
on biases and 1-D parameters), gradients accumulated over the microbatches
with weight 1/num_microbatches, clipped to the global norm --clip-grad with
torch.nn.utils.clip_grad_norm_. Prints one JSON line per step, {"step": i,
"loss": l, "grad_norm": n}, tessera-run's --metrics format (compare them
with compare_losses.py).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from torch_reference import read_tokens, sample_batch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--micro-batch-size", type=int, required=True)
    ap.add_argument("--global-batch-size", type=int, required=True)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--float64", action="store_true",
                    help="compute in float64 (the reference of the "
                         "reference)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    dtype = torch.float64 if args.float64 else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, torch_dtype=dtype, attn_implementation="eager")
    model.train()
    # Megatron's get_param_groups: no decay on biases and 1-D parameters.
    named = list(model.named_parameters())
    decay = [p for n, p in named if not n.endswith(".bias") and p.dim() > 1]
    no_decay = [p for n, p in named if n.endswith(".bias") or p.dim() <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    # Mixtral's routers: each step's smallest margin between the k-th and
    # the (k+1)-th routing probability, as torch_reference.py reports it
    # (compare_losses.py --min-decision-margin): a near-tie another
    # summation order could decide the other way.
    margins = []
    topk = getattr(model.config, "num_experts_per_tok", 0)

    def router_margin(module, inputs, logits):
        probs = torch.softmax(logits.detach().double(), dim=-1)
        top = torch.topk(probs, topk + 1, dim=-1).values
        margins.append(float((top[:, topk - 1] - top[:, topk]).min()))

    for name, module in model.named_modules():
        if name.endswith("block_sparse_moe.gate"):
            module.register_forward_hook(router_margin)
    stream = read_tokens(args.data)
    b, g = args.micro_batch_size, args.global_batch_size
    nmb = g // b
    for it in range(1, args.steps + 1):
        margins.clear()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(nmb):
            gs = range((it - 1) * g + m * b, (it - 1) * g + (m + 1) * b)
            tokens, labels = sample_batch(stream, args.seq, gs)  # [S, B]
            ids = torch.from_numpy(np.ascontiguousarray(tokens.T))
            target = torch.from_numpy(np.ascontiguousarray(labels.T))
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            (loss / nmb).backward()
            total += loss.item()
        record = {"step": it, "loss": total / nmb}
        if args.clip_grad > 0:
            record["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(
                model.parameters(), args.clip_grad))
        opt.step()
        if margins:
            record["min_decision_margin"] = min(margins)
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
