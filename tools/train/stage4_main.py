"""Stage 4 (GPU machine): train the block drafter (tools/train/block.py) on the frozen target, calibrate
its confidence-pruning thresholds, and compute the reference fixture tests/fixtures/tiny-code-block/.

Usage: python3 stage4_main.py WORK_DIR      (driven by tools/train/stage4.sh; honours STAGE_DEADLINE)
Environment: STAGE4_LAYERS, STAGE4_INIT, STAGE4_PEAK_LR, STAGE4_SEED, STAGE4_GEN_S, STAGE4_POST_S, STAGE4_WPOS_TAU
(loss weight of block position j = exp(-(j-1)/tau), default 5), STAGE4_GEN_BATCH, STAGE4_N_BENCH,
STAGE4_CHAIN (the chain head's width C, block.py; default 0 = none; a warm start without one starts it as
the identity, u = z), STAGE4_G (block_size G: the anchor + G-1 drafts, default 8; no weight depends on G, so
a warm start may come from a drafter of another block size; the replays, calibration (G-1 thresholds) and
fixture all run at depth G-1).
Needs models/tiny-code/target (committed), models/tiny-code/mtp (for the comparison only; without it the
benchmark-prompt replay measures the drafter alone) and bench/prompts/code.jsonl.  Writes into $OUT:
block/config.json + block/model.safetensors (the drafter), metrics.json, ref.json, logits.f32, alt.tar (the
variant not chosen, for the record).

Two sources of blocks, taken in turn step by step:
- Generations (common.generation_data): for each (P, n) in SPECS, random P-token windows of the train stream
  (the deterministic corpus / tokenizer / hash order of stages 1-3, first 20M tokens), each continued
  greedily by the target for n tokens (bf16, sdpa, KV cache, batches of GEN_BATCH, groups in turn, for GEN_S
  seconds); ANCH anchors a in [P-1, P+n-G] per sequence.  Validation sequences: the same from the valid split.
- Corpus text (distillation on real text, fresh windows every step, never repeated): REAL_N-token windows of
  the train stream, ANCH anchors a in [1, REAL_N-G].  The label of block position j is the target's own
  greedy token after stream[..a+j-1] (argmax of its logits there), and it counts (weight 1) only while the
  text stream[a+1..a+j-1] agrees with the target's greedy tokens, i.e. while that label is the target's greedy
  continuation of stream[..a] (block.anchor_labels).  This puts anchors where the benchmark's first rounds
  are (contexts of real code, not of the target's own repetitive continuations) and removes the
  memorisation of a small set of generations (the first block drafter: 47 epochs, train 5.1 / valid 3.6).
Both sources use the same labels (block.anchor_labels; on generations they are the stream itself).
Training (common.train_loop): target frozen (bf16); each step takes BSZ sequences, computes the target's taps
of every position (forward hooks on the tapped layers: residual stream after k layers, before the final
norm); each block is [stream[a], mask x (G-1)] at positions a..a+G-1 with the context positions < a; loss =
position-weighted (exp(-(j-1)/WPOS_TAU)) CE of the block's logits (shared lm_head over u, the chain head's
output with the teacher-forced previous tokens where there is one (STAGE4_CHAIN), else z; + Markov bias of the
teacher-forced previous token) against the labels, weighted by the label weights, + 0.2 * BCE(confidence_j, drafts 1..j
all correct) on detached hiddens, also weighted.  VARIANTS drafters (layer counts) train side by side on the
same blocks (one optimiser, independent parameters).  Drafter fp32 master weights under bf16 autocast.
Warm start (STAGE4_INIT=DIR, relative to the repository root): every variant starts from DIR's trained
drafter; the layers DIR lacks (a deeper variant) start from the target's layers with o_proj and down_proj
zero, i.e. as identities, so the deeper drafter starts as DIR's function.
Selection: the variant with the most accepted drafts per round in replayed greedy speculative decoding at
depth G-1 (block.simulate_rounds) on valid-split generations from 256-token prompts wins, a deeper variant
only by a margin of DEEPER_MARGIN per extra layer (its round costs more).  The benchmark prompts
(bench/prompts/code.jsonl, the first N_BENCH, 128 generated tokens, float32) are measured for every
variant and for the MTP head (models/tiny-code/mtp), for the record only.
"""
import json
import os
import sys
import time

import common
from common import log
import block as BK

