"""Sliding-window cache layers under test.

Two of them are transformers' own, as the installed transformers implements
them: `static_sliding` (StaticCache: StaticSlidingWindowLayer + StaticLayer)
and `dynamic_sliding` (DynamicCache: DynamicSlidingWindowLayer +
DynamicLayer). They build their attention masks through transformers' own
masking code from the 2-D padding mask.

`dynamic_sliding_md` is the same DynamicCache with its growing dimensions
marked dynamic before every compiled step (transformers PR #40328:
torch.compile with DynamicCache, mark_dynamic, no CUDA graphs).

The other four are written here from their descriptions (docs/DESIGN.md §3,
the seeds in shared/seeds/): `index_copy` (transformers' original
SlidingWindowCache update), `cat_shift`, `roll` and `always_roll` (the
branchless layer of transformers #44609). They keep W slots per sliding layer
(full layers use transformers' StaticLayer) and say, for every key column
they return, which absolute position it holds: the capture driver builds the
4-D masks from that (the right-aligned mapping of #44609 for always_roll), as
the seed replaced transformers' mask function.

Every layer can also name, for each absolute position, the slot that holds
it (`slot_of`), so the `layerN.cache` probe hashes the rows the next query may
see in ascending position whatever the layout: two layers that store the same
keys give the same hash.

Positions are padded-slot indices (DESIGN §2): slot counts include left pads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig, StaticCache
from transformers.cache_utils import Cache, CacheLayerMixin, StaticLayer

from .names import BROKEN, LAYER_ALIASES, LAYERS  # noqa: F401 (re-exported: the tests import them from here)

# The most decode graphs each layer needs by design (DESIGN §3): one for a
# branchless update, two for a host regime branch (filling, full), none
# stated for the shape-changing dynamic layer.
GRAPH_BUDGET = {
    "index_copy": 1, "always_roll": 1, "cat_shift": 2, "roll": 2,
    "static_sliding": 2, "dynamic_sliding": -1, "dynamic_sliding_md": -1,
    "always_roll_off_by_one": 1, "index_copy_first_w": 1,
}


class SlidingLayer(CacheLayerMixin):
    """W slots per (batch, kv head). Subclasses give the one-token update and
    the layout; a multi-token update (prefill, chunks) is generic: attention
    runs over the cached slots plus the new rows, then the last min(W, seen)
    tokens are stored in the layout (DESIGN §3)."""

    is_sliding = True
    is_compileable = True
    right_aligned = False   # layout: slot i holds seen - W + i (right) or i until full (left)

    def __init__(self, window: int):
        super().__init__()
        self.window = window
        self.seen = 0           # tokens stored so far (host side)
        self.pos: torch.Tensor | None = None  # the same count on the device, for branchless updates

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        # keys, values: (B, KVH, W, D)
        self.keys = torch.zeros((b, h, self.window, d), dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros((b, h, self.window, value_states.shape[-1]), dtype=value_states.dtype,
                                  device=value_states.device)
        self.pos = torch.zeros((), dtype=torch.long, device=key_states.device)
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
            torch._dynamo.mark_static_address(self.pos)
        self.is_initialized = True

    # -- layout -------------------------------------------------------------
    def slot_position(self, slot: int, seen: int) -> int:
        """Absolute position slot holds after `seen` tokens were stored, -1 if none."""
        w = self.window
        if self.right_aligned or seen > w:
            p = seen - w + slot
        else:
            p = slot
        return p if 0 <= p < seen else -1

    def slot_of(self, position: int) -> int:
        for s in range(self.window):
            if self.slot_position(s, self.seen) == position:
                return s
        return -1

    def key_positions(self, seen_before: int, n: int) -> list[int]:
        """Absolute position of each key column update() returns for n new tokens."""
        if n == 1:
            return [self.slot_position(s, seen_before + 1) for s in range(self.window)]
        old = [self.slot_position(s, seen_before) for s in range(self.window)]
        return old + [seen_before + j for j in range(n)]

    # -- update ---------------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[-2] == 1:
            return self.update_one(key_states, value_states)
        return self.update_many(key_states, value_states)

    def update_one(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The one-token update. It must not change host state (self.seen):
        under torch.compile a Python int written here is a guarded constant
        and every step would recompile; the driver advances `seen` after
        the step (advance())."""
        raise NotImplementedError

    def write_filling(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """While the window fills, slot = position: index_copy at the device
        count (a tensor index, so the step's position is not a guarded
        constant)."""
        slot = self.pos.reshape(1)
        self.keys.index_copy_(2, slot, k)
        self.values.index_copy_(2, slot, v)

    def advance(self, n: int) -> None:
        self.seen += n

    def stored_positions(self, total: int) -> list[int]:
        """Which absolute positions the layout keeps after total tokens."""
        return [p for p in (self.slot_position(s, total) for s in range(self.window))]

    def update_many(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[-2]
        before = self.seen
        old_pos = [self.slot_position(s, before) for s in range(self.window)]
        attend_k = torch.cat([self.keys, k], dim=-2)
        attend_v = torch.cat([self.values, v], dim=-2)
        total = before + n
        # column of attend_k holding each absolute position
        column = {p: c for c, p in enumerate(old_pos) if p >= 0}
        column.update({before + j: self.window + j for j in range(n)})
        keep = self.stored_positions(total)
        index = [column[p] if p >= 0 else 0 for p in keep]
        sel = torch.tensor(index, dtype=torch.long, device=k.device)
        empty = torch.tensor([p < 0 for p in keep], device=k.device)[None, None, :, None]
        self.keys.copy_(torch.where(empty, torch.zeros_like(self.keys), attend_k.index_select(2, sel)))
        self.values.copy_(torch.where(empty, torch.zeros_like(self.values), attend_v.index_select(2, sel)))
        self.seen = total
        self.pos.fill_(total)
        return attend_k, attend_v

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # the capture driver passes prepared 4-D masks; transformers never asks
        return self.window, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.window


class AlwaysRollLayer(SlidingLayer):
    """transformers #44609: always roll left by n and write the n newest
    into the rightmost slots; no host state in the update, one graph."""

    right_aligned = True

    def update_one(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new_k = self.keys.roll(-1, dims=-2)
        new_v = self.values.roll(-1, dims=-2)
        new_k[:, :, -1:] = k
        new_v[:, :, -1:] = v
        self.keys.copy_(new_k)
        self.values.copy_(new_v)
        return self.keys, self.values


class AlwaysRollOffByOneLayer(AlwaysRollLayer):
    """Broken on purpose: the mask's mapping uses the count before the update."""

    def key_positions(self, seen_before: int, n: int) -> list[int]:
        if n == 1:
            w = self.window
            return [p if 0 <= p < seen_before + 1 else -1
                    for p in (seen_before - w + s for s in range(w))]
        return super().key_positions(seen_before, n)


class IndexCopyLayer(SlidingLayer):
    """transformers' original SlidingWindowCache update: the shift is a
    gather with indices (arange(W) + to_shift) % W computed on the device from
    the position, then index_copy at clamp(pos, 0, W-1). No host branch."""

    def update_one(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.window
        to_shift = (self.pos >= w).long()
        indices = (torch.arange(w, device=k.device) + to_shift) % w
        slot = self.pos.clamp(0, w - 1).reshape(1)
        k_out = self.keys[:, :, indices]
        v_out = self.values[:, :, indices]
        k_out.index_copy_(2, slot, k)
        v_out.index_copy_(2, slot, v)
        self.keys.copy_(k_out)
        self.values.copy_(v_out)
        self.pos.add_(1)
        return self.keys, self.values


class IndexCopyFirstWLayer(IndexCopyLayer):
    """Broken on purpose: a prefill longer than W stores its first W rows."""

    def stored_positions(self, total: int) -> list[int]:
        if total > self.window and self.seen == 0:
            return list(range(self.window))
        return super().stored_positions(total)


class CatShiftLayer(SlidingLayer):
    """While filling, index_copy at the position; when full, cat(keys[1:],
    new) through a temporary. The regime is a host branch: two graphs."""

    def update_one(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.seen >= self.window:
            self.keys.copy_(torch.cat([self.keys[:, :, 1:], k], dim=-2))
            self.values.copy_(torch.cat([self.values[:, :, 1:], v], dim=-2))
        else:
            self.write_filling(k, v)
        self.pos.add_(1)
        return self.keys, self.values


class RollLayer(SlidingLayer):
    """While filling, index_copy at the position; when full, roll(-1) and
    write the last slot (a tensor index, as transformers does). Host branch."""

    def update_one(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.seen >= self.window:
            new_k = self.keys.roll(-1, dims=-2)
            new_v = self.values.roll(-1, dims=-2)
            last = torch.tensor([self.window - 1], dtype=torch.long, device=k.device)
            new_k[:, :, last] = k
            new_v[:, :, last] = v
            self.keys.copy_(new_k)
            self.values.copy_(new_v)
        else:
            self.write_filling(k, v)
        self.pos.add_(1)
        return self.keys, self.values


CUSTOM = {
    "index_copy": IndexCopyLayer, "cat_shift": CatShiftLayer, "roll": RollLayer,
    "always_roll": AlwaysRollLayer, "always_roll_off_by_one": AlwaysRollOffByOneLayer,
    "index_copy_first_w": IndexCopyFirstWLayer,
}


class KvCache(Cache):
    """A transformers Cache of custom sliding layers and StaticLayer full layers."""

    def __init__(self, layers: list[CacheLayerMixin]):
        super().__init__(layers=layers)


@dataclass
class CacheSetup:
    cache: Cache
    native: bool                 # transformers builds the masks (its own layers)
    layer_types: list[str]       # "sliding_attention" / "full_attention" per model layer
    window: int
    max_len: int
    mark_dynamic: bool = False   # mark the growing dims dynamic before each compiled step


def mark_growing_dims(setup: "CacheSetup", attention_mask: torch.Tensor) -> None:
    """What transformers PR #40328 does for DynamicCache under torch.compile:
    the 2-D mask's length and every cached tensor's sequence length are
    marked dynamic, so dynamo compiles them as symbols from the first call
    instead of specialising on the first length and recompiling. maybe_:
    a full sliding layer's length is constant (W - 1), and a hard
    mark_dynamic on it stops the compile with a ConstraintViolationError
    (measured: torch 2.15 refuses the whole decode)."""
    torch._dynamo.maybe_mark_dynamic(attention_mask, 1)
    for lay in setup.cache.layers:
        if lay.keys is not None and lay.keys.dim() == 4 and lay.keys.shape[-2] > 1:
            torch._dynamo.maybe_mark_dynamic(lay.keys, 2)
            torch._dynamo.maybe_mark_dynamic(lay.values, 2)


def layer_types_of(config: PretrainedConfig) -> list[str]:
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return [kind] * config.num_hidden_layers


def make_cache(name: str, config: PretrainedConfig, max_len: int) -> CacheSetup:
    """A fresh cache of layer kind `name` for a decode of at most max_len
    positions (prompt + new tokens). name may be the C gate's name for the
    layout (names.LAYER_ALIASES: `dynamic` is dynamic_sliding)."""
    name = LAYER_ALIASES.get(name, name)
    types = layer_types_of(config)
    window = int(config.sliding_window)
    if name == "static_sliding":
        return CacheSetup(StaticCache(config=config, max_cache_len=max_len), True, types, window, max_len)
    if name in ("dynamic_sliding", "dynamic_sliding_md"):
        return CacheSetup(DynamicCache(config=config), True, types, window, max_len,
                          mark_dynamic=name == "dynamic_sliding_md")
    cls = CUSTOM.get(name)
    if cls is None:
        raise ValueError(f"unknown cache layer {name!r}: expected one of {', '.join(LAYERS + BROKEN)}")
    layers: list[CacheLayerMixin] = [
        cls(window) if t == "sliding_attention" else StaticLayer(max_cache_len=max_len) for t in types]
    return CacheSetup(KvCache(layers), False, types, window, max_len)


def visible_cache_rows(setup: CacheSetup, layer: int, seen: int) -> tuple[list[int], list[int]]:
    """For layer, the absolute positions the next query may see from the
    cache (ascending) and the slot (index along the cache's seq axis) of
    each. Layouts: custom sliding layers say it themselves; StaticLayer and
    DynamicLayer hold position p at index p; transformers' static sliding
    layer keeps W slots left-aligned until full, then slot i = seen - W + i;
    its dynamic sliding layer keeps the last W - 1 rows contiguously."""
    lay = setup.cache.layers[layer]
    sliding = setup.layer_types[layer] == "sliding_attention"
    w = setup.window
    first = max(0, seen - w + 1) if sliding else 0
    want = list(range(first, seen))
    if isinstance(lay, SlidingLayer):
        return want, [lay.slot_of(p) for p in want]
    name = type(lay).__name__
    if name == "StaticSlidingWindowLayer":
        cap = lay.max_cache_len
        return want, [p if seen <= cap else p - (seen - cap) for p in want]
    if name == "DynamicSlidingWindowLayer":
        held = lay.keys.shape[-2]
        return want, [p - (seen - held) for p in want]
    return want, want
