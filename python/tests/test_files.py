"""Writes go only where they were named:
`kvrepro-hf capture --out` (report.write_report), `plot --out`
(plot.plot_report) and `report --html` (html_report.write_html_report)
publish through files.publish, the rules of the C gate's
reports/report.c kv_report_file_publish:

  - an output path that exists and is not a regular file (a FIFO, a
    directory) or is named like a writer's temporary is refused (InputError,
    exit 2), before anything is written;
  - a symbolic link at the output path is replaced itself, its target is
    never written; a link planted at the temporary's name is never followed;
  - no temporary outlives a write, failed or not, and the temporaries of
    writers that were killed are removed by the next write.

Run: cd python/tests && PYTHONPATH=.. python -m unittest -v test_files
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

import numpy as np

from kvrepro.errors import InputError
from kvrepro.html_report import write_html_report
from kvrepro.plot import plot_report
from kvrepro.report import Run, margins_of, write_report

ROOT = {"tool_version": "test", "git_commit": "none", "host": "test", "device": "cpu only", "math_mode": "fp32"}
FIGURES = ("summary.png", "error_vs_reference.png", "divergence_map.png", "graphs_per_decode.png")
VICTIM = b"not yours to write\n"


def tiny_runs(steps: int = 3, vocab: int = 8) -> list[Run]:
    rng = np.random.default_rng(0)
    out = []
    for variant in ("hf:roll:eager:fp32", "hf:index_copy:eager:fp32"):
        logits = rng.standard_normal((steps, 1, vocab)).astype(np.float32)
        out.append(Run(model="tiny", scenario="unit", variant=variant, backend="torch-cpu", mode="eager",
                       repeat=0, engine="test", vocab=vocab, steps=steps, prompt=np.zeros((1, 2), np.int32),
                       prompt_real=np.ones((1, 2), np.uint8), tokens=np.argmax(logits, -1).astype(np.int32),
                       logits=logits, margins=margins_of(logits), probe_names=["logits"],
                       probe_hash=np.zeros((steps, 1, 1), np.uint64)))
    return out


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.victim = os.path.join(self.d, "victim")
        with open(self.victim, "wb") as f:
            f.write(VICTIM)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def temps(self, directory: str | None = None) -> list[str]:
        return sorted(n for n in os.listdir(directory or self.d) if ".tmp-" in n)

    def assert_victim_intact(self) -> None:
        with open(self.victim, "rb") as f:
            self.assertEqual(f.read(), VICTIM)
        self.assertTrue(stat.S_ISREG(os.lstat(self.victim).st_mode))


class ReportWriteTest(Base):
    """capture --out: report.write_report."""

    def test_output_that_is_not_a_regular_file_is_refused(self) -> None:
        fifo = os.path.join(self.d, "fifo.h5")
        os.mkfifo(fifo)
        adir = os.path.join(self.d, "dir.h5")
        os.mkdir(adir)
        for path, want in ((fifo, "FIFO"), (adir, "directory"), (adir + "/", "directory"),
                           (os.path.join(self.d, "r.h5.tmp-77"), "temporary"),
                           (os.path.join(self.d, "no", "such", "r.h5"), "cannot create"), ("", "empty")):
            with self.subTest(path=path), self.assertRaises(InputError) as cm:
                write_report(path, tiny_runs(), ROOT)
            self.assertIn(want, str(cm.exception))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))   # still the FIFO, not a report
        self.assertTrue(stat.S_ISDIR(os.lstat(adir).st_mode))
        self.assertEqual(os.listdir(adir), [])
        self.assertEqual(sorted(os.listdir(self.d)), ["dir.h5", "fifo.h5", "victim"])

    def test_links_are_never_written_through_and_temporaries_never_left(self) -> None:
        out = os.path.join(self.d, "r.h5")
        # a link planted at the temporary's name (this process's pid) ...
        os.symlink(self.victim, f"{out}.tmp-{os.getpid()}")
        # ... and what a killed writer left behind
        stale = f"{out}.tmp-{dead_pid()}"
        with open(stale, "wb") as f:
            f.write(b"half a report")
        write_report(out, tiny_runs(), ROOT)
        self.assert_victim_intact()
        self.assertTrue(stat.S_ISREG(os.lstat(out).st_mode))
        self.assertEqual(self.temps(), [])
        # a link at the output path itself: replaced by the report, its target untouched
        link = os.path.join(self.d, "link.h5")
        os.symlink(self.victim, link)
        write_report(link, tiny_runs(), ROOT)
        self.assert_victim_intact()
        self.assertTrue(stat.S_ISREG(os.lstat(link).st_mode))
        with open(link, "rb") as f:
            self.assertEqual(f.read(8), b"\x89HDF\r\n\x1a\n")
        self.assertEqual(self.temps(), [])

    def test_named_temporary_is_never_written_through(self) -> None:
        # where the file system has no unnamed files (O_TMPFILE), the
        # temporary is created by name: a link planted there after the
        # stale-temporary sweep (the sweep disabled here) is not followed
        out = os.path.join(self.d, "r.h5")
        tmp = f"{out}.tmp-{os.getpid()}"
        os.symlink(self.victim, tmp)
        with mock.patch("kvrepro.files._open_unnamed", return_value=None), \
                mock.patch("kvrepro.files.remove_stale_temps"):
            write_report(out, tiny_runs(), ROOT)
        self.assert_victim_intact()
        self.assertTrue(stat.S_ISREG(os.lstat(out).st_mode))
        self.assertEqual(self.temps(), [])

    def test_failed_write_leaves_the_old_file_and_no_temporary(self) -> None:
        # a full disk, made with RLIMIT_FSIZE in a child process (writes past
        # the limit fail with EFBIG once SIGXFSZ is ignored)
        out = os.path.join(self.d, "r.h5")
        with open(out, "wb") as f:
            f.write(b"the previous report")
        script = textwrap.dedent(f"""
            import resource, signal, sys
            sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
            from test_files import tiny_runs, ROOT
            from kvrepro.errors import InputError
            from kvrepro.report import write_report
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            try:
                write_report({out!r}, tiny_runs(steps=64, vocab=256), ROOT)
            except InputError as e:
                print("InputError:", e)
                sys.exit(2)
            """)
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn(f"InputError: {out}: cannot write", p.stdout)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"the previous report")
        self.assertEqual(self.temps(), [])


class PlotWriteTest(Base):
    """plot --out: plot.plot_report."""

    def setUp(self) -> None:
        super().setUp()
        self.report = os.path.join(self.d, "report.h5")
        write_report(self.report, tiny_runs(), ROOT)
        self.out = os.path.join(self.d, "plots")
        os.mkdir(self.out)

    def test_links_are_never_written_through(self) -> None:
        os.symlink(self.victim, os.path.join(self.out, f"{FIGURES[0]}.tmp-{os.getpid()}"))
        os.symlink(self.victim, os.path.join(self.out, FIGURES[1]))   # replaced itself
        with open(os.path.join(self.out, f"{FIGURES[2]}.tmp-{dead_pid()}"), "wb") as f:
            f.write(b"half a figure")
        paths = plot_report(self.report, self.out)
        self.assert_victim_intact()
        self.assertEqual(sorted(os.listdir(self.out)), sorted(FIGURES))
        for p in paths:
            self.assertTrue(stat.S_ISREG(os.lstat(p).st_mode), p)
            with open(p, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_failed_write_leaves_no_temporary(self) -> None:
        def half_then_fail(_fig, fname, *args, **kwargs):
            if isinstance(fname, (str, os.PathLike)):
                with open(fname, "wb") as f:
                    f.write(b"\x89PNG half")
            else:
                fname.write(b"\x89PNG half")
            raise RuntimeError("the renderer failed")

        with mock.patch("matplotlib.figure.Figure.savefig", half_then_fail), self.assertRaises(RuntimeError):
            plot_report(self.report, self.out)
        self.assertEqual(os.listdir(self.out), [])

    def test_figure_path_that_is_not_a_regular_file_is_refused_before_any_figure(self) -> None:
        os.mkfifo(os.path.join(self.out, FIGURES[2]))
        with self.assertRaises(InputError) as cm:
            plot_report(self.report, self.out)
        self.assertIn(FIGURES[2], str(cm.exception))
        self.assertIn("FIFO", str(cm.exception))
        self.assertEqual(os.listdir(self.out), [FIGURES[2]])      # nothing drawn first
        self.assertTrue(stat.S_ISFIFO(os.lstat(os.path.join(self.out, FIGURES[2])).st_mode))
        os.unlink(os.path.join(self.out, FIGURES[2]))
        os.mkdir(os.path.join(self.out, FIGURES[1]))
        with self.assertRaises(InputError) as cm:
            plot_report(self.report, self.out)
        self.assertIn(FIGURES[1], str(cm.exception))
        self.assertEqual(os.listdir(self.out), [FIGURES[1]])

    def test_figures_over_the_report_are_refused(self) -> None:
        report = os.path.join(self.out, FIGURES[0])
        os.rename(self.report, report)
        with self.assertRaises(InputError) as cm:
            plot_report(report, self.out)
        self.assertIn("is the report being plotted", str(cm.exception))
        with open(report, "rb") as f:
            self.assertEqual(f.read(8), b"\x89HDF\r\n\x1a\n")


class HtmlWriteTest(Base):
    """report --html: html_report.write_html_report."""

    def setUp(self) -> None:
        super().setUp()
        self.report = os.path.join(self.d, "report.h5")
        write_report(self.report, tiny_runs(), ROOT)

    def test_links_are_never_written_through(self) -> None:
        out = os.path.join(self.d, "page.html")
        os.symlink(self.victim, out)                                   # replaced itself
        os.symlink(self.victim, f"{out}.tmp-{os.getpid()}")            # never followed
        with open(f"{out}.tmp-{dead_pid()}", "wb") as f:               # a killed writer's
            f.write(b"<html>half a page")
        write_html_report(self.report, out)
        self.assert_victim_intact()
        self.assertTrue(stat.S_ISREG(os.lstat(out).st_mode))
        with open(out, "rb") as f:
            self.assertEqual(f.read(15), b"<!DOCTYPE html>")
        self.assertEqual(self.temps(), [])

    def test_output_that_is_not_a_regular_file_is_refused(self) -> None:
        fifo = os.path.join(self.d, "fifo.html")
        os.mkfifo(fifo)
        adir = os.path.join(self.d, "dir.html")
        os.mkdir(adir)
        for path, want in ((fifo, "FIFO"), (adir, "directory"), (os.path.join(self.d, "p.html.tmp-77"), "temporary"),
                           (os.path.join(self.d, "no", "such", "p.html"), "cannot create")):
            with self.subTest(path=path), self.assertRaises(InputError) as cm:
                write_html_report(self.report, path)
            self.assertIn(want, str(cm.exception))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertEqual(os.listdir(adir), [])
        self.assertEqual(sorted(os.listdir(self.d)), ["dir.html", "fifo.html", "report.h5", "victim"])

    def test_failed_render_leaves_the_old_page_and_no_temporary(self) -> None:
        out = os.path.join(self.d, "page.html")
        with open(out, "wb") as f:
            f.write(b"the previous page")

        def fail(*_args, **_kwargs):
            raise RuntimeError("the renderer failed")

        with mock.patch("matplotlib.figure.Figure.savefig", fail), self.assertRaises(RuntimeError):
            write_html_report(self.report, out)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"the previous page")
        self.assertEqual(self.temps(), [])


if __name__ == "__main__":
    unittest.main()