WORK = sys.argv[1]
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TARGET = os.path.join(ROOT, "models", "tiny-code", "target")
MTP_DIR = os.path.join(ROOT, "models", "tiny-code", "mtp")
PROMPTS = os.path.join(ROOT, "bench", "prompts", "code.jsonl")
OUT = os.environ.get("OUT") or os.path.join(WORK, "out")
DL = common.Deadline(560)
TAPS, G, INTER, RANK = [2, 6, 10], int(os.environ.get("STAGE4_G", "8")), 1280, 32
assert G >= 2, "STAGE4_G: the block holds the anchor and at least one draft"
CHAIN = int(os.environ.get("STAGE4_CHAIN", "0"))
VARIANTS = [int(x) for x in os.environ.get("STAGE4_LAYERS", "2,3").split(",")]  # drafter layer counts
DEEPER_MARGIN = 0.05
INIT = os.environ.get("STAGE4_INIT")  # a trained block drafter's directory (relative to the repository root)
PEAK_LR_ENV = os.environ.get("STAGE4_PEAK_LR")
SPECS = [(24, 136), (96, 160), (256, 160), (448, 160)]  # (prompt tokens, generated tokens) groups
GEN_BATCH, GEN_S, N_VALID = int(os.environ.get("STAGE4_GEN_BATCH", "4096")), float(os.environ.get("STAGE4_GEN_S", "80")), 128
REAL_N = 384  # corpus-text window length
BSZ, ANCH, PEAK_LR, WARMUP, SEED = 128, 24, float(PEAK_LR_ENV or 1.5e-3), 50, int(os.environ.get("STAGE4_SEED", "2024"))
POST_S = float(os.environ.get("STAGE4_POST_S", "150"))
WPOS_TAU = float(os.environ.get("STAGE4_WPOS_TAU", "5"))  # loss weight of block position j: exp(-(j-1)/WPOS_TAU)
N_BENCH, BENCH_NEW, BENCH_MAXP = int(os.environ.get("STAGE4_N_BENCH", "40")), 128, 256
TAU = 0.25  # pruning: keep draft j while the calibrated P(drafts 1..j accepted) >= TAU
ROUNDS, N_FIX, N_CAND = 6, 3, 24
DEFINITION = f"""Greedy speculative decoding of the target with the block drafter, 6 rounds per prompt.
All compute float32 (the committed bf16 weights of models/tiny-code/target and models/tiny-code/block
upcast), eager attention, TF32 off, on the GPU; every target forward recomputes the whole sequence from
position 0 (no KV cache); argmax = lowest id on ties.
State: committed stream S (starts as prompt_ids[0..N-1)), pending token t (starts as prompt_ids[N-1]).
The drafter's context holds c_p for p = 0..|S|-1 (from the target's taps of S; tap layers in config.json).
Round: draft = one block forward (tools/train/block.py draft_round) with the anchor t at position |S|, at
depth block_size-1 = {G - 1}, pruned by the confidence thresholds of config.json: drafts d_1..d_n (0 <= n <= {G - 1}).
verify: the target over S + [t, d_1..d_n]; target_greedy[i] = argmax of its logits at position |S|+i
(i = 0..n).  m = number of leading i < n with target_greedy[i] == d_{{i+1}}; emitted = target_greedy[0..m].
commit: S += [t, d_1..d_m]; t := target_greedy[m].
Round 0 of each prompt also records the UNPRUNED draft (all {G - 1} positions): drafts_unpruned and its full
logits rows (logits_rows) in logits.f32."""



