// llamacpp_greedy.mjs — llama.cpp (the prebuilt binaries of the npm package
// node-llama-cpp, pinned in scripts/test-deps) against tandem on the same GGUF.
//
//   node tests/llamacpp_greedy.mjs MODEL.gguf TANDEM.jsonl LABEL
//
// TANDEM.jsonl: `gguf_tool greedy MODEL N PROMPTS` lines {prompt, prompt_ids,
// gen_ids}. For each prompt, llama.cpp evaluates tandem's prompt ids and
// continues greedily (temperature 0) for as many tokens as tandem generated;
// the streams must be identical (rows without gen_ids are skipped). llama.cpp's
// own tokenization of the prompt text is compared with tandem's too. Two threads, CPU only, no GPU build,
// never builds from source (build: "never").
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const require = createRequire(path.join(root, ".cache/npm-llama/package.json"));
const { getLlama, LlamaLogLevel } = await import(require.resolve("node-llama-cpp"));

const [modelPath, jsonl, label] = process.argv.slice(2);
const rows = fs.readFileSync(jsonl, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath });
const ctx = await model.createContext({ contextSize: 1024, threads: 2, batchSize: 512 });
const seq = ctx.getSequence();
let genBad = 0, tokBad = 0, tokens = 0;
for (const [i, r] of rows.entries()) {
  const ids = Array.from(model.tokenize(r.prompt, false));
  if (ids.join(" ") !== r.prompt_ids.join(" ")) {
    if (tokBad++ < 3) console.log(`  prompt ${i} tokenized differently:\n    llama.cpp ${ids.slice(0, 24).join(" ")}\n    tandem    ${r.prompt_ids.slice(0, 24).join(" ")}`);
  }
  if (!r.gen_ids.length) continue; /* tokenization only */
  await seq.clearHistory();
  const out = [];
  for await (const t of seq.evaluate(r.prompt_ids, { temperature: 0 })) {
    out.push(t);
    if (out.length >= r.gen_ids.length) break;
  }
  tokens += out.length;
  if (out.join(" ") !== r.gen_ids.join(" ")) {
    let k = 0;
    while (out[k] === r.gen_ids[k]) k++;
    if (genBad++ < 3) console.log(`  prompt ${i}: first difference at generated token ${k}: llama.cpp ${out.slice(k, k + 6).join(" ")}, tandem ${r.gen_ids.slice(k, k + 6).join(" ")}`);
  }
}
if (tokens) console.log(`${genBad ? "FAIL" : "PASS"} gguf_llamacpp_greedy_${label} (${rows.length} prompts, ${tokens} tokens; ${genBad} differ)`);
console.log(`${tokBad ? "FAIL" : "PASS"} gguf_llamacpp_tokenize_${label} (${rows.length} prompts; ${tokBad} tokenized differently)`);
await ctx.dispose();
await model.dispose();
await llama.dispose();
