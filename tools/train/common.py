"""Shared pieces of the tiny-code training pipeline (tools/train/).

Everything a training stage needs that must be identical between stages lives here, so that
later drafter-training scripts (MTP head, block drafter, KV-borrowing assistant) can reuse it:

  * corpus:    build_corpus()  -- the .py files of this machine's Python (site-packages + stdlib),
               deduplicated by content, assigned to packages, split train/valid/test BY PACKAGE
               with a deterministic rule (see split_packages()).  The same machine image gives the
               same corpus, split and file order on every run, so stage 2 rebuilds exactly the
               corpus stage 1 trained on without shipping it.
  * tokenizer: train_tokenizer() / load_tokenizer() -- byte-level BPE, Qwen3's normalizer and
               pre-tokenizer, 16384 entries, 4 special tokens with fixed ids 0..3.
  * tokens:    tokenize_docs() -- documents joined with <|endoftext|> into one uint16 stream.
  * models:    target_config() / draft_config() -- the tiny-code family's Qwen3 configs;
               load_model() -- load a saved family member (any dtype) for training or reference.
  * saving:    save_hf() -- bf16 HF layout with safetensors shards <= 14 MB + index + tokenizer.

No network is used anywhere.  Deterministic: sorted walks, content hashes, fixed seeds.
"""
import hashlib
import json
import os
import re
import sys
import sysconfig
import time

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
EOT_ID = 0  # <|endoftext|>
IM_START_ID = 1
IM_END_ID = 2
MASK_ID = 3
VOCAB_SIZE = 16384
MAX_FILE_BYTES = 1_000_000  # larger .py files are generated tables, not code; skipped
FORCED_TEST = ["requests", "click"]  # well-known packages always held out
FORCED_TRAIN = ["stdlib"]
# The pre-tokenizer regex of Qwen2 / Qwen2.5 / Qwen3 tokenizer.json (Split, behavior Isolated).
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Deadline:
    """Wall-clock guard. STAGE_DEADLINE (epoch seconds) is set by the stage*.sh driver."""

    def __init__(self, default_s=540):
        self.t_end = float(os.environ.get("STAGE_DEADLINE", time.time() + default_s))

    def left(self):
        return self.t_end - time.time()


def _h(s):
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big")


# ----------------------------------------------------------------------------------------- corpus
def python_roots():
    """(kind, path) roots: the stdlib and every site-packages of this interpreter."""
    paths = sysconfig.get_paths()
    stdlib = os.path.realpath(paths["stdlib"])
    roots = [("stdlib", stdlib)]
    seen = {stdlib}
    cands = [paths.get("purelib"), paths.get("platlib")]
    try:
        import site
        cands += site.getsitepackages()
    except Exception:
        pass
    for p in cands:
        if p and os.path.isdir(p):
            rp = os.path.realpath(p)
            if rp not in seen:
                seen.add(rp)
                roots.append(("site", rp))
    return roots


