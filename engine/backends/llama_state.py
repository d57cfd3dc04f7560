"""Rollback for llama.cpp models with recurrent layers: state checkpoints and a replay.

A hybrid model (Qwen3.5, Qwen3-Next, LFM2, Nemotron-H, Granite 4, Falcon-H1) or a recurrent one
(Mamba) keeps, besides or instead of its attention KV cache, one state per sequence that every
token updates in place, so llama.cpp cannot cut it back token by token: `llama_memory_seq_rm` on
a position inside the sequence fails for the recurrent part. What works (checked on 0.3.36's
llama.cpp, with qwen35, lfm2, nemotron_h and mamba2 files):

1. before each forward, copy the recurrent part of the sequence (`llama_state_seq_get_data_ext`
   with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the attention KV is left out, it can be cut) into a
   buffer of a ring (engine/backends/checkpoints.py), keyed by the tokens it covers;
2. on a rollback to `length`, restore the newest checkpoint at or before `length` with
   `llama_state_seq_set_data_ext`: the recurrent cell now ends at the checkpoint's position;
3. then cut the attention KV at that position with `llama_memory_seq_rm`, which now succeeds
   (the recurrent part has nothing past it; in the other order the removal fails and changes nothing);
4. replay the kept tokens after the checkpoint in one decode without logits, like a prefill.

The buffers are allocated as the ring first needs them and then reused: a checkpoint costs one
copy of the state (18 MiB for Qwen3.5-0.8B: ~1.3 ms here, against ~18 ms for a one-token forward;
docs/bench/llama_hybrid_overhead.py), no allocation.

Each sequence of a context with several (engine/backends/llama_slots.py) has its checkpoints of its
own: the state calls take a sequence id, and restoring one sequence leaves the others as they are.

Not used: llama.cpp's own rollback for recurrent memory (context parameter n_rs_seq, marked
experimental). Measured on 0.3.36 with these files: `llama_memory_seq_rm` then succeeds inside the
last decode's tokens with the right state, but also succeeds further back (into an earlier decode,
as a draft model's rollback goes) with a wrong one (logits off by 8), and Mamba 2 refuses it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import llama_cpp

from engine.backends.checkpoints import KEEP, Checkpoint, StateCheckpoints
from engine.errors import ModelLoadError

PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
SEQ = 0  # the backend's own sequence (slots have the others)
BUDGET_BYTES = 1 << 30  # checkpoints of one model, all its sequences together, in about this much memory (2 at least)

# Replays `tokens` at positions start... without logits: the backend's batched decode.
Replay = Callable[[list[int], int], None]


class StateUnsupported(Exception):
    """This llama.cpp cannot save and restore the recurrent state of this model."""


class RecurrentCheckpoints:
    """Checkpoints of one sequence's recurrent state in reused buffers, and the rollback they allow."""

    def __init__(self, ctx, mem, state_bytes: int, keep: int = KEEP, seq: int = SEQ, sequences: int = 1) -> None:
        """`seq`: the sequence id these checkpoints save and restore; `sequences`: how many share the
        memory budget (each keeps as many checkpoints as its share holds)."""
        self._ctx = ctx
        self._mem = mem
        self._size = state_bytes
        self._seq = seq
        self._sequences = sequences
        # A 27B hybrid's state is ~150 MB: fewer of those. A target rolls back into its last forward
        # only; a draft model (a small state) goes back over its draft, one forward per token.
        keep = max(2, min(keep, BUDGET_BYTES // sequences // max(state_bytes, 1)))
        self._ring: StateCheckpoints[tuple[ctypes.Array, int]] = StateCheckpoints(keep)
        # Allocated as needed, keep + 1 at most: the ring holds keep states at most, so one is free.
        self._buffers: list[ctypes.Array] = []
        # The state after the last prefill (the prompt), kept apart: the ring forgets it after `keep`
        # steps, and the next generation over the same prompt (a comparison, a regenerated reply)
        # would then run the whole prompt again.
        self._prompt: Checkpoint[tuple[ctypes.Array, int]] | None = None
        self._prompt_buffer: ctypes.Array | None = None
        self.saves = self.restores = self.replayed = 0  # counters for measurements

    @property
    def state_bytes(self) -> int:
        return self._size

    def for_sequence(self, seq: int) -> RecurrentCheckpoints:
        """Empty checkpoints of sequence `seq` of the same context, sharing the same budget."""
        return RecurrentCheckpoints(self._ctx, self._mem, self._size, seq=seq, sequences=self._sequences)

    def save(self, position: int) -> None:
        """Checkpoint the state after the first `position` tokens (the cache holds exactly those)."""
        newest = self._ring.newest_at_or_before(position)
        if newest is not None and newest.position == position:
            return  # already saved: the state after the same tokens (the ring drops stale ones)
        buffer = self._free_buffer()
        self._ring.save(position, (buffer, self._copy_into(buffer, position)))

    def save_prompt(self, position: int) -> None:
        """Keep the state after a prefill of `position` tokens until a rollback goes behind it."""
        if self._prompt is not None and self._prompt.position == position:
            return
        if self._prompt_buffer is None:
            try:
                self._prompt_buffer = (ctypes.c_uint8 * self._size)()
            except MemoryError:  # a saving of time, not needed for the reply: go without
                return
        self._prompt = Checkpoint(position, (self._prompt_buffer, self._copy_into(self._prompt_buffer, position)))

    def _copy_into(self, buffer: ctypes.Array, position: int) -> int:
        written = llama_cpp.llama_state_seq_get_data_ext(self._ctx, buffer, self._size, self._seq, PARTIAL)
        if written == 0:
            raise RuntimeError(f"llama.cpp could not save the recurrent state after {position} tokens.")
        self.saves += 1
        return written

    def _free_buffer(self) -> ctypes.Array:
        """A buffer no checkpoint of the ring holds (a checkpoint kept from long ago still holds its own)."""
        in_use = {id(checkpoint.state[0]) for checkpoint in self._ring}
        for buffer in self._buffers:
            if id(buffer) not in in_use:
                return buffer
        buffer = (ctypes.c_uint8 * self._size)()  # MemoryError when it does not fit: the backend says what to do
        self._buffers.append(buffer)
        return buffer

    def rollback(self, length: int, tokens: list[int], replay: Replay) -> None:
        """Make the cache hold `tokens[:length]`: restore, cut, replay (the module docstring)."""
        checkpoint = self._ring.newest_at_or_before(length)
        prompt = self._prompt if self._prompt is not None and self._prompt.position <= length else None
        if prompt is not None and (checkpoint is None or prompt.position > checkpoint.position):
            checkpoint = prompt
        if checkpoint is None:  # older than every checkpoint: start from an empty sequence
            start = 0
            llama_cpp.llama_memory_seq_rm(self._mem, self._seq, -1, -1)
        else:
            start = checkpoint.position
            buffer, size = checkpoint.state
            if llama_cpp.llama_state_seq_set_data_ext(self._ctx, buffer, size, self._seq, PARTIAL) != size:
                raise RuntimeError(f"llama.cpp could not restore the recurrent state after {start} tokens.")
            if not llama_cpp.llama_memory_seq_rm(self._mem, self._seq, start, -1):
                raise RuntimeError(f"llama.cpp could not cut the cache back to {start} tokens after a restore.")
            self.restores += 1
        self._ring.drop_after(length)
        if self._prompt is not None and self._prompt.position > length:
            self._prompt = None
        if start < length:
            replay(tokens[start:length], start)
            self.replayed += length - start

    def clear(self) -> None:
        self._ring.clear()
        self._prompt = None


def recurrent_checkpoints(model, ctx, mem, decode: Replay, bos: int, sequences: int = 1) -> RecurrentCheckpoints | None:
    """The state checkpoints of sequence 0 of a hybrid or recurrent model, after checking on the model
    that its state can be saved and restored (`probe`: StateUnsupported if not); None for other models.
    `sequences`: how many the context holds (the others get theirs from `for_sequence`)."""
    if not (llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)):
        return None
    return RecurrentCheckpoints(ctx, mem, probe(ctx, mem, decode, bos if bos >= 0 else 0), sequences=sequences)


def cache_kind(model, states: RecurrentCheckpoints | None) -> str:
    """One sentence on how this model's cache rolls back, where it is not plain attention (ModelInfo.forward)."""
    if states is not None:
        return (
            "recurrent layers: their state is saved before each forward and a rejected draft "
            "restores it and reruns the kept tokens"
        )
    if llama_cpp.llama_model_n_swa(model) > 0:
        return "sliding-window attention with the full cache kept, so rejected drafts roll back exactly"
    return ""


def probe(ctx, mem, decode: Callable[[list[int], int], None], token: int) -> int:
    """Check on this model that the partial state can be saved and restored; return its size in
    bytes. Decodes [token, token] and cuts back to one, the way a rollback does, then empties the
    sequence. Raises StateUnsupported with the reason."""
    llama_cpp.llama_memory_seq_rm(mem, SEQ, -1, -1)
    try:
        decode([token], 0)
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, SEQ, PARTIAL)
        if size == 0:
            raise StateUnsupported("llama.cpp reports no recurrent state to save")
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data_ext(ctx, buffer, size, SEQ, PARTIAL)
        if written == 0:
            raise StateUnsupported("llama.cpp could not copy the recurrent state")
        decode([token], 1)
        if llama_cpp.llama_state_seq_set_data_ext(ctx, buffer, written, SEQ, PARTIAL) != written:
            raise StateUnsupported("llama.cpp could not restore a saved recurrent state")
        if not llama_cpp.llama_memory_seq_rm(mem, SEQ, 1, -1):
            raise StateUnsupported("llama.cpp could not cut the attention cache after restoring the state")
        if llama_cpp.llama_memory_seq_pos_max(mem, SEQ) != 0:
            raise StateUnsupported("the restored state does not end where it was saved")
        decode([token], 1)  # the position after the restored state must be free again
        return size
    except (RuntimeError, OSError) as e:  # a failed decode in the probe
        raise StateUnsupported(str(e)) from e
    finally:
        llama_cpp.llama_memory_seq_rm(mem, SEQ, -1, -1)


def unsupported_error(name: str, reason: str) -> ModelLoadError:
    return ModelLoadError(
        f"{name} has recurrent (state-space) layers, whose state speculative decoding must save and "
        f"restore to undo rejected drafts, and this llama.cpp ({llama_cpp.__version__}) cannot do that "
        f"for it: {reason}. Update llama-cpp-python, or pick a transformer model."
    )
