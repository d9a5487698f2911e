"""The transformers lane end to end on the committed tiny checkpoints
(fixtures/hf/gemma2, fixtures/hf/mistral): kvrepro-hf capture, then the C
tool's `gate --external` and `bisect` (KVREPRO_BIN, default build/kvrepro).

Prompts: the goldens' padded batch (a 24-token prompt, 3W, and a 3-token one
left-padded to it), so every decode crosses the window (W = 8) and the long
prompt's prefill is longer than W.

Run one group:  python -m unittest test_hf_lane.EagerTest
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

from kvrepro.caches import CUSTOM, LAYERS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KVREPRO = os.environ.get("KVREPRO_BIN", os.path.join(ROOT, "build", "kvrepro"))
N_NEW = 40
W = 8


def model_dir(family: str) -> str:
    return os.path.join(ROOT, "fixtures", "hf", family)


def golden_prompts(family: str) -> list[list[int]]:
    with h5py.File(os.path.join(model_dir(family), "golden.h5"), "r") as f:
        g = f["scenarios/padded_batch"]
        ids, real = g["input_ids"][:], g["attention_mask"][:]
    return [[int(t) for t, m in zip(r, mm) if m] for r, mm in zip(ids, real)]


def capture(tmp: str, family: str, out: str, *args: str) -> str:
    prompts = os.path.join(tmp, f"{family}.json")
    with open(prompts, "w") as f:
        json.dump(golden_prompts(family), f)
    cmd = [sys.executable, "-m", "kvrepro.cli", "capture", "--model", model_dir(family), "--prompts", prompts,
           "--scenario", "padded_batch", "--max-new-tokens", str(N_NEW), "--out", out, *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout, end="")
    if p.returncode != 0:
        raise AssertionError(f"capture exited {p.returncode}: {p.stderr[-3000:]}")
    return p.stdout


def gate(family: str, report: str, *externals: str) -> tuple[int, str]:
    cmd = [KVREPRO, "gate", "--model", model_dir(family), "--report", report]
    for e in externals:
        cmd += ["--external", e]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout, end="")
    return p.returncode, p.stdout + p.stderr


def comparisons(report: str) -> list[dict]:
    """Every comparison with the labels of its two runs."""
    out = []
    with h5py.File(report, "r") as f:
        runs = {}
        for name, g in f["runs"].items():
            runs[int(name)] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
        for c in f["comparisons"][:]:
            out.append({"kind": int(c["kind"]), "verdict": int(c["verdict"]), "message": c["message"].decode(),
                        "a": runs[int(c["run_a"])], "b": runs[int(c["run_b"])],
                        "first_step": int(c["first_step"])})
    return out


KIND = {"reference": 0, "repeat": 1, "finite": 5, "compiled_vs_eager": 6, "graph_budget": 7}
PASS, FAIL = 0, 1


def setUpModule() -> None:
    if not os.access(KVREPRO, os.X_OK):
        raise unittest.SkipTest(f"{KVREPRO} not built")


class EagerTest(unittest.TestCase):
    """Every LAYER in eager agrees with the C reference: tokens identical
    where the margin is clear, logits within the gate's tolerance."""

    def check_family(self, family: str, attn: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            runs = os.path.join(tmp, "runs.h5")
            capture(tmp, family, runs, "--cache", ",".join(LAYERS), "--attn", attn)
            rc, out = gate(family, os.path.join(tmp, "gate.h5"), runs)
            self.assertEqual(rc, 0, out)
            cmps = comparisons(os.path.join(tmp, "gate.h5"))
            ref = [c for c in cmps if c["kind"] == KIND["reference"] and c["b"]["backend"] == "torch-cpu"]
            ran = {c["b"]["variant"] for c in ref}
            want = {f"hf:{layer}:{a}:fp32" for layer in LAYERS for a in attn.split(",")}
            skipped = {f"hf:{layer}:sdpa:fp32" for layer in LAYERS} if family == "gemma2" else set()
            self.assertEqual(ran, want - skipped)
            for c in ref:
                self.assertEqual(c["verdict"], PASS, c["message"])
            with h5py.File(runs, "r") as f:
                for g in f["runs"].values():
                    if g.attrs["skipped"]:
                        self.assertIn("sdpa", g.attrs["skip_reason"].decode())
                        continue
                    # the goldens' tokens (transformers' own generate) as an independent check
                    with h5py.File(os.path.join(model_dir(family), "golden.h5"), "r") as gold:
                        np.testing.assert_array_equal(g["tokens"][:], gold["scenarios/padded_batch/tokens"][:])

    def test_mistral(self) -> None:
        self.check_family("mistral", "eager,sdpa")

    def test_gemma2(self) -> None:
        self.check_family("gemma2", "eager,sdpa")


class CompileTest(unittest.TestCase):
    """torch.compile on the CPU for static_sliding and always_roll: repeats
    bitwise equal, compiled within tolerance of eager, and the decode graph
    counts as dynamo reported them."""

    def test_mistral_compile(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            runs = os.path.join(tmp, "runs.h5")
            out = capture(tmp, "mistral", runs, "--cache", "static_sliding,always_roll",
                          "--mode", "eager,compile", "--repeats", "2")
            rc, gout = gate("mistral", os.path.join(tmp, "gate.h5"), runs)
            cmps = comparisons(os.path.join(tmp, "gate.h5"))
            graphs = {}
            with h5py.File(runs, "r") as f:
                for g in f["runs"].values():
                    if g.attrs["mode"] == b"compile":
                        n, rec = int(g.attrs["graphs_captured"]), int(g.attrs["recompiles"])
                        key = (g.attrs["variant"].decode(), int(g.attrs["repeat"]))
                        graphs[key] = (n, rec)
                        # two of dynamo's own reports agree: graphs compiled for the decode
                        # (counters["stats"]["unique_graphs"]) = its recompile messages + 1
                        self.assertEqual(n, rec + 1, key)
                        print(f"{key}: {n} decode graphs, {rec} recompiles")
            self.assertEqual(graphs[("hf:always_roll:eager:fp32", 0)], (1, 0))
            self.assertEqual(graphs[("hf:always_roll:eager:fp32", 1)], (1, 0))
            self.assertIn("1 decode graphs, 0 recompiles", out)
            for c in cmps:
                if c["kind"] in (KIND["repeat"], KIND["compiled_vs_eager"], KIND["reference"], KIND["finite"]):
                    self.assertEqual(c["verdict"], PASS, c["message"])
            budget = [c for c in cmps if c["kind"] == KIND["graph_budget"]]
            self.assertEqual(len(budget), 4)
            over = False
            for c in budget:
                n = int(c["b"]["graphs_captured"])
                self.assertEqual(c["verdict"], FAIL if n > int(c["b"]["graph_budget"]) else PASS, c["message"])
                over |= c["verdict"] == FAIL
            self.assertEqual(rc, 1 if over else 0, gout)
            self.assertEqual(len([c for c in cmps if c["kind"] == KIND["repeat"]]), 4)  # 2 eager + 2 compile


def first_admitted_difference(prompt_lens: list[int], pad_to: int) -> int:
    """The first decode step at which always_roll_off_by_one's mask admits a
    different set of real positions than always_roll's, for any row: where
    the planted bug starts to matter. Computed from the layers' own mappings,
    not from a model."""
    good, bad = CUSTOM["always_roll"](W), CUSTOM["always_roll_off_by_one"](W)
    for step in range(1, N_NEW):
        seen = pad_to + step - 1
        q = seen
        truth = good.key_positions(seen, 1)             # what each slot really holds
        for row_len in prompt_lens:
            first_real = pad_to - row_len

            def admitted(claims: list[int]) -> set[int]:
                return {truth[c] for c, p in enumerate(claims)
                        if p >= 0 and q - W < p <= q and p >= first_real and truth[c] >= 0}
            if admitted(good.key_positions(seen, 1)) != admitted(bad.key_positions(seen, 1)):
                return step
    return -1


class BrokenLayerTest(unittest.TestCase):
    """Deliberately broken custom layers are caught, at the first step where
    the bug matters, with the layer named by the probe hashes."""

    def test_gemma2_broken(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            runs = os.path.join(tmp, "runs.h5")
            capture(tmp, "gemma2", runs, "--cache", "always_roll,always_roll_off_by_one,index_copy,index_copy_first_w")
            rc, out = gate("gemma2", os.path.join(tmp, "gate.h5"), runs)
            self.assertEqual(rc, 1, out)
            ref = {c["b"]["variant"]: c for c in comparisons(os.path.join(tmp, "gate.h5"))
                   if c["kind"] == KIND["reference"]}
            self.assertEqual(ref["hf:always_roll:eager:fp32"]["verdict"], PASS)
            self.assertEqual(ref["hf:index_copy:eager:fp32"]["verdict"], PASS)
            self.assertEqual(ref["hf:always_roll_off_by_one:eager:fp32"]["verdict"], FAIL)
            self.assertEqual(ref["hf:index_copy_first_w:eager:fp32"]["verdict"], FAIL)
            lens = [len(p) for p in golden_prompts("gemma2")]
            want_step = first_admitted_difference(lens, max(lens))
            self.assertGreater(want_step, 0)
            for good, bad, step, probe in ((0, 1, want_step, "layer0.attn"), (2, 3, 0, "layer0.cache")):
                p = subprocess.run([KVREPRO, "bisect", runs, "--run", str(good), "--run", str(bad)],
                                   capture_output=True, text=True)
                print(p.stdout, end="")
                self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
                m = re.search(r"first divergence: step (\d+), row (\d+), probe (\S+)", p.stdout)
                self.assertIsNotNone(m, p.stdout)
                self.assertEqual((int(m.group(1)), m.group(3)), (step, probe), p.stdout)


if __name__ == "__main__":
    unittest.main()
