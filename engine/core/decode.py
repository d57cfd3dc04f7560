"""The decode loop: one speculative step per target forward, yielded as it happens.

The engine knows nothing about chat or text beyond turning ids into pieces for
display; it takes prompt ids and yields `StepEvent`s.

Cache invariant: the target's cache holds every committed token but the last
one, which is "pending" and goes in front of the drafts in the next forward:

    committed:  x_1 ... x_{m-1} x_m
    cache:      x_1 ... x_{m-1}
    step feed:  [x_m, d_1, ..., d_n]        -> logits rows l_0 ... l_n
                l_{i-1} is p's row for d_i; l_n is the row after d_n (bonus)

After the verdict (j drafts kept, then token y), roll the cache back to
x_1..x_m d_1..d_j; y becomes the new pending token. Plain (vanilla) decoding is
the same step with n = 0, so both go through one code path and one sampler.

Trees (Medusa, EAGLE): the feed is [x_m, node_1, ..., node_n] with node i
attending to its ancestors only (`Backend.forward_tree`, parents shifted by one
for x_m in front); row i + 1 is p after node i. The verdict is a root-to-node
path (engine/core/verify_tree.py) and `keep_nodes` keeps x_m and that path. A backend
without tree attention (llama.cpp) gets the draft's best branch as a chain, and
the run says so in `RunStats.notes`. Drafters that read the target's hidden
states get the rows of what the step kept (x_m, then the accepted drafts).

Extra rows (lookahead decoding's Jacobi window): a draft may add e rows that ride
along unverified. The feed becomes [x_m, node_1..node_n, extra_1..extra_e] in one
`Backend.forward_masked` call: x_m at offset 0, node i at its depth, extra j at
the offset the drafter gave; the mask is the tree's (each node sees x_m and its
ancestors) plus the drafter's block among the extra rows, which also see x_m
and the cache, while nodes and extras never see each other. So rows 0..n are
exactly what `forward_tree` would have returned and the verdict is unchanged;
rows n+1.. go to `Drafter.observe_extra`, and `keep_rows` keeps x_m and the
accepted path (dropping the extras). The step costs n + 1 + e rows, and that is
what the cost model is told (`CostModel.observe_verify`) and what the predicted
speedup charges. Extras that would not fit in the context are dropped, and so
are they on a backend without tree attention (a chain cannot carry them).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Iterator

import torch

from engine.backends.base import Backend
from engine.core.draft_length import CostModel, DraftLength, expected_tokens, expected_tokens_tree
from engine.drafters.base import EMPTY_DRAFT, Draft, Drafter
from engine.errors import ConfigError, ContextOverflowError
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from engine.core.sampling import SamplingConfig, make_generator, probabilities
from engine.core.text import IncrementalText, find_stop, held_back
from engine.core.tree import ancestor_mask, depths
from engine.core.verify import verify_greedy, verify_sampled
from engine.core.verify_tree import dedupe_siblings, verify_tree_greedy, verify_tree_sampled


def decode_steps(
    target: Backend,
    prompt: list[int],
    sampling: SamplingConfig,
    *,
    drafter: Drafter | None = None,
    draft_length: DraftLength | None = None,
    costs: CostModel | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[StepEvent]:
    """Generate after `prompt`, speculatively when a drafter is given, plainly otherwise."""
    if not prompt:
        raise ConfigError("The prompt is empty: give at least one token of input.")
    if len(prompt) >= target.n_ctx:
        raise ContextOverflowError(
            f"The prompt is {len(prompt)} tokens long but the context window holds {target.n_ctx}: "
            "shorten the prompt (or start a new chat), or load the model with a larger context."
        )
    if drafter is not None and drafter.uses_features and not target.supports_features:
        raise ConfigError(
            f"The {drafter.name} drafter reads the target's hidden states, which the {target.name} "
            "backend does not expose: load the target with the PyTorch backend (--backend torch)."
        )
    draft_length = draft_length or DraftLength(0 if drafter is None else "auto")
    costs = costs if costs is not None else CostModel()
    generator = make_generator(sampling.seed)
    eos = target.eos_ids
    trees = target.supports_tree  # False: tree drafts are verified as their best branch
    if drafter is not None:
        drafter.reset()
        if drafter.drafts_trees and trees:
            draft_length.use_tree_estimate(drafter.tree_expected_tokens)  # k = node budget

    start = time.perf_counter()
    target.prefill(prompt[:-1])
    run = _Run(prefill_s=time.perf_counter() - start, notes=run_notes(target, drafter))
    context = list(prompt)
    reply = _Reply(target.detokenize, sampling.stop)
    loop_start = time.perf_counter()

    for index in range(sampling.max_tokens):  # each step emits at least one token
        if cancel is not None and cancel.is_set():
            yield run.event(index, (), "", 0, 0, 0, 0.0, 0.0, 0.0, loop_start, costs, "cancelled")
            return
        room = target.n_ctx - len(context)  # drafts that still fit behind the pending token
        if room < 0:
            yield run.event(index, (), "", 0, 0, 0, 0.0, 0.0, 0.0, loop_start, costs, "context")
            return
        left = sampling.max_tokens - run.tokens
        k = 0 if drafter is None else min(draft_length.choose(costs), room, left - 1)

        # 1. Draft up to k tokens or tree nodes (and q, if the drafter has a distribution).
        t0 = time.perf_counter()
        draft = drafter.propose(context, k, sampling, generator) if k > 0 else EMPTY_DRAFT
        catch_up_s = draft.catch_up_s  # feeding the drafter's cache, not drafting (fit_draft drops it)
        draft = fit_draft(draft, k, trees, room)
        drafted = list(draft.tokens)
        extra = len(draft.extra_tokens)
        t1 = time.perf_counter()

        # 2. One target forward over the pending token and the drafts (a chain or a tree),
        #    and the draft's extra rows (lookahead's window) beside them when it has some.
        if extra:
            block = target.forward_masked(*masked_block(context[-1], draft), what="a lookahead step")
            logits = block[: len(drafted) + 1]  # (n+1, V): what forward_tree would have returned
            drafter.observe_extra(block[len(drafted) + 1 :])  # (e, V)
        elif draft.is_tree:
            logits = target.forward_tree([context[-1], *drafted], [-1, *(p + 1 for p in draft.parents)])  # (n+1, V)
        elif draft.exit_hidden is not None and drafted:
            # Early exit: the draft already ran the first layers; the target starts from there.
            rows = draft.exit_hidden[: len(drafted) + 1]
            logits = target.forward_from_exit([context[-1], *drafted], rows, draft.exit_layer)  # (n+1, V)
        else:
            logits = target.forward([context[-1], *drafted])  # (n+1, V)
        t2 = time.perf_counter()

        # 3. Verdict: keep the longest accepted prefix (or tree path), then one token from p
        #    (or the residual); cut the cache back to the pending token and what was kept.
        if draft.is_tree:
            if sampling.greedy:
                verdict = verify_tree_greedy(logits, drafted, draft.parents)
            else:
                verdict = verify_tree_sampled(probabilities(logits, sampling), drafted, draft.parents, generator)
            path, tested = list(verdict.path), verdict.tested_depths
            kept_rows = [0, *(node + 1 for node in path)]
            features = target.last_features()[kept_rows] if _wants_features(drafter) else None
            if extra:
                target.keep_rows(kept_rows)  # keep_nodes needs forward_tree; this is its general form
            else:
                target.keep_nodes(kept_rows)
        else:
            if sampling.greedy:
                verdict = verify_greedy(logits, drafted)
            else:
                q = draft.q[: len(drafted)] if draft.q is not None else None
                verdict = verify_sampled(probabilities(logits, sampling), q, drafted, generator)
            path = list(range(verdict.accepted))
            tested = len(path) + (len(path) < len(drafted))
            features = target.last_features()[: len(path) + 1] if _wants_features(drafter) else None
            if extra:  # the pending token and the accepted prefix, without the extra rows
                target.keep_rows(list(range(len(path) + 1)))
            else:
                target.rollback(len(context) + len(path))  # drop the rejected drafts' cache entries
        kept = len(path)
        if features is not None:
            drafter.observe_features(features)  # (kept + 1, hidden): the last row chose the new token
        if drafter is not None and drafted:
            drafter.observe(len(drafted), kept)
            draft_length.observe(tested, kept)
            costs.observe_draft(len(drafted), max(t1 - t0 - catch_up_s, 0.0))
        costs.observe_verify(len(drafted) + 1 + extra, t2 - t1)  # rows the forward really ran

        # 4. Commit token by token, so EOS, stop strings and max tokens cut inside the block.
        finish = end = None
        for i, token in enumerate([*(drafted[node] for node in path), verdict.token]):
            info = _token_info(token, i, path, verdict, draft)
            if token in eos:
                finish, end = "stop", info
                break
            context.append(token)
            if reply.add(info):
                finish = "stop_string"
            elif reply.count >= sampling.max_tokens:
                finish = "length"
            if finish:
                break
        infos, step_text = reply.release(final=finish is not None)
        t3 = time.perf_counter()
        tree_depth = max(depths(draft.parents)) if draft.is_tree else None
        run.add(reply.count, len(drafted), kept, tested, t1 - t0, t2 - t1, t3 - t2, tree_depth, extra)
        yield run.event(
            index, tuple(infos), step_text, k, len(drafted), kept,
            t1 - t0, t2 - t1, t3 - t2, loop_start, costs, finish, end,
        )  # fmt: skip
        if finish is not None:
            return


def run_notes(target: Backend, drafter: Drafter | None) -> tuple[str, ...]:
    """Sentences a UI should show about this target/drafter combination (RunStats.notes)."""
    if drafter is not None and drafter.drafts_trees and not target.supports_tree:
        note = (
            f"The {target.name} backend verifies chains only, so each {drafter.name} draft tree is cut "
            "to its most likely branch: fewer tokens are accepted per step than with the PyTorch "
            "backend, which verifies the whole tree."
        )
        return (note,)
    return ()


def fit_draft(draft: Draft, k: int, trees: bool, room: int | None = None) -> Draft:
    """The draft as it will be verified: at most k tokens (nodes, for a tree).

    Tree nodes are point masses (q dropped), siblings carry distinct tokens (a repeated
    sibling goes, with its subtree), and where the backend verifies chains only the
    tree becomes its best branch. Extra rows are not counted in k; they stay when the
    backend runs masked forwards (`trees`) and they fit behind the pending token with
    the nodes (`room`: free positions after it), and are dropped otherwise.
    """
    if not draft.extra_tokens:
        return _fit_nodes(draft, k, trees)
    nodes = _fit_nodes(replace(draft, extra_tokens=(), extra_offsets=(), extra_mask=None), k, trees)
    e = len(draft.extra_tokens)
    fits = room is None or (len(nodes) + e <= room and max(draft.extra_offsets, default=0) <= room)
    if not trees or not fits:
        return nodes
    return replace(nodes, extra_tokens=draft.extra_tokens, extra_offsets=draft.extra_offsets,
                   extra_mask=draft.extra_mask)  # fmt: skip


def masked_block(pending: int, draft: Draft) -> tuple[list[int], list[int], torch.Tensor]:
    """tokens, offsets and mask of one `forward_masked` call over the pending token, the
    draft's nodes (a chain when parents is None) and its extra rows, in that order.

    Offsets: the pending token 0, node i its depth, extra row j `extra_offsets[j]`. Mask
    (bool, n + 1 + e square): every row sees the pending token; node i sees its ancestors
    and itself; extra rows see each other as `extra_mask` says (a causal chain when it is
    None); nodes and extra rows never see each other.
    """
    n, e = len(draft.tokens), len(draft.extra_tokens)
    parents = draft.parents if draft.parents is not None else tuple(range(-1, n - 1))
    if len(parents) != n or len(draft.extra_offsets) != e:
        raise ValueError(f"a draft of {n} nodes and {e} extra rows needs as many parents and offsets")
    extra_mask = draft.extra_mask if draft.extra_mask is not None else torch.ones(e, e, dtype=torch.bool).tril()
    if tuple(extra_mask.shape) != (e, e):
        raise ValueError(f"extra_mask must be ({e}, {e}), got {tuple(extra_mask.shape)}")
    mask = torch.zeros(1 + n + e, 1 + n + e, dtype=torch.bool)
    mask[:, 0] = True
    if n:
        mask[1 : n + 1, 1 : n + 1] = ancestor_mask(parents)
    if e:
        mask[n + 1 :, n + 1 :] = extra_mask.to(dtype=torch.bool, device="cpu")
    offsets = [0, *depths(parents), *(int(o) for o in draft.extra_offsets)]
    return [pending, *draft.tokens, *draft.extra_tokens], offsets, mask


def _fit_nodes(draft: Draft, k: int, trees: bool) -> Draft:
    """fit_draft for a draft without extra rows."""
    if not draft.is_tree:  # a chain: keep q, if any
        if len(draft) <= k and draft.parents is None:
            return draft
        q_token = draft.q_token[:k] if draft.q_token is not None else None
        exit_hidden = draft.exit_hidden[: k + 1] if draft.exit_hidden is not None and draft.parents is None else None
        return Draft(draft.tokens[:k], draft.q[:k] if draft.q is not None else None, q_token,
                     exit_hidden=exit_hidden, exit_layer=draft.exit_layer)  # fmt: skip
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
        return Draft(tokens, parents=tuple(parents))
    branch = _branch(parents, best)
    return Draft([tokens[i] for i in branch], parents=tuple(range(-1, len(branch) - 1)))


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


def _wants_features(drafter: Drafter | None) -> bool:
    return drafter is not None and drafter.uses_features


def _token_info(token: int, i: int, path: list[int], verdict, draft: Draft) -> TokenInfo:
    """What the UI shows for the i-th token emitted this step (path: the accepted draft nodes)."""
    if i < len(path):
        source, p = Source.ACCEPTED, verdict.p_draft[i]
        q = draft.q_token[path[i]] if draft.q_token is not None else None
    else:
        source, p, q = verdict.source, verdict.p_token, None
    top_ids = verdict.top_ids[i] if verdict.top_ids else ()
    top_logits = verdict.top_logits[i] if verdict.top_logits else ()
    return TokenInfo(token, "", source, p, q, top_ids, top_logits)


class _Reply:
    """The reply's tokens and text; holds back what might be the start of a stop string.

    A token's text is the span of decoded text from its start to the next token's
    start. Tokens are released (to the UI) once their text cannot become part of a
    stop string; at a stop string the reply is cut where it begins.
    """

    def __init__(self, detokenize, stops: tuple[str, ...]) -> None:
        self.text = IncrementalText(detokenize)
        self.stops = stops
        self.pending: list[tuple[TokenInfo, int]] = []  # (token, offset of its text)
        self.count = 0  # tokens in the reply so far (released or pending)
        self.cut: int | None = None

    def add(self, info: TokenInfo) -> bool:
        """Append a token; True when it completes a stop string."""
        start = len(self.text.text)
        piece = self.text.push(info.id)
        self.pending.append((info, start))
        self.count += 1
        if self.stops and piece:
            at = find_stop(self.text.text, self.stops, start)
            if at != -1:
                self.cut = at
                return True
        return False

    def release(self, final: bool) -> tuple[tuple[TokenInfo, ...], str]:
        if final and self.cut is None:
            self.text.flush()
        full = self.text.text
        if self.cut is not None:
            safe = self.cut
        else:
            safe = len(full) if final else len(full) - held_back(full, self.stops)
        out: list[TokenInfo] = []
        while self.pending:
            info, start = self.pending[0]
            end = self.pending[1][1] if len(self.pending) > 1 else len(full)
            if final and self.cut is not None and start >= self.cut:
                self.count -= len(self.pending)  # tokens of the stop string itself
                self.pending.clear()
                break
            if not final and end > safe:
                break
            out.append(replace(info, text=full[start : min(end, safe)]))
            self.pending.pop(0)
        if final and self.cut is not None:
            self.text.text = full[: self.cut]
        return tuple(out), "".join(info.text for info in out)


class _Run:
    """Running totals of one generation, turned into a RunStats snapshot per step."""

    def __init__(self, prefill_s: float, notes: tuple[str, ...] = ()) -> None:
        self.stats = RunStats(prefill_s=prefill_s, notes=notes)
        self.tokens = 0
        # For the predicted speedup: chain steps by (drafts, extra rows), tree steps by
        # (nodes, depth, extra rows); extra rows (lookahead) add to a step's verify cost only.
        self.drafted_lengths: dict[tuple[int, int], int] = {}
        self.tree_shapes: dict[tuple[int, int, int], int] = {}

    def add(
        self, total_tokens: int, drafted: int, kept: int, tested: int,
        draft_s: float, verify_s: float, other_s: float, tree_depth: int | None = None, extra: int = 0,
    ):  # fmt: skip
        """One step: `drafted` tokens (tree nodes), `kept` accepted along the path, `tested`
        depths where the path met a draft (kept, plus one when the rule rejected there)."""
        s = self.stats
        self.tokens = total_tokens
        if tree_depth is None:
            shape = (drafted, extra)
            self.drafted_lengths[shape] = self.drafted_lengths.get(shape, 0) + 1
        else:
            shape = (drafted, tree_depth, extra)
            self.tree_shapes[shape] = self.tree_shapes.get(shape, 0) + 1
        self.stats = replace(
            s,
            steps=s.steps + 1,
            tokens=self.tokens,
            drafted=s.drafted + drafted,
            accepted=s.accepted + kept,
            tested=s.tested + tested,
            draft_s=s.draft_s + draft_s,
            verify_s=s.verify_s + verify_s,
            other_s=s.other_s + other_s,
            k=drafted,
            # Depth d (index d - 1) was tested when the accepted path reached depth d - 1 and the
            # draft had a node below it; for a chain depth d is draft position d (Medusa: head d).
            depth_tested=(depth_tested := _count_first(s.depth_tested, tested)),
            depth_accepted=_count_first(s.depth_accepted, kept, len(depth_tested)),
            tree_nodes=drafted,
        )

    def event(
        self, index, infos, text, k, drafted, kept, draft_s, verify_s, other_s, loop_start, costs, finish, end=None
    ):
        s = self.stats
        a = s.acceptance_rate
        # The formula applied to the drafts this run actually made, against the sum of their
        # costs in units of one plain forward: chains E(a, n); trees 1 + sum over depths of
        # the product of the measured per-depth acceptance (draft_length.expected_tokens_tree),
        # each step costing n * c_d + T(n+1+e) / T(1) for its n nodes and e extra rows.
        rates = s.depth_acceptance
        gain = sum(c * expected_tokens(a, n) for (n, _), c in self.drafted_lengths.items())
        gain += sum(c * expected_tokens_tree(rates, depth) for (_, depth, _), c in self.tree_shapes.items())
        shapes = [*self.drafted_lengths.items(), *(((n, e), c) for (n, _, e), c in self.tree_shapes.items())]
        cost = sum(c * (n * costs.draft_ratio() + costs.verify_ratio(n + 1 + e)) for (n, e), c in shapes)
        mean_drafted = s.drafted / s.steps if s.steps else 0.0
        wall_s = time.perf_counter() - loop_start
        self.stats = replace(
            s,
            wall_s=wall_s,
            time_to_first_token_s=s.time_to_first_token_s or (s.prefill_s + wall_s if infos else 0.0),
            draft_cost_ratio=costs.draft_ratio() if costs.verify_s else 0.0,
            verify_cost_ratio=costs.verify_ratio(round(mean_drafted) + 1) if costs.verify_s else 1.0,
            predicted_speedup=gain / cost if cost > 0 else 1.0,
        )
        return StepEvent(index, infos, text, k, drafted, kept, draft_s, verify_s, other_s, self.stats, finish, end)


def _count_first(counts: tuple[int, ...], n: int, length: int = 0) -> tuple[int, ...]:
    """counts + 1 at indices 0..n-1, grown with zeros to at least n (and `length`) entries."""
    grown = list(counts) + [0] * max(0, n - len(counts), length - len(counts))
    return tuple(c + 1 if i < n else c for i, c in enumerate(grown))
