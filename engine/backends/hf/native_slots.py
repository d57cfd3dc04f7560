"""More sequences on one NativeLlama (the native backend's Slots), and the forward that runs them together.

    slot = backend.open_slot()                       # a Backend of its own: tokens, cache, trees...
    logits_a, logits_b = backend.forward_batch([BatchCall(backend, [5]), BatchCall(slot, [7, 8])])

A `NativeSlot` shares everything the loaded backend holds except what belongs to one
sequence: its tokens, KV cache, hidden-feature store and tree window. `run_batch` runs
the rows of several sequences as one forward: on a CPU a decode step reads every
weight once per forward, so four sequences of one to a few rows each cost little more
than one.

Packed rows, not padded slots. The calls' rows are concatenated (N rows in all); the
embeddings, q/k/v, o, MLP and LM head run once on (N, hidden); attention runs per
sequence on its own slice of rows against its own cache, with the mask its own call
would build (NativeLlama.placement), so a row sees exactly what it would see alone.
Padding every sequence to the longest call's rows (B, T_max) would let one batched
attention call replace the per-sequence ones, but it needs the caches side by side in
one (B, ...) tensor (a cache layout of its own, as the static path's, or a copy of every
cache per layer and step),
runs the projections on the padding too, and still needs a mask per sequence. Measured
on the 2-core CPU while others loaded it (so one torch thread, medians of 7 steps, three
runs each), float32, a random llama with SmolLM2-135M's widths and 8 layers, 4 sequences
with 300-600 cached tokens, the padded variant given its caches already stacked (not
charged the copy it would need):

    new rows 1, 3, 5, 2:  packed 74-136 ms   padded 142-156 ms   one call after another 219-327 ms
    new rows 1, 1, 1, 1:  packed  91-100 ms  padded  91-101 ms   one call after another 162-176 ms

With one row each the two are even (the same rows; four small attention calls cost what
one batched call and the stacking writes do); with a tree or a verify block among them
the padding's extra projection rows cost more than packing's per-sequence attention.

On the static-shape path (--compile on, static.py) the slots are places in one shared KV
buffer, laid out so that one attention call reads them all, and a batch whose total rows
fit a row bucket runs as one padded static step instead (what CUDA graphs can capture);
past the largest bucket it runs packed as here, on the same slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.backends.base import Backend, finite_rows
from engine.backends.capabilities import HiddenFeatures, LayerExit, ModelParts, TreeForward
from engine.backends.hf.base import PREFILL_CHUNK
from engine.backends.hf.loader import is_oom
from engine.backends.hf.native_sequence import NativeSequence
from engine.backends.hf.static import Call, bucket
from engine.backends.kv_cache import KVCache
from engine.backends.slots import BatchCall

if TYPE_CHECKING:  # annotations only: the backend imports this module
    from engine.backends.hf.native_backend import NativeBackend

# What a slot reads from its owner, shared and never copied: the model and the forward, the
# tokenizer and the facts. Everything else (HFBackend's feature stores, NativeSequence's cache
# and tree window) is the slot's own.
_SHARED = (
    "_model", "_tok", "_device", "_dtype", "_n_ctx", "_eos", "_hidden_size", "_vocabulary", "_template",
    "_info", "_native", "_pass", "_static",
)  # fmt: skip


class NativeSlot(NativeSequence):
    """One more sequence on a NativeBackend's weights: forward, rollback, prefill, trees and
    masked blocks, hidden features and early exit on a cache of its own.

    No Slots (slots are opened on the backend that loaded the model) and no LayerFeatures: the
    layers an EAGLE-3 head watches are set on the model every sequence shares, so one slot
    watching them would change what the others keep. `close()` frees this slot's cache only
    and gives its place back to the owner.
    """

    capabilities = frozenset({TreeForward, HiddenFeatures, LayerExit, ModelParts})

    def __init__(self, owner: NativeBackend) -> None:
        Backend.__init__(self)  # its own tokens
        for name in _SHARED:
            setattr(self, name, getattr(owner, name))
        self._features = self._feature_store = self._layer_store = None
        self._watched = ()
        self._start_sequence(owner._new_cache())
        self._owner: NativeBackend | None = owner

    def watch_layers(self, layers: tuple[int, ...]) -> None:
        if layers:
            raise RuntimeError("a slot keeps no layer inputs: watch layers on the backend that loaded the model")

    def close(self) -> None:
        """Free this slot's cache; the model stays loaded and the owner can open a slot again."""
        if self._owner is not None:
            self._owner._slots.remove(self)
            if self._kv is not None:
                self._owner._release_cache(self._kv)
            self._owner = None
        super().close()


