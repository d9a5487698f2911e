"""The capture driver: a greedy decode through transformers' own model with a
chosen cache layer, attention implementation, dtype and mode, recorded per
step and row as the C side records its runs (docs/SCHEMA.md).

The prefill runs eagerly (as transformers' own generate does with a compiled
forward); the decode steps run through the mode's function: model.forward
itself (`eager`), torch.compile(fullgraph=True) (`compile`, inductor, any
device) or torch.compile(mode="reduce-overhead") (`reduce-overhead`, CUDA
graphs; CUDA only).

Probes (per step, per batch row, FNV-1a 64 of the float32 row bytes):
  embed, layerN.attn, layerN.out   forward hooks; eager only: a fullgraph
                                   compiled region runs no Python hooks
  layerN.cache                     read from the cache after the step, in
                                   ascending position (caches.visible_cache_rows),
                                   so every mode and every layout records it
  logits                           the step's logits row
A compiled run therefore records `layerN.cache` and `logits` only; its
probe_names say so.

Timings (every run; wall clock, the device synchronized at both ends): the
prefill, and each decode step's call as the decode loop makes it (the step's
masks built, the forward, a custom layer's host count advanced; not the
probes, which are hashed between steps), step_ms[i] being the call that
gives step i + 1's logits. The steady per-step time is the median from
steady_from() on: after the last step that compiled a graph or recorded a
CUDA graph, and its warm-up. Masks: transformers' own compileable cache gets
them built before the forward as generate builds them (generate_masks);
its dynamic cache, the 2-D mask; the custom layers, 4-D masks from their
slot mapping (build_masks).
"""

from __future__ import annotations

import inspect
import logging
import os
import platform
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import transformers

from . import __version__
from .caches import (GRAPH_BUDGET, CacheSetup, SlidingLayer, make_cache, mark_growing_dims,
                     visible_cache_rows)
from .errors import InputError
from .fnv import fnv1a64_rows
from .names import IMPLS, LAYER_ALIASES, MODES  # noqa: F401 (IMPLS, MODES re-exported)
from .report import Run, margins_of

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class CaptureSpec:
    model_dir: str
    prompts: list[list[int]]
    scenario: str
    new_tokens: int
    layer: str
    mode: str
    impl: str
    dtype: str
    repeats: int
    device: str
    # the rows' texts and "<name> vocab=<V> sha256=<16 hex>" of their
    # tokenizer, when the prompts came from texts (None: ids only, and the
    # report has no prompt_text, no tokenizer attribute)
    texts: list[str] | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        # a layer named by the C gate's name for its layout (names.LAYER_ALIASES)
        # is recorded under the lane's own name, as the CLI records it
        self.layer = LAYER_ALIASES.get(self.layer, self.layer)


class RecompileLog(logging.Handler):
    """Counts dynamo's recompile messages (the `recompiles` log artifact,
    what TORCH_LOGS=recompiles prints) and keeps the first one's guard."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.first = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if not self.first:
            lines = [ln.strip() for ln in record.getMessage().splitlines() if ln.strip().startswith("- ")]
            self.first = lines[0][2:] if lines else record.getMessage().splitlines()[0]


def _recompile_logger() -> logging.Logger:
    return logging.getLogger("torch._dynamo.guards.__recompiles")


class CudagraphSkips(logging.Handler):
    """While entered: how many times inductor declined to wrap a compiled
    graph in a CUDA graph (its `cudagraph_skips` counter) and the first
    reason it logged ("skipping cudagraphs due to mutated inputs ..."). A
    reduce-overhead decode whose graphs were skipped runs compiled code
    launched kernel by kernel: its step times are not CUDA graph replays."""

    LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.first = ""
        self._start = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if not self.first and "skipping cudagraphs" in text:
            self.first = text.splitlines()[0].strip()

    def __enter__(self) -> "CudagraphSkips":
        from torch._dynamo.utils import counters

        self._start = counters["inductor"]["cudagraph_skips"]
        logging.getLogger(self.LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        from torch._dynamo.utils import counters

        logging.getLogger(self.LOGGER).removeHandler(self)
        self.count = counters["inductor"]["cudagraph_skips"] - self._start


def left_pad(prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(B, P) int32 ids left-padded with 0 and (B, P) uint8 real flags."""
    p = max(len(r) for r in prompts)
    ids = np.zeros((len(prompts), p), np.int32)
    real = np.zeros((len(prompts), p), np.uint8)
    for b, row in enumerate(prompts):
        ids[b, p - len(row):] = row
        real[b, p - len(row):] = 1
    return ids, real


