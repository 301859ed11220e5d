#!/bin/bash
# Stage 5 on the GPU machine (device tool), from the repository root, with the committed
# models/tiny-code/target and bench/prompts/code.jsonl in the tree:
#   STAGE_SECONDS=500 timeout 540 bash tools/train/stage5.sh      (run with timeout_s ~560)
# Retrains the MTP head (tools/train/mtp.py, starting from the committed models/tiny-code/mtp) on the frozen
# target's greedy generations with its recursion unrolled 3 steps, then runs stage 3's float32 phase
# (checks, validation, reference fixture) on it. Everything lands in $OUT/mtp:
#   config.json, model.safetensors, metrics.json -> models/tiny-code/mtp/
#   ref.json, logits.f32                        -> tests/fixtures/tiny-code-mtp/
# STAGE_SECONDS (default 500) is the internal wall-clock budget; STAGE5_POST_S (default 80) the part
# kept after training; STAGE5_GEN_S (default 60) the time spent generating training sequences.
# stage5_main.py also reads STAGE5_K / STAGE5_WS (unrolled steps and their loss weights, default 3 and
# 1,0.8,0.6), STAGE5_LR, STAGE5_BSZ and STAGE5_DATA_SEED (see its header).
# Stage 4 and stage 5 fit together on one H200: run them side by side in one call.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
T0=$(date +%s)
export STAGE_DEADLINE=$((T0 + ${STAGE_SECONDS:-500}))
export OUT=${OUT:-/tmp/stage5_out}
WORK=/tmp/tandem_stage5
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK"
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | tee "$OUT/stage5.log"
python3 stage5_main.py "$WORK" 2>&1 | tee -a "$OUT/stage5.log"
ls -la "$OUT" "$OUT/mtp" | tee -a "$OUT/stage5.log"
echo "stage5.sh finished in $(( $(date +%s) - T0 ))s" | tee -a "$OUT/stage5.log"
