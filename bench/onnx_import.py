#!/usr/bin/env python3
"""Import speed and memory of the ONNX frontend on a GPT-2-small-sized model.

Exports the Megatron-shaped GPT of test/Import/Inputs/make_onnx_fixtures.py
(tied embeddings, loss in the graph) with Debian's python3-torch at the given
size (default GPT-2 small: vocab 50257, hidden 768, 12 heads, 12 layers, seq
1024, about 124M parameters, 0.5 GB of inline weights), then times, each
as a fresh process under GNU time:
  - tessera-translate --import-onnx (the printed IR holds the weights as
    hex: the printer's cost is part of it),
  - tessera-compile at tp1 and tp2 (import, the training pipeline,
    serialisation of the weights into the artifact),
and prints one JSON object: wall seconds and peak resident memory (MiB)
per run, the ONNX and artifact sizes. Prints {"skipped": ...} where torch
is not installed. A benchmark, not a test: nothing is asserted.

usage: bench/onnx_import.py [--build build] [--vocab 50257] [--hidden 768]
           [--heads 12] [--layers 12] [--seq 1024]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def timed(cmd):
    """Wall seconds and peak RSS (MiB) of `cmd`, run under GNU time."""
    out = subprocess.run(["/usr/bin/time", "-f", "%e %M"] + cmd,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    wall, kib = out.stderr.strip().splitlines()[-1].split()
    return float(wall), round(int(kib) / 1024, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print(json.dumps({"benchmark": "onnx_import",
                          "skipped": "PyTorch is not installed"}))
        return 0
    sys.path.insert(0, os.path.join(REPO, "test", "Import", "Inputs"))
    from make_onnx_fixtures import megatron_gpt
    GPT, _ = megatron_gpt()
    torch.manual_seed(1234)
    model = GPT(args.vocab, args.hidden, args.heads, args.layers, args.seq, True)
    params = sum(p.numel() for p in model.parameters())
    bindir = os.path.join(args.build, "bin")
    result = {"benchmark": "onnx_import",
              "model": {"vocab": args.vocab, "hidden": args.hidden,
                        "heads": args.heads, "layers": args.layers,
                        "seq": args.seq, "tied": True, "params": params},
              "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        onnx = os.path.join(tmp, "gpt.onnx")
        ids = torch.randint(0, args.vocab, (1, args.seq))
        start = time.time()
        torch.onnx.export(model, (ids, ids), onnx, opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False,
                          input_names=["input_ids", "labels"])
        result["export_s"] = round(time.time() - start, 2)
        result["onnx_bytes"] = os.path.getsize(onnx)
        wall, rss = timed([os.path.join(bindir, "tessera-translate"),
                           "--import-onnx", onnx, "-o", os.devnull])
        result["runs"].append({"tool": "tessera-translate --import-onnx",
                               "wall_s": wall, "peak_rss_mib": rss})
        for tp in (1, 2):
            tsr = os.path.join(tmp, f"gpt-tp{tp}.tsr")
            wall, rss = timed([os.path.join(bindir, "tessera-compile"), onnx,
                               "--tp", str(tp), "--micro-batch-size", "1",
                               "--global-batch-size", "1",
                               "--make-vocab-size-divisible-by", "1",
                               "-o", tsr])
            result["runs"].append({"tool": f"tessera-compile --tp {tp}",
                                   "wall_s": wall, "peak_rss_mib": rss,
                                   "artifact_bytes": os.path.getsize(tsr)})
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
