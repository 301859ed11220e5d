"""Stage 2 (GPU machine): distil the draft model from the frozen target, then measure the draft's
greedy acceptance profile against the target.

Usage: python3 stage2_main.py WORK_DIR      (driven by tools/train/stage2.sh; honours STAGE_DEADLINE)
Needs models/tiny-code/target (committed) and bench/prompts/code.jsonl.

Distillation: draft = Qwen3ForCausalLM(common.draft_config()), fp32 master weights, bf16 autocast;
teacher = the committed target in bf16, frozen.  loss = KL(p_target || p_draft) (per token, T=1)
+ 0.1 * cross-entropy on the real next token, over random 1024-token windows of the train stream
(the same deterministic corpus and token stream as stage 1), 64 windows/step, AdamW(0.9/0.95,
wd 0.1 on matrices), peak lr 3e-3, 100 warmup steps, cosine to 10%; step count fixed from a
throughput measurement; wall-clock guard.

Acceptance profile (tests/fixtures/tiny-code/acceptance_profile.json): see DEFINITION below.
"""
import json
import math
import os
import sys
import time

import common
from common import log

WORK = sys.argv[1]
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TARGET = os.path.join(ROOT, "models", "tiny-code", "target")
PROMPTS = os.path.join(ROOT, "bench", "prompts", "code.jsonl")
DL = common.Deadline()
SEQ, BSZ, PEAK_LR, WARMUP, SEED = 1024, 64, 3e-3, 100, 4321
CE_WEIGHT = 0.1
POST_MARGIN_S = 75
ACC_KINDS = ["file_head", "file_middle", "signature_docstring"]
N_ACC_PROMPTS, ACC_PROMPT_LEN, ACC_GEN, ACC_EXTRA, KMAX = 100, 128, 128, 8, 8

DEFINITION = """Greedy acceptance profile of the draft against the target, depth k = 1..8.
Prompts: 100 entries of bench/prompts/code.jsonl taken round-robin over the kinds file_head, file_middle,
signature_docstring (each kind in file order), skipping prompts whose tokenization (tokenizer.json, no
special tokens) has < 128 tokens; each truncated to its first 128 token ids (prompt_ids below).
Target stream: the target's greedy continuation of the prompt, 136 = 128 + 8 tokens (target_stream),
computed batched with a KV cache (prefill of the 128 prompt tokens, then one token per step), float32
weights upcast from the committed bf16, eager attention, TF32 off, on the GPU; argmax = lowest id on ties.
draft_match[i] (i = 0..135) = 1 iff the draft's argmax next token given prompt_ids + target_stream[:i]
equals target_stream[i] (the draft in float32, upcast from bf16, teacher-forced over the whole sequence).
Under greedy decoding the draft's j-th proposal in a round that starts after e emitted tokens is
conditioned on prompt + target_stream[:e] + its own earlier proposals of that round, which equal
target_stream[e..e+j-2] as long as all earlier proposals were accepted; so the accepted count of a round
is exactly the run of consecutive 1s in draft_match starting at e, capped at the number of proposals.
Primary definition ('capped'): per prompt, e = 0; while e < 128: k_eff = min(k, 127 - e); m = the largest
j <= k_eff with draft_match[e..e+j-1] all 1; the round emits m + 1 tokens (m accepted drafts + the
target's own token); e += m + 1; rounds += 1; accepted += m; proposed += k_eff.  Exactly 128 tokens are
emitted per prompt.  mean_accepted_per_round = sum(accepted) / sum(rounds) over all 100 prompts (ratio of
sums); mean_emitted_per_round = 12800 / sum(rounds) = mean_accepted_per_round + 1.
Variant 'uncapped': k_eff = k always (proposals may reach past the 128th token; draft_match up to index
134 is used); m and accepted as above; emitted tokens are cut at 128, so mean_emitted_per_round =
12800 / sum(rounds) while mean_accepted_per_round = sum(uncut m) / sum(rounds)."""


