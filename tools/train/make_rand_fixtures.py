"""Random-weight conformance fixtures for the engine's loader and forward pass (issue 2).

Usage: python3 make_rand_fixtures.py OUT_DIR      (CPU only, a few seconds)

Writes under OUT_DIR:
  qwen3-rand/       Qwen3ForCausalLM, float32, tied embeddings, SHARDED (2+ safetensors + index)
  qwen3-rand-bf16/  the same weights rounded to bfloat16 (single model.safetensors)
  qwen3-rand-f16/   the same weights rounded to float16 (single model.safetensors)
  llama-rand/       LlamaForCausalLM, float32, untied, Llama-3 rope scaling (single file)
each with ref.json and logits.f32:
  logits.f32  raw little-endian float32, shape [sum(prompt lengths)][vocab], row-major; rows are
              the positions of prompt 0, then prompt 1, then prompt 2 (each prompt run alone
              from position 0, no padding); row r = logits predicting the token after position r.
  ref.json    prompts (token-id lists), greedy continuations, layout and provenance.

Weights: the default init is replaced by 0.08*N(0,1) for every matrix and 1 + 0.2*N(0,1) for the
norm weights (so that a missing norm weight or a wrong q/k-norm shows up in the logits).
Reference logits: CPU, float32, attn_implementation="eager", loaded back from the saved files
(for the bf16/f16 copies: the rounded weights upcast to float32), TF32 off.
Greedy: manual argmax loop with a full recompute of the whole sequence each step (no KV cache),
32 new tokens, torch.argmax (first index on ties), no stop token.
"""
import json
import os
import sys

import numpy as np
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_num_threads(4)

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
PROMPT_LENS = [5, 17, 40]
N_NEW = 32


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def reference(d, prompts, info):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    vocab = m.config.vocab_size
    rows = []
    gens = []
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([p])
            lg = m(input_ids=x, use_cache=False).logits[0].float()
            assert lg.shape == (len(p), vocab)
            rows.append(lg.numpy().astype("<f4"))
            seq = list(p)
            margins = []
            for _ in range(N_NEW):
                last = m(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
                top2 = torch.topk(last, 2).values
                margins.append(float(top2[0] - top2[1]))
                seq.append(int(torch.argmax(last)))
            gens.append({"new_tokens": seq[len(p):], "min_top1_top2_margin": min(margins)})
    allrows = np.concatenate(rows, axis=0)
    allrows.tofile(os.path.join(d, "logits.f32"))
    offs = np.cumsum([0] + [len(p) for p in prompts])[:-1].tolist()
    ref = {
        "model_dir": os.path.basename(d),
        "architecture": type(m).__name__,
        "weights_dtype": info["dtype"],
        "compute": "CPU float32, attn_implementation=eager, TF32 off; weights loaded from this directory and upcast to float32",
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "vocab_size": vocab,
        "prompts": [{"token_ids": p, "length": len(p), "logits_row_offset": o} for p, o in zip(prompts, offs)],
        "logits_file": "logits.f32",
        "logits_layout": "little-endian float32, row-major [sum(prompt lengths)=%d][vocab=%d]; prompt i's rows start at "
                         "prompts[i].logits_row_offset; row r of a prompt = logits at position r (predicting token r+1); "
                         "each prompt is evaluated alone from position 0" % (allrows.shape[0], vocab),
        "greedy": {"method": "manual argmax loop, full recompute of the whole sequence each step (no KV cache), "
                             "torch.argmax (lowest index on ties), no stop tokens",
                   "new_tokens": N_NEW,
                   "continuations": gens},
        "logits_stats": {"absmax": float(np.abs(allrows).max()), "std": float(allrows.std())},
    }
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(d, "logits", allrows.shape, "greedy margins", [g["min_top1_top2_margin"] for g in gens], flush=True)


def listing(d):
    return [(f, os.path.getsize(os.path.join(d, f))) for f in sorted(os.listdir(d))]


def main():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    g = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in PROMPT_LENS]
    report = {}

    # ---- Qwen3, f32, sharded
    qcfg = Qwen3Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
                       max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    q = Qwen3ForCausalLM(qcfg).float()
    assert q.lm_head.weight.data_ptr() == q.model.embed_tokens.weight.data_ptr(), "embeddings not tied"
    randomize(q, 11)
    dq = os.path.join(OUT, "qwen3-rand")
    q.save_pretrained(dq, max_shard_size=200_000)
    shards = [f for f in os.listdir(dq) if f.endswith(".safetensors")]
    assert len(shards) >= 2 and os.path.exists(os.path.join(dq, "model.safetensors.index.json")), listing(dq)
    reference(dq, prompts, {"dtype": "float32"})
    report["qwen3-rand"] = listing(dq)
    for dt, name in ((torch.bfloat16, "qwen3-rand-bf16"), (torch.float16, "qwen3-rand-f16")):
        d = os.path.join(OUT, name)
        qq = Qwen3ForCausalLM(qcfg)
        qq.load_state_dict(q.state_dict())
        qq.to(dt).save_pretrained(d, max_shard_size=10_000_000_000)
        reference(d, prompts, {"dtype": str(dt).replace("torch.", "")})
        report[name] = listing(d)

    # ---- Llama, f32, untied, llama3 rope scaling
    lcfg = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=160, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64},
                       rms_norm_eps=1e-5, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                       pad_token_id=None)
    torch.manual_seed(0)
    l = LlamaForCausalLM(lcfg).float()
    assert l.lm_head.weight.data_ptr() != l.model.embed_tokens.weight.data_ptr()
    randomize(l, 22)
    dl = os.path.join(OUT, "llama-rand")
    l.save_pretrained(dl, max_shard_size=10_000_000_000)
    reference(dl, prompts, {"dtype": "float32"})
    report["llama-rand"] = listing(dl)
    # the inverse frequencies transformers actually used (documents the three llama3 bands)
    from transformers import AutoModelForCausalLM
    lm = AutoModelForCausalLM.from_pretrained(dl, dtype=torch.float32, attn_implementation="eager")
    try:
        inv = lm.model.rotary_emb.inv_freq.tolist()
    except Exception as e:  # noqa
        inv = "unavailable: %r" % (e,)
    with open(os.path.join(dl, "ref.json")) as f:
        ref = json.load(f)
    ref["rope_inv_freq_used_by_transformers"] = inv
    with open(os.path.join(dl, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    for k, v in report.items():
        print(k, v)
        print(open(os.path.join(OUT, k, "config.json")).read())


if __name__ == "__main__":
    main()
