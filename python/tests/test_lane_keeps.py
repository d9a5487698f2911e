"""What the capture keeps, on the committed tiny checkpoints (fixtures/hf),
CPU, eager:

- the prefill asks the model for the last position's logits only (as
  transformers' generate does): every family takes the keyword, the
  prefill's forward is called with it and returns one position, and the
  decode steps' forwards are called as before (their compiled graphs and
  guards unchanged);
- transformers' compileable cache gets its 4-D masks built before the
  forward, as generate builds them, with the same logits;
- `capture --scenario NAME` without prompts decodes the gate's batch of NAME
  (the ids and steps `kvrepro gate` runs, full and real scale);
- every run records its timings (prefill, each decode step, the steady
  per-step time) and the C reader takes the file;
- the probe hashes of a capture that hashes only what changed
  (capture.ProbeMemo) are those of hashing everything;
- SIGTERM stops a capture, which writes the runs it completed;
- `kvrepro-hf table` on a capture and its gate, and scripts/gpu-hf.sh run on
  the CPU (DEVICE=cpu) end to end.

About a minute and a half on 2 cores (KVREPRO_BIN: the C tool, default
build/kvrepro; the tests that need it are skipped without it)."""

import functools
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch

from kvrepro import capture, scenarios

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KVREPRO = os.environ.get("KVREPRO_BIN", os.path.join(ROOT, "build", "kvrepro"))
TIMEOUT_S = 600
FAMILIES = ("mistral", "gemma2", "gemma3_text", "qwen2", "gpt_oss")
STEPS = 3


def model_dir(family: str) -> str:
    return os.path.join(ROOT, "fixtures", "hf", family)


def spy_forward(model: torch.nn.Module) -> list[tuple[dict, tuple[int, ...]]]:
    """Replaces model.forward by a wrapper (same signature: functools.wraps)
    that records each call's keyword arguments but the tensors, and the
    shape of the logits it returned."""
    calls: list[tuple[dict, tuple[int, ...]]] = []
    orig = model.forward

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        out = orig(*args, **kwargs)
        seen = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)
                and k != "past_key_values"}
        seen["n_input"] = int(kwargs["input_ids"].shape[1])
        calls.append((seen, tuple(out.logits.shape)))
        return out

    model.forward = forward
    return calls


class PrefillLastPositionTest(unittest.TestCase):
    def test_every_family_takes_the_keyword(self) -> None:
        for family in FAMILIES:
            with self.subTest(family=family):
                model = capture.load_model(model_dir(family), "eager", "fp32", "cpu")
                self.assertEqual(capture.last_logits_kwargs(model), {"logits_to_keep": 1})

    def test_prefill_computes_one_position(self) -> None:
        for family in ("gemma2", "gpt_oss"):
            with self.subTest(family=family):
                model = capture.load_model(model_dir(family), "eager", "fp32", "cpu")
                calls = spy_forward(model)
                prompts = [[5, 17, 42, 7, 99, 3, 8, 1, 2, 3, 4, 5], [11, 12, 13, 14]]
                ids, real = capture.left_pad(prompts)
                spec = capture.CaptureSpec(model_dir=model_dir(family), prompts=prompts,
                                           scenario="t", new_tokens=STEPS, layer="static_sliding",
                                           mode="eager", impl="eager", dtype="fp32", repeats=1,
                                           device="cpu")
                run = capture.decode(model, spec, ids, real, 0)
                b, p = ids.shape
                self.assertEqual(len(calls), STEPS)
                prefill, prefill_shape = calls[0]
                self.assertEqual(prefill["n_input"], p)
                self.assertEqual(prefill.get("logits_to_keep"), 1,
                                 f"the prefill forward was called with {prefill}")
                # one position of logits, not p: the B x P x V tensor is never made
                self.assertEqual(prefill_shape, (b, 1, model.config.vocab_size))
                for kwargs, shape in calls[1:]:
                    self.assertEqual(kwargs["n_input"], 1)
                    self.assertNotIn("logits_to_keep", kwargs)
                    self.assertEqual(shape, (b, 1, model.config.vocab_size))
                self.assertTrue(np.isfinite(run.logits).all())



