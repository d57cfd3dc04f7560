"""Several sequences on one llama.cpp context: a LlamaCppBackend's slots and one decode over their rows.

A llama.cpp context holds up to n_seq_max sequences (set when it is made), each token of a
`llama_batch` naming the sequence it belongs to. A LlamaCppBackend loaded with slots=N is
sequence 0; `open_slot` gives sequences 1..N-1 as `LlamaSlot`s, Backends of their own on the
owner's model and context, and `forward_batch` runs the rows of several of them in one
llama_decode (in chunks of n_batch tokens, as any long input): the weights are read once for
every sequence, which is what makes serving requests together cheaper than one after another.

The cache is unified (kv_unified): one buffer of N x n_ctx cells that every sequence draws
from. Each sequence may use n_ctx of them (Backend.forward checks it), so together they never
need more than the buffer holds. With a buffer per sequence instead, llama.cpp splits a batch
into ubatches with as many rows of each sequence and consecutive sequence ids, each one more
pass over the weights: rows [5, 3, 5] of three sequences took 81 ms that way against 70 ms
unified (SmolLM2-135M Q4_1, 2 threads); one row alone took 9 ms either way. Sequences 0 and 2
without 1 would take two passes as well. What unified costs:
- a sequence's new rows may land in cells another sequence freed, before its older ones, and
  attention over the F16 cache then sums in another order: logits a rounding apart (0.008 on a
  tiny float32 model) from where the cells lay otherwise;
- llama.cpp takes N x n_ctx as each sequence's context where it picks a model's rope factors:
  a LongRoPE model (Phi-3 128k) whose original context lies between n_ctx and N x n_ctx runs its
  long-context factors, as one sequence would with a context of N x n_ctx.

The decode and rollback of one sequence are here too (`decode_sequence`, `truncate_sequence`):
the backend runs them on sequence 0, each slot on its own id, through the same `Rows`.

llama.cpp has no custom attention masks: a masked call (a tree, lookahead's block) runs its rows
on temporary sequence ids (engine/backends/llama_tree.py), in the same decode as the chains.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from itertools import chain
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np
import torch

from engine.backends import llama_tree
from engine.backends.base import Backend, ModelInfo, finite_rows
from engine.backends.capabilities import TreeForward, has
from engine.backends.slots import BatchCall, SlotsFull
from engine.errors import ConfigError
from engine.models.memory_errors import model_out_of_memory

if TYPE_CHECKING:
    from engine.backends.llama_cpp import LlamaCppBackend


class Rows:
    """A llama_batch whose arrays are numpy buffers we own, filled in place per decode (nothing to
    free, nothing to build per call). Each row names its sequence through a pointer into
    `_seq_ids`; a decode of one sequence points every row at its id, and pays for that only when
    the id differs from the last decode's."""

    def __init__(self, size: int, sequences: int) -> None:
        self.size = size
        self.tokens = np.zeros(size, dtype=np.int32)
        self.pos = np.zeros(size, dtype=np.int32)
        self.flags = np.zeros(size, dtype=np.int8)  # 1 = return logits for this row
        self.arange = np.arange(size, dtype=np.int32)
        self._n_seq = np.ones(size, dtype=np.int32)  # each row is in one sequence
        self._seq_ids = np.arange(sequences, dtype=np.int32)
        # seq_address[s]: where id s lives; seq_ptrs[i]: row i's llama_seq_id*, as an integer.
        base, step = self._seq_ids.ctypes.data, self._seq_ids.itemsize
        self.seq_address = np.array([base + step * s for s in range(sequences)], dtype=np.uintp)
        self.seq_ptrs = np.full(size, self.seq_address[0], dtype=np.uintp)
        self._all_in = 0  # the sequence every row names, -1 after a batch of several

        batch = llama_cpp.llama_batch()
        batch.token = self.tokens.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
        batch.embd = None
        batch.pos = self.pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        batch.n_seq_id = self._n_seq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(self.seq_ptrs.ctypes.data, ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id)))
        batch.logits = self.flags.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.batch = batch

    def all_in(self, seq: int) -> None:
        """Make every row belong to sequence `seq`."""
        if self._all_in != seq:
            self.seq_ptrs[:] = self.seq_address[seq]
            self._all_in = seq

    def mixed(self) -> None:
        """Rows of several sequences are about to be written: the next `all_in` rewrites them all."""
        self._all_in = -1

    def decode(self, ctx, n: int) -> int:
        """llama_decode over the first `n` rows; its return code."""
        self.batch.n_tokens = n
        return llama_cpp.llama_decode(ctx, self.batch)


