"""PNG figures of a kvrepro report (docs/SCHEMA.md, version 1), for review.

`plot_report` reads any schema-1 file (a C gate report, a `gate --external`
report, or a `kvrepro-hf capture`) and writes three figures:

  error_vs_reference.png  per decode step, each run's max relative logit
                          error against its baseline (log scale)
  divergence_map.png      run x step: bitwise equal / logits differ /
                          a token differs, against the same baseline
  graphs_per_decode.png   per compiled run: decode graphs captured,
                          dynamo recompiles and the layer's graph budget

The baseline of a run is a `reference` run of the same model and scenario
when the report has one (the C gate's reference comparison); a capture has
none, so its first eager run stands in, and the figures say which run that
is. The comparisons are pure functions of arrays (`rel_error_series`,
`kept_rel_error_series`, `rows_bitwise_equal`, `divergence_codes`,
`divergence_matrix`, `window_step`) so they can be checked without a figure;
`load_comparisons` gives what the figures show for a report file.

Figures are drawn on `matplotlib.figure.Figure` and saved as PNG, which
matplotlib renders with its Agg canvas whatever backend is selected; pyplot
is never imported. So no display is needed, and there is no
`matplotlib.use("Agg")` either: it would switch the backend of a process
(a notebook, say) that merely imports this module, and pyplot's registry
would keep every figure alive. Sizes and dpi are functions of the report
alone and the PNG carries no Software tag, so the same report gives the same
bytes with the same matplotlib.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import h5py
import matplotlib
import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from .errors import InputError
from .files import check_out_dir, check_writable, open_regular, publish, same_file
from .names import MAX_WINDOW

SCHEMA_VERSION = 1
# An exact zero has no place on a log axis: errors below this are drawn at it
# (and the axis label says so), so a run equal to its baseline stays visible.
FLOOR = 1e-12
# Floats read at once from a logits dataset: a small vocabulary's whole
# (S, B, V) dataset, otherwise as many steps as fit (the dataset is chunked
# one step per chunk, so a block of steps is whole chunks).
BLOCK_FLOATS = 1 << 22
DPI = 100
# Divergence map codes (and -1 where a run has no such step).
NO_DATA, EQUAL, LOGITS_DIFFER, TOKEN_DIFFERS = -1, 0, 1, 2
MAP_COLORS = ("#ffffff", "#cfe3cf", "#f0a830", "#c0392b")
MAP_LABELS = ("no data (step not recorded / not comparable)",
              "0: bitwise-equal logits in every batch row",
              "1: logits differ, every token equal",
              "2: some token differs")
# A figure taller than this (inches) gets thinner rows instead; matplotlib
# refuses images above 2^16 pixels a side.
MAX_HEIGHT_IN = 150.0
FIGURES = ("error_vs_reference.png", "divergence_map.png", "graphs_per_decode.png")


# ---------------------------------------------------------------- pure math

def rel_error_series(base_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """(S, B, V) baseline and candidate logits -> (S,) float64: per step the
    largest over batch rows of max|a-b| / max|baseline row|, the C side's
    max_rel_err (harness/compare.c: a row whose baseline is all zero divides
    by 1). A row with a non-finite logit on either side gives inf: the C
    gate fails it outright, so it must not read as a small error."""
    b = np.asarray(base_logits, dtype=np.float64)
    c = np.asarray(logits, dtype=np.float64)
    if b.shape != c.shape or b.ndim != 3:
        raise ValueError(f"shapes differ or are not (S, B, V): {b.shape} vs {c.shape}")
    return _rel(np.abs(c - b), np.abs(b), np.isfinite(b).all(-1) & np.isfinite(c).all(-1))


def kept_rel_error_series(base_ids: np.ndarray, base_vals: np.ndarray, ids: np.ndarray,
                          vals: np.ndarray, base_scale: np.ndarray | None = None) -> np.ndarray:
    """The error series on the kept ids of top-k rows (S, B, K): an id the
    candidate kept is compared with the baseline's value of the same id when
    the baseline kept it too. The denominator is base_scale (S, B) when the
    baseline's full rows are known (their max |logit|), else the largest
    kept |baseline value|: all a top-k baseline offers."""
    bi, bv = np.asarray(base_ids), np.asarray(base_vals, dtype=np.float64)
    ci, cv = np.asarray(ids), np.asarray(vals, dtype=np.float64)
    match = ci[..., :, None] == bi[..., None, :]                      # (S, B, K, Kb)
    found = match.any(-1)
    at = np.where(match, bv[..., None, :], 0.0).sum(-1)               # baseline value of each kept id
    finite = (np.isfinite(bv).all(-1) & np.isfinite(cv).all(-1)
              & (np.isfinite(base_scale) if base_scale is not None else True))
    diff = np.where(found, np.abs(cv - at), 0.0)
    scale = np.abs(bv) if base_scale is None else np.asarray(base_scale, np.float64)[..., None]
    return _rel(diff, scale, finite)


def _rel(absdiff: np.ndarray, absbase: np.ndarray, finite: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        num = absdiff.max(-1, initial=0.0)                            # (S, B)
        den = absbase.max(-1, initial=0.0)
        rel = np.where(finite, num / np.where(den > 0.0, den, 1.0), np.inf)
    return rel.max(-1, initial=0.0)


def rows_bitwise_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(S, B, V) float32 pair -> (S, B): rows equal bit for bit (-0 differs
    from 0, and a NaN equals only the same NaN), as the gate's bitwise
    comparisons and logits_hash see them."""
    a32 = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    b32 = np.ascontiguousarray(b, dtype=np.float32).view(np.uint32)
    return (a32 == b32).all(-1)


