"""The names and limits `kvrepro-hf` checks its arguments against, in a module
that imports neither torch nor transformers: a bad command line is refused in
a fraction of a second, before the seconds those imports cost.

Each limit is the C side's, so that what the capture writes the C reader
accepts (`kvrepro gate --external`); the comment names the C constant.
"""

from __future__ import annotations

LAYERS = ("static_sliding", "dynamic_sliding", "dynamic_sliding_md", "index_copy", "cat_shift", "roll",
          "always_roll")
# Deliberately broken layers, for the harness's own tests (they must be caught):
#   always_roll_off_by_one  the right-aligned mapping computed from the count
#                           before the update: real_pos = seen - W + slot, so
#                           every slot is claimed one position early and the
#                           oldest key of a full window is masked out
#   index_copy_first_w      a prefill longer than W stores its first W rows
BROKEN = ("always_roll_off_by_one", "index_copy_first_w")
# One vocabulary across surfaces (docs/cli.md, "Names"): a layer the C gate
# has a variant of the same layout for is named as that variant. The four
# layers written here (index_copy, cat_shift, roll, always_roll) carry the C
# names. transformers' own layers keep transformers' names, because the lane
# also has kvrepro-written layers of the same layouts (`roll` is kvrepro's,
# `static_sliding` is transformers' StaticSlidingWindowLayer in roll's
# layout); the C gate takes those names for its variant (`gate --variants
# static_sliding` runs roll). Where the C name has no other layer here, the
# lane takes it for transformers' layer of that layout:
LAYER_ALIASES = {
    # C `dynamic` is DynamicSlidingWindowLayer's layout (the last W - 1 rows)
    "dynamic": "dynamic_sliding",
}
# C variants the lane has no layer for, and why, said in one line when asked.
C_ONLY = {
    "ring": "ring is C-only (kvrepro gate --variants ring): slot p mod W with no data movement is how "
            "engines with their own attention kernels (vLLM, TensorRT-LLM, llama.cpp) keep a window; "
            "transformers has no such cache layer, and the lane runs transformers' layers and the "
            "sliding updates transformers has shipped or been sent (DESIGN §3)",
}


def cache_layers(text: str) -> list[str]:
    """--cache: comma-separated layer names (LAYERS, BROKEN) or aliases
    (LAYER_ALIASES), each layer once, as the layers' own names. Raises
    ValueError with the one line to print."""
    allowed = LAYERS + BROKEN
    typed: dict[str, str] = {}   # each layer's name -> as it was typed
    for t in (t.strip() for t in text.split(",")):
        if t in C_ONLY:
            raise ValueError(C_ONLY[t])
        name = LAYER_ALIASES.get(t, t)
        if name not in allowed:
            aliases = ", ".join(f"{a} = {n}" for a, n in LAYER_ALIASES.items())
            raise ValueError(f"unknown name {t!r}: expected one of {', '.join(allowed)} "
                             f"(or the C gate's name for the same layout: {aliases})")
        if name in typed:
            alias = next((a for a in (t, typed[name]) if a != name), None)
            raise ValueError(f"{name!r} given twice" + (f" ({alias!r} is {name})" if alias else ""))
        typed[name] = t
    return list(typed)


MODES = ("eager", "compile", "reduce-overhead")
IMPLS = ("eager", "sdpa", "flex_attention")
DTYPE_NAMES = ("fp32", "bf16")

# --max-new-tokens: the limits table's KV_REPORT_MAX_STEPS (2^20,
# reports/kv_limits.h), the reader's cap on a run's steps and the C gate's
# bound on its own --max-new-tokens (harness/cmd_gate.c
# KV_GATE_MAX_NEW_TOKENS): longer than any model's context.
MAX_NEW_TOKENS = 1 << 20
# --repeats: the C gate's bound on its --repeats (harness/cmd_gate.c).
MAX_REPEATS = 100
# --threads: no machine this runs on has more cores; a larger count is a typo
# (torch would start that many threads).
MAX_THREADS = 1024
# --prompts: reports/kv_limits.h KV_PROMPTS_MAX_BYTES (64 MiB, ~10M tokens),
# and the reader's caps on a run's batch and prompt length (KV_REPORT_MAX_BATCH,
# KV_REPORT_MAX_PROMPT_LEN), which the C gate applies to its --prompts too.
MAX_PROMPTS_BYTES = 64 << 20
MAX_PROMPT_ROWS = 1 << 12
MAX_PROMPT_LEN = 1 << 20
# config.json: model/config.c KV_CONFIG_MAX_BYTES.
MAX_CONFIG_BYTES = 16 << 20
# config.json's vocab_size: reports/kv_limits.h KV_REPORT_MAX_VOCAB.
MAX_VOCAB = 1 << 22
# The bytes of runs a capture holds until it writes the report (every run's
# (steps, batch, vocab) float32 logits, and its probes): the reader's
# KV_REPORT_MAX_READ_BYTES (16 GiB, reports/kv_limits.h), so that a capture
# the machine cannot hold, or whose report no reader takes, is refused
# before the model is loaded rather than ended by the OOM killer.
MAX_HOLD_BYTES = 1 << 34
# The schema's fixed-length string fields (docs/SCHEMA.md): model and
# scenario are 64-byte fields, so at most 63 bytes of UTF-8.
MAX_NAME_BYTES = 63
# --device cuda:N: an index above any machine's device count.
MAX_CUDA_INDEX = 1023
# plot --window: a window beyond the longest prompt plus the longest decode a
# report may hold (KV_REPORT_MAX_PROMPT_LEN + KV_REPORT_MAX_STEPS) is never
# full in any run, so it is a typo.
MAX_WINDOW = MAX_PROMPT_LEN + MAX_NEW_TOKENS
# --text, a --text-file's prompt: a prompt text's UTF-8 bytes (16 MiB; a row
# is at most MAX_PROMPT_LEN tokens anyway).
MAX_TEXT_BYTES = 1 << 24
