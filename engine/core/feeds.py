"""One feed per kind of draft: what the target runs for it, the rule that judges it, what the cache keeps.

A drafter's draft (a ChainDraft or a TreeDraft, engine/drafters/base.py) is cut to what this
step verifies (`fit_draft`) and, matched by its type here and nowhere else, becomes one of:

    feed          target forward over [x_m, drafts...]      rule                         commit
    draft                 feed          target forward over [x_m, drafts...]      rule                   commit
    ChainDraft            ChainFeed     forward: d_i after d_1..d_{i-1}           chain (q, or a point   rollback
                                                                                  mass)
    ChainDraft + ExitStart ExitFeed     forward_from_exit: the draft already ran  chain                  rollback
                                        layers 0..L-1, the target starts at L
    TreeDraft             TreeFeed      forward_tree: node i sees its ancestors   tree (point masses)    keep_nodes
    either + ExtraRows    ExtraRowsFeed forward_masked: a chain or tree feed and  the wrapped feed's     keep_rows
                                        e unverified rows (lookahead's window)

Every feed's forward returns p's rows l_0..l_n for its n drafts (l_{i-1} is p's row for
d_i, l_n the row after d_n), `verify` returns the verdict with the accepted nodes (`path`)
and the depths the rule tested, and `commit` leaves the cache holding the committed
tokens, x_m and the accepted path: the decode loop's invariant (engine/core/decode.py).
`rows` is what the forward really ran (n + 1, plus the extra rows), what the cost model
is told.

A feed's forward is one `BatchCall` (engine/backends/slots.py: `call`), so that the batched
step (engine/core/batch.py) runs the calls of every sequence in one target forward and hands
each feed its rows back (`receive`); `forward` is the same for one sequence on its own. Only
the early-exit feed cannot join a batch (its forward starts from residual streams of its
own): `batchable` is False there and it runs its own forward.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.backends.base import Backend
from engine.backends.capabilities import HiddenFeatures, LayerExit, TreeForward, has
from engine.backends.slots import BatchCall, run_calls
from engine.core.draft_bounds import DraftBounds
from engine.core.sampling import SamplingConfig, probabilities
from engine.core.tree import ancestor_mask, depths
from engine.core.verify import Verdict, verify_greedy, verify_sampled
from engine.core.verify_tree import dedupe_siblings, verify_tree_greedy, verify_tree_sampled
from engine.drafters.base import ChainDraft, Draft, ExtraRows, TreeDraft


class ChainFeed:
    """d_1..d_n after the pending token x_m, each seeing the ones before it."""

    extra = 0  # rows run beside the drafts and never verified
    extra_logits: torch.Tensor | None = None
    tree_depth: int | None = None  # None: the run counts this step by its length, as a chain
    batchable = True  # its forward can be one call of a batched forward

    def __init__(self, draft: ChainDraft) -> None:
        self.tokens = list(draft.tokens)
        self.q = draft.q[: len(self.tokens)] if draft.q is not None else None  # (n, V) or a point mass
        self.q_token = draft.q_token  # q(d_i), for display

    @property
    def rows(self) -> int:
        return len(self.tokens) + 1 + self.extra

    def call(self, slot: Backend, pending: int) -> BatchCall:
        return BatchCall(slot, [pending, *self.tokens])

    def receive(self, logits: torch.Tensor, batched: bool = False) -> torch.Tensor:
        """The rows the rule judges, from what this feed's call returned (`batched`: as one call of a
        batched forward): all of them, (n+1, V)."""
        return logits

    def forward(self, target: Backend, pending: int) -> torch.Tensor:
        """The target's rows for this feed alone (one sequence): l_0..l_n, (n+1, V)."""
        return self.receive(run_calls(target, [self.call(target, pending)])[0])

    def verify(
        self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
    ) -> tuple[Verdict, list[int], int]:
        """(verdict, path, tested): the accepted prefix d_1..d_j (path 0..j-1), and j tested,
        plus one where the rule rejected d_{j+1}."""
        if sampling.greedy:
            verdict = verify_greedy(logits, self.tokens)
        else:
            verdict = verify_sampled(probabilities(logits, sampling), self.q, self.tokens, generator)
        path = list(range(verdict.accepted))
        return verdict, path, len(path) + (len(path) < len(self.tokens))

    def kept_rows(self, path: list[int]) -> list[int]:
        """Rows of this forward the cache keeps: x_m and the accepted drafts."""
        return list(range(len(path) + 1))

    def features(self, target: HiddenFeatures, path: list[int]) -> torch.Tensor:
        return target.last_features()[: len(path) + 1]  # (kept + 1, hidden)

    def commit(self, target: Backend, path: list[int], committed: int) -> None:
        """Cut the cache back to the `committed` tokens (x_1..x_m) and the accepted drafts."""
        target.rollback(committed + len(path))  # drop the rejected drafts' cache entries


