"""The custom cache layers' layouts and the capture CLI's input checks, without a model.

Layouts: every key row written carries its own absolute position as its value,
so after any sequence of updates the slot mapping each layer claims
(slot_position, key_positions) can be read back from the data itself.
"""

import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stderr

import numpy as np
import torch

from kvrepro import cli
from kvrepro.caches import BROKEN, CUSTOM, SlidingLayer
from kvrepro.fnv import fnv1a64_rows

W = 8


def rows(first: int, n: int) -> torch.Tensor:
    """(1, 1, n, 1) keys whose value is their position + 1 (0 = never written)."""
    return torch.arange(first + 1, first + n + 1, dtype=torch.float32).reshape(1, 1, n, 1)


def run_layer(cls, chunks: list[int]) -> tuple[SlidingLayer, list[tuple[list[int], list[float]]]]:
    """Feeds updates of the given sizes; returns the layer and, per update,
    (claimed key positions, positions the returned keys really hold)."""
    lay = cls(W)
    seen = 0
    got = []
    for n in chunks:
        claimed = None
        k = rows(seen, n)
        if n > 1:
            keys, _ = lay.update(k, k.clone())
            claimed = lay.key_positions(seen, n)
        else:
            claimed = lay.key_positions(seen, n)
            keys, _ = lay.update(k, k.clone())
            lay.advance(1)
        held = [float(x) - 1 for x in keys.reshape(-1)]
        got.append((claimed, held))
        seen += n
    return lay, got


class LayoutTest(unittest.TestCase):
    def check_honest(self, name: str, chunks: list[int]) -> None:
        lay, got = run_layer(CUSTOM[name], chunks)
        seen = 0
        for i, (claimed, held) in enumerate(got):
            n = chunks[i]
            for c, p in enumerate(claimed):
                if p >= 0:
                    self.assertEqual(held[c], p, f"{name} update {i}: column {c} claims {p}, holds {held[c]}")
            # every position the next query's window needs is claimed somewhere
            total = seen + n
            need = set(range(max(0, total - W), total)) if n == 1 else set(range(seen, total))
            self.assertTrue(need <= set(claimed), f"{name} update {i}: {sorted(need - set(claimed))} missing")
            seen = total
        # after the last update, slot_of names a slot that holds the position
        for p in range(max(0, seen - W + 1), seen):
            s = lay.slot_of(p)
            self.assertGreaterEqual(s, 0)
            self.assertEqual(float(lay.keys[0, 0, s, 0]) - 1, p)

    def test_layouts_short_prompt_crossing_window(self) -> None:
        for name in ("index_copy", "cat_shift", "roll", "always_roll"):
            self.check_honest(name, [3] + [1] * 20)

    def test_layouts_prefill_longer_than_window(self) -> None:
        for name in ("index_copy", "cat_shift", "roll", "always_roll"):
            self.check_honest(name, [3 * W] + [1] * 10)

    def test_layouts_prompt_w_and_chunks(self) -> None:
        for name in ("index_copy", "cat_shift", "roll", "always_roll"):
            self.check_honest(name, [W] + [1] * 5 + [3] + [1] * 5)
            self.check_honest(name, [W - 1, 1, 1])

    def test_broken_layers_are_dishonest(self) -> None:
        """The planted bugs show in the data: the off-by-one mapping claims
        positions its slots do not hold, first_w keeps the wrong rows."""
        _, got = run_layer(CUSTOM["always_roll_off_by_one"], [3] + [1] * 3)
        claimed, held = got[1]
        self.assertTrue(any(p >= 0 and held[c] != p for c, p in enumerate(claimed)))
        lay, _ = run_layer(CUSTOM["index_copy_first_w"], [3 * W])
        self.assertEqual([float(x) - 1 for x in lay.keys.reshape(-1)], list(range(W)))
        self.assertEqual(set(BROKEN), {"always_roll_off_by_one", "index_copy_first_w"})


class FnvTest(unittest.TestCase):
    def test_known_vectors(self) -> None:
        # FNV-1a 64 reference values: "" and "a"
        self.assertEqual(int(fnv1a64_rows(np.zeros((1, 0), np.uint8))[0]), 0xCBF29CE484222325)
        self.assertEqual(int(fnv1a64_rows(np.frombuffer(b"a", np.uint8).reshape(1, 1))[0]),
                         0xAF63DC4C8601EC8C)