# -- one sequence's decode and rollback (the backend's own and each slot's) --------------------


def decode_sequence(owner: LlamaCppBackend, s: Backend, tokens: list[int], all_logits: bool) -> torch.Tensor:
    """`s._forward`: decode `tokens` after s's cached ones on its sequence."""
    ctx = owner._ctx
    owner._check_open()
    rows = owner._rows
    rows.all_in(s._seq_id)
    n = len(tokens)
    start = len(s.tokens)
    if s._states is not None and s.checkpoint_forwards:  # what a rollback into this forward restores
        save_state(owner, s, start)
    out = torch.empty((n if all_logits else 1, owner._n_vocab), dtype=torch.float32)
    for offset in range(0, n, rows.size):
        m = min(rows.size, n - offset)
        rows.tokens[:m] = tokens if m == n else tokens[offset : offset + m]
        np.add(rows.arange[:m], start + offset, out=rows.pos[:m])
        if all_logits:
            rows.flags[:m] = 1
        else:  # a prefill: only the very last token's logits are wanted
            rows.flags[:m] = 0
            rows.flags[m - 1] = offset + m == n
        rc = rows.decode(ctx, m)
        if rc != 0:
            owner._decode_failed(rc, [(s, start)], tokens)
        if all_logits:  # rows of this chunk, contiguous and in batch order
            ctypes.memmove(
                out.data_ptr() + offset * owner._row_bytes, llama_cpp.llama_get_logits(ctx), m * owner._row_bytes
            )
    if s._states is not None and not all_logits and n > 1:  # a prefill: the prompt's own checkpoint
        s._states.save_prompt(start + n)
    if not all_logits:
        last = llama_cpp.llama_get_logits_ith(ctx, -1)
        if not last:  # NULL: copying from it would crash the process
            raise RuntimeError("llama.cpp returned no logits for the last token.")
        ctypes.memmove(out.data_ptr(), last, owner._row_bytes)
    return out


def truncate_sequence(owner: LlamaCppBackend, s: Backend, length: int) -> None:
    """`s._truncate`: cut s's cache back to `length` tokens."""
    if s._block is not None and llama_tree.settle(owner, s, length):  # a masked forward's rows, not kept
        return
    if s._states is not None:
        try:
            s._states.rollback(length, s.tokens, s._replay)
        except BaseException:
            forget_cache(owner, s)  # the cache is now somewhere between: start again from nothing
            raise
        return
    if not llama_cpp.llama_memory_seq_rm(owner._mem, s._seq_id, length, -1):
        raise RuntimeError(f"llama.cpp could not cut the cache of {owner._display_name} back to {length} tokens.")


def save_state(owner: LlamaCppBackend, s: Backend, start: int) -> None:
    """Checkpoint s's recurrent state after its first `start` tokens, before a forward adds more."""
    try:
        s._states.save(start)
    except MemoryError as e:  # before the decode: the cache, and the reply so far, stay as they were
        mib = s._states.state_bytes / 2**20
        raise model_out_of_memory(
            f"keep a {mib:.1f} MiB checkpoint of the recurrent state of {owner._display_name}, which "
            "undoes rejected drafts",
            owner._info,
            owner._n_ctx,
            "closing other programs that use memory",
        ) from e


