#!/usr/bin/env python3
"""Hugging Face checkpoints in: speed and memory at Llama 3 8B's width.

Writes Hugging Face model directories of Llama 3 8B's shape (hidden 4096,
32 heads in 8 key/value groups, FFN 14336, vocabulary 128256, untied
output layer, rope_theta 500000) with 1, 2 and 4 layers of random bf16
weights (safetensors, as save_pretrained writes them; about 2.1 GB for the
embeddings and 0.44 GB a layer), then times, each as a fresh process under
GNU time, `tessera-compile DIR --seq-length 8192 --tp 8 --sequence-parallel
-o model.tsr`: config.json to the model, the weights converted to
Megatron's layouts in f32 into model.tsr.weights, the training pipeline
and the artifact. Prints one JSON object: per layer count the wall seconds,
the peak resident memory (MiB), the safetensors and converted bytes, and
the seconds and MiB each layer adds. A benchmark, not a test: nothing is
asserted. Needs .venv (scripts/install-python.sh).

usage: bench/hf_import.py [--build build] [--layers 1,2,4]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_import import timed  # noqa: E402

MAKE = r"""
import json, sys, torch
from safetensors.torch import save_file
out, layers = sys.argv[1], int(sys.argv[2])
H, F, V, heads, groups, d = 4096, 14336, 128256, 32, 8, 128
g = torch.Generator().manual_seed(0)
def w(*shape):
    return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
t = {"model.embed_tokens.weight": w(V, H), "lm_head.weight": w(V, H),
     "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}
for i in range(layers):
    p = f"model.layers.{i}."
    t[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    t[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    t[p + "self_attn.q_proj.weight"] = w(heads * d, H)
    t[p + "self_attn.k_proj.weight"] = w(groups * d, H)
    t[p + "self_attn.v_proj.weight"] = w(groups * d, H)
    t[p + "self_attn.o_proj.weight"] = w(H, heads * d)
    t[p + "mlp.gate_proj.weight"] = w(F, H)
    t[p + "mlp.up_proj.weight"] = w(F, H)
    t[p + "mlp.down_proj.weight"] = w(H, F)
save_file(t, out + "/model.safetensors", metadata={"format": "pt"})
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "vocab_size": V, "hidden_size": H, "intermediate_size": F,
           "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": groups, "head_dim": d, "hidden_act": "silu",
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
           "rope_theta": 500000.0, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}, open(out + "/config.json", "w"))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--layers", default="1,2,4")
    args = ap.parse_args()
    python = os.path.join(REPO, ".venv", "bin", "python")
    if not os.path.exists(python):
        print(json.dumps({"benchmark": "hf_import",
                          "skipped": "no .venv (scripts/install-python.sh)"}))
        return
    compile_ = os.path.join(args.build, "bin", "tessera-compile")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in [int(x) for x in args.layers.split(",")]:
            model = os.path.join(tmp, f"llama-{layers}")
            os.makedirs(model)
            subprocess.run([python, "-c", MAKE, model, str(layers)], check=True)
            tsr = os.path.join(tmp, f"llama-{layers}.tsr")
            wall, rss = timed([compile_, model, "--seq-length", "8192",
                               "--tp", "8", "--sequence-parallel", "--bf16",
                               "--micro-batch-size", "1",
                               "--global-batch-size", "8", "-o", tsr])
            runs.append({"layers": layers, "wall_s": wall, "peak_rss_mib": rss,
                         "safetensors_bytes": os.path.getsize(
                             os.path.join(model, "model.safetensors")),
                         "converted_bytes": os.path.getsize(tsr + ".weights"),
                         "artifact_bytes": os.path.getsize(tsr)})
            for f in (os.path.join(model, "model.safetensors"),
                      tsr + ".weights"):
                os.remove(f)
    first, last = runs[0], runs[-1]
    span = last["layers"] - first["layers"]
    result = {"benchmark": "hf_import", "shape": "llama3-8b width",
              "runs": runs}
    if span > 0:
        result["per_layer_s"] = round((last["wall_s"] - first["wall_s"]) / span, 3)
        result["per_layer_rss_mib"] = round(
            (last["peak_rss_mib"] - first["peak_rss_mib"]) / span, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