def load_model(model_dir: str, impl: str, dtype: str, device: str) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=DTYPES[dtype], attn_implementation=impl)
    return model.to(device).eval()


def skip_reason(spec: CaptureSpec) -> str:
    """Why this configuration cannot run here, or "" (known before loading
    the model; load_model's refusal of an attention implementation is the
    other reason a run is skipped)."""
    if spec.mode == "reduce-overhead" and not spec.device.startswith("cuda"):
        why = "no CUDA device" if not torch.cuda.is_available() else "device is " + spec.device
        return f"reduce-overhead captures CUDA graphs: {why}"
    if spec.mode == "reduce-overhead" and spec.layer == "dynamic_sliding":
        # DynamicSlidingWindowLayer grows its keys and values by torch.cat:
        # under cudagraph trees they are the graph's outputs, overwritten by
        # the next replay (torch 2.11 on an H200 raised "accessing tensor
        # output of CUDAGraphs that has been overwritten by a subsequent
        # run"), and transformers' generate compiles only caches whose
        # is_compileable is true, which a dynamic cache's is not
        return ("reduce-overhead: transformers' dynamic_sliding is not a compileable cache "
                "(generate never compiles it; its growing keys and values are CUDA graph outputs "
                "that the next replay overwrites); compile mode judges it compiled")
    if spec.impl == "flex_attention" and spec.layer not in ("static_sliding", "dynamic_sliding"):
        return ("flex_attention needs a BlockMask; custom layers pass 4-D masks built from their "
                "slot mapping (eager and sdpa only)")
    return ""


