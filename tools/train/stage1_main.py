"""Stage 1 (GPU machine): corpus -> manifest + bench prompts -> tokenizer -> target model.

Usage: python3 stage1_main.py WORK_DIR      (driven by tools/train/stage1.sh; honours STAGE_DEADLINE)

Writes WORK_DIR/manifest.json, WORK_DIR/code.jsonl, WORK_DIR/tokenizer/, WORK_DIR/target/ (bf16 HF
layout, shards <= 14 MB), WORK_DIR/target_metrics.json.

Target training: Qwen3ForCausalLM (common.target_config()), bf16 autocast, fp32 master weights,
AdamW(betas 0.9/0.95, wd 0.1 on matrices, fused), peak lr 2e-3, 100 warmup steps, cosine to 10%,
grad clip 1.0, seq len 1024, 64 sequences/step (65,536 tokens), random windows of the train token
stream (files in hash-shuffled order, each followed by <|endoftext|>).  The step count is fixed after
30 measured steps from the time left before the training deadline; a wall-clock guard also stops it.
"""
import json
import math
import os
import sys
import time

import common
from common import log

WORK = sys.argv[1]
DL = common.Deadline()
SEQ = 1024
BSZ = 64
PEAK_LR = 2e-3
WARMUP = 100
SEED = 1234
TRAIN_END_MARGIN_S = 75  # time kept after training for eval + save + packing


def main():
    os.makedirs(WORK, exist_ok=True)
    t_start = time.time()
    splits, man = common.build_corpus()
    with open(os.path.join(WORK, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
        f.write("\n")
    try:
        import bench_prompts
        ps = bench_prompts.make_prompts(splits["test"])
        with open(os.path.join(WORK, "code.jsonl"), "w") as f:
            for p in ps:
                f.write(json.dumps(p, ensure_ascii=False) + "\n")
        log(f"bench prompts: {len(ps)}")
    except Exception as e:  # never lose the training run over the prompts
        log("bench prompts FAILED", repr(e))

    # ---- tokenizer: trained on a ~40 MB hash-shuffled sample of the train split
    t0 = time.time()
    sample, n = [], 0
    for f in common.shuffled(splits["train"], "tok:"):
        sample.append(f["text"])
        n += f["bytes"]
        if n >= 40_000_000:
            break
    tok = common.train_tokenizer(sample)
    tok_dir = os.path.join(WORK, "tokenizer")
    common.write_tokenizer(tok, tok_dir)
    log(f"tokenizer: {tok.get_vocab_size()} entries from {len(sample)} files / {n / 1e6:.1f} MB in {time.time() - t0:.1f}s")
    del sample
    common.pack(os.environ.get("OUT"), "stage1_small.tar.gz", WORK, ["manifest.json", "code.jsonl", "tokenizer"])

    # ---- tokens
    budget = min(80.0, max(20.0, DL.left() - 400))
    train_ids, n_train_files = common.tokenize_docs(tok, common.shuffled(splits["train"], "train:"), 400_000_000, budget)
    vfiles = common.shuffled(splits["valid"], "valid:")
    valid_ids, nvf = common.tokenize_docs(tok, vfiles, 2_100_000, 15)
    test_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["test"], "test:"), 2_100_000, 15)
    bytes_per_token = sum(f["bytes"] for f in vfiles[:nvf]) / max(1, len(valid_ids) - nvf)
    del splits
    metrics = {"corpus_prep_s": time.time() - t_start, "train_stream_tokens": int(len(train_ids)),
               "train_stream_files": n_train_files, "valid_eval_tokens_available": int(len(valid_ids)),
               "test_eval_tokens_available": int(len(test_ids)), "valid_bytes_per_token": bytes_per_token}
    log(metrics)
    train(train_ids, valid_ids, test_ids, tok_dir, metrics)


