"""Writing runs in the kvrepro HDF5 report schema (docs/SCHEMA.md, version 1).

A capture writes one schema-1 report holding only runs: /tolerances and
/comparisons are empty (the C gate makes the comparisons, `kvrepro gate
--external`), /summary has one row per run. Types follow the schema table for
table by table so that the C reader (reports/report_h5_read.c) accepts the
file without leeway: fixed-length strings of the field's size, little-endian
integers and floats of the stated widths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO

import h5py
import numpy as np

from .files import publish

SCHEMA_VERSION = 1
# Above this vocabulary a run keeps each row's TOPK largest logits and the
# hash of the full row, as the C gate does (--full-logits-max-vocab).
FULL_LOGITS_MAX_VOCAB = 65536
TOPK = 16

TOLERANCE_DTYPE = np.dtype([("name", "S64"), ("value", "<f8"), ("reason", "S160")])
COMPARISON_DTYPE = np.dtype([
    ("kind", "<i4"), ("run_a", "<i8"), ("run_b", "<i8"), ("verdict", "<i4"),
    ("message", "S512"), ("first_step", "<i8"), ("first_row", "<i8"), ("first_probe", "<i8"),
    ("near_ties", "<i8"), ("max_abs_err", "<f8"), ("max_rel_err", "<f8"), ("nmse", "<f8"),
    ("kl", "<f8"), ("top1_agreement", "<f8")])
SUMMARY_DTYPE = np.dtype([
    ("index", "<i8"), ("model", "S64"), ("scenario", "S64"), ("variant", "S64"),
    ("backend", "S16"), ("mode", "S16"), ("repeat", "<i4"), ("verdict", "<i4"),
    ("verdict_name", "S8"), ("first_divergence", "S512"), ("max_rel_err", "<f8"),
    ("graphs_captured", "<i8")])


@dataclass
class Run:
    """One recorded decode. Arrays are None for a skipped run."""

    model: str
    scenario: str
    variant: str           # e.g. "hf:static_sliding:sdpa:fp32"
    backend: str           # "torch-cpu" or "torch-cuda"
    mode: str              # "eager", "compile" or "reduce-overhead"
    repeat: int
    engine: str            # "transformers X, torch Y, attn IMPL, DTYPE"
    skipped: bool = False
    skip_reason: str = ""
    prompt: np.ndarray | None = None        # (B, P) int32, left-padded
    prompt_real: np.ndarray | None = None   # (B, P) uint8
    tokens: np.ndarray | None = None        # (S, B) int32
    logits: np.ndarray | None = None        # (S, B, V) float32
    margins: np.ndarray | None = None       # (S, B) float32
    logits_hash: np.ndarray | None = None   # (S, B) uint64 FNV-1a 64 of each logits row
    probe_names: list[str] = field(default_factory=list)
    probe_hash: np.ndarray | None = None    # (S, NP, B) uint64
    graphs_captured: int = 0
    recompiles: int = -1
    graph_budget: int = -1
    extra: dict[str, str | int] = field(default_factory=dict)  # attributes the C side ignores
    vocab: int = 0
    steps: int = 0
    prompt_text: list[str] | None = None    # (B,) the rows' texts, when the prompts came from texts


def _fixed(text: str, size: int, what: str) -> np.bytes_:
    b = text.encode("utf-8")
    if len(b) >= size:
        raise ValueError(f"{what}: {text!r} is {len(b)} bytes, the schema field holds {size - 1}")
    return np.bytes_(b)


def _str_attr(obj: h5py.HLObject, name: str, text: str, size: int) -> None:
    b = _fixed(text, size, name)
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(size)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    tid.set_cset(h5py.h5t.CSET_UTF8)
    obj.attrs.create(name, np.array(b, dtype=f"S{size}"), dtype=h5py.Datatype(tid))


def _topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k largest logits by descending value, ties to the lowest id
    (a stable sort of the negated values keeps the lower id first)."""
    flat = logits.reshape(-1, logits.shape[-1])
    order = np.argsort(-flat, axis=1, kind="stable")[:, :k].astype(np.int32)
    vals = np.take_along_axis(flat, order, axis=1).astype(np.float32)
    return order.reshape(*logits.shape[:-1], k), vals.reshape(*logits.shape[:-1], k)


def margins_of(logits: np.ndarray) -> np.ndarray:
    """Top-1 minus runner-up of each row (..., V) -> (...) float32."""
    part = np.sort(logits, axis=-1)
    return (part[..., -1] - part[..., -2]).astype(np.float32)


def write_report(path: str, runs: list[Run], root: dict[str, str | int]) -> None:
    """Writes runs to path through files.publish: path is untouched or
    complete, never written through a link, and a path that is not a
    regular file (a device, a FIFO, a directory) is refused. A failure of
    the destination raises InputError naming path."""

    def write(fobj: BinaryIO) -> None:
        # HDF5 through the file object: the temporary publish created is
        # the file written, never a name opened again
        with h5py.File(fobj, "w", libver=("v108", "v108"), track_order=True) as f:
            _write(f, runs, root)

    publish(path, write, "--out")


