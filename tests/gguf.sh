#!/usr/bin/env bash
# gguf — GGUF files written by `tandem quantize` read by an independent parser,
# and the CLI around them:
#   - @huggingface/gguf (pinned in scripts/test-deps) reads the same metadata and
#     tensor table as tandem (tests/gguf_oracle.mjs vs `gguf_tool dump`), for the
#     bundled target in bf16 / q8_0 / q4_0 (tokenizer arrays included), the
#     Llama 3 fixture (rope_freqs) and the f16 Qwen3 fixture;
#   - `tandem run -m FILE.gguf` generates the same greedy ids as from the
#     Hugging Face directory; `tandem inspect` describes a GGUF;
#   - bad arguments and files exit non-zero with a message.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
tandem=$BUILD/tandem tool=$BUILD/testtools/gguf_tool
if ! bash scripts/test-deps; then echo "FAIL gguf_oracle (scripts/test-deps failed)"; exit 1; fi
[ -x "$tool" ] || { echo "FAIL gguf_oracle ($tool not built)"; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

conv() { # conv SRC OUT TYPE
  if ! "$tandem" quantize "$1" "$work/$2" --type "$3" 2>"$work/q.log"; then
    echo "FAIL gguf_quantize_$2"; sed 's/^/  /' "$work/q.log"; return 1
  fi
}
for spec in "models/tiny-code/target target-bf16.gguf bf16" "models/tiny-code/target target-q8_0.gguf q8_0" \
            "models/tiny-code/target target-q4_0.gguf q4_0" "tests/fixtures/llama-rand llama-rand.gguf f32" \
            "tests/fixtures/qwen3-rand-f16 qwen3-rand-f16.gguf f16"; do
  set -- $spec
  conv "$1" "$2" "$3" || continue
  if "$tool" dump "$work/$2" >"$work/$2.json" 2>"$work/d.log"; then
    node tests/gguf_oracle.mjs "$work/$2" "$work/$2.json" 2>&1 || echo "FAIL gguf_oracle_$2 (node exited $?)"
  else
    echo "FAIL gguf_oracle_$2 (dump failed: $(head -1 "$work/d.log"))"
  fi
done

# the same greedy ids from the GGUF as from the directory
a=$("$tandem" run -m models/tiny-code/target -p 'def quicksort(xs):' -n 24 --draft none --ids 2>&1 >/dev/null | grep '^ids:')
b=$("$tandem" run -m "$work/target-bf16.gguf" -p 'def quicksort(xs):' -n 24 --draft none --ids 2>&1 >/dev/null | grep '^ids:')
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS gguf_cli_run_same_ids"; else echo "FAIL gguf_cli_run_same_ids"; echo "  dir:  $a"; echo "  gguf: $b"; fi
mkdir "$work/onedir" && cp "$work/llama-rand.gguf" "$work/onedir/"
if "$tandem" inspect "$work/onedir" 2>&1 | grep -q 'GGUF v3, 22 tensors'; then echo "PASS gguf_cli_inspect_dir"; else echo "FAIL gguf_cli_inspect_dir"; fi

# errors
check_err() { # name expected-substring command...
  local name=$1 want=$2; shift 2
  local out; out=$("$@" 2>&1); local rc=$?
  if [ "$rc" -ne 0 ] && grep -qF -- "$want" <<<"$out"; then echo "PASS $name"; else echo "FAIL $name (exit $rc: $out)"; fi
}
check_err gguf_cli_bad_type 'unknown type "q3"' "$tandem" quantize tests/fixtures/llama-rand "$work/x.gguf" --type q3
check_err gguf_cli_missing_out 'needs IN and OUT' "$tandem" quantize tests/fixtures/llama-rand
[ -e "$work/x.gguf" ] || [ -e "$work/x.gguf.tmp" ] && echo "FAIL gguf_cli_no_partial_output" || echo "PASS gguf_cli_no_partial_output"
head -c 1000 "$work/llama-rand.gguf" >"$work/trunc.gguf"
# where the cut falls depends on the header's length: inside a string or another field
out=$("$tandem" inspect "$work/trunc.gguf" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] && grep -qE 'past the end of the file|the file has [0-9]+ left \(truncated\?\)' <<<"$out"; then
  echo "PASS gguf_cli_truncated"; else echo "FAIL gguf_cli_truncated (exit $rc: $out)"; fi
printf 'GGUF\3\0\0\0' >"$work/short.gguf"
check_err gguf_cli_short 'too short for a GGUF header' "$tandem" inspect "$work/short.gguf"
