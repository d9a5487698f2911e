"""PNG figures of a kvrepro report (docs/SCHEMA.md, version 1), for review.

`plot_report` reads any schema-1 file (a C gate report, a `gate --external`
report, or a `kvrepro-hf capture`) and writes four figures:

  summary.png             one page: the verdict and run counts, the model x
                          scenario grid, which variant failed by which
                          comparison and where first, the tolerances the gate
                          applied and each model's window W
  error_vs_reference.png  per decode step, the max relative logit error
                          against the baseline: one panel per (model,
                          scenario) unit, failing units first, the unit's
                          applied tolerance drawn
  divergence_map.png      unit (and failing run) x step: bitwise equal /
                          within the unit's tolerance / beyond it / a token
                          differs, against the same baseline
  graphs_per_decode.png   decode graphs captured against the graph budget:
                          per compiled run, or per (variant, backend, mode)
                          when there are many

Every figure is bounded: no side is above MAX_PX pixels whatever the report
holds (the default gate has ~2900 runs in ~95 units). What does not fit is
aggregated (a unit's runs into one row, passing runs into one envelope
line, compiled runs by variant) or left out with a line saying how many and
where to look (`kvrepro-hf report --html` lists every failure).

The baseline of a run is a `reference` run of the same model and scenario
when the report has one (the C gate's reference comparison); a capture has
none, so its first eager run stands in, and the figures say which run that
is. The calibration members (variants `reference~ORDER`, DESIGN §6) are the
reference under other valid reduction orders: they differ from it by design,
are drawn as the unit's spread and never in a failure colour. The tolerance
of a unit is the one the gate applied (`max_rel_err@MODEL/SCENARIO` in
/tolerances, the golden's 1e-5, or the gate-wide `max_rel_err` where that is
the one in use), and W is the run's `window` attribute, else what the
report's boundary-sweep units say (DESIGN §5: `prompt_w` has a prompt of
exactly W tokens), else `--window`.

The comparisons are pure functions of arrays (`rel_error_series`,
`kept_rel_error_series`, `rows_bitwise_equal`, `divergence_codes`,
`graded_codes`, `divergence_matrix`, `window_step`, `window_from_sweep`) so
they can be checked without a figure; `load_comparisons` gives what the
figures show for a report file and `load_report` everything (failures,
tolerances, counts) `kvrepro-hf report --html` prints.

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

import io
import math
import os
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

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
# No figure is wider or taller than this (pixels at DPI): a reviewer opens it
# in a browser tab or a CI artifact viewer without scrolling a 60k-pixel
# strip, and matplotlib's own limit (2^16 a side) is never near.
MAX_PX = 2000
MAX_IN = MAX_PX / DPI
# What one figure shows at most before it aggregates or leaves out (said in
# the figure): panels of the error figure, rows of the divergence map, bars
# of the graphs figure, lines of a panel drawn one per run.
MAX_PANELS = 12
MAX_MAP_ROWS = 110
MAX_BAR_ROWS = 40
MAX_RUN_LINES = 8
# A report with at most this many comparable runs gets one map row per run
# (a capture, a small gate); above it, one row per unit plus its failing runs.
PER_RUN_MAP_MAX = 40
# Divergence map codes (and -1 where a run has no such step). Within / beyond
# tolerance compare the step's max relative error with the unit's applied
# tolerance; without a known tolerance every differing step is code 1.
NO_DATA, EQUAL, LOGITS_DIFFER, TOKEN_DIFFERS = -1, 0, 1, 2     # divergence_codes
G_EQUAL, G_WITHIN, G_BEYOND, G_TOKEN = 0, 1, 2, 3              # graded_codes
MAP_COLORS = ("#ffffff", "#cfe3cf", "#9cc3e4", "#f0a830", "#c0392b")
MAP_LABELS = ("no data (step not recorded / not comparable)",
              "bitwise-equal logits in every batch row",
              "logits differ within the unit's tolerance, tokens equal",
              "logits beyond the unit's tolerance, tokens equal",
              "some token differs (the gate accepts a flip at a near-tie)")
FAIL_COLOR, PASS_COLOR, SKIP_COLOR, MEMBER_COLOR = "#c0392b", "#2e8b57", "#b0b0b0", "0.45"
FIGURES = ("summary.png", "error_vs_reference.png", "divergence_map.png", "graphs_per_decode.png")
# docs/SCHEMA.md `/comparisons` kind, as reports/junit.c names them.
KIND_NAMES = ("reference", "repeat", "graph_vs_eager", "variant_vs_variant", "replay", "finite",
              "compiled_vs_eager", "graph_budget", "fresh_run", "shifted_vs_fresh", "golden",
              "fp64_shadow", "row_alone")
VERDICT_NAMES = ("PASS", "FAIL", "SKIP")
# The golden comparison's tolerance (harness/golden.h, docs/SCHEMA.md kind 10),
# which a golden unit of the default gate records in no /tolerances row.
GOLDEN_MAX_REL_ERR = 1e-5
# A /tolerances name is a string(64): the C side cuts it to 63 bytes.
NAME_BYTES = 63
# The boundary sweep (DESIGN §5; the goldens' names in fixtures/hf): a unit
# of this name decodes a single prompt of W + offset tokens.
SWEEP_OFFSETS = {"prompt_w": 0, "prompt_w_minus_1": -1, "prompt_w_plus_1": 1,
                 "w": 0, "w_minus_1": -1, "w_plus_1": 1}


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


def graded_codes(codes: np.ndarray, errors: np.ndarray | None, tolerance: float | None) -> np.ndarray:
    """divergence_codes (S,) graded by the tolerance: G_EQUAL (0) bitwise
    equal, G_WITHIN (1) logits differ by at most tolerance, G_BEYOND (2) by
    more (or non-finite), G_TOKEN (3) a token differs; NO_DATA stays. errors
    (S,) are the step's max relative errors; without errors or a tolerance
    every differing step is G_WITHIN (nothing to hold it to)."""
    c = np.asarray(codes, np.int8)
    out = np.where(c == TOKEN_DIFFERS, G_TOKEN, np.where(c == LOGITS_DIFFER, G_WITHIN, c)).astype(np.int8)
    if errors is not None and tolerance is not None:
        e = np.full(c.shape, 0.0)
        n = min(e.size, np.asarray(errors).size)
        e[:n] = np.asarray(errors, np.float64)[:n]
        with np.errstate(invalid="ignore"):
            beyond = ~(e <= tolerance)           # NaN and inf are beyond
        out = np.where((c == LOGITS_DIFFER) & beyond, G_BEYOND, out).astype(np.int8)
    return out


def window_from_sweep(prompt_lens: dict[str, int]) -> tuple[int | None, str]:
    """W from a model's boundary-sweep units (DESIGN §5): prompt_lens maps a
    scenario name of SWEEP_OFFSETS to the prompt length of its single-row
    reference run. (W, the scenarios it came from) when they agree, (None,
    why) when there are none or they disagree."""
    ws: dict[int, list[str]] = {}
    for scenario, plen in sorted(prompt_lens.items()):
        if scenario in SWEEP_OFFSETS:
            ws.setdefault(plen - SWEEP_OFFSETS[scenario], []).append(scenario)
    if not ws:
        return None, "no boundary-sweep unit (prompt_w, prompt_w_minus_1, prompt_w_plus_1)"
    if len(ws) > 1:
        return None, "its boundary-sweep units disagree: " + ", ".join(
            f"{'/'.join(s)} say W={w}" for w, s in sorted(ws.items()))
    w, scen = next(iter(ws.items()))
    if w < 1:
        return None, f"its boundary-sweep units give W={w}"
    return w, "the prompt length of its " + ", ".join(scen) + " unit" + ("s" if len(scen) > 1 else "")


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
    dtype: str = ""            # another engine's run: fp32, bf16; "" unset
    verdict: int | None = None  # /summary's: 0 PASS, 1 FAIL, 2 SKIP; None unknown

    @property
    def name(self) -> str:
        """variant[+fault]/backend/mode/rN, as kvrepro's listings name a run."""
        v = f"{self.variant}+{self.fault}" if self.fault else self.variant
        return f"{v}/{self.backend}/{self.mode}/r{self.repeat}"

    @property
    def label(self) -> str:
        return f"#{self.index} {self.name}"

    @property
    def full_label(self) -> str:
        """MODEL/SCENARIO/VARIANT[+FAULT]/BACKEND/MODE/rN: what `kvrepro
        bisect --run` takes (harness/gate_verdict.c run_full_label)."""
        return f"{self.model}/{self.scenario}/{self.name}"

    @property
    def member(self) -> bool:
        """A run of the reference in another reduction order (a calibration
        member, DESIGN §6) or teacher-forced (`reference~forced`): it
        differs from the reference by design."""
        return self.variant.startswith("reference~")

    @property
    def failed(self) -> bool:
        return self.verdict == 1


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
    tolerance: float | None = None       # the max_rel_err the gate applied to the unit
    tolerance_note: str = ""
    bf16_tolerance: float | None = None  # bf16 runs' (bf16_max_rel_err@unit), if recorded

    @property
    def title(self) -> str:
        return f"{self.model} / {self.scenario}"

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.runs + self.skipped)

    def tolerance_of(self, run: RunInfo) -> float | None:
        if run.dtype == "bf16" and self.bf16_tolerance is not None:
            return self.bf16_tolerance
        return self.tolerance

    def candidates(self) -> list[RunInfo]:
        """The runs judged against the baseline: not the baseline itself,
        not a calibration member."""
        return [r for r in self.runs if not r.member and self.baseline_of[r.index].index != r.index]


