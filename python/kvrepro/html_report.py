"""`kvrepro-hf report R.h5 --html OUT.html`: one self-contained page of a
report for a reviewer who opens it from a CI artifact.

The page holds, in this order: the verdict and the run counts (as the gate's
count line), the report's provenance (tool, commit, device, seeds, shard),
the model x scenario grid of runs passed/failed/skipped, every failing
comparison with where it first failed and its `next:` bisect command (the
wording of harness/gate_verdict.c kv_gate_print_next, built from the
report's runs), the skipped runs grouped by backend and reason, the
tolerances the gate applied and each model's window W, and the four figures
of `kvrepro-hf plot`, inline as base64 PNG.

Self-contained: no script, no stylesheet or image from anywhere else (a
data: URL is the one kind of URL in it), so it opens the same from a
downloaded artifact, offline, in any browser. Every text from the report is
escaped. The page is published like every output (files.publish: written
whole or not at all, never through a link), after everything has been read
and drawn, so bad input leaves nothing behind.
"""

from __future__ import annotations

import base64
import html
import os

from .errors import InputError
from .files import check_writable, open_regular, publish, same_file
from .plot import (FAIL_COLOR, PASS_COLOR, ReportData, _check_window, _grid_counts, load_report,
                   render_figures, tolerance_lines, window_lines)

