#!/usr/bin/env python3
"""Frequency ranking of a target model's own output tokens, for draft vocabularies.

A drafter's `vocab=N` option keeps N token ids in its LM head.  Without a ranking
file those are ids 0..N-1 (byte-level BPE ids in merge order, a proxy for corpus
frequency).  This script samples the target itself (tandem run, temperature 1,
distinct seeds) from a fixed list of neutral Python openers written here — no
corpus, no benchmark prompt — counts the ids it emits, and writes
DIR/draft_vocab.json:
    {"ranked_ids": [all ids, most frequent first; unseen ids follow in id order],
     "method": "...", "samples": K, "tokens": T}
so that `vocab=N` keeps the N ids the target emits most.

usage: tools/draftvocab/rank.py --target models/tiny-code/target --out DIR [DIR...]
       [--samples K] [--tokens N] [--tandem build/tandem]
"""
import argparse
import json
import os
import subprocess
import sys

OPENERS = [
    "import os\n", "import sys\n", "from typing import", "def ", "class ", "# ", '"""', "    def __init__(self",
    "    return ", "if __name__ == \"__main__\":\n", "for i in range(", "with open(", "try:\n    ", "raise ",
    "@property\n    def ", "self.", "assert ", "async def ", "from . import ", "import numpy as np\n",
    "def test_", "    if not ", "elif ", "lambda x: ", "while True:\n", "yield ", "print(", "x = [",
    "return {", "logger = logging.getLogger(", "__all__ = [", "    @staticmethod\n",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", nargs="+", required=True)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--tandem", default="build/tandem")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.target, "config.json")))
    V = int(cfg["vocab_size"])
    counts = [0] * V
    total = 0
    for s in range(a.samples):
        p = OPENERS[s % len(OPENERS)]
        r = subprocess.run([a.tandem, "run", "-m", a.target, "-p", p, "-n", str(a.tokens), "--temp", "1",
                            "--seed", str(1000 + s), "--ids", "--draft", "none", "--ignore-eos"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
        line = next((l for l in r.stderr.splitlines() if l.startswith("ids:")), None)
        if line is None:
            sys.exit(f"rank.py: no 'ids:' line from tandem run (sample {s})")
        for t in line.split()[1:]:
            counts[int(t)] += 1
            total += 1
    ranked = sorted(range(V), key=lambda i: (-counts[i], i))
    doc = {"ranked_ids": ranked,
           "method": f"ids emitted by {os.path.normpath(a.target)} sampled at temperature 1 from "
                     f"{len(OPENERS)} fixed Python openers (tools/draftvocab/rank.py), most frequent first; "
                     "unseen ids in id order",
           "samples": a.samples, "tokens": total, "distinct": sum(1 for c in counts if c)}
    for d in a.out:
        with open(os.path.join(d, "draft_vocab.json"), "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
    print(f"rank.py: {total} tokens, {doc['distinct']} distinct ids; wrote draft_vocab.json in {', '.join(a.out)}")


if __name__ == "__main__":
    main()
