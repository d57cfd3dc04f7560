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
attending to its ancestors only (`TreeForward.forward_tree`, parents shifted by one
for x_m in front); row i + 1 is p after node i. The verdict is a root-to-node
path (engine/core/verify_tree.py) and `keep_nodes` keeps x_m and that path. A backend
without tree attention (llama.cpp) gets the draft's best branch as a chain, and
the run says so in `RunStats.notes`. Drafters that read the target's hidden
states (ReadsFeatures) get the rows of what the step kept (x_m, then the accepted drafts).

Extra rows (lookahead decoding's Jacobi window): a draft may add e rows that ride
along unverified. The feed becomes [x_m, node_1..node_n, extra_1..extra_e] in one
`TreeForward.forward_masked` call: x_m at offset 0, node i at its depth, extra j at
the offset the drafter gave; the mask is the tree's (each node sees x_m and its
ancestors) plus the drafter's block among the extra rows, which also see x_m
and the cache, while nodes and extras never see each other. So rows 0..n are
exactly what `forward_tree` would have returned and the verdict is unchanged;
rows n+1.. go to `observe_extra` (a ReadsExtraRows drafter), and `keep_rows` keeps x_m and the
accepted path (dropping the extras). The step costs n + 1 + e rows, and that is
what the cost model is told (`CostModel.observe_verify`) and what the predicted
speedup charges. Extras that would not fit in the context are dropped, and so
are they on a backend without tree attention (a chain cannot carry them).

Early exit (self-speculation): the drafter ran the target's first L layers over
x_m, d_1..d_{n-1}; the verifying forward starts from the residual stream they
left (`LayerExit.forward_from_exit`), so only d_n runs the first layers, and the
rows are the ones a full forward gives.

Each of these is one feed object (engine/core/feeds.py) that knows its forward,
its rule and its commit; the step below is the same for all of them. A generation's
draft bounds (n_min, n_max, p_min: engine/core/draft_bounds.py) come with its
DraftLength and are applied where k is chosen and where the draft is fitted to k.