@dataclass
class Comparison:
    """A run against its baseline over the steps both recorded."""

    errors: np.ndarray | None     # (S,) float64, None when not comparable
    codes: np.ndarray             # (S_base,) int8
    topk_only: bool = False
    why_not: str = ""             # why the run could not be compared


@dataclass(frozen=True)
class Failure:
    """A failing row of /comparisons."""

    kind: str                     # KIND_NAMES' name, or "kind N"
    run_a: RunInfo
    run_b: RunInfo
    message: str
    first_step: int               # -1: none
    first_row: int
    probe: str                    # run_b's probe at first_probe, "" when none

    @property
    def unit(self) -> str:
        return f"{self.run_b.model} / {self.run_b.scenario}"

    @property
    def pair(self) -> str:
        """A per-run check (finite, graph_budget) names its one run."""
        if self.run_a.index == self.run_b.index:
            return self.run_b.name
        return f"{self.run_a.name} vs {self.run_b.name}"

    @property
    def where(self) -> str:
        parts = []
        if self.first_step >= 0:
            parts.append(f"step {self.first_step}")
        if self.first_row >= 0:
            parts.append(f"row {self.first_row}")
        if self.probe:
            parts.append(f"probe {self.probe}")
        return " ".join(parts) or "-"

    def bisect_command(self, report_path: str) -> str | None:
        """The gate's `next:` line for this failure (harness/gate_verdict.c
        kv_gate_print_next): only between two runs that both ran."""
        if self.run_a.index == self.run_b.index or self.run_a.skipped or self.run_b.skipped:
            return None
        return (f"kvrepro bisect {report_path} --run {self.run_a.full_label} "
                f"--run {self.run_b.full_label} --rerun")


@dataclass(frozen=True)
class Tolerance:
    name: str
    value: float
    reason: str


@dataclass
class ReportData:
    """What the summary figure and the HTML page show of a report."""

    path: str
    root: dict[str, str]                 # root attributes, as text
    runs: list[RunInfo]
    groups: list[Group]
    cmp: dict[int, Comparison]
    failures: list[Failure]
    tolerances: list[Tolerance]
    n_comparisons: int
    windows: dict[str, tuple[int | None, str]]   # model -> (W, where it came from)

    @property
    def counts(self) -> tuple[int, int, int]:
        """Runs passed, failed, skipped (as the gate's count line; a run
        /summary does not judge counts as passed, a skipped one as skipped)."""
        p = f = s = 0
        for r in self.runs:
            v = r.verdict if r.verdict is not None else (2 if r.skipped else 0)
            p, f, s = p + (v == 0), f + (v == 1), s + (v == 2)
        return p, f, s

    @property
    def verdict(self) -> str:
        if self.failures:
            return "FAIL"
        if self.n_comparisons == 0:
            return "NOT JUDGED"
        return "PASS"


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
        """Every run, in index order, with its /summary verdict."""
        out = []
        for name in self.f["runs"]:
            if not name.isdigit():
                raise self.fail(f"/runs/{name}", "expected a run group named by its index")
            out.append(self._run(int(name), f"runs/{name}"))
        out.sort(key=lambda r: r.index)
        verdicts = self.verdicts({r.index for r in out})
        if verdicts:
            out = [replace(r, verdict=verdicts.get(r.index)) for r in out]
        return out

    def _table(self, name: str, members: tuple[str, ...]) -> np.ndarray | None:
        """A compound table of the root, None when absent; one that lacks a
        member is refused naming it."""
        if name not in self.f:
            return None
        t = self.f[name]
        if not isinstance(t, h5py.Dataset) or t.dtype.names is None or t.ndim != 1:
            raise self.fail(f"/{name}", "expected a one-dimensional compound table")
        for m in members:
            if m not in t.dtype.names:
                raise self.fail(f"/{name}", f"missing table member '{m}'")
        return t[()]

    def verdicts(self, indices: set[int]) -> dict[int, int]:
        """/summary's verdict of each run, {} when there is no /summary."""
        t = self._table("summary", ("index", "verdict"))
        if t is None:
            return {}
        out = {}
        for i, row in enumerate(t):
            idx, v = int(row["index"]), int(row["verdict"])
            if idx not in indices or v not in (0, 1, 2):
                raise self.fail(f"/summary row {i}", f"expected a run index and a verdict 0..2, "
                                f"found index {idx}, verdict {v}")
            out[idx] = v
        return out

    def tolerances(self) -> list[Tolerance]:
        """/tolerances, in report order (a capture's is empty)."""
        t = self._table("tolerances", ("name", "value"))
        if t is None:
            return []
        has_reason = "reason" in (t.dtype.names or ())
        return [Tolerance(_text(row["name"]), float(row["value"]),
                          _text(row["reason"]) if has_reason else "") for row in t]

    def failures(self, runs: list[RunInfo]) -> tuple[list[Failure], int]:
        """The failing rows of /comparisons, in report order, and how many
        rows it has."""
        t = self._table("comparisons", ("kind", "run_a", "run_b", "verdict", "message", "first_step",
                                        "first_row", "first_probe"))
        if t is None:
            return [], 0
        by_index = {r.index: r for r in runs}
        out = []
        for i in (np.flatnonzero(t["verdict"] == 1) if len(t) else []):
            row = t[i]
            a, b = int(row["run_a"]), int(row["run_b"])
            for what, idx in (("run_a", a), ("run_b", b)):
                if idx not in by_index:
                    raise self.fail(f"/comparisons row {i}", f"{what}: expected a run index, found {idx} "
                                    f"({len(runs)} runs)")
            k = int(row["kind"])
            out.append(Failure(KIND_NAMES[k] if 0 <= k < len(KIND_NAMES) else f"kind {k}",
                               by_index[a], by_index[b], _text(row["message"]), int(row["first_step"]),
                               int(row["first_row"]), self.probe_name(by_index[b], int(row["first_probe"]))))
        return out, len(t)

    def probe_name(self, run: RunInfo, probe: int) -> str:
        if probe < 0:
            return ""
        ds = self.f.get(f"{run.group}/probe_names")
        if isinstance(ds, h5py.Dataset) and ds.ndim == 1 and probe < ds.shape[0]:
            return _text(ds[probe])
        return f"#{probe}"

    def root(self) -> dict[str, str]:
        return {k: _text(v) for k, v in self.f.attrs.items()}

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
            recompiles=optional("recompiles"), graph_budget=optional("graph_budget"),
            dtype=text("dtype", ""))

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


