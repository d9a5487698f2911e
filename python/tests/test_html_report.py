"""kvrepro-hf report --html: the page of a report, checked for what a
reviewer needs (every failure with the gate's bisect command, the applied
tolerances, W, the figures) and for being self-contained (nothing fetched
from anywhere: the figures are data: URLs, no script, no stylesheet link);
opened in a real headless browser (Debian's chromium: a screenshot that is
not blank, no console message, every figure decoded, no resource fetched);
and, on reports of the real gate (KVREPRO_BIN, as ctest sets it), its bisect
commands equal to the gate's own --summary-json ones and every figure of the
full default gate's report within plot.MAX_PX a side.

Run: cd python/tests && PYTHONPATH=.. python -m unittest -v test_html_report
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from test_plot import MESSAGE, UNIT_TOL, W, gate_like_report, png_size

from kvrepro.errors import InputError
from kvrepro.html_report import write_html_report
from kvrepro.plot import MAX_PX, load_report, render_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHROMIUM_TIMEOUT_S = 120
GATE_TIMEOUT_S = 900


def chromium() -> str | None:
    """Debian's chromium (package `chromium`), or None."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def page_urls(page: str) -> list[str]:
    """Every src/href value and CSS url() of the page."""
    attrs = re.findall(r"""\b(?:src|href|srcset|poster|data)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>"']+))""", page, re.I)
    return [a or b or c for a, b, c in attrs] + re.findall(r"url\(\s*([^)]*)\)", page, re.I)


class HtmlPageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.report = os.path.join(cls.tmp.name, "gate.h5")
        gate_like_report(cls.report, compiled=2)
        cls.out = os.path.join(cls.tmp.name, "page.html")
        write_html_report(cls.report, cls.out)
        with open(cls.out, encoding="utf-8") as f:
            cls.page = f.read()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def test_self_contained(self) -> None:
        urls = page_urls(self.page)
        self.assertEqual(len([u for u in urls if u.startswith("data:image/png;base64,")]), 4)
        self.assertEqual([u for u in urls if not u.startswith("data:")], [])
        for bad in ("<script", "@import", "http://", "https://", "<iframe", "<object", "<embed"):
            self.assertNotIn(bad, self.page.lower())
        for u in urls:
            if u.startswith("data:image/png;base64,"):
                png = base64.b64decode(u.split(",", 1)[1], validate=True)
                self.assertEqual(png[:8], PNG_MAGIC)
                self.assertLessEqual(max(png_size(png)), MAX_PX)

    def test_failures_with_their_bisect_lines(self) -> None:
        text = html.unescape(self.page)
        self.assertIn("FAIL", text)
        self.assertIn(f"next: kvrepro bisect {self.report} --run tiny/prompt_w/reference/cpu/eager/r0 "
                      "--run tiny/prompt_w/index_copy+window_off_by_one/cpu/eager/r0 --rerun", text)
        self.assertIn("step 3 row 1 probe logits", text)
        self.assertIn("graph_budget", text)   # the per-run check: no bisect line of its own
        self.assertEqual(text.count("next: kvrepro bisect"), 1)
        self.assertIn("4 passed, 2 failed, 0 skipped", text)

    def test_report_text_is_escaped(self) -> None:
        self.assertFalse(MESSAGE in self.page, "the report's markup reached the page unescaped")
        self.assertIn(html.escape(MESSAGE), self.page)

    def test_applied_tolerance_and_window(self) -> None:
        text = html.unescape(self.page)
        self.assertIn(f"max_rel_err {UNIT_TOL:.3g} over 1 unit (calibrated)", text)
        self.assertIn(f"W={W} (the prompt length of its prompt_w unit)", text)

    def test_bad_report_writes_nothing(self) -> None:
        junk = os.path.join(self.tmp.name, "junk.h5")
        with open(junk, "wb") as f:
            f.write(b"not hdf5")
        out = os.path.join(self.tmp.name, "junk.html")
        with self.assertRaises(InputError) as cm:
            write_html_report(junk, out)
        self.assertIn(junk, str(cm.exception))
        self.assertFalse(os.path.lexists(out))
        with self.assertRaises(InputError) as cm:
            write_html_report(self.report, self.report)   # the page over its own report
        self.assertIn("choose another --html", str(cm.exception))
        with open(self.report, "rb") as f:
            self.assertEqual(f.read(8), b"\x89HDF\r\n\x1a\n")


@unittest.skipIf(chromium() is None, "no chromium here (Debian: apt-get install chromium): "
                 "the page is not opened in a browser")
