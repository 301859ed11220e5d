#!/bin/bash
# Stage 4 on the GPU machine (device tool), from the repository root, with the committed
# models/tiny-code/target and bench/prompts/code.jsonl in the tree:
#   STAGE_SECONDS=500 timeout 540 bash tools/train/stage4.sh      (run with timeout_s ~560)
# Trains the block drafter (tools/train/block.py) on the frozen target's greedy generations and on corpus
# text labelled with the target's own greedy tokens (two layer counts side by side, STAGE4_LAYERS), picks
# one on validation replays, calibrates its pruning thresholds, then computes in float32 the validation and
# benchmark-prompt replays (against the MTP head) and the reference fixture.
# Everything lands directly in $OUT:
#   block/config.json, block/model.safetensors -> models/tiny-code/block/
#   ref.json, logits.f32                         -> tests/fixtures/tiny-code-block/
#   metrics.json, stage4.log                     -> models/tiny-code/block/ (training record)
#   alt.tar                                      the variant not chosen (not committed)
# STAGE_SECONDS (default 500) is the internal wall-clock budget; STAGE4_POST_S (default 150) the part
# kept after training; STAGE4_GEN_S (default 80) the time spent generating training sequences.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
T0=$(date +%s)
export STAGE_DEADLINE=$((T0 + ${STAGE_SECONDS:-500}))
export OUT=${OUT:-/tmp/stage4_out}
WORK=/tmp/tandem_stage4
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK"
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | tee "$OUT/stage4.log"
python3 stage4_main.py "$WORK" 2>&1 | tee -a "$OUT/stage4.log"
ls -la "$OUT" "$OUT/block" | tee -a "$OUT/stage4.log"
echo "stage4.sh finished in $(( $(date +%s) - T0 ))s" | tee -a "$OUT/stage4.log"