def build_masks(setup: CacheSetup, model_type: str, real: np.ndarray, seen: int, n: int,
                impl: str, dtype: torch.dtype,
                device: str) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention masks of a custom cache for n new tokens after `seen`,
    from each layer's key positions: key c of a query at position q is
    visible when it holds a real (non-pad) position k with q - W < k <= q on
    sliding layers, k <= q on full layers (DESIGN §2). A pad query sees
    itself only, so no softmax row is empty (an all-masked SDPA row is NaN,
    and NaN times a zero weight would reach real rows through the pads'
    cached values). eager takes an additive float mask, sdpa a boolean one."""
    b = real.shape[0]
    p = real.shape[1]
    qpos = np.arange(seen, seen + n)

    def is_real(pos: np.ndarray) -> np.ndarray:  # (B, K)
        ok = pos >= 0
        r = np.ones((b, pos.size), bool)
        inside = ok & (pos < p)
        r[:, inside] = real[:, pos[inside]].astype(bool)
        r[:, ~ok] = False
        return r

    def mask_for(kpos: np.ndarray, window: int | None) -> torch.Tensor:
        vis = (kpos[None, :] >= 0) & (kpos[None, :] <= qpos[:, None])          # (Q, K)
        if window is not None:
            vis &= kpos[None, :] > qpos[:, None] - window
        m = vis[None, :, :] & is_real(kpos)[:, None, :]                          # (B, Q, K)
        q_real = is_real(qpos)                                                    # (B, Q)
        self_col = (kpos[None, :] == qpos[:, None])[None, :, :] & ~q_real[:, :, None]
        m = m | self_col
        t = torch.from_numpy(m[:, None, :, :].copy()).to(device)
        if impl == "sdpa":
            return t
        neg = torch.finfo(dtype).min
        return torch.where(t, torch.zeros((), dtype=dtype, device=device),
                           torch.full((), neg, dtype=dtype, device=device))

    masks = {}
    for i, t in enumerate(setup.layer_types):
        if t in masks:
            continue
        lay = setup.cache.layers[i]
        if isinstance(lay, SlidingLayer):
            masks[t] = mask_for(np.array(lay.key_positions(seen, n)), setup.window)
        else:  # StaticLayer: slot = position, max_len slots
            masks[t] = mask_for(np.arange(setup.max_len), None)
    if model_type == "mistral":  # one mask for every layer (mistral takes no dict)
        return masks[setup.layer_types[0]]
    return masks


def generate_masks(model: torch.nn.Module, attention_mask: torch.Tensor, setup: CacheSetup,
                   position_ids: torch.Tensor, batch: int, n: int) -> Any:
    """The masks of a step of n tokens for transformers' own compileable
    cache (StaticCache), built as transformers' generate builds them
    (GenerationMixin.prepare_inputs_for_generation: a compileable cache's
    2-D padding mask becomes its 4-D masks before the forward, with
    transformers' own create_masks_for_generate, "important for performant
    compiled forward pass"), so that a compiled decode sees masks of a fixed
    shape as it does under generate, not a 2-D mask one column longer at
    every step. The same masks the forward would build: eager logits are
    bitwise those of passing the 2-D mask (tests)."""
    from transformers.masking_utils import create_masks_for_generate

    make = getattr(model, "create_masks_for_generate", create_masks_for_generate)
    return make(config=model.config,
                inputs_embeds=torch.empty((batch, n, 0), dtype=model.dtype, device=attention_mask.device),
                attention_mask=attention_mask, past_key_values=setup.cache, position_ids=position_ids)


class Probes:
    """Forward hooks for embed, layerN.attn, layerN.out (eager only)."""

    def __init__(self, model: torch.nn.Module, hooks: bool):
        self.values: dict[str, torch.Tensor] = {}
        self.handles = []
        inner = model.model
        n_layers = len(inner.layers)
        self.names = []
        if hooks:
            self.names.append("embed")
            self.handles.append(inner.embed_tokens.register_forward_hook(self._hook("embed")))
        for i, layer in enumerate(inner.layers):
            if hooks:
                self.names.append(f"layer{i}.attn")
                self.handles.append(layer.self_attn.register_forward_hook(self._hook(f"layer{i}.attn")))
            self.names.append(f"layer{i}.cache")
            if hooks:
                self.names.append(f"layer{i}.out")
                self.handles.append(layer.register_forward_hook(self._hook(f"layer{i}.out")))
        self.names.append("logits")
        self.n_layers = n_layers

    def _hook(self, name: str):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            self.values[name] = t.detach()
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def row_hashes(self, setup: CacheSetup, seen: int, batch: int, memo: ProbeMemo) -> np.ndarray:
        """(NP, B) hashes of this step's probes (probe_row_hashes, hashing
        only what memo does not already hold); the logits probe is left 0
        here and filled from the logits' own row hashes once the decode is
        done (decode())."""
        out = []
        for name in self.names:
            if name == "logits":
                out.append(np.zeros(batch, np.uint64))
                continue
            if name.endswith(".cache"):
                layer = int(name[5:-6])
                rows = cache_rows(setup, layer, seen)
                positions, _ = visible_cache_rows(setup, layer, seen)
                labels = [("k", p) for p in positions] + [("v", p) for p in positions] \
                    if rows.shape[1] == 2 * len(positions) else list(range(rows.shape[1]))
            else:
                # a copy: the memo keeps it, and the model may reuse the storage
                t = self.values[name].float().clone()
                rows = t.reshape(t.shape[0], -1, t.shape[-1]) if t.dim() > 1 else t.reshape(-1, 1, 1)
                labels = list(range(rows.shape[1]))
            out.append(memo.row_hashes(name, rows, labels))
        self.values.clear()
        return np.stack(out)


@dataclass
class SliceState:
    """A probe's slices as hashed at one step: what each slice holds
    (`labels`: a cache probe's ("k", position) and ("v", position), a hook
    probe's token index), the float32 rows (B, N, F) where they are (on the
    GPU for a CUDA run) and their FNV-1a 64 hashes (B, N)."""

    labels: list
    rows: torch.Tensor
    hashes: np.ndarray


def hash_slices(rows: torch.Tensor, labels: list, old: SliceState | None) -> SliceState:
    """The FNV-1a 64 of each F-element float32 slice of rows (B, N, F),
    hashing only the slices that an earlier state `old` does not hold with
    the same label and the same bits. A cache probe's rows are the W
    positions the next query may see, and from one decode step to the next
    one position enters and one leaves: hashing every slice again (a
    4096-position window of 1024-wide K and V rows is 8192 slices of 4 KiB,
    ~0.6 s in numpy) would cost far more than the step. The bits are
    compared where the rows are, as int32 (NaN, -0.0 and every payload count
    as their bits), and equal bytes have equal hashes, so the result is
    exactly that of hashing every slice (slice_hashes), as the tests check."""
    rows = rows.detach().float()
    b, n = rows.shape[0], rows.shape[1]
    src = np.full(n, -1, np.int64)   # old's slice of the same label, or -1
    if old is not None and old.rows.device == rows.device and old.rows.shape[0] == b \
            and old.rows.shape[2:] == rows.shape[2:]:
        at = {lab: i for i, lab in enumerate(old.labels)}
        src = np.fromiter((at.get(lab, -1) for lab in labels), np.int64, count=n)
    hashes = np.zeros((b, n), np.uint64)
    need = np.ones((b, n), bool)
    have = np.flatnonzero(src >= 0)
    if have.size:
        assert old is not None
        new_bits, old_bits = rows.view(torch.int32), old.rows.view(torch.int32)
        # runs where both indices step by one (a window moved by a position:
        # its K rows, then its V rows), compared as slices, not gathered
        cut = np.flatnonzero((np.diff(have) != 1) | (np.diff(src[have]) != 1)) + 1
        parts = []
        for run in np.split(np.arange(have.size), cut):
            j, i, k = int(have[run[0]]), int(src[have[run[0]]]), run.size
            parts.append((new_bits[:, j:j + k] == old_bits[:, i:i + k]).all(-1))
        same = torch.cat(parts, dim=1).cpu().numpy()                                 # (B, len(have))
        hashes[:, have] = np.where(same, old.hashes[:, src[have]], np.uint64(0))
        need[:, have] = ~same
    if need.any():
        todo = rows[torch.from_numpy(need).to(rows.device)]                         # (N', F)
        hashes[need] = fnv1a64_rows(np.ascontiguousarray(todo.cpu().numpy(), dtype="<f4"))
    return SliceState(list(labels), rows, hashes)


# The most bytes of probe rows a ProbeMemo keeps (float32, where the rows
# are: GPU memory for a CUDA run). attn2b's two layers keep ~0.3 GB; a
# 26-layer model at W 4096 (Gemma 2 2B) would keep ~3.5 GB without a bound.
MEMO_BYTES = 2 << 30


class ProbeMemo:
    """The slice states a capture keeps to hash less (hash_slices): per
    probe, its state at the run's previous step and its state at the first
    run's step 0 (the prefill, which every mode runs eagerly: the repeats,
    and often the other modes and cache layers, give it the same bits).
    At most max_bytes of rows are kept: the previous steps' first (each
    decode step reuses them), the step-0 states in what is left; a state
    not kept costs only the hashing it would have saved."""

    def __init__(self, max_bytes: int = MEMO_BYTES) -> None:
        self.first: dict[str, SliceState] = {}
        self.last: dict[str, SliceState] = {}
        self.max_bytes = max_bytes

    def kept_bytes(self) -> int:
        held = {id(s.rows): s.rows.numel() * s.rows.element_size()
                for s in (*self.first.values(), *self.last.values())}
        return sum(held.values())

    def start_run(self) -> None:
        self.last = {}

    def row_hashes(self, name: str, rows: torch.Tensor, labels: list) -> np.ndarray:
        """(B,) the probe's hash of rows (B, N, F) (probe_row_hashes)."""
        state = hash_slices(rows, labels, self.last.get(name) or self.first.get(name))
        self.last.pop(name, None)
        size = state.rows.numel() * state.rows.element_size()
        while self.first and self.kept_bytes() + size > self.max_bytes:
            self.first.pop(next(iter(self.first)))
        if self.kept_bytes() + size <= self.max_bytes:
            self.last[name] = state
            if name not in self.first:
                self.first[name] = state   # the same rows: no more bytes
        return combine_slices(state.hashes)


