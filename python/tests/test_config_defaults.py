"""Every optional config.json field takes transformers' default for its family.

A config.json that leaves out an optional field means "the config class's default" to
transformers, and the default differs by family (gpt_oss's rms_norm_eps is 1e-5, the others'
1e-6; num_key_value_heads is 4 for gemma2/gemma3, 8 for gpt_oss and mistral, 32 for qwen2 and
num_attention_heads for llama). Each case here writes a config.json holding only the fields
kvrepro requires (plus, in the variants, one field that changes how others default), reads it
with the reference's loader (the config_dump test program, KVREPRO_CONFIG_DUMP) and with
AutoConfig, builds the transformers model on the meta device, and checks that every value the
reference computes with is the one transformers' model uses: read from the model's modules
where they hold it (head width, score scale, norm epsilon, biases, experts, RoPE frequencies
and scaling), from the config where only the masks read it (windows per layer).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import unittest
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG_DUMP = os.environ.get("KVREPRO_CONFIG_DUMP",
                             os.path.join(ROOT, "build", "tests", "config_dump"))

# What the reference requires; 32 heads so that every family's default key/value head count
# (4, 8, 32 or num_attention_heads) divides it; 8 layers so that gemma3's every-6th full layer
# and gpt_oss's alternation both show.
REQUIRED: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 128, "intermediate_size": 32, "num_hidden_layers": 8,
    "num_attention_heads": 32,
}

CASES: dict[str, dict[str, Any]] = {
    "gemma2": {"model_type": "gemma2"},
    "gemma3_text": {"model_type": "gemma3_text"},
    "gpt_oss": {"model_type": "gpt_oss"},
    "mistral": {"model_type": "mistral"},
    "llama": {"model_type": "llama"},
    "qwen2": {"model_type": "qwen2"},
    # one given field that others default from
    "qwen2_sliding": {"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 5},
    "gemma3_pattern": {"model_type": "gemma3_text", "sliding_window_pattern": 3},
    "gpt_oss_yarn_factor": {"model_type": "gpt_oss",
                            "rope_parameters": {"rope_type": "yarn", "factor": 8.0,
                                                "original_max_position_embeddings": 16384}},
    "gpt_oss_yarn_partial": {"model_type": "gpt_oss",
                             "rope_parameters": {"rope_type": "yarn", "factor": 8.0}},
    # a top-level original_max_position_embeddings wins over the rope object's (Phi3's form)
    "gpt_oss_top_orig": {"model_type": "gpt_oss", "original_max_position_embeddings": 8192},
    "gpt_oss_rope_scaling": {"model_type": "gpt_oss",
                             "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 16.0}},
    # 64 heads: Qwen2Config's 32 key/value heads is not num_attention_heads
    "qwen2_64_heads": {"model_type": "qwen2", "num_attention_heads": 64, "hidden_size": 256},
    "gpt_oss_rope_default": {"model_type": "gpt_oss", "rope_parameters": {"rope_type": "default"}},
    "mistral_no_window": {"model_type": "mistral", "sliding_window": None},
}


def reference_config(path: str) -> dict[str, Any]:
    """The reference's resolved configuration (config_dump's JSON)."""
    p = subprocess.run([CONFIG_DUMP, path], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise AssertionError(f"config_dump {path}: exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def f32(x: float) -> float:
    """x rounded to float32, as torch applies a Python float to float32 tensors."""
    return torch.tensor(x, dtype=torch.float32).item()


def layer_rope(model: torch.nn.Module, cfg: PreTrainedConfig) -> dict[str, tuple[list[float], float]]:
    """Per layer type (None when the model has one RoPE): (inv_freq, attention scaling), from
    the model's own rotary embedding class, built on the CPU (the meta model holds no values)."""
    cls = type(model.model.rotary_emb)
    rot = cls(cfg)
    if hasattr(rot, "inv_freq"):
        return {"": (rot.inv_freq.tolist(), float(rot.attention_scaling))}
    out = {}
    for lt in ("sliding_attention", "full_attention"):
        out[lt] = (getattr(rot, f"{lt}_inv_freq").tolist(),
                   float(getattr(rot, f"{lt}_attention_scaling")))
    return out


