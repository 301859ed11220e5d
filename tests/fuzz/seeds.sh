#!/bin/bash
# seeds.sh — write the seed corpora of the libFuzzer harnesses (tests/fuzz/README.md).
#   bash tests/fuzz/seeds.sh [OUT]   (OUT defaults to /tmp/fuzz; run from the repository root)
# Writes OUT/seeds-{tok,gguf,st,cfg,srv,ck} and OUT/*.dict. Needs python3 and a
# tandem binary for the GGUF seeds (TANDEM, default build/tandem).
set -euo pipefail
OUT=${1:-/tmp/fuzz}
TANDEM=${TANDEM:-build/tandem}
mkdir -p "$OUT"/seeds-{tok,gguf,st,cfg,srv,ck} "$OUT/gen"

python3 - "$OUT" <<'PY'
import json, os, random, struct, sys
out = sys.argv[1]
def w(path, data): open(os.path.join(out, path), 'wb').write(data)

# tokenizer: mode byte 0 = tokenizer.json (+ NUL + tokenizer_config.json), 1 = text
small = open('tests/fixtures/tok/tokenizer.json', 'rb').read()
cfg = open('tests/fixtures/tok/tokenizer_config.json', 'rb').read()
w('seeds-tok/small', b'\0' + small)
w('seeds-tok/small_cfg', b'\0' + small + b'\0' + cfg)
big = json.load(open('models/tiny-code/target/tokenizer.json'))
tcfg = open('models/tiny-code/target/tokenizer_config.json', 'rb').read()
for n in (300, 1000):
    v = dict(list(big['model']['vocab'].items())[:n])
    merges = []
    for m in big['model']['merges']:
        a, b = m if isinstance(m, list) else m.split(' ')
        if a in v and b in v and a + b in v: merges.append(m)
    t = dict(big); t['model'] = dict(big['model'], vocab=v, merges=merges)
    t['added_tokens'] = [dict(a, id=n + i) for i, a in enumerate(big['added_tokens'][:5])]
    js = json.dumps(t, ensure_ascii=False).encode()
    w('seeds-tok/trunc%d' % n, b'\0' + js)
    w('seeds-tok/trunc%d_cfg' % n, b'\0' + js + b'\0' + tcfg)
texts = [b'def fibonacci(n):\n    return n', b'hello \xff\xfe world \xc3', '中文 café e\u0301'.encode(),
         b'<|im_start|>user\nhi<|im_end|>\n', b'   \t\n\n  x  ', b'123456789 1.5e10']
for i, t in enumerate(texts): w('seeds-tok/text%d' % i, b'\1' + t)

# a one-layer 288-token model with the fixture tokenizer (small GGUF seeds)
V, H, HD, NH, NKV, F = 288, 32, 16, 2, 1, 64
shapes = {'model.embed_tokens.weight': [V, H], 'model.norm.weight': [H],
          'model.layers.0.input_layernorm.weight': [H], 'model.layers.0.post_attention_layernorm.weight': [H],
          'model.layers.0.self_attn.q_proj.weight': [NH * HD, H], 'model.layers.0.self_attn.k_proj.weight': [NKV * HD, H],
          'model.layers.0.self_attn.v_proj.weight': [NKV * HD, H], 'model.layers.0.self_attn.o_proj.weight': [H, NH * HD],
          'model.layers.0.self_attn.q_norm.weight': [HD], 'model.layers.0.self_attn.k_norm.weight': [HD],
          'model.layers.0.mlp.gate_proj.weight': [F, H], 'model.layers.0.mlp.up_proj.weight': [F, H],
          'model.layers.0.mlp.down_proj.weight': [H, F]}