class ExitFeed(ChainFeed):
    """A chain whose first L layers the early-exit drafter already ran over x_m, d_1..d_{n-1}:
    the verifying forward starts from their residual stream, and only d_n runs from layer 0."""

    def __init__(self, draft: ChainDraft) -> None:
        super().__init__(draft)
        self.hidden = draft.exit.hidden[: len(self.tokens) + 1]  # (n or n+1, hidden): layer L's input
        self.exit_layer = draft.exit.layer

    batchable = False  # the verifying forward starts from this draft's own residual streams

    def forward(self, target: LayerExit, pending: int) -> torch.Tensor:
        return target.forward_from_exit([pending, *self.tokens], self.hidden, self.exit_layer)  # (n+1, V)


class TreeFeed:
    """[x_m, node_1..node_n], node i seeing x_m and its ancestors only; nodes are point masses."""

    extra = 0
    extra_logits: torch.Tensor | None = None
    q_token = None
    batchable = True

    def __init__(self, draft: TreeDraft) -> None:
        self.tokens = list(draft.tokens)
        self.parents = draft.parents
        self._batched = False  # ran as masked rows of a batch: keep_rows, not keep_nodes, commits it

    @property
    def rows(self) -> int:
        return len(self.tokens) + 1 + self.extra

    @property
    def tree_depth(self) -> int:
        return max(depths(self.parents))

    def call(self, slot: TreeForward, pending: int) -> BatchCall:
        # parents shifted by one for x_m in front; row i + 1 is p after node i
        parents = [-1, *(p + 1 for p in self.parents)]
        offsets = [d - 1 for d in depths(parents)]
        return BatchCall(slot, [pending, *self.tokens], offsets, ancestor_mask(parents), "a tree", parents)

    def receive(self, logits: torch.Tensor, batched: bool = False) -> torch.Tensor:
        self._batched = batched
        return logits  # (n+1, V)

    def forward(self, target: TreeForward, pending: int) -> torch.Tensor:
        return self.receive(run_calls(target, [self.call(target, pending)])[0])

    def verify(
        self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
    ) -> tuple[Verdict, list[int], int]:
        """(verdict, path, tested): the accepted root-to-node path (engine/core/verify_tree.py)."""
        if sampling.greedy:
            verdict = verify_tree_greedy(logits, self.tokens, self.parents)
        else:
            verdict = verify_tree_sampled(probabilities(logits, sampling), self.tokens, self.parents, generator)
        return verdict, list(verdict.path), verdict.tested_depths

    def kept_rows(self, path: list[int]) -> list[int]:
        return [0, *(node + 1 for node in path)]

    def features(self, target: HiddenFeatures, path: list[int]) -> torch.Tensor:
        return target.last_features()[self.kept_rows(path)]  # (kept + 1, hidden)

    def commit(self, target: TreeForward, path: list[int], committed: int) -> None:
        rows = self.kept_rows(path)
        target.keep_rows(rows) if self._batched else target.keep_nodes(rows)


