"""table: one line per captured configuration (dtype, cache layer, attention,
mode) of one or more captures, with the gate's verdicts on them when the
`kvrepro gate --external` report is given.

Columns:
  runs        runs with data (skipped and failed ones counted apart, their
              reasons listed under the table)
  reference   the gate's `reference` comparisons (kind 0) of those runs: PASS,
              or FAIL and how many of them failed; the largest max_rel_err
  vs eager    `compiled_vs_eager` (kind 6), the same way (compiled modes)
  repeats     `repeat` (kind 1: repeat k bitwise equal to repeat 0): bitwise,
              or DIFF and how many differ; `-` with one repeat
  graphs      decode graphs dynamo compiled, over the run's graph_budget, and
              `!` where the gate's `graph_budget` (kind 7) failed; a range
              where repeats differ; reduce-overhead: `cgN`, the CUDA graphs
              cudagraph trees recorded during the decode
  recompiles  dynamo's recompile messages during the decode
  ms/step     the steady per-step time (capture: the median of the decode
              steps after the warm-up), median over the runs [min-max]; `*`
              where inductor skipped the CUDA graphs of a reduce-overhead run
              (its steps are then not replays; the reason under the table)
  prefill ms  the prefill's time, median over the runs
  compile s   the decode steps whose call compiled a graph (dynamo, inductor;
              reduce-overhead's warm-up run), summed per run: median [min-max]

Without --gate the verdict columns are `-`. Under the table: each line's
first skip reason and first failure, at most MAX_NOTES lines. Reads the report schema only
(h5py, numpy): no torch, no transformers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from .errors import InputError
from .files import open_regular

# Lines under the table (skip reasons, first failures) at most: a log's tail
# keeps the table whole.
MAX_NOTES = 16
KIND_REFERENCE, KIND_REPEAT, KIND_FINITE, KIND_COMPILED, KIND_BUDGET = 0, 1, 5, 6, 7
PASS, FAIL, SKIP = 0, 1, 2


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray) and v.dtype.kind == "S":
        return v.tobytes().split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(v)


def _num(v: Any, default: float = math.nan) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


@dataclass
class CapturedRun:
    key: tuple[str, str, str, str, str, int]   # model, scenario, variant, backend, mode, repeat
    dtype: str
    cache: str
    attn: str
    skipped: bool
    skip_reason: str
    graphs: int
    recompiles: int
    budget: int
    step_ms_steady: float
    prefill_ms: float
    compile_ms: float
    cudagraph_skips: int = 0
    cudagraph_skip: str = ""
    cudagraph_records: int = -1   # -1: not recorded (not a reduce-overhead run)
    steps: int = 0


@dataclass
class Verdicts:
    """The gate's comparisons that judged one run, by kind: (verdict,
    max_rel_err, message) each."""

    by_kind: dict[int, list[tuple[int, float, str]]] = field(default_factory=dict)


def _open(path: str) -> h5py.File:
    os.close(open_regular(path, "report"))   # a FIFO or device refused before HDF5 opens it
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise InputError(f"{path}: not an HDF5 report (or damaged): {str(e).splitlines()[0][:200]}") from None


def _run_groups(f: h5py.File, path: str) -> Iterator[tuple[int, h5py.Group]]:
    runs = f.get("runs")
    if not isinstance(runs, h5py.Group):
        raise InputError(f"{path}: /runs: missing (not a kvrepro report)")
    for name in runs:
        g = runs[name]
        if not name.isdigit() or not isinstance(g, h5py.Group):
            raise InputError(f"{path}: /runs/{name}: expected a run group named by its index")
        yield int(name), g


def _key(g: h5py.Group) -> tuple[str, str, str, str, str, int]:
    a = g.attrs
    return (_text(a.get("model", "")), _text(a.get("scenario", "")), _text(a.get("variant", "")),
            _text(a.get("backend", "")), _text(a.get("mode", "")), int(a.get("repeat", 0)))


def read_captured(path: str) -> list[CapturedRun]:
    """The runs of a capture (`kvrepro-hf capture`): another engine's runs,
    those with an `engine` attribute."""
    out = []
    with _open(path) as f:
        for _, g in _run_groups(f, path):
            a = g.attrs
            if "engine" not in a:
                continue
            key = _key(g)
            # a skipped run records no capture attributes: its variant
            # hf:LAYER:IMPL:DTYPE (capture.variant_name) names them
            parts = key[2].split(":")
            layer, impl, dtype = parts[1:4] if len(parts) == 4 and parts[0] == "hf" else ("?", "?", "?")
            out.append(CapturedRun(
                key=key, dtype=_text(a.get("dtype", dtype)), cache=_text(a.get("cache_layer", layer)),
                attn=_text(a.get("attn_impl", impl)), skipped=bool(int(a.get("skipped", 0))),
                skip_reason=_text(a.get("skip_reason", "")), graphs=int(a.get("graphs_captured", 0)),
                recompiles=int(a.get("recompiles", -1)), budget=int(a.get("graph_budget", -1)),
                step_ms_steady=_num(a.get("step_ms_steady")), prefill_ms=_num(a.get("prefill_ms")),
                compile_ms=_num(a.get("compile_ms")), cudagraph_skips=int(a.get("cudagraph_skips", 0)),
                cudagraph_skip=_text(a.get("cudagraph_skip", "")),
                cudagraph_records=int(a.get("cudagraph_records", -1)), steps=int(a.get("steps", 0))))
    return out


def read_verdicts(path: str) -> dict[tuple[str, str, str, str, str, int], Verdicts]:
    """A gate report's comparisons, by the label of the run they judged
    (run_b)."""
    with _open(path) as f:
        index = {i: _key(g) for i, g in _run_groups(f, path)}
        t = f.get("comparisons")
        if not isinstance(t, h5py.Dataset) or t.dtype.names is None:
            raise InputError(f"{path}: /comparisons: missing (not a gate's report)")
        for m in ("kind", "run_b", "verdict", "max_rel_err", "message"):
            if m not in t.dtype.names:
                raise InputError(f"{path}: /comparisons: missing table member '{m}'")
        if t.shape[0] == 0:
            raise InputError(f"{path}: /comparisons: empty: not the report of `kvrepro gate --external` "
                             "(a capture judges nothing)")
        out: dict[tuple[str, str, str, str, str, int], Verdicts] = {}
        for i, row in enumerate(t[()]):
            b = int(row["run_b"])
            if b not in index:
                raise InputError(f"{path}: /comparisons row {i}: run_b {b} is no run of the report")
            v = out.setdefault(index[b], Verdicts())
            v.by_kind.setdefault(int(row["kind"]), []).append(
                (int(row["verdict"]), float(row["max_rel_err"]), _text(row["message"])))
    return out


def _verdict_cell(results: list[tuple[int, float, str]], with_err: bool) -> tuple[str, str]:
    """The cell and the first failure's message ("" when none failed)."""
    judged = [r for r in results if r[0] != SKIP]
    if not judged:
        return ("SKIP" if results else "-"), ""
    failed = [r for r in judged if r[0] == FAIL]
    errs = [r[1] for r in judged if math.isfinite(r[1])]
    err = f" {max(errs):.1e}" if with_err and errs else ""
    if failed:
        return f"FAIL {len(failed)}/{len(judged)}{err}", failed[0][2]
    return f"PASS{err}", ""


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _ms(values: list[float], spread: bool) -> str:
    v = [x for x in values if math.isfinite(x)]
    if not v:
        return "-"
    med = float(np.median(v))
    digits = 3 if med < 100 else 1
    text = f"{med:.{digits}f}"
    if spread and len(v) > 1 and max(v) > min(v):
        text += f" [{min(v):.{digits}f}-{max(v):.{digits}f}]"
    return text


