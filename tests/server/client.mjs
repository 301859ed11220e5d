// Client-side checks of `tandem serve`, driven by tests/server.sh against a
// server it started: the official `openai` npm client (completions, chat,
// streaming), outputs identical to `tandem run` (greedy and temperature 0.8
// with a seed, with and without speculation, 1 and 8 concurrent clients),
// per-request drafters and provenance, clients that disconnect mid-stream,
// and a bounded load test. Prints one "PASS name" / "FAIL name: why" line per
// check. usage: node client.mjs BASE_URL TANDEM_BIN CTX [light]
import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const require = createRequire(path.join(root, '.cache/npm/'));
const OpenAI = require('openai').default ?? require('openai');

const [base, tandem, ctxArg, lightArg] = process.argv.slice(2);
const LIGHT = lightArg === 'light'; // sanitizer builds: a smaller load test
const CTX = Number(ctxArg || 512);
const MODEL = 'tiny-code';
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60000 });

let failed = 0;
const pass = (n) => console.log(`PASS ${n}`);
const fail = (n, why) => { failed++; console.log(`FAIL ${n}: ${why}`); };
const check = (n, cond, why) => (cond ? pass(n) : fail(n, why));
async function guard(n, fn) {
  try { await fn(); } catch (e) { fail(n, `exception: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`); }
}

const prompts = readFileSync(path.join(root, 'bench/prompts/code.jsonl'), 'utf8')
  .split('\n').filter(Boolean).slice(0, 8).map((l) => JSON.parse(l).prompt.slice(0, 400));
const MAXT = 40;

// Reference: `tandem run` prints the prompt, the generated text, then "\n";
// --ids prints the generated ids to stderr.
function runRef(prompt, { temp = 0, seed = 0, draft = 'none', chat = false, n = MAXT } = {}) {
  const args = ['run', '-p', prompt, '-n', String(n), '--temp', String(temp), '--seed', String(seed),
    '--draft', draft, '--ctx', String(CTX), '-t', '1', '--ids'];
  if (chat) args.push('--chat', '--stop', '<|im_end|>');
  let r;
  for (let attempt = 0; attempt < 3; attempt++) { // the binary may be mid-rebuild by a concurrent make
    r = require('node:child_process').spawnSync(tandem, args, { encoding: 'utf8' });
    if (!r.error && r.status === 0) break;
    execFileSync('sleep', ['1']);
  }
  if (r.error || r.status !== 0) throw new Error(`tandem run failed: ${r.error || r.stderr}`);
  const m = /ids:([\d ]*)\n/.exec(r.stderr);
  const ids = m ? m[1].trim().split(/\s+/).filter(Boolean).map(Number) : [];
  let text = r.stdout;
  if (!chat) text = text.slice(prompt.length);
  text = text.slice(0, -1);
  return { ids, text };
}

async function post(pathname, body, opts = {}) {
  const r = await fetch(base + pathname, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body), ...opts });
  return r;
}

async function metric(name) {
  const t = await (await fetch(base + '/metrics')).text();
  const m = new RegExp(`^${name.replace(/[:]/g, '\\:')} ([0-9.e+-]+)$`, 'm').exec(t);
  return m ? Number(m[1]) : NaN;
}

async function waitRows0(ms = 8000) {
  const t0 = Date.now();
  let v;
  while (Date.now() - t0 < ms) {
    v = await metric('tandem:num_requests_running');
    if (v === 0) return 0;
    await new Promise((r) => setTimeout(r, 50));
  }
  return v;
}