def report_windows(runs: list[RunInfo]) -> dict[str, tuple[int | None, str]]:
    """Per model, W from its boundary-sweep units (window_from_sweep): the
    prompt length of the reference runs of prompt_w, prompt_w_minus_1,
    prompt_w_plus_1 (and the goldens' w, w_minus_1, w_plus_1). A model with
    several windows (mistral_mixed) gets its largest, the one the sweep is
    built on."""
    lens: dict[str, dict[str, int]] = {}
    for r in runs:
        if r.variant == "reference" and not r.skipped and r.scenario in SWEEP_OFFSETS:
            lens.setdefault(r.model, {}).setdefault(r.scenario, r.prompt_len)
    return {m: window_from_sweep(v) for m, v in lens.items()}


def _cut(name: str) -> str:
    """A /tolerances name as the C side stores it: cut to NAME_BYTES bytes."""
    return name.encode("utf-8")[:NAME_BYTES].decode("utf-8", "replace")


def unit_tolerance(tolerances: Sequence[Tolerance], model: str, scenario: str,
                   golden: bool) -> tuple[float | None, str]:
    """The max_rel_err the gate applied to the unit's reference comparisons,
    and where it comes from: its `max_rel_err@MODEL/SCENARIO` row (a
    calibrated gate, a --golden gate), else the golden's fixed 1e-5 for a
    golden unit of the default gate, else the gate-wide `max_rel_err` unless
    its reason says it is not used; None when the report has none (a
    capture: nothing judged it yet)."""
    rows = {t.name: t for t in tolerances}
    t = rows.get(_cut(f"max_rel_err@{model}/{scenario}"))
    if t is not None:
        how = t.reason.split(":")[0] if t.reason else "recorded"
        return t.value, f"max_rel_err@unit {t.value:.3g} ({how})"
    if golden:
        return GOLDEN_MAX_REL_ERR, f"golden max_rel_err {GOLDEN_MAX_REL_ERR:g} (harness/golden.h)"
    t = rows.get("max_rel_err")
    if t is not None and not t.reason.startswith("not used"):
        return t.value, f"max_rel_err {t.value:.3g} (gate-wide)"
    if t is not None:
        return None, "no per-unit max_rel_err recorded (bitwise comparisons only)"
    return None, "no tolerance in the report (not judged by a gate)"


def _groups(runs: list[RunInfo], cli_window: int | None,
            tolerances: Sequence[Tolerance] = ()) -> list[Group]:
    groups: dict[tuple[str, str], Group] = {}
    for r in runs:
        g = groups.setdefault((r.model, r.scenario), Group(r.model, r.scenario))
        (g.skipped if r.skipped else g.runs).append(r)
    sweep = report_windows(runs)
    rows = {t.name: t for t in tolerances}
    for g in groups.values():
        _choose_baselines(g)
        base = g.baseline_of.get(g.runs[0].index) if g.runs else None
        windows = [r.window for r in ([base] if base else []) + g.runs + g.skipped if r.window]
        w_sweep, why = sweep.get(g.model, (None, "no boundary-sweep unit"))
        if windows:
            g.window, g.window_note = windows[0], f"W={windows[0]} (run attribute 'window')"
        elif w_sweep is not None:
            g.window, g.window_note = w_sweep, f"W={w_sweep} ({why})"
        elif cli_window:
            g.window, g.window_note = cli_window, f"W={cli_window} (from --window)"
        else:
            g.window_note = f"window unknown (no 'window' attribute, {why}; pass --window W)"
        golden = any(r.variant == "transformers" for r in g.runs + g.skipped)
        g.tolerance, g.tolerance_note = unit_tolerance(tolerances, g.model, g.scenario, golden)
        bf16 = rows.get(_cut(f"bf16_max_rel_err@{g.model}/{g.scenario}"))
        g.bf16_tolerance = bf16.value if bf16 is not None else None
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


def _skipped_lines(groups: list[Group], width: int, max_reasons: int = 6) -> list[str]:
    """The footnote: skipped runs by reason, so ten runs refused for one
    reason take one line; at most max_reasons reasons."""
    by_reason: dict[str, list[int]] = {}
    for g in groups:
        for r in g.skipped:
            by_reason.setdefault(r.skip_reason or "(no reason recorded)", []).append(r.index)
    if not by_reason:
        return []
    lines = ["Skipped runs, left out:"]
    for reason, idx in list(by_reason.items())[:max_reasons]:
        short = reason if len(reason) <= 110 else reason[:109] + "…"
        lines += textwrap.wrap(f"{_ranges(sorted(idx))}: {short}", width,
                               initial_indent="  ", subsequent_indent="      ")[:2]
    if len(by_reason) > max_reasons:
        lines.append(f"  … {len(by_reason) - max_reasons} more reasons")
    return lines


def _fit(width_in: float, height_in: float) -> tuple[float, float]:
    """A figure's size within MAX_PX a side at DPI (layouts are computed
    from the fitted size, so nothing is cut)."""
    return min(width_in, MAX_IN), min(height_in, MAX_IN)


