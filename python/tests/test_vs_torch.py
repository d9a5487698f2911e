"""bench/vs_torch.py (kvrepro against transformers eager, a benchmark) as a smoke run on the
committed tiny checkpoint fixtures/hf/gemma2 (~4 s, most of it importing torch), with
bench_decode from KVREPRO_BENCH_DECODE (default build/bench_decode).

What it can fail on, none of it a timing: the prompt ids the script builds (its port of
model/prng.c) against the FNV-1a hash bench_decode prints, the RESULT lines it reads, the
greedy tokens of the two engines (the checkpoint's goldens say they agree), the table, and the
exit status 2 for a missing model directory or bench_decode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "vs_torch.py")
BENCH_DECODE = os.environ.get("KVREPRO_BENCH_DECODE", os.path.join(ROOT, "build", "bench_decode"))
MODEL = os.path.join(ROOT, "fixtures", "hf", "gemma2")


def vs_torch(*args: str, bench_decode: str = BENCH_DECODE) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, SCRIPT, "--bench-decode", bench_decode, *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout, p.stderr, sep="", end="")
    return p


class VsTorchTest(unittest.TestCase):
    def test_smoke(self) -> None:
        p = vs_torch("--model", MODEL, "--prompt-len", "8", "--batch", "2", "--new-tokens", "3",
                     "--threads", "1", "--repeats", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        out = p.stdout
        self.assertIn("greedy tokens: identical (2 x 3); prompt ids identical", out)
        self.assertIn("median of 2 rounds", out)
        self.assertIn("round 2/2:", out)
        self.assertIn("prefill: 2 x 8 tokens", out)
        self.assertIn("decode: 2 steps of 2 tokens", out)
        self.assertEqual(sum(line.split()[:1] == ["tokens/s"] for line in out.splitlines()), 2)
        self.assertEqual(sum(line.split()[:1] == ["GFLOP/s"] for line in out.splitlines()), 2)
        # gemma2's softcaps are floats in this config.json: nothing to convert.
        self.assertNotIn("read with integers as floats", out)

    def test_missing_model_dir(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = vs_torch("--model", os.path.join(tmp, "none"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a directory", p.stderr)

    def test_missing_bench_decode(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = vs_torch("--model", MODEL, bench_decode=os.path.join(tmp, "bench_decode"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("missing or not executable", p.stderr)


if __name__ == "__main__":
    unittest.main()
