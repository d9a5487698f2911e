"""The C gate's scenario batches, built here as harness/scenario.c builds
them, so that `kvrepro-hf capture --scenario NAME` (no --prompts) decodes
the very batch `kvrepro gate --model DIR` runs under that name: the same
token ids from the same prompt seed, left-padded alike, and the same number
of decode steps.

Only the scenarios a capture can run are here: one prefill of a
left-padded batch, then one token per step (no script: no prefix reuse, no
speculative rollback, no context shift; no right padding). The chunked
prefill's prompt is here too (the capture prefills it whole).

Token ids: row b of scenario NAME is `1 + kv_prng_below(g, vocab - 1)`
drawn from the SplitMix64 stream `scenario/NAME/rowB` of the prompt seed
(at real scale row 0 from `scenario/real-stream/row0`: every scenario's
first row is a prefix of one stream, whose one forward the gate cuts)
(model/prng.c: the stream's state is the FNV-1a 64 of the name XOR one
SplitMix64 step of the seed; below(n) is the top 32 bits of a draw times
n, shifted right 32). Lengths: `w * W + half * (W / 2) + w32 * (W / 32) +
add` with the full-scale row of the table for W <= 32, the real-scale one
above (KV_SCENARIO_FULL_MAX_W); W is config.json's sliding_window (16 when
the model has none). Steps: the tokens that take the longest row to W, then
3 W + 1 (full scale) or 8 (KV_SCENARIO_TAIL) more.
"""

from __future__ import annotations

from dataclasses import dataclass

# the gate's default --prompt-seed (harness/cmd_gate.c: KV_FIXTURE_DEFAULT_SEED)
DEFAULT_PROMPT_SEED = 20261122
FULL_MAX_W = 32       # harness/scenario.h KV_SCENARIO_FULL_MAX_W
TAIL = 8              # harness/scenario.h KV_SCENARIO_TAIL
NO_WINDOW_W = 16      # the W scenarios use for a model without a window

MASK64 = (1 << 64) - 1

# (w, half, w32, add) per row: harness/scenario.c k_defs, full and real scale
_ROWS: dict[str, tuple[tuple[tuple[int, int, int, int], ...], tuple[tuple[int, int, int, int], ...]]] = {
    "short_prompt_crosses_window": (((0, 0, 0, 5),), ((1, 0, 0, -8),)),
    "prompt_w_minus_1": (((1, 0, 0, -1),), ((1, 0, 0, -1),)),
    "prompt_w": (((1, 0, 0, 0),), ((1, 0, 0, 0),)),
    "prompt_w_plus_1": (((1, 0, 0, 1),), ((1, 0, 0, 1),)),
    "prefill_longer_than_window": (((3, 0, 0, 0),), ((1, 1, 0, 3),)),
    "left_padded_batch": (((3, 0, 0, 0), (0, 0, 0, 3)), ((1, 0, 1, 0), (0, 0, 0, 10))),
    "chunked_prefill": (((3, 0, 0, 0),), ((1, 0, 0, 3),)),
}
NAMES = tuple(_ROWS)


@dataclass
class ScenarioBatch:
    name: str
    prompts: list[list[int]]   # each row's ids, unpadded (the capture left-pads them)
    new_tokens: int            # the decode steps the gate runs
    window: int


def _splitmix_next(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def prng_stream(seed: int, name: str) -> int:
    """model/prng.c kv_prng_stream: the stream's initial state."""
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    _, s = _splitmix_next(seed & MASK64)
    return s ^ h


def prng_below(state: int, n: int, count: int) -> list[int]:
    """count draws of kv_prng_below(n) from state (multiply-shift)."""
    out = []
    for _ in range(count):
        state, z = _splitmix_next(state)
        out.append(((z >> 32) * n) >> 32)
    return out


def window_of(config: dict) -> int:
    """The W the C gate's scenarios are sized by: config.json's
    sliding_window, 16 without one."""
    w = config.get("sliding_window")
    return w if isinstance(w, int) and not isinstance(w, bool) and w > 0 else NO_WINDOW_W


def build(name: str, config: dict, seed: int = DEFAULT_PROMPT_SEED) -> ScenarioBatch:
    """Scenario NAME's batch for the model of config.json `config` (its
    sliding_window and vocab_size), as `kvrepro gate --prompt-seed SEED`
    builds it. Raises ValueError for a name not in NAMES."""
    if name not in _ROWS:
        raise ValueError(f"scenario {name!r}: not one the capture builds; expected one of {', '.join(NAMES)}")
    w = window_of(config)
    vocab = int(config["vocab_size"])
    full = w <= FULL_MAX_W
    rows = _ROWS[name][0 if full else 1]
    prompts = []
    for b, (nw, half, w32, add) in enumerate(rows):
        n = max(1, nw * w + half * (w // 2) + w32 * (w // 32) + add)
        # at real scale every first row is a prefix of one stream
        # (harness/scenario.c kv_scenario_stream)
        stream = "scenario/real-stream/row0" if not full and b == 0 else f"scenario/{name}/row{b}"
        state = prng_stream(seed, stream)
        prompts.append([1 + t for t in prng_below(state, vocab - 1, n)])
    longest = max(len(r) for r in prompts)
    cross = w - longest if longest < w else 0
    tail = 3 * w + 1 if full else TAIL
    return ScenarioBatch(name=name, prompts=prompts, new_tokens=cross + tail, window=w)