This module is the step only. The reply's text, held back where it might begin a
stop string, is engine/core/reply.py; the run's predicted speedup is
engine/core/prediction.py. The drafter's opt-in calls (hidden states, extra rows,
the prompt, the tree estimate: engine/drafters/base.py) are looked up once per
generation, not per step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from engine.backends.base import Backend
from engine.backends.capabilities import HiddenFeatures, TreeForward, has
from engine.core.draft_length import CostModel, DraftLength
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from engine.core.feeds import feed_for
from engine.core.prediction import SpeedupPrediction
from engine.core.reply import ReplyText
from engine.core.sampling import SamplingConfig, make_generator
from engine.drafters.base import (
    EMPTY_DRAFT,
    Drafter,
    DraftsTrees,
    ReadsExtraRows,
    ReadsFeatures,
    RemembersReplies,
)
from engine.errors import ConfigError, ContextOverflowError


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
    wants_features = has(drafter, ReadsFeatures)
    wants_extra = has(drafter, ReadsExtraRows)
    if wants_features and not has(target, HiddenFeatures):
        raise ConfigError(
            f"The {drafter.name} drafter reads the target's hidden states, which the {target.name} "
            "backend does not expose: load the target with the PyTorch backend (--backend torch)."
        )
    draft_length = draft_length or DraftLength(0 if drafter is None else "auto")
    costs = costs if costs is not None else CostModel()
    costs.replays = target.replays_on_rollback  # a rejection costs a restore and a replay (costs.rollback_time)
    if cancel is not None and cancel.is_set():  # before the prefill, the step's first costly part
        yield _Run(0.0, run_notes(target, drafter), costs).event(0, _NOTHING, finish="cancelled")
        return
    target.prepare_threads()  # the cores free now, not at load (a draft model's follow in drafter.reset)
    generator = make_generator(sampling.seed)
    eos = target.eos_ids
    if drafter is not None:
        drafter.reset()
        if has(drafter, RemembersReplies):
            drafter.begin(list(prompt))
        if has(drafter, DraftsTrees) and has(target, TreeForward):  # else trees go as their best branch
            draft_length.use_tree_estimate(drafter.tree_expected_tokens)  # k = node budget

    start = time.perf_counter()
    target.prefill(prompt[:-1])  # the cache holds all but the pending token x_m
    prefill_s = time.perf_counter() - start
    context = list(prompt)
    reply = ReplyText(target.detokenize, sampling.stop)  # engine/core/reply.py: the stop strings' holdback
    run = _Run(prefill_s, run_notes(target, drafter), costs)

    # A run without a drafter never rolls back inside it: a recurrent target need not save its state
    # before each forward (engine/backends/checkpoints.py), which would slow plain decoding and make
    # every speedup measured against it look larger than it is. The prefill above kept its own.
    target.checkpoint_forwards = drafter is not None
    try:
        for index in range(sampling.max_tokens):  # each step emits at least one token
            if cancel is not None and cancel.is_set():
                yield run.event(index, _NOTHING, finish="cancelled")
                return
            room = target.n_ctx - len(context)  # drafts that still fit behind the pending token
            if room < 0:
                yield run.event(index, _NOTHING, finish="context")
                return
            k = 0 if drafter is None else min(draft_length.choose(costs), room, sampling.max_tokens - run.tokens - 1)

            # 1. Draft up to k tokens or tree nodes d_1..d_n (and q, if the drafter has a distribution),
            #    cut to what this target verifies: one feed per kind (chain, tree, early exit, extra rows).
            t0 = time.perf_counter()
            draft = drafter.propose(context, k, sampling, generator) if k > 0 else EMPTY_DRAFT
            feed = feed_for(draft, k, target, room, draft_length.bounds)  # n_min and p_min cut chains here
            drafted = feed.tokens
            t1 = time.perf_counter()

            # 2. One target forward over [x_m, d_1, ..., d_n]: rows l_0..l_n, l_{i-1} = p's row for d_i and
            #    l_n the bonus row; lookahead's extra rows ride along in the same forward, unverified.
            logits = feed.forward(target, context[-1])  # (n+1, V)
            if feed.extra and wants_extra:
                drafter.observe_extra(feed.extra_logits)  # (e, V)
            t2 = time.perf_counter()

            # 3. Verdict: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) (q a point mass without a
            #    distribution; greedy: while d_i is p's argmax; a tree walks down the children it accepts);
            #    at the first rejection draw y ~ norm(max(0, p_i - q_i)), after the last draft y ~ p_{n+1}.
            #    Then cut the cache back to x_1..x_m and the accepted path; y is the next pending token.
            verdict, path, tested = feed.verify(logits, sampling, generator)
            features = feed.features(target, path) if wants_features else None  # rows of this forward
            t3 = time.perf_counter()
            feed.commit(target, path, len(context))
            kept = len(path)
            if target.replays_on_rollback and kept < len(drafted):
                # A rejection on a recurrent target: the commit restored the state saved before this
                # step's forward and replayed x_m and the kept drafts, kept + 1 tokens.
                costs.observe_rollback(kept + 1, time.perf_counter() - t3)
            if features is not None:
                drafter.observe_features(features)  # (kept + 1, hidden): the last row chose y
            if drafter is not None and drafted:
                drafter.observe(len(drafted), kept)
                draft_length.observe(tested, kept)
                # feeding the drafter's cache (catch_up_s) is not drafting: a prefill of n costs far less than n decodes
                costs.observe_draft(len(drafted), max(t1 - t0 - draft.catch_up_s, 0.0))
            costs.observe_verify(feed.rows, t2 - t1)  # rows the forward really ran: n + 1 + extra rows

            # 4. Emit token by token, so EOS, stop strings and max tokens cut inside the block.
            finish = end = None
            for i, token in enumerate([*(drafted[node] for node in path), verdict.token]):
                info = _token_info(token, i, path, verdict, feed.q_token)
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
            infos, step_text, stop_infos = reply.release(final=finish is not None)
            # What the step counts (RunStats): its tokens up to and including the one that ended the
            # reply, token i. An end at a draft (i < kept) makes that draft the step's own token, as the
            # target's would have been, and the drafts accepted after it go unused: the step counts i
            # drafts accepted and tested, so tokens = steps + accepted holds for every step.
            counted, counted_tested = (kept, tested) if i >= kept else (i, i)
            step = _Step(
                k=k,
                drafted=len(drafted),
                kept=counted,
                tested=counted_tested,
                draft_s=t1 - t0,
                verify_s=t2 - t1,
                other_s=time.perf_counter() - t2,
                tree_depth=feed.tree_depth,
                extra=feed.extra,
            )
            run.add(counted + 1, step)
            yield run.event(index, step, infos, step_text, finish, end, stop_infos)
            if finish is not None:
                return
    finally:
        target.checkpoint_forwards = True


def run_notes(target: Backend, drafter: Drafter | None) -> tuple[str, ...]:
    """Sentences a UI should show about this target/drafter combination (RunStats.notes): first what
    loading the models found (a damaged GGUF: engine/models/gguf_check.py)."""
    draft_model = getattr(drafter, "backend", None)  # the model drafter's draft model
    notes = [*target.load_notes, *(draft_model.load_notes if isinstance(draft_model, Backend) else ())]
    if has(drafter, DraftsTrees) and not has(target, TreeForward):
        notes.append(
            f"The {target.name} backend verifies chains only, so each {drafter.name} draft tree is cut "
            "to its most likely branch: fewer tokens are accepted per step than with the PyTorch "
            "backend, which verifies the whole tree."
        )
    return tuple(notes)