@dataclass
class _Rows:
    """One call's share of the packed rows: where its rows are and what they attend to."""

    slot: NativeSequence
    rows: slice  # into the packed rows
    start: int  # its cache's length before the call
    group_mask: torch.Tensor | None  # NativeLlama.placement's


def run_batch(owner: NativeBackend, open_slots: list[NativeSequence], calls: list[BatchCall]) -> list[torch.Tensor]:
    """Each call's float32 CPU logits (len(tokens), V) from one forward over all their rows (the
    Slots protocol's forward_batch). Every check runs before anything does; afterwards each slot is
    as its own forward (or forward_masked) would leave it. On an error every slot's cache and tokens
    are as they were; on non-finite logits every call is rolled back and corrupt_error raised."""
    _check(owner, open_slots, calls)
    bases = [len(call.slot.tokens) for call in calls]
    leads: list[torch.Tensor | None] = [None] * len(calls)
    try:
        # A chain longer than a prefill slice runs its head alone (sliced as forward() slices it),
        # so the packed rows stay within what one slice of a prefill may take.
        tails = []
        for i, call in enumerate(calls):
            cut = 0 if call.masked else max(0, len(call.tokens) - PREFILL_CHUNK)
            if cut:
                leads[i] = call.slot.forward(call.tokens[:cut])
            tails.append(call.tokens[cut:])
        logits, features, parts = _packed_forward(owner, calls, tails)
    except BaseException as error:
        for call, base in zip(calls, bases):
            call.slot._kv.truncate(len(call.slot.tokens))
            call.slot.rollback(base)
        if is_oom(error):
            rows = sum(len(call.tokens) for call in calls)
            raise owner._out_of_memory(
                f"run {len(calls)} sequences ({rows} tokens) together with {owner.info.name}",
                "fewer sequences at once (--parallel)",
            ) from error
        raise
    logits = logits.to(device="cpu", dtype=torch.float32, copy=True)  # an ordinary tensor, outside inference mode
    for call, part, tail, base in zip(calls, parts, tails, bases):
        slot = call.slot
        slot.tokens.extend(tail)
        # last_features: the call's rows, a sliced chain's too (as NativeSequence._forward gives them)
        slot._features = (
            slot._feature_store[base : base + len(call.tokens)].clone() if base < part.start else features[part.rows]
        )
        slot._tree_base = base if call.masked else None
        slot._tree_parents = None if call.parents is None else list(call.parents)  # keep_nodes, as after forward_tree
    if not finite_rows(logits):
        for call, base in zip(calls, bases):
            call.slot.rollback(base)
        raise owner.corrupt_error()
    results = []
    for part, lead in zip(parts, leads):
        rows = logits[part.rows]
        results.append(rows if lead is None else torch.cat([lead, rows]))
    return results


