#!/usr/bin/python3
"""spec-table — print the markdown table of a `bench/spec.sh` run (one JSON object
per line, as `tandem bench spec --json` prints them) for notes and issues.
Usage: bench/spec-table.py bench/results/spec.jsonl"""
import json, sys

print("| drafter | batch | prompts | plain tok/s | spec tok/s | speedup | paired median | mean accepted | tokens/round | exact |")
print("|---|---|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    d = json.loads(line)
    kind = "random" if d.get("prompt_source") == "random" else "code"
    tpr = d["spec_tokens"] / d["rounds"] if d["rounds"] else 0.0
    pm = f"{d['speedup_paired_median']:.2f}" if "speedup_paired_median" in d else "-"  # runs before it existed
    print(f"| {d['drafter']} | {d['batch']} | {kind} | {d['plain_tps']:.0f} | {d['spec_tps']:.0f} | "
          f"{d['speedup']:.2f} | {pm} | {d['mean_accepted']:.2f} | {tpr:.2f} | {d['exact']} |")
