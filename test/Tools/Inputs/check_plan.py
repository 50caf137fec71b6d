"""Checks a tessera-plan JSON report against the planner's promises:
ranked fastest first, every layout fits the cluster's usable memory, the
ranks' GPUs multiply to the cluster, the compiled memory of the verified
layouts within --max-fit-error of the prediction, and --where constraints
(key=value) hold for every layout; for a model with experts, ep divides
them and ep x etp divides tp x cp x dp (the expert layout folds onto the
same ranks). Prints OK and the first layout's flags."""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("report")
ap.add_argument("--cluster", required=True)
ap.add_argument("--max-fit-error", type=float, default=0.15)
ap.add_argument("--where", action="append", default=[])
args = ap.parse_args()
r = json.load(open(args.report))
c = json.load(open(args.cluster))
usable = c["memory_gib"] * c.get("usable_memory_fraction", 0.9)
ranked = r["ranked"]
assert ranked, "no layout"
times = [x["step_seconds"] for x in ranked]
assert times == sorted(times), f"not fastest first: {times}"
for x in ranked:
    assert x["memory_gib"] <= usable, f"{x['memory_gib']} GiB > {usable}"
    gpus = x["tp"] * x["cp"] * x["pp"] * x["dp"]
    assert gpus == r["gpus"], f"layout of {gpus} GPUs on {r['gpus']}"
    if "ep" in x:
        experts = r["model"]["experts"]
        assert experts % x["ep"] == 0, f"ep {x['ep']} of {experts} experts"
        dense = x["tp"] * x["cp"] * x["dp"]
        assert dense % (x["ep"] * x["etp"]) == 0, f"ep x etp on {dense}: {x}"
        assert x["etp"] in (1, x["tp"]), x
    if "compiled_memory_gib" in x:
        assert abs(x["memory_fit_error"]) <= args.max_fit_error, x
    for w in args.where:
        k, v = w.split("=")
        assert str(x[k]).lower() == v, f"{k} = {x[k]}, wanted {v}"
print("OK", ranked[0]["flags"])