def fnv_by_columns(rows: np.ndarray) -> np.ndarray:
    """FNV-1a 64 of each row's bytes, one byte column at a time over every
    row (the definition, independent of fnv.FEW_ROWS)."""
    b = np.ascontiguousarray(rows).reshape(rows.shape[0], -1).view(np.uint8)
    h = np.full(b.shape[0], 0xCBF29CE484222325, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(b.shape[1]):
            h ^= b[:, j].astype(np.uint64)
            h *= np.uint64(0x100000001B3)
    return h


class FnvRowsTest(unittest.TestCase):
    """fnv1a64_rows hashes few rows one row at a time (Python integers) and
    more one byte column at a time: the same hash either way."""

    def test_few_and_many_rows_hash_alike(self) -> None:
        from kvrepro import fnv

        rng = np.random.default_rng(1)
        for n in (1, 2, fnv.FEW_ROWS, fnv.FEW_ROWS + 1, 40):
            for width in (0, 1, 7, 300):
                with self.subTest(rows=n, bytes=width):
                    a = rng.integers(0, 256, (n, width), dtype=np.uint8)
                    np.testing.assert_array_equal(fnv1a64_rows(a), fnv_by_columns(a))
        f = rng.standard_normal((2, 3, 5)).astype("<f4")   # (R, ...) rows of any shape, any dtype
        np.testing.assert_array_equal(fnv1a64_rows(f), fnv_by_columns(f))


class HashSlicesTest(unittest.TestCase):
    """hash_slices hashes only the slices an earlier state does not hold with
    the same label and bits, and gets exactly what hashing every slice gets
    (capture.slice_hashes), whatever changed: a slice of a kept label whose
    bits changed (one element, a NaN's payload, 0.0 to -0.0), labels that
    moved, came or went."""

    def test_equal_to_hashing_every_slice(self) -> None:
        from kvrepro.capture import ProbeMemo, combine_slices, hash_slices, probe_row_hashes, slice_hashes

        g = torch.Generator().manual_seed(3)
        w, f = 6, 5
        seq = torch.randn((2, 20, f), generator=g)                 # (B, position, F) K rows; V = 2 K

        def window(first: int) -> tuple[torch.Tensor, list]:
            k = seq[:, first:first + w]
            pos = list(range(first, first + w))
            return torch.cat([k, 2 * k], dim=1).clone(), [("k", p) for p in pos] + [("v", p) for p in pos]

        rows, labels = window(0)
        state = hash_slices(rows, labels, None)
        np.testing.assert_array_equal(state.hashes, slice_hashes(rows))
        for first in range(1, 6):
            # changes to positions held before and after (first..first + w - 1)
            if first == 2:
                seq[1, 4, 2] += 1.0                        # a kept position's row changed
            if first == 3:
                seq[0, 5, 0] = float("nan")                # became NaN...
            if first == 4:
                seq.view(torch.int32)[0, 5, 0] ^= 1        # ...then a NaN of another payload
                seq[1, 6, 4] = 0.0
            if first == 5:
                seq[1, 6, 4] = -0.0                        # 0.0 and -0.0: equal floats, other bits
            rows, labels = window(first)
            state = hash_slices(rows, labels, state)
            np.testing.assert_array_equal(state.hashes, slice_hashes(rows), f"window at {first}")
            np.testing.assert_array_equal(combine_slices(state.hashes), probe_row_hashes(rows))
        # labels of another kind (a hook's token index), another width: hashed anew
        other = torch.randn((2, 4, f + 1), generator=g)
        st = hash_slices(other, list(range(4)), state)
        np.testing.assert_array_equal(st.hashes, slice_hashes(other))
        # the memo over runs: a run's first step is compared with the first run's;
        # within its byte bound (one window's rows: it keeps the previous step's)
        one = 2 * w * 2 * f * 4
        for bound in (1 << 30, one, one - 1):
            memo = ProbeMemo(max_bytes=bound)
            for run in range(2):
                memo.start_run()
                for first in range(3):
                    for layer in range(2):
                        rows, labels = window(first)
                        if run == 1:
                            rows[0, 0, 0] -= 0.5
                        np.testing.assert_array_equal(memo.row_hashes(f"layer{layer}.cache", rows, labels),
                                                      probe_row_hashes(rows))
                        self.assertLessEqual(memo.kept_bytes(), bound)
            # unbounded: each layer's first state and its last; one window's bytes: one last; less: none
            self.assertEqual(memo.kept_bytes(), {1 << 30: 4 * one, one: one, one - 1: 0}[bound])


class SteadyTest(unittest.TestCase):
    """Where a run's steady per-step time starts, and its median."""

    def test_steady_from(self) -> None:
        from kvrepro.capture import steady_from

        self.assertEqual(steady_from("eager", []), 1)                # the first step allocates
        self.assertEqual(steady_from("compile", [0]), 1)
        self.assertEqual(steady_from("compile", [0, 1]), 2)          # a recompile at step 1
        self.assertEqual(steady_from("reduce-overhead", [0]), 2)     # step 1 records the CUDA graph
        self.assertEqual(steady_from("reduce-overhead", [0, 3]), 5)
        # after the last CUDA graph recording: a graph recorded again at steps 4 and 5
        self.assertEqual(steady_from("reduce-overhead", [0], [1, 4, 5]), 6)
        self.assertEqual(steady_from("reduce-overhead", [0, 3], [1]), 5)

    def test_cudagraph_records_from_torchs_callbacks(self) -> None:
        from torch._dynamo.callback import CallbackTrigger, callback_handler

        from kvrepro.capture import CudagraphRecords

        with CudagraphRecords() as rec:
            for step, trigger in ((0, CallbackTrigger.DYNAMO), (1, CallbackTrigger.CUDAGRAPH_RECORDING),
                                  (2, CallbackTrigger.CUDAGRAPH_RECORDING)):
                rec.step = step
                with callback_handler.install_callbacks(trigger, "0/0"):
                    pass
        with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
            pass   # after the run: not counted
        self.assertEqual(rec.at, [1, 2])
        self.assertNotIn(rec, callback_handler.start_callbacks)

    def test_steady_ms(self) -> None:
        from kvrepro.capture import steady_ms

        t = np.array([900.0, 40.0, 1.0, 3.0, 8.0])
        self.assertEqual(steady_ms(t, 2), 3.0)
        self.assertTrue(np.isnan(steady_ms(t, 5)))


class SkipReasonTest(unittest.TestCase):
    """Configurations a capture skips before loading the model, saying why."""

    def spec(self, layer: str, mode: str, device: str):
        from kvrepro.capture import CaptureSpec

        return CaptureSpec(model_dir="m", prompts=[[1]], scenario="s", new_tokens=2, layer=layer, mode=mode,
                           impl="eager", dtype="fp32", repeats=1, device=device)

    def test_dynamic_cache_under_cuda_graphs(self) -> None:
        from kvrepro.capture import skip_reason

        why = skip_reason(self.spec("dynamic_sliding", "reduce-overhead", "cuda"))
        self.assertIn("not a compileable cache", why)
        # compiled without CUDA graphs, and the compileable caches under them, run
        self.assertEqual(skip_reason(self.spec("dynamic_sliding", "compile", "cuda")), "")
        for layer in ("static_sliding", "cat_shift", "roll", "always_roll"):
            self.assertEqual(skip_reason(self.spec(layer, "reduce-overhead", "cuda")), "", layer)
        self.assertIn("no CUDA device" if not torch.cuda.is_available() else "device is cpu",
                      skip_reason(self.spec("static_sliding", "reduce-overhead", "cpu")))


class TableNotesTest(unittest.TestCase):
    """kvrepro-hf table lists the reasons of skipped runs under the table,
    at most table.MAX_NOTES lines (a log's tail keeps the table whole)."""

    def test_notes_are_bounded(self) -> None:
        from kvrepro import table
        from kvrepro.report import Run, write_report

        runs = [Run(model="m", scenario="s", variant=f"hf:roll:eager:fp32", backend="torch-cuda", mode="eager",
                    repeat=r, engine="test", skipped=True, skip_reason=f"why {r}", vocab=4, steps=2)
                for r in range(2)]
        runs += [Run(model="m", scenario="s", variant=f"hf:twin{i}:eager:fp32", backend="torch-cuda",
                     mode="compile", repeat=0, engine="test", skipped=True, skip_reason="failed: the same",
                     vocab=4, steps=2) for i in range(2)]
        runs += [Run(model="m", scenario="s", variant=f"hf:layer{i}:eager:fp32", backend="torch-cuda",
                     mode="compile", repeat=0, engine="test", skipped=True, skip_reason=f"failed: reason {i}",
                     vocab=4, steps=2) for i in range(table.MAX_NOTES + 5)]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.h5")
            write_report(path, runs, {"tool_version": "t", "git_commit": "x", "host": "h", "device": "d",
                                      "math_mode": "m"})
            lines = table.table_lines([path])
        self.assertEqual(lines[0], "m s torch-cuda (no gate report)")
        rows = lines[2:2 + 1 + 2 + table.MAX_NOTES + 5]
        self.assertRegex(rows[0], r"^fp32 +roll +eager +eager +0 \(2 skipped\)")
        self.assertRegex(rows[3], r"^fp32 +layer0 +eager +compile +0 \(1 failed\)")
        notes = lines[2 + len(rows):]
        self.assertEqual(len(notes), table.MAX_NOTES + 1)
        self.assertEqual(notes[0], "  fp32 roll eager eager: why 0")
        # one message of several lines is said once
        self.assertEqual(notes[1], "  fp32 twin0 eager compile (and 1 more lines): failed: the same")
        self.assertEqual(notes[2], "  fp32 layer0 eager compile: failed: reason 0")
        self.assertEqual(notes[-1], "  ... and 7 more (the captures' skip reasons and the gate's report hold them all)")


class TableFailedRunTest(unittest.TestCase):
    """A run the engine could not complete is noted once under the table
    (its reason), not again for the gate's `finite` comparison that fails it."""

    def test_failed_run_noted_once(self) -> None:
        import h5py

        from kvrepro import table
        from kvrepro.report import COMPARISON_DTYPE, Run, write_report

        run = Run(model="m", scenario="s", variant="hf:roll:flex_attention:bf16", backend="torch-cuda", mode="eager",
                  repeat=0, engine="test", skipped=True, skip_reason="failed: InductorError: boom", vocab=4, steps=2)
        with tempfile.TemporaryDirectory() as d:
            cap, gate = os.path.join(d, "c.h5"), os.path.join(d, "g.h5")
            root = {"tool_version": "t", "git_commit": "x", "host": "h", "device": "d", "math_mode": "m"}
            write_report(cap, [run], root)
            write_report(gate, [run], root)
            with h5py.File(gate, "r+") as f:   # the gate's finite comparison of the run
                del f["comparisons"]
                c = np.zeros(1, COMPARISON_DTYPE)
                c["kind"], c["run_a"], c["run_b"], c["verdict"] = 5, 0, 0, 1
                c["message"] = b"the run did not complete: InductorError: boom"
                f.create_dataset("comparisons", data=c)
            lines = table.table_lines([cap], gate)
        self.assertRegex(lines[2], r"^bf16 +roll +flex_attention +eager +0 \(1 failed\)")
        self.assertEqual(lines[3:], ["  bf16 roll flex_attention eager: failed: InductorError: boom"])


class CudagraphSkipsTest(unittest.TestCase):
    """A reduce-overhead run records how often inductor skipped its CUDA
    graphs and the first reason, from torch's own counter and log (its
    steps are then not replays), and the table marks its ms/step."""

    def test_counts_torchs_skips(self) -> None:
        from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

        from kvrepro.capture import CudagraphSkips

        with redirect_stderr(io.StringIO()):
            with CudagraphSkips() as skips:
                log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (2 instances)")
                log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (arg0_1)")
            log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to a later run")
        self.assertEqual(skips.count, 2)
        self.assertEqual(skips.first, "skipping cudagraphs due to mutated inputs (2 instances)")

    def test_table_marks_runs_without_graphs(self) -> None:
        from kvrepro import table
        from kvrepro.report import Run, margins_of, write_report

        logits = np.arange(2 * 1 * 4, dtype=np.float32).reshape(2, 1, 4)
        runs = []
        for r, skipped in enumerate((0, 3)):
            extra = {"cudagraph_skips": skipped, "cudagraph_records": 1, "attn_impl": "eager", "dtype": "fp32",
                     "cache_layer": "roll"}
            if skipped:
                extra["cudagraph_skip"] = "skipping cudagraphs due to mutated inputs (1 instances)"
            runs.append(Run(model="m", scenario="s", variant="hf:roll:eager:fp32", backend="torch-cuda",
                            mode="reduce-overhead", repeat=r, engine="test", vocab=4, steps=2,
                            prompt=np.zeros((1, 2), np.int32), prompt_real=np.ones((1, 2), np.uint8),
                            tokens=np.argmax(logits, -1).astype(np.int32), logits=logits, margins=margins_of(logits),
                            probe_names=["logits"], probe_hash=np.zeros((2, 1, 1), np.uint64), graphs_captured=1,
                            recompiles=0, graph_budget=2, extra=extra, step_ms=np.array([50.0]), steady_from=0,
                            step_ms_steady=[0.5, 0.7][r], prefill_ms=3.0, compile_ms=50.0))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.h5")
            write_report(path, runs, {"tool_version": "t", "git_commit": "x", "host": "h", "device": "d",
                                      "math_mode": "m"})
            lines = table.table_lines([path])
        self.assertRegex(lines[2], r"^fp32 +roll +eager +reduce-overhead +2 +- +- +- +1/2 cg1 +0 +0.600 "
                                   r"\[0.500-0.700\]\* +3.000 +0.050$")
        self.assertEqual(lines[3], "  fp32 roll eager reduce-overhead: * CUDA graphs skipped in 1 of 2 runs, their "
                                   "steps are not replays: skipping cudagraphs due to mutated inputs (1 instances)")


class CliInputTest(unittest.TestCase):
    def run_cli(self, argv: list[str]) -> tuple[int, str]:
        err = io.StringIO()
        with redirect_stderr(err):
            try:
                rc = cli.main(argv)
            except SystemExit as e:  # argparse usage errors
                rc = int(e.code)
        return rc, err.getvalue()

    def test_bad_inputs_exit_2_naming_the_file(self) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        model = os.path.join(here, "..", "..", "fixtures", "hf", "mistral")
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "p.json")
            cases = [("[[1, 2], []]", "prompt 1"), ("{}", "format"), ("[[1, -3]]", "token 1"),
                     ("[[1, 2", "not JSON"), ("[[1, 9999]]", "vocab_size")]
            for text, want in cases:
                with open(bad, "w") as f:
                    f.write(text)
                rc, msg = self.run_cli(["capture", "--model", model, "--prompts", bad, "--max-new-tokens", "2",
                                        "--out", os.path.join(d, "o.h5")])
                self.assertEqual(rc, 2, msg)
                self.assertIn(bad, msg)
                self.assertIn(want, msg)
            with open(bad, "w") as f:
                json.dump([[1, 2]], f)
            rc, msg = self.run_cli(["capture", "--model", os.path.join(d, "nope"), "--prompts", bad,
                                    "--max-new-tokens", "2", "--out", os.path.join(d, "o.h5")])
            self.assertEqual(rc, 2)
            self.assertIn("nope", msg)
            rc, msg = self.run_cli(["capture", "--model", model, "--prompts", bad, "--max-new-tokens", "2",
                                    "--cache", "ring", "--out", os.path.join(d, "o.h5")])
            self.assertEqual(rc, 2)
            self.assertIn("ring", msg)
            rc, msg = self.run_cli(["capture", "--model", model, "--prompts", bad, "--max-new-tokens", "2",
                                    "--out", os.path.join(d, "no", "such", "o.h5")])
            self.assertEqual(rc, 2)
            self.assertIn("cannot create", msg)
            self.assertFalse(os.path.exists(os.path.join(d, "o.h5")))


if __name__ == "__main__":
    unittest.main()
