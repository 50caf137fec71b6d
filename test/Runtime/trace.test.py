import json
import sys

d = json.load(open(sys.argv[1]))
ev = [e for e in d["traceEvents"] if e["ph"] == "X"]
print("ranks", sorted({e["pid"] for e in ev}))
print("tracks", sorted({e["cat"] for e in ev}))
r0 = [e for e in ev if e["pid"] == 0]
print("rank 0 phases", [e["name"] for e in sorted(r0, key=lambda e: e["ts"]) if e["cat"] == "phase"])
print("rank 0 communication", {e["name"] for e in r0 if e["cat"] == "communication"})
print("rank 0 compute includes Gemm", any(e["name"] == "Gemm" for e in r0 if e["cat"] == "compute"))
# Instructions of one rank never overlap and start after the epoch.
ok = True
for rank in range(4):
    ins = sorted((e for e in ev if e["pid"] == rank and e["cat"] != "phase"), key=lambda e: e["ts"])
    ok &= all(e["ts"] >= 0 and e["dur"] >= 0 for e in ins)
    ok &= all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(ins, ins[1:]))
print("ordered", ok)
phases = [e for e in ev if e["pid"] == 0 and e["cat"] == "phase"]
inside = all(any(p["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= p["ts"] + p["dur"] + 1e-3 for p in phases)
             for e in r0 if e["cat"] != "phase")
print("inside phases", inside)
