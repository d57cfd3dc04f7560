"""The drafter interface: propose up to k tokens, then learn how many were kept.

A drafter is a small strategy object (as in transformers' candidate generators),
registered by its spec module (engine/drafters/registry.py):
`propose` looks at the committed context and returns a `Draft`; `observe` is told
how many of its tokens the target accepted. A drafter with a distribution returns
q for each token (processed with the same `SamplingConfig` as the target, so the
rejection rule stays lossless); one without (n-gram lookup) returns q=None and is
verified as a point mass.

Tree-shaped drafts (Medusa, EAGLE, lookahead) set `Draft.parents`: node i's
parent is parents[i] (an earlier node), or -1 when it follows the pending token
directly. A chain is the tree where parents[i] == i - 1 (and parents=None).
Tree nodes are verified as point masses (engine/core/verify_tree.py), so siblings
must carry distinct tokens and q is not used. A backend that cannot verify trees
(llama.cpp) verifies one branch instead: `Draft.best_path`, or the first child
at every level when it is None, so list the most likely child first.
A tree drafter sets `drafts_trees` and interprets k as its node budget.

Drafters that work from the target's hidden states (Medusa, EAGLE) set
`uses_features`; after every step the decode loop hands them the target's final
hidden states of the tokens that step committed to the cache.

Extra rows (lookahead decoding). A draft may also carry rows the target should
run in the same forward without verifying them: `extra_tokens`, placed at
`extra_offsets` (positions relative to the pending token, which is offset 0),
attending to the whole cache, to the pending token and to the extra rows j where
`extra_mask[i, j]` (bool (e, e), diagonal included), never to the draft nodes;
no draft node attends to them, so they cannot change the verdict. The decode
loop hands their logits to `observe_extra` and drops their cache entries. Only
backends with TreeForward (a masked forward) run them; elsewhere they are
dropped with the rest of the tree.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.drafters.registry import DrafterStats, NoStats

if TYPE_CHECKING:  # annotations only: a light drafter module (a spec with its drafter) loads no torch
    import torch

    from engine.core.sampling import SamplingConfig


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    q: torch.Tensor | None = None  # (n, V_target) processed draft probabilities; None = point mass
    q_token: tuple[float, ...] | None = None  # q(x_i) for display (raw softmax when greedy)
    parents: tuple[int, ...] | None = None  # None = a chain; else parent index per node, -1 = root
    # The branch to verify where trees cannot be: node indices from depth 1 down (tree drafts only).
    best_path: tuple[int, ...] | None = None
    # Early exit: the residual stream after the first `exit_layer` layers of the tokens the
    # drafter ran (the pending token, then all drafts but the last), for the verifying
    # forward to start from (TorchBackend.forward_from_exit). Chains only.
    exit_hidden: torch.Tensor | None = None
    exit_layer: int = 0
    # Rows run alongside the draft and never verified (see the module docstring).
    extra_tokens: tuple[int, ...] = ()
    extra_offsets: tuple[int, ...] = ()  # position of each, relative to the pending token (offset 0)
    extra_mask: torch.Tensor | None = field(default=None, compare=False)  # bool (e, e): row i sees row j
    # Seconds of the proposal spent feeding committed tokens the drafter's own cache lacked
    # (a draft model after plain steps), not drafting: the cost model keeps it out of the
    # per-token draft cost, since a prefill of n tokens costs far less than n decodes.
    catch_up_s: float = field(default=0.0, compare=False)
    # The drafter's own estimate of how many of these tokens will be accepted (suffix decoding: the
    # sum of its nodes' vote shares), where it has one: a chain (chain.py) compares drafts by it.
    expected: float | None = field(default=None, compare=False)

    @property
    def is_tree(self) -> bool:
        return self.parents is not None and any(p != i - 1 for i, p in enumerate(self.parents))

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft(tokens=[])


class Drafter(abc.ABC):
    name: str = "drafter"
    uses_features: bool = False  # True when it needs observe_features() after every step
    drafts_trees: bool = False  # True when propose() returns trees; k is then a node budget
    # True when proposing costs next to nothing and changes nothing a later call depends on (n-gram
    # lookup, suffix decoding): a chain (chain.py) asks it every step and may leave its draft unused.
    free: bool = False
    # The engine's CostModel (engine/core/draft_length.py), set by Engine: drafters that size
    # themselves from the verify-cost curve (lookahead's W, N, G; early exit's L) read it.
    costs = None

    @abc.abstractmethod
    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """Up to k tokens that may follow `context` (the committed token ids)."""

    def observe(self, drafted: int, accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""

    def observe_features(self, features: torch.Tensor) -> None:
        """The target's final hidden states (m, hidden) for the tokens the last step
        put in the cache for good: the pending token it was fed, then the accepted
        drafts. The last row is the one whose logits chose the new pending token."""

    def observe_extra(self, logits: torch.Tensor) -> None:
        """Float32 logits (e, V) of the last draft's extra rows, in `extra_tokens` order
        (called right after the target's forward, before the verdict)."""

    def tree_expected_tokens(self, nodes: int) -> float | None:
        """Tree drafters: expected tokens per step (accepted nodes + 1) from a tree of
        `nodes` nodes, from the drafter's own acceptance estimates; automatic k uses it
        in place of the chain formula. None = use the chain formula."""
        return None

    def measure_token_cost(self) -> float | None:
        """Seconds to draft one token, measured once at load (None: nothing to measure, or
        the drafter does not say); the cost model starts from it and follows the loop."""
        return None

    def reset(self) -> None:
        """Forget per-conversation state (called at the start of each generation)."""

    def begin(self, prompt: list[int]) -> None:
        """The prompt a generation starts from (its token ids, the pending token last), told
        right after `reset`: what the reply will be appended to (suffix decoding keeps replies)."""

    def forget(self) -> None:
        """Forget what was learned from earlier generations (suffix decoding's earlier replies):
        a benchmark's runs must not draft from each other's replies."""

    def stats(self) -> DrafterStats:
        """Drafter-specific numbers for the UI (pool size, hits...): the frozen dataclass its
        registry spec names as `stats` (engine/drafters/registry.py), fields labelled for the charts."""
        return NoStats()

    def close(self) -> None:
        """Free what the drafter holds (a draft model, say)."""
