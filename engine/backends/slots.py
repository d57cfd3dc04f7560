"""Several sequences on one model: what one call of a batched forward asks, and running a step's calls.

A backend with `Slots` (engine/backends/capabilities.py) holds several sequences, each
a `Backend` of its own sharing the weights. The batched decode step (engine/core/batch.py)
gathers each sequence's rows as a `BatchCall` and runs them with `run_calls`: one call is
the slot's own forward (so one sequence decodes exactly as it always has), several are one
`forward_batch` on the owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.backends.capabilities import Slots, has
from engine.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from engine.backends.base import Backend


class SlotsFull(ConfigError):
    """Every sequence a backend can hold is in use."""


@dataclass(frozen=True)
class BatchCall:
    """One sequence's rows in a batched forward: `tokens` after what `slot` caches, a causal chain
    (`slot.forward`), or with `offsets` and a bool `mask` (n, n) as `slot.forward_masked` takes them."""

    slot: Backend
    tokens: list[int]
    offsets: list[int] | None = None
    mask: torch.Tensor | None = None
    what: str = "a block"  # for a context-full message: "a tree", "a lookahead step"
    # A token tree's parents (offsets and mask then say the same): alone, the call runs as
    # `slot.forward_tree`, which every tree backend has; in a batch, as the masked rows it is.
    parents: list[int] | None = None

    @property
    def masked(self) -> bool:
        return self.mask is not None


def run_calls(owner: Backend, calls: list[BatchCall]) -> list[torch.Tensor]:
    """Each call's float32 logits (len(tokens), V): one call through its slot's own forward, several
    through one `forward_batch` of `owner`, which must have Slots."""
    if len(calls) == 1:
        call = calls[0]
        if call.parents is not None:
            return [call.slot.forward_tree(call.tokens, call.parents)]
        if call.masked:
            return [call.slot.forward_masked(call.tokens, call.offsets, call.mask, what=call.what)]
        return [call.slot.forward(call.tokens)]
    if not has(owner, Slots):
        raise ConfigError(
            f"The {owner.name} backend runs one sequence at a time for {owner.info.name}, and "
            f"{len(calls)} were asked for in one forward: serve one request at a time (--parallel 1)."
        )
    return owner.forward_batch(calls)
