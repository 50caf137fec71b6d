#!/usr/bin/env python3
"""Writes the malformed opset-18 models of onnx-errors.test with the onnx package.

Usage: make_bad_onnx18.py OUT_DIR (the committed files are in onnx/bad/). Opset 18
is newer than Debian's onnx library, so its checker does not run on them: the
importer's own checks must catch what they get wrong.
"""
import os
import sys

import onnx
from onnx import helper, TensorProto

out = sys.argv[1]
# A stored type that its inputs contradict (opset 18: no onnx checker).
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
onnx.save(m, os.path.join(out, "wrong-value-info.onnx"))
# A Constant whose 'value' is an int, not a tensor.
c = helper.make_node("Constant", [], ["c"], name="const")
c.attribute.append(helper.make_attribute("value", 3))
z = helper.make_tensor_value_info("c", TensorProto.FLOAT, [])
g = helper.make_graph([c], "g", [], [z])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
onnx.save(m, os.path.join(out, "constant-kind.onnx"))
