#!/usr/bin/env bash
# Speculative decoding benchmark: every drafter against plain decoding on the
# held-out code prompts, batch 1 and 8, plus random-token prompts (nothing to
# predict: the cost of speculation that cannot pay). One JSON object per line
# (tandem bench spec --json), written to stdout.
#   bench/spec.sh [LIMIT] [TOKENS] [REPS] [REPS8]   (defaults 20 prompts, 128 tokens, 2 reps
#   at batch 1 and 8 at batch 8: plain and speculative runs alternate, the fastest of REPS
#   counts per piece, and speedup_paired_median is the median of the per-repetition ratios)
set -euo pipefail
cd "$(dirname "$0")/.."
T=build/tandem
LIMIT=${1:-20}
N=${2:-128}
REPS=${3:-2}
REPS8=${4:-8}
M=models/tiny-code
for B in 1 8; do
  for d in ngram model:$M/draft model:$M/draft,vocab=1024 model:$M/draft,vocab=1024,quant=q8_0 \
           model:$M/draft,vocab=1024,quant=q8_0,lookup=3 model:$M/draft,vocab=1024,lookup=3 mtp:$M/mtp,vocab=1024 \
           mtp:$M/mtp,vocab=1024,quant=q8_0 mtp:$M/mtp,vocab=1024,quant=q8_0,lookup=3 mtp:$M/mtp,vocab=1024,lookup=3 block:$M/block block:$M/block,vocab=1024 block:$M/block,vocab=1024,quant=q8_0 \
           block:$M/block,vocab=1024,quant=q8_0,lookup=3 block:$M/block,vocab=1024,lookup=3; do
    $T bench spec -m $M/target --prompts bench/prompts/code.jsonl --limit "$LIMIT" -n "$N" --batch "$B" --draft "$d" --reps "$([ "$B" = 1 ] && echo "$REPS" || echo "$REPS8")" --json
  done
done
for d in ngram model:$M/draft,vocab=1024,lookup=3 mtp:$M/mtp,vocab=1024,quant=q8_0 block:$M/block,vocab=1024; do
  $T bench spec -m $M/target --random "$LIMIT" -n "$N" --batch 1 --draft "$d" --reps "$REPS" --json
done
