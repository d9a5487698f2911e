"""One vocabulary across surfaces (docs/cli.md, "Names"): the names
`kvrepro-hf capture --cache` takes for a layout, its aliases, its one line
for the C-only `ring`, and the lane's layer names checked against the C
gate's variants and aliases (`kvrepro gate --variants`), so the two name the
same layouts the same way.

Run: cd python/tests && PYTHONPATH=.. KVREPRO_BIN=../../build/kvrepro python -m unittest -v test_names
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import unittest

from kvrepro.cli import build_parser
from kvrepro.names import BROKEN, C_ONLY, LAYER_ALIASES, LAYERS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CAPTURE = ["capture", "--model", "m", "--prompts", "p.json", "--max-new-tokens", "2", "--out", "o.h5"]


def parse_cache(text: str) -> list[str]:
    return build_parser().parse_args([*CAPTURE, "--cache", text]).cache


def run_cli(argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, "-m", "kvrepro.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL, cwd=cwd)


def c_gate_names() -> tuple[list[str], dict[str, str]]:
    """The C gate's variants and its aliases (alias -> variant), from the
    message of a bad `kvrepro gate --variants` (read from its registry)."""
    binary = os.environ.get("KVREPRO_BIN")
    if not binary or not os.access(binary, os.X_OK):
        raise unittest.SkipTest("KVREPRO_BIN is not set to the kvrepro binary (ctest sets it)")
    p = subprocess.run([binary, "gate", "--variants", "nope"], capture_output=True, text=True, timeout=60)
    m = re.search(r"expected a comma-separated list of: ([^(\n]*) \(or the lane's names for the same "
                  r"layouts: ([^)\n]*)\)", p.stderr)
    assert p.returncode == 2 and m, p.stderr
    variants = [v.strip() for v in m.group(1).split(",")]
    aliases = dict(tuple(x.strip() for x in pair.split(" = ")) for pair in m.group(2).split(","))
    return variants, aliases


class LaneNamesTest(unittest.TestCase):
    def test_alias_is_the_layer(self) -> None:
        # the C gate's name for a layout the lane has under another name
        for alias, name in LAYER_ALIASES.items():
            self.assertEqual(parse_cache(alias), [name])
            self.assertEqual(parse_cache(f"roll,{alias}"), ["roll", name])
        self.assertEqual(parse_cache("dynamic"), ["dynamic_sliding"])

    def test_capture_spec_records_the_lanes_name(self) -> None:
        from kvrepro.capture import CaptureSpec, variant_name

        spec = CaptureSpec(model_dir="m", prompts=[[1]], scenario="s", new_tokens=1, layer="dynamic",
                           mode="eager", impl="eager", dtype="fp32", repeats=1, device="cpu")
        self.assertEqual(spec.layer, "dynamic_sliding")
        self.assertEqual(variant_name(spec.layer, spec.impl, spec.dtype), "hf:dynamic_sliding:eager:fp32")

    def test_alias_and_layer_twice_refused(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = run_cli([*CAPTURE, "--cache", "dynamic_sliding,dynamic"], tmp)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("'dynamic_sliding' given twice ('dynamic' is dynamic_sliding)", p.stderr)
            self.assertNotIn("Traceback", p.stderr)

    def test_ring_says_why_in_one_line(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = run_cli([*CAPTURE, "--cache", "roll,ring"], tmp)
            self.assertEqual(p.returncode, 2, p.stderr)
            last = p.stderr.strip().splitlines()[-1]
            self.assertRegex(last, r"^kvrepro-hf capture: error: argument --cache: ring is C-only "
                                   r"\(kvrepro gate --variants ring\): .*transformers has no such cache layer")
            self.assertNotIn("Traceback", p.stderr)
            self.assertEqual(os.listdir(tmp), [])

    def test_help_lists_aliases_and_c_only(self) -> None:
        text = " ".join(build_parser()._subparsers._group_actions[0].choices["capture"].format_help().split())
        for alias, name in LAYER_ALIASES.items():
            self.assertIn(f"{alias} (= {name})", text)
        for name in C_ONLY:
            self.assertIn(f"C-only: {name}", text)


class SameNamesAsTheCGateTest(unittest.TestCase):
    """The lane and the C gate name the same layouts the same way."""

    def test_every_c_variant_is_a_lane_name_an_alias_or_c_only(self) -> None:
        variants, _ = c_gate_names()
        for v in variants:
            with self.subTest(variant=v):
                self.assertTrue(v in LAYERS or v in LAYER_ALIASES or v in C_ONLY,
                                f"C variant {v!r} is neither a lane layer, a lane alias nor listed C-only")
        for v in C_ONLY:
            self.assertIn(v, variants, f"{v!r} is listed C-only but the C gate has no such variant")
            self.assertNotIn(v, LAYERS)

    def test_every_lane_layer_names_a_c_layout(self) -> None:
        variants, c_aliases = c_gate_names()
        for layer in LAYERS:
            with self.subTest(layer=layer):
                self.assertTrue(layer in variants or layer in c_aliases,
                                f"lane layer {layer!r} is neither a C variant nor a C alias")
        for alias in c_aliases:
            self.assertIn(alias, LAYERS, f"the C gate takes {alias!r}, which is no lane layer")
        self.assertFalse(set(BROKEN) & (set(variants) | set(c_aliases)))

    def test_aliases_agree_both_ways(self) -> None:
        _, c_aliases = c_gate_names()
        # the lane takes C's `dynamic` for dynamic_sliding: C takes dynamic_sliding for dynamic
        for c_name, lane_name in LAYER_ALIASES.items():
            self.assertEqual(c_aliases.get(lane_name), c_name)


if __name__ == "__main__":
    unittest.main()
