#!/usr/bin/env python3
"""Writes ordinary-gpt/gpt-ext.torchscript17.onnx: gpt.torchscript17.onnx
with every tensor, the Constant nodes' values included, in one external-data
file (gpt-ext.torchscript17.onnx.data), as torch's TorchScript exporter
stores a model over 2 GiB. Needs the onnx package (.venv).
"""
import os

import onnx
from onnx.external_data_helper import convert_model_to_external_data

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ordinary-gpt")
model = onnx.load(os.path.join(HERE, "gpt.torchscript17.onnx"))
convert_model_to_external_data(model, all_tensors_to_one_file=True,
                               location="gpt-ext.torchscript17.onnx.data",
                               size_threshold=64, convert_attribute=True)
onnx.save_model(model, os.path.join(HERE, "gpt-ext.torchscript17.onnx"))
print("wrote", os.path.join(HERE, "gpt-ext.torchscript17.onnx"))