class HtmlBrowserTest(unittest.TestCase):
    """The page in headless chromium: rendered (a screenshot with content),
    silent (chromium logs every console message as INFO:CONSOLE; the page
    has no script, so any is a fault: a blocked load, a parse error), and,
    in a copy with a probe script, every figure decoded and, as the
    browser parsed the page, no element or stylesheet referring to anything
    but a data: URL (nor any resource fetched)."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.report = os.path.join(cls.tmp.name, "gate.h5")
        gate_like_report(cls.report, compiled=2)
        cls.page = os.path.join(cls.tmp.name, "page.html")
        write_html_report(cls.report, cls.page)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def open_page(self, page: str, shot: str) -> list[str]:
        """Screenshot of page into shot; the console lines chromium logged."""
        profile = tempfile.mkdtemp(dir=self.tmp.name)
        p = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr",
                            "--log-level=0", "--window-size=1400,2000", "--virtual-time-budget=5000",
                            f"--screenshot={shot}", "file://" + os.path.abspath(page)],
                           capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        return [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]

    def test_screenshot_and_no_console_message(self) -> None:
        shot = os.path.join(self.tmp.name, "page.png")
        console = self.open_page(self.page, shot)
        self.assertEqual(console, [])
        with open(shot, "rb") as f:
            png = f.read()
        self.assertEqual(png_size(png), (1400, 2000))
        # a blank page compresses to a few KiB; this one has tables, text and figures
        self.assertGreater(len(png), 50_000)
        keep = os.environ.get("KVREPRO_KEEP_SCREENSHOT")
        if keep:
            shutil.copyfile(shot, keep)

    def test_figures_decode_and_nothing_refers_outside(self) -> None:
        with open(self.page, encoding="utf-8") as f:
            page = f.read()
        probe = ("<script data-probe>window.addEventListener('load', () => console.log('kvrepro-probe ' + JSON.stringify({"
                 "images: [...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight]),"
                 "fetched: performance.getEntriesByType('resource').map(e => e.name).concat("
                 "[...document.querySelectorAll('[src],[href],[srcset],[poster],[data]')]"
                 ".filter(e => !e.hasAttribute('data-probe'))"
                 ".map(e => e.getAttribute('src') || e.getAttribute('href') || e.getAttribute('srcset') || "
                 "e.getAttribute('poster') || e.getAttribute('data') || '')"
                 ".filter(u => !u.startsWith('data:')))})));</script>")
        copy = os.path.join(self.tmp.name, "probe.html")
        with open(copy, "w", encoding="utf-8") as f:
            f.write(page.replace("</body>", probe + "</body>"))
        console = self.open_page(copy, os.path.join(self.tmp.name, "probe.png"))
        found = [ln for ln in console if "kvrepro-probe " in ln]
        self.assertEqual(len(found), 1, console)
        got = json.loads(found[0].split("kvrepro-probe ", 1)[1].rsplit('", source:', 1)[0].replace('\\"', '"'))
        self.assertEqual(got["fetched"], [])
        self.assertEqual(len(got["images"]), 4)
        for alt, complete, w, h in got["images"]:
            self.assertTrue(complete and w > 0 and h > 0, alt)


@unittest.skipIf(not os.environ.get("KVREPRO_BIN"), "KVREPRO_BIN is not set (ctest sets it): no gate to run")
class GateReportTest(unittest.TestCase):
    """Reports of the real gate: a planted fault's (its failures' bisect
    commands against the gate's --summary-json) and the full default gate's
    (~40 s: every figure within MAX_PX a side)."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.gate = os.environ["KVREPRO_BIN"]

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def run_gate(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.gate, "gate", "--quiet", *args], capture_output=True, text=True,
                              timeout=GATE_TIMEOUT_S, stdin=subprocess.DEVNULL)

    def test_fault_report_bisect_lines_are_the_gates(self) -> None:
        report = os.path.join(self.tmp.name, "fault.h5")
        summary = os.path.join(self.tmp.name, "fault.json")
        p = self.run_gate("--fixture", "mistral-tiny", "--scenarios", "prompt_w_plus_1,chunked_prefill",
                          "--fault", "window_off_by_one", "--report", report, "--summary-json", summary)
        self.assertEqual(p.returncode, 1, p.stdout[-2000:] + p.stderr[-2000:])
        with open(summary, encoding="utf-8") as f:
            want = [x["next"] for x in json.load(f)["failures"] if "next" in x]
        self.assertGreater(len(want), 0)
        out = os.path.join(self.tmp.name, "fault.html")
        write_html_report(report, out)
        with open(out, encoding="utf-8") as f:
            page = html.unescape(f.read())
        got = re.findall(r"next: (kvrepro bisect [^<\n]*)", page)
        self.assertEqual(got, want)
        data = load_report(report)
        self.assertEqual(data.verdict, "FAIL")
        for g in data.groups:
            if g.scenario in ("prompt_w_plus_1", "chunked_prefill"):
                self.assertEqual(g.window, 16, g.window_note)      # mistral-tiny's W, from prompt_w_plus_1
                self.assertIn("calibrated", g.tolerance_note)
                self.assertLess(g.tolerance or 1.0, 1e-4)

    def test_default_gate_figures_are_bounded(self) -> None:
        report = os.path.join(self.tmp.name, "default.h5")
        p = self.run_gate("--report", report)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        data = load_report(report)
        self.assertGreater(len(data.runs), 2000)
        for name, png in render_figures(data):
            self.assertLessEqual(max(png_size(png)), MAX_PX, name)
        self.assertEqual([m for m, (w, _) in data.windows.items() if w is None], [])   # every model's W known


if __name__ == "__main__":
    unittest.main()
