"""The tiny-code block drafter (models/tiny-code/block/): a DFlash-style drafter with DSpark's options.
Plain torch (no transformers classes), so the arithmetic is explicit and identical to what the C engine
implements in src/spec/drafters/block.c.

Notation: the committed stream S has positions 0..L-1, whose target taps are known; the pending token t
(sampled by the target, not yet processed by it) sits at position L.  tap_k(p) = the target's residual
stream after k decoder layers, before the final norm (k = 1..n_layer; HF hidden_states[k] for k < n_layer,
a forward hook on the last layer for k = n_layer).  E = the target's embed_tokens, W_lm = its lm_head
(tied here), both frozen and shared, never stored in the drafter.

Context (per committed position p, computed once, when p is committed):
    c_p = hidden_norm( fc( concat(tap_{l_1}(p), ..., tap_{l_n}(p)) ) )                  [D]
    for every drafter layer l:  K^l_p = RoPE_p(k_norm^l(Wk^l c_p)),  V^l_p = Wv^l c_p
Block (one forward per round): G = block_size entries at positions L..L+G-1,
    x_0 = E[t] (the anchor), x_j = E[mask_token_id] for j = 1..G-1
    each layer l:  n = input_layernorm(x);  q = RoPE(q_norm(Wq n));  k = RoPE(k_norm(Wk n));  v = Wv n
                   every block query attends to ALL context keys K^l_0..K^l_{L-1} and ALL G block keys
                   (bidirectional within the block, no causal mask);  x += Wo attn;
                   x += down(silu(gate(m)) * up(m)),  m = post_attention_layernorm(x)
    z_j = norm(x_j) for j = 1..G-1 (the anchor's output is unused)
    Chain (optional, config "chain_hidden" C > 0): a small recurrent head that lets position j see the
    token drafted before it (the block's positions are otherwise drafted in parallel), s_0 = 0,
        s_j = silu(chain.inp([z_j ; chain.enorm(E[prev_j])]) + chain.rec(s_{j-1}))      [C]
        u_j = z_j + chain.out(s_j)                                                      [H]
    (without a chain u_j = z_j)
    confidence_j = sigmoid(confidence.w . u_j + confidence.b)  (trained as P(drafts 1..j all accepted))
    logits_j = W_lm u_j + markov.out @ markov.embed[prev_j],  prev_1 = t, prev_j = d_{j-1}
    d_j = argmax logits_j (lowest id on ties)
Pruning (DSpark confidence schedule): with thresholds thr[0..G-2] in config.json ("prune_thresholds"),
the round keeps the leading drafts j with confidence_j >= thr[j-1], stopping at the first that fails;
no thresholds = keep all.  The caller's depth caps the count too.

RMSNorm (Qwen3): w * (x / sqrt(mean(x^2) + eps)) in float32.  RoPE: default, rotate_half, inv_freq =
theta^(-2i/head_dim).  GQA: query head h uses kv head h // (heads / kv_heads); scale 1/sqrt(head_dim).

Weights: one bf16 safetensors file with the state_dict keys of BlockDrafter below.
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtp import RMSNorm, rope_cos_sin, rotate_half


class BlockAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def kv(self, x, cos, sin):
        """x [B,T,H] -> k, v [B,nkv,T,hd] (k normed and rotated)."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        k = k * cos.to(k.dtype) + rotate_half(k) * sin.to(k.dtype)
        return k, v

    def forward(self, x, cos, sin, ck, cv, mask):
        """x [B,T,H] block inputs (normed), cos/sin [T,hd] of the block positions; ck/cv [B,nkv,N,hd]
        context keys/values; mask [B or 1, T, N+T] bool (True = may attend) or None (all)."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        q = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
        kb, vb = self.kv(x, cos, sin)
        k = torch.cat([ck.to(kb.dtype), kb], 2)
        v = torch.cat([cv.to(vb.dtype), vb], 2)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = torch.matmul(q, k.transpose(2, 3).to(q.dtype)).float() * (self.hd ** -0.5)
        if mask is not None:
            s = s.masked_fill(~mask[:, None], float("-inf"))
        p = torch.softmax(s, dim=-1).to(v.dtype)
        o = torch.matmul(p, v)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class BlockLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.self_attn = BlockAttention(c)
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, I, bias=False)
        self.mlp.up_proj = nn.Linear(H, I, bias=False)
        self.mlp.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x, cos, sin, ck, cv, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ck, cv, mask)
        m = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(m)) * self.mlp.up_proj(m))


class BlockDrafter(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.c = c
        self.fc = nn.Linear(len(c["tap_layers"]) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([BlockLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        r = c.get("markov_rank", 0)
        if r:
            self.markov = nn.Module()
            self.markov.embed = nn.Embedding(c["target_vocab_size"], r)
            self.markov.out = nn.Linear(r, c["target_vocab_size"], bias=False)
        C = c.get("chain_hidden", 0)
        if C:
            self.chain = nn.Module()
            self.chain.enorm = RMSNorm(H, c["rms_norm_eps"])
            self.chain.inp = nn.Linear(2 * H, C, bias=False)
            self.chain.rec = nn.Linear(C, C, bias=False)
            self.chain.out = nn.Linear(C, H, bias=False)
        if c.get("confidence_head"):
            self.confidence = nn.Linear(H, 1)

    def rope(self, pos):
        return rope_cos_sin(pos, self.c["head_dim"], self.c["rope_theta"], pos.device)

    def context(self, taps):
        """taps [B,N,n_taps*H] (concatenated in tap_layers order) -> c [B,N,H]."""
        return self.hidden_norm(self.fc(taps))

    def context_kv(self, ctx, pos):
        """ctx [B,N,H], pos [N] -> per layer (k, v) [B,nkv,N,hd]."""
        cos, sin = self.rope(pos)
        return [l.self_attn.kv(ctx, cos, sin) for l in self.layers]

    def block_hidden(self, x, pos, ckv, mask=None):
        """x [B,T,H] block inputs (embeddings), pos [T] (or [B,T] not supported: one position set),
        ckv per-layer context (k, v); returns z = norm(x_out) [B,T,H]."""
        cos, sin = self.rope(pos)
        for l, (ck, cv) in zip(self.layers, ckv):
            x = l(x, cos, sin, ck, cv, mask)
        return self.norm(x)

    def markov_bias(self, prev):
        """prev [...] token ids -> [..., V] logit bias (zeros when the head has no Markov term)."""
        return self.markov.out(self.markov.embed(prev))

    def chain_step(self, z, prev, s, E):
        """One chain step: z [..., H], prev [...] ids, s [..., C] or None (s_0 = 0) -> (u, s')."""
        a = self.chain.inp(torch.cat([z, self.chain.enorm(F.embedding(prev, E).to(z.dtype))], -1))
        if s is not None:
            a = a + self.chain.rec(s)
        s = F.silu(a)
        return z + self.chain.out(s), s

    def heads_in(self, z, prev, E):
        """z [..., G-1, H], prev [..., G-1] (teacher-forced previous tokens) -> u [..., G-1, H]."""
        if not hasattr(self, "chain"):
            return z
        us, s = [], None
        for j in range(z.shape[-2]):
            u, s = self.chain_step(z[..., j, :], prev[..., j], s, E)
            us.append(u)
        return torch.stack(us, -2)

    def conf_logit(self, z):
        return self.confidence(z).squeeze(-1)


def make_config(target_cfg, tap_layers, block_size, n_layers, intermediate, markov_rank, mask_id, chain_hidden=0):
    tc = target_cfg
    theta = (tc.get("rope_parameters") or {}).get("rope_theta", tc.get("rope_theta", 10000.0))
    return {"architectures": ["TandemBlockDrafter"], "model_type": "tandem_block",
            "target_hidden_size": tc["hidden_size"], "target_num_hidden_layers": tc["num_hidden_layers"],
            "target_vocab_size": tc["vocab_size"], "tap_layers": list(tap_layers), "block_size": block_size,
            "mask_token_id": mask_id, "num_hidden_layers": n_layers, "hidden_size": tc["hidden_size"],
            "num_attention_heads": tc["num_attention_heads"], "num_key_value_heads": tc["num_key_value_heads"],
            "head_dim": tc["head_dim"], "intermediate_size": intermediate, "rms_norm_eps": tc["rms_norm_eps"],
            "rope_theta": float(theta), "markov_rank": markov_rank, "chain_hidden": chain_hidden,
            "confidence_head": True,
            "prune_thresholds": []}


def init_from_target(m, target):
    """Drafter layer i <- the attention/MLP weights of target layer (n_target - n_draft + i) where the
    shapes agree; Markov output zero (no bias at start); fc = averaging of the taps (identity blocks / n)."""
    nt, nd = len(target.model.layers), len(m.layers)
    for i, l in enumerate(m.layers):
        sd = target.model.layers[nt - nd + i].state_dict()
        own = l.state_dict()
        l.load_state_dict({k: v.float() for k, v in sd.items() if k in own and own[k].shape == v.shape}, strict=False)
    H = m.c["hidden_size"]
    n = len(m.c["tap_layers"])
    with torch.no_grad():
        m.fc.weight.copy_(torch.cat([torch.eye(H)] * n, 1) / n + torch.randn(H, n * H) * 0.01)
        if hasattr(m, "markov"):
            m.markov.out.weight.zero_()
            m.markov.embed.weight.normal_(0, 0.02)
        if hasattr(m, "confidence"):
            m.confidence.weight.zero_()
            m.confidence.bias.zero_()
        if hasattr(m, "chain"):
            m.chain.out.weight.zero_()  # starts as no chain: u = z


def save(m, d):
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in m.state_dict().items()}
    for f in os.listdir(d):  # a previous save's weights, one file or shards
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(d, f))
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    import shard
    shard.split(d)  # files in the repository stay under 16 MB
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(m.c, f, indent=2)
        f.write("\n")
    return sorted(sd)


