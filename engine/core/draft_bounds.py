"""A generation's draft bounds: the shortest and longest draft, and the least draft probability.

llama-server takes them per request (speculative.n_min, n_max, p_min), and any front
end may give them to a generation through its `DraftLength`:

    n_max   the longest draft: caps a fixed k, and automatic k's k_max
    n_min   the shortest: a drafting step asks for at least n_min tokens, and a chain draft
            the drafter found shorter is dropped (the step decodes plainly); clamped to n_max
    p_min   a chain draft is cut at its first token whose draft probability q is below p_min
            (only drafts that carry q: the draft-model drafter's, DrafterSpec.draft_probabilities)

n_max and n_min are applied where k is chosen (`DraftLength.choose`), n_min and p_min where a
draft is fitted to k (engine/core/feeds.py `fit_draft`), to chain drafts only: trees, lookahead's
window and early exit's rows are not cut. The draft model keeps in its cache what it drafted past
a cut; it rolls back to the committed text before its next draft (ModelDrafter.propose), so the cut
costs nothing but the tokens drafted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.drafters.base import ChainDraft

K_LIMIT = 32  # longest draft anyone may ask for (engine/core/draft_length.py says so too)


@dataclass(frozen=True)
class DraftBounds:
    n_min: int = 0
    n_max: int | None = None  # None: no cap beyond the engine's own
    p_min: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_min", min(self.n_min, self.cap))  # clamped to n_max, as llama-server does

    @property
    def cap(self) -> int:
        return K_LIMIT if self.n_max is None else self.n_max

    @property
    def cuts(self) -> bool:
        """Whether fitting a draft to these bounds can change it."""
        return self.n_min > 0 or self.p_min > 0

    def length(self, k: int) -> int:
        """A chosen k held to the bounds: plain steps (k = 0) stay plain, as drafting that does not pay
        is not forced."""
        return min(max(k, self.n_min), self.cap) if k > 0 else 0

    def apply(self, draft: ChainDraft) -> ChainDraft:
        """The chain cut at its first token with q < p_min, or no draft when shorter than n_min."""
        n = len(draft)
        if self.p_min > 0 and draft.q_token is not None:
            n = next((i for i, q in enumerate(draft.q_token) if q < self.p_min), n)
        if n < max(self.n_min, 1):
            return replace(draft, tokens=[], q=None, q_token=None)  # no draft: the step decodes plainly
        if n == len(draft):
            return draft
        q = draft.q[:n] if draft.q is not None else None
        return replace(draft, tokens=draft.tokens[:n], q=q, q_token=draft.q_token[:n])


NO_BOUNDS = DraftBounds()