class ExtraRowsFeed:
    """A chain or tree feed with the draft's extra rows beside it, in one `forward_masked`
    (`masked_block`): rows 0..n are what the wrapped feed's forward returns, so its rule
    judges them; the extra rows' logits go to the drafter and their cache entries are dropped."""

    def __init__(self, inner: ChainFeed | TreeFeed, draft: Draft) -> None:
        self.inner = inner
        self.draft = draft
        self.tokens = inner.tokens
        self.q_token = inner.q_token
        self.extra = len(draft.extra)
        self.extra_logits: torch.Tensor | None = None

    batchable = True

    @property
    def rows(self) -> int:
        return len(self.tokens) + 1 + self.extra

    @property
    def tree_depth(self) -> int | None:
        return self.inner.tree_depth

    def call(self, slot: TreeForward, pending: int) -> BatchCall:
        return BatchCall(slot, *masked_block(pending, self.draft), what="a lookahead step")

    def receive(self, block: torch.Tensor, batched: bool = False) -> torch.Tensor:
        self.extra_logits = block[len(self.tokens) + 1 :]  # (e, V)
        return block[: len(self.tokens) + 1]  # (n+1, V): what forward_tree would have returned

    def forward(self, target: TreeForward, pending: int) -> torch.Tensor:
        return self.receive(run_calls(target, [self.call(target, pending)])[0])

    def verify(
        self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
    ) -> tuple[Verdict, list[int], int]:
        return self.inner.verify(logits, sampling, generator)

    def features(self, target: HiddenFeatures, path: list[int]) -> torch.Tensor:
        return self.inner.features(target, path)

    def commit(self, target: TreeForward, path: list[int], committed: int) -> None:
        # x_m and the accepted path, without the extra rows (keep_nodes needs forward_tree; this is its general form)
        target.keep_rows(self.inner.kept_rows(path))


Feed = ChainFeed | TreeFeed | ExtraRowsFeed


def feed_for(draft: Draft, k: int, target: Backend, room: int | None = None, bounds: DraftBounds | None = None) -> Feed:
    """The feed that verifies `draft` on `target`: cut to k tokens (nodes), to a request's bounds and
    to what the target can run (`fit_draft`), then one feed for its type. A chain that ran the first
    layers goes from there where the target can (LayerExit); elsewhere it is a chain like any other."""
    fitted = fit_draft(draft, k, has(target, TreeForward), room, bounds)
    if isinstance(fitted, TreeDraft):
        feed = TreeFeed(fitted)
    elif fitted.exit is not None and fitted.tokens and has(target, LayerExit):
        feed = ExitFeed(fitted)
    else:
        feed = ChainFeed(fitted)
    return ExtraRowsFeed(feed, fitted) if fitted.extra else feed  # no ExtraRows, or none


def fit_draft(draft: Draft, k: int, trees: bool, room: int | None = None, bounds: DraftBounds | None = None) -> Draft:
    """The draft as it will be verified: at most k tokens (nodes, for a tree).

    Tree nodes are point masses, siblings carry distinct tokens (a repeated sibling goes,
    with its subtree), and where the backend verifies chains only the tree becomes its best
    branch, a ChainDraft; so does a tree without branches. A plain chain (no extra-row part)
    is held to `bounds` first: cut at its first token below p_min, dropped when shorter than
    n_min (engine/core/draft_bounds.py). Extra rows are not counted in k; they stay when the
    backend runs masked forwards (`trees`) and they fit behind the pending token with the
    nodes (`room`: free positions after it), and are dropped otherwise.
    """
    if isinstance(draft, ChainDraft) and not draft.extra and draft.exit is None:
        return _fit_chain(bounds.apply(draft) if bounds is not None and bounds.cuts else draft, k)
    if not draft.extra:
        return _fit_nodes(draft, k, trees)
    nodes = _fit_nodes(replace(draft, extra=None), k, trees)
    extra = draft.extra
    fits = room is None or (len(nodes) + len(extra) <= room and max(extra.offsets, default=0) <= room)
    if not trees or not fits:
        return nodes
    return replace(nodes, extra=extra)


