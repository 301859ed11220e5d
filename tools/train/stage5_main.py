"""Stage 5 (GPU machine): retrain the MTP head (tools/train/mtp.py) on the frozen target's own greedy
generations, with its recursion unrolled, then rebuild its reference fixture with stage 3's float32 phase.

Usage: python3 stage5_main.py WORK_DIR      (driven by tools/train/stage5.sh; honours STAGE_DEADLINE)
Needs models/tiny-code/target, models/tiny-code/mtp (the stage-3 head: the starting point) and
bench/prompts/code.jsonl.  Writes into $OUT/mtp: config.json + model.safetensors, metrics.json, ref.json,
logits.f32 (the same formats as stage 3).

Data: common.generation_data with the same (prompt, generated) groups as stage 4.
Training (common.train_loop): the target frozen (bf16) gives the last layer's taps of every position; the
head runs K = 3 drafting steps teacher-forced over every base position at once (mtp.unrolled_logits: step
s at base p reads (y^{s-1}_p, x_{p+s}) and attends to the true entries up to p plus its own round's
recursive entries, as the C drafter does); loss = sum_s w_s CE(step s logits, x_{p+s+1}) over labels in
the generated part (the target's greedy tokens), w = 1, 0.8, 0.6.  fp32 master weights, bf16 autocast.
"""
import json
import os
import sys

import common
from common import log
import mtp as M

WORK = sys.argv[1]
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TARGET = os.path.join(ROOT, "models", "tiny-code", "target")
START = os.path.join(ROOT, "models", "tiny-code", "mtp")
OUT = os.path.join(os.environ.get("OUT") or os.path.join(WORK, "out"), "mtp")
DL = common.Deadline(560)
SPECS = [(24, 136), (96, 160), (256, 160), (448, 160)]
GEN_BATCH, GEN_S, N_VALID = 1024, float(os.environ.get("STAGE5_GEN_S", "60")), 64
# unrolled drafting steps and their loss weights (STAGE5_K, STAGE5_WS="1,0.8,0.6"), peak learning rate
# (STAGE5_LR), sequences per step (STAGE5_BSZ); STAGE5_DATA_SEED (default 556) picks the prompt windows
K = int(os.environ.get("STAGE5_K", "3"))
WS = [float(w) for w in os.environ.get("STAGE5_WS", "1,0.8,0.6").split(",")]
if len(WS) != K:
    sys.exit(f"stage5: STAGE5_WS has {len(WS)} weights for STAGE5_K={K} steps")
BSZ, PEAK_LR, WARMUP, SEED = int(os.environ.get("STAGE5_BSZ", "32")), float(os.environ.get("STAGE5_LR", "5e-4")), 50, 555
POST_S = float(os.environ.get("STAGE5_POST_S", "80"))
EAGER = os.environ.get("STAGE5_EAGER") == "1"  # explicit attention (tests without SDPA)


def main():
    import torch
    import torch.nn.functional as F

    os.makedirs(OUT, exist_ok=True)
    dev = os.environ.get("STAGE_DEVICE", "cuda")
    metrics = {"init": os.environ.get("STAGE5_INIT_NOTE", "models/tiny-code/mtp of stage 3"), "unrolled_steps": K, "step_weights": WS,
               "sequence_groups (prompt, generated)": SPECS, "batch_sequences": BSZ, "peak_lr": PEAK_LR,
               "warmup": WARMUP, "loss": "sum_s w_s CE(step s, target greedy token) / sum w"}
    tok = common.load_tokenizer(TARGET)
    splits, _ = common.build_corpus()
    train_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["train"], "train:"), 20_000_000, 12)
    valid_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["valid"], "valid:"), 1_100_000, 8)
    del splits
    if dev.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    tgt = common.load_model(TARGET, dtype=torch.bfloat16, attn="sdpa", device=dev)
    for p in tgt.parameters():
        p.requires_grad_(False)
    NL = len(tgt.model.layers)
    tp = common.Taps(tgt, [NL])
    data, _ = common.generation_data(tgt, train_ids, valid_ids, SPECS, GEN_BATCH, GEN_S, N_VALID,
                                      int(os.environ.get("STAGE5_DATA_SEED", str(SEED + 1))), dev)
    metrics["data_seed"] = int(os.environ.get("STAGE5_DATA_SEED", str(SEED + 1)))
    metrics["train_sequences"] = {str(k): int(v.shape[0]) for k, v in data.items()}
    head = M.load(START, torch.float32, dev)
    head.train()
    for p in head.parameters():
        p.requires_grad_(True)
    E = tgt.model.embed_tokens.weight
    V = E.shape[0]
    gen = torch.Generator(device=dev).manual_seed(SEED)

    def step_fn(step):
        P, n_new = SPECS[step % len(SPECS)]
        grp = data[(P, n_new)]
        seq = grp[torch.randint(0, grp.shape[0], (BSZ,), generator=gen, device=dev)]
        h = tp.of(seq)
        with torch.autocast(dev.split(":")[0], dtype=torch.bfloat16):
            outs = M.unrolled_logits(head, h, seq, K, E, eager=EAGER)
        loss, info = 0.0, {}
        for s, (lg, lab) in enumerate(outs, 1):
            Mlen = lab.shape[1]
            ok = (torch.arange(Mlen, device=dev) + s + 1 >= P).float()[None].expand(lab.shape)
            ce = F.cross_entropy(lg.float().reshape(-1, V), lab.reshape(-1), reduction="none").view(lab.shape)
            n = ok.sum().clamp(min=1)
            ce_s = (ce * ok).sum() / n
            loss = loss + WS[s - 1] * ce_s
            info[f"ce{s}"] = ce_s.detach()
            info[f"acc{s}"] = ((lg.argmax(-1) == lab).float() * ok).sum() / n
        return loss / sum(WS), info

    res = common.train_loop(head.parameters(), step_fn, DL.t_end - POST_S, PEAK_LR, WARMUP, wd=0.01)
    metrics.update(res)
    log(f"trained {res['steps']} steps in {res['train_seconds']}s ({res['stopped_by']})")
    keys = M.save(head, OUT)
    log("saved", keys)
    tp.remove()
    del tgt, data, head
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    import stage3_main as S3
    S3.reference_phase(OUT, tok, valid_ids, metrics, dev)
    log("stage5 done")


if __name__ == "__main__":
    main()
