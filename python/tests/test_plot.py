"""kvrepro.plot: the comparisons behind the figures, checked against values
worked out by hand from a tiny report built here, and the figures written.

Run: cd REPO && PYTHONPATH=python python -m unittest python/tests/test_plot.py -v
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import unittest

import h5py
import numpy as np

from kvrepro.cli import InputError, main
from kvrepro.plot import (FIGURES, G_BEYOND, G_EQUAL, G_TOKEN, G_WITHIN, MAX_PX, NO_DATA, Tolerance,
                          divergence_matrix, graded_codes, kept_rel_error_series, load_comparisons, load_report,
                          plot_report, rel_error_series, render_figures, unit_tolerance, window_from_sweep,
                          window_step)
from kvrepro.report import COMPARISON_DTYPE, SUMMARY_DTYPE, TOLERANCE_DTYPE, Run, margins_of, write_report

S, B, V, P = 6, 2, 8, 3
# Every row is a rotation of R, so every baseline row's max |logit| is 4 and
# the relative errors below are exact binary fractions.
R = np.array([4.0, 1.0, 0.5, -2.0, 0.0, 3.0, -1.0, 2.0], np.float32)
ROOT = {"tool_version": "test", "git_commit": "none", "host": "test", "device": "cpu only",
        "math_mode": "fp32"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def baseline_logits() -> np.ndarray:
    out = np.zeros((S, B, V), np.float32)
    for s in range(S):
        for b in range(B):
            out[s, b] = np.roll(R, s + b)      # argmax (the token) at (s + b) % V
    return out


def candidate_logits() -> np.ndarray:
    """Equal to the baseline but at step 3, row 1: the 1.0 becomes 1.5 (the
    argmax stays: error 0.5 / 4 = 0.125), and at step 4, row 0: the 4.0 and
    the 3.0 swap places (the argmax moves: error 1 / 4 = 0.25)."""
    out = baseline_logits()
    i = int(np.flatnonzero(out[3, 1] == 1.0)[0])
    out[3, 1, i] = 1.5
    hi, lo = int(np.argmax(out[4, 0])), int(np.flatnonzero(out[4, 0] == 3.0)[0])
    out[4, 0, hi], out[4, 0, lo] = 3.0, 4.0
    return out


def tokens_of(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits, axis=-1).astype(np.int32)


EXPECTED_ERRORS = np.array([0.0, 0.0, 0.0, 0.125, 0.25, 0.0])
EXPECTED_CODES = np.array([0, 0, 0, 1, 2, 0], np.int8)


def make_run(variant: str, mode: str, logits: np.ndarray | None, **kw) -> Run:
    common = dict(model="tiny", scenario="unit", variant=variant, backend="torch-cpu", mode=mode,
                  repeat=0, engine="test", vocab=V, steps=S)
    if logits is None:
        return Run(skipped=True, skip_reason="no CUDA device", **common, **kw)
    return Run(prompt=np.arange(B * P, dtype=np.int32).reshape(B, P),
               prompt_real=np.ones((B, P), np.uint8), tokens=tokens_of(logits), logits=logits,
               margins=margins_of(logits), probe_names=["logits"],
               probe_hash=np.zeros((S, 1, B), np.uint64), **common, **kw)


W = 5               # the gate-like report's window: its prompt_w unit has P = W
UNIT_TOL = 2e-5     # its max_rel_err@tiny/prompt_w
MESSAGE = "logits beyond max_rel_err at step 3 row 1 <b>&amp;</b>"   # markup to be escaped


def gate_like_report(path: str, units: int = 1, compiled: int = 0) -> None:
    """A report shaped like the C gate's: per unit a reference run, a
    calibration member (the reference in another order: 1e-6 off), a clean
    candidate and a faulted one (candidate_logits, failing its reference
    comparison at step 3 row 1); `compiled` graph-mode runs per unit, the
    first over its budget. /tolerances, /comparisons and /summary as the gate
    writes them. Unit 0 is prompt_w (P = W), the others u1, u2, ..."""
    runs: list[Run] = []
    cmps = []
    fail = set()
    member = baseline_logits() * np.float32(1 + 1e-6)
    for u in range(units):
        scen = "prompt_w" if u == 0 else f"u{u}"
        plen = W if u == 0 else P
        base = len(runs)

        def run(variant: str, logits: np.ndarray, mode: str = "eager", **kw) -> Run:
            return Run(model="tiny", scenario=scen, variant=variant, backend="cpu", mode=mode, repeat=0,
                       engine="", vocab=V, steps=S, prompt=np.arange(B * plen, dtype=np.int32).reshape(B, plen),
                       prompt_real=np.ones((B, plen), np.uint8), tokens=tokens_of(logits), logits=logits,
                       margins=margins_of(logits), probe_names=["embed", "logits"],
                       probe_hash=np.zeros((S, 2, B), np.uint64), **kw)

        runs += [run("reference", baseline_logits()), run("reference~keys_reversed", member),
                 run("roll", baseline_logits()),
                 run("index_copy", candidate_logits(), extra={"fault": "window_off_by_one"})]
        for c in range(compiled):
            runs.append(run("roll", baseline_logits(), mode="graph", graphs_captured=9 if c == 0 else 1,
                            graph_budget=1, extra={"fault": f"f{c}"} if c else {}))
            if c == 0:
                fail.add(len(runs) - 1)
                cmps.append((7, len(runs) - 1, len(runs) - 1, 1, "9 decode graphs, budget 1: the decode recompiles",
                             -1, -1, -1))
        cmps += [(0, base, base + 1, 0, "", -1, -1, -1), (0, base, base + 2, 0, "", -1, -1, -1),
                 (0, base, base + 3, 1, MESSAGE, 3, 1, 1), (5, base + 3, base + 3, 0, "", -1, -1, -1)]
        fail.add(base + 3)
    write_report(path, runs, ROOT)
    with h5py.File(path, "r+") as f:
        tol = [("max_rel_err", 1e-4, "not used: each (model, scenario) is judged by its calibrated max_rel_err"),
               ("tie_margin", 1e-3, "a token flip is a near-tie when the reference's top-1 margin is at most this")]
        tol += [(f"max_rel_err@tiny/{'prompt_w' if u == 0 else f'u{u}'}", UNIT_TOL,
                 "calibrated: max(16 x spread, 8 x fp64_err, 1e-06)") for u in range(units)]
        table = np.zeros(len(tol), TOLERANCE_DTYPE)
        for i, (n, v, why) in enumerate(tol):
            table[i] = (n.encode(), v, why.encode())
        cmp = np.zeros(len(cmps), COMPARISON_DTYPE)
        for i, (k, a, b, v, msg, s_, r_, p_) in enumerate(cmps):
            cmp[i]["kind"], cmp[i]["run_a"], cmp[i]["run_b"], cmp[i]["verdict"] = k, a, b, v
            cmp[i]["message"], cmp[i]["first_step"], cmp[i]["first_row"], cmp[i]["first_probe"] = \
                msg.encode(), s_, r_, p_
        summary = f["summary"][()]
        for i in fail:
            summary[i]["verdict"], summary[i]["verdict_name"] = 1, b"FAIL"
        for name, data in (("tolerances", table), ("comparisons", cmp), ("summary", summary)):
            del f[name]
            f.create_dataset(name, data=data)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR."""
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


class PlotTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.report = os.path.join(cls.tmp.name, "tiny.h5")
        write_report(cls.report, [
            make_run("hf:static_sliding:eager:fp32", "eager", baseline_logits()),   # baseline
            make_run("hf:roll:eager:fp32", "eager", candidate_logits()),
            make_run("hf:roll:eager:fp32", "compile", baseline_logits(),
                     graphs_captured=3, recompiles=2, graph_budget=2),
            make_run("hf:roll:eager:fp32", "reduce-overhead", None),
        ], ROOT)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    # -- the pure functions, on the arrays the report was built from

    def test_sanity_of_the_data(self) -> None:
        base, cand = tokens_of(baseline_logits()), tokens_of(candidate_logits())
        self.assertEqual([int((base[s] != cand[s]).sum()) for s in range(S)], [0, 0, 0, 0, 1, 0])

    def test_rel_error_series(self) -> None:
        np.testing.assert_array_equal(rel_error_series(baseline_logits(), candidate_logits()),
                                      EXPECTED_ERRORS)
        np.testing.assert_array_equal(rel_error_series(baseline_logits(), baseline_logits()),
                                      np.zeros(S))

    def test_rel_error_series_all_zero_row_and_non_finite(self) -> None:
        # A zero baseline row divides by 1 (harness/compare.c); a NaN row is inf.
        a = np.zeros((2, 1, 3), np.float32)
        b = a.copy()
        b[0, 0, 1] = 0.5
        b[1, 0, 2] = np.nan
        np.testing.assert_array_equal(rel_error_series(a, b), [0.5, np.inf])

    def test_kept_rel_error_series(self) -> None:
        # Row max |baseline| 8; the candidate kept ids 1, 2: id 2's 5 vs 4 is
        # off by 1, id 1 only the candidate kept (ignored): 1 / 8.
        base_ids, base_vals = np.array([[[0, 2]]]), np.array([[[8.0, 4.0]]])
        ids, vals = np.array([[[2, 1]]]), np.array([[[5.0, 7.0]]])
        np.testing.assert_array_equal(kept_rel_error_series(base_ids, base_vals, ids, vals), [0.125])

    def test_divergence_matrix(self) -> None:
        base, cand = baseline_logits(), candidate_logits()
        short = base[:4]
        m = divergence_matrix(base, tokens_of(base), [(base, tokens_of(base)),
                                                      (cand, tokens_of(cand)),
                                                      (short, tokens_of(short))])
        np.testing.assert_array_equal(m, [[0, 0, 0, 0, 0, 0],
                                          EXPECTED_CODES,
                                          [0, 0, 0, 0, -1, -1]])

    def test_divergence_matrix_is_bitwise(self) -> None:
        base = baseline_logits()
        neg0 = base.copy()
        neg0[2, 1, int(np.flatnonzero(base[2, 1] == 0.0)[0])] = -0.0   # equal as numbers, not as bits
        m = divergence_matrix(base, tokens_of(base), [(neg0, tokens_of(neg0))])
        np.testing.assert_array_equal(m, [[0, 0, 1, 0, 0, 0]])

    def test_window_step(self) -> None:
        self.assertEqual(window_step(P, 5), 2)       # P + 2 >= 5 first at step 2
        self.assertEqual(window_step(P, P), 0)
        self.assertEqual(window_step(24, 8), 0)      # the prompt already fills the window
        self.assertIsNone(window_step(P, None))

    def test_graded_codes(self) -> None:
        codes = np.array([NO_DATA, 0, 1, 1, 1, 2], np.int8)
        errors = np.array([0.0, 0.0, 1e-6, 1e-4, np.nan, 0.5])
        np.testing.assert_array_equal(graded_codes(codes, errors, 1e-5),
                                      [NO_DATA, G_EQUAL, G_WITHIN, G_BEYOND, G_BEYOND, G_TOKEN])
        # no tolerance known: a difference is not held to anything
        np.testing.assert_array_equal(graded_codes(codes, errors, None),
                                      [NO_DATA, G_EQUAL, G_WITHIN, G_WITHIN, G_WITHIN, G_TOKEN])

    def test_window_from_sweep(self) -> None:
        self.assertEqual(window_from_sweep({"prompt_w": 16, "prompt_w_minus_1": 15, "prompt_w_plus_1": 17})[0], 16)
        self.assertEqual(window_from_sweep({"w_minus_1": 7})[0], 8)          # the goldens' names
        self.assertEqual(window_from_sweep({"prompt_w_plus_1": 17, "other": 3})[0], 16)
        w, why = window_from_sweep({"prompt_w": 16, "prompt_w_plus_1": 16})
        self.assertIsNone(w)
        self.assertIn("disagree", why)
        self.assertIsNone(window_from_sweep({"long": 24})[0])

    def test_unit_tolerance(self) -> None:
        tols = [Tolerance("max_rel_err", 1e-4, "not used: each unit is judged by its calibrated max_rel_err"),
                Tolerance("max_rel_err@m/s", 2.5e-5, "calibrated: max(16 x spread, ...)")]
        self.assertEqual(unit_tolerance(tols, "m", "s", False)[0], 2.5e-5)
        self.assertIn("calibrated", unit_tolerance(tols, "m", "s", False)[1])
        self.assertEqual(unit_tolerance(tols, "hf/m", "w", True)[0], 1e-5)   # a golden unit
        self.assertIsNone(unit_tolerance(tols, "m", "other", False)[0])      # the 1e-4 is not used
        self.assertEqual(unit_tolerance([Tolerance("max_rel_err", 1e-4, "F32 reduction-order ...")],
                                        "m", "other", False)[0], 1e-4)       # --no-calibrate: in use
        long = "m" * 40 + "/" + "s" * 40                                       # cut to 63 bytes
        self.assertEqual(unit_tolerance([Tolerance(f"max_rel_err@{long}"[:63], 3e-5, "")],
                                        "m" * 40, "s" * 40, False)[0], 3e-5)
        self.assertIsNone(unit_tolerance([], "m", "s", False)[0])

    # -- the same values, read back from the report file

    def test_load_comparisons(self) -> None:
        groups, cmp = load_comparisons(self.report)
        self.assertEqual(len(groups), 1)
        g = groups[0]
        self.assertEqual([r.index for r in g.runs], [0, 1, 2])
        self.assertEqual([r.index for r in g.skipped], [3])
        self.assertEqual({i: b.index for i, b in g.baseline_of.items()}, {0: 0, 1: 0, 2: 0})
        self.assertIn("#0", g.baseline_note)
        self.assertIn("first eager run", g.baseline_note)
        np.testing.assert_array_equal(cmp[0].codes, np.zeros(S))
        np.testing.assert_array_equal(cmp[1].codes, EXPECTED_CODES)
        np.testing.assert_array_equal(cmp[1].errors, EXPECTED_ERRORS)
        np.testing.assert_array_equal(cmp[2].codes, np.zeros(S))
        self.assertNotIn(3, cmp)
        self.assertIsNone(g.window)
        self.assertIn("window unknown", g.window_note)
        g4 = load_comparisons(self.report, window=4)[0][0]
        self.assertEqual((g4.window, g4.window_note), (4, "W=4 (from --window)"))

    def test_window_attribute_wins_over_the_option(self) -> None:
        path = os.path.join(self.tmp.name, "window.h5")
        write_report(path, [make_run("hf:roll:eager:fp32", "eager", baseline_logits(),
                                     extra={"window": 5})], ROOT)
        g = load_comparisons(path, window=4)[0][0]
        self.assertEqual(g.window, 5)
        self.assertIn("run attribute", g.window_note)

    def test_gate_report_tolerance_window_members_failures(self) -> None:
        path = os.path.join(self.tmp.name, "gate.h5")
        gate_like_report(path)
        data = load_report(path)
        (g,) = data.groups
        self.assertEqual((g.tolerance, g.window), (UNIT_TOL, W))        # not 1e-4, not unknown
        self.assertIn("prompt_w", g.window_note)
        self.assertEqual([r.variant for r in g.candidates()], ["roll", "index_copy"])   # no member
        member = g.runs[1]
        self.assertTrue(member.member)
        self.assertLessEqual(int(graded_codes(data.cmp[1].codes, data.cmp[1].errors, g.tolerance).max()), G_WITHIN)
        self.assertEqual(int(graded_codes(data.cmp[3].codes, data.cmp[3].errors, g.tolerance).max()), G_TOKEN)
        self.assertEqual((data.counts, data.verdict), ((3, 1, 0), "FAIL"))
        (fl,) = data.failures
        self.assertEqual((fl.kind, fl.where, fl.message), ("reference", "step 3 row 1 probe logits", MESSAGE))
        self.assertEqual(fl.bisect_command("r.h5"),
                         "kvrepro bisect r.h5 --run tiny/prompt_w/reference/cpu/eager/r0 "
                         "--run tiny/prompt_w/index_copy+window_off_by_one/cpu/eager/r0 --rerun")

    def test_figures_are_bounded(self) -> None:
        # more units than the map has rows, more compiled runs than the
        # graphs figure has bars, more than MAX_PANELS units
        path = os.path.join(self.tmp.name, "big.h5")
        gate_like_report(path, units=120, compiled=2)
        for name, png in render_figures(load_report(path)):
            w, h = png_size(png)
            self.assertLessEqual(max(w, h), MAX_PX, name)
            self.assertGreater(min(w, h), 300, name)
        self.assertEqual(len(FIGURES), 4)

    # -- the figures

    def test_plot_writes_four_pngs(self) -> None:
        out = os.path.join(self.tmp.name, "figs", "new")          # created, parents too
        paths = plot_report(self.report, out, window=4)
        self.assertEqual([os.path.basename(p) for p in paths],
                         ["summary.png", "error_vs_reference.png", "divergence_map.png", "graphs_per_decode.png"])
        first = []
        for p in paths:
            with open(p, "rb") as f:
                data = f.read()
            self.assertEqual(data[:8], PNG_MAGIC, p)
            self.assertGreater(len(data), 10_000, p)
            self.assertNotIn(b"Software", data, p)
            first.append(data)
        again = plot_report(self.report, out, window=4)       # the same report, the same bytes
        for p, data in zip(again, first):
            with open(p, "rb") as f:
                self.assertEqual(f.read(), data, p)
        self.assertEqual(sorted(os.listdir(out)), sorted(os.path.basename(p) for p in paths))

    def test_cli_plot_with_window(self) -> None:
        out = os.path.join(self.tmp.name, "cli")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            self.assertEqual(main(["plot", self.report, "--out", out, "--window", "4"]), 0)
        self.assertEqual(buf.getvalue().split(),
                         [os.path.join(out, n) for n in ("summary.png", "error_vs_reference.png",
                                                         "divergence_map.png",
                                                         "graphs_per_decode.png")])

    # -- bad input

    def test_missing_file(self) -> None:
        path = os.path.join(self.tmp.name, "no-such.h5")
        with self.assertRaises(InputError) as cm:
            plot_report(path, os.path.join(self.tmp.name, "x"))
        self.assertIn(path, str(cm.exception))
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "x")))

    def test_not_hdf5_and_wrong_schema(self) -> None:
        junk = os.path.join(self.tmp.name, "junk.h5")
        with open(junk, "wb") as f:
            f.write(b"not hdf5")
        with self.assertRaises(InputError) as cm:
            plot_report(junk, self.tmp.name)
        self.assertIn(junk, str(cm.exception))
        v2 = os.path.join(self.tmp.name, "v2.h5")
        with h5py.File(v2, "w") as f:
            f.attrs["schema_version"] = np.int32(2)
        with self.assertRaises(InputError) as cm:
            plot_report(v2, self.tmp.name)
        self.assertIn(v2, str(cm.exception))
        self.assertIn("schema_version", str(cm.exception))

    def test_unwritable_out_dir(self) -> None:
        afile = os.path.join(self.tmp.name, "a-file")
        with open(afile, "w") as f:
            f.write("x")
        with self.assertRaises(InputError) as cm:
            plot_report(self.report, os.path.join(afile, "sub"))
        self.assertIn(afile, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