def masked_block(pending: int, draft: Draft) -> tuple[list[int], list[int], torch.Tensor]:
    """tokens, offsets and mask of one `forward_masked` call over the pending token, the
    draft's nodes (a ChainDraft's as the chain they are) and its extra rows, in that order.

    Offsets: the pending token 0, node i its depth, extra row j `extra_offsets[j]`. Mask
    (bool, n + 1 + e square): every row sees the pending token; node i sees its ancestors
    and itself; extra rows see each other as `extra_mask` says (a causal chain when it is
    None); nodes and extra rows never see each other.
    """
    extra = draft.extra if draft.extra is not None else ExtraRows((), ())
    n, e = len(draft.tokens), len(extra)
    parents = draft.parents if isinstance(draft, TreeDraft) else tuple(range(-1, n - 1))
    if len(parents) != n or len(extra.offsets) != e:
        raise ValueError(f"a draft of {n} nodes and {e} extra rows needs as many parents and offsets")
    extra_mask = extra.mask if extra.mask is not None else torch.ones(e, e, dtype=torch.bool).tril()
    if tuple(extra_mask.shape) != (e, e):
        raise ValueError(f"extra_mask must be ({e}, {e}), got {tuple(extra_mask.shape)}")
    mask = torch.zeros(1 + n + e, 1 + n + e, dtype=torch.bool)
    mask[:, 0] = True
    if n:
        mask[1 : n + 1, 1 : n + 1] = ancestor_mask(parents)
    if e:
        mask[n + 1 :, n + 1 :] = extra_mask.to(dtype=torch.bool, device="cpu")
    offsets = [0, *depths(parents), *(int(o) for o in extra.offsets)]
    return [pending, *draft.tokens, *extra.tokens], offsets, mask


def _fit_chain(draft: ChainDraft, k: int) -> ChainDraft:
    """A chain cut to k tokens, with its q and its early-exit rows."""
    if len(draft) <= k:
        return draft
    return ChainDraft(
        draft.tokens[:k],
        draft.q[:k] if draft.q is not None else None,
        draft.q_token[:k] if draft.q_token is not None else None,
        exit=replace(draft.exit, hidden=draft.exit.hidden[: k + 1]) if draft.exit is not None else None,
    )


def _fit_nodes(draft: Draft, k: int, trees: bool) -> Draft:
    """fit_draft for a draft without extra rows."""
    if isinstance(draft, ChainDraft):
        return _fit_chain(draft, k)
    if not draft.branches:  # a tree without branches is verified as the chain it is
        return ChainDraft(draft.tokens[:k])
    tokens, parents = list(draft.tokens[:k]), list(draft.parents[:k])
    keep = dedupe_siblings(tokens, parents)
    if len(keep) < len(tokens):
        new_index = {old: new for new, old in enumerate(keep)}
        tokens = [tokens[i] for i in keep]
        parents = [new_index.get(parents[i], -1) for i in keep]
        best = [new_index[i] for i in draft.best_path or () if i in new_index]
    else:
        best = list(draft.best_path or ())
    if trees:
        return TreeDraft(tokens, parents=tuple(parents))
    branch = _branch(parents, best)
    return ChainDraft([tokens[i] for i in branch])


def _branch(parents: list[int], best: list[int]) -> list[int]:
    """The longest valid prefix of `best` (a path from depth 1 down); without one, the first
    child at every level."""
    branch: list[int] = []
    for node in best:
        if node >= len(parents) or parents[node] != (branch[-1] if branch else -1):
            break
        branch.append(node)
    if best:
        return branch
    node = -1
    while (node := next((i for i, p in enumerate(parents) if p == node), None)) is not None:
        branch.append(node)
    return branch