def load(d, dtype=torch.float32, device="cpu"):
    from safetensors.torch import load_file
    c = json.load(open(os.path.join(d, "config.json")))
    m = BlockDrafter(c)
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        sd = {}
        for f in sorted(set(json.load(open(idx))["weight_map"].values())):
            sd.update(load_file(os.path.join(d, f)))
    else:
        sd = load_file(os.path.join(d, "model.safetensors"))
    m.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    return m.to(device=device, dtype=dtype).eval()


# ------------------------------------------------------------------------------------ training form
def train_forward(m, taps, stream, anchors, E, W_lm):
    """Teacher-forced training forward over many blocks of many sequences at once.
    taps [B,N,n_taps*H] (target taps of every position), stream [B,N] token ids (the target's greedy
    stream), anchors [B,A] anchor positions a (1 <= a <= N-G).  Block b of sequence i: entries at
    positions a..a+G-1, anchor stream[a], masks; context = positions < a.
    Returns z [B,A,G-1,H], labels [B,A,G-1] (stream[a+j]), prev [B,A,G-1] (stream[a+j-1])."""
    B, N, _ = taps.shape
    A = anchors.shape[1]
    G = m.c["block_size"]
    dev = taps.device
    ctx = m.context(taps)
    pos = torch.arange(N, device=dev)
    ckv = m.context_kv(ctx, pos)
    j = torch.arange(G, device=dev)
    bpos = anchors[:, :, None] + j  # [B,A,G]
    inp = torch.full((B, A, G), m.c["mask_token_id"], dtype=torch.long, device=dev)
    inp[:, :, 0] = torch.gather(stream, 1, anchors)
    x = F.embedding(inp, E).reshape(B, A * G, -1)
    # mask [B, A*G, N + A*G]: context keys p < a; block keys of the same block
    ctx_ok = pos[None, None, :] < anchors[:, :, None]  # [B,A,N]
    ctx_ok = ctx_ok[:, :, None, :].expand(B, A, G, N).reshape(B, A * G, N)
    blk = torch.arange(A, device=dev).repeat_interleave(G)
    blk_ok = (blk[:, None] == blk[None, :])[None].expand(B, A * G, A * G)
    mask = torch.cat([ctx_ok, blk_ok], 2)
    # rope per query position: positions differ per sequence, so rotate with [B,T] tables
    cos, sin = m.rope(bpos.reshape(-1))
    cos = cos.view(B, A * G, -1)[:, None]
    sin = sin.view(B, A * G, -1)[:, None]
    for l, (ck, cv) in zip(m.layers, ckv):
        x = l(x, cos, sin, ck, cv, mask)
    z = m.norm(x).view(B, A, G, -1)[:, :, 1:]
    lab = torch.gather(stream, 1, (anchors[:, :, None] + j[1:]).reshape(B, -1)).view(B, A, G - 1)
    prev = torch.gather(stream, 1, (anchors[:, :, None] + j[:-1]).reshape(B, -1)).view(B, A, G - 1)
    return z, lab, prev


