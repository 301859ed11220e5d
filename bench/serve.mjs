// bench/serve.mjs — load generator for `tandem serve` (see bench/serve.sh).
// For each concurrency level and with/without speculation (per request:
// `speculative: false` vs the server's drafter, same server, same run), C
// clients stream completions of the bench prompts back to back; measures
// throughput (generated tokens / wall time), client-side inter-token latency
// (gap between SSE chunks, shared by the chunk's tokens) p50/p99, and TTFT p50.
// usage: node serve.mjs BASE_URL [--conc 1,4,16] [--requests N] [--max-tokens N] [--prompt-chars N] [--reps R]
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const base = args[0];
const opt = (k, d) => { const i = args.indexOf(k); return i > 0 ? args[i + 1] : d; };
const concs = opt('--conc', '1,4,16').split(',').map(Number);
const perLevel = Number(opt('--requests', '0'));   // 0 = 4 per client, at least 8
const maxTokens = Number(opt('--max-tokens', '64'));
const promptChars = Number(opt('--prompt-chars', '400'));
const reps = Number(opt('--reps', '2'));
const prompts = readFileSync(path.join(here, 'prompts/code.jsonl'), 'utf8').split('\n').filter(Boolean)
  .map((l) => JSON.parse(l).prompt.slice(0, promptChars));

const pct = (a, p) => { if (!a.length) return 0; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };

async function one(prompt, spec, seed, acc) {
  const t0 = performance.now();
  const r = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, seed, stream: true, provenance: true,
      ...(spec ? {} : { speculative: false }) }) });
  if (r.status !== 200) { acc.errors++; await r.text(); return; }
  const rd = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '', last = null;
  for (;;) {
    const { value, done } = await rd.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.error) { acc.errors++; continue; }
      const c = j.choices && j.choices[0];
      const k = c && c.provenance ? c.provenance.length : 0;
      if (j.usage) { acc.drafted += j.usage.speculative.drafted; acc.accepted += j.usage.speculative.accepted; acc.rounds += j.usage.speculative.rounds; }
      if (!k) continue;
      const now = performance.now();
      if (last === null) acc.ttft.push(now - t0);
      else for (let q = 0; q < k; q++) acc.itl.push((now - last) / k);
      last = now;
      acc.tokens += k;
    }
  }
  acc.requests++;
}

const newAcc = () => ({ tokens: 0, requests: 0, errors: 0, itl: [], ttft: [], drafted: 0, accepted: 0, rounds: 0, wall: 0 });
async function phase(conc, spec, acc, rep) {
  const n = perLevel || Math.max(8, 4 * conc);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: conc }, async () => {
    while (next < n) { const i = next++; await one(prompts[(i + rep * n) % prompts.length], spec, i, acc).catch(() => acc.errors++); }
  }));
  acc.wall += (performance.now() - t0) / 1000;
}
// plain and speculative phases alternate (reps of each), so a noisy machine
// weighs on both alike; the same prompts go through both.
async function levelPair(conc) {
  const a = newAcc(), b = newAcc();
  for (let rep = 0; rep < reps; rep++) { await phase(conc, false, a, rep); await phase(conc, true, b, rep); }
  return [summary(conc, false, a), summary(conc, true, b)];
}
function summary(conc, spec, acc) {
  const wall = acc.wall;
  return { concurrency: conc, speculative: spec, requests: acc.requests, errors: acc.errors, tokens: acc.tokens,
    wall_s: +wall.toFixed(3), throughput_tok_s: +(acc.tokens / wall).toFixed(1),
    itl_p50_ms: +pct(acc.itl, 0.5).toFixed(2), itl_p99_ms: +pct(acc.itl, 0.99).toFixed(2), ttft_p50_ms: +pct(acc.ttft, 0.5).toFixed(1),
    drafted: acc.drafted, accepted: acc.accepted, mean_accepted: acc.rounds ? +(acc.accepted / acc.rounds).toFixed(3) : 0 };
}

const results = [];
await phase(1, true, newAcc(), 0); // warm-up
for (const c of concs) results.push(...await levelPair(c));
const models = await (await fetch(base + '/v1/models')).json();
const m = models.data[0];
const speedup = {};
for (const c of concs) {
  const a = results.find((r) => r.concurrency === c && !r.speculative), b = results.find((r) => r.concurrency === c && r.speculative);
  speedup[c] = a.throughput_tok_s ? +(b.throughput_tok_s / a.throughput_tok_s).toFixed(3) : 0;
}
console.log(JSON.stringify({ model: m.id, drafter: m.drafter, draft_depth: m.draft_depth, max_tokens: maxTokens, prompt_chars: promptChars, reps, results, speedup }, null, 1));
