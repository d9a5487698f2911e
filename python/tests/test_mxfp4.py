"""gpt-oss's MXFP4 experts, read as stored by the C reference, against transformers.

`kvrepro fixture --family gpt_oss --dtype mxfp4` writes the experts as gpt-oss ships
them (`*_blocks` of packed e2m1 pairs, `*_scales` of e8m0 exponents) and the rest in
BF16. The reference reads the blocks in place and widens them in its kernels
(model/weight.c). Two checks against transformers' own reading of the same files:

- the weights, bitwise: transformers' dequantizer (`convert_moe_packed_tensors`, the one
  `Mxfp4Config(dequantize=True)` runs) gives every expert's F32 values, and the FNV-1a of
  all weights in the reference's order (model.c, kv_model_hash) must be the hash the C
  side prints for the file it loaded;
- the logits: transformers' model on the same directory (dequantized on the CPU), captured
  and judged by `kvrepro gate --external` within the calibrated tolerance.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import unittest

import numpy as np
import torch
from safetensors import safe_open
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KVREPRO = os.environ.get("KVREPRO_BIN", os.path.join(ROOT, "build", "kvrepro"))
HF = [os.path.join(ROOT, ".venv", "bin", "kvrepro-hf")]

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    """FNV-1a 64 continued from h over data (model/prng.c's kv_fnv1a)."""
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK
    return h


def f32_bytes(t: torch.Tensor) -> bytes:
    return t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()


def reference_order(f, layers: int) -> list[torch.Tensor]:
    """gpt_oss's weights in kv_model_hash's order (KvLayerWeights' fields), the
    experts dequantized by transformers and laid out (E, out, in) as the reference
    holds them (the dequantizer returns [E, in, out])."""
    out = [f.get_tensor("model.embed_tokens.weight")]
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight",
                     "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                     "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                     "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                     "self_attn.o_proj.bias", "self_attn.sinks", "mlp.router.weight",
                     "mlp.router.bias"):
            out.append(f.get_tensor(p + name))
        for stack in ("gate_up_proj", "down_proj"):
            base = p + "mlp.experts." + stack
            w = convert_moe_packed_tensors(f.get_tensor(base + "_blocks"),
                                           f.get_tensor(base + "_scales"), dtype=torch.float32)
            out.append(w.transpose(1, 2))
            out.append(f.get_tensor(base + "_bias"))
    out.append(f.get_tensor("model.norm.weight"))
    out.append(f.get_tensor("lm_head.weight"))
    return out


class Mxfp4Test(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = os.path.join(self.tmp.name, "gpt_oss-mxfp4")
        p = subprocess.run([KVREPRO, "fixture", "--family", "gpt_oss", "--dtype", "mxfp4",
                            "--out", self.dir], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r"weights fnv1a64: 0x([0-9a-f]{16})", p.stdout)
        self.assertIsNotNone(m, p.stdout)
        self.c_hash = int(m.group(1), 16)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def test_dequantized_weights_bitwise(self) -> None:
        path = os.path.join(self.dir, "model.safetensors")
        with safe_open(path, "pt") as f:
            keys = set(f.keys())
            self.assertIn("model.layers.0.mlp.experts.gate_up_proj_blocks", keys)
            self.assertNotIn("model.layers.0.mlp.experts.gate_up_proj", keys)
            layers = 1 + max(int(k.split(".")[2]) for k in keys if k.startswith("model.layers."))
            tensors = reference_order(f, layers)
        h = FNV_OFFSET
        for t in tensors:
            h = fnv1a64(f32_bytes(t), h)
        self.assertEqual(h, self.c_hash,
                         f"transformers' dequantized weights hash to {h:#018x}, the reference's "
                         f"to {self.c_hash:#018x}: some expert value differs")
        # the experts are not trivial: both nibble halves and several scales
        e = tensors[14]
        self.assertGreater(len(np.unique(e.numpy())), 16)

    def test_logits_within_the_gates_tolerance(self) -> None:
        prompts = os.path.join(self.tmp.name, "p.json")
        with open(prompts, "w", encoding="utf-8") as fh:
            fh.write("[[5, 17, 99, 3, 42, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]")
        cap = os.path.join(self.tmp.name, "cap.h5")
        p = subprocess.run(HF + ["capture", "--model", self.dir, "--prompts", prompts,
                                 "--max-new-tokens", "8", "--cache", "static_sliding",
                                 "--mode", "eager", "--attn", "eager", "--out", cap],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        g = subprocess.run([KVREPRO, "gate", "--model", self.dir, "--external", cap],
                           capture_output=True, text=True)
        self.assertEqual(g.returncode, 0, g.stdout[-3000:] + g.stderr[-2000:])
        self.assertRegex(g.stdout, r"hf:static_sliding:eager:fp32 +torch-cpu +eager +0 +PASS")


if __name__ == "__main__":
    unittest.main()