def slice_hashes(t: torch.Tensor) -> np.ndarray:
    """(B, S) the FNV-1a 64 of each F-element float32 slice of t (B, ..., F)."""
    a = np.ascontiguousarray(t.detach().float().cpu().numpy(), dtype="<f4")
    b = a.shape[0]
    f = a.shape[-1] if a.ndim > 1 else 1
    return fnv1a64_rows(a.reshape(-1, f)).reshape(b, -1)


def combine_slices(slices: np.ndarray) -> np.ndarray:
    """(B,) FNV-1a 64 of the little-endian bytes of each row's slice hashes."""
    b = slices.shape[0]
    return fnv1a64_rows(np.ascontiguousarray(slices, dtype="<u8").view(np.uint8).reshape(b, -1))


def probe_row_hashes(t: torch.Tensor) -> np.ndarray:
    """(B,) hash of each batch row of t (B, ..., F): FNV-1a 64 of the
    little-endian bytes of the FNV-1a 64 hashes of its F-element float32
    slices (one per token, or per cached K or V row), in order. Two levels
    because FNV is serial in the bytes and numpy runs it one byte column at
    a time over all rows at once: a whole 1000-token prefill row of a
    2304-wide model would be 9M serial steps, its slices 9216 steps over
    1000 rows. Any change of any element still changes the hash (up to
    FNV collisions), which is all the bitwise comparisons need; these
    hashes are compared only with other captures, never with the C side's."""
    return combine_slices(slice_hashes(t))