def _png(fig: Figure) -> bytes:
    """The figure as PNG bytes: rendered in memory, so a renderer that fails
    leaves no file at all, and the PNG carries no Software tag."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _footnote(fig: Figure, lines: list[str], bottom_in: float, height_in: float) -> None:
    if lines:
        fig.text(0.01, bottom_in / height_in, "\n".join(lines), ha="left", va="bottom",
                 fontsize=8, family="monospace", color="0.25")


def _label_inches(labels: Sequence[str], fontsize: float) -> float:
    """Width of monospace tick labels (DejaVu Sans Mono: 0.6 em a glyph)."""
    return max((len(t) for t in labels), default=0) * fontsize * 0.6 / 72 + 0.25


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _window_caption(g: Group, steps: int, base: RunInfo | None) -> tuple[int | None, str]:
    if g.window is None or base is None:
        return None, g.window_note
    ws = window_step(base.prompt_len, g.window)
    assert ws is not None
    if ws >= steps:
        return None, f"{g.window_note}: not full within {steps} steps (prompt_len {base.prompt_len})"
    return ws, f"{g.window_note}, prompt_len {base.prompt_len}: full from step {ws}"


def _unit_order(groups: list[Group]) -> list[Group]:
    """Units with recorded runs, failing ones first, each part in report order."""
    shown = [g for g in groups if g.runs]
    return [g for g in shown if g.failed] + [g for g in shown if not g.failed]


def _errors(cmp: dict[int, Comparison], r: RunInfo) -> np.ndarray | None:
    c = cmp.get(r.index)
    return None if c is None else c.errors


# ---------------------------------------------------------------- summary

def _grid_counts(data: ReportData) -> dict[tuple[str, str], list[int]]:
    cells: dict[tuple[str, str], list[int]] = {}
    for r in data.runs:
        v = r.verdict if r.verdict is not None else (2 if r.skipped else 0)
        cells.setdefault((r.model, r.scenario), [0, 0, 0])[v] += 1
    return cells


def _keep(names: list[str], failing: set[str], limit: int) -> tuple[list[str], int]:
    """At most limit names, failing ones first, in their order; and how many
    were left out."""
    if len(names) <= limit:
        return names, 0
    keep = set([n for n in names if n in failing][:limit])
    keep |= set([n for n in names if n not in keep][:limit - len(keep)])
    return [n for n in names if n in keep], len(names) - len(keep)


def tolerance_lines(data: ReportData) -> list[str]:
    """The tolerances the gate applied, in a few lines: the per-unit
    max_rel_err by where it came from (its range over units), and the
    gate-wide rows."""
    by_how: dict[str, list[float]] = {}
    none = 0
    for g in data.groups:
        if g.tolerance is None:
            none += 1
            continue
        how = g.tolerance_note.split("(", 1)[1].rstrip(")") if "(" in g.tolerance_note else g.tolerance_note
        by_how.setdefault(how, []).append(g.tolerance)
    out = []
    for how, vals in by_how.items():
        lo, hi = min(vals), max(vals)
        span = f"{lo:.3g}" if lo == hi else f"{lo:.3g} … {hi:.3g}"
        out.append(f"max_rel_err {span} over {len(vals)} unit{'s' if len(vals) != 1 else ''} ({how})")
    if none:
        out.append(f"{none} unit{'s' if none != 1 else ''} without a max_rel_err (bitwise comparisons only, "
                   "or not judged)")
    for t in data.tolerances:
        if "@" not in t.name:
            out.append(f"{t.name} = {t.value:g}" + (f"  ({_short(t.reason, 90)})" if t.reason else ""))
    bf16 = [t.value for t in data.tolerances if t.name.startswith("bf16_max_rel_err@")]
    if bf16:
        out.append(f"bf16_max_rel_err {min(bf16):.3g} … {max(bf16):.3g} over {len(bf16)} bf16 batches")
    return out


def window_lines(data: ReportData) -> list[str]:
    """Each model's W and where it came from, models of one W on one line."""
    by: dict[str, list[str]] = {}
    for model, (w, how) in data.windows.items():
        key = f"W={w} ({how.split('(', 1)[1].rstrip(')')})" if w is not None and "(" in how else \
            (f"W={w}" if w is not None else how)
        by.setdefault(key, []).append(model)
    return [f"{', '.join(ms)}: {key}" for key, ms in by.items()]


def _summary_figure(data: ReportData) -> Figure:
    p, f, s = data.counts
    cells = _grid_counts(data)
    failing_models = {fl.run_b.model for fl in data.failures} | {r.model for r in data.runs if r.failed}
    failing_scen = {fl.run_b.scenario for fl in data.failures} | {r.scenario for r in data.runs if r.failed}
    models, models_out = _keep(list(dict.fromkeys(r.model for r in data.runs)), failing_models, 28)
    scens, scens_out = _keep(list(dict.fromkeys(r.scenario for r in data.runs)), failing_scen, 30)
    # failures by variant[+fault] of run_b, and comparison kind
    by_var: dict[str, dict[str, list[int]]] = {}
    for fl in data.failures:
        v = fl.run_b.name.rsplit("/", 3)[0]
        by_var.setdefault(v, {}).setdefault(fl.kind, []).append(fl.first_step)
    variants = sorted(by_var, key=lambda v: (-sum(len(x) for x in by_var[v].values()), v))
    variants_out = max(0, len(variants) - 24)
    variants = variants[:24]
    kinds = [k for k in KIND_NAMES if any(k in by_var[v] for v in variants)] + \
        sorted({k for v in variants for k in by_var[v]} - set(KIND_NAMES))
    # the text at the bottom
    first = sorted(data.failures, key=lambda fl: (fl.first_step < 0, fl.first_step, fl.run_b.index))[:8]
    text = [f"First failures ({len(data.failures)} failing comparisons; earliest step first):"]
    text += [_short(f"  {fl.unit}: {fl.pair} {fl.kind} at {fl.where}: {fl.message}", 190) for fl in first]
    if not data.failures:
        text = ["No failing comparison." if data.n_comparisons else
                "No comparisons in this report: a capture, judged by `kvrepro gate --external`."]
    text += ["Tolerances applied:"] + ["  " + _short(t, 190) for t in tolerance_lines(data)[:6]]
    text += ["Sliding window:"] + ["  " + _short(t, 190) for t in window_lines(data)[:4]]
    skips = _skipped_lines(data.groups, 180, 3)
    text += skips
    rows_in = max(len(models) * 0.3, len(variants) * 0.3, 1.5)
    mid_in = rows_in + 2.0                      # the grid's cells and its rotated scenario names
    top_in, text_in = 1.0, 0.14 * len(text) + 0.3
    width, height = _fit(16.0, top_in + mid_in + text_in)
    fig = Figure(figsize=(width, height), dpi=DPI)
    color = {"FAIL": FAIL_COLOR, "PASS": PASS_COLOR}.get(data.verdict, "0.3")
    fig.text(0.01, 1 - 0.35 / height, f"{data.verdict}", color=color, fontsize=18, weight="bold",
             va="center")
    fig.text(0.12, 1 - 0.3 / height, f"{p} passed, {f} failed, {s} skipped (runs) — {data.path}",
             fontsize=12, va="center")
    root = data.root
    fig.text(0.12, 1 - 0.62 / height, _short(
        f"kvrepro {root.get('tool_version', '?')}, commit {root.get('git_commit', '?')}, "
        f"shard {root.get('shard', '?')}, device: {root.get('device', '?')}", 170), fontsize=8, color="0.3",
        va="center")
    # the model x scenario grid
    label_in = _label_inches(models, 8)
    grid_w = min(7.8, 0.3 * max(len(scens), 1))
    ax = fig.add_axes((label_in / width, (text_in + 1.8) / height, grid_w / width, rows_in / height))
    codes = np.zeros((len(models), len(scens)), np.int8)
    for i, m in enumerate(models):
        for j, sc in enumerate(scens):
            c = cells.get((m, sc))
            codes[i, j] = 0 if c is None else 3 if c[1] else 2 if c[0] else 1
    ax.imshow(codes, cmap=ListedColormap(["#ffffff", SKIP_COLOR, "#bfe3c6", "#f1948a"]),
              norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5, 3.5], 4), aspect="auto", interpolation="nearest")
    fs = 6 if len(scens) <= 16 else 4.5
    for i, m in enumerate(models):
        for j, sc in enumerate(scens):
            c = cells.get((m, sc))
            if c is not None:
                ax.text(j, i, f"{c[0]}/{c[1]}/{c[2]}", ha="center", va="center", fontsize=fs)
    ax.set_yticks(range(len(models)), models, fontsize=8, family="monospace")
    ax.set_xticks(range(len(scens)), [_short(x, 28) for x in scens], fontsize=7, rotation=40,
                  ha="right", rotation_mode="anchor")
    ax.set_xticks(np.arange(-0.5, len(scens)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(models)), minor=True)
    ax.grid(True, which="minor", color="white", lw=1.0)
    ax.tick_params(which="minor", length=0)
    more = (f"; {models_out} models" if models_out else "") + (f"; {scens_out} scenarios" if scens_out else "")
    ax.set_title("runs passed/failed/skipped per model and scenario" +
                 (f" (not shown{more}: all passing)" if more else ""), fontsize=9, loc="left")
    # failures by variant and comparison
    left2 = label_in + grid_w + 0.4
    var_in = _label_inches(variants, 7.5)
    ax2 = fig.add_axes(((left2 + var_in) / width, (text_in + 1.8) / height,
                        max(1.0, min(0.9 * max(len(kinds), 1), width - left2 - var_in - 0.3)) / width,
                        rows_in / height))
    if variants:
        mat = np.array([[len(by_var[v].get(k, [])) for k in kinds] for v in variants], float)
        ax2.imshow(np.where(mat > 0, 1, 0), cmap=ListedColormap(["#ffffff", "#f5b7b1"]), aspect="auto",
                   interpolation="nearest", vmin=0, vmax=1)
        for i, v in enumerate(variants):
            for j, k in enumerate(kinds):
                steps = [x for x in by_var[v].get(k, []) if x >= 0]
                if by_var[v].get(k):
                    ax2.text(j, i, f"{len(by_var[v][k])}" + (f"\nstep {min(steps)}" if steps else ""),
                             ha="center", va="center", fontsize=6.5 if len(variants) <= 14 else 5)
        ax2.set_yticks(range(len(variants)), variants, fontsize=7.5, family="monospace")
        ax2.set_xticks(range(len(kinds)), kinds, fontsize=7, rotation=40, ha="right", rotation_mode="anchor")
        ax2.set_xticks(np.arange(-0.5, len(kinds)), minor=True)
        ax2.set_yticks(np.arange(-0.5, len(variants)), minor=True)
        ax2.grid(True, which="minor", color="0.85", lw=0.8)
        ax2.tick_params(which="minor", length=0)
        ax2.set_title("failing comparisons by variant[+fault] and comparison: how many, first step"
                      + (f" ({variants_out} more variants)" if variants_out else ""), fontsize=9, loc="left")
    else:
        ax2.set_axis_off()
        ax2.text(0.0, 0.5, "no failing comparison", fontsize=12, color=PASS_COLOR if data.n_comparisons else "0.4",
                 transform=ax2.transAxes)
    fig.text(0.01, 0.15 / height, "\n".join(text), ha="left", va="bottom", fontsize=8, family="monospace",
             color="0.15")
    return fig


