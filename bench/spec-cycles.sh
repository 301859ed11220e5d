#!/usr/bin/env bash
# Compare drafters on a machine whose speed drifts: run them in CYCLES cycles, each
# cycle running every drafter once (tandem bench spec --reps REPS, plain and
# speculative runs alternating inside), the order rotating from cycle to cycle, so
# every drafter meets the machine's slow and fast minutes alike. One JSON object
# per run goes to OUT (each with its "cycle"); the summary printed at the end gives
# per drafter the median of all its paired repetitions (plain seconds / speculative
# seconds, taken back to back) and whether every run was exact.
#   bench/spec-cycles.sh OUT CYCLES BATCH REPS DRAFTER...
#   e.g. bench/spec-cycles.sh /tmp/c.jsonl 3 1 2 model:models/tiny-code/draft,vocab=1024,lookup=3 ngram
# Environment: LIMIT (prompts, default 20), TOKENS (default 128), SPEC_ARGS (more
# options for tandem bench spec, e.g. "--act-type amx"; the summary keys runs by
# drafter and act_type).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 5 ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
OUT=$1 CYCLES=$2 BATCH=$3 REPS=$4
shift 4
n=$#
for c in $(seq 1 "$CYCLES"); do
  for k in $(seq 0 $((n - 1))); do
    i=$(( (k + c) % n + 1 ))
    d=${!i}
    build/tandem bench spec -m models/tiny-code/target --prompts bench/prompts/code.jsonl --limit "${LIMIT:-20}" \
      -n "${TOKENS:-128}" --batch "$BATCH" --reps "$REPS" --draft "$d" ${SPEC_ARGS:-} --json |
      tail -n 1 | python3 -c 'import json, sys; j = json.loads(sys.stdin.read()); j["cycle"] = int(sys.argv[1]); print(json.dumps(j))' "$c" >> "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import collections, json, statistics, sys
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    if line.strip():
        j = json.loads(line)
        key = j["drafter"] + ("" if j.get("act_type", "f32") == "f32" else " (act " + j["act_type"] + ")")
        runs.setdefault(key, []).append(j)
print("| drafter | batch | runs | paired median | pairs (min-max) | mean accepted | exact |")
print("|---|---|---|---|---|---|---|")
for d, v in runs.items():
    pairs = [x for j in v for x in j["rep_speedups"]]
    print(f"| {d} | {v[0]['batch']} | {len(v)} | {statistics.median(pairs):.3f} | {min(pairs):.2f}-{max(pairs):.2f} "
          f"| {statistics.mean(j['mean_accepted'] for j in v):.2f} | {all(j['exact'] for j in v)} |")
PY