def batches_eval(ids, n_max_windows):
    import torch
    n = min(len(ids) // (SEQ + 1), n_max_windows)
    t = torch.from_numpy(ids[: n * (SEQ + 1)].astype("int64")).view(n, SEQ + 1)
    return t


def train(train_ids, valid_ids, test_ids, tok_dir, metrics):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3ForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    torch.manual_seed(SEED)
    cfg = common.target_config()
    model = Qwen3ForCausalLM(cfg).float().to(dev)
    n_par = common.n_params(model)
    log(f"target params {n_par} ({n_par / 1e6:.2f}M), attn={getattr(model.config, '_attn_implementation', None)}, "
        f"tied={model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()}")
    metrics["params"] = n_par
    data = torch.from_numpy(train_ids.astype(np.int32)).to(dev)
    N = data.numel()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
    gen = torch.Generator(device=dev).manual_seed(SEED)
    ar = torch.arange(SEQ + 1, device=dev)
    V = cfg.vocab_size

    def loss_fn(x, y):
        h = model.model(input_ids=x, use_cache=False).last_hidden_state
        logits = model.lm_head(h)
        return F.cross_entropy(logits.float().view(-1, V), y.reshape(-1))

    train_deadline = DL.t_end - TRAIN_END_MARGIN_S
    total_steps = None
    hist = []
    step = 0
    t_train0 = time.time()
    t_meas = None
    stopped_by = "steps"
    model.train()
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
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(w[:, :-1], w[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step == 10:
                torch.cuda.synchronize()
                t_meas = time.time()
            if step == 40 and total_steps is None:
                torch.cuda.synchronize()
                sps = (time.time() - t_meas) / 30
                left = train_deadline - time.time()
                total_steps = 40 + int(left / sps * 0.97)
                log(f"measured {sps * 1000:.1f} ms/step = {BSZ * SEQ / sps / 1e3:.0f}k tok/s; total_steps={total_steps}")
                metrics["measured_tok_per_s"] = BSZ * SEQ / sps
            if step % 50 == 0 or step == 1:
                l = float(loss)
                hist.append({"step": step, "loss": l, "lr": lr, "grad_norm": float(gn), "t": time.time() - t_train0})
                log(f"step {step} loss {l:.4f} lr {lr:.2e} gn {float(gn):.3f} t {time.time() - t_train0:.0f}s")
    except Exception as e:
        stopped_by = "exception: " + repr(e)
        log("TRAINING EXCEPTION", repr(e))
    torch.cuda.synchronize()
    train_s = time.time() - t_train0
    metrics.update({"steps": step, "planned_steps": total_steps, "stopped_by": stopped_by,
                    "tokens_seen": step * BSZ * SEQ, "train_seconds": train_s, "seq_len": SEQ,
                    "batch_sequences": BSZ, "peak_lr": PEAK_LR, "warmup": WARMUP, "history": hist,
                    "epochs_over_train_stream": step * BSZ * SEQ / max(1, N)})
    log(f"trained {step} steps, {step * BSZ * SEQ / 1e6:.1f}M tokens in {train_s:.0f}s ({stopped_by})")

    # ---- eval (bf16 autocast, like training), each split at most 2M tokens
    model.eval()

    @torch.no_grad()
    def evaluate(ids, max_windows=2000):
        if len(ids) < SEQ + 1:
            return None
        t = batches_eval(ids, max_windows)
        tot, cnt = 0.0, 0
        for i in range(0, t.shape[0], 64):
            if DL.left() < 35:
                break
            w = t[i:i + 64].to(dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = model.model(input_ids=w[:, :-1], use_cache=False).last_hidden_state
                lg = model.lm_head(h)
            l = F.cross_entropy(lg.float().reshape(-1, V), w[:, 1:].reshape(-1), reduction="sum")
            tot += float(l)
            cnt += w[:, 1:].numel()
        return {"loss": tot / max(cnt, 1), "tokens": cnt}

    try:
        metrics["eval"] = {"train_first2M": evaluate(train_ids), "valid": evaluate(valid_ids), "test": evaluate(test_ids)}
        log("eval", metrics["eval"])
    except Exception as e:
        log("EVAL FAILED", repr(e))
    out_dir = os.path.join(WORK, "target")
    metrics["files"] = common.save_hf(model, out_dir, tok_dir)
    # bf16-weight eval on valid (what ships), if time allows
    try:
        if DL.left() > 45:
            metrics["eval_bf16_weights_valid"] = evaluate(valid_ids, 500)
            log("bf16 valid", metrics["eval_bf16_weights_valid"])
    except Exception as e:
        log("bf16 eval failed", repr(e))
    with open(os.path.join(WORK, "target_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
        f.write("\n")
    log("stage1 done")


if __name__ == "__main__":
    main()