# ---------------------------------------------------------------- error per step

@dataclass
class _Line:
    label: str
    errors: np.ndarray
    kind: str            # "run", "fail", "envelope", "fail_envelope", "member"
    eager: bool = True


def _envelope(series: list[np.ndarray]) -> np.ndarray:
    n = max(e.size for e in series)
    out = np.full(n, 0.0)
    for e in series:
        with np.errstate(invalid="ignore"):
            out[:e.size] = np.fmax(out[:e.size], np.where(np.isnan(e), np.inf, e))
    return out


def _panel_lines(g: Group, cmp: dict[int, Comparison], single: bool) -> list[_Line]:
    """A unit's lines: every candidate run when they are few, else each
    failing run (identical series once) and one envelope of the passing
    ones; the calibration members as one grey envelope, never as a
    candidate."""
    cands = [r for r in g.candidates() if _errors(cmp, r) is not None]
    members = [r for r in g.runs if r.member and _errors(cmp, r) is not None
               and g.baseline_of[r.index].index != r.index]
    out: list[_Line] = []

    def name(r: RunInfo) -> str:
        return (r.label if single else r.name) + (" [top-k ids only]" if cmp[r.index].topk_only else "")

    if len(cands) <= MAX_RUN_LINES:
        seen: dict[bytes, int] = {}
        for r in cands:
            e = _errors(cmp, r)
            assert e is not None
            label = ("FAIL " if r.failed else "") + name(r)
            same = seen.setdefault(e.tobytes(), r.index)
            if not (e > 0).any():
                label += " (= baseline: at floor)"
            elif same != r.index:
                label += f" (same errors as #{same})"
            out.append(_Line(label, e, "fail" if r.failed else "run", r.mode == "eager"))
    else:
        failing = [r for r in cands if r.failed]
        passing = [r for r in cands if not r.failed]
        distinct: dict[bytes, list[RunInfo]] = {}
        for r in failing:
            e = _errors(cmp, r)
            assert e is not None
            distinct.setdefault(e.tobytes(), []).append(r)
        shown = list(distinct.values())[:MAX_RUN_LINES - 2]
        for rs in shown:
            e = _errors(cmp, rs[0])
            assert e is not None
            out.append(_Line(f"FAIL {name(rs[0])}" + (f" (+{len(rs) - 1} same)" if len(rs) > 1 else ""), e,
                             "fail", rs[0].mode == "eager"))
        rest = [r for rs in list(distinct.values())[MAX_RUN_LINES - 2:] for r in rs]
        if rest:
            out.append(_Line(f"max of {len(rest)} more failing runs", _envelope(
                [e for r in rest if (e := _errors(cmp, r)) is not None]), "fail_envelope"))
        if passing:
            out.append(_Line(f"max of {len(passing)} runs with no failing comparison", _envelope(
                [e for r in passing if (e := _errors(cmp, r)) is not None]), "envelope"))
    if members:
        out.append(_Line(f"reference~ runs (other reduction orders{', forced' if any('forced' in r.variant for r in members) else ''}): "
                         f"max of {len(members)}, by design",
                         _envelope([e for r in members if (e := _errors(cmp, r)) is not None]), "member"))
    return out


