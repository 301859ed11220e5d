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
import math
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


# ---------------------------------------------------------------------------------- training loop
def train_loop(params, step_fn, t_end, peak_lr, warmup=50, wd=0.01, final_frac=0.1, clip=1.0,
               log_every=100, betas=(0.9, 0.95)):
    """The shared optimisation loop of the drafter stages (stage 4 on): AdamW (weight decay wd on
    tensors of >= 2 dims), linear warmup, cosine decay to final_frac * peak_lr, gradient clipping.
    The number of steps is fixed after step 40 from the measured speed of steps 10..40, so that the
    cosine ends at the wall-clock time t_end (epoch seconds); training also stops at t_end.
    step_fn(step) -> (loss tensor, {name: float}) runs one forward and returns the loss to minimise.
    Returns {steps, planned_steps, stopped_by, train_seconds, history}; never raises (an exception
    stops training and is reported in stopped_by)."""
    import torch
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=peak_lr, betas=betas, eps=1e-8,
                            **({"fused": True} if torch.cuda.is_available() else {}))
    total, step, hist, stopped_by, t_meas = None, 0, [], "steps", None
    acc, n_acc = {}, 0
    t0 = time.time()
    try:
        while True:
            if (total is not None and step >= total) or time.time() >= t_end:
                stopped_by = "steps" if total is not None and step >= total else "deadline"
                break
            T = total or 10 ** 9
            if step < warmup:
                lr = peak_lr * (step + 1) / warmup
            else:
                pr = min(1.0, (step - warmup) / max(1, T - warmup))
                lr = peak_lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * pr)))
            for g in opt.param_groups:
                g["lr"] = lr
            loss, info = step_fn(step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            step += 1
            for k, v in info.items():  # tensors stay on the device until logged (no sync per step)
                acc[k] = acc.get(k, 0.0) + (v.detach() if hasattr(v, "detach") else v)
            n_acc += 1
            if step == 10 and torch.cuda.is_available():
                torch.cuda.synchronize()
            if step == 10:
                t_meas = time.time()
            if step == 40 and total is None:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                sps = (time.time() - t_meas) / 30
                total = 40 + int((t_end - time.time()) / sps * 0.97)
                log(f"measured {sps * 1000:.1f} ms/step; total_steps={total}")
            if step % log_every == 0 or step == 1:
                rec = {"step": step, **{k: float(v) / n_acc for k, v in acc.items()}, "lr": lr, "grad_norm": float(gn),
                       "t": round(time.time() - t0, 1)}
                acc, n_acc = {}, 0
                hist.append(rec)
                log(rec)
    except Exception as e:  # noqa
        stopped_by = "exception: " + repr(e)
        log("TRAIN EXCEPTION", repr(e))
        import traceback
        traceback.print_exc()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"steps": step, "planned_steps": total, "stopped_by": stopped_by,
            "train_seconds": round(time.time() - t0, 1), "history": hist}


# ------------------------------------------------------------------- target generations and taps
class Taps:
    """Forward hooks that capture the residual stream after k decoder layers (before the final norm) of
    an HF decoder, for each k in layers (1..n_layer), while enabled.  of(ids) runs the base model (no
    lm_head) and returns the taps concatenated in the order of layers: [B, N, len(layers) * hidden]."""

    def __init__(self, model, layers):
        self.model, self.layers, self.on, self.buf = model, list(layers), False, {}
        self.hooks = [model.model.layers[k - 1].register_forward_hook(self._hook(k)) for k in self.layers]

    def _hook(self, k):
        def hook(mod, args, out):
            if self.on:
                self.buf[k] = out[0] if isinstance(out, (tuple, list)) else out
        return hook

    def run(self, fn):
        """fn() runs a forward of the model; returns (fn's result, concatenated taps)."""
        import torch
        self.on = True
        try:
            res = fn()
        finally:
            self.on = False
        return res, torch.cat([self.buf.pop(k) for k in self.layers], -1)

    def of(self, ids):
        import torch
        with torch.no_grad():
            return self.run(lambda: self.model.model(input_ids=ids, use_cache=False))[1]

    def remove(self):
        for h in self.hooks:
            h.remove()


def greedy_generate(model, prompts, n_new):
    """prompts [B, P] (equal lengths) -> [B, P + n_new]: the model's greedy continuation with its KV
    cache (argmax, lowest id on ties; <|endoftext|> does not stop a row)."""
    import torch
    with torch.no_grad():
        try:
            out = model(input_ids=prompts, use_cache=True, logits_to_keep=1)
        except TypeError:
            out = model(input_ids=prompts, use_cache=True)
        pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
        toks = [nxt]
        for _ in range(n_new - 1):
            out = model(input_ids=nxt[:, None], past_key_values=pkv, use_cache=True)
            pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
            toks.append(nxt)
        return torch.cat([prompts, torch.stack(toks, 1)], 1)


def generation_data(model, train_ids, valid_ids, specs, batch, seconds, n_valid, seed, device):
    """Sequences for drafter training: random p_len-token windows of the train (valid) stream continued
    greedily by the (frozen) target for n_new tokens, for each (p_len, n_new) in specs; batches of
    `batch`, the specs taken in turn, until `seconds` have passed (at least one batch of each).
    Returns (train, valid): {(p_len, n_new): int64 tensor [n, p_len + n_new] on the device}, valid with
    n_valid sequences per spec."""
    import numpy as np
    import torch
    rng = np.random.default_rng(seed)

    def windows(ids, n, p_len):
        st = rng.integers(0, len(ids) - p_len, n)
        return torch.from_numpy(np.stack([ids[s:s + p_len] for s in st]).astype(np.int64)).to(device)

    t0 = time.time()
    data = {sp: [] for sp in specs}
    i = 0
    while time.time() - t0 < seconds or i < len(specs):
        sp = specs[i % len(specs)]
        data[sp].append(greedy_generate(model, windows(train_ids, batch, sp[0]), sp[1]))
        i += 1
    train = {sp: torch.cat(v) for sp, v in data.items()}
    valid = {sp: greedy_generate(model, windows(valid_ids, n_valid, sp[0]), sp[1]) for sp in specs}
    log(f"generated {sum(v.shape[0] for v in train.values())} train + {n_valid * len(specs)} valid sequences "
        f"(prompt, generated) {list(specs)} in {time.time() - t0:.0f}s")
    return train, valid
