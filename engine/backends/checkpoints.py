"""State checkpoints: how a model whose cache cannot be cut token by token rolls back.

An attention layer keeps one cache entry per token, so a rejected draft is undone by
dropping the entries past the accepted length. A recurrent layer (Mamba, a gated
delta net, LFM2's short convolution) keeps one state for the whole sequence, already
updated with the rejected tokens. Hybrid models (Qwen3.5, Qwen3-Next, LFM2,
Nemotron-H, Granite 4, Falcon-H1) have both. Such a backend saves the recurrent state
before each forward (`save`, keyed by the number of tokens it covers); a rollback to
`length` restores the newest state saved at or before `length` (`newest_at_or_before`),
cuts the attention layers back to that position as usual, and runs the model over the
kept tokens after it again (the replay), so that the cache equals a fresh pass over
the kept tokens. llama.cpp's server does the same with its context checkpoints.

A few states are kept, not one: a draft model runs one forward per drafted token, and
its rollback goes back several of them. The backend's `replays_on_rollback` flag tells
the decoding loop that a rollback costs a replay (engine/core/costs.py counts it).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

State = TypeVar("State")

KEEP = 16  # states kept: a draft of up to 15 tokens one forward each, plus the step's verify


@dataclass(frozen=True)
class Checkpoint(Generic[State]):
    """The recurrent state after the first `position` tokens of the sequence."""

    position: int
    state: State


class StateCheckpoints(Generic[State]):
    """The newest `keep` checkpoints of one sequence, oldest first."""

    def __init__(self, keep: int = KEEP) -> None:
        self._saved: collections.deque[Checkpoint[State]] = collections.deque(maxlen=keep)

    def save(self, position: int, state: State) -> None:
        """Remember the state after `position` tokens; later checkpoints are stale and go."""
        self.drop_after(position - 1)
        self._saved.append(Checkpoint(position, state))

    def newest_at_or_before(self, length: int) -> Checkpoint[State] | None:
        """The checkpoint to restore for a rollback to `length` tokens; None: replay from the start."""
        for checkpoint in reversed(self._saved):
            if checkpoint.position <= length:
                return checkpoint
        return None

    def drop_after(self, length: int) -> None:
        """Forget the states past `length` tokens (they hold tokens no longer in the sequence)."""
        while self._saved and self._saved[-1].position > length:
            self._saved.pop()

    def clear(self) -> None:
        self._saved.clear()

    def __len__(self) -> int:
        return len(self._saved)

    def __iter__(self) -> Iterator[Checkpoint[State]]:
        """The checkpoints kept, oldest first: a backend that reuses its state buffers looks here
        for the ones still in use."""
        return iter(self._saved)