// Completion through the server, ids from provenance.
async function serverComplete(prompt, { temp = 0, seed = 0, speculative, stream = false, maxTokens = MAXT, echo = false } = {}) {
  const body = { model: MODEL, prompt, max_tokens: maxTokens, temperature: temp, seed, provenance: true, echo };
  if (speculative !== undefined) body.speculative = speculative;
  if (!stream) {
    const r = await post('/v1/completions', body);
    const j = await r.json();
    if (r.status !== 200) throw new Error(`status ${r.status}: ${JSON.stringify(j)}`);
    return { ids: j.choices[0].provenance.map((p) => p.token), text: j.choices[0].text, usage: j.usage,
      prov: j.choices[0].provenance };
  }
  body.stream = true;
  const r = await post('/v1/completions', body);
  const raw = await r.text();
  let text = '', ids = [], usage = null, done = false;
  for (const ev of raw.split('\n\n')) {
    if (!ev.startsWith('data: ')) continue;
    const d = ev.slice(6);
    if (d === '[DONE]') { done = true; continue; }
    const j = JSON.parse(d);
    if (j.error) throw new Error(JSON.stringify(j.error));
    const c = j.choices[0];
    if (c) { text += c.text; if (c.provenance) ids.push(...c.provenance.map((p) => p.token)); }
    if (j.usage) usage = j.usage;
  }
  if (!done) throw new Error('stream without [DONE]');
  return { ids, text, usage };
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// ---- exactness against tandem run -------------------------------------------
const settings = [{ name: 'greedy', temp: 0, seed: 0 }, { name: 't08', temp: 0.8, seed: 1234 }];
const refs = {};
try {
  for (const s of settings) refs[s.name] = prompts.map((p) => runRef(p, { temp: s.temp, seed: s.seed }));
} catch (e) {
  fail('server_ref_run', String(e));
  process.exit(1);
}
// tandem run itself agrees with and without a drafter (sanity for the reference)
await guard('server_ref_run_spec_equal', async () => {
  const r2 = runRef(prompts[0], { temp: 0.8, seed: 1234, draft: 'ngram' });
  check('server_ref_run_spec_equal', same(r2.ids, refs.t08[0].ids), 'tandem run differs with --draft ngram');
});

for (const s of settings) {
  for (const spec of [{ name: 'spec', v: undefined }, { name: 'nospec', v: false },
    { name: 'ngram12d4', v: { drafter: 'ngram:1-2', depth: 4 } }]) {
    for (const conc of [1, 8]) {
      const name = `server_exact_${s.name}_${spec.name}_c${conc}`;
      await guard(name, async () => {
        const outs = [];
        if (conc === 1) {
          for (const p of prompts) outs.push(await serverComplete(p, { temp: s.temp, seed: s.seed, speculative: spec.v }));
        } else {
          outs.push(...await Promise.all(prompts.map((p, i) =>
            serverComplete(p, { temp: s.temp, seed: s.seed, speculative: spec.v, stream: i % 2 === 1 }))));
        }
        const bad = outs.map((o, i) => (same(o.ids, refs[s.name][i].ids) && o.text === refs[s.name][i].text ? -1 : i))
          .filter((i) => i >= 0);
        check(name, bad.length === 0, `prompts ${bad} differ from tandem run (e.g. ${JSON.stringify(outs[bad[0]]?.ids?.slice(0, 8))} vs ${JSON.stringify(refs[s.name][bad[0]]?.ids.slice(0, 8))})`);
        if (spec.name === 'ngram12d4' && conc === 1) {
          const u = outs[0].usage.speculative;
          check(`server_spec_per_request_drafter_${s.name}`, u && u.drafter === 'ngram:1-2' && u.depth === 4,
            `usage.speculative ${JSON.stringify(u)}`);
        }
        if (spec.name === 'nospec' && conc === 1) {
          const u = outs[0].usage.speculative;
          check(`server_spec_false_no_drafts_${s.name}`, u && u.drafted === 0 && u.drafter === 'none', JSON.stringify(u));
        }
      });
    }
  }
}

// provenance: drafter tokens appear on a repetitive prompt; usage.speculative consistent
await guard('server_provenance', async () => {
  const p = 'a = 1\nb = 2\na = 1\nb = 2\na = 1\nb = 2\na = 1\nb = 2\n';
  const o = await serverComplete(p, { temp: 0 });
  const nd = o.prov.filter((x) => x.source === 'drafter').length;
  const u = o.usage.speculative;
  check('server_provenance', o.prov.every((x) => x.source === 'drafter' || x.source === 'target') &&
    nd === u.accepted && u.drafted >= u.accepted && typeof u.mean_accepted_length === 'number' &&
    o.usage.completion_tokens === o.ids.length,
  `drafter tokens ${nd}, usage ${JSON.stringify(o.usage)}`);
});

// ---- the openai client ----------------------------------------------------------
await guard('server_openai_completions', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: prompts[1], max_tokens: MAXT, temperature: 0 });
  check('server_openai_completions', r.choices[0].text === refs.greedy[1].text && r.usage.completion_tokens === refs.greedy[1].ids.length &&
    r.usage.prompt_tokens > 0 && r.choices[0].finish_reason === 'length', JSON.stringify(r).slice(0, 300));
});
await guard('server_openai_completions_stream', async () => {
  const st = await client.completions.create({ model: MODEL, prompt: prompts[2], max_tokens: MAXT, temperature: 0.8, seed: 1234, stream: true });
  let text = '', fin = null;
  for await (const ch of st) { if (ch.choices[0]) { text += ch.choices[0].text; fin = ch.choices[0].finish_reason ?? fin; } }
  check('server_openai_completions_stream', text === refs.t08[2].text && fin === 'length', `${JSON.stringify(text)} vs ${JSON.stringify(refs.t08[2].text)}`);
});
const chatQ = 'Write a Python function that reverses a string.';
let chatRef = { ids: [], text: null };
try { chatRef = runRef(chatQ, { chat: true, n: MAXT, temp: 0 }); } catch (e) { fail('server_ref_run_chat', String(e)); }
await guard('server_openai_chat', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: chatQ }], max_tokens: MAXT, temperature: 0 });
  const m = r.choices[0].message;
  check('server_openai_chat', m.role === 'assistant' && m.content === chatRef.text && r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens &&
    r.object === 'chat.completion', `${JSON.stringify(m.content)} vs ${JSON.stringify(chatRef.text)}`);
});
await guard('server_openai_chat_stream', async () => {
  const st = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: chatQ }], max_tokens: MAXT, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', role = null, fin = null, usage = null;
  for await (const ch of st) {
    const c = ch.choices[0];
    if (c) { if (c.delta.role) role = c.delta.role; if (c.delta.content) text += c.delta.content; fin = c.finish_reason ?? fin; }
    if (ch.usage) usage = ch.usage;
  }
  check('server_openai_chat_stream', role === 'assistant' && text === chatRef.text && fin && usage && usage.speculative,
    `role ${role} fin ${fin} usage ${JSON.stringify(usage)} text ${JSON.stringify(text)} vs ${JSON.stringify(chatRef.text)}`);
});
await guard('server_openai_models', async () => {
  const l = await client.models.list();
  check('server_openai_models', l.data.length === 1 && l.data[0].id === MODEL, JSON.stringify(l.data));
});
await guard('server_openai_error', async () => {
  try {
    await client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 4 });
    fail('server_openai_error', 'no error');
  } catch (e) {
    check('server_openai_error', e.status === 404 && /does not exist/.test(e.message), `${e.status} ${e.message}`);
  }
});
await guard('server_stop_string', async () => {
  const ref = refs.greedy[3].text;
  const cut = ref.slice(10, 14);
  const r = await client.completions.create({ model: MODEL, prompt: prompts[3], max_tokens: MAXT, temperature: 0, stop: [cut] });
  check('server_stop_string', r.choices[0].finish_reason === 'stop' && r.choices[0].text === ref.slice(0, ref.indexOf(cut)),
    `${JSON.stringify(r.choices[0])} cut ${JSON.stringify(cut)}`);
});