os.makedirs(os.path.join(out, 'gen/micro'), exist_ok=True)
hdr, data = {}, b''
random.seed(1)
for k, s in shapes.items():
    n = 1
    for d in s: n *= d
    b = struct.pack('<%df' % n, *[random.uniform(-.1, .1) for _ in range(n)])
    hdr[k] = {'dtype': 'F32', 'shape': s, 'data_offsets': [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(hdr).encode(); h += b' ' * ((8 - len(h) % 8) % 8)
st = struct.pack('<Q', len(h)) + h + data
w('gen/micro/model.safetensors', st)
c = json.load(open('tests/fixtures/qwen3-rand/config.json'))
c.update(vocab_size=V, hidden_size=H, head_dim=HD, num_attention_heads=NH, num_key_value_heads=NKV,
         intermediate_size=F, num_hidden_layers=1, layer_types=['full_attention'])
w('gen/micro/config.json', json.dumps(c, indent=1).encode())
w('gen/micro/tokenizer.json', small)
w('gen/micro/tokenizer_config.json', cfg)

# safetensors
for src, name in (('qwen3-rand/model-00001-of-00003.safetensors', 'shard1'),
                  ('qwen3-rand/model-00003-of-00003.safetensors', 'shard3'),
                  ('qwen3-rand-bf16/model.safetensors', 'bf16')):
    w('seeds-st/' + name, open('tests/fixtures/' + src, 'rb').read())
w('seeds-st/micro', st)
def stf(name, hdr, data=b''):
    h = json.dumps(hdr).encode()
    w('seeds-st/' + name, struct.pack('<Q', len(h)) + h + data)
stf('tiny1', {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "I64", "shape": [], "data_offsets": [16, 24]},
              "c": {"dtype": "BF16", "shape": [0], "data_offsets": [24, 24]}}, bytes(24))
stf('tiny2', {"x": {"dtype": "F8_E4M3", "shape": [3, 1, 1, 1, 1, 1, 1, 1], "data_offsets": [0, 3]},
              "y": {"dtype": "BOOL", "shape": [1], "data_offsets": [3, 4]}}, bytes(4))

# model directory: mode byte (mod 8) 0 config.json, 5 generation_config.json, 6 index, 7 third shard; bit 7 copy
for i, d in enumerate(['qwen3-rand', 'llama-rand', 'qwen3-rand-bf16']):
    w('seeds-cfg/cfg%d' % i, b'\0' + open('tests/fixtures/%s/config.json' % d, 'rb').read())
q = 'tests/fixtures/qwen3-rand/'
w('seeds-cfg/cfg-copy', b'\x80' + open(q + 'config.json', 'rb').read())
w('seeds-cfg/gen0', b'\5' + open(q + 'generation_config.json', 'rb').read())
w('seeds-cfg/idx0', b'\6' + open(q + 'model.safetensors.index.json', 'rb').read())
w('seeds-cfg/shard3', b'\7' + open(q + 'model-00003-of-00003.safetensors', 'rb').read())
w('seeds-cfg/shard3-copy', b'\x87' + open(q + 'model-00003-of-00003.safetensors', 'rb').read())

# server request bodies: mode byte bit 0 chat, bit 1 llama3, bit 2 small context
bodies = [
 (1, {"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}],
      "max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop": ["\n", "end"], "stream": True,
      "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3, "seed": 42, "provenance": True}),
 (3, {"messages": [{"role": "developer", "content": [{"type": "text", "text": "  a "}, {"type": "text", "text": "b\n"}]},
                   {"role": "assistant", "content": None}, {"role": "user", "content": "x"}],
      "max_completion_tokens": 4, "speculative": {"drafter": "ngram:2-4", "depth": 3}}),
 (0, {"model": "tiny", "prompt": "def f(x):", "max_tokens": 16, "echo": True, "logprobs": 5, "stop": "\n\n",
      "speculative": False, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1}),
 (0, {"prompt": [1, 2, 3, 200], "echo": True, "logprobs": 2, "provenance": True, "seed": -1, "ignore_eos": True,
      "speculative": {"drafter": "default", "depth": 0}}),
 (4, {"prompt": ["hello there general kenobi"], "n": 1, "best_of": 1, "suffix": "", "logit_bias": {}, "tools": [],
      "response_format": {"type": "text"}, "user": "u"}),
 (1, {"messages": [{"role": "user", "content": "hi"}], "logprobs": False, "top_logprobs": 0, "stream": False}),
]
for i, (m, b) in enumerate(bodies): w('seeds-srv/s%d' % i, bytes([m]) + json.dumps(b).encode())

# checkpoints: mode byte bits 0-1 the drafter (0 ngram, 1 draft model, 2 MTP, 3 block; bit 2 another's namespace)
for m in (0, 1):
    w('seeds-ck/e%d' % m, bytes([m]))
    w('seeds-ck/s%d' % m, bytes([m]) + struct.pack('<12i', 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2))
    w('seeds-ck/l%d' % m, bytes([m]) + struct.pack('<64i', *[i % 511 for i in range(64)]))
random.seed(7)
fl = lambda n: struct.pack('<%df' % n, *[random.uniform(-1, 1) for _ in range(n)])
# mtp-v1: int32 n, n tokens, n x 384 hidden floats
for n in (0, 1, 5):
    w('seeds-ck/m%d' % n, bytes([2]) + struct.pack('<i', n) + struct.pack('<%di' % n, *[100 + i for i in range(n)]) + fl(n * 384))
# block-v3: int32 len, n_layer (4), KVH x head_dim (128), n_ids, stream length; the stream; len x 4 layers x 2 x 128
# floats (K and V); the context ids
for ln, ni, sl in ((0, 0, 0), (2, 2, 3), (6, 3, 6)):
    w('seeds-ck/b%d' % ln, bytes([3]) + struct.pack('<5i', ln, 4, 128, ni, sl) + struct.pack('<%di' % sl, *[200 + i for i in range(sl)]) +
      fl(ln * 4 * 256) + struct.pack('<%di' % ni, *[300 + i for i in range(ni)]))

# dictionaries
def dct(name, toks): w(name, ''.join('"%s"\n' % t for t in toks).encode())
q_ = lambda s: '\\"%s\\"' % s
dct('tok.dict', [q_(k) for k in ('model', 'vocab', 'merges', 'type', 'BPE', 'added_tokens', 'id', 'content', 'special',
    'lstrip', 'rstrip', 'normalized', 'single_word', 'pre_tokenizer', 'Sequence', 'pretokenizers', 'Split', 'ByteLevel',
    'pattern', 'Regex', 'String', 'behavior', 'Isolated', 'normalizer', 'NFC', 'decoder', 'ignore_merges', 'use_regex',
    'eos_token', 'bos_token', 'chat_template')] + ['<|im_start|>', '<|im_end|>', '\\\\u0000', '\\\\ud800', 'true', 'false',
    'null', '1e308', '16777215', '-1'])
dct('gguf.dict', ['GGUF', 'general.architecture', 'general.alignment', 'qwen3', 'llama'] +
    ['qwen3.' + k for k in ('block_count', 'context_length', 'embedding_length', 'feed_forward_length',
     'attention.head_count', 'attention.head_count_kv', 'attention.key_length', 'attention.value_length',
     'attention.layer_norm_rms_epsilon', 'rope.freq_base', 'vocab_size')] +
    ['llama.rope.scaling.original_context_length', 'tandem.rope.llama3.factor', 'rope_freqs.weight'] +
    ['tokenizer.ggml.' + k for k in ('model', 'pre', 'tokens', 'token_type', 'merges', 'bos_token_id', 'eos_token_id',
     'add_bos_token')] + ['tokenizer.chat_template', 'gpt2', 'qwen2', 'llama-bpe', 'token_embd.weight', 'output.weight',
     'output_norm.weight'] + ['blk.0.%s.weight' % k for k in ('attn_q', 'attn_k', 'attn_v', 'attn_output', 'attn_q_norm',
     'attn_k_norm', 'attn_norm', 'ffn_norm', 'ffn_gate', 'ffn_up', 'ffn_down')] +
    ['\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff', '\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x80'])
dct('st.dict', [q_(k) for k in ('dtype', 'shape', 'data_offsets', '__metadata__', 'F32', 'F16', 'BF16', 'F64', 'I64',
    'BOOL', 'F8_E4M3')] + ['9007199254740992', '18446744073709551615', '1e308', '-0', '\\\\u0000'])
dct('cfg.dict', [q_(k) for k in ('architectures', 'Qwen3ForCausalLM', 'LlamaForCausalLM', 'vocab_size', 'hidden_size',
    'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'head_dim', 'intermediate_size',
    'max_position_embeddings', 'rms_norm_eps', 'tie_word_embeddings', 'attention_bias', 'mlp_bias', 'sliding_window',
    'use_sliding_window', 'layer_types', 'full_attention', 'sliding_attention', 'hidden_act', 'silu', 'rope_theta',
    'rope_scaling', 'rope_parameters', 'rope_type', 'llama3', 'factor', 'low_freq_factor', 'high_freq_factor',
    'original_max_position_embeddings', 'eos_token_id', 'bos_token_id', 'weight_map', 'model-00001-of-00003.safetensors',
    'model-00003-of-00003.safetensors', 'model.embed_tokens.weight', 'lm_head.weight', 'model.norm.weight', 'dtype',
    'shape', 'data_offsets', 'BF16', 'F16', 'F32')] + ['null', 'true', '1e308', '2147483647', '-2147483648'])
dct('srv.dict', [q_(k) for k in ('model', 'messages', 'role', 'content', 'system', 'user', 'assistant', 'developer',
    'type', 'text', 'prompt', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'stop',
    'stream', 'stream_options', 'include_usage', 'logprobs', 'top_logprobs', 'seed', 'echo', 'provenance',
    'speculative', 'drafter', 'depth', 'ngram:1-16', 'ignore_eos', 'n', 'best_of', 'suffix', 'logit_bias', 'tools',
    'response_format', 'presence_penalty', 'frequency_penalty', 'repetition_penalty')] +
    ['<|im_start|>', '<|im_end|>', '<|end|>', '1e308', '-9223372036854775808', '18446744073709551615', '\\\\u0000',
     'null', 'true', 'false'])
PY

# GGUF: the fixture models written by tandem quantize
mkdir -p "$OUT/gen/qtok"
cp tests/fixtures/qwen3-rand/* tests/fixtures/tok/* "$OUT/gen/qtok/"
for t in q8_0 q4_0 f16; do "$TANDEM" quantize "$OUT/gen/qtok" "$OUT/seeds-gguf/qwen3tok-$t.gguf" --type $t; done
for t in q4_0 q8_0 f32; do "$TANDEM" quantize "$OUT/gen/micro" "$OUT/seeds-gguf/micro-$t.gguf" --type $t; done
"$TANDEM" quantize tests/fixtures/llama-rand "$OUT/seeds-gguf/llama-q8_0.gguf" --type q8_0
echo "seeds in $OUT/seeds-*, dictionaries in $OUT/*.dict"