def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    env["HF_HUB_OFFLINE"] = "1"
    return env


def kvrepro_hf(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvrepro.cli", *argv], capture_output=True, text=True,
                          env=_env(), timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def need_kvrepro(test: unittest.TestCase) -> None:
    if not os.access(KVREPRO, os.X_OK):
        test.skipTest(f"{KVREPRO} not built (KVREPRO_BIN)")


def gate_external(model: str, report: str, *captures: str) -> subprocess.CompletedProcess:
    cmd = [KVREPRO, "gate", "--model", model, "--report", report, "--no-calibrate"]
    for c in captures:
        cmd += ["--external", c]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def real_rows(g: h5py.Group) -> list[list[int]]:
    return [[int(t) for t, m in zip(r, mm) if m] for r, mm in zip(g["prompt"][:], g["prompt_real"][:])]


def mistral_at(tmp: str, window: int) -> str:
    """fixtures/hf/mistral with sliding_window `window` (its weights linked)."""
    d = os.path.join(tmp, f"mistral-w{window}")
    os.mkdir(d)
    with open(os.path.join(model_dir("mistral"), "config.json")) as f:
        cfg = json.load(f)
    cfg["sliding_window"] = window
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    os.symlink(os.path.join(model_dir("mistral"), "model.safetensors"), os.path.join(d, "model.safetensors"))
    return d


class GenerateMasksTest(unittest.TestCase):
    """transformers' own compileable cache (static_sliding) gets its 4-D
    masks built before the forward, as generate builds them (a compiled
    decode then sees masks of one shape); the logits and probe hashes are
    bitwise those of passing the 2-D mask. dynamic_sliding (not
    compileable) is passed the 2-D mask, as generate passes it."""

    def test_masks_as_generate_builds_them(self) -> None:
        for family in ("gemma2", "mistral"):
            model = capture.load_model(model_dir(family), "eager", "fp32", "cpu")
            prompts = [[5, 17, 42, 7, 99, 3, 8, 1, 2, 3, 4, 5, 6, 7], [11, 12, 13]]
            ids, real = capture.left_pad(prompts)
            for layer in ("static_sliding", "dynamic_sliding"):
                with self.subTest(family=family, layer=layer):
                    spec = capture.CaptureSpec(model_dir=model_dir(family), prompts=prompts, scenario="t",
                                               new_tokens=12, layer=layer, mode="eager", impl="eager", dtype="fp32",
                                               repeats=1, device="cpu")
                    masks: list[object] = []
                    orig = model.forward

                    @functools.wraps(orig)
                    def forward(*args, **kwargs):
                        masks.append(kwargs["attention_mask"])
                        return orig(*args, **kwargs)

                    model.forward = forward
                    try:
                        run = capture.decode(model, spec, ids, real, 0)
                    finally:
                        model.forward = orig
                    two_d = [isinstance(m, torch.Tensor) and m.dim() == 2 for m in masks]
                    self.assertEqual(two_d, [layer == "dynamic_sliding"] * len(masks))
                    if layer == "dynamic_sliding":
                        continue
                    saved = capture.generate_masks
                    capture.generate_masks = lambda _m, am, *_a: am   # the forward builds them from the 2-D mask
                    try:
                        plain = capture.decode(model, spec, ids, real, 0)
                    finally:
                        capture.generate_masks = saved
                    np.testing.assert_array_equal(run.logits.view(np.uint32), plain.logits.view(np.uint32))
                    np.testing.assert_array_equal(run.probe_hash, plain.probe_hash)


class GateScenarioTest(unittest.TestCase):
    """scenarios.build gives the batch and steps `kvrepro gate` runs under
    each scenario name (harness/scenario.c), at full scale (W 8) and real
    scale (W 64); `capture --scenario NAME` without prompts decodes it."""

    def test_batches_are_the_gates(self) -> None:
        need_kvrepro(self)
        with tempfile.TemporaryDirectory() as tmp:
            for model in (model_dir("gemma2"), mistral_at(tmp, 64)):
                report = os.path.join(tmp, "gate.h5")
                p = subprocess.run([KVREPRO, "gate", "--model", model, "--scenarios", ",".join(scenarios.NAMES),
                                    "--variants", "index_copy", "--backends", "cpu", "--modes", "eager",
                                    "--repeats", "1", "--no-calibrate", "--no-goldens", "--report", report],
                                   capture_output=True, text=True, timeout=TIMEOUT_S)
                self.assertIn(p.returncode, (0, 1), p.stderr)
                with open(os.path.join(model, "config.json")) as f:
                    cfg = json.load(f)
                seen = set()
                with h5py.File(report, "r") as f:
                    for g in f["runs"].values():
                        if g.attrs["variant"] != b"reference":
                            continue
                        name = g.attrs["scenario"].decode()
                        if name not in scenarios.NAMES:
                            continue   # the gate's own twins (a fresh run), not a batch
                        with self.subTest(model=os.path.basename(model), scenario=name):
                            want = scenarios.build(name, cfg)
                            self.assertEqual(real_rows(g), want.prompts)
                            self.assertEqual(int(g.attrs["steps"]), want.new_tokens)
                            self.assertTrue((g["prompt_real"][:, -1] == 1).all())   # left-padded
                        seen.add(name)
                self.assertEqual(seen, set(scenarios.NAMES))

    def test_unknown_scenario_without_prompts_is_refused(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "o.h5")
            for extra, want in (([], "--scenario"), (["--scenario", "mine"], "'mine'")):
                p = kvrepro_hf("capture", "--model", model_dir("mistral"), "--out", out, *extra)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(want, p.stderr)
                self.assertIn("left_padded_batch", p.stderr)
                self.assertFalse(os.path.exists(out))


class TimingsTest(unittest.TestCase):
    """A capture of the gate's left-padded batch: the gate's prompts and
    steps, every run's timings recorded (the schema's `seconds`, and
    prefill_ms, step_ms, steady_from, step_ms_steady, compile_ms), printed,
    and the C reader takes the file (`gate --external` passes it)."""

    def test_capture_of_the_gate_batch_with_timings(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "runs.h5")
            p = kvrepro_hf("capture", "--model", model_dir("mistral"), "--scenario", "left_padded_batch",
                           "--cache", "static_sliding,always_roll", "--repeats", "2", "--out", out)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(model_dir("mistral"), "config.json")) as f:
                want = scenarios.build("left_padded_batch", json.load(f))
            with h5py.File(out, "r") as f:
                runs = list(f["runs"].values())
                self.assertEqual(len(runs), 4)
                for g in runs:
                    a = g.attrs
                    self.assertEqual(a["scenario"], b"left_padded_batch")
                    self.assertEqual(real_rows(g), want.prompts)
                    self.assertEqual(int(a["steps"]), want.new_tokens)
                    step_ms = a["step_ms"]
                    self.assertEqual(step_ms.shape, (want.new_tokens - 1,))
                    self.assertTrue((step_ms > 0).all())
                    self.assertEqual(int(a["steady_from"]), 1)
                    self.assertEqual(float(a["step_ms_steady"]), float(np.median(step_ms[1:])))
                    self.assertGreater(float(a["prefill_ms"]), 0)
                    self.assertAlmostEqual(float(a["seconds"]), (float(a["prefill_ms"]) + step_ms.sum()) / 1e3,
                                           places=9)
                    self.assertEqual(float(a["compile_ms"]), 0.0)
            self.assertIn(" ms/step steady (median of decode steps 1..", p.stdout)
            if os.access(KVREPRO, os.X_OK):
                g = gate_external(model_dir("mistral"), os.path.join(tmp, "gate.h5"), out)
                self.assertEqual(g.returncode, 0, g.stdout + g.stderr)


