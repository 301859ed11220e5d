#!/bin/bash
# Stage 3 on the GPU machine (device tool), from the repository root, with the committed
# models/tiny-code/target and bench/prompts/code.jsonl in the tree:
#   STAGE_SECONDS=380 timeout 410 bash tools/train/stage3.sh      (run with timeout_s ~420)
# Trains the MTP head (tools/train/mtp.py) on the frozen target, then computes in float32 the checks,
# validation metrics and the speculative reference fixture.  Everything lands directly in $OUT:
#   config.json, model.safetensors      -> models/tiny-code/mtp/
#   ref.json, logits.f32                 -> tests/fixtures/tiny-code-mtp/
#   metrics.json, stage3.log             -> models/tiny-code/mtp/ (training record)
# STAGE_SECONDS (default 380) is the internal wall-clock budget; STAGE3_POST_S (default 70) the part
# of it kept after training for saving, evaluation and the fixture.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
T0=$(date +%s)
export STAGE_DEADLINE=$((T0 + ${STAGE_SECONDS:-380}))
export OUT=${OUT:-/tmp/stage3_out}
WORK=/tmp/tandem_stage3
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK"
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | tee "$OUT/stage3.log"
python3 stage3_main.py "$WORK" 2>&1 | tee -a "$OUT/stage3.log"
ls -la "$OUT" | tee -a "$OUT/stage3.log"
echo "stage3.sh finished in $(( $(date +%s) - T0 ))s" | tee -a "$OUT/stage3.log"
