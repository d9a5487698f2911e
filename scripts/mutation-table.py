#!/usr/bin/env python3
"""mutation-table.py: which checks catch 17 hand-written source mutations.

Each mutation is a real, plausible bug planted in the C sources by replacing
one exact snippet (which must occur exactly once in its file, or the script
stops: no mutation is ever skipped silently). For each mutation the script
applies it, rebuilds (``cmake --build build -j2``; a mutation that does not
compile is reported as such), runs the default gate
(``build/kvrepro gate --quiet``: caught when it exits non-zero, with the
comparison kind of its first FAIL line) and the test suite
(``ctest -LE "long|python" -j2 --stop-on-failure --output-on-failure`` with
KV_FUZZ_SECONDS=5: caught when it fails, with the first failing test; ctest's
cost file is reset to the baseline's before each run, so the test order, and
with it the first failure, does not depend on the previous mutation), then
restores the file with ``git checkout -- FILE`` (always, in a finally block)
and prints one markdown table row. A clean baseline (gate and suite both passing) runs
first; the script aborts when it does not pass. At the end it prints the
whole table and rebuilds the clean tree.

Run from the repository root, after a first configure and build:

    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2
    python3 scripts/mutation-table.py                 # all 17, ~40 min on 2 cores
    python3 scripts/mutation-table.py --only 1,8      # a subset
    python3 scripts/mutation-table.py --no-tests      # the gate only
    python3 scripts/mutation-table.py --check         # snippets only, no build

The full output of every gate and ctest run is kept under
build/mutation-logs/. The working tree must have no local changes in the
mutated files (they are restored with git checkout).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
LOGS = BUILD / "mutation-logs"
BUILD_CMD = ["cmake", "--build", "build", "-j2"]
GATE_CMD = ["build/kvrepro", "gate", "--quiet"]
CTEST_CMD = ["ctest", "-LE", "long|python", "-j2", "--stop-on-failure", "--output-on-failure"]
CTEST_ENV = {"KV_FUZZ_SECONDS": "5"}
GATE_TIMEOUT_S = 1200
CTEST_TIMEOUT_S = 3600
BUILD_TIMEOUT_S = 3600
# ctest orders tests by the costs it recorded and runs the ones that failed
# last time first; the baseline's cost file is put back before every run so
# that "first failing test" does not depend on the previous mutation.
COST_DATA = BUILD / "Testing" / "Temporary" / "CTestCostData.txt"
LAST_FAILED = BUILD / "Testing" / "Temporary" / "LastTestsFailed.log"
BASELINE_COST = LOGS / "baseline-CTestCostData.txt"

# The comparison kinds a FAIL line can name (reports/junit.c).
KINDS = (
    "reference",
    "repeat",
    "graph_vs_eager",
    "variant_vs_variant",
    "replay",
    "finite",
    "compiled_vs_eager",
    "graph_budget",
    "fresh_run",
    "shifted_vs_fresh",
)
FAIL_RE = re.compile(r"^FAIL \S+ \S+: .*? (" + "|".join(KINDS) + r"): ")
CTEST_FAIL_RE = re.compile(
    r"Test\s+#\d+: (\S+) \.*\s*\*\*\*(Failed|Exception|Timeout|Not Run)"
)


@dataclasses.dataclass(frozen=True)
class Mutation:
    id: int
    desc: str
    file: str
    old: str
    new: str


MUTATIONS: list[Mutation] = [
    Mutation(
        1,
        "window mask off by one: kv_window_visible admits q - W <= k",
        "reference/kvmath.c",
        "return window == 0 || q - window < k;",
        "return window == 0 || q - window <= k;",
    ),
    Mutation(
        2,
        "always_roll writes the new rows one slot left (slot W - m - 1 + t)",
        "candidates/cache_always_roll.c",
        "const int64_t slot = keep + t;",
        "const int64_t slot = keep + t - 1;",
    ),
    Mutation(
        3,
        "index_copy one-token shift threshold p >= W - 1 instead of p >= W",
        "candidates/cache_index_copy.c",
        "const int64_t shift = p0 >= W ? 1 : 0;",
        "const int64_t shift = p0 >= W - 1 ? 1 : 0;",
    ),
    Mutation(
        4,
        "cat_shift full regime shifted in place over cur, wrong direction "
        "(`faults & INPLACE_SHIFT` typed as `|`, so the in-place loop is live)",
        "candidates/cache_cat_shift.c",
        "if (n == 1 && (c->faults & KV_FAULT_INPLACE_SHIFT)) {",
        "if (n == 1 && (c->faults | KV_FAULT_INPLACE_SHIFT)) {",
    ),
    Mutation(
        5,
        "roll shift done in place over cur, wrong direction "
        "(`faults & INPLACE_SHIFT` typed as `|`, so the in-place roll is live)",
        "candidates/cache_roll.c",
        "if (c->faults & KV_FAULT_INPLACE_SHIFT) {",
        "if (c->faults | KV_FAULT_INPLACE_SHIFT) {",
    ),
    Mutation(
        6,
        "ring writes position p at slot (p + 1) % W (pos[] recorded faithfully)",
        "candidates/cache_ring.c",
        "const int64_t slot = (c->faults & KV_FAULT_RING_SLOT) ? (p + 1) % W : p % W;",
        "const int64_t slot = (p + 1) % W;",
    ),
    Mutation(
        7,
        "prefill longer than W: always_roll stores the first W new rows, not the last W",
        "candidates/cache_always_roll.c",
        "const int64_t j = n - m + t;",
        "const int64_t j = t;",
    ),
    Mutation(
        8,
        "RoPE sign flipped in the second half: x[i+h] = b cos - a sin",
        "reference/kvmath.c",
        "x[i + h] = b * c + a * s;",
        "x[i + h] = b * c - a * s;",
    ),
    Mutation(
        9,
        "gemma2 RMSNorm multiplies by w instead of (1 + w)",
        "reference/kvmath.c",
        "out[i] = offset ? xn * (1.0f + w[i]) : w[i] * xn;",
        "out[i] = offset ? xn * w[i] : w[i] * xn;",
    ),
    Mutation(
        10,
        "stale position in graph mode: the cache update reads the host count "
        "captured at launch (&a->host_total) instead of &s->total_mem",
        "engine/cpu_attention.c",
        "                            &s->total_mem, a->host_total);",
        "                            &a->host_total, a->host_total);",
    ),
    Mutation(
        11,
        "comparator: reference flip is a near-tie only when margin < tie_margin (was <=)",
        "harness/compare.c",
        "} else if (ref->margins[i] <= t->tie_margin) {",
        "} else if (ref->margins[i] < t->tie_margin) {",
    ),
    Mutation(
        12,
        "probe hash covers only the first half of each row (per_row / 2)",
        "engine/cpu_probe.c",
        "kv_fnv1a(KV_FNV_OFFSET, row, (size_t)per_row);",
        "kv_fnv1a(KV_FNV_OFFSET, row, (size_t)per_row / 2);",
    ),
    Mutation(
        13,
        "HDF5 report writer drops each run's last dataset (probe_hash): loop bound off by one",
        "reports/report_h5_write.c",
        "for (size_t k = 0; k < H5_RUN_DATASETS.n && st == KV_OK; k++) {",
        "for (size_t k = 0; k + 1 < H5_RUN_DATASETS.n && st == KV_OK; k++) {",
    ),
    Mutation(
        14,
        "dynamic allocates W slots (cur and tmp) instead of W - 1",
        "candidates/cache_dynamic.c",
        "    if (!kv_slots_alloc(&c->cur, batch, window - 1, dim) ||\n"
        "        !kv_slots_alloc(&c->tmp, batch, window - 1, dim)) {",
        "    if (!kv_slots_alloc(&c->cur, batch, window, dim) ||\n"
        "        !kv_slots_alloc(&c->tmp, batch, window, dim)) {",
    ),
    Mutation(
        15,
        "ring copies row 0's real/pad flags to every batch row (real_new[j])",
        "candidates/cache_ring.c",
        "s->real[b * W + slot] = real_new[b * n + j];",
        "s->real[b * W + slot] = real_new[j];",
    ),
    Mutation(
        16,
        "a chunk (n > 1) updates the cache before attending",
        "engine/cpu_attention.c",
        "const bool after = n == 1 && ops->one_token_order == KV_ATTEND_AFTER_UPDATE;",
        "const bool after = ops->one_token_order == KV_ATTEND_AFTER_UPDATE;",
    ),
    Mutation(
        17,
        "RoPE position counts pad tokens (qpos = slot index len + t)",
        "reference/forward.c",
        "s->qpos[r] = is_real ? s->n_real[b]++ : 0;",
        "s->qpos[r] = len + t;",
    ),
]


@dataclasses.dataclass
class Outcome:
    compiled: bool = True
    gate_caught: bool | None = None
    gate_detail: str = ""
    tests_caught: bool | None = None
    tests_detail: str = ""
    seconds: float = 0.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], cwd: Path, timeout: int, env_extra: dict[str, str] | None = None,
        log_name: str | None = None) -> tuple[int, str]:
    """Runs cmd, returns (exit status, stdout+stderr); 124 on timeout."""
    env = dict(os.environ)
    if env_extra:
        env.update(env_extra)
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace",
                           timeout=timeout)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        rc, out = 124, out + f"\n[timed out after {timeout} s]\n"
    if log_name is not None:
        LOGS.mkdir(parents=True, exist_ok=True)
        (LOGS / log_name).write_text(f"$ {' '.join(cmd)}\n{out}\n[exit {rc}]\n")
    return rc, out


def check_snippets(muts: list[Mutation]) -> None:
    """Every old snippet occurs exactly once, and old != new; else exit 2."""
    bad = []
    for m in muts:
        text = (ROOT / m.file).read_text()
        count = text.count(m.old)
        if count != 1:
            bad.append(f"mutation {m.id}: expected the old snippet exactly once in {m.file}, "
                       f"found {count} times:\n    {m.old!r}")
        if m.old == m.new:
            bad.append(f"mutation {m.id}: old and new snippets are identical")
    if bad:
        sys.exit("mutation-table: " + "\n".join(bad))


def build() -> tuple[bool, str]:
    rc, out = run(BUILD_CMD, ROOT, BUILD_TIMEOUT_S)
    return rc == 0, out


def gate(tag: str) -> tuple[bool, str]:
    """(caught, detail): caught when the gate exits non-zero."""
    rc, out = run(GATE_CMD, ROOT, GATE_TIMEOUT_S, log_name=f"{tag}-gate.txt")
    lines = out.splitlines()
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    if rc == 0:
        return False, f"missed ({last})"
    fails = [FAIL_RE.match(ln) for ln in lines if ln.startswith("FAIL ")]
    kinds = [f.group(1) for f in fails if f is not None]
    if kinds:
        others = sorted(set(kinds) - {kinds[0]})
        more = f"; also {', '.join(others)}" if others else ""
        return True, f"{kinds[0]} ({len(kinds)} FAIL{more})"
    if any(ln.startswith("FAIL ") for ln in lines):
        return True, f"exit {rc}, unparsed FAIL line"
    return True, f"error exit {rc}, no FAIL line: {last.strip()[:110]}"


def tests(tag: str) -> tuple[bool, str]:
    """(caught, detail): caught when ctest exits non-zero."""
    if BASELINE_COST.exists():
        COST_DATA.write_bytes(BASELINE_COST.read_bytes())
        LAST_FAILED.unlink(missing_ok=True)
    rc, out = run(CTEST_CMD, BUILD, CTEST_TIMEOUT_S, CTEST_ENV, log_name=f"{tag}-ctest.txt")
    m = CTEST_FAIL_RE.search(out)
    summary = next((ln.strip() for ln in out.splitlines() if "tests passed" in ln), "")
    if rc == 0:
        return False, f"missed ({summary})" if summary else "missed"
    if m is not None:
        what = "" if m.group(2) == "Failed" else f", {m.group(2)}"
        return True, f"{m.group(1)}{what}"
    return True, f"exit {rc}: {summary or out.strip().splitlines()[-1][:100]}"


def restore(path: str) -> None:
    subprocess.run(["git", "checkout", "--", path], cwd=ROOT, check=True)


def verdict(o: Outcome) -> str:
    if not o.compiled:
        return "compile error"
    g, t = bool(o.gate_caught), bool(o.tests_caught)
    if o.tests_caught is None:
        return "gate (tests not run)" if g else "not by the gate (tests not run)"
    return {(True, True): "both", (True, False): "gate only", (False, True): "tests only",
            (False, False): "neither"}[(g, t)]


def cell(caught: bool | None, detail: str) -> str:
    if caught is None:
        return "—" if not detail else detail
    return f"caught: {detail}" if caught else detail


def row(m: Mutation, o: Outcome) -> str:
    desc = m.desc.replace("|", "\\|")
    if not o.compiled:
        gate_cell = tests_cell = "— (does not compile)"
    else:
        gate_cell = cell(o.gate_caught, o.gate_detail).replace("|", "\\|")
        tests_cell = cell(o.tests_caught, o.tests_detail).replace("|", "\\|")
    return f"| {m.id} | {desc} | `{m.file}` | {gate_cell} | {tests_cell} | {verdict(o)} |"


HEADER = "| # | mutation | file | gate | tests | verdict |\n|---|---|---|---|---|---|"


def run_mutation(m: Mutation, with_tests: bool) -> Outcome:
    o = Outcome()
    t0 = time.monotonic()
    path = ROOT / m.file
    text = path.read_text()
    if text.count(m.old) != 1:  # checked up front; the tree may not change meanwhile
        sys.exit(f"mutation-table: mutation {m.id}: snippet no longer unique in {m.file}")
    try:
        path.write_text(text.replace(m.old, m.new, 1))
        log(f"mutation {m.id}: applied to {m.file}; building")
        ok, out = build()
        if not ok:
            o.compiled = False
            LOGS.mkdir(parents=True, exist_ok=True)
            (LOGS / f"m{m.id}-build.txt").write_text(out)
            err = next((ln for ln in out.splitlines() if "error" in ln), "")
            o.gate_detail = o.tests_detail = err.strip()[:160]
            log(f"mutation {m.id}: does not compile: {err.strip()[:160]}")
            return o
        log(f"mutation {m.id}: gate")
        o.gate_caught, o.gate_detail = gate(f"m{m.id}")
        log(f"mutation {m.id}: gate {'caught' if o.gate_caught else 'missed'}: {o.gate_detail}")
        if with_tests:
            log(f"mutation {m.id}: tests")
            o.tests_caught, o.tests_detail = tests(f"m{m.id}")
            log(f"mutation {m.id}: tests {'caught' if o.tests_caught else 'missed'}: "
                f"{o.tests_detail}")
        else:
            o.tests_detail = "not run (--no-tests)"
        return o
    finally:
        restore(m.file)
        o.seconds = time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated mutation ids (default: all)")
    ap.add_argument("--no-tests", action="store_true", help="skip ctest (gate only)")
    ap.add_argument("--check", action="store_true",
                    help="only check that every snippet occurs exactly once")
    args = ap.parse_args()

    muts = MUTATIONS
    if args.only:
        try:
            ids = [int(x) for x in args.only.split(",") if x.strip()]
        except ValueError:
            sys.exit(f"mutation-table: --only: expected comma-separated ids, found {args.only!r}")
        known = {m.id for m in MUTATIONS}
        unknown = [i for i in ids if i not in known]
        if unknown:
            sys.exit(f"mutation-table: --only: unknown mutation ids {unknown} "
                     f"(known: 1..{len(MUTATIONS)})")
        muts = [m for m in MUTATIONS if m.id in ids]
    check_snippets(muts)
    if args.check:
        print(f"all {len(muts)} snippets occur exactly once")
        return 0
    dirty = subprocess.run(["git", "status", "--porcelain", "--"] + sorted({m.file for m in muts}),
                           cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout
    if dirty.strip():
        sys.exit(f"mutation-table: local changes in files it would restore:\n{dirty}")

    with_tests = not args.no_tests
    log("baseline: building the clean tree")
    ok, out = build()
    if not ok:
        sys.exit(f"mutation-table: the clean tree does not build:\n{out[-3000:]}")
    g_caught, g_detail = gate("baseline")
    log(f"baseline gate: {'FAIL' if g_caught else 'pass'} {g_detail}")
    if g_caught:
        sys.exit(f"mutation-table: baseline gate fails: {g_detail}")
    base = f"baseline: gate pass {g_detail.removeprefix('missed ')}"
    if with_tests:
        t_caught, t_detail = tests("baseline")
        log(f"baseline tests: {'FAIL' if t_caught else 'pass'} {t_detail}")
        if t_caught:
            sys.exit(f"mutation-table: baseline tests fail: {t_detail}")
        base += f"; tests pass {t_detail.removeprefix('missed ')}"
        if COST_DATA.exists():
            BASELINE_COST.write_bytes(COST_DATA.read_bytes())
    print(base, flush=True)
    print(HEADER, flush=True)

    rows = []
    try:
        for m in muts:
            o = run_mutation(m, with_tests)
            r = row(m, o)
            rows.append(r)
            print(r, flush=True)
            log(f"mutation {m.id}: done in {o.seconds:.0f} s: {verdict(o)}")
    finally:
        log("rebuilding the clean tree")
        build()

    print()
    print(base)
    print()
    print(HEADER)
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