def cache_rows(setup: CacheSetup, layer: int, seen: int) -> torch.Tensor:
    """(B, 2L, KVH * D): for the L positions the next query may see from
    layer's cache, ascending, their K rows, then their V rows."""
    lay = setup.cache.layers[layer]
    _, slots = visible_cache_rows(setup, layer, seen)
    if not slots or lay.keys is None or lay.keys.numel() == 0:
        batch = lay.keys.shape[0] if lay.keys is not None and lay.keys.dim() == 4 else 1
        return torch.zeros((batch, 0, 1))
    if min(slots) < 0:  # the layout lost a position the window still needs
        raise RuntimeError(f"layer {layer}: cache does not hold a visible position")
    idx = torch.tensor(slots, dtype=torch.long, device=lay.keys.device)
    k = lay.keys.index_select(2, idx).transpose(1, 2)   # (B, L, KVH, D)
    v = lay.values.index_select(2, idx).transpose(1, 2)
    return torch.cat([k, v], dim=1).flatten(2)          # (B, 2L, KVH * D)


def engine_text(spec: CaptureSpec) -> str:
    return (f"transformers {transformers.__version__}, torch {torch.__version__}, "
            f"attn {spec.impl}, {spec.dtype}, {spec.mode}")


def variant_name(layer: str, impl: str, dtype: str) -> str:
    return f"hf:{layer}:{impl}:{dtype}"


