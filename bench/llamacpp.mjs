// llamacpp.mjs — llama.cpp's side of bench/llamacpp.sh, through the npm package
// node-llama-cpp (pinned, prebuilt linux-x64 CPU binaries; `scripts/test-deps
// llama` installs it into .cache/npm-llama).
//
//   node bench/llamacpp.mjs MODEL.gguf [THREADS] [REPS]
//
// Prints one JSON object measured like `tandem bench forward`:
//   prefill_tps   a 512-token prompt evaluated in one call (batch size 512)
//   decode_tps    greedy generation at batch 1 after that prompt (64 tokens,
//                 the first excluded), temperature 0
//   verify_ms     {"1","2","4","8","16"}: one forward of T new tokens at context
//                 512 with the next token computed at every one of them
//                 (controlledEvaluate, as a speculative verify needs), the T
//                 tokens then erased; best of REPS
// Prompt tokens are fixed pseudo-random ids in [1000, 10000).
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const require = createRequire(path.join(root, ".cache/npm-llama/package.json"));
const { getLlama, LlamaLogLevel } = await import(require.resolve("node-llama-cpp"));
const pkg = JSON.parse(fs.readFileSync(path.join(root, ".cache/npm-llama/node_modules/node-llama-cpp/package.json"), "utf8"));

const [modelPath, threadsArg, repsArg] = process.argv.slice(2);
const threads = Number(threadsArg || 2), reps = Number(repsArg || 3);
let s = 12345;
const rnd = () => { s = (s * 1103515245 + 12345) >>> 0; return s; };
const prompt = Array.from({ length: 512 }, () => 1000 + (rnd() % 9000));
const now = () => Number(process.hrtime.bigint()) / 1e9;

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath });
const ctx = await model.createContext({ contextSize: 1024, threads, batchSize: 512 });
const seq = ctx.getSequence();

let prefill = Infinity;
for (let r = 0; r < reps; r++) {
  await seq.clearHistory();
  const t0 = now();
  await seq.evaluateWithoutGeneratingNewTokens(prompt);
  prefill = Math.min(prefill, now() - t0);
}
const verify = {};
for (const T of [1, 2, 4, 8, 16]) {
  let best = Infinity;
  for (let r = 0; r < reps; r++) {
    const toks = Array.from({ length: T }, () => [1000 + (rnd() % 9000), { generateNext: { token: true } }]);
    const t0 = now();
    await seq.controlledEvaluate(toks);
    best = Math.min(best, now() - t0);
    await seq.eraseContextTokenRanges([{ start: 512, end: 512 + T }]);
  }
  verify[String(T)] = +(best * 1000).toFixed(3);
}
let decode = 0;
for (let r = 0; r < reps; r++) {
  await seq.eraseContextTokenRanges([{ start: 512, end: seq.nextTokenIndex }]);
  let n = 0, t1 = 0;
  for await (const _ of seq.evaluate([prompt[0]], { temperature: 0 })) {
    if (n === 0) t1 = now();
    if (++n >= 64) break;
  }
  decode = Math.max(decode, (n - 1) / (now() - t1));
}
console.log(JSON.stringify({
  engine: `llama.cpp (node-llama-cpp ${pkg.version}, prebuilt CPU)`, model: modelPath, threads,
  prefill_tps: +(512 / prefill).toFixed(1), decode_tps: +decode.toFixed(1), verify_ms: verify,
  verify8_over_1: +(verify["8"] / verify["1"]).toFixed(2),
}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