def _token_info(token: int, i: int, path: list[int], verdict, q_token: tuple[float, ...] | None) -> TokenInfo:
    """What the UI shows for the i-th token emitted this step (path: the accepted draft nodes)."""
    if i < len(path):
        source, p = Source.ACCEPTED, verdict.p_draft[i]
        q = q_token[path[i]] if q_token is not None else None
    else:
        source, p, q = verdict.source, verdict.p_token, None
    top_ids = verdict.top_ids[i] if verdict.top_ids else ()
    top_logits = verdict.top_logits[i] if verdict.top_logits else ()
    return TokenInfo(token, "", source, p, q, top_ids, top_logits)


@dataclass(frozen=True)
class _Step:
    """One step's counts and timings, for the run's totals and its StepEvent."""

    k: int = 0  # draft length asked for
    drafted: int = 0  # draft tokens (tree nodes) the target verified
    kept: int = 0  # accepted along the path
    tested: int = 0  # depths where the path met a draft: kept, plus one when the rule rejected there
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    tree_depth: int | None = None  # the deepest node of a tree draft; None for a chain
    extra: int = 0  # rows run beside the draft, unverified (lookahead's window)


_NOTHING = _Step()  # a step that ran no forward (cancelled, or the context is full)


class _Run:
    """Running totals of one generation, turned into a RunStats snapshot per step."""

    def __init__(self, prefill_s: float, notes: tuple[str, ...], costs: CostModel) -> None:
        self.stats = RunStats(prefill_s=prefill_s, notes=notes)
        self.costs = costs
        self.tokens = 0
        self.prediction = SpeedupPrediction()  # engine/core/prediction.py
        self.loop_start = time.perf_counter()

    def add(self, tokens: int, step: _Step) -> None:
        """Count a step that gave `tokens` tokens: its accepted drafts plus its own one."""
        s = self.stats
        self.tokens += tokens
        self.prediction.add(step.drafted, step.tree_depth, step.extra)
        self.stats = replace(
            s,
            steps=s.steps + 1,
            tokens=self.tokens,
            drafted=s.drafted + step.drafted,
            accepted=s.accepted + step.kept,
            tested=s.tested + step.tested,
            draft_s=s.draft_s + step.draft_s,
            verify_s=s.verify_s + step.verify_s,
            other_s=s.other_s + step.other_s,
            k=step.drafted,
            # Depth d (index d - 1) was tested when the accepted path reached depth d - 1 and the
            # draft had a node below it; for a chain depth d is draft position d (Medusa: head d).
            depth_tested=(depth_tested := _count_first(s.depth_tested, step.tested)),
            depth_accepted=_count_first(s.depth_accepted, step.kept, len(depth_tested)),
            tree_nodes=step.drafted,
        )

    def event(
        self,
        index: int,
        step: _Step,
        infos: tuple[TokenInfo, ...] = (),
        text: str = "",
        finish: str | None = None,
        end: TokenInfo | None = None,
        stop_tokens: tuple[TokenInfo, ...] = (),
    ) -> StepEvent:
        s, costs = self.stats, self.costs
        mean_drafted = s.drafted / s.steps if s.steps else 0.0
        wall_s = time.perf_counter() - self.loop_start
        self.stats = replace(
            s,
            wall_s=wall_s,
            time_to_first_token_s=s.time_to_first_token_s or (s.prefill_s + wall_s if infos else 0.0),
            draft_cost_ratio=costs.draft_ratio() if costs.verify_s else 0.0,
            verify_cost_ratio=costs.verify_ratio(round(mean_drafted) + 1) if costs.verify_s else 1.0,
            predicted_speedup=self.prediction.speedup(s, costs),
        )
        return StepEvent(
            index=index,
            tokens=infos,
            text=text,
            k=step.k,
            drafted=step.drafted,
            accepted=step.kept,
            draft_s=step.draft_s,
            verify_s=step.verify_s,
            other_s=step.other_s,
            stats=self.stats,
            finish_reason=finish,
            end_token=end,
            stop_tokens=stop_tokens,
        )


def _count_first(counts: tuple[int, ...], n: int, length: int = 0) -> tuple[int, ...]:
    """counts + 1 at indices 0..n-1, grown with zeros to at least n (and `length`) entries."""
    grown = list(counts) + [0] * max(0, n - len(counts), length - len(counts))
    return tuple(c + 1 if i < n else c for i, c in enumerate(grown))