def _dist_versions(site_dir):
    """top-level name -> (dist name, version) from *.dist-info (RECORD, then top_level.txt)."""
    out = {}
    for d in sorted(os.listdir(site_dir)):
        if not d.endswith(".dist-info"):
            continue
        dd = os.path.join(site_dir, d)
        name, ver = d[: -len(".dist-info")].rsplit("-", 1) if "-" in d else (d, "")
        try:
            with open(os.path.join(dd, "METADATA"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("Name:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("Version:"):
                        ver = line.split(":", 1)[1].strip()
                    elif not line.strip():
                        break
        except OSError:
            pass
        tops = set()
        try:
            with open(os.path.join(dd, "RECORD"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    p = line.split(",", 1)[0]
                    if p.endswith(".py") and not p.startswith(".."):
                        top = p.split("/", 1)[0]
                        tops.add(top[:-3] if top.endswith(".py") else top)
        except OSError:
            pass
        try:
            with open(os.path.join(dd, "top_level.txt"), encoding="utf-8") as f:
                tops |= {t.strip() for t in f if t.strip()}
        except OSError:
            pass
        for t in tops:
            out.setdefault(t, (name, ver))
    return out


def scan_files():
    """Sorted list of dicts {path, rel, package, text, sha} for every unique .py file."""
    files = []
    seen = set()
    skipped = {"dup": 0, "big": 0, "undecodable": 0, "empty": 0}
    versions = {}
    for kind, root in python_roots():
        if kind == "site":
            versions.update({k: v for k, v in _dist_versions(root).items() if k not in versions})
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            if kind == "stdlib":
                dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
            else:
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.endswith((".dist-info", ".egg-info")))
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fn)
                if os.path.islink(path):
                    continue
                rel = os.path.normpath(os.path.join(rel_dir, fn))
                if kind == "stdlib":
                    package = "stdlib"
                else:
                    top = rel.split(os.sep, 1)[0]
                    package = top[:-3] if top.endswith(".py") else top
                try:
                    with open(path, "rb") as f:
                        data = f.read(MAX_FILE_BYTES + 1)
                except OSError:
                    continue
                if len(data) > MAX_FILE_BYTES:
                    skipped["big"] += 1
                    continue
                if not data.strip():
                    skipped["empty"] += 1
                    continue
                sha = hashlib.sha256(data).hexdigest()
                if sha in seen:
                    skipped["dup"] += 1
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    skipped["undecodable"] += 1
                    continue
                seen.add(sha)
                files.append({"rel": ("stdlib/" if kind == "stdlib" else "") + rel, "package": package,
                              "text": text, "bytes": len(data), "sha": sha})
    return files, versions, skipped


def split_packages(pkg_bytes, frac_valid=0.03, frac_test=0.03):
    """Deterministic split by package.  Forced: FORCED_TRAIN -> train, FORCED_TEST -> test.
    Remaining packages are visited in order of sha256('tandem-split:' + name); a package goes to
    test while test holds < frac_test of all bytes, then to valid likewise, else train; packages
    larger than 1% of all bytes always go to train (keeps the held-out splits from being one
    giant package)."""
    total = sum(pkg_bytes.values())
    split = {}
    acc = {"train": 0, "valid": 0, "test": 0}
    for p in FORCED_TRAIN:
        if p in pkg_bytes:
            split[p] = "train"
            acc["train"] += pkg_bytes[p]
    for p in FORCED_TEST:
        if p in pkg_bytes:
            split[p] = "test"
            acc["test"] += pkg_bytes[p]
    rest = sorted((p for p in pkg_bytes if p not in split), key=lambda p: (_h("tandem-split:" + p), p))
    for p in rest:
        b = pkg_bytes[p]
        if b <= 0.01 * total and acc["test"] + b <= frac_test * total:
            s = "test"
        elif b <= 0.01 * total and acc["valid"] + b <= frac_valid * total:
            s = "valid"
        else:
            s = "train"
        split[p] = s
        acc[s] += b
    return split


def build_corpus():
    """Returns {'train': [file...], 'valid': [...], 'test': [...]}, manifest dict."""
    t0 = time.time()
    files, versions, skipped = scan_files()
    pkg_bytes = {}
    for f in files:
        pkg_bytes[f["package"]] = pkg_bytes.get(f["package"], 0) + f["bytes"]
    split = split_packages(pkg_bytes)
    out = {"train": [], "valid": [], "test": []}
    for f in files:
        out[split[f["package"]]].append(f)
    man = {"python": sys.version.split()[0], "roots": [r for _, r in python_roots()],
           "rule": split_packages.__doc__.strip(), "max_file_bytes": MAX_FILE_BYTES,
           "skipped": skipped, "splits": {}}
    for s in out:
        pk = {}
        for f in out[s]:
            e = pk.setdefault(f["package"], {"files": 0, "bytes": 0})
            e["files"] += 1
            e["bytes"] += f["bytes"]
        rows = []
        for p in sorted(pk):
            dist, ver = versions.get(p, (None, None))
            if p == "stdlib":
                dist, ver = "python-stdlib", sys.version.split()[0]
            rows.append({"package": p, "dist": dist, "version": ver, **pk[p]})
        man["splits"][s] = {"files": len(out[s]), "bytes": sum(f["bytes"] for f in out[s]),
                            "packages": rows}
    log(f"corpus: {len(files)} unique files in {time.time() - t0:.1f}s; " +
        ", ".join(f"{s}: {man['splits'][s]['files']} files {man['splits'][s]['bytes'] / 1e6:.1f} MB "
                  f"{len(man['splits'][s]['packages'])} pkgs" for s in out) + f"; skipped {skipped}")
    return out, man


def shuffled(files, salt):
    """Deterministic shuffle of a file list by content hash."""
    return sorted(files, key=lambda f: (_h(salt + f["sha"]), f["rel"]))


# -------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts, vocab_size=VOCAB_SIZE):
    from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"],
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "errors": "replace",
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
                                 for i, s in enumerate(SPECIAL_TOKENS)},
    }


def write_tokenizer(tok, d):
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2)
        f.write("\n")


