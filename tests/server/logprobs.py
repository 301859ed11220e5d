#!/usr/bin/env python3
"""logprobs checks for `tandem serve` (run by tests/server.sh): URL as argv[1].
Greedy completions (logprobs: 3) and chat (logprobs: true, top_logprobs: 2),
plain and streaming: every token_logprob <= 0, the chosen token is the first
alternative, tokens joined equal the text, counts match completion_tokens, and
the same request with speculative: false gives bitwise the same logprobs JSON."""
import json, sys, urllib.request

U = sys.argv[1]
fails = 0

def post(path, body):
    req = urllib.request.Request(U + path, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()

def raw_logprobs(text):
    # the "logprobs" value exactly as the server printed it (numbers unparsed)
    d = json.loads(text, parse_float=str)
    return json.dumps(d["choices"][0]["logprobs"])

def check(name, cond, why):
    global fails
    if cond: print("PASS " + name)
    else:
        fails += 1
        print("FAIL %s: %s" % (name, why))

def stream(path, body):
    b = dict(body, stream=True)
    out = post(path, b)
    chunks = [l[6:] for l in out.split("\n") if l.startswith("data: {")]
    toks, text, usage = [], "", None
    for c in chunks:
        d = json.loads(c, parse_float=str)
        if d.get("usage"): usage = d["usage"]
        if not d["choices"]: continue
        ch = d["choices"][0]
        text += ch["delta"].get("content") or "" if "delta" in ch else ch.get("text", "")
        lp = ch.get("logprobs")
        if lp: toks += lp["content"] if "content" in lp else [list(x) for x in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"])]
    return toks, text, usage

PROMPT = "a = 1\nb = 2\na = 1\nb = 2\na = 1\nb = 2\na = 1\n"
cb = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 3, "speculative": {"drafter": "ngram"}}
spec = post("/v1/completions", cb)
plain = post("/v1/completions", dict(cb, speculative=False))
d = json.loads(spec)
c = d["choices"][0]; lp = c["logprobs"]; n = d["usage"]["completion_tokens"]
ok = (lp is not None and len(lp["tokens"]) == n == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
      and "".join(lp["tokens"]) == c["text"] and all(x <= 0 for x in lp["token_logprobs"])
      and all(len(t) == 3 and list(t.values())[0] == x and list(t.keys())[0] == tok and all(v <= x for v in t.values())
              for t, x, tok in zip(lp["top_logprobs"], lp["token_logprobs"], lp["tokens"]))
      and lp["text_offset"] == [sum(len(t.encode()) for t in lp["tokens"][:i]) for i in range(n)])
check("server_logprobs_completion", ok, spec[:600])
check("server_logprobs_completion_speculated", d["usage"]["speculative"]["accepted"] > 0, "no draft accepted: " + json.dumps(d["usage"]))
check("server_logprobs_completion_spec_equal", raw_logprobs(spec) == raw_logprobs(plain), "speculative %s\nplain %s" % (raw_logprobs(spec)[:300], raw_logprobs(plain)[:300]))
st, stext, su = stream("/v1/completions", cb)
check("server_logprobs_completion_stream", stext == c["text"] and len(st) == n
      and json.dumps([[t[0], t[1], t[2], t[3]] for t in st]) == json.dumps([list(x) for x in zip(*[json.loads(spec, parse_float=str)["choices"][0]["logprobs"][k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")])]),
      "stream differs: %s" % json.dumps(st)[:300])

chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2,
        "speculative": {"drafter": "ngram"}}
spec = post("/v1/chat/completions", chat)
plain = post("/v1/chat/completions", dict(chat, speculative=False))
d = json.loads(spec)
c = d["choices"][0]; cont = (c["logprobs"] or {}).get("content"); n = d["usage"]["completion_tokens"]
ok = (cont is not None and len(cont) == n and c["finish_reason"] == "length"
      and "".join(e["token"] for e in cont) == c["message"]["content"]
      and bytes(b for e in cont for b in e["bytes"]) == c["message"]["content"].encode()
      and all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]
              and e["top_logprobs"][0]["logprob"] == e["logprob"] and e["top_logprobs"][1]["logprob"] <= e["logprob"] for e in cont))
check("server_logprobs_chat", ok, spec[:600])
check("server_logprobs_chat_spec_equal", raw_logprobs(spec) == raw_logprobs(plain), "speculative %s\nplain %s" % (raw_logprobs(spec)[:300], raw_logprobs(plain)[:300]))
st, stext, su = stream("/v1/chat/completions", chat)
check("server_logprobs_chat_stream", stext == c["message"]["content"] and json.dumps(st) == json.dumps(json.loads(spec, parse_float=str)["choices"][0]["logprobs"]["content"]),
      "stream differs: %s" % json.dumps(st)[:300])
# off: null as before
d = json.loads(post("/v1/completions", {"prompt": "x", "max_tokens": 2, "logprobs": 0}))
check("server_logprobs_off", d["choices"][0]["logprobs"] is None, json.dumps(d)[:300])
sys.exit(1 if fails else 0)