def _error_figure(data: ReportData) -> Figure:
    order = _unit_order(data.groups)
    panels, left_out = order[:MAX_PANELS], order[MAX_PANELS:]
    single = len(data.groups) == 1
    n = max(1, len(panels))
    ncols = 1 if n == 1 else 2 if n <= 4 else 3
    nrows = math.ceil(n / ncols)
    plot_in = {1: 12.0, 2: 8.4, 3: 5.6}[ncols]
    left_in, gap_in = 1.0, 0.9
    per_group = [_panel_lines(g, data.cmp, single) for g in panels]
    legend_rows = max((math.ceil(len(ls) / (1 if ncols == 3 else 2)) for ls in per_group), default=1)
    panel_in, title_in, below_in = 2.5, 0.62, 0.42 + 0.15 * legend_rows
    foot = _skipped_lines(data.groups, 200 if ncols > 1 else 150, 3)
    incomparable = [f"  {r.label}: {data.cmp[r.index].why_not}" for g in data.groups for r in g.runs
                    if r.index in data.cmp and data.cmp[r.index].errors is None]
    if incomparable:
        foot += [f"Not comparable with their baseline, left out ({len(incomparable)}):"] + incomparable[:4]
    if left_out:
        nf = sum(g.failed for g in left_out)
        foot.append(f"{len(left_out)} more units not drawn ({nf} failing, {len(left_out) - nf} passing): "
                    "failing units come first; the divergence map has every unit, `kvrepro-hf report "
                    "--html` every failure")
    top_in, bottom_in = 1.0, 0.2 + 0.15 * len(foot)
    width, height = _fit(left_in + ncols * plot_in + (ncols - 1) * gap_in + 0.4,
                         top_in + bottom_in + nrows * (title_in + panel_in + below_in))
    row_in = (height - top_in - bottom_in) / nrows
    panel_in = row_in - title_in - below_in
    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.suptitle("Max relative logit error per decode step, each run against its unit's baseline: "
                 "max |a − b| / max |baseline| per batch row (as the C gate's max_rel_err), max over rows\n"
                 f"dash-dot: the tolerance the gate applied to the unit; solid: eager, dashed: compiled; "
                 f"0 and < {FLOOR:g} drawn at {FLOOR:g} — {data.path}", fontsize=10, y=1 - 0.1 / height,
                 va="top")
    palette = [matplotlib.colormaps["tab10"](i) for i in range(10)]
    for k, (g, lines) in enumerate(zip(panels, per_group)):
        r_i, c_i = divmod(k, ncols)
        x0 = left_in + c_i * (plot_in + gap_in)
        y0 = height - top_in - r_i * row_in - title_in - panel_in
        ax = fig.add_axes((x0 / width, y0 / height, plot_in / width, panel_in / height))
        base = g.baseline_of.get(g.runs[0].index)
        steps = base.steps if base else 0
        tol = g.tolerance
        finite_max = [float(ln.errors[np.isfinite(ln.errors)].max(initial=0.0)) for ln in lines]
        ceiling = max([1.0, (tol or 0.0) * 3] + [m * 3 for m in finite_max])
        handles = []
        for j, ln in enumerate(lines):
            e, finite = ln.errors, np.isfinite(ln.errors)
            x = np.arange(e.size)
            style = {"run": dict(color=palette[j % 10], lw=1.3),
                     "fail": dict(color=palette[j % 10], lw=2.0),
                     "envelope": dict(color="#2e86c1", lw=1.6),
                     "fail_envelope": dict(color="#922b21", lw=1.6),
                     "member": dict(color=MEMBER_COLOR, lw=1.2)}[ln.kind]
            ls = ":" if ln.kind == "member" else "-" if ln.eager else "--"
            (h,) = ax.plot(x, np.where(finite, np.maximum(e, FLOOR), np.nan), ls=ls,
                           marker="o" if e.size <= 80 and ln.kind in ("run", "fail") else None, ms=2.5,
                           label=_short(ln.label, 70 if ncols == 3 else 95), **style)
            handles.append(h)
            if not finite.all():
                ax.plot(x[~finite], np.full((~finite).sum(), ceiling), "x", color=style["color"], ms=6, mew=2)
        ax.set_yscale("log")
        ax.set_ylim(FLOOR / 10, ceiling)
        ax.axhline(FLOOR, color="0.55", ls=":", lw=1)
        if tol is not None:
            ax.axhline(tol, color=FAIL_COLOR, ls="-.", lw=1.1)
            ax.text(1.0, tol, f" {tol:.3g}", transform=ax.get_yaxis_transform(), fontsize=7,
                    color=FAIL_COLOR, va="bottom", ha="right")
        if g.bf16_tolerance is not None and any(r.dtype == "bf16" for r in g.runs):
            ax.axhline(g.bf16_tolerance, color="#8e44ad", ls="-.", lw=1.1)
            ax.text(1.0, g.bf16_tolerance, f" bf16 {g.bf16_tolerance:.3g}", transform=ax.get_yaxis_transform(),
                    fontsize=7, color="#8e44ad", va="bottom", ha="right")
        ax.set_xlim(-0.5, max(steps, 1) - 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", axis="both", color="0.9", lw=0.6)
        ax.set_xlabel("decode step", fontsize=8, labelpad=1)
        ax.set_ylabel("max rel. logit error", fontsize=8)
        ws, wcap = _window_caption(g, steps, base)
        if ws is not None:
            ax.axvline(ws, color="k", ls="--", lw=1.1)
            ax.text(ws, 0.98, " window full", rotation=90, va="top", ha="left", fontsize=7,
                    transform=ax.get_xaxis_transform(),
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
        nfail = sum(r.failed for r in g.runs + g.skipped)
        head = f"{g.title}: " + (f"FAIL ({nfail} failing runs)" if nfail else
                                 "PASS" if any(r.verdict == 0 for r in g.runs) else "not judged")
        wrap = 70 if ncols == 3 else 110
        ax.set_title(f"{head}\n" + _short(f"{g.baseline_note}; tolerance: {g.tolerance_note}", wrap) + "\n" +
                     _short(wcap, wrap), fontsize=7.5, loc="left",
                     color=FAIL_COLOR if nfail else "0.1")
        if lines:
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.40 / panel_in * 0.9),
                      fontsize=6.5, frameon=False, ncol=1 if ncols == 3 else 2, borderaxespad=0,
                      handlelength=2.2, columnspacing=1.2)
        else:
            ax.text(0.5, 0.5, "no run to compare with the baseline", ha="center", va="center",
                    transform=ax.transAxes, fontsize=10, color="0.4")
    if not panels:
        fig.text(0.5, 0.5, f"no recorded (not skipped) runs in {data.path}", ha="center", va="center",
                 fontsize=12)
    _footnote(fig, foot, 0.1, height)
    return fig


# ---------------------------------------------------------------- divergence map

@dataclass
class _MapRow:
    label: str
    codes: np.ndarray       # graded codes, (steps,)
    window_step: int | None
    first_of_unit: bool
    failed: bool


def _graded(g: Group, cmp: dict[int, Comparison], r: RunInfo) -> np.ndarray | None:
    c = cmp.get(r.index)
    if c is None or c.errors is None:
        return None
    return graded_codes(c.codes, c.errors, g.tolerance_of(r))


def _max_codes(rows: list[np.ndarray], steps: int) -> np.ndarray:
    out = np.full(steps, NO_DATA, np.int8)
    for c in rows:
        n = min(steps, c.size)
        out[:n] = np.maximum(out[:n], c[:n])
    return out


