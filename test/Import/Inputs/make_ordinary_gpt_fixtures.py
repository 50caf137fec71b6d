#!/usr/bin/env python3
"""Exports a GPT written the way PyTorch users write one, not for Tessera.

Usage: make_ordinary_gpt_fixtures.py --data PREFIX [--out DIR] [--steps 10]

Needs torch 2.9 with onnx and onnxscript 0.7 (as make_hf_onnx_fixtures.py);
--data is the indexed dataset tessera-preprocess makes from
examples/data/northanger_abbey_vol1.txt. The exports are committed; the
tests need none of these packages.

The model is the common single-file GPT (as nanoGPT and many tutorials
write it): a causal-mask buffer registered at the full context (64) and
sliced to the sequence (32), compared with 0 and applied with masked_fill;
q, k, v split from one c_attn projection; dropout modules of rate 0;
LayerNorm and linear layers without biases (bias=False); exact GELU; the LM
head tied to the token embedding by assigning the weight; and a forward
that returns (logits, loss), the loss F.cross_entropy(..., ignore_index=-1)
over targets the data loader shifted. Written to DIR:
  gpt.dynamo18.onnx        torch.onnx.export(dynamo=True, opset 18)
  gpt.torchscript17.onnx   torch.onnx.export(dynamo=False, opset 17,
                           training mode, constant folding on)
  gpt-last.dynamo18.onnx   the same model without targets: the logits of the
                           last position only (x[:, [-1], :]), which
                           Tessera cannot train (an error test)
  gpt.torch.jsonl          PyTorch's loss and gradient norm over --steps
                           AdamW steps on tessera-run's samples (Megatron's
                           groups, clipping at 1.0), the parity reference
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "E2E", "Inputs"))
from torch_reference import read_tokens, sample_batch  # noqa: E402

VOCAB, BLOCK, SEQ, EMBD, HEADS, LAYERS = 257, 64, 32, 64, 4, 2
MICRO, GLOBAL, SEED = 2, 8, 1234


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD, bias=False)
        self.c_proj = nn.Linear(EMBD, EMBD, bias=False)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK))
                             .view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(EMBD, dim=2)
        q = q.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        k = k.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        v = v.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBD, bias=False)
        self.attn = SelfAttention()
        self.ln_2 = nn.LayerNorm(EMBD, bias=False)
        self.c_fc = nn.Linear(EMBD, 4 * EMBD, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * EMBD, EMBD, bias=False)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.dropout(self.c_proj(self.gelu(self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, EMBD), wpe=nn.Embedding(BLOCK, EMBD),
            drop=nn.Dropout(0.0), h=nn.ModuleList([Block() for _ in range(LAYERS)]),
            ln_f=nn.LayerNorm(EMBD, bias=False)))
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :])  # inference: the last position
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "ordinary-gpt"))
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(SEED)
    model = GPT()
    stream = read_tokens(args.data)

    def batches(step):
        out = []
        for m in range(GLOBAL // MICRO):
            gs = [(step - 1) * GLOBAL + m * MICRO + i for i in range(MICRO)]
            tokens, labels = sample_batch(stream, SEQ, gs)  # [S, B]
            out.append((torch.from_numpy(np.ascontiguousarray(tokens.T)),
                        torch.from_numpy(np.ascontiguousarray(labels.T))))
        return out

    ids, targets = batches(1)[0]
    path = os.path.join(args.out, "gpt.dynamo18.onnx")
    torch.onnx.export(model, (ids, targets), path, dynamo=True, external_data=False,
                      input_names=["idx", "targets"], opset_version=18)
    path = os.path.join(args.out, "gpt.torchscript17.onnx")
    torch.onnx.export(model, (ids, targets), path, dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING,
                      input_names=["idx", "targets"])
    path = os.path.join(args.out, "gpt-last.dynamo18.onnx")
    torch.onnx.export(model, (ids,), path, dynamo=True, external_data=False,
                      input_names=["idx"], opset_version=18)

    # The reference: Megatron's AdamW groups (no decay on 1-D parameters),
    # clipping at 1.0, each microbatch's loss its mean, scaled by
    # 1/microbatches.
    named = list(model.named_parameters())
    decay = [p for _, p in named if p.ndim > 1]
    no_decay = [p for _, p in named if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    with open(os.path.join(args.out, "gpt.torch.jsonl"), "w") as f:
        for step in range(1, args.steps + 1):
            opt.zero_grad()
            total = 0.0
            for x, y in batches(step):
                loss = model(x, y)[1] / (GLOBAL // MICRO)
                loss.backward()
                total += loss.item()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            f.write(json.dumps({"step": step, "loss": total,
                                "grad_norm": float(norm)}) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
