"""One generation in a batch: its context, drafter, draft length, reply text and running totals.

The step of engine/core/batch.py asks every sequence for its feed (`plan`), runs all their
rows in one target forward, and hands each sequence its rows back (`finish`), which judges
them with the lossless rule, commits its own cache to the accepted length and makes the
step's `StepEvent`. Nothing here knows about the other sequences: a sequence decodes
exactly as it would alone, on its own slot (engine/backends/capabilities.py Slots), with
its own sampling settings, seed, stop strings, draft bounds and drafter. The cache
invariant and the four parts of a step are engine/core/decode.py's docstring.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

import torch

from engine.backends.base import Backend
from engine.backends.capabilities import HiddenFeatures, TreeForward, has
from engine.core.draft_length import CostModel, DraftLength
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from engine.core.feeds import Feed, feed_for
from engine.core.prediction import SpeedupPrediction
from engine.core.reply import ReplyText
from engine.core.sampling import SamplingConfig, make_generator
from engine.drafters.base import (
    EMPTY_DRAFT,
    Draft,
    Drafter,
    DraftsTrees,
    ReadsExtraRows,
    ReadsFeatures,
    RemembersReplies,
)
from engine.errors import ConfigError, ContextOverflowError


class Sequence:
    """One generation on one slot: made by `Batch.join`, stepped by `Batch.step` until it ends."""

    def __init__(
        self,
        slot: Backend,
        prompt: list[int],
        sampling: SamplingConfig,
        *,
        drafter: Drafter | None,
        draft_length: DraftLength | None,
        costs: CostModel,
        cancel: threading.Event | None,
        notes: tuple[str, ...],
        tag=None,
    ) -> None:
        """Checks what can be checked before any work (raises ConfigError, ContextOverflowError)."""
        if not prompt:
            raise ConfigError("The prompt is empty: give at least one token of input.")
        if len(prompt) >= slot.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {len(prompt)} tokens long but the context window holds {slot.n_ctx}: "
                "shorten the prompt (or start a new chat), or load the model with a larger context."
            )
        if has(drafter, ReadsFeatures) and not has(slot, HiddenFeatures):
            raise ConfigError(
                f"The {drafter.name} drafter reads the target's hidden states, which the {slot.name} "
                "backend does not expose: load the target with the PyTorch backend (--backend torch)."
            )
        self.slot = slot
        self.prompt = list(prompt)
        self.sampling = sampling
        self.drafter = drafter
        self.draft_length = draft_length or DraftLength(0 if drafter is None else "auto")
        self.costs = costs
        self.cancel = cancel
        self.tag = tag  # whatever the caller keeps with it (a server's request)
        self.run = _Run(0.0, notes, costs)
        self.index = 0  # steps emitted
        self.started = False
        self.ended = False
        self._wants_features = has(drafter, ReadsFeatures)
        self._wants_extra = has(drafter, ReadsExtraRows)
        self._feed: Feed | None = None
        self._k = 0
        self._draft_s = 0.0
        self._catch_up_s = 0.0

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    @property
    def room(self) -> int:
        """Drafts that still fit behind the pending token; below 0 when the context is full."""
        return self.slot.n_ctx - len(self.context)

    @property
    def k_limit(self) -> int:
        """The most this step may draft: the room left and the tokens the reply may still have."""
        return min(self.room, self.sampling.max_tokens - self.run.tokens - 1)

    def start(self) -> None:
        """Prefill the prompt (all but the pending token x_m) and set the drafter up for it."""
        slot, drafter = self.slot, self.drafter
        slot.prepare_threads()  # the cores free now, not at load (a draft model's follow in drafter.reset)
        self.generator = make_generator(self.sampling.seed)
        if drafter is not None:
            drafter.reset()
            if has(drafter, RemembersReplies):
                drafter.begin(list(self.prompt))
            if has(drafter, DraftsTrees) and has(slot, TreeForward):  # else trees go as their best branch
                self.draft_length.use_tree_estimate(drafter.tree_expected_tokens)  # k = node budget
        begin = time.perf_counter()
        slot.prefill(self.prompt[:-1])  # the cache holds all but the pending token x_m
        self.run = _Run(time.perf_counter() - begin, self.run.stats.notes, self.costs)
        self.context = list(self.prompt)
        self.reply = ReplyText(slot.detokenize, self.sampling.stop)  # engine/core/reply.py: the stop strings' holdback
        # A run without a drafter never rolls back inside it: a recurrent target need not save its state
        # before each forward (engine/backends/checkpoints.py), which would slow plain decoding and make
        # every speedup measured against it look larger than it is. The prefill above kept its own.
        slot.checkpoint_forwards = drafter is not None
        self.started = True

    def end_early(self, finish: str) -> StepEvent:
        """The event of a step that runs no forward ("cancelled", or "context": no room left)."""
        self.ended = True
        return self.run.event(self.index, _NOTHING, finish=finish)

    def plan(self, k: int, drafted: tuple[Draft, float] | None = None) -> Feed:
        """1. Draft up to k tokens or tree nodes d_1..d_n (and q, if the drafter has a distribution), cut to
        what this target verifies: one feed per kind (chain, tree, early exit, extra rows). `drafted`:
        the draft already made with the batch's other sequences (DraftsTogether), and this sequence's
        share of its seconds."""
        self._k = k
        begin = time.perf_counter()
        if drafted is not None:
            draft, shared_s = drafted
        else:
            draft = self.drafter.propose(self.context, k, self.sampling, self.generator) if k > 0 else EMPTY_DRAFT
            shared_s = 0.0
        self._feed = feed_for(draft, k, self.slot, self.room, self.draft_length.bounds)  # n_min, p_min cut here
        self._draft_s, self._catch_up_s = time.perf_counter() - begin + shared_s, draft.catch_up_s
        return self._feed

    def finish(self, logits: torch.Tensor, verify_s: float, batch: int = 1) -> StepEvent:
        """3. and 4. of the step, on the rows l_0..l_n the forward gave this sequence (verify_s: that
        forward's seconds, shared with the `batch` sequences it ran): the verdict, the commit, the
        events' tokens."""
        feed, costs, drafter, slot = self._feed, self.costs, self.drafter, self.slot
        if feed.extra and self._wants_extra:
            drafter.observe_extra(feed.extra_logits)  # (e, V)
        begin = time.perf_counter()
        # Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) (q a point mass without a distribution;
        # greedy: while d_i is p's argmax; a tree walks down the children it accepts); at the first
        # rejection draw y ~ norm(max(0, p_i - q_i)), after the last draft y ~ p_{n+1}. Then cut the
        # cache back to x_1..x_m and the accepted path; y is the next pending token.
        verdict, path, tested = feed.verify(logits, self.sampling, self.generator)
        features = feed.features(slot, path) if self._wants_features else None  # rows of this forward
        committed = time.perf_counter()
        drafted = feed.tokens
        feed.commit(slot, path, len(self.context))
        kept = len(path)
        if slot.replays_on_rollback and kept < len(drafted):
            # A rejection on a recurrent target: the commit restored the state saved before this
            # step's forward and replayed x_m and the kept drafts, kept + 1 tokens.
            costs.observe_rollback(kept + 1, time.perf_counter() - committed)
        if features is not None:
            drafter.observe_features(features)  # (kept + 1, hidden): the last row chose y
        if drafter is not None and drafted:
            drafter.observe(len(drafted), kept)
            self.draft_length.observe(tested, kept)
            # feeding the drafter's cache (catch_up_s) is not drafting: a prefill of n costs far less than n decodes
            costs.observe_draft(len(drafted), max(self._draft_s - self._catch_up_s, 0.0))

        # Emit token by token, so EOS, stop strings and max tokens cut inside the block.
        finish = end = None
        reply, eos = self.reply, slot.eos_ids
        for i, token in enumerate([*(drafted[node] for node in path), verdict.token]):
            info = _token_info(token, i, path, verdict, feed.q_token)
            if token in eos:
                finish, end = "stop", info
                break
            self.context.append(token)
            if reply.add(info):
                finish = "stop_string"
            elif reply.count >= self.sampling.max_tokens:
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
            k=self._k,
            drafted=len(drafted),
            kept=counted,
            tested=counted_tested,
            draft_s=self._draft_s,
            verify_s=verify_s,
            other_s=time.perf_counter() - begin,
            tree_depth=feed.tree_depth,
            extra=feed.extra,
        )
        self.run.add(counted + 1, step)
        event = replace(self.run.event(self.index, step, infos, step_text, finish, end, stop_infos), batch=batch)
        self.index += 1
        self._feed = None
        self.ended = finish is not None or self.index >= self.sampling.max_tokens
        return event

    def leave(self) -> None:
        """The sequence is done with its slot: a recurrent target saves its states again."""
        self.slot.checkpoint_forwards = True


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
