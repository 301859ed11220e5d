#!/usr/bin/env bash
# llamacpp — tandem against llama.cpp on the same GGUF file with the same threads,
# in the manner of issue #7's table: prefill tok/s (512-token prompt), decode
# tok/s at batch 1, and the cost of a forward of T = 8 new tokens against T = 1
# at context 512. llama.cpp is the prebuilt CPU build inside the npm package
# node-llama-cpp (pinned in scripts/test-deps; bench/llamacpp.mjs); tandem is
# `tandem bench forward -m FILE.gguf --json`.
#
#   bench/llamacpp.sh FILE.gguf [THREADS] [REPS] [OPTION...]   (defaults 2 and 3)
#
# OPTIONs go to tandem bench forward (e.g. --act-type amx); the summary names
# tandem's act_type.
#
# Prints three JSON lines: tandem's object, llama.cpp's, and a summary
# {"model", "threads", "load_avg", "tandem": {...}, "llamacpp": {...},
# "decode_ratio", "prefill_ratio"} (ratios tandem / llama.cpp). The two engines
# run one after the other, llama.cpp twice (before and after tandem, best kept),
# so slow drift of a shared machine's load weighs on both; note the load
# average with any figure.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/llamacpp.sh FILE.gguf [THREADS] [REPS]}
threads=${2:-2} reps=${3:-3}
bash scripts/test-deps llama >&2
[ -x build/tandem ] || make >&2
load0=$(cut -d' ' -f1 /proc/loadavg)
l1=$(node bench/llamacpp.mjs "$model" "$threads" "$reps")
td=$(build/tandem bench forward -m "$model" -t "$threads" --reps "$reps" "${@:4}" --json)
l2=$(node bench/llamacpp.mjs "$model" "$threads" "$reps")
load1=$(cut -d' ' -f1 /proc/loadavg)
echo "$td"
node -e '
  const [td, a, b, load0, load1, model, threads] = process.argv.slice(1);
  const t = JSON.parse(td), x = JSON.parse(a), y = JSON.parse(b);
  const best = { ...x, prefill_tps: Math.max(x.prefill_tps, y.prefill_tps), decode_tps: Math.max(x.decode_tps, y.decode_tps),
    verify_ms: Object.fromEntries(Object.keys(x.verify_ms).map((k) => [k, Math.min(x.verify_ms[k], y.verify_ms[k])])) };
  best.verify8_over_1 = +(best.verify_ms["8"] / best.verify_ms["1"]).toFixed(2);
  console.log(JSON.stringify(best));
  const tv = t.verify_ms || {};
  console.log(JSON.stringify({ model, threads: +threads, load_avg: [+load0, +load1],
    tandem: { act_type: t.act_type, prefill_tps: t.prefill_tps, decode_tps: t.decode_tps, verify_ms_1: tv["1"], verify_ms_8: tv["8"],
              verify8_over_1: tv["1"] ? +(tv["8"] / tv["1"]).toFixed(2) : null, floor_fraction: t.floor_fraction, bandwidth_gbs: t.bandwidth_gbs,
              floor_fraction_paired: t.floor_fraction_paired, floor_fraction_interleaved: t.floor_fraction_interleaved,
              verify8_over_1_paired: t.verify_ratio_8_1_paired },
    llamacpp: { prefill_tps: best.prefill_tps, decode_tps: best.decode_tps, verify_ms_1: best.verify_ms["1"], verify_ms_8: best.verify_ms["8"],
                verify8_over_1: best.verify8_over_1 },
    prefill_ratio: +(t.prefill_tps / best.prefill_tps).toFixed(2), decode_ratio: +(t.decode_tps / best.decode_tps).toFixed(2) }));
' "$td" "$l1" "$l2" "$load0" "$load1" "$model" "$threads"