class ForgetfulMemo(capture.ProbeMemo):
    """Hashes every slice of every probe at every step (no memory)."""

    def row_hashes(self, name: str, rows: torch.Tensor, labels: list) -> np.ndarray:
        return capture.probe_row_hashes(rows)


class ProbeMemoTest(unittest.TestCase):
    """A capture's probe hashes with the memo (each step hashing only the
    slices that changed, the memo shared by every run of the model) are
    those of hashing everything, whatever the layer: transformers' own, a
    custom one, one whose cache holds the wrong rows."""

    def test_memo_hashes_as_hashing_everything(self) -> None:
        model = capture.load_model(model_dir("gemma2"), "eager", "fp32", "cpu")
        prompts = [[5, 17, 42, 7, 99, 3, 8, 1, 2, 3, 4, 5, 6, 7], [11, 12, 13]]
        ids, real = capture.left_pad(prompts)
        shared = capture.ProbeMemo()
        for layer in ("static_sliding", "index_copy_first_w", "always_roll"):
            spec = capture.CaptureSpec(model_dir=model_dir("gemma2"), prompts=prompts, scenario="t", new_tokens=12,
                                       layer=layer, mode="eager", impl="eager", dtype="fp32", repeats=1,
                                       device="cpu")
            for repeat in range(2):
                with self.subTest(layer=layer, repeat=repeat):
                    got = capture.decode(model, spec, ids, real, repeat, shared)
                    want = capture.decode(model, spec, ids, real, repeat, ForgetfulMemo())
                    self.assertEqual(got.probe_names, want.probe_names)
                    np.testing.assert_array_equal(got.probe_hash, want.probe_hash)


