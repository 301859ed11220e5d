#!/bin/bash
# Stage 1 on the GPU machine (device tool), from the repository root:
#   timeout 560 bash tools/train/stage1.sh        (run with timeout_s 600)
# 1. random-weight conformance fixtures (CPU, background)   -> $OUT/fixtures.tar.gz
# 2. corpus, manifest, bench prompts, tokenizer, target      -> $OUT/stage1_small.tar.gz
#    (everything but the weight shards) + $OUT/model-0000N-of-0000M.safetensors
# Logs: $OUT/stage1.log.  STAGE_SECONDS (default 530) is the internal wall-clock budget.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
T0=$(date +%s)
export STAGE_DEADLINE=$((T0 + ${STAGE_SECONDS:-530}))
export OUT=${OUT:-/tmp/stage1_out}
WORK=/tmp/tandem_stage1
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK/fixtures"
cd "$(dirname "$0")"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; python3 -c 'import sys,torch,transformers,tokenizers;print(sys.version,torch.__version__,transformers.__version__,tokenizers.__version__)'; nproc; } 2>&1 | tee "$OUT/stage1.log"
( python3 make_rand_fixtures.py "$WORK/fixtures" > "$WORK/fixtures/fixtures.log" 2>&1; echo "rc=$?" >> "$WORK/fixtures/fixtures.log"
  tar -C "$WORK" -czf "$OUT/fixtures.tar.gz" fixtures ) &
FIXPID=$!
python3 stage1_main.py "$WORK" 2>&1 | tee -a "$OUT/stage1.log"
wait $FIXPID
cat "$WORK/fixtures/fixtures.log" >> "$OUT/stage1.log"
cp "$WORK"/target/model-*.safetensors "$OUT"/ 2>/dev/null
(cd "$WORK" && ls -la target >> "$OUT/stage1.log" 2>&1)
tar -C "$WORK" -czf "$OUT/stage1_small.tar.gz" --exclude='model-*.safetensors' manifest.json code.jsonl tokenizer target target_metrics.json 2>>"$OUT/stage1.log"
ls -la "$OUT" | tee -a "$OUT/stage1.log"
echo "stage1.sh finished in $(( $(date +%s) - T0 ))s" | tee -a "$OUT/stage1.log"