def _check(owner: NativeBackend, open_slots: list[NativeSequence], calls: list[BatchCall]) -> None:
    """Raise before anything runs: a slot that is not this backend's or comes twice, a call that is
    malformed or does not fit its slot's context."""
    if owner._model is None:
        raise RuntimeError("this backend was closed")
    if not calls:
        raise ValueError("forward_batch() needs at least one call")
    allowed = {id(owner)} | {id(slot) for slot in open_slots}
    seen: set[int] = set()
    for call in calls:
        slot, n = call.slot, len(call.tokens)
        if id(slot) not in allowed:
            raise ValueError("forward_batch() runs this backend and the open slots it opened only")
        if id(slot) in seen:
            raise ValueError("forward_batch() runs each sequence at most once per call")
        seen.add(id(slot))
        if not n:
            raise ValueError("forward_batch() needs at least one token per call")
        used = len(slot.tokens)
        if call.masked:
            if call.offsets is None or len(call.offsets) != n or tuple(call.mask.shape) != (n, n):
                raise ValueError(f"a masked call needs one offset and one mask row per token ({n} tokens)")
            if used + n > slot.n_ctx or used + max(call.offsets) >= slot.n_ctx:
                raise slot._context_full(f"{used} are in use and {call.what} of {n} more was asked for")
        elif used + n > slot.n_ctx:
            raise slot._context_full(f"{used} are in use and {n} more were asked for")


def _packed_forward(owner: NativeBackend, calls: list[BatchCall], tails: list[list[int]]):
    """The forward over the concatenated rows of `tails` (each call's tokens still to run):
    (logits (N, V), features (N, hidden), each call's _Rows). Each cache ends after its rows and
    its feature stores hold them; tokens are the caller's to extend. On the static-shape path,
    while N fits a row bucket, one padded static step (static.StaticForward.run); else eager:
    projections, MLP and head run on all N rows at once, attention per sequence against its own
    cache."""
    native, device = owner._native, owner._device
    static = owner._static
    parts: list[_Rows] = []
    row = 0
    with torch.inference_mode():
        ids = torch.tensor([t for tokens in tails for t in tokens], dtype=torch.long, device=device)
        placed = []  # each call's offsets and new-row mask (device tensors), None for a chain
        for call, tokens in zip(calls, tails):
            n = len(tokens)
            parts.append(_Rows(call.slot, slice(row, row + n), call.slot._kv.length, None))
            placed.append(
                (
                    torch.tensor(call.offsets, dtype=torch.long, device=device),
                    call.mask.to(device=device, dtype=torch.bool),
                )
                if call.masked
                else (None, None)
            )
            row += n
        if static is not None and bucket(row) is not None:
            static_calls = [Call(p.slot._kv, p.rows.stop - p.rows.start, *where) for p, where in zip(parts, placed)]
            logits, features, _, layer_features = static.run(ids, static_calls)
        else:
            logits, features, layer_features = _eager_packed(native, ids, parts, placed)
        for p in parts:
            p.slot._kv.length = p.start + (p.rows.stop - p.rows.start)
            p.slot._store_features(p.start, features[p.rows])
            p.slot._store_layer_features(p.start, None if layer_features is None else layer_features[p.rows])
    return logits, features, parts


def _eager_packed(native, ids: torch.Tensor, parts: list[_Rows], placed: list[tuple]):
    """The eager forward over packed rows: (logits (N, V), features (N, hidden), watched layers' inputs)."""
    cos_parts, sin_parts = [], []
    for p, (offsets, mask) in zip(parts, placed):
        cache: KVCache = p.slot._kv
        n = p.rows.stop - p.rows.start
        cache.reserve(p.start + n)
        cos, sin, p.group_mask = native.placement(p.start, n, offsets, mask)  # (n, 1, head_dim) x2
        cos_parts.append(cos)
        sin_parts.append(sin)

    def attend(layer: int, q, kv):  # q (N, heads, dim), kv (N, 2 * kv_heads, dim)
        return torch.cat(
            [native._attend_cached(layer, q[p.rows], kv[p.rows], p.slot._kv, p.start, p.group_mask) for p in parts]
        )  # (N, heads * dim)

    cos, sin = torch.cat(cos_parts), torch.cat(sin_parts)  # (N, 1, head_dim)
    x, layer_features = native.run_layers(native._embed(ids), 0, len(native.blocks), cos, sin, attend)
    features = F.rms_norm(x, (native.hidden_size,), native.final_norm, native.eps)  # (N, hidden)
    return native.head(features), features, layer_features
