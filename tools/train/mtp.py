"""The tiny-code MTP head (models/tiny-code/mtp/): a one-layer multi-token-prediction drafter that taps
the target's residual stream.  Plain torch, no transformers classes, so the arithmetic is explicit and
identical to what the C engine implements.

Notation: h_p = the target's residual stream after its LAST decoder layer, BEFORE the final norm, at
position p; E = the target's embed_tokens (tied with its lm_head), frozen and shared.  The head predicts
x_{p+2} from (h_p, x_{p+1}):
    u      = fc( concat( pre_fc_norm_embedding(E[x_{p+1}]), pre_fc_norm_hidden(h_p) ) )   # [emb; hid]
    y      = Qwen3 decoder layer (u) at position p (RoPE angle of p), causal over the MTP positions 0..p
    logits = norm(y) @ E^T
Recursive drafting: the next step uses (h := y, x := the drafted token) at position p+1.

RMSNorm (Qwen3): w * (x / sqrt(mean(x^2) + eps)), computed in float32, cast back to the input dtype
before the weight multiply.  Decoder layer (Qwen3): x + o_proj(attn(RoPE(q_norm(q)), RoPE(k_norm(k)), v))
with pre-norm input_layernorm; then x + down(silu(gate(n)) * up(n)), n = post_attention_layernorm(x).
q_norm / k_norm are per-head RMSNorms over head_dim; RoPE is the default (non-interleaved, rotate_half)
with inv_freq = theta^(-2i/head_dim); GQA: query head i uses kv head i // (heads / kv_heads);
scale 1/sqrt(head_dim).

Weights: one bf16 safetensors file, keys 'mtp.' + the state_dict keys of MTP below (Qwen3-Next naming).
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dt)


def rope_cos_sin(pos, head_dim, theta, device):
    """pos: LongTensor [T] -> cos, sin float32 [T, head_dim] (HF default rope, attention_scaling 1)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    fr = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([fr, fr], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


class Attention(nn.Module):
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

    def forward(self, x, cos, sin, eager, mask=None):
        """mask: None = causal, or a bool [T, T] (True = may attend) for unrolled multi-step training."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # as HF: cos/sin cast to the activations' dtype
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if eager:  # float32 reference path: explicit causal softmax attention (as HF eager)
            s = torch.matmul(q, k.transpose(2, 3)) * (self.hd ** -0.5)
            block = ~mask if mask is not None else torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(block, float("-inf"))
            p = torch.softmax(s.float(), dim=-1).to(q.dtype)
            o = torch.matmul(p, v)
        else:  # training path (bf16 autocast): the norms promote q/k to float32; SDPA wants one dtype
            o = F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v, attn_mask=mask,
                                               is_causal=mask is None, scale=self.hd ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, eager=False, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, eager, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.c = c
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(H, c["rms_norm_eps"])
        self.pre_fc_norm_hidden = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["num_mtp_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])

    def hidden(self, h, emb, pos, eager=False):
        """h: [B,T,H] target taps (or recursive y), emb: [B,T,H] = E[x_{p+1}], pos: LongTensor [T]
        (positions p).  Returns y [B,T,H] (decoder-layer output, before the final norm)."""
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(h)], dim=-1))
        cos, sin = rope_cos_sin(pos, self.c["head_dim"], self.c["rope_theta"], h.device)
        for layer in self.layers:
            u = layer(u, cos, sin, eager)
        return u

    def logits(self, y, E):
        return F.linear(self.norm(y), E)


def make_config(target_cfg):
    tc = target_cfg
    theta = (tc.get("rope_parameters") or {}).get("rope_theta", tc.get("rope_theta", 10000.0))
    return {"architectures": ["TandemMTP"], "model_type": "tandem_mtp",
            "target_hidden_size": tc["hidden_size"], "target_num_hidden_layers": tc["num_hidden_layers"],
            "target_vocab_size": tc["vocab_size"], "num_mtp_layers": 1, "tap_layer": tc["num_hidden_layers"],
            "hidden_size": tc["hidden_size"], "num_attention_heads": tc["num_attention_heads"],
            "num_key_value_heads": tc["num_key_value_heads"], "head_dim": tc["head_dim"],
            "intermediate_size": tc["intermediate_size"], "rms_norm_eps": tc["rms_norm_eps"],
            "rope_theta": float(theta), "max_position_embeddings": 2048, "concat_order": "embedding,hidden"}


def init_from_target(mtp, target, seed=0):
    """Decoder layer <- the target's last layer; final norm <- the target's final norm;
    fc = [small noise | I] (embedding half Xavier-scaled by 0.1, hidden half identity)."""
    sd = target.model.layers[-1].state_dict()
    res = mtp.layers[0].load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    assert not res.missing_keys, res
    mtp.norm.weight.data.copy_(target.model.norm.weight.data.float())
    H = mtp.c["hidden_size"]
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(H, 2 * H)
    w[:, :H] = torch.randn(H, H, generator=g) * (0.1 * math.sqrt(2.0 / (2 * H)))
    w[:, H:] = torch.eye(H)
    mtp.fc.weight.data.copy_(w.to(mtp.fc.weight.device))
    return res


def save(mtp, d):
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)
    sd = {"mtp." + k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in mtp.state_dict().items()}
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(mtp.c, f, indent=2)
        f.write("\n")
    return sorted(sd)


def load(d, dtype=torch.float32, device="cpu"):
    from safetensors.torch import load_file
    c = json.load(open(os.path.join(d, "config.json")))
    m = MTP(c)
    sd = load_file(os.path.join(d, "model.safetensors"))
    m.load_state_dict({k[len("mtp."):]: v.to(dtype) for k, v in sd.items()}, strict=True)
    return m.to(device=device, dtype=dtype).eval()


# ------------------------------------------------------------------------- unrolled multi-step training
def unrolled_mask(M, K, device):
    """Entries (s, p) for steps s = 1..K and base positions p = 0..M-1, laid out step-major (index
    (s-1)*M + p).  Query (s, p) may attend to (1, q) for q <= p and to (s', p) for 2 <= s' <= s: the
    entries built from true taps up to its base position, and the recursive entries of its own drafting
    round -- exactly what the C drafter's KV holds when it drafts step s after base position p."""
    import torch
    idx = torch.arange(K * M, device=device)
    s, p = idx // M + 1, idx % M
    qs, qp, ks, kp = s[:, None], p[:, None], s[None], p[None]
    return ((ks == 1) & (kp <= qp)) | ((ks >= 2) & (ks <= qs) & (kp == qp))


def unrolled_logits(head, h, x, K, E, eager=False):
    """Teacher-forced K-step recursion over a whole sequence.  h [B,N,H] true taps, x [B,N] tokens.
    Step s at base position p (p = 0..M-1, M = N-K-1) takes (y^{s-1}_p, x_{p+s}) (y^0 = h) at RoPE
    position p+s-1 and predicts x_{p+s+1}.  Returns [(logits [B,M,V], labels [B,M]) for s = 1..K]."""
    import torch
    B, N, H = h.shape
    M = N - K - 1
    full = unrolled_mask(M, K, h.device)
    pos = torch.cat([torch.arange(M, device=h.device) + s for s in range(K)])
    cos, sin = rope_cos_sin(pos, head.c["head_dim"], head.c["rope_theta"], h.device)
    us, out, y = [], [], h[:, :M]
    for s in range(1, K + 1):
        emb = F.embedding(x[:, s:s + M], E)
        us.append(head.fc(torch.cat([head.pre_fc_norm_embedding(emb), head.pre_fc_norm_hidden(y)], dim=-1)))
        Y = torch.cat(us, 1)
        for layer in head.layers:
            Y = layer(Y, cos[:s * M], sin[:s * M], eager, full[:s * M, :s * M])
        y = Y[:, (s - 1) * M:]
        out.append((head.logits(y, E), x[:, s + 1:s + 1 + M]))
    return out
