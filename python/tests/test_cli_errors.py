"""kvrepro-hf's command line: every option of every subcommand, given bad
values, ends in a one-line message and exit 2, never a
Python traceback, a hang on a FIFO or a read of /dev/zero until memory runs
out; and nothing is written (no report, no temporary).

Each case runs `python -m kvrepro.cli` in a subprocess (the way a user meets
it) and is refused before a model is loaded: the whole module takes seconds.
Which options exist is read from the subcommand's --help, so an option added
later without a case here fails test_every_option_has_a_case.

Run: cd python/tests && PYTHONPATH=.. python -m unittest -v test_cli_errors
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest
from dataclasses import dataclass

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "fixtures", "hf", "mistral")   # vocab_size 256
# A case that is (wrongly) accepted would run a whole capture, or block on a
# FIFO: the subprocess is stopped here and the case fails.
TIMEOUT_S = 60
# What transformers prints when it loads weights: a refused command never does.
LOADING = "Loading weights"
LAYERS = ("static_sliding", "dynamic_sliding", "dynamic_sliding_md", "index_copy", "cat_shift", "roll",
          "always_roll")
PROMPTS = "[[1, 2, 3], [4, 5]]"


def write_tiny_report(path: str) -> None:
    """A valid capture report of one 2-step run (no torch needed)."""
    import numpy as np

    from kvrepro.report import Run, margins_of, write_report

    logits = np.arange(2 * 1 * 4, dtype=np.float32).reshape(2, 1, 4)
    run = Run(model="tiny", scenario="unit", variant="hf:roll:eager:fp32", backend="torch-cpu", mode="eager",
              repeat=0, engine="test", vocab=4, steps=2, prompt=np.zeros((1, 2), np.int32),
              prompt_real=np.ones((1, 2), np.uint8), tokens=np.argmax(logits, -1).astype(np.int32),
              logits=logits, margins=margins_of(logits), probe_names=["logits"],
              probe_hash=np.zeros((2, 1, 1), np.uint64))
    write_report(path, [run], {"tool_version": "test", "git_commit": "none", "host": "test",
                               "device": "cpu only", "math_mode": "fp32"})


@dataclass
class Case:
    option: str           # the option (or positional) under test
    argv: list[str]       # the whole command line after `kvrepro-hf`
    want: str             # a substring of the message: the file or the option


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # the package under test: PYTHONPATH if given (ctest sets it), else this tree's
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    try:
        p = subprocess.run([sys.executable, "-m", "kvrepro.cli", *argv], capture_output=True, text=True,
                           env=_env(), timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return -1, "", f"(still running after {TIMEOUT_S} s: stopped)\n{err}"
    return p.returncode, p.stdout, p.stderr


class CliErrorTest(unittest.TestCase):
    tmp: tempfile.TemporaryDirectory
    d: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.d = cls.tmp.name

        def put(name: str, data: str | bytes) -> str:
            path = os.path.join(d, name)
            with open(path, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
            return path

        # a copy of the model: a case wrongly accepted may write over its --out
        # (the cases below name the prompts file and config.json as --out)
        cls.model = os.path.join(d, "mistral")
        os.mkdir(cls.model)
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(FIXTURE, name), os.path.join(cls.model, name))
        cls.prompts = put("p.json", PROMPTS)
        cls.fifo = os.path.join(d, "fifo")
        os.mkfifo(cls.fifo)
        cls.dir = os.path.join(d, "a-dir")
        os.mkdir(cls.dir)
        cls.out_dir = os.path.join(d, "out")   # where --out points: must stay empty
        os.mkdir(cls.out_dir)
        cls.out = os.path.join(cls.out_dir, "o.h5")
        cls.ro = os.path.join(d, "read-only")
        os.mkdir(cls.ro)
        os.chmod(cls.ro, stat.S_IRUSR | stat.S_IXUSR)
        # model directories with a bad config.json
        cls.models = {}
        for name, make in (("fifo", lambda p: os.mkfifo(p)), ("zero", lambda p: os.symlink("/dev/zero", p)),
                           ("junk", lambda p: put(p, "{")), ("list", lambda p: put(p, "[]")),
                           ("none", None)):
            m = os.path.join(d, f"model-{name}")
            os.mkdir(m)
            if make is not None:
                make(os.path.join(m, "config.json"))
            cls.models[name] = m
        # a config.json that reads, and weights that do not (found by transformers)
        for name, weights in (("noweights", None), ("badweights", b"\x08\x00\x00\x00\x00\x00\x00\x00{}")):
            m = os.path.join(d, f"model-{name}")
            os.mkdir(m)
            shutil.copyfile(os.path.join(FIXTURE, "config.json"), os.path.join(m, "config.json"))
            if weights is not None:
                put(os.path.join(m, "model.safetensors"), weights)
            cls.models[name] = m
        with open(os.path.join(FIXTURE, "config.json")) as f:
            cfg = json.load(f)
        m = cls.models["vocab"] = os.path.join(d, "model-vocab")
        os.mkdir(m)
        put(os.path.join(m, "config.json"), json.dumps({**cfg, "vocab_size": (1 << 22) + 1}))
        # bad prompts files
        big = os.path.join(d, "big.json")
        with open(big, "wb") as f:
            f.truncate((64 << 20) + 1)   # sparse: one byte over the C side's 64 MiB
        cls.bad_prompts = {
            "trailing": put("trailing.json", "[[1, 2]] [[3, 4, 5]]"),
            "deep": put("deep.json", "[" * 200000 + "]" * 200000),
            "rows": put("rows.json", json.dumps([[1]] * 4097)),
            "long": put("long.json", json.dumps([[1] * ((1 << 20) + 1)])),
            "bool": put("bool.json", "[[1, true]]"),
            "float": put("float.json", "[[1, 2.5]]"),
            "neg": put("neg.json", "[[1, -3]]"),
            "vocab": put("vocab.json", "[[1, 256]]"),
            "empty": put("empty.json", "[]"),
            "emptyrow": put("emptyrow.json", "[[1], []]"),
            "utf8": put("utf8.json", b"[[1, 2]]\xff"),
            "big": big,
        }
        cls.junk_report = put("junk.h5", "not hdf5")
        cls.report = os.path.join(d, "report.h5")
        write_tiny_report(cls.report)
        cls.cases = (cls._capture_cases() + cls._plot_cases() + cls._prompts_cases() + cls._show_cases()
                     + cls._convert_cases() + cls._report_cases() + cls._table_cases())

    @classmethod
    def tearDownClass(cls) -> None:
        os.chmod(cls.ro, stat.S_IRWXU)
        cls.tmp.cleanup()

    @classmethod
    def _capture(cls, **over: str | None) -> list[str]:
        """A valid capture command line with the options in over replaced
        (None drops the option)."""
        opts: dict[str, str | None] = {"--model": cls.model, "--prompts": cls.prompts, "--max-new-tokens": "2",
                                       "--cache": "static_sliding", "--out": cls.out}
        opts.update({"--" + k.replace("_", "-"): v for k, v in over.items()})
        argv = ["capture"]
        for k, v in opts.items():
            if v is not None:
                argv += [k, v]
        return argv

    @classmethod
    def _capture_cases(cls) -> list[Case]:
        c, d = cls._capture, cls.d
        cases = [
            Case("--model", c(model=""), "--model"),
            Case("--model", c(model=os.path.join(d, "nope")), "nope"),
            Case("--model", c(model=cls.prompts), cls.prompts),
            Case("--model", c(model=cls.models["none"]), "config.json"),
            Case("--model", c(model=cls.models["fifo"]), "FIFO"),
            Case("--model", c(model=cls.models["zero"]), "device"),
            Case("--model", c(model=cls.models["junk"]), "config.json"),
            Case("--model", c(model=cls.models["list"]), "config.json"),
            Case("--model", c(model=cls.models["vocab"]), "vocab_size"),
            Case("--model", c(model=cls.models["noweights"]), cls.models["noweights"]),   # needs torch: ~5 s
            Case("--model", c(model=cls.models["badweights"]), cls.models["badweights"]),
            Case("--prompts", c(prompts=""), "--prompts"),
            Case("--prompts", c(prompts=os.path.join(d, "nope.json")), "nope.json"),
            Case("--prompts", c(prompts=cls.dir), cls.dir),
            Case("--prompts", c(prompts=cls.fifo), "FIFO"),
            Case("--prompts", c(prompts="/dev/zero"), "/dev/zero"),
            *[Case("--prompts", c(prompts=p), p) for p in cls.bad_prompts.values()],
            Case("--max-new-tokens", c(max_new_tokens=None), "--max-new-tokens"),
            # within the bound, but 70 runs of it would hold ~79 GiB of logits
            Case("--max-new-tokens", c(max_new_tokens=str(1 << 20), cache=",".join(LAYERS), repeats="10"),
                 "--max-new-tokens"),
            *[Case("--max-new-tokens", c(max_new_tokens=v), "--max-new-tokens")
              for v in ("0", "-1", "1e11", "100000000000", str((1 << 20) + 1), "2.0", "x", "", " 2", "1_0")],
            *[Case("--cache", c(cache=v), "--cache") for v in ("ring", "", "roll,roll", "roll,")],
            *[Case("--mode", c(mode=v), "--mode") for v in ("fast", "", "eager,eager")],
            *[Case("--attn", c(attn=v), "--attn") for v in ("flash", "", "sdpa,sdpa")],
            *[Case("--dtype", c(dtype=v), "--dtype") for v in ("fp16", "")],
            *[Case("--repeats", c(repeats=v), "--repeats") for v in ("0", "-1", "101", "x")],
            *[Case("--scenario", c(scenario=v), "--scenario") for v in ("", "x" * 64, "a\tb", "é" * 32)],
            *[Case("--device", c(device=v), "--device")
              for v in ("cuda:x", "tpu", "", "CPU", "cuda:-1", "cuda:", "cpu:0", "cuda:99999")],
            # well-formed, but no such device here (no CUDA, or fewer than 100 GPUs)
            Case("--device", c(device="cuda:99"), "--device"),
            *[Case("--threads", c(threads=v), "--threads") for v in ("-1", "1025", "x", "")],
            Case("--out", c(out=""), "--out"),
            Case("--out", c(out=None), "--out"),
            Case("--out", c(out=os.path.join(d, "no", "such", "o.h5")), "o.h5"),
            Case("--out", c(out="/proc/kvrepro-test.h5"), "/proc/kvrepro-test.h5"),   # unwritable, root too
            # a directory without write permission (root writes there anyway)
            *([Case("--out", c(out=os.path.join(cls.ro, "o.h5")), "o.h5")] if os.geteuid() != 0 else []),
            Case("--out", c(out=cls.dir), cls.dir),
            Case("--out", c(out=cls.dir + "/"), cls.dir),
            Case("--out", c(out=cls.fifo), cls.fifo),
            Case("--out", c(out=os.path.join(cls.out_dir, "o.h5.tmp-123")), "tmp-123"),
            Case("--out", c(out=cls.prompts), cls.prompts),
            Case("--out", c(out=os.path.join(cls.model, "config.json")), "config.json"),
            # an option given twice, an abbreviation, an unknown option
            Case("--out", c() + ["--out", os.path.join(cls.out_dir, "b.h5")], "--out"),
            Case("--max-new-tokens", c() + ["--max-new-tokens", "3"], "--max-new-tokens"),
            Case("--max-new-tokens", c(max_new_tokens=None) + ["--max-new", "2"], "--max-new"),
            Case("--bogus", c() + ["--bogus"], "--bogus"),
            # texts instead of ids (kvrepro/prompts.py): an empty or blank text, a text file
            # that is not a readable UTF-8 regular file, both sources, a model without a tokenizer
            *[Case("--text", c(prompts=None) + ["--text", v], "--text 1") for v in ("", "  \n")],
            Case("--text", c() + ["--text", "a"], "--text"),
            Case("--text", c(prompts=None) + ["--text", "a"], cls.model),   # no tokenizer there
            Case("--text-file", c(prompts=None) + ["--text-file", ""], "--text-file"),
            Case("--text-file", c(prompts=None) + ["--text-file", os.path.join(d, "nope.txt")], "nope.txt"),
            Case("--text-file", c(prompts=None) + ["--text-file", cls.dir], cls.dir),
            Case("--text-file", c(prompts=None) + ["--text-file", cls.fifo], "FIFO"),
            Case("--text-file", c(prompts=None) + ["--text-file", "/dev/zero"], "/dev/zero"),
            Case("--text-file", c(prompts=None) + ["--text-file", cls.bad_prompts["utf8"]], "UTF-8"),
            Case("--text-file", c(prompts=None) + ["--text", "a", "--text-file", cls.prompts], "--text-file"),
            # no prompts: --scenario must name a gate scenario, whose batch is built
            Case("--prompts", c(prompts=None), "--prompts"),
            Case("--scenario", c(prompts=None, scenario="mine"), "'mine'"),
            Case("--scenario", c(prompts=None, scenario="left_padded_batch", model=cls.models["noweights"],
                                 max_new_tokens="0"), "--max-new-tokens"),
        ]
        return cases

    @classmethod
    def _table_cases(cls) -> list[Case]:
        d = cls.d
        ok = os.path.join(FIXTURE, "golden.h5")   # HDF5 but not a report
        return [
            Case("RUNS.h5", ["table"], "RUNS.h5"),
            Case("RUNS.h5", ["table", ""], "RUNS.h5"),
            Case("RUNS.h5", ["table", os.path.join(d, "nope.h5")], "nope.h5"),
            Case("RUNS.h5", ["table", cls.dir], cls.dir),
            Case("RUNS.h5", ["table", cls.fifo], cls.fifo),
            Case("RUNS.h5", ["table", "/dev/zero"], "/dev/zero"),
            Case("RUNS.h5", ["table", cls.junk_report], cls.junk_report),
            Case("RUNS.h5", ["table", ok], ok),
            Case("RUNS.h5", ["table", cls.report, cls.fifo], cls.fifo),
            Case("--gate", ["table", cls.report, "--gate"], "--gate"),
            Case("--gate", ["table", cls.report, "--gate", ""], "--gate"),
            Case("--gate", ["table", cls.report, "--gate", os.path.join(d, "nope.h5")], "nope.h5"),
            Case("--gate", ["table", cls.report, "--gate", cls.fifo], cls.fifo),
            Case("--gate", ["table", cls.report, "--gate", cls.junk_report], cls.junk_report),
            Case("--gate", ["table", cls.report, "--gate", ok], ok),
            # a capture judges nothing: it is no gate report
            Case("--gate", ["table", cls.report, "--gate", cls.report], "comparisons"),
            Case("--gate", ["table", cls.report, "--gate", cls.report, "--gate", cls.report], "--gate"),
        ]

    @classmethod
    def _prompts_cases(cls) -> list[Case]:
        d, out = cls.d, os.path.join(cls.out_dir, "p.json")

        def t(*rest: str, model: str | None = None) -> list[str]:
            return ["prompts", "--model", cls.model if model is None else model, *rest]

        return [
            Case("--model", t("--text", "a", "--out", out), cls.model),   # no tokenizer
            Case("--model", t("--text", "a", "--out", out, model=""), "--model"),
            Case("--model", t("--text", "a", "--out", out, model=os.path.join(d, "nope")), "nope"),
            Case("--text", t("--text", "", "--out", out), "--text 1"),
            Case("--text", t("--out", out), "--text"),
            Case("--text-file", t("--text-file", cls.fifo, "--out", out), "FIFO"),
            Case("--text-file", t("--text-file", "", "--out", out), "--text-file"),
            Case("--no-special-tokens", t("--text", "a", "--no-special-tokens=1", "--out", out),
                 "--no-special-tokens"),
            Case("--out", t("--text", "a"), "--out"),
            Case("--out", t("--text", "a", "--out", cls.dir), cls.dir),
            Case("--out", t("--text", "a", "--out", cls.fifo), cls.fifo),
            Case("--out", t("--text", "a", "--out", os.path.join(d, "no", "such", "p.json")), "p.json"),
        ]

    @classmethod
    def _show_cases(cls) -> list[Case]:
        d = cls.d
        return [
            Case("report", ["show", "--model", cls.model], "report"),
            Case("report", ["show", os.path.join(d, "nope.h5"), "--model", cls.model], "nope.h5"),
            Case("report", ["show", cls.fifo, "--model", cls.model], cls.fifo),
            Case("--model", ["show", cls.report], "--model"),
            Case("--model", ["show", cls.report, "--model", cls.model], cls.model),   # no tokenizer
        ]

    @classmethod
    def _convert_cases(cls) -> list[Case]:
        d, out = cls.d, os.path.join(cls.out_dir, "hf")
        return [
            Case("FILE", ["convert-gguf", "--out", out], "FILE"),
            Case("FILE", ["convert-gguf", os.path.join(d, "nope.gguf"), "--out", out], "nope.gguf"),
            Case("FILE", ["convert-gguf", cls.fifo, "--out", out], cls.fifo),
            Case("FILE", ["convert-gguf", "/dev/zero", "--out", out], "/dev/zero"),
            Case("FILE", ["convert-gguf", cls.prompts, "--out", out], "magic"),
            Case("--out", ["convert-gguf", cls.prompts], "--out"),
            *[Case("--sliding-window", ["convert-gguf", cls.prompts, "--out", out, "--sliding-window", v],
                   "--sliding-window") for v in ("0", "-1", "x", "")],
            Case("--dtype", ["convert-gguf", cls.prompts, "--out", out, "--dtype", "fp16"], "--dtype"),
        ]

    @classmethod
    def _plot_cases(cls) -> list[Case]:
        d = cls.d
        out = os.path.join(cls.out_dir, "plots")
        # --out directories holding, where a figure goes, something that is not a file
        fig_dir = os.path.join(d, "fig-dir")
        os.makedirs(os.path.join(fig_dir, "divergence_map.png"))
        fig_fifo = os.path.join(d, "fig-fifo")
        os.mkdir(fig_fifo)
        os.mkfifo(os.path.join(fig_fifo, "graphs_per_decode.png"))

        def p(report: str | None = None, *rest: str) -> list[str]:
            return ["plot", cls.report if report is None else report, *rest]

        ok = os.path.join(FIXTURE, "golden.h5")   # HDF5 but not a report: refused late
        return [
            Case("report", ["plot", "--out", out], "report"),
            Case("report", p("", "--out", out), "report"),
            Case("report", p(os.path.join(d, "nope.h5"), "--out", out), "nope.h5"),
            Case("report", p(cls.dir, "--out", out), cls.dir),
            Case("report", p(cls.fifo, "--out", out), cls.fifo),
            Case("report", p("/dev/zero", "--out", out), "/dev/zero"),
            Case("report", p(cls.junk_report, "--out", out), cls.junk_report),
            Case("report", p(ok, "--out", out), ok),
            Case("--out", p(), "--out"),
            Case("--out", p(None, "--out", ""), "--out"),
            Case("--out", p(None, "--out", cls.prompts), cls.prompts),
            Case("--out", p(None, "--out", cls.fifo), cls.fifo),
            Case("--out", p(None, "--out", out, "--out", out), "--out"),
            *[Case("--window", p(None, "--out", out, "--window", v), "--window")
              for v in ("0", "-1", "x", "", str(1 << 40), "2.5")],
            Case("--window", p(None, "--out", out, "--window", "4", "--window", "4"), "--window"),
            Case("--out", p(None, "--out", fig_dir), fig_dir),
            Case("--out", p(None, "--out", fig_fifo), fig_fifo),
        ]

    @classmethod
    def _report_cases(cls) -> list[Case]:
        d = cls.d
        page = os.path.join(cls.out_dir, "r.html")

        def r(report: str | None = None, *rest: str) -> list[str]:
            return ["report", cls.report if report is None else report, *rest]

        ok = os.path.join(FIXTURE, "golden.h5")   # HDF5 but not a report: refused late
        return [
            Case("report", ["report", "--html", page], "report"),
            Case("report", r("", "--html", page), "report"),
            Case("report", r(os.path.join(d, "nope.h5"), "--html", page), "nope.h5"),
            Case("report", r(cls.dir, "--html", page), cls.dir),
            Case("report", r(cls.fifo, "--html", page), cls.fifo),
            Case("report", r("/dev/zero", "--html", page), "/dev/zero"),
            Case("report", r(cls.junk_report, "--html", page), cls.junk_report),
            Case("report", r(ok, "--html", page), ok),
            Case("--html", r(), "--html"),
            Case("--html", r(None, "--html", ""), "--html"),
            Case("--html", r(None, "--html", cls.fifo), cls.fifo),
            Case("--html", r(None, "--html", cls.dir), cls.dir),
            Case("--html", r(None, "--html", os.path.join(cls.out_dir, "r.html.tmp-12")), ".tmp-12"),
            Case("--html", r(None, "--html", os.path.join(d, "no", "such", "r.html")), "r.html"),
            Case("--html", r(None, "--html", cls.report), "choose another --html"),   # over its own report
            Case("--html", r(None, "--html", page, "--html", page), "--html"),
            *[Case("--window", r(None, "--html", page, "--window", v), "--window")
              for v in ("0", "-1", "x", "", str(1 << 40), "2.5")],
            Case("--window", r(None, "--html", page, "--window", "4", "--window", "4"), "--window"),
        ]

    def test_every_option_has_a_case(self) -> None:
        for cmd in ("capture", "plot", "prompts", "show", "convert-gguf", "report", "table"):
            rc, out, err = run_cli([cmd, "--help"])
            self.assertEqual(rc, 0, err)
            options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", out)) - {"--help"}
            self.assertTrue(options, out)
            covered = {c.option for c in self.cases if c.argv[0] == cmd}
            self.assertEqual(options - covered, set(), f"{cmd}: options without a bad-value case")
        self.assertIn("report", {c.option for c in self.cases if c.argv[0] == "plot"})
        self.assertIn("report", {c.option for c in self.cases if c.argv[0] == "report"})

    def test_bad_values_exit_2_with_a_message(self) -> None:
        for case in self.cases:
            with self.subTest(option=case.option, argv=" ".join(a[:60] for a in case.argv[1:])):
                try:
                    self.check_refused(case)
                finally:
                    self.clean()

    def clean(self) -> None:
        """What a wrongly accepted case wrote, removed so that the next case
        is judged on its own."""
        for name in os.listdir(self.out_dir):
            path = os.path.join(self.out_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        for name in os.listdir(self.d):
            if ".tmp-" in name:
                os.unlink(os.path.join(self.d, name))
        if not stat.S_ISFIFO(os.lstat(self.fifo).st_mode):
            os.unlink(self.fifo)
            os.mkfifo(self.fifo)
        with open(self.prompts, "w") as f:
            f.write(PROMPTS)
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(FIXTURE, name), os.path.join(self.model, name))

    def check_refused(self, case: Case) -> None:
        rc, _, err = run_cli(case.argv)
        self.assertNotIn("Traceback", err)
        self.assertEqual(rc, 2, err[-2000:])
        self.assertNotIn(LOADING, err)   # refused before a model was loaded
        last = err.rstrip("\n").splitlines()[-1] if err.strip() else ""
        self.assertRegex(last, r"^kvrepro-hf( capture| plot| prompts| show| convert-gguf| report| table)?: ", err[-2000:])
        self.assertIn(case.want, last)
        # nothing written: no report, no figure, no temporary
        self.assertEqual(os.listdir(self.out_dir), [])
        self.assertEqual([n for n in os.listdir(self.d) if ".tmp-" in n], [])
        self.assertTrue(stat.S_ISFIFO(os.lstat(self.fifo).st_mode))
        with open(self.prompts) as f:
            self.assertEqual(f.read(), PROMPTS)


if __name__ == "__main__":
    unittest.main()