// ---- disconnects free their rows ----------------------------------------------
await guard('server_disconnect_stream', async () => {
  const c0 = await metric('tandem:request_cancelled_total');
  const ctrls = [];
  await Promise.all([0, 1, 2, 3].map(async (i) => {
    const ac = new AbortController();
    ctrls.push(ac);
    const r = await post('/v1/completions', { model: MODEL, prompt: prompts[i], max_tokens: CTX, temperature: 0.8, seed: i, stream: true, speculative: i % 2 === 0 },
      { signal: ac.signal });
    const rd = r.body.getReader();
    await rd.read(); await rd.read();
    ac.abort();
  }).map((p) => p.catch(() => {})));
  const rows = await waitRows0();
  const c1 = await metric('tandem:request_cancelled_total');
  check('server_disconnect_stream', rows === 0 && c1 - c0 >= 1, `rows ${rows}, cancelled ${c0} -> ${c1}`);
});
await guard('server_disconnect_nonstream', async () => {
  const ac = new AbortController();
  const p = post('/v1/completions', { model: MODEL, prompt: prompts[5], max_tokens: CTX, temperature: 0.8, seed: 3 }, { signal: ac.signal }).catch(() => {});
  await new Promise((r) => setTimeout(r, 60));
  ac.abort();
  await p;
  const rows = await waitRows0();
  check('server_disconnect_nonstream', rows === 0, `rows ${rows}`);
});

