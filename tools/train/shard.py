"""Split a safetensors file into shards under a size limit, with the index transformers writes.

    python3 tools/train/shard.py DIR [MAX_BYTES]

DIR/model.safetensors (over MAX_BYTES, default 15,000,000) becomes DIR/model-0000K-of-0000N.safetensors
plus DIR/model.safetensors.index.json ({"metadata": {"total_size": ...}, "weight_map": {tensor: shard}}),
each shard a valid safetensors file holding whole tensors in the original order; the original is removed.
Files in the repository stay under 16 MB.  Pure Python (no safetensors package), so it runs anywhere.
"""
import json
import os
import struct
import sys


def split(d, max_bytes=15_000_000):
    src = os.path.join(d, "model.safetensors")
    if os.path.getsize(src) <= max_bytes:
        return [src]
    with open(src, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = blob[8 + n:]
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    groups, cur, size = [], [], 0
    for k in names:
        b, e = header[k]["data_offsets"]
        if cur and size + (e - b) > max_bytes - 65536:
            groups.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += e - b
    groups.append(cur)
    total = len(groups)
    wmap, out = {}, []
    for i, g in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        hdr, chunks, off = {}, [], 0
        if meta is not None:
            hdr["__metadata__"] = meta
        for k in g:
            b, e = header[k]["data_offsets"]
            hdr[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [off, off + e - b]}
            chunks.append(data[b:e])
            off += e - b
            wmap[k] = name
        hb = json.dumps(hdr, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(d, name), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + b"".join(chunks))
        out.append(os.path.join(d, name))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": len(data)}, "weight_map": wmap}, f, indent=1, sort_keys=True)
        f.write("\n")
    os.remove(src)
    return out


if __name__ == "__main__":
    print("\n".join(split(sys.argv[1], *(int(a) for a in sys.argv[2:3]))))
