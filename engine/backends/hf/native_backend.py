"""The PyTorch backend on our own forward (`native.NativeLlama`: llama, mistral, qwen2, qwen3).

On the weights transformers loaded, with a preallocated KV cache (rollback sets a
length), it has every capability of engine/backends/capabilities.py:

- TreeForward: token trees (`forward_tree` / `keep_nodes`) and any attention pattern
  over the new rows (`forward_masked` / `keep_rows`, lookahead's window);
- HiddenFeatures: the final-norm hidden states of the rows just run (`last_features`)
  and of every cached token (`cached_features`, a store grown like the KV cache);
- LayerFeatures: the inputs of chosen layers of every cached token (`watch_layers`,
  `cached_layer_features`), kept in a second store while an EAGLE-3 head watches them;
- LayerExit: the first layers only on scratch rows (`partial_forward`), and a verifying
  forward that picks up their residual stream (`forward_from_exit`);
- ModelParts: the target's embeddings, rotary embedding and LM head;
- Slots: more sequences on the same weights, each with its own cache (`open_slot`), and
  one forward over rows of several of them (`forward_batch`): engine/backends/hf/native_slots.py,
  on either forward (on the static one each sequence is a slot of one shared KV buffer);

and optional int8 weights. float32 weights on a CPU are multiplied from a oneDNN-packed copy
where it fits (engine/backends/hf/packed.py: a verify block or a batch of a few rows then costs
little more than one row). `compile` picks eager or the static-shape forward
(engine/backends/hf/static.py: "auto" is eager on every device until a recorded GPU run
shows the static path with CUDA graphs correct and faster; "on" asks for it); `info.forward`
says which runs. One sequence's code is engine/backends/hf/native_sequence.py.
"""

from __future__ import annotations

import torch

from engine.backends.capabilities import Slots
from engine.backends.hf.loader import LoadedModel, is_oom
from engine.backends.hf.native import NativeLlama
from engine.backends.hf.native_sequence import NativeSequence
from engine.backends.hf.native_slots import NativeSlot, run_batch
from engine.backends.hf.packed import PACKED, fits, why_not
from engine.backends.hf.static import choose
from engine.backends.slots import BatchCall, SlotsFull
from engine.models.memory_errors import out_of_memory


class NativeBackend(NativeSequence):
    """A llama-family model on NativeLlama: trees, hidden states, early exit, int8 weights, and
    more sequences on the same weights (Slots: `open_slot`, `forward_batch`), itself the first."""

    capabilities = NativeSequence.capabilities | {Slots}
    _max_slots = 1

    def __init__(self, loaded: LoadedModel, compile: str = "auto", prepack: str = "auto") -> None:
        """Builds the forward on `loaded`'s weights (fused in place; int8 replaces the float ones);
        `compile`: "auto", "on" or "off" (static.choose); `prepack`: "auto" or "off" (packed.py)."""
        try:
            native = NativeLlama(loaded.model, loaded.n_ctx, loaded.weights)
            path = _prepack(native, prepack)
            static, forward = choose(native, compile)
            path = f"{forward}, {path}" if path else forward
        except Exception as error:
            if not is_oom(error):
                raise
            raise out_of_memory(
                f"prepare {loaded.name}",
                path=loaded.path,
                backend="torch",
                dtype=loaded.dtype_label,
                device=loaded.device,
                n_ctx=loaded.n_ctx,
            ) from error
        super().__init__(loaded, weight_bytes=native.weight_bytes, forward=path)
        self._native = native
        # The one forward every call goes through: NativeLlama's own (eager), or the static one.
        self._pass = native.forward if static is None else static.forward
        self._static = static  # StaticForward or None (eager); slots share it (native_slots._SHARED)
        self._start_sequence(native.new_cache() if static is None else static.cache)
        self._slots: list[NativeSequence] = []  # the slots open now, this backend not included

    @property
    def max_slots(self) -> int:
        """Sequences at once, this one included (engine/models/loading.py sets it from --parallel).
        The static path sizes its shared KV buffer to it (capacity still grows as it is used)."""
        return self._max_slots

    @max_slots.setter
    def max_slots(self, slots: int) -> None:
        if slots < 1 + len(self._slots):
            raise ValueError(f"{len(self._slots)} slots are open: max_slots cannot be {slots}")
        if self._static is not None:
            self._static.resize(slots)
        self._max_slots = slots

    def _new_cache(self):
        """An empty cache for a slot: the static forward's next slot, or a KVCache of its own."""
        return self._native.new_cache() if self._static is None else self._static.open_cache()

    def _release_cache(self, cache) -> None:
        """A closing slot's cache: its place in the static buffer is free again."""
        if self._static is not None:
            self._static.release(cache)

    # -- more sequences (Slots) ------------------------------------------------------------

    def open_slot(self) -> NativeSequence:
        """A new, empty sequence on this model's weights, with a cache of its own (native_slots.NativeSlot):
        on the eager path a KVCache, on the static-shape path (--compile on) a slot of the static
        forward's shared buffer (static.py), which forward_batch steps with the others in one padded
        forward."""
        if self._model is None:
            raise RuntimeError("this backend was closed")
        if 1 + len(self._slots) >= self.max_slots:
            raise SlotsFull(
                f"{self._info.name} holds {self.max_slots} sequence{'s' if self.max_slots != 1 else ''} at once "
                f"(--parallel {self.max_slots}) and all are in use: wait for one to finish, or load the model "
                "with a larger --parallel."
            )
        slot = NativeSlot(self)
        self._slots.append(slot)
        return slot

    def forward_batch(self, calls: list[BatchCall]) -> list[torch.Tensor]:
        """One forward over the rows of several sequences (this one and slots it opened, each at most
        once), each left as its own forward or forward_masked would leave it (native_slots.run_batch)."""
        return run_batch(self, self._slots, calls)

    def close(self) -> None:
        """Free the model and every slot's cache: the slots are unusable afterwards."""
        for slot in list(self._slots):
            slot.close()
        super().close()


def _prepack(native: NativeLlama, choice: str) -> str:
    """Pack `native`'s linear maps where that pays and fits (packed.py); what the load line says of it."""
    reason = why_not(choice, native.device, native.dtype, native.weights)
    if reason is None:
        reason = fits(native.linear_bytes())
    if reason is None:
        native.prepack()
        return PACKED
    return reason