HEADER = ("dtype", "cache", "attn", "mode", "runs", "reference", "vs eager", "repeats", "graphs", "recompiles",
          "ms/step", "prefill ms", "compile s")


def table_lines(captures: list[str], gate: str | None = None) -> list[str]:
    """The table of the runs in captures (in file order), with the gate
    report's verdicts when gate is given."""
    runs: list[CapturedRun] = []
    for path in captures:
        got = read_captured(path)
        if not got:
            raise InputError(f"{path}: no captured run (no run with an `engine` attribute: not a "
                             "kvrepro-hf capture, or a gate report of one)")
        runs.extend(got)
    verdicts = read_verdicts(gate) if gate is not None else {}
    groups: dict[tuple[str, ...], list[CapturedRun]] = {}
    for r in runs:
        model, scenario, _, backend, mode, _ = r.key
        groups.setdefault((model, scenario, backend, r.dtype, r.cache, r.attn, mode), []).append(r)
    by_unit: dict[tuple[str, str, str], list[tuple[str, ...]]] = {}
    notes: dict[str, list[str]] = {}   # each message, once, with the lines it is about

    def note(label: str, text: str) -> None:
        notes.setdefault(text, []).append(label)
    for (model, scenario, backend, dtype, cache, attn, mode), rs in groups.items():
        ran = [r for r in rs if not r.skipped]
        failed = [r for r in rs if r.skipped and r.skip_reason.startswith("failed:")]
        skipped = [r for r in rs if r.skipped and not r.skip_reason.startswith("failed:")]
        cell = str(len(ran))
        extra = [f"{len(x)} {w}" for x, w in ((failed, "failed"), (skipped, "skipped")) if x]
        if extra:
            cell += f" ({', '.join(extra)})"
        label = f"{dtype} {cache} {attn} {mode}"
        for r in (failed or skipped)[:1]:
            note(label, f"{r.skip_reason}")
        v = [verdicts.get(r.key, Verdicts()) for r in rs]
        cells = []
        for kind, with_err in ((KIND_REFERENCE, True), (KIND_COMPILED, True), (KIND_REPEAT, False)):
            results = [x for vv in v for x in vv.by_kind.get(kind, [])]
            if gate is None or (kind == KIND_COMPILED and mode == "eager"):
                cells.append("-")
                continue
            c, first = _verdict_cell(results, with_err)
            if kind == KIND_REPEAT:
                c = "-" if c == "-" else ("bitwise" if c.startswith("PASS") else c.replace("FAIL", "DIFF"))
            cells.append(c)
            if first:
                note(label, f"{first}")
        _, first = _verdict_cell([x for vv in v for x in vv.by_kind.get(KIND_FINITE, [])], False)
        if first and not failed:   # a run that did not complete: its reason is noted already
            note(label, f"{first}")
        if mode == "eager" or not ran:
            graphs = recompiles = "-"
        else:
            budgets = {r.budget for r in ran}
            budget = str(budgets.pop()) if len(budgets) == 1 else "?"
            graphs = f"{_span([r.graphs for r in ran])}/{'-' if budget == '-1' else budget}"
            over = [x for vv in v for x in vv.by_kind.get(KIND_BUDGET, []) if x[0] == FAIL]
            if over:
                graphs += "!"
                note(label, f"{over[0][2]}")
            recompiles = _span([r.recompiles for r in ran])
            recorded = [r.cudagraph_records for r in ran if r.cudagraph_records >= 0]
            if recorded:
                graphs += f" cg{_span(recorded)}"
        ms = _ms([r.step_ms_steady for r in ran], True)
        unsteady = [r for r in ran if r.cudagraph_records > 0 and not math.isfinite(r.step_ms_steady)]
        if unsteady:
            r = unsteady[0]
            note(label, f"{r.cudagraph_records} CUDA graphs recorded in {r.steps - 1} decode steps: "
                         "recorded again up to the last step, no replay to time (a size or integer that changes "
                         "every step)")
        no_graph = [r for r in ran if r.cudagraph_skips > 0]
        if no_graph:
            ms += "*"
            note(label, f"* CUDA graphs skipped in {len(no_graph)} of {len(ran)} runs, their steps are not "
                         f"replays: {no_graph[0].cudagraph_skip or '(no reason logged)'}")
        by_unit.setdefault((model, scenario, backend), []).append(
            (dtype, cache, attn, mode, cell, *cells, graphs, recompiles,
             ms, _ms([r.prefill_ms for r in ran], False),
             "-" if mode == "eager" else _ms([r.compile_ms / 1e3 for r in ran], True)))
    all_rows = [r for rows in by_unit.values() for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in all_rows)) for i, h in enumerate(HEADER)]
    lines: list[str] = []
    for (model, scenario, backend), rows in by_unit.items():
        lines.append(f"{model} {scenario} {backend}" + (f" (verdicts: {gate})" if gate else " (no gate report)"))
        lines.append("  ".join(h.ljust(w) for h, w in zip(HEADER, widths)).rstrip())
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    shown = [f"{labels[0]}{f' (and {len(labels) - 1} more lines)' if len(labels) > 1 else ''}: {text}"
             for text, labels in notes.items()]
    lines.extend(f"  {n[:300]}" for n in shown[:MAX_NOTES])
    if len(shown) > MAX_NOTES:
        lines.append(f"  ... and {len(shown) - MAX_NOTES} more (the captures' skip reasons and the gate's report "
                     "hold them all)")
    return lines
