#!/usr/bin/env bash
# CLI behaviour: help on every command, clear errors with non-zero exits, and
# that `tandem run` streams the same tokens with and without a drafter.
set -u
cd "$(dirname "$0")/.."
T=${BUILD:-build}/tandem
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name" "command failed: $*"; fi; }

for c in run inspect "bench spec"; do
  out=$($T $c --help 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -q usage && ok "cli_help_${c// /_}" || bad "cli_help_${c// /_}" "rc=$rc"
done
$T --help | grep -q 'commands' && ok cli_help_main || bad cli_help_main "no command list"

# errors: non-zero exit and a message naming the problem
out=$($T run -p x -m /nonexistent 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q nonexistent && ok cli_err_missing_model || bad cli_err_missing_model "rc=$rc: $out"
out=$($T run 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q 'prompt' && ok cli_err_no_prompt || bad cli_err_no_prompt "rc=$rc: $out"
out=$($T run -p x --temp abc 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q -- '--temp' && ok cli_err_bad_number || bad cli_err_bad_number "rc=$rc: $out"
out=$($T run -p x --bogus 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q -- '--bogus' && ok cli_err_unknown_option || bad cli_err_unknown_option "rc=$rc: $out"
out=$($T run -p x --draft telepathy 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q 'unknown drafter' && ok cli_err_unknown_drafter || bad cli_err_unknown_drafter "rc=$rc: $out"
for c in "run -p x" "bench forward" "bench spec --random 1" "serve"; do
  out=$($T $c --kv-type fp8 2>&1); rc=$?
  n=cli_err_kv_type_$(echo "$c" | awk '{print $1 ($1 == "bench" ? "_" $2 : "")}')
  [ $rc -eq 2 ] && echo "$out" | grep -q -- "--kv-type: 'fp8' is not auto, f32, bf16, f16 or q8_0" && ok "$n" || bad "$n" "rc=$rc: $out"
  out=$($T $c --act-type f16 2>&1); rc=$?
  n=cli_err_act_type_$(echo "$c" | awk '{print $1 ($1 == "bench" ? "_" $2 : "")}')
  [ $rc -eq 2 ] && echo "$out" | grep -q -- "--act-type: 'f16' is not f32, bf16, amx or auto" && ok "$n" || bad "$n" "rc=$rc: $out"
done
out=$($T frobnicate 2>&1); rc=$?
[ $rc -ne 0 ] && ok cli_err_unknown_command || bad cli_err_unknown_command "rc=$rc"

M=models/tiny-code/target
if [ -f $M/config.json ]; then
  out=$($T inspect $M 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -q Qwen3ForCausalLM && ok cli_inspect || bad cli_inspect "rc=$rc"
  # the same ids with and without speculation, greedy and seeded sampling
  for s in "--temp 0" "--temp 0.8 --seed 7 --top-p 0.95"; do
    a=$($T run -m $M -p 'import os
def main(' -n 48 $s --draft none --ids 2>&1 >/dev/null | grep '^ids:')
    b=$($T run -m $M -p 'import os
def main(' -n 48 $s --draft ngram --fixed-depth --draft-depth 4 --ids 2>&1 >/dev/null | grep '^ids:')
    name="cli_run_spec_equals_plain_${s// /_}"
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "$name" || bad "$name" "plain [$a] spec [$b]"
  done
  # --kv-type bf16: the bundled drafter (a model drafter, whose cache follows) still gives plain's ids
  a=$($T run -m $M -p 'def main(' -n 32 --kv-type bf16 --draft none --ids 2>&1 >/dev/null | grep '^ids:')
  b=$($T run -m $M -p 'def main(' -n 32 --kv-type bf16 --draft model:models/tiny-code/draft --fixed-depth --draft-depth 4 --ids 2>&1 >/dev/null | grep '^ids:')
  [ -n "$a" ] && [ "$a" = "$b" ] && ok cli_run_kv_bf16_spec_equals_plain || bad cli_run_kv_bf16_spec_equals_plain "plain [$a] spec [$b]"
  # --kv-type q8_0 (head_dim 64: two blocks a row): the same, the draft model's cache q8_0 too
  a=$($T run -m $M -p 'def main(' -n 32 --kv-type q8_0 --draft none --ids 2>&1 >/dev/null | grep '^ids:')
  b=$($T run -m $M -p 'def main(' -n 32 --kv-type q8_0 --draft model:models/tiny-code/draft --fixed-depth --draft-depth 4 --ids 2>&1 >/dev/null | grep '^ids:')
  [ -n "$a" ] && [ "$a" = "$b" ] && ok cli_run_kv_q8_0_spec_equals_plain || bad cli_run_kv_q8_0_spec_equals_plain "plain [$a] spec [$b]"
  # --act-type bf16: the bundled drafter (its model follows the mode) still gives plain's ids
  a=$($T run -m $M -p 'def main(' -n 32 --act-type bf16 --draft none --ids 2>&1 >/dev/null | grep '^ids:')
  b=$($T run -m $M -p 'def main(' -n 32 --act-type bf16 --draft model:models/tiny-code/draft --fixed-depth --draft-depth 4 --ids 2>&1 >/dev/null | grep '^ids:')
  [ -n "$a" ] && [ "$a" = "$b" ] && ok cli_run_act_bf16_spec_equals_plain || bad cli_run_act_bf16_spec_equals_plain "plain [$a] spec [$b]"
  # --act-type amx: where the CPU has the tiles, the block drafter (its bf16 products on them too)
  # gives plain's ids; where it has none, run refuses the type, naming AMX
  a=$($T run -m $M -p 'def main(' -n 32 --act-type amx --draft none --ids 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ]; then
    a=$(echo "$a" | grep '^ids:')
    b=$($T run -m $M -p 'def main(' -n 32 --act-type amx --draft block:models/tiny-code/block --fixed-depth --draft-depth 4 --ids 2>&1 >/dev/null | grep '^ids:')
    [ -n "$a" ] && [ "$a" = "$b" ] && ok cli_run_act_amx_spec_equals_plain || bad cli_run_act_amx_spec_equals_plain "plain [$a] spec [$b]"
    # with a bf16 cache the target's and the draft model's attention run on the tiles as well
    a=$($T run -m $M -p 'def main(' -n 32 --act-type amx --kv-type bf16 --draft none --ids 2>&1 >/dev/null | grep '^ids:')
    b=$($T run -m $M -p 'def main(' -n 32 --act-type amx --kv-type bf16 --draft model:models/tiny-code/draft --fixed-depth --draft-depth 4 --ids 2>&1 >/dev/null | grep '^ids:')
    [ -n "$a" ] && [ "$a" = "$b" ] && ok cli_run_act_amx_kv_bf16_spec_equals_plain || bad cli_run_act_amx_kv_bf16_spec_equals_plain "plain [$a] spec [$b]"
  else
    echo "$a" | grep -q 'AMX' && ok cli_run_act_amx_refused_without_tiles || bad cli_run_act_amx_refused_without_tiles "rc=$rc: $a"
  fi
  # --act-type auto runs everywhere (amx where the tiles are, else bf16 where vdpbf16ps is native, else
  # f32), and a drafter whose matrices are Q8_0 (R16 products over their repacks in bf16 and amx modes)
  # still gives plain's ids
  a=$($T run -m $M -p 'def main(' -n 32 --act-type auto --draft none --ids 2>&1 >/dev/null | grep '^ids:')
  b=$($T run -m $M -p 'def main(' -n 32 --act-type auto --draft block:models/tiny-code/block,quant=q8_0 --fixed-depth --draft-depth 4 --ids 2>&1 >/dev/null | grep '^ids:')
  [ -n "$a" ] && [ "$a" = "$b" ] && ok cli_run_act_auto_q8_drafter_spec_equals_plain || bad cli_run_act_auto_q8_drafter_spec_equals_plain "plain [$a] spec [$b]"
  out=$($T bench forward -m $M --kv-type f16 --bw-mib 16 --json 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -q '"kv_type": "f16"' && ok cli_bench_forward_kv_type || bad cli_bench_forward_kv_type "rc=$rc: $out"
  # --kv-type auto (the default): bf16 under act amx (attention on the tiles) and under act bf16 on CPUs
  # with AVX-512 BF16, f32 otherwise
  out=$($T bench forward -m $M --bw-mib 16 --json 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -q '"kv_type": "f32"' && ok cli_bench_forward_kv_auto_f32 || bad cli_bench_forward_kv_auto_f32 "rc=$rc: $out"
  out=$($T bench forward -m $M --act-type auto --kv-type auto --bw-mib 16 --json 2>&1); rc=$?
  if echo "$out" | grep -q '"act_type": "f32"'; then want=f32; else want=bf16; fi
  [ $rc -eq 0 ] && echo "$out" | grep -q "\"kv_type\": \"$want\"" && ok cli_bench_forward_kv_auto_follows_act || bad cli_bench_forward_kv_auto_follows_act "rc=$rc want $want: $out"
  # under act bf16: a bf16 cache where the CPU runs bf16 natively (auto is not f32 there), else f32 (on
  # AVX2 a bf16 cache's attention would be the C emulation of the A32 order)
  out=$($T bench forward -m $M --act-type bf16 --bw-mib 16 --json 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -q '"act_type": "bf16"' && ok cli_bench_forward_act_type || bad cli_bench_forward_act_type "rc=$rc: $out"
  echo "$out" | grep -q "\"kv_type\": \"$want\"" && ok cli_bench_forward_kv_auto_under_act_bf16 || bad cli_bench_forward_kv_auto_under_act_bf16 "want $want: $out"
  # --reps 2: one paired bandwidth and floor fraction per repetition, 9 T=8/T=1 pairs per repetition;
  # the paired fraction is the median of the per-repetition ones, each the floor at that
  # repetition's bandwidth over its decode time (checked against the JSON's own figures)
  out=$($T bench forward -m $M --bw-mib 16 --reps 2 --json 2>&1); rc=$?
  if [ $rc -eq 0 ] && echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
bw, ff = d["paired_bandwidth_gbs"], d["paired_floor_fraction"]
assert len(bw) == len(ff) == 2 and min(bw) > 0 and min(ff) > 0, d
assert abs(d["floor_fraction_paired"] - sorted(ff)[0] / 2 - sorted(ff)[1] / 2) < 1e-3, d
assert d["decode_ms"] > 0 and d["verify_ratio_8_1_paired"] > 0, d
# the interleaved decode repeats the first one token for token (else the command fails)
assert d["interleaved_tokens_equal"] is True and d["floor_fraction_interleaved"] > 0, d
# the floor takes the faster of the plain and the prefetching read, and says which
pl, pf = d["bandwidth_plain_gbs"], d["bandwidth_prefetch_gbs"]
assert min(pl, pf) > 0 and abs(d["bandwidth_gbs"] - max(pl, pf)) < 1e-3 * max(pl, pf), d
assert d["bandwidth_read"] == ("prefetch" if pf > pl else "plain"), d
# a repetition at the run-level bandwidth and best decode would give floor_fraction
assert abs(d["floor_ms"] - d["weight_bytes"] / d["bandwidth_gbs"] / 1e6) < 1e-3 * d["floor_ms"], d'; then ok cli_bench_forward_paired; else bad cli_bench_forward_paired "rc=$rc: $out"; fi
  out=$($T run -m $M -p 'def f(x):' -n 64 --stop 'return' 2>/dev/null); rc=$?
  [ $rc -eq 0 ] && ! echo "$out" | grep -q 'return' && ok cli_run_stop_string || bad cli_run_stop_string "rc=$rc: $out"
  out=$($T run -m $M -p 'hello' -n 8 --chat 2>&1); rc=$?
  [ $rc -eq 0 ] && ok cli_run_chat || bad cli_run_chat "rc=$rc: $out"
  # bench spec: interleaved reps; the JSON says the speculative tokens equal the plain ones
  out=$($T bench spec -m $M --prompts bench/prompts/code.jsonl --limit 2 -n 24 --draft ngram --reps 2 --json 2>&1); rc=$?
  if [ $rc -eq 0 ] && echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["reps"] == 2 and d["exact"] is True, d
assert d["plain_tokens"] == d["spec_tokens"] == 48, d
assert d["plain_tps"] > 0 and d["spec_tps"] > 0 and d["rounds"] > 0, d'; then ok cli_bench_spec_reps_json; else bad cli_bench_spec_reps_json "rc=$rc: $out"; fi
else
  bad cli_bundled_model "models/tiny-code/target is missing"
fi