# Failures listed one by one; past this the page says how many more (a
# `--faults all` gate has thousands, each the same few lines).
MAX_FAILURES = 500
FIGURE_CAPTIONS = {
    "summary.png": "One page: the verdict, the grid, failing comparisons by variant and comparison.",
    "error_vs_reference.png": "Max relative logit error per decode step against the unit's baseline, "
                              "with the tolerance the gate applied (failing units first).",
    "divergence_map.png": "Per unit and step: bitwise equal, within or beyond the tolerance, a token "
                          "differs; the black tick is where the window fills.",
    "graphs_per_decode.png": "Decode graphs captured against the cache layer's graph budget.",
}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; max-width: 2100px; }
h1 { margin: 0 0 .2em 0; } h1 .v { padding: 0 .3em; color: #fff; border-radius: 4px; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
code, pre, td.mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.85em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #d5d5d5; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.pass { background: #d5ecd9; } td.fail { background: #f5b7b1; } td.skip { background: #e3e3e3; }
td.num { text-align: right; }
pre.next { margin: 0; white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: 2px 4px; }
tr.next td { border-top: none; }
img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figure { margin: 1em 0 2em 0; } figcaption { color: #555; font-size: .9em; }
.meta td:first-child { color: #555; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _verdict_color(verdict: str) -> str:
    return {"FAIL": FAIL_COLOR, "PASS": PASS_COLOR}.get(verdict, "#666666")


def _meta(data: ReportData) -> str:
    r = data.root
    rows = [("report", data.path), ("tool", r.get("tool_version", "?")), ("git commit", r.get("git_commit", "?")),
            ("host", r.get("host", "?")), ("device", r.get("device", "?")), ("math", r.get("math_mode", "?")),
            ("weight seed", r.get("weight_seed", "?")), ("prompt seed", r.get("prompt_seed", "?")),
            ("model hash", r.get("model_hash_hex", "?")), ("shard", r.get("shard", "?"))]
    for k in ("transformers_version", "torch_version", "capture_command"):
        if k in r:
            rows.append((k.replace("_", " "), r[k]))
    return "<table class=\"meta\">" + "".join(f"<tr><td>{_e(k)}</td><td class=\"mono\">{_e(v)}</td></tr>"
                                            for k, v in rows) + "</table>"


def _grid(data: ReportData) -> str:
    cells = _grid_counts(data)
    models = list(dict.fromkeys(r.model for r in data.runs))
    scens = list(dict.fromkeys(r.scenario for r in data.runs))
    head = "<tr><th>scenario</th>" + "".join(f"<th>{_e(m)}</th>" for m in models) + "</tr>"
    body = []
    for sc in scens:
        tds = []
        for m in models:
            c = cells.get((m, sc))
            if c is None:
                tds.append("<td></td>")
                continue
            cls = "fail" if c[1] else "pass" if c[0] else "skip"
            tds.append(f"<td class=\"{cls} num\">{c[0]}/{c[1]}/{c[2]}</td>")
        body.append(f"<tr><td class=\"mono\">{_e(sc)}</td>{''.join(tds)}</tr>")
    return ("<p>Runs passed/failed/skipped per model and scenario.</p><table class=\"grid\">" + head +
            "".join(body) + "</table>")


def _failures(data: ReportData, report_arg: str) -> str:
    if not data.failures:
        return ("<p>No failing comparison.</p>" if data.n_comparisons else
                "<p>No comparisons in this report: a capture, judged by <code>kvrepro gate --external</code>."
                "</p>")
    out = [f"<p>{len(data.failures)} failing comparison{'s' if len(data.failures) != 1 else ''}, in report "
           "order; each with the command that bisects it.</p>",
           "<table class=\"failures\"><tr><th>#</th><th>model / scenario</th><th>comparison</th>"
           "<th>runs</th><th>first</th><th>message</th></tr>"]
    for i, fl in enumerate(data.failures[:MAX_FAILURES]):
        nxt = fl.bisect_command(report_arg)
        out.append(f"<tr class=\"failure\"><td class=\"num\">{i + 1}</td><td class=\"mono\">{_e(fl.unit)}</td>"
                   f"<td>{_e(fl.kind)}</td><td class=\"mono\">{_e(fl.pair)}</td><td>{_e(fl.where)}</td>"
                   f"<td>{_e(fl.message)}</td></tr>")
        if nxt:
            out.append(f"<tr class=\"next\"><td></td><td colspan=\"5\"><pre class=\"next\">next: {_e(nxt)}</pre>"
                       "</td></tr>")
    out.append("</table>")
    if len(data.failures) > MAX_FAILURES:
        out.append(f"<p>{len(data.failures) - MAX_FAILURES} more failing comparisons not listed: "
                   "<code>kvrepro gate --summary-json</code> or <code>kvrepro show</code> list them all.</p>")
    return "".join(out)


def skip_groups(data: ReportData) -> list[tuple[str, str, int]]:
    """Skipped runs as the gate groups them (harness/gate_verdict.c
    kv_gate_print_skips): (backend, reason, runs), by first appearance. A
    run that ran but whose comparisons were skipped gives the first skipped
    comparison's reason only in the C listing; here, the run's own."""
    groups: dict[tuple[str, str], int] = {}
    for r in data.runs:
        if r.verdict == 2 or (r.verdict is None and r.skipped):
            key = (r.backend, r.skip_reason or "no comparison judged it")
            groups[key] = groups.get(key, 0) + 1
    return [(b, why, n) for (b, why), n in groups.items()]


def _skips(data: ReportData) -> str:
    groups = skip_groups(data)
    if not groups:
        return "<p>No skipped run.</p>"
    return "<ul>" + "".join(f"<li>{n} run{'s' if n != 1 else ''} skipped on <code>{_e(b)}</code>: {_e(why)}</li>"
                            for b, why, n in groups) + "</ul>"


def _tolerances(data: ReportData) -> str:
    lines = "".join(f"<li>{_e(t)}</li>" for t in tolerance_lines(data))
    rows = "".join(f"<tr><td class=\"mono\">{_e(g.title)}</td><td class=\"num\">"
                   f"{'-' if g.tolerance is None else f'{g.tolerance:.4g}'}</td><td>{_e(g.tolerance_note)}</td></tr>"
                   for g in data.groups)
    table = "".join(f"<tr><td class=\"mono\">{_e(t.name)}</td><td class=\"num\">{t.value:.6g}</td>"
                    f"<td>{_e(t.reason)}</td></tr>" for t in data.tolerances)
    return (f"<ul>{lines}</ul>"
            f"<details><summary>Per unit ({len(data.groups)})</summary><table><tr><th>unit</th>"
            f"<th>max_rel_err applied</th><th>from</th></tr>{rows}</table></details>"
            f"<details><summary>/tolerances as recorded ({len(data.tolerances)} rows)</summary><table>"
            f"<tr><th>name</th><th>value</th><th>reason</th></tr>{table}</table></details>")


def build_html(data: ReportData, figures: list[tuple[str, bytes]], report_arg: str) -> str:
    """The page, from what load_report read and render_figures drew.
    report_arg is the report's path as the reviewer gave it: the bisect
    commands name it (as the gate's name its --report)."""
    p, f, s = data.counts
    verdict = data.verdict
    title = f"kvrepro: {verdict} — {os.path.basename(data.path)}"
    figs = "".join(
        f"<figure id=\"{_e(name)}\"><img alt=\"{_e(name)}\" src=\"data:image/png;base64,"
        f"{base64.b64encode(png).decode('ascii')}\"><figcaption>{_e(name)}: {_e(FIGURE_CAPTIONS.get(name, ''))}"
        "</figcaption></figure>" for name, png in figures)
    windows = "".join(f"<li>{_e(t)}</li>" for t in window_lines(data))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        # an empty icon: the browser asks for no /favicon.ico
        "<link rel=\"icon\" href=\"data:,\">"
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n"
        f"<h1><span class=\"v\" style=\"background:{_verdict_color(verdict)}\">{_e(verdict)}</span> kvrepro report"
        f"</h1>\n<p class=\"counts\"><b>{p} passed, {f} failed, {s} skipped</b> (runs); "
        f"{len(data.failures)} failing of {data.n_comparisons} comparisons; report <code>{_e(report_arg)}</code></p>\n"
        f"{_meta(data)}\n<h2>Summary</h2>\n{_grid(data)}\n"
        f"<h2>Failures</h2>\n{_failures(data, report_arg)}\n"
        f"<h2>Skipped</h2>\n{_skips(data)}\n"
        f"<h2>Tolerances applied</h2>\n{_tolerances(data)}\n"
        f"<h2>Sliding window</h2>\n<ul>{windows or '<li>no run recorded</li>'}</ul>\n"
        f"<h2>Figures</h2>\n{figs}\n</body></html>\n")


def write_html_report(report_path: str, out_path: str, window: int | None = None) -> str:
    """Reads the report, draws its figures and publishes the page at
    out_path; returns out_path. Bad input (the report, --html, --window)
    raises InputError naming the file and field, with nothing written."""
    _check_window(window)
    os.close(open_regular(report_path, "report"))
    check_writable(out_path, "--html")
    if same_file(out_path, report_path):
        raise InputError(f"{out_path}: is the report ({report_path}): choose another --html")
    data = load_report(report_path, window)
    page = build_html(data, render_figures(data), report_path).encode("utf-8")
    publish(out_path, lambda f: f.write(page), "--html")
    return out_path
