#!/usr/bin/env bash
# Install the npm packages the server tests use (the official `openai` client)
# into .cache/npm, pinned to an exact version, beside scripts/test-deps' packages.
# Idempotent: does nothing when the package is already there. Needs node + npm
# and the npm registry only when it has to install.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=.cache/npm
pkg=openai ver=6.49.0   # no dependencies; works on node >= 18 (global fetch)
f="$dir/node_modules/$pkg/package.json"
if [ -f "$f" ] && grep -q "\"version\": *\"$ver\"" "$f"; then exit 0; fi
command -v npm >/dev/null || { echo "tests/server/install-deps.sh: npm not found" >&2; exit 1; }
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name":"tandem-test-deps","private":true}' > "$dir/package.json"
echo "tests/server/install-deps.sh: installing $pkg@$ver into $dir" >&2
npm install --prefix "$dir" --no-audit --no-fund --save-exact --loglevel=error "$pkg@$ver" >&2
