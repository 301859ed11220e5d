"""Held-out code prompts for benchmarks, cut from the TEST split (bench/prompts/code.jsonl).

make_prompts(test_files) -> list of dicts {"id", "kind", "source", "prompt"}, deterministic:
  kind "file_head":           a file's opening lines (whole lines, 600..2000 chars)
  kind "file_middle":         whole lines from the middle of a file (600..2000 chars)
  kind "signature_docstring": a def line (with its decorators' following def) through the end of its
                              docstring, exactly as in the file (indentation kept)
ids: "<kind>-<package>-<sha1(source:line)[:10]>", stable for a given corpus.
"""
import ast
import hashlib

COUNTS = {"file_head": 90, "file_middle": 90, "signature_docstring": 60}
PER_PACKAGE_KIND = 12


def _key(s):
    return hashlib.sha1(s.encode()).hexdigest()


def _take_lines(lines, start, lo=600, hi=2000):
    out, n = [], 0
    for ln in lines[start:]:
        if n + len(ln) > hi:
            break
        out.append(ln)
        n += len(ln)
    if n < lo:
        return None
    return "".join(out)


def _sig_doc(text):
    try:
        tree = ast.parse(text)
    except Exception:
        return []
    lines = text.splitlines(keepends=True)
    res = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            b0 = node.body[0]
            if (isinstance(b0, ast.Expr) and isinstance(getattr(b0, "value", None), ast.Constant)
                    and isinstance(b0.value.value, str) and len(b0.value.value.strip()) >= 40
                    and getattr(b0, "end_lineno", None)):
                start, end = node.lineno - 1, b0.end_lineno
                p = "".join(lines[start:end])
                if 80 <= len(p) <= 2000 and p.lstrip().startswith(("def ", "async def ")):
                    res.append((start + 1, p if p.endswith("\n") else p + "\n"))
    res.sort()
    return res


def make_prompts(test_files):
    res = _collect(test_files, PER_PACKAGE_KIND)
    if len(res) < 200:  # small test split: drop the per-package cap
        res = _collect(test_files, 10 ** 9)
    return res


def _collect(test_files, cap):
    files = sorted(test_files, key=lambda f: (_key("bench:" + f["sha"]), f["rel"]))
    out = {k: [] for k in COUNTS}
    per = {}
    for f in files:
        if all(len(out[k]) >= COUNTS[k] for k in COUNTS):
            break
        text = f["text"]
        if "\x00" in text:
            continue
        lines = text.splitlines(keepends=True)
        src = f["rel"]
        cands = []
        if len(text) >= 3000:
            p = _take_lines(lines, 0)
            if p:
                cands.append(("file_head", 1, p))
            mid = len(lines) // 2
            p = _take_lines(lines, mid)
            if p:
                cands.append(("file_middle", mid + 1, p))
        sd = _sig_doc(text) if len(out["signature_docstring"]) < COUNTS["signature_docstring"] else []
        if sd:
            line, p = sd[int(_key("pick:" + f["sha"]), 16) % len(sd)]
            cands.append(("signature_docstring", line, p))
        for kind, line, p in cands:
            pk = (f["package"], kind)
            if len(out[kind]) >= COUNTS[kind] or per.get(pk, 0) >= cap:
                continue
            per[pk] = per.get(pk, 0) + 1
            out[kind].append({"id": f"{kind}-{f['package']}-{_key(src + ':' + str(line))[:10]}",
                              "kind": kind, "source": f"{src}:{line}", "prompt": p})
    res = []
    for k in COUNTS:
        res += out[k]
    seen = set()
    uniq = []
    for r in res:
        if r["id"] not in seen:
            seen.add(r["id"])
            uniq.append(r)
    return uniq
