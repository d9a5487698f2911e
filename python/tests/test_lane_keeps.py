"""The capture's prefill asks the model for the last position's logits only
(as transformers' generate does): every family of the
committed tiny checkpoints (fixtures/hf) takes the keyword, the prefill's
forward is called with it and returns one position, and the decode steps'
forwards are called as before (their compiled graphs and guards unchanged).
CPU, eager, the tiny checkpoints: a few seconds."""

import functools
import os
import unittest

import numpy as np
import torch

from kvrepro import capture

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
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


if __name__ == "__main__":
    unittest.main()
