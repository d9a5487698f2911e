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
from kvrepro.report import Run, margins_of, write_report

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