def divergence_codes(base_tokens: np.ndarray, tokens: np.ndarray,
                     rows_equal: np.ndarray) -> np.ndarray:
    """Per step (S,) int8: 0 when every batch row's logits are bitwise equal,
    1 when some row's logits differ but every token is equal, 2 when some
    token differs. tokens (S, B); rows_equal (S, B) bool."""
    tok = (np.asarray(base_tokens) != np.asarray(tokens)).any(-1)
    logit = ~np.asarray(rows_equal, dtype=bool).all(-1)
    return np.where(tok, TOKEN_DIFFERS, np.where(logit, LOGITS_DIFFER, EQUAL)).astype(np.int8)


def divergence_matrix(base_logits: np.ndarray, base_tokens: np.ndarray,
                      runs: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The divergence map of runs [(logits (S', B, V), tokens (S', B))]
    against one baseline: (len(runs), S) int8 codes, S the baseline's steps;
    NO_DATA (-1) where a run recorded fewer steps than the baseline."""
    steps = base_tokens.shape[0]
    out = np.full((len(runs), steps), NO_DATA, np.int8)
    for i, (lg, tk) in enumerate(runs):
        n = min(steps, tk.shape[0])
        out[i, :n] = divergence_codes(base_tokens[:n], tk[:n], rows_bitwise_equal(base_logits[:n], lg[:n]))
    return out


def window_step(prompt_len: int, window: int | None) -> int | None:
    """The first decode step s whose position prompt_len + s reaches the
    sliding window W (prompt_len + s >= W); None when W is unknown."""
    if window is None or window <= 0:
        return None
    return max(0, window - prompt_len)


# ---------------------------------------------------------------- reading

@dataclass(frozen=True)
class RunInfo:
    """A run's attributes, as the figures need them."""

    index: int
    group: str             # HDF5 path of the run group, e.g. "runs/0003"
    model: str
    scenario: str
    variant: str
    fault: str
    backend: str
    mode: str
    repeat: int
    skipped: bool
    skip_reason: str
    steps: int
    batch: int
    vocab: int
    prompt_len: int
    topk: int
    window: int | None
    graphs_captured: int
    recompiles: int | None     # None: absent or -1 (unknown)
    graph_budget: int | None   # None: absent or -1 (no budget)

    @property
    def name(self) -> str:
        """variant[+fault]/backend/mode/rN, as kvrepro's listings name a run."""
        v = f"{self.variant}+{self.fault}" if self.fault else self.variant
        return f"{v}/{self.backend}/{self.mode}/r{self.repeat}"

    @property
    def label(self) -> str:
        return f"#{self.index} {self.name}"


@dataclass
class Group:
    """The runs of one (model, scenario) and each one's baseline."""

    model: str
    scenario: str
    runs: list[RunInfo] = field(default_factory=list)       # not skipped, in index order
    skipped: list[RunInfo] = field(default_factory=list)
    baseline_of: dict[int, RunInfo] = field(default_factory=dict)
    baseline_note: str = ""
    window: int | None = None
    window_note: str = ""

    @property
    def title(self) -> str:
        return f"{self.model} / {self.scenario}"


@dataclass
class Comparison:
    """A run against its baseline over the steps both recorded."""

    errors: np.ndarray | None     # (S,) float64, None when not comparable
    codes: np.ndarray             # (S_base,) int8
    topk_only: bool = False
    why_not: str = ""             # why the run could not be compared


def _text(value: object) -> str:
    if isinstance(value, np.ndarray):
        value = value.item() if value.shape == () else value.tolist()
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


class _Reader:
    """The open report and the arrays read so far for baselines (each is a
    baseline to many runs); lives for one plot_report call."""

    def __init__(self, path: str) -> None:
        self.path = path
        # a FIFO would block the open, a device be read as a file
        os.close(open_regular(path, "report"))
        try:
            self.f = h5py.File(path, "r")
        except OSError as e:
            raise InputError(f"{path}: not an HDF5 file (or damaged): {e}") from None
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    def close(self) -> None:
        self.f.close()

    def fail(self, where: str, what: str) -> InputError:
        return InputError(f"{self.path}: {where}: {what}")

    def check_root(self) -> None:
        if "schema_version" not in self.f.attrs:
            raise self.fail("/", "missing root attribute 'schema_version'")
        v = self.f.attrs["schema_version"]
        try:
            ok = int(v) == SCHEMA_VERSION
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise self.fail("schema_version", f"expected {SCHEMA_VERSION}, found {_text(v)}")
        if not isinstance(self.f.get("runs", getlink=True), h5py.HardLink) \
                or not isinstance(self.f["runs"], h5py.Group):
            raise self.fail("/runs", "expected a group, found none")

    def runs(self) -> list[RunInfo]:
        out = []
        for name in self.f["runs"]:
            if not name.isdigit():
                raise self.fail(f"/runs/{name}", "expected a run group named by its index")
            out.append(self._run(int(name), f"runs/{name}"))
        out.sort(key=lambda r: r.index)
        return out

    def _run(self, index: int, group: str) -> RunInfo:
        g = self.f[group]
        if not isinstance(g, h5py.Group):
            raise self.fail(f"/{group}", "expected a group")
        a = g.attrs

        def text(name: str, default: str | None = None) -> str:
            if name not in a:
                if default is None:
                    raise self.fail(f"/{group}", f"missing attribute '{name}'")
                return default
            return _text(a[name])

        def num(name: str, default: int | None = None) -> int:
            if name not in a:
                if default is None:
                    raise self.fail(f"/{group}", f"missing attribute '{name}'")
                return default
            try:
                return int(np.asarray(a[name]).item())
            except (TypeError, ValueError):
                raise self.fail(f"/{group}", f"attribute '{name}': expected an integer, "
                                f"found {_text(a[name])!r}") from None

        def optional(name: str) -> int | None:
            v = num(name, -1)
            return None if v < 0 else v

        return RunInfo(
            index=index, group=group, model=text("model"), scenario=text("scenario"),
            variant=text("variant"), fault=text("fault", ""), backend=text("backend"),
            mode=text("mode"), repeat=num("repeat"), skipped=bool(num("skipped")),
            skip_reason=text("skip_reason", ""), steps=num("steps"), batch=num("batch"),
            vocab=num("vocab"), prompt_len=num("prompt_len"), topk=num("topk", 0),
            window=optional("window") or None, graphs_captured=num("graphs_captured", 0),
            recompiles=optional("recompiles"), graph_budget=optional("graph_budget"))

    def dataset(self, run: RunInfo, name: str, shape: tuple[int, ...]) -> h5py.Dataset:
        path = f"{run.group}/{name}"
        ds = self.f.get(path)
        if not isinstance(ds, h5py.Dataset):
            raise self.fail(f"/{path}", "missing dataset")
        if ds.shape != shape:
            raise self.fail(f"/{path}", f"expected shape {shape}, found {ds.shape}")
        return ds

    def small(self, run: RunInfo, name: str) -> np.ndarray:
        """tokens or logits_hash (S, B): small, read whole, kept for reuse."""
        key = (run.group, name)
        if key not in self._cache:
            self._cache[key] = self.dataset(run, name, (run.steps, run.batch))[()]
        return self._cache[key]

    def blocks(self, runs: Sequence[RunInfo], steps: int) -> Iterator[tuple[int, int]]:
        """Step ranges that keep each read of these runs near BLOCK_FLOATS."""
        width = max(max(1, r.batch * max(r.vocab if r.topk == 0 else r.topk, 1)) for r in runs)
        per = max(1, BLOCK_FLOATS // width)
        for s0 in range(0, steps, per):
            yield s0, min(steps, s0 + per)

    def rows(self, run: RunInfo, s0: int, s1: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Steps s0..s1 of a run: (logits, None) for full rows, (values, ids)
        for top-k rows. A whole small dataset is read once and kept."""
        if run.topk > 0:
            shape = (run.steps, run.batch, run.topk)
            return (self._part(run, "topk_values", shape, s0, s1),
                    self._part(run, "topk_ids", shape, s0, s1))
        return self._part(run, "logits", (run.steps, run.batch, run.vocab), s0, s1), None

    def _part(self, run: RunInfo, name: str, shape: tuple[int, ...], s0: int, s1: int) -> np.ndarray:
        key = (run.group, name)
        if key in self._cache:
            return self._cache[key][s0:s1]
        ds = self.dataset(run, name, shape)
        if math.prod(shape) <= BLOCK_FLOATS:
            self._cache[key] = ds[()]
            return self._cache[key][s0:s1]
        return ds[s0:s1]

    def same_logits(self, a: RunInfo, b: RunInfo) -> bool:
        """Both runs' `logits` are one dataset: the writer hard-links
        bitwise-identical logits (SCHEMA.md), so nothing needs reading."""
        if a.topk or b.topk:
            return False
        x, y = self.f.get(f"{a.group}/logits"), self.f.get(f"{b.group}/logits")
        return isinstance(x, h5py.Dataset) and isinstance(y, h5py.Dataset) and x.id == y.id


def _groups(runs: list[RunInfo], cli_window: int | None) -> list[Group]:
    groups: dict[tuple[str, str], Group] = {}
    for r in runs:
        g = groups.setdefault((r.model, r.scenario), Group(r.model, r.scenario))
        (g.skipped if r.skipped else g.runs).append(r)
    for g in groups.values():
        _choose_baselines(g)
        base = g.baseline_of.get(g.runs[0].index) if g.runs else None
        windows = [r.window for r in ([base] if base else []) + g.runs + g.skipped if r.window]
        if windows:
            g.window, g.window_note = windows[0], f"W={windows[0]} (run attribute 'window')"
        elif cli_window:
            g.window, g.window_note = cli_window, f"W={cli_window} (from --window)"
        else:
            g.window_note = "window unknown (no 'window' attribute; pass --window W)"
    return list(groups.values())


def _choose_baselines(g: Group) -> None:
    """A reference run where there is one: the nearest one before each run
    (the gate writes each pass's reference run before its candidates, and a
    planted-fault pass has its own, stored top-k), or the first one for runs
    before any. A capture has none: its first eager run, else its first run."""
    refs = [r for r in g.runs if r.variant == "reference"]
    if refs:
        for r in g.runs:
            before = [x for x in refs if x.index <= r.index]
            g.baseline_of[r.index] = before[-1] if before else refs[0]
        used = sorted({b.index for b in g.baseline_of.values()})
        g.baseline_note = ("vs reference run " if len(used) == 1 else
                           "vs the nearest preceding reference run ") + \
            ", ".join(f"#{i}" for i in used[:6]) + (" …" if len(used) > 6 else "")
        return
    if not g.runs:
        return
    eager = [r for r in g.runs if r.mode == "eager"]
    base = eager[0] if eager else g.runs[0]
    why = ("first eager run; no reference run in the report" if eager else
           "no reference and no eager run in the report: the first recorded run")
    for r in g.runs:
        g.baseline_of[r.index] = base
    g.baseline_note = f"vs {base.label} ({why})"


def _compare(rd: _Reader, base: RunInfo, run: RunInfo) -> Comparison:
    codes = np.full(base.steps, NO_DATA, np.int8)
    if run.batch != base.batch:
        return Comparison(None, codes, why_not=f"batch {run.batch} vs baseline's {base.batch}")
    if run.vocab != base.vocab:
        return Comparison(None, codes, why_not=f"vocab {run.vocab} vs baseline's {base.vocab}")
    steps = min(run.steps, base.steps)
    tb, tr = rd.small(base, "tokens")[:steps], rd.small(run, "tokens")[:steps]
    if run.index == base.index or rd.same_logits(base, run):
        codes[:steps] = divergence_codes(tb, tr, np.ones(tr.shape, bool))
        return Comparison(np.zeros(steps), codes)
    topk_only = bool(run.topk or base.topk)
    if topk_only:  # bitwise equality of the full rows: their stored hashes
        eq = rd.small(base, "logits_hash")[:steps] == rd.small(run, "logits_hash")[:steps]
    else:
        eq = np.zeros((steps, run.batch), bool)
    errors = np.zeros(steps)
    for s0, s1 in rd.blocks((base, run), steps):
        bl, bids = rd.rows(base, s0, s1)
        cl, cids = rd.rows(run, s0, s1)
        if not topk_only:
            errors[s0:s1] = rel_error_series(bl, cl)
            eq[s0:s1] = rows_bitwise_equal(bl, cl)
        elif bids is None:      # full baseline, top-k candidate: the baseline at the kept ids
            assert cids is not None
            errors[s0:s1] = kept_rel_error_series(
                cids, np.take_along_axis(bl, cids.astype(np.intp), -1), cids, cl,
                base_scale=np.abs(bl.astype(np.float64)).max(-1, initial=0.0))
        elif cids is None:      # top-k baseline, full candidate
            errors[s0:s1] = kept_rel_error_series(
                bids, bl, bids, np.take_along_axis(cl, bids.astype(np.intp), -1))
        else:
            errors[s0:s1] = kept_rel_error_series(bids, bl, cids, cl)
    codes[:steps] = divergence_codes(tb, tr, eq)
    return Comparison(errors, codes, topk_only=topk_only)


# ---------------------------------------------------------------- figures

def _ranges(indices: list[int], limit: int = 14) -> str:
    """#3-#7, #9 … (N runs): run indices, consecutive ones as a range."""
    parts: list[str] = []
    start = prev = None
    for i in indices + [None]:  # type: ignore[list-item]
        if start is not None and (i is None or i != prev + 1):
            parts.append(f"#{start}" if start == prev else f"#{start}-#{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    text = ", ".join(parts[:limit]) + (" …" if len(parts) > limit else "")
    return f"{text} ({len(indices)} run{'s' if len(indices) != 1 else ''})"


def _skipped_lines(groups: list[Group], width: int) -> list[str]:
    """The footnote: skipped runs by reason, so ten runs refused for one
    reason take one line."""
    by_reason: dict[str, list[int]] = {}
    for g in groups:
        for r in g.skipped:
            by_reason.setdefault(r.skip_reason or "(no reason recorded)", []).append(r.index)
    if not by_reason:
        return []
    lines = ["Skipped runs, left out:"]
    for reason, idx in by_reason.items():
        short = reason if len(reason) <= 110 else reason[:109] + "…"
        lines += textwrap.wrap(f"{_ranges(sorted(idx))}: {short}", width,
                               initial_indent="  ", subsequent_indent="      ")
    return lines


def _save(fig: Figure, out_dir: str, name: str) -> str:
    """Written through files.publish, as the reports are: a failed write
    never leaves a file that looks like a figure, and a link at the name is
    replaced, never written through."""
    path = os.path.join(out_dir, name)
    publish(path, lambda f: fig.savefig(f, format="png", dpi=DPI, metadata={"Software": None}),
            "--out")
    return path


def _footnote(fig: Figure, lines: list[str], bottom_in: float, height_in: float) -> None:
    if lines:
        fig.text(0.01, bottom_in / height_in, "\n".join(lines), ha="left", va="bottom",
                 fontsize=8, family="monospace", color="0.25")


def _tolerance(rd: _Reader, name: str) -> float | None:
    """A named tolerance from /tolerances (C gate reports; a capture's table
    is empty), so the error plot can show where the gate draws its line."""
    t = rd.f.get("tolerances")
    if not isinstance(t, h5py.Dataset) or t.dtype.names is None \
            or not {"name", "value"} <= set(t.dtype.names) or t.ndim != 1:
        return None
    for row in t[()]:
        if _text(row["name"]) == name:
            return float(row["value"])
    return None


def _label_inches(labels: Sequence[str], fontsize: float) -> float:
    """Width of monospace tick labels (DejaVu Sans Mono: 0.6 em a glyph)."""
    return max((len(t) for t in labels), default=0) * fontsize * 0.6 / 72 + 0.25


def _window_caption(g: Group, steps: int, base: RunInfo | None) -> tuple[int | None, str]:
    if g.window is None or base is None:
        return None, g.window_note
    ws = window_step(base.prompt_len, g.window)
    assert ws is not None
    if ws >= steps:
        return None, f"{g.window_note}: not full within {steps} steps (prompt_len {base.prompt_len})"
    return ws, f"{g.window_note}, prompt_len {base.prompt_len}: full from step {ws}"


@dataclass
class _Line:
    run: RunInfo
    name: str
    errors: np.ndarray


def _error_lines(groups: list[Group], cmp: dict[int, Comparison]) -> list[list[_Line]]:
    """Each group's lines and their legend names. One group (a capture) names
    runs by index, so a line hidden under an identical one can say whose it
    is; several groups share a legend keyed by run name instead (the same
    variant in every panel has one colour), which has no index to give."""
    single = len(groups) == 1
    out = []
    for g in groups:
        lines: list[_Line] = []
        seen: dict[bytes, int] = {}
        for r in g.runs:
            c = cmp.get(r.index)
            if c is None or c.errors is None or g.baseline_of[r.index].index == r.index:
                continue
            e = c.errors
            name = (r.label if single else r.name) + (" [top-k ids only]" if c.topk_only else "")
            same = seen.setdefault(e.tobytes(), r.index)
            if not (e > 0).any():
                name += " (= baseline: at floor)"
            elif single and same != r.index:
                name += f" (same errors as #{same})"
            lines.append(_Line(r, name, e))
        out.append(lines)
    return out


def _error_figure(rd: _Reader, groups: list[Group], cmp: dict[int, Comparison], out_dir: str) -> str:
    n = max(1, len(groups))
    ncols = 1 if n <= 4 else 2
    nrows = math.ceil(n / ncols)
    foot = _skipped_lines(groups, 150 if ncols == 1 else 230)
    incomparable = [f"  {r.label}: {cmp[r.index].why_not}" for g in groups for r in g.runs
                    if r.index in cmp and cmp[r.index].errors is None]
    if incomparable:
        foot += ["Not comparable with their baseline, left out:"] + incomparable[:20]
    per_group = _error_lines(groups, cmp)
    names = list(dict.fromkeys(ln.name for lines in per_group for ln in lines))
    shown_names = names[:40]
    legend_in = max(_label_inches(shown_names, 8) * 0.92, 3.2)  # proportional font: narrower
    plot_in = 11.0 if ncols == 1 else 9.0
    left_in, gap_in = 1.1, 0.9
    width = left_in + ncols * plot_in + (ncols - 1) * gap_in + 0.3 + legend_in
    panel, top_in, bottom_in = 3.6, 1.45, 0.75 + 0.16 * len(foot)
    height = min(MAX_HEIGHT_IN, top_in + bottom_in + panel * nrows)
    right = (left_in + ncols * plot_in + (ncols - 1) * gap_in) / width
    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.subplots_adjust(left=left_in / width, right=right, top=1 - top_in / height,
                        bottom=bottom_in / height, hspace=0.55, wspace=gap_in / plot_in)
    fig.suptitle("Max relative logit error per decode step, each run against its baseline\n"
                 "max |a − b| / max |baseline| per batch row (as the C gate's max_rel_err), "
                 f"max over batch rows — {rd.path}", fontsize=11)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    palette = [matplotlib.colormaps["tab10"](i) for i in range(10)] + \
        [matplotlib.colormaps["Dark2"](i) for i in range(8)]
    colors = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    handles: dict[str, Line2D] = {}
    any_nonfinite = False
    modes: set[bool] = set()
    tol = _tolerance(rd, "max_rel_err")
    for ax, g, lines in zip(axes, groups, per_group):
        base = g.baseline_of.get(g.runs[0].index) if g.runs else None
        steps = base.steps if base else 0
        ceiling = max([1.0, tol * 3 if tol else 0.0] +
                      [float(ln.errors[np.isfinite(ln.errors)].max(initial=0.0)) * 3 for ln in lines])
        for ln in lines:
            e, finite = ln.errors, np.isfinite(ln.errors)
            eager = ln.run.mode == "eager"
            modes.add(eager)
            x = np.arange(e.size)
            (h,) = ax.plot(x, np.where(finite, np.maximum(e, FLOOR), np.nan), "-" if eager else "--",
                           color=colors[ln.name], lw=1.4, marker="o" if e.size <= 80 else None,
                           ms=3, label=ln.name)
            handles.setdefault(ln.name, h)
            if not finite.all():
                any_nonfinite = True
                ax.plot(x[~finite], np.full((~finite).sum(), ceiling), "x", color=colors[ln.name],
                        ms=7, mew=2)
        ax.set_yscale("log")
        ax.set_ylim(FLOOR / 10, ceiling)
        ax.axhline(FLOOR, color="0.55", ls=":", lw=1)
        if tol:
            ax.axhline(tol, color="#c0392b", ls="-.", lw=1)
        ax.set_xlim(-0.5, max(steps, 1) - 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, which="major", axis="both", color="0.9", lw=0.6)
        ax.set_xlabel("decode step")
        ax.set_ylabel("max rel. logit error\n(0 and < 1e-12 drawn at 1e-12)", fontsize=9)
        ws, wcap = _window_caption(g, steps, base)
        if ws is not None:
            ax.axvline(ws, color="k", ls="--", lw=1.2)
            ax.text(ws, 0.98, " window full", rotation=90, va="top", ha="left", fontsize=9,
                    transform=ax.get_xaxis_transform(),
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
        ax.set_title(f"{g.title}: {g.baseline_note}\n{wcap}", fontsize=9, loc="left")
        if not lines:
            ax.text(0.5, 0.5, "no run to compare with the baseline", ha="center", va="center",
                    transform=ax.transAxes, fontsize=11, color="0.4")
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    if not groups:
        axes[0].set_visible(True)
        axes[0].text(0.5, 0.5, f"no runs in {rd.path}", ha="center", va="center",
                     transform=axes[0].transAxes, fontsize=12)
    extra = [Line2D([], [], color="0.55", ls=":", label="floor 1e-12: exact 0 (bitwise equal)"),
             Line2D([], [], color="k", ls="--", label="window full (prompt_len + step ≥ W)")]
    if tol:
        extra.append(Line2D([], [], color="#c0392b", ls="-.",
                            label=f"gate tolerance max_rel_err = {tol:g}"))
    if True in modes:
        extra.append(Line2D([], [], color="0.3", ls="-", label="eager run (solid)"))
    if False in modes:
        extra.append(Line2D([], [], color="0.3", ls="--", label="compiled run (dashed)"))
    if any_nonfinite:
        extra.append(Line2D([], [], color="0.3", ls="", marker="x", mew=2,
                            label="non-finite logits (drawn at the top)"))
    legend = [handles[nm] for nm in shown_names if nm in handles]
    if len(names) > len(shown_names):
        legend.append(Line2D([], [], ls="", label=f"… {len(names) - len(shown_names)} more runs"))
    fig.legend(handles=legend + extra, loc="upper left",
               bbox_to_anchor=(right + 0.2 / width, 1 - top_in / height), fontsize=8,
               frameon=False, title="run (variant/backend/mode/repeat)", title_fontsize=8,
               alignment="left")
    _footnote(fig, foot, 0.1, height)
    return _save(fig, out_dir, FIGURES[0])


def _map_figure(rd: _Reader, groups: list[Group], cmp: dict[int, Comparison], out_dir: str) -> str:
    shown = [g for g in groups if g.runs]
    foot = _skipped_lines(groups, 200)
    rows = sum(len(g.runs) for g in shown)
    per_group_in, row_in = 1.1, 0.24
    bottom_in, top_in = 0.6 + 0.16 * len(foot), 1.3
    height = top_in + bottom_in + per_group_in * len(shown) + row_in * rows
    if height > MAX_HEIGHT_IN:
        row_in = max(0.005, (MAX_HEIGHT_IN - top_in - bottom_in - per_group_in * len(shown)) / max(rows, 1))
        height = top_in + bottom_in + per_group_in * len(shown) + row_in * rows
    max_steps = max((g.baseline_of[g.runs[0].index].steps for g in shown), default=1)
    labels = {g.title: _map_labels(g, cmp) for g in shown}
    label_in = (_label_inches([t for ls in labels.values() for t in ls], 8) if row_in >= 0.11
                else 0.8)  # rows too thin to label: the axis says how many runs instead
    width = min(40.0, max(14.0, label_in + 0.6 + max(8.0, 0.22 * max_steps)))
    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.suptitle(f"Divergence map against each group's baseline — {rd.path}", fontsize=11,
                 y=1 - 0.25 / height)
    cmap = ListedColormap(list(MAP_COLORS))
    norm = BoundaryNorm([-1.5, -0.5, 0.5, 1.5, 2.5], cmap.N)
    fig.legend(handles=[Patch(facecolor=c, edgecolor="0.5", label=t) for c, t in
                        zip(MAP_COLORS, MAP_LABELS)] +
               [Line2D([], [], color="k", ls="--", label="window full (prompt_len + step ≥ W)")],
               loc="upper center", ncol=5, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.6 / height))
    if shown:
        gs = fig.add_gridspec(len(shown), 1, left=(label_in + 0.1) / width, right=1 - 0.4 / width, top=1 - top_in / height,
                              bottom=bottom_in / height,
                              height_ratios=[len(g.runs) * row_in + 0.01 for g in shown],
                              hspace=per_group_in / max(row_in * rows / len(shown), 0.01))
    for k, g in enumerate(shown):
        ax = fig.add_subplot(gs[k])
        base = g.baseline_of[g.runs[0].index]
        steps = base.steps
        mat = np.full((len(g.runs), steps), NO_DATA, np.int8)
        for i, r in enumerate(g.runs):
            c = cmp.get(r.index)
            if c is not None:
                n = min(steps, c.codes.size)
                mat[i, :n] = c.codes[:n]
        ax.imshow(mat, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest",
                  extent=(-0.5, steps - 0.5, len(g.runs) - 0.5, -0.5))
        if row_in >= 0.11:
            ax.set_yticks(range(len(g.runs)), labels[g.title], fontsize=8 if row_in >= 0.17 else 6,
                          family="monospace")
        else:
            ax.set_yticks([])
            ax.set_ylabel(f"{len(g.runs)} runs", fontsize=8)
        if len(g.runs) * steps <= 6000:  # cell borders, where cells are big enough to see
            ax.set_xticks(np.arange(-0.5, steps), minor=True)
            ax.set_yticks(np.arange(-0.5, len(g.runs)), minor=True)
            ax.grid(True, which="minor", color="white", lw=0.8)
            ax.tick_params(which="minor", length=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(steps, 25) or 1))
        ax.set_xlabel("decode step", fontsize=9)
        ws, wcap = _window_caption(g, steps, base)
        if ws is not None:
            ax.axvline(ws - 0.5, color="k", ls="--", lw=1.5)
            ax.text(ws - 0.5, 0.98, " window full", rotation=90, ha="left", va="top", fontsize=8,
                    transform=ax.get_xaxis_transform(),
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
        ax.set_title(f"{g.title}: {g.baseline_note}\n{wcap}", fontsize=9, loc="left")
    if not shown:
        ax = fig.add_subplot(1, 1, 1)
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"no recorded (not skipped) runs in {rd.path}", ha="center",
                va="center", fontsize=12, transform=ax.transAxes)
    _footnote(fig, foot, 0.1, height)
    return _save(fig, out_dir, FIGURES[1])


def _map_labels(g: Group, cmp: dict[int, Comparison]) -> list[str]:
    out = []
    for r in g.runs:
        lab = r.label
        if g.baseline_of[r.index].index == r.index:
            lab += "  (baseline)"
        elif cmp.get(r.index) is not None and cmp[r.index].topk_only:
            lab += "  [top-k]"
        out.append(lab)
    return out


def _graphs_figure(rd: _Reader, groups: list[Group], out_dir: str) -> str:
    compiled = [r for g in groups for r in g.runs if r.mode != "eager"]
    skipped = [r for g in groups for r in g.skipped if r.mode != "eager"]
    foot = _skipped_lines([Group("", "", skipped=skipped)], 150)
    several = len({(r.model, r.scenario) for r in compiled}) > 1
    labels = [(f"{r.model}/{r.scenario} " if several else "") + r.label for r in compiled]
    bottom_in, top_in, row_in = 0.7 + 0.16 * len(foot), 1.1, 0.5
    height = top_in + bottom_in + row_in * max(len(compiled), 3)
    if height > MAX_HEIGHT_IN:
        row_in = (MAX_HEIGHT_IN - top_in - bottom_in) / len(compiled)
        height = MAX_HEIGHT_IN
    small = row_in >= 0.2
    label_in = _label_inches(labels, 8 if small else 5)
    width = max(12.0, label_in + 8.0)
    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.suptitle("Decode graphs captured per compiled run, dynamo recompiles beside them, "
                 f"and the cache layer's graph budget — {rd.path}", fontsize=11, y=1 - 0.2 / height)
    ax = fig.add_axes(((label_in + 0.1) / width, bottom_in / height,
                       1 - (label_in + 0.5) / width, 1 - (top_in + bottom_in) / height))
    if not compiled:
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"no compiled runs in {rd.path}", ha="center", va="center",
                fontsize=13, transform=ax.transAxes)
        _footnote(fig, foot, 0.1, height)
        return _save(fig, out_dir, FIGURES[2])
    y = np.arange(len(compiled))
    graphs = np.array([r.graphs_captured for r in compiled])
    over = np.array([r.graph_budget is not None and r.graphs_captured > r.graph_budget
                     for r in compiled])
    ax.barh(y - 0.2, graphs, height=0.38, color=np.where(over, "#c0392b", "#2e86c1"))
    rec = np.array([r.recompiles if r.recompiles is not None else 0 for r in compiled])
    ax.barh(y + 0.2, rec, height=0.38, color="#f0a830")
    top = max(1, int(graphs.max()), int(rec.max()),
              max((r.graph_budget or 0) for r in compiled))
    for i, r in enumerate(compiled):
        if small:
            budget = f" (budget {r.graph_budget})" if r.graph_budget is not None else " (no budget)"
            ax.text(r.graphs_captured + top * 0.01, i - 0.2, f"{r.graphs_captured} graphs{budget}",
                    va="center", fontsize=8)
            ax.text((r.recompiles or 0) + top * 0.01, i + 0.2,
                    f"{r.recompiles} recompiles" if r.recompiles is not None else "recompiles unknown",
                    va="center", fontsize=8, color="0.2" if r.recompiles is not None else "0.5")
        if r.graph_budget is not None:
            ax.plot([r.graph_budget, r.graph_budget], [i - 0.46, i + 0.46], color="k", lw=2.5)
    ax.set_yticks(y, labels, fontsize=8 if small else 5, family="monospace")
    ax.set_ylim(len(compiled) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.35 + 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, axis="x", color="0.9")
    ax.set_axisbelow(True)
    ax.set_xlabel("count")
    fig.legend(handles=[Patch(color="#2e86c1", label="graphs_captured (decode graphs), within budget"),
                        Patch(color="#c0392b", label="graphs_captured above the graph budget"),
                        Patch(color="#f0a830", label="recompiles (dynamo; -1/absent: unknown)"),
                        Line2D([], [], color="k", lw=2.5, label="graph_budget of the cache layer")],
               loc="upper center", bbox_to_anchor=(0.5, 1 - 0.55 / height), ncol=4, fontsize=8,
               frameon=False)
    _footnote(fig, foot, 0.1, height)
    return _save(fig, out_dir, FIGURES[2])


def _out_dir(out_dir: str) -> None:
    check_out_dir(out_dir, FIGURES, "--out")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{out_dir}: cannot create: not a directory") from None
    except OSError as e:
        raise InputError(f"{out_dir}: cannot create: {e.strerror or e}") from None
    for name in FIGURES:
        check_writable(os.path.join(out_dir, name), "--out")


def plot_report(report_path: str, out_dir: str, window: int | None = None) -> list[str]:
    """Writes error_vs_reference.png, divergence_map.png and
    graphs_per_decode.png for the report into out_dir (created if missing)
    and returns their paths. window is the sliding window W for reports
    whose runs carry no `window` attribute. Bad input raises InputError
    naming the file and field."""
    if window is not None and not 1 <= window <= MAX_WINDOW:
        raise InputError(f"--window: expected 1 <= W <= {MAX_WINDOW}, found {window}")
    rd = _Reader(report_path)
    try:
        rd.check_root()      # a bad report is refused before out_dir is created
        _out_dir(out_dir)
        for name in FIGURES:   # a figure written over the report it draws
            if same_file(report_path, os.path.join(out_dir, name)):
                raise InputError(f"{os.path.join(out_dir, name)}: is the report being plotted "
                                 f"({report_path}): choose another --out")
        groups, cmp = _load(rd, window)
        return [_error_figure(rd, groups, cmp, out_dir), _map_figure(rd, groups, cmp, out_dir),
                _graphs_figure(rd, groups, out_dir)]
    except (KeyError, OSError) as e:  # h5py's errors on a damaged file
        raise InputError(f"{report_path}: cannot read: {e}") from None
    finally:
        rd.close()


def load_comparisons(report_path: str, window: int | None = None
                     ) -> tuple[list[Group], dict[int, Comparison]]:
    """What the figures show, without drawing them: the (model, scenario)
    groups with each run's baseline, and every recorded run's comparison
    with its baseline, by run index."""
    rd = _Reader(report_path)
    try:
        return _load(rd, window)
    except (KeyError, OSError) as e:
        raise InputError(f"{report_path}: cannot read: {e}") from None
    finally:
        rd.close()


def _load(rd: _Reader, window: int | None) -> tuple[list[Group], dict[int, Comparison]]:
    if window is not None and not 1 <= window <= MAX_WINDOW:
        raise InputError(f"--window: expected 1 <= W <= {MAX_WINDOW}, found {window}")
    rd.check_root()
    groups = _groups(rd.runs(), window)
    cmp: dict[int, Comparison] = {}
    for g in groups:
        for r in g.runs:
            cmp[r.index] = _compare(rd, g.baseline_of[r.index], r)
    return groups, cmp
