"""The loss tessera-run logged for a batch, and the comparison with it.

Shared by the scripts that score Tessera's exports elsewhere (hf_loss.py in
transformers, onnx_loss.py in onnxruntime).
"""
import json
import sys


def add_arguments(ap):
    """The scoring scripts' arguments: the model, Tessera's batch (data,
    iteration, sequence, micro and global batch) and the comparison."""
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--iteration", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--micro-batch-size", type=int, required=True)
    ap.add_argument("--global-batch-size", type=int, required=True)
    ap.add_argument("--metrics")
    ap.add_argument("--rtol", type=float, default=1e-5)


def logged_loss(metrics, batch):
    """The loss of `batch` in a tessera-run --metrics file: training
    iteration `batch`'s (computed before its update), or an evaluation's of
    that batch (--eval-iters / --eval-only)."""
    logged = None
    for line in open(metrics):
        r = json.loads(line)
        if r.get("step") == batch:
            logged = r["loss"]
        for b in r.get("eval_batches", []):
            if b["batch"] == batch:
                logged = b["loss"]
    if logged is None:
        sys.exit(f"{metrics}: no loss of batch {batch}")
    return logged


def check(metrics, batch, loss, rtol, who):
    """Prints the comparison of `loss` (computed by `who`) with Tessera's
    and OK, or exits with FAIL when they differ by more than `rtol`."""
    logged = logged_loss(metrics, batch)
    diff = abs(loss - logged) / abs(logged)
    print(f"{who} {loss:.9g} tessera {logged:.9g} relative difference {diff:.3g}")
    if not diff <= rtol:
        sys.exit(f"FAIL: relative difference {diff:.3g} > {rtol}")
    print("OK")