def forget_cache(owner: LlamaCppBackend, s: Backend) -> None:
    """Empty s's cache, checkpoints and `tokens`: the next prefill recomputes everything."""
    llama_cpp.llama_memory_seq_rm(owner._mem, s._seq_id, -1, -1)
    s._states.clear()
    s.tokens.clear()


class LlamaSlot(llama_tree.MaskedForwards, Backend):
    """Sequence `seq_id` of a LlamaCppBackend's context: its own tokens, cache, forward and rollback
    (through the owner's decode on this sequence id), the owner's model, vocabulary and template, and
    the owner's TreeForward. It has no Slots of its own: slots are opened on the owner."""

    name = "llama.cpp"

    def __init__(self, owner: LlamaCppBackend, seq_id: int) -> None:
        super().__init__()
        self._owner: LlamaCppBackend | None = owner
        self._seq_id = seq_id
        self.capabilities = owner.capabilities & {TreeForward}
        self._states = owner._states.for_sequence(seq_id) if owner._states is not None else None
        self.replays_on_rollback = owner.replays_on_rollback

    def _replay(self, tokens: list[int], start: int) -> None:
        self._live()._decode_plain(tokens, start, self._seq_id)

    def _context_owner(self) -> LlamaCppBackend:
        return self._live()

    def _live(self) -> LlamaCppBackend:
        if self._owner is None:
            raise RuntimeError(f"Sequence {self._seq_id} of this llama.cpp model was closed; open another slot.")
        return self._owner

    @property
    def seq_id(self) -> int:
        return self._seq_id

    @property
    def closed(self) -> bool:
        return self._owner is None

    # -- the owner's model ------------------------------------------------------------

    @property
    def info(self) -> ModelInfo:
        return self._live().info

    @property
    def n_ctx(self) -> int:
        return self._live().n_ctx

    @property
    def vocab_size(self) -> int:
        return self._live().vocab_size

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._live().eos_ids

    @property
    def chat_template(self) -> str | None:
        return self._live().chat_template

    def prepare_threads(self) -> None:
        self._live().prepare_threads()

    # -- this sequence's cache ----------------------------------------------------------

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        return decode_sequence(self._live(), self, tokens, all_logits)

    def _truncate(self, length: int) -> None:
        truncate_sequence(self._live(), self, length)

    # -- text ------------------------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self._live().tokenize(text, special)

    def detokenize(self, ids: list[int]) -> str:
        return self._live().detokenize(ids)

    def token_text(self, token_id: int) -> str:
        return self._live().token_text(token_id)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return self._live().apply_chat_template(messages)

    def close(self) -> None:
        """Empty this sequence's cache and give its id back to the owner; the model stays loaded."""
        if self._owner is not None:
            self._owner._slot_table.close(self)


class SlotTable:
    """The sequences 1..max_slots-1 of one owner's context that are open, by id."""

    def __init__(self, owner: LlamaCppBackend, max_slots: int) -> None:
        self._owner = owner
        self.max_slots = max_slots
        self._open: dict[int, LlamaSlot] = {}

    def open(self) -> LlamaSlot:
        free = next((i for i in range(1, self.max_slots) if i not in self._open), None)
        if free is None:
            raise SlotsFull(
                f"{self._owner.info.name} holds {self.max_slots} sequences at once on llama.cpp and all are in "
                f"use: close one, or load the model with more (--parallel {self.max_slots + 1} or more)."
            )
        slot = self._open[free] = LlamaSlot(self._owner, free)
        return slot

    def close(self, slot: LlamaSlot) -> None:
        if self._open.get(slot.seq_id) is not slot:
            return
        del self._open[slot.seq_id]
        if slot._block is not None:  # a masked forward's rows: their temporary ids go back
            llama_tree.settle(self._owner, slot, 0)
        if self._owner._mem is not None:
            llama_cpp.llama_memory_seq_rm(self._owner._mem, slot.seq_id, -1, -1)
        if slot._states is not None:
            slot._states.clear()
        slot.tokens.clear()
        slot._owner = None

    def close_all(self) -> None:
        for slot in list(self._open.values()):
            self.close(slot)

    def holds(self, backend: Backend) -> bool:
        """Whether `backend` is the owner or one of its open slots."""
        if backend is self._owner:
            return True
        return isinstance(backend, LlamaSlot) and self._open.get(backend.seq_id) is backend