def _one_prompt(tmp: str) -> tuple[str, str]:
    """A prompts file of one 3-token row in tmp (p.json), and the capture's
    output path there (runs.h5)."""
    prompts = os.path.join(tmp, "p.json")
    with open(prompts, "w") as f:
        json.dump([[1, 2, 3]], f)
    return prompts, os.path.join(tmp, "runs.h5")


class SigtermTest(unittest.TestCase):
    """SIGTERM (timeout(1)) stops a capture between two steps: it writes the
    runs it completed, says so, and exits 143."""

    def test_stopped_capture_writes_its_runs(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            prompts, out = _one_prompt(tmp)
            proc = subprocess.Popen([sys.executable, "-m", "kvrepro.cli", "capture", "--model", model_dir("mistral"),
                                     "--prompts", prompts, "--max-new-tokens", "200", "--repeats", "50",
                                     "--cache", "always_roll", "--out", out], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=_env(), stdin=subprocess.DEVNULL)
            try:
                assert proc.stdout is not None
                first = proc.stdout.readline()        # the first run is done
                proc.send_signal(signal.SIGTERM)
                rest, err = proc.communicate(timeout=TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
            printed = [ln for ln in (first + rest).splitlines() if "/eager/r" in ln]
            self.assertEqual(proc.returncode, 143, err)
            self.assertGreaterEqual(len(printed), 1, first)
            self.assertLess(len(printed), 50)
            self.assertIn("capture stopped by SIGTERM", err)
            with h5py.File(out, "r") as f:
                # every run printed is kept, and one more if the signal came between the two
                self.assertIn(len(f["runs"]), (len(printed), len(printed) + 1))
                for g in f["runs"].values():
                    self.assertEqual(int(g.attrs["steps"]), 200)

    def test_stopped_before_a_run_writes_nothing(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            prompts, out = _one_prompt(tmp)
            # stopped while the first (long) run decodes: no run to write, no empty report
            # (`gate --external` refuses a file of no run)
            proc = subprocess.Popen([sys.executable, "-c", "import sys, kvrepro.cli as c; print('ready', flush=True); "
                                     "sys.exit(c.main(sys.argv[1:]))", "capture", "--model", model_dir("mistral"),
                                     "--prompts", prompts, "--max-new-tokens", "100000", "--cache", "always_roll",
                                     "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=_env(), stdin=subprocess.DEVNULL)
            try:
                assert proc.stdout is not None
                proc.stdout.readline()
                for _ in range(600):   # until the model is loaded and the decode runs
                    if proc.poll() is not None or os.path.exists(out):
                        break
                    subprocess.run(["sleep", "0.05"])
                    if _decoding(proc.pid):
                        break
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
            self.assertEqual(proc.returncode, 143, err)
            self.assertIn("before a run completed", err)
            self.assertFalse(os.path.exists(out))
            self.assertEqual([n for n in os.listdir(tmp) if n != "p.json"], [])


def _decoding(pid: int) -> bool:
    """Whether process pid has been running Python long enough to be in the
    decode (its CPU time past the imports and the load: ~4 s)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") > 6.0
    except (OSError, ValueError, IndexError):
        return False


class TableTest(unittest.TestCase):
    """`kvrepro-hf table` on a capture and its gate: per layer and mode the
    reference verdict, the repeats bitwise or not, the steady per-step time;
    a layer that fails the gate reads FAIL, with the gate's message under
    the table."""

    def test_table_reads_capture_and_gate(self) -> None:
        need_kvrepro(self)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "runs.h5")
            p = kvrepro_hf("capture", "--model", model_dir("mistral"), "--scenario", "left_padded_batch",
                           "--cache", "static_sliding,always_roll_off_by_one", "--repeats", "2", "--out", out)
            self.assertEqual(p.returncode, 0, p.stderr)
            report = os.path.join(tmp, "gate.h5")
            g = gate_external(model_dir("mistral"), report, out)
            self.assertEqual(g.returncode, 1, g.stdout)
            t = kvrepro_hf("table", out, "--gate", report)
            self.assertEqual(t.returncode, 0, t.stderr)
            lines = t.stdout.splitlines()
            self.assertTrue(lines[0].startswith("mistral left_padded_batch torch-cpu"), lines[0])
            head = lines[1].split()
            self.assertEqual(head[:6], ["dtype", "cache", "attn", "mode", "runs", "reference"])
            rows = {ln.split()[1]: ln for ln in lines[2:4]}
            # reference PASS and its max_rel_err, no vs-eager (eager), bitwise repeats, no graphs
            # or recompiles (eager), ms/step median [min-max], prefill ms, no compile time
            self.assertRegex(rows["static_sliding"], r"^fp32 +static_sliding +eager +eager +2 +PASS [0-9.e+-]+ +- +"
                             r"bitwise +- +- +[0-9.]+( \[[0-9.]+-[0-9.]+\])? +[0-9.]+ +-$")
            bad = rows["always_roll_off_by_one"].split()
            self.assertEqual(bad[5:7], ["FAIL", "2/2"])
            self.assertTrue(any("always_roll_off_by_one" in ln and "logits beyond" in ln for ln in lines[4:]),
                            t.stdout)
            # without the gate: the capture's own columns only
            t = kvrepro_hf("table", out)
            self.assertEqual(t.returncode, 0, t.stderr)
            self.assertNotIn("PASS", t.stdout)
            self.assertIn("(no gate report)", t.stdout)


class GpuScriptTest(unittest.TestCase):
    """scripts/gpu-hf.sh end to end on the CPU (DEVICE=cpu): versions, the
    captures, the gate and the table, each step timed; usage exit 2."""

    def test_script_on_cpu(self) -> None:
        need_kvrepro(self)
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(_env(), DEVICE="cpu", MODES="eager", CACHES="static_sliding,always_roll", DTYPES="fp32",
                       REPEATS="2", BF16_PAIR="none", CALIBRATE="0", PYTHON=sys.executable, KVREPRO=KVREPRO)
            p = subprocess.run(["sh", "scripts/gpu-hf.sh", model_dir("mistral"), os.path.join(tmp, "out")],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
            out = p.stdout
            self.assertRegex(out, r"torch [0-9.]+.*transformers [0-9.]+")
            self.assertRegex(out, r"== capture fp32: [0-9.]+ s")
            self.assertRegex(out, r"== gate --external \(CPU reference, [0-9]+ cores\): [0-9.]+ s")
            self.assertRegex(out, r"fp32 +static_sliding +eager +eager +2 +PASS .* bitwise")
            self.assertRegex(out, r"fp32 +always_roll +eager +eager +2 +PASS .* bitwise")
            self.assertRegex(out, r"== gpu-hf: [0-9.]+ s in all")
            for name in ("hf_fp32.h5", "gate_hf.h5", "gate_hf.xml"):
                self.assertTrue(os.path.isfile(os.path.join(tmp, "out", name)), name)
        p = subprocess.run(["sh", "scripts/gpu-hf.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage:", p.stderr)


if __name__ == "__main__":
    unittest.main()
