#!/usr/bin/env python3
"""Splits a model directory's model.safetensors into shards with a model.safetensors.index.json,
the layout transformers' save_pretrained writes for a large model, so kvrepro's sharded loader
(model/shards.h) has committed and generated inputs. Python standard library only.

    scripts/shard-checkpoint.py SRC OUT [--shards N]

SRC holds config.json and model.safetensors; OUT (created if needed) gets config.json (copied
byte for byte), model-0000K-of-0000N.safetensors and model.safetensors.index.json, and no
model.safetensors (kvrepro would read that one first, as transformers does). The tensors, in name
order, are split into N runs of about equal bytes; each shard keeps every tensor's dtype, shape
and bytes, in name order, behind a header padded with spaces to a multiple of 8 bytes (so F32
data stays 4-byte aligned and is used in place). The same input gives the same bytes: this is
how fixtures/sharded/ is regenerated (fixtures/sharded/README.md).

Exit status: 0 written, 2 bad input or usage.
"""

import argparse
import json
import os
import struct
import sys

# The safetensors reference reader's cap on the header (kvrepro's too, model/safetensors.c).
MAX_HEADER = 100_000_000


def fail(msg):
    print(f"shard-checkpoint: {msg}", file=sys.stderr)
    sys.exit(2)


def read_safetensors(path):
    """(header dict without __metadata__, data section bytes)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    if len(blob) < 8:
        fail(f"{path}: file is {len(blob)} bytes, expected at least 8 (the header length)")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > MAX_HEADER or 8 + hlen > len(blob):
        fail(f"{path}: header length {hlen}: expected at most {min(MAX_HEADER, len(blob) - 8)}")
    try:
        header = json.loads(blob[8 : 8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        fail(f"{path}: header: expected UTF-8 JSON, found {e}")
    if not isinstance(header, dict):
        fail(f"{path}: header: expected a JSON object")
    header.pop("__metadata__", None)
    return header, blob[8 + hlen :]


def shard_bytes(entries, data):
    """One shard: entries is [(name, info)] in name order; returns the file's bytes."""
    header = {"__metadata__": {"format": "pt"}}
    chunks = []
    at = 0
    for name, info in entries:
        begin, end = info["data_offsets"]
        chunk = data[begin:end]
        header[name] = {
            "dtype": info["dtype"],
            "shape": info["shape"],
            "data_offsets": [at, at + len(chunk)],
        }
        chunks.append(chunk)
        at += len(chunk)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # The data section starts at a multiple of 8, as the safetensors writer pads it.
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def split(names, sizes, n):
    """Runs of consecutive names, about total/n bytes each: shard k takes the tensors whose
    first byte (in the concatenation) falls in [k * total / n, (k + 1) * total / n)."""
    total = sum(sizes)
    runs = [[] for _ in range(n)]
    at = 0
    for name, size in zip(names, sizes):
        k = min(n - 1, at * n // total) if total > 0 else 0
        runs[k].append(name)
        at += size
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="model directory with config.json and model.safetensors")
    ap.add_argument("out", help="directory to write the sharded copy into")
    ap.add_argument("--shards", type=int, default=2, help="number of shard files (default 2)")
    a = ap.parse_args()
    if a.shards < 1 or a.shards > 99999:
        fail(f"--shards: expected 1..99999, found {a.shards}")

    header, data = read_safetensors(os.path.join(a.src, "model.safetensors"))
    names = sorted(header)
    sizes = []
    for name in names:
        info = header[name]
        try:
            begin, end = info["data_offsets"]
            info["dtype"], info["shape"]
        except (KeyError, TypeError, ValueError):
            fail(f"{a.src}/model.safetensors: tensor '{name}': expected dtype, shape and "
                 "data_offsets [begin, end]")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(data)):
            fail(f"{a.src}/model.safetensors: tensor '{name}': data_offsets [{begin}, {end}] "
                 f"outside the {len(data)}-byte data section")
        sizes.append(end - begin)
    runs = split(names, sizes, a.shards)
    for k, run in enumerate(runs):
        if not run:
            fail(f"--shards {a.shards}: shard {k + 1} would be empty ({len(names)} tensors, "
                 "or one tensor larger than a shard); use fewer shards")

    try:
        with open(os.path.join(a.src, "config.json"), "rb") as f:
            config = f.read()
    except OSError as e:
        fail(f"{a.src}/config.json: cannot read: {e.strerror}")

    os.makedirs(a.out, exist_ok=True)
    if os.path.exists(os.path.join(a.out, "model.safetensors")):
        fail(f"{a.out}/model.safetensors exists: it would be read instead of the shards")
    weight_map = {}
    for k, run in enumerate(runs):
        fname = f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors"
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(shard_bytes([(name, header[name]) for name in run], data))
        for name in run:
            weight_map[name] = fname
    # As transformers writes it: total_size is the tensors' bytes, keys sorted, indent 2.
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    with open(os.path.join(a.out, "config.json"), "wb") as f:
        f.write(config)
    print(f"wrote {a.out}: {a.shards} shards, {len(names)} tensors, {sum(sizes)} bytes")


if __name__ == "__main__":
    main()