# ------------------------------------------------------------------------------- reference drafting
@torch.no_grad()
def draft_round(m, ctx_kv, L, t, E, W_lm, depth=None, prune=True):
    """One block forward for one row: ctx_kv = per-layer (k, v) [1,nkv,L,hd] of the committed positions
    0..L-1, t = the pending token at position L.  Returns (drafts, logits rows [n][V], the confidences
    of the positions computed: n of them, or n + 1 when pruning stopped the round)."""
    G = m.c["block_size"]
    dev = E.device
    ids = torch.tensor([t] + [m.c["mask_token_id"]] * (G - 1), device=dev)
    z = m.block_hidden(F.embedding(ids, E)[None], torch.arange(L, L + G, device=dev), ctx_kv)[0, 1:]
    n = G - 1 if depth is None else min(depth, G - 1)
    thr = (m.c.get("prune_thresholds") or []) if prune else []
    ds, rows, confs, prev, s = [], [], [], t, None
    for j in range(n):  # in order: with a chain, u_j needs d_{j-1}
        pv = torch.tensor([prev], device=dev)
        if hasattr(m, "chain"):
            u, s = m.chain_step(z[j:j + 1], pv, s, E)
        else:
            u = z[j:j + 1]
        c = float(torch.sigmoid(m.conf_logit(u))[0]) if hasattr(m, "confidence") else 1.0
        confs.append(c)
        if thr and c < thr[j]:
            break
        lg = F.linear(u, W_lm)[0] + (m.markov_bias(pv)[0] if hasattr(m, "markov") else 0)
        d = int(torch.argmax(lg))
        ds.append(d)
        rows.append(lg)
        prev = d
    return ds, rows, torch.tensor(confs)


