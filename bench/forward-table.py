#!/usr/bin/python3
"""forward-table — summarise `tandem bench forward --json` runs into the table of
bench/forward-notes.md. Usage: bench/forward-table.py LABEL=run1.json,run2.json ...
For each label, every metric takes its best value over the runs given (the
machine is shared: the best run is the least disturbed one); `typical` columns
are the bench's own median/total figures, `best` columns its single-forward minima."""
import json, sys

def best(runs, key, fn=max):
    vals = [r[key] for r in runs if key in r]
    return fn(vals) if vals else float("nan")

rows = []
for arg in sys.argv[1:]:
    label, files = arg.split("=", 1)
    runs = [json.load(open(f)) for f in files.split(",")]
    v = {t: min(r["verify_ms"][t] for r in runs) for t in ["1", "2", "4", "8", "16"]}
    vb = {t: min(r.get("verify_best_ms", r["verify_ms"])[t] for r in runs) for t in ["1", "2", "4", "8", "16"]}
    rows.append((label, runs[0]["threads"], best(runs, "bandwidth_gbs"), best(runs, "decode_tps"),
                 best(runs, "floor_fraction"), best(runs, "decode_best_ms", min), best(runs, "prefill_tps"),
                 best(runs, "prefill_best_tps"), v, vb, best(runs, "loadavg_before", min)))
print("| build | thr | bandwidth GB/s | decode tok/s | floor fraction | decode best ms | prefill tok/s (best) "
      "| verify ms T=1/2/4/8/16 (median) | verify best ms T=1/2/4/8/16 | T8/T1 | load |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (l, th, bw, dt, ff, db, pt, pb, v, vb, ld) in rows:
    vs = "/".join(f"{v[t]:.2f}" for t in v)
    vbs = "/".join(f"{vb[t]:.2f}" for t in vb)
    print(f"| {l} | {th} | {bw:.1f} | {dt:.1f} | {ff:.2f} | {db:.3f} | {pt:.0f} ({pb:.0f}) | {vs} | {vbs} "
          f"| {v['8'] / v['1']:.2f} ({vb['8'] / vb['1']:.2f}) | {ld:.1f} |")
