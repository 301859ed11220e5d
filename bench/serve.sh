#!/usr/bin/env bash
# bench/serve.sh — throughput and p50/p99 inter-token latency of `tandem serve`
# at 1, 4 and 16 concurrent streaming clients, with and without speculation
# (per request, in the same server and run; plain and speculative phases
# alternate --reps times each). Prints one JSON object.
#   bench/serve.sh [--conc 1,4,16] [--requests N] [--max-tokens N] [--prompt-chars N] [--reps R] [-- SERVE OPTIONS...]
# Serve options default to: --draft ngram --max-rows 16 (the bundled model).
# Not run by tests.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${BUILD:-build}/tandem
bench_args=(); serve_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; serve_args=("$@"); break; fi
  bench_args+=("$1"); shift
done
[ ${#serve_args[@]} -gt 0 ] || serve_args=(--draft ngram --max-rows 16)
log=$(mktemp)
$T serve --port 0 "${serve_args[@]}" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
url=
for _ in $(seq 1 600); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1 || true)
  [ -n "$url" ] && curl -sf "$url/health" >/dev/null && break
  kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
node bench/serve.mjs "$url" "${bench_args[@]}"
