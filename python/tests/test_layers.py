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
