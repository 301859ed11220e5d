#!/usr/bin/env bash
# gguf_llamacpp — llama.cpp loads tandem's GGUF of the bundled target and
# generates the same greedy tokens as tandem (tests/llamacpp_greedy.mjs).
# llama.cpp is the prebuilt linux-x64 CPU build inside the npm package
# node-llama-cpp (pinned; `scripts/test-deps llama` installs it into
# .cache/npm-llama, nothing is built from source).
#   - f32 GGUF of the target (the bf16 weights, exactly): llama.cpp's f32 matmul
#     keeps f32 activations like tandem, so every greedy token must agree
#     (8 held-out prompts x 32 tokens), and llama.cpp's tokenization of each
#     prompt (from the GGUF's tokenizer metadata) must equal tandem's.
#   - bf16, q8_0, q5_0 and q5_1 GGUFs: llama.cpp rounds the activations of bf16 dot
#     products to bf16 (tandem keeps them f32); both quantize q8_0 activations
#     to 8-bit blocks, llama.cpp with f16 scales (tandem f32) and another
#     summation order (src/nn/quant.h), so a near-tie may break differently
#     (measured 2026-12-02: bf16 1 of 8 prompts differs from token 12 on, q8_0
#     0 of 8): only their tokenization is checked here.
#   - q4_k_m GGUF (tandem's own k-quant writer: Q4_K / Q6_K tensors, Q5_0 where
#     the target's rows of 384 are not whole super-blocks): llama.cpp must load
#     it (it checks every tensor's type and size) and tokenize alike; its k-quant
#     products quantize activations in blocks of 256, so greedy streams are not
#     compared either; iq4_xs, q3_k_m and q2_k likewise (IQ4_NL for the 384-wide rows)
#     (2026-12-03, 8 prompts x 32 tokens: q8_0 2 differ, q4_k_m
#     and q6_k 3, where tandem's q8_0 and k-quant streams agree). The decoded values themselves are compared bit for bit
#     with ggml's dequantizers in test_quant (kquant_ggml_dequantizers_agree).
#   - The other way round: the target's f32 GGUF quantized by llama.cpp's own
#     quantizer (llama_model_quantize in the package's prebuilt libllama, called by
#     tests/llamacpp_quantize.py) to Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_M, Q4_K_M,
#     Q5_K_M, Q6_K and IQ4_XS, with llama.cpp's own choice of tensor types and its
#     fallbacks for the 384-wide rows: tandem must load each file, generate 32
#     greedy tokens for every prompt, and tokenize as llama.cpp does. (2026-12-03:
#     tandem's and llama.cpp's 32-token streams were identical for 4-8 of the 8
#     prompts depending on the type, near ties breaking differently, as above.)
# Prints a SKIP line only when node-llama-cpp cannot be installed at all.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
tandem=$BUILD/tandem tool=$BUILD/testtools/gguf_tool
if ! command -v node >/dev/null || ! bash scripts/test-deps llama >/tmp/td_llama_deps.$$ 2>&1; then
  echo "SKIP gguf_llamacpp: node-llama-cpp could not be installed ($(tail -1 /tmp/td_llama_deps.$$ 2>/dev/null))"
  rm -f /tmp/td_llama_deps.$$; exit 0
fi
rm -f /tmp/td_llama_deps.$$
[ -x "$tool" ] || { echo "FAIL gguf_llamacpp ($tool not built)"; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
head -8 bench/prompts/code.jsonl | node -e '
  const lines = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean);
  for (const l of lines) console.log(JSON.stringify(JSON.parse(l).prompt.slice(-600)));' >"$work/prompts.jsonl"
for t in f32 bf16 q8_0 q5_0 q5_1 q4_k_m iq4_xs q3_k_m q2_k; do
  if ! "$tandem" quantize models/tiny-code/target "$work/target-$t.gguf" --type "$t" 2>"$work/q.log"; then
    echo "FAIL gguf_llamacpp_quantize_$t"; sed 's/^/  /' "$work/q.log"; continue
  fi
  n=0; [ "$t" = f32 ] && n=32
  if ! "$tool" greedy "$work/target-$t.gguf" $n "$work/prompts.jsonl" >"$work/$t.jsonl" 2>"$work/g.log"; then
    echo "FAIL gguf_llamacpp_greedy_$t (tandem: $(head -1 "$work/g.log"))"; continue
  fi
  node tests/llamacpp_greedy.mjs "$work/target-$t.gguf" "$work/$t.jsonl" "$t" >"$work/node.log" 2>&1
  rc=$?
  cat "$work/node.log"
  grep -q "gguf_llamacpp_tokenize_$t" "$work/node.log" || echo "FAIL gguf_llamacpp_$t (node exited $rc)"
done
# files made by llama.cpp's quantizer (FTYPE:name)
for ft in 2:q4_0 3:q4_1 8:q5_0 9:q5_1 7:q8_0 10:q2_k 12:q3_k_m 15:q4_k_m 17:q5_k_m 18:q6_k 30:iq4_xs; do
  n=${ft#*:} f="$work/llama-${ft#*:}.gguf"
  if ! python3 tests/llamacpp_quantize.py "$work/target-f32.gguf" "$f" "${ft%%:*}" >"$work/lq.log" 2>&1; then
    echo "FAIL gguf_llamacpp_file_$n (llama.cpp's quantizer: $(tail -1 "$work/lq.log"))"; continue
  fi
  if ! "$tool" greedy "$f" 32 "$work/prompts.jsonl" >"$work/ll-$n.jsonl" 2>"$work/g.log" ||
     [ "$(grep -c '"gen_ids":\[[0-9]' "$work/ll-$n.jsonl")" != 8 ]; then
    echo "FAIL gguf_llamacpp_file_$n (tandem: $(head -1 "$work/g.log"))"; continue
  fi
  node -e 'const fs = require("fs"); const [i, o] = process.argv.slice(1);
    fs.writeFileSync(o, fs.readFileSync(i, "utf8").split("\n").filter(Boolean)
      .map((l) => { const j = JSON.parse(l); j.gen_ids = []; return JSON.stringify(j); }).join("\n") + "\n");' \
    "$work/ll-$n.jsonl" "$work/ll-$n-tok.jsonl"
  node tests/llamacpp_greedy.mjs "$f" "$work/ll-$n-tok.jsonl" "llama_file_$n" >"$work/node.log" 2>&1
  if grep -q "^PASS gguf_llamacpp_tokenize_llama_file_$n" "$work/node.log"; then
    echo "PASS gguf_llamacpp_file_$n (made by llama.cpp's quantizer: tandem loads it, generates, tokenizes alike)"
  else
    echo "FAIL gguf_llamacpp_file_$n"; sed 's/^/  /' "$work/node.log"
  fi
done
