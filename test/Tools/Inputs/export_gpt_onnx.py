"""Exports the Megatron-shaped GPT of test/Import/Inputs/make_onnx_fixtures.py
with --layers layers (tessera-plan needs at least 3) to an ONNX file, as
torch.onnx.export in training mode with the loss in the graph."""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "Import", "Inputs"))
from make_onnx_fixtures import megatron_gpt  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("output")
ap.add_argument("--layers", type=int, default=3)
args = ap.parse_args()
torch.manual_seed(0)
GPT, _ = megatron_gpt()
model = GPT(vocab=260, hidden=32, heads=4, layers=args.layers, seq=16, tied=False)
tokens = torch.randint(0, 260, (4, 16))
torch.onnx.export(model, (tokens, tokens), args.output, opset_version=17,
                  training=torch.onnx.TrainingMode.TRAINING,
                  do_constant_folding=False,
                  input_names=["input_ids", "labels"], output_names=["loss"])