def last_logits_kwargs(model: torch.nn.Module) -> dict[str, int]:
    """The forward keyword that asks for the last position's logits only,
    as transformers' generate asks (GenerationMixin._supports_logits_to_keep):
    `logits_to_keep` in transformers 5 (every family kvrepro captures),
    `num_logits_to_keep` in the 4.4x releases that named it so, nothing for
    a model that takes neither. Without it the prefill projects every prompt
    position onto the vocabulary (P x V floats per row) for one row of output;
    the kept row is the same lm_head product of the same hidden state."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


# The steady state of a decode's per-step time starts WARM_STEPS[mode] steps
# after the last step that changed the code the decode runs: the last step
# whose call compiled a graph, or the first decode step when none did. One
# step for the step itself (compiling; in eager the first step, which
# allocates and picks its kernels), and for reduce-overhead one more: cudagraph
# trees run a new graph once to warm up, record it on the next call and
# replay it from then on. And after the last step that recorded a CUDA graph:
# cudagraph trees record a graph again for each new value of a dynamic size
# or integer, so a decode whose every step records has no steady state.
WARM_STEPS = {"eager": 1, "compile": 1, "reduce-overhead": 2}


def steady_from(mode: str, compiled_at: list[int], recorded_at: list[int] | None = None) -> int:
    """The first decode step of the steady state (compiled_at: the steps
    whose call compiled a graph, recorded_at: those whose call recorded a
    CUDA graph; ascending)."""
    after_compile = (compiled_at[-1] if compiled_at else 0) + WARM_STEPS[mode]
    return max(after_compile, recorded_at[-1] + 1) if recorded_at else after_compile


class CudagraphRecords:
    """While entered: the decode steps (`step`, set by the caller) during
    which cudagraph trees recorded a CUDA graph, from torch's own compile
    callbacks (CallbackTrigger.CUDAGRAPH_RECORDING). Enter it after
    torch._dynamo.reset(), which clears the callbacks."""

    def __init__(self) -> None:
        self.at: list[int] = []
        self.step = -1

    def __call__(self, args: object) -> None:
        from torch._dynamo.callback import CallbackTrigger

        if getattr(args, "callback_trigger", None) == CallbackTrigger.CUDAGRAPH_RECORDING:
            self.at.append(self.step)

    def __enter__(self) -> "CudagraphRecords":
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self)
        return self

    def __exit__(self, *exc: object) -> None:
        from torch._dynamo.callback import callback_handler

        try:
            callback_handler.remove_start_callback(self)
        except ValueError:   # cleared meanwhile (a dynamo reset)
            pass


def steady_ms(step_ms: np.ndarray, first: int) -> float:
    """The median of the steps from `first` on: the per-step time of the
    steady state, NaN when the decode has no such step (too few steps for
    the warm-up)."""
    rest = step_ms[first:]
    return float(np.median(rest)) if rest.size else float("nan")


def decode(model: torch.nn.Module, spec: CaptureSpec, ids_np: np.ndarray, real_np: np.ndarray,
           repeat: int, memo: ProbeMemo | None = None) -> Run:
    """One recorded greedy decode of spec.new_tokens steps (memo: the probe
    slices earlier runs of the capture hashed)."""
    memo = memo if memo is not None else ProbeMemo()
    memo.start_run()
    config = model.config
    dev = spec.device
    b, p = ids_np.shape
    n_steps = spec.new_tokens
    setup = make_cache(spec.layer, config, p + n_steps)
    compiled = spec.mode != "eager"
    probes = Probes(model, hooks=not compiled)
    dtype = DTYPES[spec.dtype]
    tokens = np.zeros((n_steps, b), np.int32)
    logits_all = np.zeros((n_steps, b, config.vocab_size), np.float32)
    hashes = np.zeros((n_steps, len(probes.names), b), np.uint64)
    ids = torch.from_numpy(ids_np.astype(np.int64)).to(dev)
    am = torch.from_numpy(real_np.astype(np.int64)).to(dev)
    pos = (am.cumsum(-1) - 1).masked_fill(am == 0, 0)
    fn = model.forward
    # the prefill's only: a decode step has one position anyway, and its
    # compiled graphs (and their guards, which `recompiles` counts) stay
    # the ones they were
    prefill_kwargs = last_logits_kwargs(model)
    graphs = recompiles = 0
    first_reason = ""
    if compiled:
        torch._dynamo.reset()   # each run compiles its own graphs: honest per-run counts
        fn = torch.compile(model.forward, fullgraph=True,
                           mode="reduce-overhead" if spec.mode == "reduce-overhead" else None)
    from torch._dynamo.utils import counters
    log = RecompileLog()
    logger = _recompile_logger()
    cuda = dev.startswith("cuda")

    def sync() -> None:
        # the step's kernels done before its clock stops (a CUDA launch returns at once)
        if cuda:
            torch.cuda.synchronize(dev)

    step_ms = np.zeros(max(n_steps - 1, 0), np.float64)
    compiled_at: list[int] = []   # the decode steps whose call compiled a graph
    skips = CudagraphSkips()
    records = CudagraphRecords()
    try:
        with torch.no_grad(), skips, records:
            def step(f, input_ids, seen, n, **kwargs):
                if not setup.native:
                    mask = build_masks(setup, config.model_type, real_np, seen, n, spec.impl, dtype, dev)
                elif getattr(setup.cache, "is_compileable", False):
                    mask = generate_masks(model, am, setup, pos, b, n)
                else:
                    mask = am
                if setup.mark_dynamic and f is not model.forward:
                    mark_growing_dims(setup, mask)
                out = f(input_ids=input_ids, attention_mask=mask, position_ids=pos,
                        past_key_values=setup.cache, use_cache=True, **kwargs)
                if not setup.native and n == 1:
                    for lay in setup.cache.layers:
                        if isinstance(lay, SlidingLayer):
                            lay.advance(1)
                return out.logits[:, -1, :].float()

            sync()
            t0 = time.perf_counter()
            lg = step(model.forward, ids, 0, p, **prefill_kwargs)  # prefill: eager, last position
            sync()
            prefill_s = time.perf_counter() - t0
            graphs0 = counters["stats"]["unique_graphs"]
            if compiled:
                torch._logging.set_logs(recompiles=True)
                logger.addHandler(log)
                logger.propagate = False
            for n in range(n_steps):
                seen = p + n
                row = lg.cpu().numpy()
                logits_all[n] = row
                hashes[n] = probes.row_hashes(setup, seen, b, memo)
                tokens[n] = np.argmax(row, axis=-1)        # first maximum: ties to the lowest id
                if n + 1 == n_steps:
                    break
                nxt = torch.from_numpy(tokens[n].astype(np.int64)).to(dev)[:, None]
                am = torch.cat([am, torch.ones((b, 1), dtype=am.dtype, device=dev)], dim=1)
                pos = pos[:, -1:] + 1
                before = counters["stats"]["unique_graphs"]
                records.step = n
                t0 = time.perf_counter()
                lg = step(fn, nxt, seen, 1)
                sync()
                step_ms[n] = (time.perf_counter() - t0) * 1e3
                if counters["stats"]["unique_graphs"] != before:
                    compiled_at.append(n)
            graphs = counters["stats"]["unique_graphs"] - graphs0
            # the logits probe of each step is the row's logits_hash (FNV-1a 64 of its bytes)
            logits_hash = fnv1a64_rows(logits_all.reshape(n_steps * b, -1)).reshape(n_steps, b)
            hashes[:, probes.names.index("logits"), :] = logits_hash
            recompiles, first_reason = log.count, log.first
    finally:
        probes.remove()
        if compiled:
            logger.removeHandler(log)
            logger.propagate = True
            torch._logging.set_logs()
    first = steady_from(spec.mode, compiled_at, records.at)
    extra: dict[str, str | int] = {"attn_impl": spec.impl, "dtype": spec.dtype, "cache_layer": spec.layer,
                                   "window": setup.window}
    if spec.mode == "reduce-overhead":
        extra["cudagraph_records"] = len(records.at)
        extra["cudagraph_skips"] = skips.count
        if skips.first:
            extra["cudagraph_skip"] = skips.first.encode()[:1023].decode(errors="ignore")
    if compiled:
        extra["probes_seen"] = "layerN.cache and logits: a fullgraph compiled region runs no forward hooks"
        if first_reason:
            # at most 1023 UTF-8 bytes, cut at a character: what the C side's
            # report keeps (KvRun.first_recompile) and `gate --external` copies
            extra["first_recompile"] = first_reason.encode()[:1023].decode(errors="ignore")
    if spec.texts is not None and spec.tokenizer is not None:
        extra["tokenizer"] = spec.tokenizer
    return Run(model=os.path.basename(os.path.abspath(spec.model_dir)), scenario=spec.scenario,
               variant=variant_name(spec.layer, spec.impl, spec.dtype),
               backend="torch-cuda" if dev.startswith("cuda") else "torch-cpu", mode=spec.mode,
               repeat=repeat, engine=engine_text(spec), prompt=ids_np, prompt_real=real_np,
               tokens=tokens, logits=logits_all, margins=margins_of(logits_all), logits_hash=logits_hash,
               probe_names=probes.names, probe_hash=hashes,
               graphs_captured=graphs if compiled else 0, recompiles=recompiles if compiled else -1,
               graph_budget=GRAPH_BUDGET.get(spec.layer, -1) if compiled else -1,
               extra=extra, vocab=config.vocab_size, steps=n_steps, prompt_text=spec.texts,
               seconds=prefill_s + float(step_ms.sum()) / 1e3, prefill_ms=prefill_s * 1e3, step_ms=step_ms,
               steady_from=first, step_ms_steady=steady_ms(step_ms, first),
               compile_ms=float(step_ms[compiled_at].sum()) if compiled_at else 0.0)


def load_or_refusal(spec: CaptureSpec) -> tuple[torch.nn.Module | None, str]:
    """The model, or None and transformers' reason for refusing spec.impl
    for it (e.g. gemma2 refuses sdpa: it would drop the softcap)."""
    try:
        return load_model(spec.model_dir, spec.impl, spec.dtype, spec.device), ""
    except (ValueError, ImportError) as e:
        first = str(e).split(". ")[0].strip()
        return None, f"transformers refuses attn {spec.impl}: {first}"[:255]
    except Exception as e:  # a checkpoint transformers cannot read (missing or damaged weights): bad input
        lines = str(e).strip().splitlines()
        raise InputError(f"{spec.model_dir}: transformers cannot load the model: {type(e).__name__}: "
                         f"{lines[0][:300] if lines else ''}") from None


def skip_runs(spec: CaptureSpec, why: str, vocab: int) -> list[Run]:
    """One skipped run per repeat, with the reason."""
    return [Run(model=os.path.basename(os.path.abspath(spec.model_dir)), scenario=spec.scenario,
                variant=variant_name(spec.layer, spec.impl, spec.dtype),
                backend="torch-cuda" if spec.device.startswith("cuda") else "torch-cpu",
                mode=spec.mode, repeat=r, engine=engine_text(spec), skipped=True,
                skip_reason=why[:255], vocab=vocab, steps=spec.new_tokens)
            for r in range(spec.repeats)]


def capture(spec: CaptureSpec, model: torch.nn.Module, memo: ProbeMemo | None = None) -> list[Run]:
    """spec.repeats runs of a loaded model, or skipped runs with the reason
    when the configuration cannot run here (memo: the probe slices hashed
    by earlier captures of the model, to hash less; one for these repeats
    when None)."""
    return list(capture_runs(spec, model, memo))


def capture_runs(spec: CaptureSpec, model: torch.nn.Module, memo: ProbeMemo | None = None) -> Iterator[Run]:
    """capture()'s runs, each as soon as it is done."""
    why = skip_reason(spec)
    if why:
        yield from skip_runs(spec, why, model.config.vocab_size)
        return
    ids, real = left_pad(spec.prompts)
    memo = memo if memo is not None else ProbeMemo()
    for r in range(spec.repeats):
        try:
            run = decode(model, spec, ids, real, r, memo)
        except Exception as e:  # the engine under test failed: recorded, never hidden
            yield from failed_run(spec, r, e, model.config.vocab_size)
            continue
        yield run