def _unit_rows(g: Group, cmp: dict[int, Comparison], per_run: bool, single: bool) -> list[_MapRow]:
    base = g.baseline_of[g.runs[0].index]
    steps = base.steps
    ws, _ = _window_caption(g, steps, base)
    rows: list[_MapRow] = []
    if per_run:
        for r in g.runs:
            c = _graded(g, cmp, r)
            lab = (r.label if single else f"{g.title}: {r.label}")
            if g.baseline_of[r.index].index == r.index:
                lab += "  (baseline)"
            elif r.member:
                lab += "  (by design)"
            elif cmp.get(r.index) is not None and cmp[r.index].topk_only:
                lab += "  [top-k]"
            rows.append(_MapRow(("FAIL " if r.failed else "") + lab,
                                _max_codes([c] if c is not None else [], steps), ws, not rows, r.failed))
        return rows
    cands = g.candidates()
    codes = [c for r in cands if (c := _graded(g, cmp, r)) is not None]
    nfail = sum(r.failed for r in g.runs)
    rows.append(_MapRow(f"{g.title} ({len(cands)} runs" + (f", {nfail} failing)" if nfail else ")"),
                        _max_codes(codes, steps), ws, True, nfail > 0))
    by: dict[str, list[RunInfo]] = {}
    for r in cands:
        if r.failed:
            by.setdefault(r.name.rsplit("/", 1)[0], []).append(r)
    for k, (key, rs) in enumerate(by.items()):
        if k == 4:
            rows.append(_MapRow(f"    … {len(by) - 4} more failing variant/backend/mode", np.full(steps, NO_DATA,
                                                                                                 np.int8), ws,
                                False, True))
            break
        cs = [c for r in rs if (c := _graded(g, cmp, r)) is not None]
        rows.append(_MapRow(f"    ↳ FAIL {key}" + (f" ×{len(rs)}" if len(rs) > 1 else ""),
                            _max_codes(cs, steps), ws, False, True))
    return rows


def _map_figure(data: ReportData) -> Figure:
    shown = [g for g in data.groups if g.runs]
    n_runs = sum(len(g.runs) for g in shown)
    per_run = n_runs <= PER_RUN_MAP_MAX
    single = len(shown) == 1
    blocks = [(g, _unit_rows(g, data.cmp, per_run, single)) for g in shown]
    # within the row budget: failing units first, then the others, in report order
    keep: set[int] = set()
    used = 0
    for pri in (True, False):
        for k, (g, rows) in enumerate(blocks):
            if g.failed == pri and used + len(rows) <= MAX_MAP_ROWS:
                keep.add(k)
                used += len(rows)
    left_out = [g for k, (g, _) in enumerate(blocks) if k not in keep]
    rows = [row for k, (_, rs) in enumerate(blocks) if k in keep for row in rs]
    foot = _skipped_lines(data.groups, 200, 3)
    if left_out:
        nf = sum(g.failed for g in left_out)
        foot.append(f"{len(left_out)} units not drawn ({nf} failing, {len(left_out) - nf} passing): "
                    f"the map holds {MAX_MAP_ROWS} rows, failing units first")
    max_steps = max((r.codes.size for r in rows), default=1)
    labels = [r.label for r in rows]
    fs = 7
    label_in = min(6.0, _label_inches(labels, fs))
    step_in = max(0.01, min(0.22, (MAX_IN - label_in - 0.8) / max(max_steps, 1)))
    row_in = 0.16
    top_in, bottom_in = 1.25, 0.65 + 0.15 * len(foot)
    width, height = _fit(max(12.0, label_in + 0.8 + step_in * max_steps), top_in + bottom_in + row_in * max(len(rows), 1))
    fig = Figure(figsize=(width, height), dpi=DPI)
    how = ("one row per run" if per_run else
           "one row per (model, scenario) unit: the worst step of its runs (not the baseline, not the "
           "calibration members), then its failing variant/backend/mode (repeats merged)")
    fig.suptitle(f"Divergence map against each unit's baseline — {data.path}\n{how}", fontsize=10,
                 y=1 - 0.08 / height, va="top")
    cmap = ListedColormap(list(MAP_COLORS))
    norm = BoundaryNorm([-1.5, -0.5, 0.5, 1.5, 2.5, 3.5], cmap.N)
    fig.legend(handles=[Patch(facecolor=c, edgecolor="0.5", label=t) for c, t in zip(MAP_COLORS, MAP_LABELS)] +
               [Line2D([], [], color="k", lw=1.5, label="window full (prompt_len + step ≥ W)")],
               loc="upper center", ncol=3, fontsize=7.5, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.55 / height))
    if rows:
        ax = fig.add_axes(((label_in + 0.1) / width, bottom_in / height,
                           (width - label_in - 0.5) / width, (height - top_in - bottom_in) / height))
        mat = np.full((len(rows), max_steps), NO_DATA, np.int8)
        for i, r in enumerate(rows):
            mat[i, :r.codes.size] = r.codes
        ax.imshow(mat, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest",
                  extent=(-0.5, max_steps - 0.5, len(rows) - 0.5, -0.5))
        ax.set_yticks(range(len(rows)), labels, fontsize=fs, family="monospace")
        for t, r in zip(ax.get_yticklabels(), rows):
            if r.failed:
                t.set_color(FAIL_COLOR)
        for i, r in enumerate(rows):
            if r.first_of_unit and i:
                ax.axhline(i - 0.5, color="0.35", lw=0.7)
            if r.window_step is not None:
                ax.vlines(r.window_step - 0.5, i - 0.5, i + 0.5, color="k", lw=1.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(max_steps, 25) or 1))
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("decode step", fontsize=8)
    else:
        fig.text(0.5, 0.5, f"no recorded (not skipped) runs in {data.path}", ha="center", va="center",
                 fontsize=12)
    _footnote(fig, foot, 0.1, height)
    return fig


# ---------------------------------------------------------------- graphs

@dataclass
class _Bar:
    label: str
    graphs: int
    recompiles: int | None
    budget: int | None
    over: bool
    note: str


def _bars(compiled: list[RunInfo]) -> tuple[list[_Bar], bool]:
    """One bar per compiled run when they fit, else one per (variant[+fault],
    backend, mode) with the largest count and the counts over budget."""
    if len(compiled) <= MAX_BAR_ROWS:
        several = len({(r.model, r.scenario) for r in compiled}) > 1
        out = []
        for r in compiled:
            budget = f" (budget {r.graph_budget})" if r.graph_budget is not None else " (no budget)"
            rec = f", {r.recompiles} recompiles" if r.recompiles is not None else ""
            out.append(_Bar((f"{r.model}/{r.scenario} " if several else "") + r.label, r.graphs_captured,
                            r.recompiles, r.graph_budget,
                            r.graph_budget is not None and r.graphs_captured > r.graph_budget,
                            f"{r.graphs_captured} graphs{budget}{rec}"))
        return out, False
    by: dict[str, list[RunInfo]] = {}
    for r in compiled:
        by.setdefault(r.name.rsplit("/", 1)[0], []).append(r)
    out = []
    for key, rs in by.items():
        over = [r for r in rs if r.graph_budget is not None and r.graphs_captured > r.graph_budget]
        worst = max(rs, key=lambda r: (r.graphs_captured - (r.graph_budget if r.graph_budget is not None else
                                                            r.graphs_captured), r.graphs_captured))
        g = [r.graphs_captured for r in rs]
        b = [r.graph_budget for r in rs if r.graph_budget is not None]
        rec = [r.recompiles for r in rs if r.recompiles is not None]
        units = len({(r.model, r.scenario) for r in rs})
        note = (f"{len(rs)} runs in {units} units: graphs {min(g)}–{max(g)}"
                + (f", budget {min(b)}–{max(b)}" if b else ", no budget")
                + (f", {len(over)} over budget (worst {worst.model}/{worst.scenario} {worst.graphs_captured}"
                   f" > {worst.graph_budget})" if over else ""))
        out.append(_Bar(key, worst.graphs_captured, max(rec) if rec else None, worst.graph_budget, bool(over), note))
    return out, True


