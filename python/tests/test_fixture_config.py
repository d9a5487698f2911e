"""The config.json that `kvrepro fixture` writes loads in transformers for every family.

transformers 5 validates config field types: a float field written as an integer (30 for
final_logit_softcapping) or an int field written as a float (32.0 for query_pre_attn_scalar)
is refused at load. kvrepro writes these configs itself (model/config.c,
kv_config_to_json), so each family's tiny fixture is written with the binary and read back
with AutoConfig, and the fields the reference computes with must come back as written.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import unittest

from transformers import AutoConfig

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KVREPRO = os.environ.get("KVREPRO_BIN", os.path.join(ROOT, "build", "kvrepro"))
FAMILIES = ("gemma2", "gemma3", "gpt_oss", "mistral", "qwen2")


class FixtureConfigTest(unittest.TestCase):
    def test_every_family_loads(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for family in FAMILIES:
                with self.subTest(family=family):
                    out = os.path.join(tmp, family)
                    os.mkdir(out)
                    p = subprocess.run([KVREPRO, "fixture", "--family", family, "--out", out],
                                       capture_output=True, text=True)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
                        written = json.load(f)
                    cfg = AutoConfig.from_pretrained(out)  # raises on a mistyped field
                    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                "sliding_window", "rms_norm_eps", "query_pre_attn_scalar",
                                "final_logit_softcapping", "attn_logit_softcapping"):
                        if key in written:
                            self.assertEqual(getattr(cfg, key), written[key], key)


if __name__ == "__main__":
    unittest.main()