def forward_batch(owner: LlamaCppBackend, calls: list[BatchCall]) -> list[torch.Tensor]:
    """Slots(capabilities.py).forward_batch on llama.cpp: one llama_decode over every call's rows
    (more when they pass n_batch), call i's rows on its slot's sequence at positions after its cache,
    logits for every row. Checks every call before anything runs; a failed decode leaves every
    sequence as it was."""
    owner._check_open()
    sequences = [call.slot for call in calls]
    _check_calls(owner, calls)
    if any(call.masked for call in calls):
        return llama_tree.forward_batch(owner, calls)
    starts = [len(s.tokens) for s in sequences]
    counts = [len(call.tokens) for call in calls]
    total = sum(counts)
    for s, start in zip(sequences, starts):
        if s._states is not None and s.checkpoint_forwards:
            save_state(owner, s, start)

    rows = owner._rows
    tokens = list(chain.from_iterable(call.tokens for call in calls))
    positions = np.concatenate([np.arange(start, start + n, dtype=np.int32) for start, n in zip(starts, counts)])
    seq_ptrs = np.repeat(rows.seq_address[[s._seq_id for s in sequences]], counts)
    out = torch.empty((total, owner.vocab_size), dtype=torch.float32)  # (sum n_i, V)
    rows.mixed()
    rows.flags[:] = 1
    for offset in range(0, total, rows.size):
        m = min(rows.size, total - offset)
        rows.tokens[:m] = tokens[offset : offset + m]
        rows.pos[:m] = positions[offset : offset + m]
        rows.seq_ptrs[:m] = seq_ptrs[offset : offset + m]
        rc = rows.decode(owner._ctx, m)
        if rc != 0:
            owner._decode_failed(rc, list(zip(sequences, starts)), tokens)
        ctypes.memmove(
            out.data_ptr() + offset * owner._row_bytes, llama_cpp.llama_get_logits(owner._ctx), m * owner._row_bytes
        )

    for s, call in zip(sequences, calls):
        s.tokens.extend(call.tokens)
    if not finite_rows(out):
        for s, start in zip(sequences, starts):
            s.rollback(start)
        raise owner.corrupt_error()
    return list(out.split(counts))  # (n_i, V) each


def _check_calls(owner: LlamaCppBackend, calls: Iterable[BatchCall]) -> None:
    """Raise before anything runs: a masked call on a model without TreeForward, a call that is empty,
    on a sequence not of this model or on one twice, or that would pass its sequence's context."""
    seen: set[int] = set()
    for call in calls:
        if call.masked and not has(owner, TreeForward):
            raise ConfigError(
                f"llama.cpp runs chains only and cannot run {call.what} with its own attention mask for "
                f"{owner.info.name}: its recurrent layers cannot branch (no TreeForward)."
            )
        if not call.tokens:
            raise ValueError("forward_batch() needs at least one token in every call")
        if not owner._slot_table.holds(call.slot):
            raise ValueError("forward_batch() runs this backend and the slots it opened only (open ones)")
        if id(call.slot) in seen:
            raise ValueError("forward_batch() takes each sequence at most once per call")
        seen.add(id(call.slot))
        s = call.slot
        if len(s.tokens) + len(call.tokens) > s.n_ctx:
            raise s._context_full(f"{len(s.tokens)} are in use and {len(call.tokens)} more were asked for")