def _graphs_figure(data: ReportData) -> Figure:
    compiled = [r for g in data.groups for r in g.runs if r.mode != "eager"]
    skipped = [r for g in data.groups for r in g.skipped if r.mode != "eager"]
    foot = _skipped_lines([Group("", "", skipped=skipped)], 150, 3)
    bars, aggregated = _bars(compiled)
    if len(bars) > MAX_BAR_ROWS:
        order = [b for b in bars if b.over] + [b for b in bars if not b.over]
        foot.append(f"{len(bars) - MAX_BAR_ROWS} more rows within budget not drawn")
        bars = order[:MAX_BAR_ROWS]
    bottom_in, top_in = 0.7 + 0.15 * len(foot), 1.2
    row_in = 0.5
    height = top_in + bottom_in + row_in * max(len(bars), 3)
    if height > MAX_IN:
        row_in = (MAX_IN - top_in - bottom_in) / max(len(bars), 3)
    labels = [b.label for b in bars]
    label_in = min(7.0, _label_inches(labels, 8))
    width, height = _fit(max(12.0, label_in + 9.0), top_in + bottom_in + row_in * max(len(bars), 3))
    fig = Figure(figsize=(width, height), dpi=DPI)
    what = ("per (variant[+fault], backend, mode) over its runs: the run furthest over its budget" if aggregated
            else "per compiled run")
    fig.suptitle("Decode graphs captured, dynamo recompiles beside them, and the cache layer's graph budget\n"
                 f"{what} — {data.path}", fontsize=10, y=1 - 0.1 / height, va="top")
    ax = fig.add_axes(((label_in + 0.1) / width, bottom_in / height,
                       1 - (label_in + 0.5) / width, 1 - (top_in + bottom_in) / height))
    if not bars:
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"no compiled runs in {data.path}", ha="center", va="center",
                fontsize=13, transform=ax.transAxes)
        _footnote(fig, foot, 0.1, height)
        return fig
    y = np.arange(len(bars))
    graphs = np.array([b.graphs for b in bars])
    over = np.array([b.over for b in bars])
    ax.barh(y - 0.2, graphs, height=0.38, color=np.where(over, FAIL_COLOR, "#2e86c1"))
    rec = np.array([b.recompiles if b.recompiles is not None else 0 for b in bars])
    ax.barh(y + 0.2, rec, height=0.38, color="#f0a830")
    top = max(1, int(graphs.max()), int(rec.max()), max((b.budget or 0) for b in bars))
    small = row_in >= 0.2
    for i, b in enumerate(bars):
        if small:
            ax.text(b.graphs + top * 0.01, i - 0.2, b.note, va="center", fontsize=7.5)
        if b.budget is not None:
            ax.plot([b.budget, b.budget], [i - 0.46, i + 0.46], color="k", lw=2.5)
    ax.set_yticks(y, labels, fontsize=8 if small else 5, family="monospace")
    for t, b in zip(ax.get_yticklabels(), bars):
        if b.over:
            t.set_color(FAIL_COLOR)
    ax.set_ylim(len(bars) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.6 + 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, axis="x", color="0.9")
    ax.set_axisbelow(True)
    ax.set_xlabel("count")
    fig.legend(handles=[Patch(color="#2e86c1", label="graphs_captured (decode graphs), within budget"),
                        Patch(color=FAIL_COLOR, label="graphs_captured above the graph budget"),
                        Patch(color="#f0a830", label="recompiles (dynamo; -1/absent: unknown)"),
                        Line2D([], [], color="k", lw=2.5, label="graph_budget of the cache layer")],
               loc="upper center", bbox_to_anchor=(0.5, 1 - 0.6 / height), ncol=4, fontsize=8,
               frameon=False)
    _footnote(fig, foot, 0.1, height)
    return fig


# ---------------------------------------------------------------- entry points

def render_figures(data: ReportData) -> list[tuple[str, bytes]]:
    """FIGURES' names and their PNG bytes, each within MAX_PX a side."""
    out = []
    for name, draw in zip(FIGURES, (_summary_figure, _error_figure, _map_figure, _graphs_figure)):
        out.append((name, _png(draw(data))))
    return out


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


def _check_window(window: int | None) -> None:
    if window is not None and not 1 <= window <= MAX_WINDOW:
        raise InputError(f"--window: expected 1 <= W <= {MAX_WINDOW}, found {window}")


def plot_report(report_path: str, out_dir: str, window: int | None = None) -> list[str]:
    """Writes FIGURES for the report into out_dir (created if missing) and
    returns their paths. window is the sliding window W for reports whose
    runs carry no `window` attribute and that have no boundary-sweep unit.
    Every figure is rendered before the first is written. Bad input raises
    InputError naming the file and field."""
    _check_window(window)
    rd = _Reader(report_path)
    try:
        rd.check_root()      # a bad report is refused before out_dir is created
        _out_dir(out_dir)
        for name in FIGURES:   # a figure written over the report it draws
            if same_file(report_path, os.path.join(out_dir, name)):
                raise InputError(f"{os.path.join(out_dir, name)}: is the report being plotted "
                                 f"({report_path}): choose another --out")
        pngs = render_figures(_load_data(rd, window))
    except (KeyError, OSError) as e:  # h5py's errors on a damaged file
        raise InputError(f"{report_path}: cannot read: {e}") from None
    finally:
        rd.close()
    paths = []
    for name, png in pngs:
        path = os.path.join(out_dir, name)
        publish(path, lambda f, png=png: f.write(png), "--out")
        paths.append(path)
    return paths


def load_report(report_path: str, window: int | None = None) -> ReportData:
    """Everything the figures and the HTML page show of a report. Bad input
    raises InputError naming the file and field."""
    _check_window(window)
    rd = _Reader(report_path)
    try:
        return _load_data(rd, window)
    except (KeyError, OSError) as e:
        raise InputError(f"{report_path}: cannot read: {e}") from None
    finally:
        rd.close()


def load_comparisons(report_path: str, window: int | None = None
                     ) -> tuple[list[Group], dict[int, Comparison]]:
    """What the figures show, without drawing them: the (model, scenario)
    groups with each run's baseline, and every recorded run's comparison
    with its baseline, by run index."""
    data = load_report(report_path, window)
    return data.groups, data.cmp


def _load_data(rd: _Reader, window: int | None) -> ReportData:
    _check_window(window)
    rd.check_root()
    runs = rd.runs()
    tolerances = rd.tolerances()
    groups = _groups(runs, window, tolerances)
    cmp: dict[int, Comparison] = {}
    for g in groups:
        for r in g.runs:
            cmp[r.index] = _compare(rd, g.baseline_of[r.index], r)
    failures, n_comparisons = rd.failures(runs)
    windows: dict[str, tuple[int | None, str]] = {}
    for g in groups:
        if g.window is not None or g.model not in windows:
            if windows.get(g.model, (None, ""))[0] is None:
                windows[g.model] = (g.window, g.window_note)
    return ReportData(rd.path, rd.root(), runs, groups, cmp, failures, tolerances, n_comparisons, windows)
