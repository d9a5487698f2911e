"""Writing runs in the kvrepro HDF5 report schema (docs/SCHEMA.md, version 1).

A capture writes one schema-1 report holding only runs: /tolerances and
/comparisons are empty (the C gate makes the comparisons, `kvrepro gate
--external`), /summary has one row per run. Types follow the schema table for
table by table so that the C reader (reports/report_h5_read.c) accepts the
file without leeway: fixed-length strings of the field's size, little-endian
integers and floats of the stated widths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import BinaryIO

import h5py
import numpy as np

from .files import publish
from .names import MAX_HOLD_BYTES

SCHEMA_VERSION = 1
# Every run keeps its full logits (`topk` 0): `kvrepro gate --external`
# judges each captured run against the reference, and compiled against
# eager, within a tolerance, and checks that it is finite, so it needs every
# logit of every run (kept top-k rows would show it 16 of a 256k
# vocabulary). Above this vocabulary (a row is 256 KiB or more) a run whose
# logits are bitwise those of an earlier run of the report (repeats of a
# deterministic engine) stores them as an HDF5 hard link to that run's
# dataset, as the C writer shares them (docs/SCHEMA.md, `logits`): stored
# once, read like any dataset. At or below it every run stores its own copy,
# as captures always did, so their reports keep their bytes.
SHARE_LOGITS_ABOVE_VOCAB = 65536
# The reader's budget for a whole report (reports/kv_limits.h
# kv_limits_read_budget): max(KV_REPORT_READ_FLOOR_BYTES,
# KV_REPORT_MAX_READ_RATIO x the file's size), at most
# KV_REPORT_MAX_READ_BYTES (names.MAX_HOLD_BYTES). It counts each run's copy
# of a shared dataset, so a small file of many links may ask for more than
# it allows: then every run stores its own copy (a file without links is
# always within deflate's ratio), as the C writer does.
READ_FLOOR_BYTES = 64 << 20
READ_RATIO = 1032
# Over what the C reader allocates per run besides its arrays (KvRun, its
# summary row, comparisons' share: a few KiB): counted generously, so a
# report that the estimate lets keep its links is one the reader takes.
READ_RUN_OVERHEAD_BYTES = 64 << 10

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
    # timings (wall clock, the device synchronized at each end): the prefill
    # and each decode step's forward, step_ms[i] the one that gives step
    # i + 1's logits; the steady state is the median of step_ms[steady_from:]
    # (capture.steady_from says where it starts). seconds: the prefill plus
    # every decode step, the schema's `seconds`
    seconds: float = 0.0
    prefill_ms: float = float("nan")
    step_ms: np.ndarray | None = None       # (S - 1,) float64 ms
    steady_from: int = -1
    step_ms_steady: float = float("nan")
    compile_ms: float = 0.0                 # the decode steps whose call compiled a graph, summed


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


def margins_of(logits: np.ndarray) -> np.ndarray:
    """Top-1 minus runner-up of each row (..., V) -> (...) float32."""
    part = np.sort(logits, axis=-1)
    return (part[..., -1] - part[..., -2]).astype(np.float32)


def write_report(path: str, runs: list[Run], root: dict[str, str | int]) -> None:
    """Writes runs to path through files.publish: path is untouched or
    complete, never written through a link, and a path that is not a
    regular file (a device, a FIFO, a directory) is refused. A failure of
    the destination raises InputError naming path."""
    twin = logits_twins(runs)
    cost = read_cost(runs)

    def write(fobj: BinaryIO) -> None:
        # HDF5 through the file object: the temporary publish created is
        # the file written, never a name opened again
        _write_file(fobj, runs, root, twin)
        if any(t >= 0 for t in twin) and cost > read_budget(fobj.seek(0, os.SEEK_END)):
            # the links would ask the reader for more than this file's
            # budget: every run its own copy, within deflate's ratio
            fobj.seek(0)
            fobj.truncate()
            _write_file(fobj, runs, root, [-1] * len(runs))

    publish(path, write, "--out")


def _write_file(fobj: BinaryIO, runs: list[Run], root: dict[str, str | int], twin: list[int]) -> None:
    with h5py.File(fobj, "w", libver=("v108", "v108"), track_order=True) as f:
        _write(f, runs, root, twin)


def read_budget(file_size: int) -> int:
    """The bytes the C reader allocates at most for a file of file_size
    bytes (reports/kv_limits.h kv_limits_read_budget)."""
    return min(max(READ_FLOOR_BYTES, READ_RATIO * file_size), MAX_HOLD_BYTES)


def read_cost(runs: list[Run]) -> int:
    """At least what the C reader allocates for these runs (reports/h5util.c
    h5_read_cost, each run's copy of a shared logits dataset counted): their
    arrays and a generous READ_RUN_OVERHEAD_BYTES per run."""
    total = 0
    for run in runs:
        total += READ_RUN_OVERHEAD_BYTES
        if run.skipped or run.tokens is None or run.logits is None or run.prompt is None:
            continue
        s, b = run.tokens.shape
        n_probes = len(run.probe_names)
        # logits, tokens, logits_hash, margins, probe_hash; prompt, prompt_real; names; texts
        total += s * b * (run.logits.shape[2] * 4 + 4 + 8 + 4 + n_probes * 8) + run.prompt.size * 5
        total += n_probes * 64 + sum(len(t.encode()) + 1 for t in run.prompt_text or [])
    return total


def _logits_f4(run: Run) -> np.ndarray:
    """(S, B, V) little-endian float32, contiguous: the bytes stored."""
    assert run.logits is not None
    return np.ascontiguousarray(run.logits, dtype="<f4")


def _logits_hash(run: Run, logits: np.ndarray) -> np.ndarray:
    """(S, B) FNV-1a 64 of each row: the capture's own (its logits probe),
    or computed here (FNV is serial in the bytes, seconds per run at a 256k
    vocabulary)."""
    from .fnv import fnv1a64_rows

    if run.logits_hash is not None:
        return run.logits_hash
    s, b, v = logits.shape
    return fnv1a64_rows(logits.reshape(s * b, v)).reshape(s, b)


def logits_twins(runs: list[Run]) -> list[int]:
    """twin[i]: the earlier run of the same model, scenario and shape whose
    logits are bitwise run i's and which stores them itself, above
    SHARE_LOGITS_ABOVE_VOCAB; -1 when none (and for a skipped run). Only
    runs with equal row hashes are compared byte by byte."""
    twin = [-1] * len(runs)
    stored: dict[tuple[str, str, tuple[int, ...], bytes], list[int]] = {}
    for i, run in enumerate(runs):
        if run.skipped or run.logits is None or run.logits.ndim != 3 or run.logits.size == 0:
            continue
        if run.logits.shape[2] <= SHARE_LOGITS_ABOVE_VOCAB:
            continue
        logits = _logits_f4(run)
        key = (run.model, run.scenario, logits.shape, _logits_hash(run, logits).astype("<u8").tobytes())
        for j in stored.get(key, []):
            # as bits: NaN rows compare equal to themselves, -0.0 unequal to 0.0
            if np.array_equal(_logits_f4(runs[j]).view("<u4"), logits.view("<u4")):
                twin[i] = j
                break
        else:
            stored.setdefault(key, []).append(i)
    return twin


def _run_name(i: int) -> str:
    return f"{i:04d}" if i < 10000 else f"{i:05d}"


def _write(f: h5py.File, runs: list[Run], root: dict[str, str | int], twin: list[int]) -> None:
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
        _write_run(runs_group.create_group(_run_name(i)), run,
                   runs_group[_run_name(twin[i])]["logits"] if twin[i] >= 0 else None)
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


def _write_run(g: h5py.Group, run: Run, shared: h5py.Dataset | None) -> None:
    """One run group; shared: the identical logits dataset of an earlier
    run, which this run's `logits` becomes a hard link to."""
    for name, text, size in (("model", run.model, 64), ("scenario", run.scenario, 64),
                             ("variant", run.variant, 64), ("backend", run.backend, 16),
                             ("mode", run.mode, 16)):
        _str_attr(g, name, text, size)
    g.attrs.create("repeat", np.int32(run.repeat))
    _str_attr(g, "fault", "", 64)
    g.attrs.create("prefill_chunk", np.int64(0))
    g.attrs.create("topk", np.int32(0))
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
    g.attrs.create("seconds", np.float64(run.seconds))
    if run.step_ms is not None:
        # kvrepro-hf's own timings (docs/SCHEMA.md): read by `kvrepro-hf
        # timings`, past by the C reader
        g.attrs.create("prefill_ms", np.float64(run.prefill_ms))
        g.attrs.create("step_ms", np.asarray(run.step_ms, dtype="<f8"))
        g.attrs.create("steady_from", np.int64(run.steady_from))
        g.attrs.create("step_ms_steady", np.float64(run.step_ms_steady))
        g.attrs.create("compile_ms", np.float64(run.compile_ms))
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
    logits = _logits_f4(run)
    g.create_dataset("prompt", data=run.prompt.astype("<i4"))
    g.create_dataset("prompt_real", data=run.prompt_real.astype("u1"))
    if run.prompt_text is not None:
        # written only when texts were given: a report of ids stays as it was
        g.create_dataset("prompt_text", data=np.array(run.prompt_text, dtype=object),
                         dtype=h5py.string_dtype("utf-8"))
    g.create_dataset("tokens", data=run.tokens.astype("<i4"))
    if shared is not None:
        g["logits"] = shared   # a hard link: the same dataset, stored once
    elif logits.size:
        g.create_dataset("logits", data=logits, chunks=(1, b, v), shuffle=True,
                         compression="gzip", compression_opts=4)
    else:
        g.create_dataset("logits", data=logits)
    g.create_dataset("logits_hash", data=_logits_hash(run, logits).astype("<u8"))
    g.create_dataset("margins", data=run.margins.astype("<f4"))
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(64)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    names = np.array([_fixed(n, 64, "probe name") for n in run.probe_names], dtype="S64")
    g.create_dataset("probe_names", data=names, dtype=h5py.Datatype(tid))
    g.create_dataset("probe_hash", data=run.probe_hash.astype("<u8"))