def failed_run(spec: CaptureSpec, repeat: int, e: Exception, vocab: int) -> list[Run]:
    """A run the engine could not complete: stored like a skipped run (it has
    no data) whose reason starts with "failed:", which `kvrepro gate
    --external` counts as a failure, not a skip."""
    text = str(e)
    detail = next((ln.strip() for ln in text.splitlines() if "error:" in ln), text.splitlines()[0] if text else "")
    detail = detail.split(" error: ", 1)[-1]   # drop a compiler's temporary file path
    why = f"failed: {type(e).__name__}: {detail}"
    run = skip_runs(CaptureSpec(**{**spec.__dict__, "repeats": 1}), why, vocab)[0]
    run.repeat = repeat
    return [run]


def root_attributes(device: str, command: str) -> dict[str, str | int]:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    if device.startswith("cuda"):
        dev = (f"{torch.cuda.get_device_name(torch.device(device))}, CUDA {torch.version.cuda}, "
               f"cuDNN {torch.backends.cudnn.version()}")
        tf32 = torch.backends.cuda.matmul.allow_tf32
        math = f"torch {'TF32' if tf32 else 'no TF32'}"
    else:
        dev = f"cpu only ({platform.machine()}, torch CPU capability {torch.backends.cpu.get_cpu_capability()})"
        math = f"torch CPU, {torch.get_num_threads()} threads"
    return {"tool_version": f"kvrepro-hf {__version__}", "git_commit": commit, "host": socket.gethostname(),
            "device": dev, "math_mode": math, "weight_seed": 0, "prompt_seed": 0, "model_hash": 0,
            "torch_version": torch.__version__, "transformers_version": transformers.__version__,
            "python_version": platform.python_version(), "capture_command": command}