# ------------------------------------------------------------------------ labels from the target itself
def anchor_labels(h_last, stream, anchors, G, logits_fn):
    """Block labels that need no generation: h_last [B,N,H] the target's last-layer taps of stream [B,N]
    (any text: a corpus window or a greedy generation), anchors [B,A] with a + G - 1 <= N - 1.
    lab[b,i,j-1] = the target's greedy token after stream[..a+j-1] = argmax logits_fn(h_last[a+j-1]),
    j = 1..G-1; w[b,i,j-1] = 1 while stream[a+1..a+j-1] all equal the target's greedy tokens (then lab_j IS
    the target's greedy continuation of stream[..a], the drafter's target), else 0.
    On the target's own greedy generations lab = stream[a+j] and w = 1.  Returns (lab, w float)."""
    B, A = anchors.shape
    j = torch.arange(G - 1, device=h_last.device)
    idx = (anchors[:, :, None] + j).reshape(B, -1)  # positions a + j - 1, j = 1..G-1
    h = torch.gather(h_last, 1, idx[..., None].expand(-1, -1, h_last.shape[-1]))
    lab = logits_fn(h).argmax(-1).view(B, A, G - 1)
    ok = (torch.gather(stream, 1, idx + 1).view(B, A, G - 1) == lab).float()
    w = torch.cat([torch.ones_like(ok[..., :1]), ok[..., :-1].cumprod(-1)], -1)
    return lab, w


@torch.no_grad()
def accepted_per_anchor(m, taps, stream, anchors, E, W_lm):
    """Teacher-forced greedy acceptance: for each anchor a of one sequence whose stream is the target's
    greedy generation from a on (anchors [A], a + G - 1 < N), the number of leading drafts d_1..d_{G-1}
    equal to stream[a+1..a+G-1] (prev_j = stream[a+j-1] = d_{j-1} on that prefix, so this IS what an
    unpruned depth-(G-1) round from anchor a accepts).  taps [1,N,n_taps*H], stream [1,N] -> [A] ints."""
    z, lab, prev = train_forward(m, taps, stream, anchors[None], E, W_lm)
    lg = F.linear(m.heads_in(z, prev, E), W_lm) + (m.markov_bias(prev) if hasattr(m, "markov") else 0)
    return (lg.argmax(-1) == lab).int().cumprod(-1).sum(-1)[0]


def simulate_rounds(acc, first, last):
    """Greedy speculative rounds replayed from per-anchor acceptance acc[a - first] (a = first..last):
    a round at anchor a accepts m = acc[a] drafts and emits m + 1 tokens, the next anchor is a + m + 1.
    Returns the list of m per round."""
    a, ms = first, []
    while a <= last:
        m = int(acc[a - first])
        ms.append(m)
        a += m + 1
    return ms
