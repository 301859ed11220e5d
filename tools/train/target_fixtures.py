"""Reference fixtures of the trained target (tests/fixtures/tiny-code/), CPU, float32, eager attention.

Usage: python3 target_fixtures.py TARGET_DIR PROMPTS_JSONL OUT_DIR

Writes OUT_DIR/logits.f32 + OUT_DIR/logits.json and OUT_DIR/greedy.json:
  logits.f32   little-endian float32, row-major [n_rows][16384]; the rows are listed in logits.json
               ("rows": prompt index + position, in file order).  Each prompt is run alone, from
               position 0, over its whole token list, no cache; the row at position t holds the logits
               that predict token t+1.
  greedy.json  20 prompts: text, token ids, 64 greedy new tokens (+ text) and each step's top1-top2
               logit margin.  Greedy = KV-cache decode with transformers' DynamicCache (prefill of the
               whole prompt in one call, then one token per call), torch.argmax (lowest id on ties),
               no stop token (an <|endoftext|> is emitted and decoding continues).
The weights are the committed bf16 ones, upcast to float32; the tokenizer is TARGET_DIR/tokenizer.json
(no special tokens added to the prompt).
"""
import json
import os
import sys
import time

import numpy as np
import torch

torch.set_num_threads(int(os.environ.get("FIXTURE_THREADS", "6")))
torch.backends.cuda.matmul.allow_tf32 = False
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

N_GREEDY, N_NEW = 20, 64
N_LOGIT_PROMPTS, N_POS = 4, 8


def pick(prompts, tok, n, lo, hi, salt):
    """Round-robin over kinds, in file order, prompts with lo <= tokens <= hi."""
    by_kind = {}
    for p in prompts:
        by_kind.setdefault(p["kind"], []).append(p)
    kinds = sorted(by_kind)
    out, idx = [], {k: 0 for k in kinds}
    while len(out) < n and any(idx[k] < len(by_kind[k]) for k in kinds):
        for k in kinds:
            while idx[k] < len(by_kind[k]):
                p = by_kind[k][idx[k]]
                idx[k] += 1
                ids = tok.encode(p["prompt"], add_special_tokens=False).ids
                if lo <= len(ids) <= hi:
                    out.append((p, ids))
                    break
            if len(out) >= n:
                break
    return out


def main():
    tdir, pfile, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    tok = common.load_tokenizer(tdir)
    prompts = [json.loads(l) for l in open(pfile)]
    model = common.load_model(tdir, dtype=torch.float32, attn="eager", device="cpu")
    V = model.config.vocab_size

    # ---- logits at ~8 positions of 4 prompts
    rows, meta = [], []
    with torch.no_grad():
        for pi, (p, ids) in enumerate(pick(prompts, tok, N_LOGIT_PROMPTS, 40, 400, "logits")):
            lg = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
            L = len(ids)
            pos = sorted({round(i * (L - 1) / (N_POS - 1)) for i in range(N_POS)})
            for t in pos:
                rows.append(lg[t].numpy().astype("<f4"))
            meta.append({"id": p["id"], "text": p["prompt"], "token_ids": ids, "positions": pos})
    arr = np.stack(rows)
    arr.tofile(os.path.join(out, "logits.f32"))
    with open(os.path.join(out, "logits.json"), "w") as f:
        json.dump({"model": "models/tiny-code/target", "compute": "CPU float32 (bf16 weights upcast), eager attention, "
                   "whole prompt in one forward pass, no cache",
                   "transformers": __import__("transformers").__version__, "torch": torch.__version__,
                   "vocab_size": V, "n_rows": int(arr.shape[0]),
                   "layout": "logits.f32: little-endian float32 row-major [n_rows][vocab]; rows in order of prompts, "
                             "then of each prompt's positions; row for (prompt, t) = logits at position t "
                             "(predicting token t+1)",
                   "prompts": meta}, f, indent=1)
        f.write("\n")
    print(f"logits fixture {arr.shape} in {time.time() - t0:.1f}s", flush=True)

    # ---- greedy 64 tokens for 20 prompts, KV cache
    res = []
    with torch.no_grad():
        for p, ids in pick(prompts, tok, N_GREEDY, 16, 400, "greedy"):
            out_ids, margins = [], []
            o = model(input_ids=torch.tensor([ids]), use_cache=True)
            cache = o.past_key_values
            last = o.logits[0, -1].float()
            for _ in range(N_NEW):
                top2 = torch.topk(last, 2).values
                margins.append(round(float(top2[0] - top2[1]), 6))
                nxt = int(torch.argmax(last))
                out_ids.append(nxt)
                o = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
                cache = o.past_key_values
                last = o.logits[0, -1].float()
            res.append({"id": p["id"], "kind": p["kind"], "source": p["source"], "prompt": p["prompt"],
                        "prompt_ids": ids, "output_ids": out_ids,
                        "output_text": tok.decode(out_ids, skip_special_tokens=False),
                        "min_margin": min(margins), "margins": margins})
    with open(os.path.join(out, "greedy.json"), "w") as f:
        json.dump({"model": "models/tiny-code/target", "new_tokens": N_NEW,
                   "method": "CPU float32 (bf16 weights upcast), eager attention; prefill the whole prompt in one "
                             "call, then one token per call with transformers DynamicCache; torch.argmax (lowest id "
                             "on ties); no stop token; margins[i] = top1 - top2 logit at step i",
                   "prompts": res}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"greedy fixture: {len(res)} prompts, min margin {min(r['min_margin'] for r in res):.4g}, "
          f"total {time.time() - t0:.1f}s", flush=True)
    for r in res[:3]:
        print("----", r["id"], "\n", r["prompt"][-300:], "\n>>>>", r["output_text"], flush=True)


if __name__ == "__main__":
    main()
