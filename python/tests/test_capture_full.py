"""A capture of a model with a large vocabulary keeps the full logits of every
run, so that `kvrepro gate --external` judges the reference agreement, the
compiled-vs-eager agreement and the `finite` check on every logit, not on
each row's top 16. Repeats bitwise equal to an earlier
run share its logits dataset (a hard link: stored once), unless the links
would ask the C reader for more than its budget for the file.

The model is a random gemma3_text of the committed fixture's shape with a
70000-token vocabulary (above the 65536 at which captures used to keep the
top 16), hidden size 16: ~1.2M parameters, written by the test. CPU, eager:
~20 s."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

from kvrepro import report
from kvrepro.fnv import fnv1a64_rows

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "fixtures", "hf", "gemma3_text")
VOCAB = 70000
STEPS = 4
TIMEOUT_S = 600
PROMPTS = [[5, 17, 42, 7, 99, 3, 8, 1, 2, 3, 60001, 7], [11, 12, 69999, 14]]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    env["OMP_NUM_THREADS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def write_model(directory: str) -> None:
    """The fixture's gemma3_text config with VOCAB tokens and hidden size
    16, random weights (seed 0), as a Hugging Face directory."""
    import torch
    import transformers

    with open(os.path.join(FIXTURE, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_attention_heads=2,
               num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8)
    config = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)


def comparisons(path: str) -> list[dict]:
    with h5py.File(path, "r") as f:
        return [{"kind": int(r["kind"]), "run_a": int(r["run_a"]), "run_b": int(r["run_b"]),
                 "verdict": int(r["verdict"]), "message": r["message"].decode(), "kl": float(r["kl"])}
                for r in f["comparisons"][:]]


KIND_REFERENCE, KIND_REPEAT, KIND_FINITE = 0, 1, 5
PASS, FAIL = 0, 1


class CaptureFullLogitsTest(unittest.TestCase):
    tmp = ""
    model = ""
    capture = ""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="kv-capfull-")
        cls.model = os.path.join(cls.tmp, "bigvocab")
        write_model(cls.model)
        prompts = os.path.join(cls.tmp, "p.json")
        with open(prompts, "w") as f:
            json.dump(PROMPTS, f)
        cls.capture = os.path.join(cls.tmp, "run.h5")
        p = run([sys.executable, "-m", "kvrepro.cli", "capture", "--model", cls.model, "--prompts", prompts,
                 "--max-new-tokens", str(STEPS), "--cache", "static_sliding", "--mode", "eager",
                 "--attn", "eager", "--dtype", "fp32", "--repeats", "2", "--out", cls.capture])
        if p.returncode != 0:
            raise AssertionError(f"capture failed ({p.returncode}): {p.stderr[-2000:]}")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def kvrepro(self) -> str:
        binary = os.environ.get("KVREPRO_BIN", "")
        if not binary or not os.access(binary, os.X_OK):
            self.skipTest("no KVREPRO_BIN (run through ctest, which gives the built kvrepro)")
        return binary

    def gate(self, capture: str, out: str) -> subprocess.CompletedProcess:
        return run([self.kvrepro(), "gate", "--quiet", "--model", self.model, "--external", capture,
                    "--report", out, "--no-calibrate"])

    def test_every_run_keeps_full_logits(self) -> None:
        with h5py.File(self.capture, "r") as f:
            runs = [f["runs"][k] for k in f["runs"]]
            self.assertEqual(len(runs), 2)
            for g in runs:
                self.assertEqual(int(g.attrs["topk"]), 0, f"{g.name} keeps only its top-k")
                self.assertNotIn("topk_ids", g)
                self.assertEqual(g["logits"].shape, (STEPS, len(PROMPTS), VOCAB))
                s, b, v = g["logits"].shape
                rows = np.ascontiguousarray(g["logits"][:], dtype="<f4").reshape(s * b, v)
                np.testing.assert_array_equal(fnv1a64_rows(rows).reshape(s, b), g["logits_hash"][:])
            # repeat 1 is bitwise repeat 0 (a deterministic CPU eager decode):
            # the same dataset, stored once
            self.assertEqual(runs[0]["logits"], runs[1]["logits"])
            self.assertGreater(runs[0]["logits"].id.get_storage_size(), 0)

    def test_gate_judges_every_logit(self) -> None:
        out = os.path.join(self.tmp, "g.h5")
        p = self.gate(self.capture, out)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        refs = [c for c in comparisons(out) if c["kind"] == KIND_REFERENCE]
        self.assertEqual(len(refs), 2)
        for c in refs:
            self.assertEqual(c["verdict"], PASS, c["message"])
            # over the full rows: no top-k note, and a KL (top-k values are
            # no distribution: the gate writes NaN there)
            self.assertNotIn("only the top-", c["message"])
            self.assertTrue(np.isfinite(c["kl"]), c)

    def test_nan_outside_the_top16_fails(self) -> None:
        """A NaN at a row's smallest logit (far outside its top 16), its row
        hashes consistent as an engine that produced it would record them:
        the `finite` check names it, and so does the reference agreement."""
        planted = os.path.join(self.tmp, "nan.h5")
        shutil.copyfile(self.capture, planted)
        step, row = 1, 0
        with h5py.File(planted, "r+") as f:
            g = f["runs/0000"]
            logits = g["logits"][:]
            tid = int(np.argmin(logits[step, row]))
            self.assertNotIn(tid, np.argsort(-logits[step, row], kind="stable")[:16])
            logits[step, row, tid] = np.nan
            g["logits"][step, row, tid] = np.nan   # run 0001 links the same dataset
            s, b, v = logits.shape
            lh = fnv1a64_rows(np.ascontiguousarray(logits, dtype="<f4").reshape(s * b, v)).reshape(s, b)
            for name in ("0000", "0001"):
                r = f["runs"][name]
                self.assertTrue(np.isnan(r["logits"][step, row, tid]))
                r["logits_hash"][...] = lh
                probes = [n.decode() for n in r["probe_names"][:]]
                ph = r["probe_hash"][:]
                ph[:, probes.index("logits"), :] = lh
                r["probe_hash"][...] = ph
        out = os.path.join(self.tmp, "g-nan.h5")
        p = self.gate(planted, out)
        self.assertEqual(p.returncode, 1, p.stdout[-2000:] + p.stderr[-2000:])
        cmps = comparisons(out)
        for x in (1, 2):   # the external runs follow the reference run 0
            fin = [c for c in cmps if c["kind"] == KIND_FINITE and c["run_b"] == x]
            self.assertEqual(len(fin), 1)
            self.assertEqual(fin[0]["verdict"], FAIL, fin[0]["message"])
            self.assertIn(f"step {step} row {row}, token id {tid}", fin[0]["message"])
            ref = [c for c in cmps if c["kind"] == KIND_REFERENCE and c["run_b"] == x]
            self.assertEqual(ref[0]["verdict"], FAIL, ref[0]["message"])
            self.assertIn(f"token id {tid}", ref[0]["message"])
        self.assertIn(f"token id {tid}", p.stdout)


def synthetic_run(logits: np.ndarray, repeat: int) -> report.Run:
    s, b, _ = logits.shape
    return report.Run(model="m", scenario="s", variant="hf:static_sliding:eager:fp32", backend="torch-cpu",
                      mode="eager", repeat=repeat, engine="test", prompt=np.ones((b, 2), np.int32),
                      prompt_real=np.ones((b, 2), np.uint8), tokens=np.zeros((s, b), np.int32),
                      logits=logits, margins=np.zeros((s, b), np.float32), probe_names=["logits"],
                      probe_hash=np.zeros((s, 1, b), np.uint64), vocab=logits.shape[2], steps=s)


ROOT_ATTRS = {"tool_version": "t", "git_commit": "t", "host": "t", "device": "t", "math_mode": "t"}


class SharedLogitsBudgetTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="kv-capfull-")

    def tearDown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_identical_runs_linked_within_budget(self) -> None:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((2, 2, VOCAB)).astype(np.float32)
        b = a.copy()
        b[1, 1, 5] = np.nextafter(b[1, 1, 5], np.float32(9))   # one ulp: not bitwise a
        runs = [synthetic_run(a, 0), synthetic_run(a.copy(), 1), synthetic_run(b, 2)]
        out = os.path.join(self.tmp, "r.h5")
        report.write_report(out, runs, ROOT_ATTRS)
        with h5py.File(out, "r") as f:
            d = [f[f"runs/000{i}/logits"] for i in range(3)]
            self.assertEqual(d[0], d[1])
            self.assertNotEqual(d[0], d[2])
            np.testing.assert_array_equal(d[2][:], b)

    def test_links_dropped_over_the_read_budget(self) -> None:
        """Identical logits that deflate to almost nothing: linked, the file
        would ask the C reader for more than max(64 MiB, 1032 x its size);
        so every run stores its own copy, as the C writer does."""
        zeros = np.zeros((4, 64, VOCAB), np.float32)   # 72 MB a run as read
        runs = [synthetic_run(zeros, 0), synthetic_run(zeros, 1)]
        out = os.path.join(self.tmp, "r.h5")
        report.write_report(out, runs, ROOT_ATTRS)
        size = os.path.getsize(out)
        self.assertLessEqual(report.read_cost(runs), report.read_budget(size))
        with h5py.File(out, "r") as f:
            self.assertNotEqual(f["runs/0000/logits"], f["runs/0001/logits"])
            np.testing.assert_array_equal(f["runs/0001/logits"][0, :2, :3], 0)
        # the control: linked, the file is over its budget (and the C reader refuses it)
        self.assertEqual(report.logits_twins(runs), [-1, 0])
        linked = os.path.join(self.tmp, "linked.h5")
        with open(linked, "w+b") as fobj:
            report._write_file(fobj, runs, ROOT_ATTRS, [-1, 0])
        self.assertGreater(report.read_cost(runs), report.read_budget(os.path.getsize(linked)))
        binary = os.environ.get("KVREPRO_BIN", "")
        if binary and os.access(binary, os.X_OK):
            for path, rc in ((out, 0), (linked, 2)):
                p = run([binary, "show", path])
                self.assertEqual(p.returncode, rc, f"kvrepro show {path}: {p.stdout[-500:]} {p.stderr[-500:]}")


if __name__ == "__main__":
    unittest.main()
