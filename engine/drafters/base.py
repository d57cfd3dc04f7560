"""The drafter guide: what a drafter is, the drafts it returns, and what it may opt into.

A drafter is a small strategy object (as in transformers' candidate generators),
registered by its spec module (engine/drafters/registry.py). Its core is five
methods, `Drafter`:

    propose(context, k, sampling, generator) -> Draft   up to k tokens after the committed context
    observe(drafted, accepted)                          how many of them the target accepted
    reset()                                             a new generation starts
    stats() -> DrafterStats                             its numbers for the UI
    close()                                             free what it holds (a draft model)

Drafts. `propose` returns one of two types, and the decode step matches on the type
in one place (engine/core/feeds.py `feed_for`):

    ChainDraft   d_1..d_n, each after the ones before it. A drafter with a distribution
                 returns q for each token (processed with the same `SamplingConfig` as the
                 target, so the rejection rule stays lossless); one without (n-gram lookup)
                 returns q=None and is verified as a point mass.
    TreeDraft    nodes with `parents`: node i's parent is parents[i] (an earlier node), or -1
                 when it follows the pending token directly. Tree nodes are verified as point
                 masses (engine/core/verify_tree.py), so siblings must carry distinct tokens and
                 there is no q. A backend that cannot verify trees (llama.cpp) verifies one
                 branch instead: `best_path`, or the first child at every level when it is None,
                 so list the most likely child first.

Either may carry extra-row parts, each its own type:

    ExitStart    (chains only) early exit's start: the residual stream after the first `layer`
                 layers of the tokens the drafter ran (the pending token, then all drafts but the
                 last), for the verifying forward to start from (LayerExit.forward_from_exit).
    ExtraRows    (lookahead's window) rows the target runs in the same forward without verifying
                 them: `tokens` at `offsets` (positions relative to the pending token, which is
                 offset 0), attending to the whole cache, to the pending token and to the extra
                 rows j where `mask[i, j]` (bool (e, e), diagonal included), never to the draft
                 nodes; no draft node attends to them, so they cannot change the verdict. Only
                 backends with TreeForward (a masked forward) run them; elsewhere they are dropped.

Opt-in protocols. Everything beyond the core is a protocol below that a drafter
declares in its `capabilities` (a frozenset, on the class or, where it depends on
the target, on the instance), checked with `has(drafter, Protocol)`, the function
engine/backends/capabilities.py checks backends with (re-exported here):

    ReadsFeatures     observe_features(features): after every step, the target's final hidden
                      states of the tokens that step committed to the cache (Medusa; EAGLE reads
                      the cached tokens' states from the target itself, HiddenFeatures)
    DraftsTrees       propose returns trees and k is a node budget; tree_expected_tokens(nodes)
                      sizes automatic k (None: the chain formula)
    ReadsExtraRows    observe_extra(logits): the logits of its draft's ExtraRows (lookahead)
    ReadsCosts        a `costs` attribute the engine sets to its CostModel: drafters that size
                      themselves from the verify-cost curve (lookahead's W, N, G; early exit's L)
    MeasuresCost      measure_token_cost(): seconds per drafted token, measured once at load
    RemembersReplies  begin(prompt) after each reset, forget() between a benchmark's runs: a
                      drafter that learns from earlier replies (suffix decoding)
    FreeToAsk         proposing costs next to nothing and changes nothing a later call depends on
                      (n-gram lookup, suffix decoding): a chain (chain.py) asks it every step
    DraftsTogether    drafters of one kind that draft for several sequences of a batch in shared
                      forwards (draft models on slots of one model: engine/core/batch.py)

A wrapper (a chain of drafters) declares what its inner drafters have and forwards
only that. The helpers below (`share_costs`, `measured_token_cost`, `forget_replies`)
do the opt-in call for code that holds any drafter.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.backends.capabilities import has
from engine.drafters.options import DrafterStats, NoStats

_log = logging.getLogger(__name__)

if TYPE_CHECKING:  # annotations only: a light drafter module (a spec with its drafter) loads no torch
    import torch

    from engine.core.draft_length import CostModel
    from engine.core.sampling import SamplingConfig


@dataclass(frozen=True)
class ExitStart:
    """Early exit's rows: layer `layer`'s input for the pending token and the drafts the drafter ran."""

    hidden: torch.Tensor  # (n or n + 1, hidden)
    layer: int


@dataclass(frozen=True)
class ExtraRows:
    """Rows run beside the draft and never verified (see the module docstring)."""

    tokens: tuple[int, ...]
    offsets: tuple[int, ...]  # position of each, relative to the pending token (offset 0)
    mask: torch.Tensor | None = field(default=None, compare=False)  # bool (e, e): row i sees row j; None = causal

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class ChainDraft:
    tokens: list[int]
    q: torch.Tensor | None = None  # (n, V_target) processed draft probabilities; None = point mass
    q_token: tuple[float, ...] | None = None  # q(x_i) for display (raw softmax when greedy)
    exit: ExitStart | None = None  # early exit: where the verifying forward may start
    extra: ExtraRows | None = None
    # Seconds of the proposal spent feeding committed tokens the drafter's own cache lacked
    # (a draft model after plain steps), not drafting: the cost model keeps it out of the
    # per-token draft cost, since a prefill of n tokens costs far less than n decodes.
    catch_up_s: float = field(default=0.0, compare=False)
    # The drafter's own estimate of how many of these tokens will be accepted (suffix decoding: the
    # sum of its nodes' vote shares), where it has one: a chain (chain.py) compares drafts by it.
    expected: float | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class TreeDraft:
    tokens: list[int]
    parents: tuple[int, ...]  # parent index per node, -1 = the pending token
    # The branch to verify where trees cannot be: node indices from depth 1 down.
    best_path: tuple[int, ...] | None = None
    extra: ExtraRows | None = None
    catch_up_s: float = field(default=0.0, compare=False)  # as ChainDraft's
    expected: float | None = field(default=None, compare=False)  # as ChainDraft's

    @property
    def branches(self) -> bool:
        """Whether some node has a sibling (else the tree is a chain: parents[i] == i - 1)."""
        return any(p != i - 1 for i, p in enumerate(self.parents))

    def __len__(self) -> int:
        return len(self.tokens)


Draft = ChainDraft | TreeDraft
EMPTY_DRAFT = ChainDraft(tokens=[])


class Drafter(abc.ABC):
    name: str = "drafter"
    capabilities: frozenset[type] = frozenset()  # the opt-in protocols below that it implements

    @abc.abstractmethod
    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """Up to k tokens (tree nodes, for a tree drafter) that may follow `context` (the committed token ids)."""

    def observe(self, drafted: int, accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""

    def reset(self) -> None:
        """Forget per-conversation state (called at the start of each generation)."""

    def stats(self) -> DrafterStats:
        """Drafter-specific numbers for the UI (pool size, hits...): the frozen dataclass its
        registry spec names as `stats` (engine/drafters/registry.py), fields labelled for the charts."""
        return NoStats()

    def close(self) -> None:
        """Free what the drafter holds (a draft model, say)."""


@runtime_checkable
class ReadsFeatures(Protocol):
    def observe_features(self, features: torch.Tensor) -> None:
        """The target's final hidden states (m, hidden) for the tokens the last step
        put in the cache for good: the pending token it was fed, then the accepted
        drafts. The last row is the one whose logits chose the new pending token."""
        ...


@runtime_checkable
class DraftsTrees(Protocol):
    def tree_expected_tokens(self, nodes: int) -> float | None:
        """Expected tokens per step (accepted nodes + 1) from a tree of `nodes` nodes, from the
        drafter's own acceptance estimates; automatic k uses it in place of the chain formula.
        None = use the chain formula."""
        ...


@runtime_checkable
class ReadsExtraRows(Protocol):
    def observe_extra(self, logits: torch.Tensor) -> None:
        """Float32 logits (e, V) of the last draft's extra rows, in `ExtraRows.tokens` order
        (called right after the target's forward, before the verdict)."""
        ...


@runtime_checkable
class ReadsCosts(Protocol):
    costs: CostModel | None  # the engine's CostModel (engine/core/draft_length.py), set by Engine


@runtime_checkable
class MeasuresCost(Protocol):
    def measure_token_cost(self) -> float | None:
        """Seconds to draft one token, measured once at load (None: nothing to measure); the
        cost model starts from it and follows the loop."""
        ...


@runtime_checkable
class RemembersReplies(Protocol):
    def begin(self, prompt: list[int]) -> None:
        """The prompt a generation starts from (its token ids, the pending token last), told
        right after `reset`: what the reply will be appended to (suffix decoding keeps replies)."""
        ...

    def forget(self) -> None:
        """Forget what was learned from earlier generations: a benchmark's runs must not draft
        from each other's replies."""
        ...


@runtime_checkable
class DraftsTogether(Protocol):
    def together_key(self) -> object:
        """Drafters with equal keys draft together (`propose_together`); a key of its own: alone."""
        ...

    @classmethod
    def propose_together(cls, drafters: list, contexts: list, ks: list, samplings: list, generators: list) -> list:
        """`propose` for each drafter (same key) at once: drafter i's Draft after contexts[i], up to
        ks[i] tokens, drawn with samplings[i] and generators[i], exactly as its own propose would."""
        ...


class FreeToAsk(Protocol):
    """A marker: proposing costs next to nothing and changes nothing a later call depends on."""


def share_costs(drafter: Drafter | None, costs: CostModel | None) -> None:
    """Hand `drafter` the engine's cost model, where it reads one (ReadsCosts)."""
    if has(drafter, ReadsCosts):
        drafter.costs = costs


def measured_token_cost(drafter: Drafter | None) -> float | None:
    """The drafter's load-time cost per token, where it measures one (MeasuresCost)."""
    return drafter.measure_token_cost() if has(drafter, MeasuresCost) else None


def forget_replies(drafter: Drafter | None) -> None:
    """Forget earlier generations' replies, where the drafter keeps them (RemembersReplies)."""
    if has(drafter, RemembersReplies):
        drafter.forget()


_failed_stats: set[type] = set()  # drafter classes whose stats() raised: logged once each


def drafter_stats(drafter: Drafter | None):
    """`drafter.stats()`, None without a drafter or when stats() fails (logged once: a statistics bug
    must not end a reply; the charts then go without the drafter's numbers). Its record is frozen,
    a copy nothing changes."""
    if drafter is None:
        return None
    try:
        return drafter.stats()
    except Exception:  # noqa: BLE001
        if type(drafter) not in _failed_stats:
            _failed_stats.add(type(drafter))
            _log.exception("%s.stats() failed; its numbers are left out of the charts", type(drafter).__name__)
        return None