def _write(f: h5py.File, runs: list[Run], root: dict[str, str | int]) -> None:
    f.attrs.create("schema_version", np.int32(SCHEMA_VERSION))
    for name, size in (("tool_version", 64), ("git_commit", 64), ("host", 128), ("device", 256),
                       ("math_mode", 64)):
        _str_attr(f, name, str(root[name]), size)
    f.attrs.create("weight_seed", np.uint64(root.get("weight_seed", 0)))
    f.attrs.create("prompt_seed", np.uint64(root.get("prompt_seed", 0)))
    mh = int(root.get("model_hash", 0))
    f.attrs.create("model_hash", np.uint64(mh))
    _str_attr(f, "model_hash_hex", f"{mh:016x}", 17)
    _str_attr(f, "shard", "1/1", 32)
    for name in ("torch_version", "transformers_version", "python_version", "capture_command"):
        if name in root:
            _str_attr(f, name, str(root[name]), max(64, len(str(root[name]).encode()) + 1))
    f.create_dataset("tolerances", data=np.zeros(0, TOLERANCE_DTYPE))
    runs_group = f.create_group("runs", track_order=True)
    for i, run in enumerate(runs):
        _write_run(runs_group.create_group(f"{i:04d}" if i < 10000 else f"{i:05d}"), run)
    f.create_dataset("comparisons", data=np.zeros(0, COMPARISON_DTYPE))
    summary = np.zeros(len(runs), SUMMARY_DTYPE)
    for i, run in enumerate(runs):
        s = summary[i]
        s["index"], s["model"], s["scenario"] = i, run.model.encode(), run.scenario.encode()
        s["variant"], s["backend"], s["mode"] = run.variant.encode(), run.backend.encode(), run.mode.encode()
        s["repeat"] = run.repeat
        # no comparisons yet: a skipped run is SKIP, any other PASS (the schema's rule)
        s["verdict"], s["verdict_name"] = (2, b"SKIP") if run.skipped else (0, b"PASS")
        s["first_divergence"] = (f"skipped: {run.skip_reason}"[:511].encode() if run.skipped else b"-")
        s["max_rel_err"] = np.nan
        s["graphs_captured"] = run.graphs_captured
    f.create_dataset("summary", data=summary)


def _write_run(g: h5py.Group, run: Run) -> None:
    from .fnv import fnv1a64_rows

    for name, text, size in (("model", run.model, 64), ("scenario", run.scenario, 64),
                             ("variant", run.variant, 64), ("backend", run.backend, 16),
                             ("mode", run.mode, 16)):
        _str_attr(g, name, text, size)
    g.attrs.create("repeat", np.int32(run.repeat))
    _str_attr(g, "fault", "", 64)
    g.attrs.create("prefill_chunk", np.int64(0))
    big = run.vocab > FULL_LOGITS_MAX_VOCAB
    g.attrs.create("topk", np.int32(TOPK if big and not run.skipped else 0))
    g.attrs.create("skipped", np.uint8(1 if run.skipped else 0))
    _str_attr(g, "skip_reason", run.skip_reason[:255], 256)
    if run.skipped:
        b, p, s, v = 0, 0, run.steps, run.vocab
    else:
        assert run.tokens is not None and run.logits is not None and run.prompt is not None
        s, b = run.tokens.shape
        v = run.logits.shape[2]
        p = run.prompt.shape[1]
    for name, val in (("steps", s), ("batch", b), ("vocab", v), ("prompt_len", p),
                      ("n_probes", len(run.probe_names) if not run.skipped else 0),
                      ("graphs_captured", run.graphs_captured), ("replays_checked", 0),
                      ("replay_mismatch_step", -1)):
        g.attrs.create(name, np.int64(val))
    g.attrs.create("seconds", np.float64(0.0))
    _str_attr(g, "engine", run.engine, 256)
    g.attrs.create("recompiles", np.int64(run.recompiles))
    g.attrs.create("graph_budget", np.int64(run.graph_budget))
    for name, val in run.extra.items():
        if isinstance(val, str):
            _str_attr(g, name, val, max(64, len(val.encode()) + 1))
        else:
            g.attrs.create(name, np.int64(val))
    if run.skipped:
        return
    assert run.margins is not None and run.probe_hash is not None and run.prompt_real is not None
    logits = np.ascontiguousarray(run.logits, dtype="<f4")
    g.create_dataset("prompt", data=run.prompt.astype("<i4"))
    g.create_dataset("prompt_real", data=run.prompt_real.astype("u1"))
    if run.prompt_text is not None:
        # written only when texts were given: a report of ids stays as it was
        g.create_dataset("prompt_text", data=np.array(run.prompt_text, dtype=object),
                         dtype=h5py.string_dtype("utf-8"))
    g.create_dataset("tokens", data=run.tokens.astype("<i4"))
    if big:
        ids, vals = _topk(logits, TOPK)
        g.create_dataset("topk_ids", data=ids, chunks=(1, b, TOPK), compression="gzip")
        g.create_dataset("topk_values", data=vals, chunks=(1, b, TOPK), compression="gzip")
    elif logits.size:
        g.create_dataset("logits", data=logits, chunks=(1, b, v), shuffle=True,
                         compression="gzip", compression_opts=4)
    else:
        g.create_dataset("logits", data=logits)
    # the capture hashed the rows once already (its logits probe); FNV is
    # serial in the bytes, seconds per run at a 256k vocabulary
    lh = run.logits_hash if run.logits_hash is not None else fnv1a64_rows(
        logits.reshape(s * b, v)).reshape(s, b)
    g.create_dataset("logits_hash", data=lh.astype("<u8"))
    g.create_dataset("margins", data=run.margins.astype("<f4"))
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(64)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    names = np.array([_fixed(n, 64, "probe name") for n in run.probe_names], dtype="S64")
    g.create_dataset("probe_names", data=names, dtype=h5py.Datatype(tid))
    g.create_dataset("probe_hash", data=run.probe_hash.astype("<u8"))