def main():
    import numpy as np
    import torch
    import torch.nn.functional as F

    os.makedirs(WORK, exist_ok=True)
    os.makedirs(os.path.join(OUT, "block"), exist_ok=True)
    dev = os.environ.get("STAGE_DEVICE", "cuda")
    metrics = {"tap_layers": TAPS, "block_size": G, "variants (layers)": VARIANTS, "intermediate": INTER,
               "markov_rank": RANK, "chain_hidden": CHAIN, "sequence_groups (prompt, generated)": SPECS, "corpus_window": REAL_N,
               "step_sources": "generations and corpus windows in turn", "batch_sequences": BSZ,
               "anchors_per_sequence": ANCH, "peak_lr": PEAK_LR, "warmup": WARMUP, "prune_tau": TAU,
               "position_weight": f"exp(-(j-1)/{WPOS_TAU})", "seed": SEED}

    def sync():
        if dev.startswith("cuda"):
            torch.cuda.synchronize()

    def dump_metrics():
        with open(os.path.join(OUT, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
            f.write("\n")

    tok = common.load_tokenizer(TARGET)
    splits, _ = common.build_corpus()
    train_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["train"], "train:"), 20_000_000, 12)
    valid_ids, _ = common.tokenize_docs(tok, common.shuffled(splits["valid"], "valid:"), 1_000_000, 6)
    del splits

    torch.backends.cuda.matmul.allow_tf32 = True
    tgt = common.load_model(TARGET, dtype=torch.bfloat16, attn="sdpa", device=dev)
    for p in tgt.parameters():
        p.requires_grad_(False)
    tcfg = json.load(open(os.path.join(TARGET, "config.json")))
    V, H = tcfg["vocab_size"], tcfg["hidden_size"]
    tp = common.Taps(tgt, TAPS)
    t0 = time.time()
    data, vdata = common.generation_data(tgt, train_ids, valid_ids, SPECS, GEN_BATCH, GEN_S, N_VALID, SEED, dev)
    sync()
    metrics["train_sequences"] = {str(k): int(v.shape[0]) for k, v in data.items()}
    metrics["generation_seconds"] = round(time.time() - t0, 1)
    log("sample generation:", tok.decode(data[SPECS[1]][0, SPECS[1][0] - 20:SPECS[1][0] + 60].tolist()))
    corpus = torch.from_numpy(train_ids.astype(np.int64)).to(dev)

    E = tgt.model.embed_tokens.weight
    W = tgt.lm_head.weight
    assert TAPS[-1] == len(tgt.model.layers), "the last tap must be the target's last layer (greedy labels)"

    def tgt_logits(h):
        return F.linear(tgt.model.norm(h), W)

    drs = {}
    for nl in VARIANTS:
        cfg = BK.make_config(tcfg, TAPS, G, nl, INTER, RANK, common.MASK_ID, CHAIN)
        torch.manual_seed(SEED + nl)
        dr = BK.BlockDrafter(cfg)
        BK.init_from_target(dr, tgt)
        if INIT:  # warm start: a trained drafter's weights; layers it lacks start as identities
            ini = os.path.join(ROOT, INIT)
            if not os.path.exists(os.path.join(ini, "model.safetensors")) and os.path.exists(os.path.join(ini, "model.safetensors.xz")):
                import lzma  # the device's upload limit: the warm-start weights may travel xz-compressed
                with lzma.open(os.path.join(ini, "model.safetensors.xz")) as fi, open(os.path.join(ini, "model.safetensors"), "wb") as fo:
                    fo.write(fi.read())
            src = BK.load(ini, torch.float32, "cpu")
            own = dr.state_dict()
            dr.load_state_dict({k: v for k, v in src.state_dict().items() if k in own and own[k].shape == v.shape},
                               strict=False)
            with torch.no_grad():
                for l in dr.layers[len(src.layers):]:
                    l.self_attn.o_proj.weight.zero_()
                    l.mlp.down_proj.weight.zero_()
            metrics["init"] = f"{INIT} ({len(src.layers)} layers)" + (
                f"; layers {len(src.layers)}..{nl - 1}: target layers, o_proj and down_proj zero" if nl > len(src.layers) else "")
        drs[nl] = dr.float().to(dev).train()
        metrics[f"params_L{nl}"] = sum(p.numel() for p in dr.parameters())
        metrics[f"params_by_part_L{nl}"] = {n: sum(p.numel() for p in mod.parameters()) for n, mod in dr.named_children()}
        log(f"block drafter L{nl} params", metrics[f"params_L{nl}"], metrics[f"params_by_part_L{nl}"])
    wpos = torch.exp(-torch.arange(G - 1, device=dev, dtype=torch.float32) / WPOS_TAU)
    gen = torch.Generator(device=dev).manual_seed(SEED)

    def step_fn(step):
        if step % 2 == 0:
            P, n_new = SPECS[(step // 2) % len(SPECS)]
            grp = data[(P, n_new)]
            seq = grp[torch.randint(0, grp.shape[0], (BSZ,), generator=gen, device=dev)]
            anchors = torch.randint(P - 1, P + n_new - G + 1, (BSZ, ANCH), generator=gen, device=dev)
        else:
            st = torch.randint(0, corpus.shape[0] - REAL_N, (BSZ,), generator=gen, device=dev)
            seq = corpus[st[:, None] + torch.arange(REAL_N, device=dev)]
            anchors = torch.randint(1, REAL_N - G + 1, (BSZ, ANCH), generator=gen, device=dev)
        taps = tp.of(seq)
        with torch.no_grad(), torch.autocast(dev.split(":")[0], dtype=torch.bfloat16):
            lab, w = BK.anchor_labels(taps[..., -H:], seq, anchors, G, tgt_logits)
        ww = w * wpos
        loss, info = 0.0, {"label_weight": w.mean()}
        for nl, dr in drs.items():
            with torch.autocast(dev.split(":")[0], dtype=torch.bfloat16):
                z, _, prev = BK.train_forward(dr, taps, seq, anchors, E, W)
                u = dr.heads_in(z, prev, E)
                logits = F.linear(u, W) + dr.markov_bias(prev)
                cl = dr.conf_logit(u.detach())
            ce = F.cross_entropy(logits.float().reshape(-1, V), lab.reshape(-1), reduction="none").view(lab.shape)
            loss_ce = (ce * ww).sum() / ww.sum().clamp(min=1e-6)
            with torch.no_grad():
                hit = (logits.argmax(-1) == lab)
                cum = hit.int().cumprod(-1).float()
            bce = F.binary_cross_entropy_with_logits(cl.float(), cum, weight=w, reduction="sum") / w.sum().clamp(min=1e-6)
            loss = loss + loss_ce + 0.2 * bce
            info.update({f"ce_L{nl}": loss_ce, f"bce_L{nl}": bce, f"acc_pos1_L{nl}": hit[..., 0].float().mean(),
                         f"mean_accepted_L{nl}": (cum * w).sum(-1).mean()})
        return loss, info

    params = [p for dr in drs.values() for p in dr.parameters()]
    res = common.train_loop(params, step_fn, DL.t_end - POST_S, PEAK_LR, WARMUP, wd=0.01, clip=float(len(drs)) ** 0.5)
    metrics.update(res)
    metrics["positions_seen"] = res["steps"] * BSZ * ANCH * (G - 1)
    log(f"trained {res['steps']} steps in {res['train_seconds']}s ({res['stopped_by']})")
    for nl, dr in drs.items():
        BK.save(dr, os.path.join(WORK, f"L{nl}"))
    dump_metrics()
    tp.remove()
    del tgt, data, drs, corpus
    torch.cuda.empty_cache()

    # ---------------------------------------------------------------- float32 phase (bf16 weights upcast)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    T = common.load_model(TARGET, dtype=torch.float32, attn="eager", device=dev)
    for p in T.parameters():
        p.requires_grad_(False)
    tp = common.Taps(T, TAPS)
    E32, W32 = T.model.embed_tokens.weight, T.lm_head.weight
    models = {nl: BK.load(os.path.join(WORK, f"L{nl}"), torch.float32, dev) for nl in VARIANTS}

    # ---- replayed greedy speculative decoding at depth G-1 (unpruned): valid generations and bench prompts
    def replay(seqs_p, with_mtp):
        """seqs_p: list of (stream [1,N] = prompt + the target's greedy continuation, P).  Per model: rounds,
        mean accepted per round, P(round accepts >= j), and the mean over all anchors (teacher-forced)."""
        mtp = None
        if with_mtp:
            import mtp as M
            mtp = M.load(MTP_DIR, torch.float32, dev)
        per = {k: {"ms": [], "all": []} for k in list(models) + (["mtp"] if mtp is not None else [])}
        for seq, P in seqs_p:
            if DL.left() < 70:
                break
            N = seq.shape[1]
            taps = tp.of(seq)
            an = torch.arange(P - 1, N - G + 1, device=dev)
            for k, m in models.items():
                acc = BK.accepted_per_anchor(m, taps, seq, an, E32, W32).tolist()
                per[k]["all"] += acc
                per[k]["ms"] += BK.simulate_rounds(acc, P - 1, N - G)
            if mtp is not None:
                with torch.no_grad():
                    outs = M.unrolled_logits(mtp, taps[..., -H:], seq, G - 1, E32)
                    hit = torch.stack([(lg.argmax(-1) == lab)[0] for lg, lab in outs], -1)  # [M, G-1], base p
                acc = hit.int().cumprod(-1).sum(-1)[P - 2:].tolist()  # anchor a <-> base a - 1
                per["mtp"]["all"] += acc
                per["mtp"]["ms"] += BK.simulate_rounds(acc, P - 1, N - G)
        out = {}
        for k, v in per.items():
            ms = v["ms"]
            n = max(len(ms), 1)
            out[str(k)] = {"rounds": len(ms), "mean_accepted_per_round": round(sum(ms) / n, 4),
                           f"P(round accepts >= j), j=1..{G - 1}": [round(sum(1 for x in ms if x >= j) / n, 4) for j in range(1, G)],
                           "mean_accepted_all_anchors": round(sum(v["all"]) / max(len(v["all"]), 1), 4)}
        return out

    scores = {}
    try:
        vsel = vdata[(256, 160)]
        seqs = [(vsel[i:i + 1, :256 + BENCH_NEW], 256) for i in range(min(48, vsel.shape[0]))]
        r = replay(seqs, False)
        metrics["valid_replay_256_128"] = r
        scores = {nl: r[str(nl)]["mean_accepted_per_round"] for nl in VARIANTS}
        log("valid replay", r)
    except Exception as e:
        log("VALID REPLAY FAILED", repr(e))
        import traceback
        traceback.print_exc()
    best = VARIANTS[0]
    for nl in sorted(VARIANTS):
        if nl in scores and scores[nl] > scores.get(best, 0) * (1 + DEEPER_MARGIN * (nl - best)):
            best = nl
    metrics["chosen_layers"] = best
    metrics["layers"] = best
    log("chosen", best, scores)
    dump_metrics()
    try:
        prompts = [json.loads(l) for l in open(PROMPTS)][:N_BENCH]
        seqs = []
        with torch.no_grad():
            for p in prompts:
                ids = tok.encode(p["prompt"], add_special_tokens=False).ids[:BENCH_MAXP]
                if len(ids) < 2 or DL.left() < 90:
                    continue
                seqs.append((common.greedy_generate(T, torch.tensor([ids], device=dev), BENCH_NEW), len(ids)))
        # the device's upload may leave an empty directory where the MTP head was moved out: test its config
        has_mtp = os.path.isfile(os.path.join(MTP_DIR, "config.json"))
        if not has_mtp:
            log("bench replay: no MTP head at", MTP_DIR, "- skipping its comparison, the drafter(s) only")
        r = replay(seqs, has_mtp)
        r["prompts"] = len(seqs)
        metrics["bench_replay"] = r
        log("bench replay", r)
    except Exception as e:
        log("BENCH REPLAY FAILED", repr(e))
        import traceback
        traceback.print_exc()
    dump_metrics()

    import shutil
    import tarfile
    bd = os.path.join(OUT, "block")
    for f in os.listdir(os.path.join(WORK, f"L{best}")):  # config + weights (block.save shards them)
        if f == "config.json" or f.endswith(".safetensors") or f == "model.safetensors.index.json":
            shutil.copy(os.path.join(WORK, f"L{best}", f), os.path.join(bd, f))
    for nl in VARIANTS:
        if nl != best:
            with tarfile.open(os.path.join(OUT, "alt.tar"), "a") as tf:
                tf.add(os.path.join(WORK, f"L{nl}"), arcname=f"L{nl}")
    m = models[best]
    del models

    # ---- validation: teacher-forced blocks on the valid generations; acceptance by position, calibration
    try:
        with torch.no_grad():
            confs, cums, by_group = [], [], {}
            for (P, n_new), vd in vdata.items():
              for i in range(0, vd.shape[0], 32):
                if DL.left() < 35:
                    break
                seq = vd[i:i + 32]
                taps = tp.of(seq)
                an = torch.arange(P - 1, P + n_new - G + 1, 3, device=dev)[None].expand(seq.shape[0], -1).contiguous()
                z, lab, prev = BK.train_forward(m, taps, seq, an, E32, W32)
                u = m.heads_in(z, prev, E32)
                lg = F.linear(u, W32) + m.markov_bias(prev)
                cums.append((lg.argmax(-1) == lab).int().cumprod(-1).reshape(-1, G - 1).float().cpu())
                confs.append(torch.sigmoid(m.conf_logit(u)).reshape(-1, G - 1).cpu())
                by_group.setdefault(str((P, n_new)), []).append(cums[-1])
            conf, cum = torch.cat(confs), torch.cat(cums)
        thr = []
        calib = []
        for j in range(G - 1):
            c, y = conf[:, j], cum[:, j]
            qs = torch.quantile(c, torch.linspace(0, 1, 21))
            bins = []
            for b in range(20):
                sel = (c >= qs[b]) & (c <= qs[b + 1])
                bins.append((float(qs[b]), float(y[sel].mean()) if sel.any() else 0.0, float(c[sel].mean()) if sel.any() else 0.0))
            # lowest bin edge from which every higher bin has an empirical rate >= TAU
            k = 20
            while k > 0 and bins[k - 1][1] >= TAU:
                k -= 1
            thr.append(round(bins[k][0], 6) if k < 20 else 1.01)
            calib.append([[round(a, 4), round(r, 4), round(mc, 4)] for a, r, mc in bins])
        keep = torch.ones(conf.shape[0], dtype=torch.bool)
        kept = []
        for j in range(G - 1):
            keep = keep & (conf[:, j] >= thr[j])
            kept.append(keep.clone())
        kept = torch.stack(kept, 1).float()
        metrics["valid_teacher_forced"] = {
            "blocks": int(conf.shape[0]),
            f"P(drafts 1..j accepted), j=1..{G - 1}": [round(float(x), 4) for x in cum.mean(0)],
            "mean_accepted_unpruned": round(float(cum.sum(1).mean()), 4),
            "mean_accepted_unpruned_by_group": {k: round(float(torch.cat(v).sum(1).mean()), 4) for k, v in by_group.items()},
            "mean_drafted_pruned": round(float(kept.sum(1).mean()), 4),
            "mean_accepted_pruned": round(float((kept * cum).sum(1).mean()), 4),
            "mean_confidence_by_position": [round(float(x), 4) for x in conf.mean(0)],
            "calibration_bins [lower edge, empirical rate, mean confidence] by position": calib}
        metrics["prune_thresholds"] = thr
        cfg = json.load(open(os.path.join(bd, "config.json")))
        cfg["prune_thresholds"] = thr
        with open(os.path.join(bd, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        m.c["prune_thresholds"] = thr
        log("valid", {k: v for k, v in metrics["valid_teacher_forced"].items() if "calibration" not in k})
        log("thresholds", thr)
    except Exception as e:
        log("VALID FAILED", repr(e))
        import traceback
        traceback.print_exc()
    dump_metrics()

    # ---- fixture
    fx = {"definition": DEFINITION, "target": "models/tiny-code/target", "block": "models/tiny-code/block",
          "compute": "GPU (" + (torch.cuda.get_device_name() if dev.startswith("cuda") else dev) + ") float32, bf16 weights upcast, eager attention, TF32 off; transformers "
                     + __import__("transformers").__version__ + ", torch " + torch.__version__,
          "block_size": G, "rounds": ROUNDS, "vocab_size": V, "prune_thresholds": m.c.get("prune_thresholds")}

    @torch.no_grad()
    def target_run(ids):
        o, h = tp.run(lambda: T(input_ids=torch.tensor([ids], device=dev), use_cache=False))
        return h[0], o.logits[0].float()

    @torch.no_grad()
    def ctx_kv(taps):
        return m.context_kv(m.context(taps[None]), torch.arange(taps.shape[0], device=dev))

    def simulate(prompt_ids, prune):
        S, t = list(prompt_ids[:-1]), prompt_ids[-1]
        rec = []
        for r in range(ROUNDS):
            h, _ = target_run(S)
            kv = ctx_kv(h)
            ds, rows, conf = BK.draft_round(m, kv, len(S), t, E32, W32, G - 1, prune)
            _, lg = target_run(S + [t] + ds)
            n = len(ds)
            tg = lg[len(S):len(S) + n + 1].argmax(-1).tolist()
            tm = torch.topk(lg[len(S):len(S) + n + 1], 2, -1).values
            mm = 0
            while mm < n and tg[mm] == ds[mm]:
                mm += 1
            top = [torch.topk(x, 5) for x in rows]
            thr = m.c.get("prune_thresholds") or []
            rr = {"round": r, "S_len": len(S), "t": t, "drafts": ds, "n_drafts": n, "target_greedy": tg, "m": mm,
                  "emitted": tg[:mm + 1], "confidence": [round(float(x), 6) for x in conf],
                  "conf_threshold_margin": min([abs(float(conf[j]) - thr[j]) for j in range(min(len(thr), n + 1, G - 1))] or [1.0]),
                  "draft_top1_margin": [round(float(x.values[0] - x.values[1]), 6) for x in top],
                  "draft_top5_ids": [x.indices.tolist() for x in top],
                  "target_top1_margin": [round(float(a - b), 6) for a, b in tm.tolist()]}
            if r == 0:
                du, urows, _ = BK.draft_round(m, kv, len(S), t, E32, W32, G - 1, False)
                rr["drafts_unpruned"] = du
                rr["_rows"] = [x.cpu() for x in urows]
                rr["unpruned_top1_margin"] = [round(float(torch.topk(x, 2).values[0] - torch.topk(x, 2).values[1]), 6) for x in urows]
            rec.append(rr)
            S = S + [t] + ds[:mm]
            t = tg[mm]
        return rec, S, t

    try:
        prompts = [json.loads(l) for l in open(PROMPTS)]
        cands, stats = [], {"pruned": [], "unpruned": []}
        for p in prompts:
            if len(cands) >= N_CAND or DL.left() < 25:
                break
            ids = tok.encode(p["prompt"], add_special_tokens=False).ids
            if len(ids) < 20:
                continue
            ids = ids[:20 + (len(cands) * 13) % 41]
            rec, S, t = simulate(ids, True)
            recu, _, _ = simulate(ids, False)
            stats["pruned"] += [(r["m"], r["n_drafts"]) for r in rec]
            stats["unpruned"] += [(r["m"], r["n_drafts"]) for r in recu]
            ms = [r["m"] for r in rec]
            marg = min(min(r["draft_top1_margin"] + [1.0]) for r in rec)
            marg = min(marg, min(min(r["target_top1_margin"]) for r in rec), min(r["conf_threshold_margin"] for r in rec),
                       min(rec[0]["unpruned_top1_margin"]))
            score = any(r["m"] < r["n_drafts"] for r in rec) + any(r["m"] == r["n_drafts"] > 0 for r in rec) \
                + any(r["n_drafts"] < G - 1 for r in rec) + (marg > 1e-3) + 0.1 * len(set(ms))
            cands.append({"p": p, "ids": ids, "rec": rec, "S": S, "t": t, "score": score, "min_margin": marg})
        fx["candidates"] = {"n_prompts": len(cands)}
        for k, v in stats.items():
            fx["candidates"][k] = {"rounds": len(v), "mean_accepted_per_round": sum(a for a, _ in v) / max(len(v), 1),
                                   "mean_drafted_per_round": sum(b for _, b in v) / max(len(v), 1),
                                   "m_histogram": [sum(1 for a, _ in v if a == j) for j in range(G)]}
        metrics["spec_candidates"] = fx["candidates"]
        log("candidates", fx["candidates"])
        order = sorted(range(len(cands)), key=lambda i: (-cands[i]["score"], i))
        rows_out, out_prompts = [], []
        for i in sorted(order[:N_FIX]):
            c = cands[i]
            rounds = []
            for r in c["rec"]:
                rr = {k: v for k, v in r.items() if k != "_rows"}
                if "_rows" in r:
                    rr["logits_rows"] = list(range(len(rows_out), len(rows_out) + len(r["_rows"])))
                    rows_out += [x.numpy().astype("<f4") for x in r["_rows"]]
                rounds.append(rr)
            out_prompts.append({"id": c["p"]["id"], "kind": c["p"]["kind"], "prompt_ids": c["ids"],
                                "n_prompt": len(c["ids"]), "min_margin": c["min_margin"], "rounds": rounds,
                                "final_S": c["S"], "final_t": c["t"]})
            log("fixture prompt", c["p"]["id"], "len", len(c["ids"]), "m/n per round",
                [(r["m"], r["n_drafts"]) for r in c["rec"]], "min margin", c["min_margin"])
        np.stack(rows_out).tofile(os.path.join(OUT, "logits.f32"))
        fx["logits_file"] = "logits.f32"
        fx["logits_layout"] = ("little-endian float32, row-major [n_rows][vocab_size]; rounds[0].logits_rows[j] = the row "
                               "holding the full logits (Markov bias included) of position j+1 of the UNPRUNED round-0 draft")
        fx["n_rows"] = len(rows_out)
        fx["prompts"] = out_prompts
    except Exception as e:
        log("FIXTURE FAILED", repr(e))
        import traceback
        traceback.print_exc()
    with open(os.path.join(OUT, "ref.json"), "w") as f:
        json.dump(fx, f, indent=1)
        f.write("\n")
    dump_metrics()
    log("stage4 done")


if __name__ == "__main__":
    main()
