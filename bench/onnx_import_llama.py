#!/usr/bin/env python3
"""ONNX import at Llama 3 8B's width: speed and memory per layer.

Exports transformers' LlamaForCausalLM with Llama 3 8B's layer shapes
(hidden 4096, 32 heads in 8 key/value groups, FFN 14336, rope_theta
500000, untied output layer) and 1, 2 and 4 layers, random f32 weights,
with torch 2's TorchScript exporter (opset 18, the weights as ONNX external
data: each model is over protobuf's 2 GiB). The vocabulary is 32000, not
Llama 3's 128256, so that the largest export and its exporter fit in this
machine's 24 GiB: the layers, whose count the benchmark varies, are 8B's.
Then times, each as a fresh process under GNU time:
  - tessera-translate --import-onnx --no-weights (graph, folding, raising),
  - tessera-compile --tp 8 --sequence-parallel (sequence 2048, as exported: import
    with the weights referenced in the external-data file, the training
    pipeline, the artifact),
and prints one JSON object: per layer count the export seconds and bytes,
each tool's wall seconds and peak resident memory (MiB), and the seconds
and MiB each layer adds (from the last two points: the 1-layer export,
1.95 GB, is under 2 GiB and stores its weights inline, the others as
external data, which the import references instead of reading). A benchmark, not
a test: nothing is asserted. Needs .venv (scripts/install-python.sh):
run it with .venv/bin/python.

usage: .venv/bin/python bench/onnx_import_llama.py [--build build]
           [--layers 1,2,4] [--vocab 32000]
"""
import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_import import timed  # noqa: E402


def export(path, layers, vocab):
    """The TorchScript export of an 8B-wide Llama's loss; returns seconds."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()

    class WithLoss(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, labels):
            return self.m(input_ids=input_ids, labels=labels, use_cache=False).loss

    ids = torch.randint(0, vocab, (1, 2048))
    start = time.time()
    with torch.no_grad():
        torch.onnx.export(WithLoss(model), (ids, ids.clone()), path, dynamo=False,
                          do_constant_folding=False, opset_version=18,
                          input_names=["input_ids", "labels"])
    del model
    return round(time.time() - start, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--layers", default="1,2,4")
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print(json.dumps({"benchmark": "onnx_import_llama",
                          "skipped": "needs .venv (torch 2, transformers)"}))
        return 0
    bindir = os.path.join(args.build, "bin")
    result = {"benchmark": "onnx_import_llama",
              "shape": {"hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336,
                        "vocab": args.vocab, "seq": 2048, "tp": 8},
              "points": []}
    for layers in [int(x) for x in args.layers.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            onnx = os.path.join(tmp, "llama.onnx")
            point = {"layers": layers, "export_s": export(onnx, layers, args.vocab)}
            point["onnx_bytes"] = sum(os.path.getsize(os.path.join(tmp, f))
                                      for f in os.listdir(tmp))
            wall, rss = timed([os.path.join(bindir, "tessera-translate"),
                               "--import-onnx", onnx, "--no-weights", "-o", os.devnull])
            point["translate_no_weights"] = {"wall_s": wall, "peak_rss_mib": rss}
            tsr = os.path.join(tmp, "llama.tsr")
            wall, rss = timed([os.path.join(bindir, "tessera-compile"), onnx,
                               "--tp", "8",
                               "--sequence-parallel", "--micro-batch-size", "1",
                               "--global-batch-size", "8", "-o", tsr])
            point["compile_tp8"] = {"wall_s": wall, "peak_rss_mib": rss,
                                    "artifact_bytes": os.path.getsize(tsr)}
            result["points"].append(point)
    pts = result["points"]
    if len(pts) >= 2:
        a, b = pts[-2], pts[-1]
        dl = b["layers"] - a["layers"]
        result["per_layer"] = {
            tool: {"wall_s": round((b[tool]["wall_s"] - a[tool]["wall_s"]) / dl, 3),
                   "peak_rss_mib": round((b[tool]["peak_rss_mib"] -
                                          a[tool]["peak_rss_mib"]) / dl, 1)}
            for tool in ("translate_no_weights", "compile_tp8")}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