// ---- bounded load test: 16 concurrent streaming clients x 40 requests -------------
const rss = () => {
  try { return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${process.env.SERVER_PID}/status`, 'utf8'))[1]) / 1024; } catch { return NaN; }
};
const rss0 = rss();
await guard('server_load', async () => {
  const CLIENTS = 16, PER = LIGHT ? 8 : 40;
  let errors = 0, tokens = 0, firstErr = '';
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
    for (let k = 0; k < PER; k++) {
      try {
        const o = await serverComplete(prompts[(c + k) % prompts.length].slice(0, 40), { temp: 0.7, seed: c * 1000 + k, stream: true, maxTokens: 8,
          speculative: k % 3 === 0 ? false : undefined });
        tokens += o.ids.length;
        if (!o.usage || o.usage.completion_tokens !== o.ids.length) { errors++; firstErr ||= `usage ${JSON.stringify(o.usage)}`; }
      } catch (e) { errors++; firstErr ||= String(e); }
    }
  }));
  const dt = (Date.now() - t0) / 1000;
  const rows = await waitRows0();
  const q = await metric('tandem:num_requests_waiting');
  check('server_load', errors === 0 && rows === 0 && q === 0,
    `errors ${errors} (${firstErr}), rows ${rows}, queue ${q}`);
  console.log(`# load: ${CLIENTS * PER} requests, ${tokens} tokens in ${dt.toFixed(1)} s`);
});
// memory back to baseline: the KV is allocated at start; requests add only
// their buffers, freed when they end (allow allocator slack)
await guard('server_load_memory', async () => {
  const rss1 = rss();
  if (!process.env.SERVER_PID) return pass('server_load_memory');
  check('server_load_memory', rss1 - rss0 < 48, `RSS ${rss0.toFixed(1)} MiB before the load, ${rss1.toFixed(1)} MiB after`);
  console.log(`# server RSS: ${rss0.toFixed(1)} MiB before load, ${rss1.toFixed(1)} MiB after`);
});
await guard('server_echo_stream', async () => {
  const o = await serverComplete(prompts[4].slice(0, 60), { temp: 0, stream: true, maxTokens: 4, echo: true });
  check('server_echo_stream', o.text.startsWith(prompts[4].slice(0, 60)) && o.ids.length === 4, JSON.stringify(o.text));
});

// ---- metrics reflect the traffic ------------------------------------------------------
await guard('server_metrics_counts', async () => {
  const t = await (await fetch(base + '/metrics')).text();
  const need = ['tandem:generation_tokens_total', 'tandem:prompt_tokens_total', 'tandem:time_to_first_token_seconds_count',
    'tandem:inter_token_latency_seconds_count', 'tandem:spec_decode_num_draft_tokens_total', 'tandem:spec_decode_num_accepted_tokens_total'];
  const vals = need.map((n) => Number((new RegExp(`^${n} ([0-9.e+-]+)$`, 'm').exec(t) || [])[1]));
  check('server_metrics_counts', vals.every((v) => v > 0) && /spec_decode_num_accepted_tokens_per_pos\{position="0"\} [1-9]/.test(t),
    need.map((n, i) => `${n}=${vals[i]}`).join(' '));
});

process.exit(failed ? 1 : 0);
