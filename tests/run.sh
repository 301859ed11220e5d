#!/usr/bin/env bash
# Run every test: the C test programs in $BUILD/tests and the scripts tests/*.sh
# (except this one). Each prints "PASS name" / "FAIL name" lines; a program that
# crashes or exits non-zero without a FAIL line counts as one failure.
# Closing line: "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD
# under the sanitizers (10-20x slower) the acceptance-profile replay uses 2 of its prompts
if [ "${SAN:-0}" = 1 ]; then export TD_PROFILE_PROMPTS=${TD_PROFILE_PROMPTS:-2}; fi
pass=0; fail=0; failed_names=()
run_one() {
  local name=$1; shift
  local log; log=$(mktemp)
  "$@" >"$log" 2>&1; local rc=$?
  local p f; p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
  cat "$log"
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $name (exit status $rc)"; f=1
  fi
  pass=$((pass + p)); fail=$((fail + f))
  [ "$f" -gt 0 ] && failed_names+=("$name")
  rm -f "$log"
}
# npm packages some tests use as oracles (pinned, into .cache/npm)
if ! bash scripts/test-deps; then echo "FAIL test-deps (npm install of the test oracles failed)"; fail=$((fail + 1)); fi
for t in "$BUILD"/tests/*; do
  [ -x "$t" ] || continue
  echo "== $(basename "$t")"
  run_one "$(basename "$t")" "$t"
done
# the exactness tests again with the kernels forced to every other path this
# machine supports (a subset: TD_TEST_QUICK=1); their lines say which path
paths=$(TD_KERNELS= "$BUILD"/testtools/kernel_paths) || { echo "FAIL kernel_paths"; fail=$((fail + 1)); paths=""; }
echo "== kernel paths: $paths (default first)"
for p in ${paths#* }; do
  [ "$p" = "${paths%% *}" ] && continue
  for t in test_forward test_conformance test_spec; do
    [ -x "$BUILD/tests/$t" ] || continue
    echo "== $t (TD_KERNELS=$p)"
    run_one "$t[$p]" bash -c 'set -o pipefail; TD_KERNELS=$1 TD_TEST_QUICK=1 "$2" | sed -E "s/^(PASS|FAIL) (.*)/\1 \2 [$1]/"' _ "$p" "$BUILD/tests/$t"
  done
done
for s in tests/*.sh; do
  [ "$(basename "$s")" = run.sh ] && continue
  echo "== $(basename "$s")"
  run_one "$(basename "$s")" bash "$s"
done
[ ${#failed_names[@]} -gt 0 ] && echo "failing: ${failed_names[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
