#!/bin/bash
# Stage 2 on the GPU machine (device tool), from the repository root, with the committed
# models/tiny-code/target and bench/prompts/code.jsonl in the tree:
#   timeout 570 bash tools/train/stage2.sh        (run with timeout_s 600)
# 1. target reference fixtures (CPU float32, background)      -> tests/fixtures/tiny-code/{logits.*,greedy.json}
# 2. draft distillation + acceptance profile + f32 losses (GPU) -> models/tiny-code/draft,
#    tests/fixtures/tiny-code/acceptance_profile.json, draft_metrics.json
# Results: $OUT/stage2_small.tar.gz (everything but the draft's weight shards), $OUT/model-*.safetensors,
# log $OUT/stage2.log.  STAGE_SECONDS (default 540) is the internal wall-clock budget.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
T0=$(date +%s)
export STAGE_DEADLINE=$((T0 + ${STAGE_SECONDS:-540}))
export OUT=${OUT:-/tmp/stage2_out}
WORK=/tmp/tandem_stage2
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK/fixtures/tiny-code"
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | tee "$OUT/stage2.log"
( python3 target_fixtures.py ../../models/tiny-code/target ../../bench/prompts/code.jsonl "$WORK/fixtures/tiny-code" \
    > "$WORK/target_fixtures.log" 2>&1; echo "rc=$?" >> "$WORK/target_fixtures.log" ) &
FIXPID=$!
python3 stage2_main.py "$WORK" 2>&1 | tee -a "$OUT/stage2.log"
wait $FIXPID
cat "$WORK/target_fixtures.log" >> "$OUT/stage2.log"
cp "$WORK"/draft/model*.safetensors "$OUT"/ 2>/dev/null
tar -C "$WORK" -czf "$OUT/stage2_small.tar.gz" --exclude='model*.safetensors' draft fixtures draft_metrics.json target_fixtures.log 2>>"$OUT/stage2.log"
ls -la "$OUT" "$WORK/draft" | tee -a "$OUT/stage2.log"
echo "stage2.sh finished in $(( $(date +%s) - T0 ))s" | tee -a "$OUT/stage2.log"