def profile_from_matches(matches, capped):
    res = []
    for k in range(1, KMAX + 1):
        per = []
        for mt in matches:
            e = R = A = P = 0
            while e < ACC_GEN:
                ke = min(k, ACC_GEN - 1 - e) if capped else k
                m = 0
                while m < ke and mt[e + m]:
                    m += 1
                e += m + 1
                R += 1
                A += m
                P += ke
            per.append([R, A, P])
        R = sum(p[0] for p in per)
        A = sum(p[1] for p in per)
        P = sum(p[2] for p in per)
        res.append({"k": k, "rounds": R, "accepted": A, "proposed": P,
                    "mean_accepted_per_round": A / R, "mean_emitted_per_round": len(matches) * ACC_GEN / R,
                    "accept_rate_per_proposed_token": A / max(P, 1),
                    "mean_of_per_prompt_mean_accepted": sum(p[1] / p[0] for p in per) / len(per),
                    "per_prompt_rounds_accepted_proposed": per})
    return res


def main():
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3ForCausalLM

    os.makedirs(WORK, exist_ok=True)
    fx_dir = os.path.join(WORK, "fixtures", "tiny-code")
    os.makedirs(fx_dir, exist_ok=True)
    dev = "cuda"
    metrics = {}
    tok = common.load_tokenizer(TARGET)
    splits, _ = common.build_corpus()
    train_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["train"], "train:"), 400_000_000, 45)
    valid_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["valid"], "valid:"), 2_100_000, 15)
    test_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["test"], "test:"), 2_100_000, 15)
    del splits
    metrics["train_stream_tokens"] = int(len(train_ids))

    torch.backends.cuda.matmul.allow_tf32 = True
    teacher = common.load_model(TARGET, dtype=torch.bfloat16, attn="sdpa", device=dev)
    for p in teacher.parameters():
        p.requires_grad_(False)
    torch.manual_seed(SEED)
    cfg = common.draft_config()
    draft = Qwen3ForCausalLM(cfg).float().to(dev)
    metrics["draft_params"] = common.n_params(draft)
    metrics["target_params"] = common.n_params(teacher)
    log(f"draft params {metrics['draft_params']} target params {metrics['target_params']}")
    V = cfg.vocab_size
    data = torch.from_numpy(train_ids.astype(np.int32)).to(dev)
    N = data.numel()
    decay = [p for p in draft.parameters() if p.dim() >= 2]
    no_decay = [p for p in draft.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
    gen = torch.Generator(device=dev).manual_seed(SEED)
    ar = torch.arange(SEQ + 1, device=dev)

    def logits_of(m, x):
        return m.lm_head(m.model(input_ids=x, use_cache=False).last_hidden_state)

    train_deadline = DL.t_end - POST_MARGIN_S
    total_steps, step, hist, t_meas, stopped_by = None, 0, [], None, "steps"
    t0 = time.time()
    draft.train()
    try:
        while True:
            if total_steps is not None and step >= total_steps:
                break
            if time.time() > train_deadline:
                stopped_by = "wall-clock guard"
                break
            if step < WARMUP:
                lr = PEAK_LR * (step + 1) / WARMUP
            elif total_steps is None:
                lr = PEAK_LR
            else:
                pr = min(1.0, (step - WARMUP) / max(1, total_steps - WARMUP))
                lr = PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * pr)))
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.randint(0, N - SEQ - 1, (BSZ, 1), device=dev, generator=gen)
            w = data[starts + ar].long()
            x, y = w[:, :-1], w[:, 1:]
            with torch.no_grad():
                t_logp = F.log_softmax(logits_of(teacher, x).float(), dim=-1).view(-1, V)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                s_logits = logits_of(draft, x)
            s_logp = F.log_softmax(s_logits.float(), dim=-1).view(-1, V)
            kl = F.kl_div(s_logp, t_logp, reduction="batchmean", log_target=True)
            ce = F.nll_loss(s_logp, y.reshape(-1))
            loss = kl + CE_WEIGHT * ce
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            del t_logp, s_logits, s_logp
            step += 1
            if step == 10:
                torch.cuda.synchronize()
                t_meas = time.time()
            if step == 40 and total_steps is None:
                torch.cuda.synchronize()
                sps = (time.time() - t_meas) / 30
                total_steps = 40 + int((train_deadline - time.time()) / sps * 0.97)
                metrics["measured_tok_per_s"] = BSZ * SEQ / sps
                log(f"measured {sps * 1000:.1f} ms/step = {BSZ * SEQ / sps / 1e3:.0f}k tok/s; total_steps={total_steps}")
            if step % 50 == 0 or step == 1:
                rec = {"step": step, "kl": float(kl.detach()), "ce": float(ce.detach()), "lr": lr,
                       "grad_norm": float(gn), "t": time.time() - t0}
                hist.append(rec)
                log(rec)
    except Exception as e:
        stopped_by = "exception: " + repr(e)
        log("DISTILL EXCEPTION", repr(e))
    torch.cuda.synchronize()
    metrics.update({"steps": step, "planned_steps": total_steps, "stopped_by": stopped_by,
                    "tokens_seen": step * BSZ * SEQ, "train_seconds": time.time() - t0, "seq_len": SEQ,
                    "batch_sequences": BSZ, "peak_lr": PEAK_LR, "warmup": WARMUP, "ce_weight": CE_WEIGHT,
                    "history": hist})
    log(f"distilled {step} steps, {step * BSZ * SEQ / 1e6:.1f}M tokens in {metrics['train_seconds']:.0f}s ({stopped_by})")
    del teacher, data, opt
    torch.cuda.empty_cache()

    draft_dir = os.path.join(WORK, "draft")
    metrics["files"] = common.save_hf(draft, draft_dir, TARGET, shard_bytes=6_000_000)
    common.pack(os.environ.get("OUT"), "stage2_small.tar.gz", WORK, ["draft"])

    # ---- float32 models (bf16 weights upcast), eager attention, TF32 off
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tgt = common.load_model(TARGET, dtype=torch.float32, attn="eager", device=dev)
    drf = common.load_model(draft_dir, dtype=torch.float32, attn="eager", device=dev)
    try:
        acceptance(tok, tgt, drf, fx_dir, metrics)
    except Exception as e:
        log("ACCEPTANCE FAILED", repr(e))
        import traceback
        traceback.print_exc()

    # ---- losses of the shipped (bf16) weights, float32 compute
    @torch.no_grad()
    def evaluate(ids, n_windows):
        n = min(len(ids) // (SEQ + 1), n_windows)
        t = torch.from_numpy(ids[: n * (SEQ + 1)].astype("int64")).view(n, SEQ + 1)
        r = {"target_ce": 0.0, "draft_ce": 0.0, "kl_target_draft": 0.0, "top1_agree": 0.0}
        cnt = 0
        for i in range(0, n, 16):
            if DL.left() < 20:
                break
            w = t[i:i + 16].to(dev)
            x, y = w[:, :-1], w[:, 1:].reshape(-1)
            tl = F.log_softmax(logits_of(tgt, x).float().view(-1, V), -1)
            dl = F.log_softmax(logits_of(drf, x).float().view(-1, V), -1)
            r["target_ce"] += float(F.nll_loss(tl, y, reduction="sum"))
            r["draft_ce"] += float(F.nll_loss(dl, y, reduction="sum"))
            r["kl_target_draft"] += float(F.kl_div(dl, tl, reduction="sum", log_target=True))
            r["top1_agree"] += float((tl.argmax(-1) == dl.argmax(-1)).sum())
            cnt += y.numel()
        return {**{k: v / max(cnt, 1) for k, v in r.items()}, "tokens": cnt}

    try:
        metrics["eval_f32"] = {}
        for name, ids in (("valid", valid_ids), ("test", test_ids)):
            metrics["eval_f32"][name] = evaluate(ids, 2000)
            log("eval", name, metrics["eval_f32"][name])
    except Exception as e:
        log("EVAL FAILED", repr(e))
    with open(os.path.join(WORK, "draft_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
        f.write("\n")
    log("stage2 done")


def acceptance(tok, tgt, drf, fx_dir, metrics):
    import torch
    t0 = time.time()
    dev = "cuda"
    by_kind = {}
    for line in open(PROMPTS):
        p = json.loads(line)
        by_kind.setdefault(p["kind"], []).append(p)
    queues = [by_kind.get(k, []) for k in ACC_KINDS]
    sel, idx = [], [0] * len(queues)
    while len(sel) < N_ACC_PROMPTS and any(idx[q] < len(queues[q]) for q in range(len(queues))):
        for q in range(len(queues)):
            while idx[q] < len(queues[q]):
                p = queues[q][idx[q]]
                idx[q] += 1
                ids = tok.encode(p["prompt"], add_special_tokens=False).ids
                if len(ids) >= ACC_PROMPT_LEN:
                    sel.append((p, ids[:ACC_PROMPT_LEN]))
                    break
            if len(sel) == N_ACC_PROMPTS:
                break
    log(f"acceptance: {len(sel)} prompts")
    x = torch.tensor([ids for _, ids in sel], device=dev)
    S = ACC_GEN + ACC_EXTRA
    stream, margins = [], []
    with torch.no_grad():
        o = tgt(input_ids=x, use_cache=True)
        cache = o.past_key_values
        last = o.logits[:, -1].float()
        for i in range(S):
            top2 = torch.topk(last, 2, dim=-1).values
            margins.append(top2[:, 0] - top2[:, 1])
            nxt = last.argmax(-1)
            stream.append(nxt)
            if i == S - 1:
                break
            o = tgt(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            last = o.logits[:, -1].float()
        stream = torch.stack(stream, 1)  # [n, S]
        margins = torch.stack(margins, 1)
        full = torch.cat([x, stream[:, :-1]], 1)  # [n, 128 + S - 1]
        lo = ACC_PROMPT_LEN - 1
        d_pred = drf(input_ids=full, use_cache=False).logits[:, lo:lo + S].argmax(-1)
        t_pred = tgt(input_ids=full, use_cache=False).logits[:, lo:lo + S].argmax(-1)
    match = (d_pred == stream).cpu().tolist()
    tf_mismatch = int((t_pred != stream).sum())
    log(f"target stream: teacher-forced recompute disagrees with the KV-cache stream at {tf_mismatch} of "
        f"{stream.numel()} positions; acceptance compute {time.time() - t0:.1f}s")
    capped = profile_from_matches(match, True)
    uncapped = profile_from_matches(match, False)
    table = [{k: v for k, v in r.items() if k != "per_prompt_rounds_accepted_proposed"} for r in capped]
    for r in table:
        log(f"k={r['k']}: mean accepted/round {r['mean_accepted_per_round']:.4f}, "
            f"emitted/round {r['mean_emitted_per_round']:.4f}, accept rate {r['accept_rate_per_proposed_token']:.4f}")
    st = stream.cpu().tolist()
    mg = margins.cpu()
    doc = {
        "definition": DEFINITION,
        "target": "models/tiny-code/target", "draft": "models/tiny-code/draft",
        "compute": "GPU (H200) float32, weights upcast from bf16, eager attention, TF32 off; transformers "
                   + __import__("transformers").__version__ + ", torch " + torch.__version__,
        "n_prompts": len(sel), "prompt_len": ACC_PROMPT_LEN, "n_generate": ACC_GEN, "stream_len": S,
        "target_stream_teacher_forced_mismatches": tf_mismatch,
        "profile": table,
        "per_prompt": {f"k{r['k']}": r["per_prompt_rounds_accepted_proposed"] for r in capped},
        "per_prompt_layout": "per_prompt.kK[i] = [rounds, accepted, proposed] of prompt i (capped definition)",
        "uncapped_variant": [{k: v for k, v in r.items() if k != "per_prompt_rounds_accepted_proposed"} for r in uncapped],
        "prompts": [{"id": p["id"], "source": p["source"], "prompt_ids": ids, "target_stream": st[i],
                     "draft_match": "".join("1" if b else "0" for b in match[i]),
                     "target_min_margin_first128": round(float(mg[i, :ACC_GEN].min()), 6)}
                    for i, (p, ids) in enumerate(sel)],
    }
    with open(os.path.join(fx_dir, "acceptance_profile.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    metrics["acceptance_profile"] = table
    metrics["acceptance_uncapped"] = doc["uncapped_variant"]


if __name__ == "__main__":
    main()