def transformers_view(cfg: PreTrainedConfig) -> dict[str, Any]:
    """The values the transformers model computes with, in config_dump's names."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    layers = model.model.layers
    attn = layers[0].self_attn
    norm = model.model.norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    mt = cfg.model_type
    gemma = mt in ("gemma2", "gemma3_text")
    v: dict[str, Any] = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads // attn.num_key_value_groups,
        "head_dim": attn.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": eps,
        "attn_scale": f32(attn.scaling),
        # Gemma3Attention keeps attn_logit_softcapping but never applies it
        "attn_logit_softcapping": (attn.attn_logit_softcapping or 0.0) if mt == "gemma2" else 0.0,
        "final_logit_softcapping": getattr(cfg, "final_logit_softcapping", None) or 0.0,
        "tie_word_embeddings": model.lm_head.weight is model.model.embed_tokens.weight,
        "attn_qkv_bias": attn.q_proj.bias is not None,
        "attn_o_bias": attn.o_proj.bias is not None,
        "qk_norm": hasattr(attn, "q_norm"),
        "attn_sinks": hasattr(attn, "sinks"),
    }
    # the k and v projections carry a bias exactly when q does (one flag in the reference)
    for name in ("k_proj", "v_proj"):
        if (getattr(attn, name).bias is not None) != v["attn_qkv_bias"]:
            raise AssertionError(f"{mt}: {name} bias differs from q_proj's")
    if gemma:
        v["query_pre_attn_scalar"] = cfg.query_pre_attn_scalar
    if mt == "gpt_oss":
        mlp = layers[0].mlp
        v["num_experts"] = mlp.experts.num_experts
        v["experts_per_tok"] = mlp.router.top_k
        v["swiglu_limit"] = mlp.experts.limit
        v["swiglu_alpha"] = mlp.experts.alpha
    else:
        v["num_experts"] = 0
        v["experts_per_tok"] = 0
    rope = layer_rope(model, cfg)
    params = cfg.rope_parameters
    windows, thetas, freqs, scales = [], [], [], []
    for i in range(cfg.num_hidden_layers):
        if mt == "mistral":  # no layer_types: the mask slides every layer when a window is set
            lt = "sliding_attention" if cfg.sliding_window is not None else "full_attention"
        elif mt == "llama":
            lt = "full_attention"
        else:
            lt = cfg.layer_types[i]
        windows.append(cfg.sliding_window if lt == "sliding_attention" else 0)
        key = "" if "" in rope else lt
        thetas.append(params[lt]["rope_theta"] if key else params["rope_theta"])
        freqs.append(rope[key][0])
        scales.append(rope[key][1])
    v["windows"] = windows
    v["rope_thetas"] = thetas
    v["inv_freqs"] = freqs
    if len(set(scales)) != 1:
        raise AssertionError(f"{mt}: attention scaling differs between layer types: {scales}")
    v["rope_attention_factor"] = scales[0]
    return v


class ConfigDefaultsTest(unittest.TestCase):
    def check_case(self, name: str, fields: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump({**REQUIRED, **fields}, f)
            ref = reference_config(path)
            cfg = AutoConfig.from_pretrained(tmp)
        hf = transformers_view(cfg)
        ref_layers = ref["layers"]
        ref["windows"] = [layer["window"] for layer in ref_layers]
        ref["rope_thetas"] = [layer["rope_theta"] for layer in ref_layers]
        wrong: list[str] = []
        for key, want in hf.items():
            if key == "inv_freqs":
                for i, (g_row, w_row) in enumerate(zip([l["inv_freq"] for l in ref_layers], want)):
                    # torch's vectorized powf is up to 1 ulp off libm's (DESIGN §1)
                    if len(g_row) != len(w_row) or not all(
                            math.isclose(g, w, rel_tol=3e-7, abs_tol=1e-30)
                            for g, w in zip(g_row, w_row)):
                        wrong.append(f"layer {i} inv_freq: reference {g_row}, transformers {w_row}")
                continue
            got = ref[key]
            if isinstance(want, float) or isinstance(got, float):
                same = math.isclose(float(got), float(want), rel_tol=1e-15)
            else:
                same = got == want
            if not same:
                wrong.append(f"{key}: reference {got}, transformers {want}")
        self.assertEqual(wrong, [], f"{name}: the reference resolves {len(wrong)} field(s) "
                                    f"differently:\n  " + "\n  ".join(wrong))

    def test_defaults_agree(self) -> None:
        for name, fields in CASES.items():
            with self.subTest(case=name):
                self.check_case(name, fields)


if __name__ == "__main__":
    unittest.main()