def load_tokenizer(d):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def tokenize_docs(tok, files, max_tokens, deadline_s, batch=512):
    """Encode files in the given order, each followed by <|endoftext|>, into one uint16 array;
    stops after max_tokens or deadline_s seconds (whichever first).  Returns (array, n_files)."""
    import numpy as np
    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    t0 = time.time()
    chunks, n, nf = [], 0, 0
    for i in range(0, len(files), batch):
        texts = [f["text"] for f in files[i:i + batch]]
        for e in enc(texts, add_special_tokens=False):
            a = np.empty(len(e.ids) + 1, dtype=np.uint16)
            a[:-1] = e.ids
            a[-1] = EOT_ID
            chunks.append(a)
            n += len(a)
            nf += 1
        if n >= max_tokens or time.time() - t0 > deadline_s:
            break
    arr = np.concatenate(chunks) if chunks else np.zeros(0, np.uint16)
    log(f"tokenized {nf}/{len(files)} files -> {len(arr) / 1e6:.2f}M tokens in {time.time() - t0:.1f}s")
    return arr, nf


# ----------------------------------------------------------------------------------------- models
def qwen3_config(hidden, layers, heads, kv_heads, head_dim, inter, **kw):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=VOCAB_SIZE, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                       intermediate_size=inter, tie_word_embeddings=True, max_position_embeddings=2048,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
                       bos_token_id=None, eos_token_id=EOT_ID, pad_token_id=EOT_ID, **kw)


def target_config():
    return qwen3_config(384, 10, 6, 2, 64, 1280)


def draft_config():
    return qwen3_config(256, 2, 4, 2, 64, 768)


def n_params(model):
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def load_model(d, dtype=None, attn="eager", device="cpu"):
    """Load a saved family member; dtype float32 upcasts bf16 weights."""
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype or torch.float32, attn_implementation=attn)
    return m.to(device).eval()


def save_hf(model, d, tok_dir=None, shard_bytes=14_000_000, gen_extra=None):
    """Save model in bf16 HF layout, sharded (<= shard_bytes per file), plus tokenizer files."""
    import shutil
    import torch
    os.makedirs(d, exist_ok=True)
    m = model.to(torch.bfloat16)
    m.generation_config.bos_token_id = None
    m.generation_config.eos_token_id = EOT_ID
    m.generation_config.pad_token_id = EOT_ID
    m.generation_config.do_sample = False
    m.save_pretrained(d, max_shard_size=shard_bytes)
    if tok_dir:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, fn), os.path.join(d, fn))
    files = sorted(os.listdir(d))
    log("saved", d, [(f, os.path.getsize(os.path.join(d, f))) for f in files])
    return files


def pack(out_dir, name, base, members):
    """tar.gz the existing members (paths relative to base) into out_dir/name (never raises)."""
    import tarfile
    try:
        if not out_dir:
            return
        os.makedirs(out_dir, exist_ok=True)
        tmp = os.path.join(out_dir, "." + name + ".tmp")
        with tarfile.open(tmp, "w:gz") as t:
            for m in members:
                p = os.path.join(base, m)
                if os.path.exists(p):
                    t.add(p, arcname=m)
        os.replace(tmp, os.path.join(out_dir, name))
    except Exception as e:  # noqa
        log("pack failed", repr(e))
