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
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Iterator

from .backends.base import Backend
from .draft_length import CostModel, DraftLength, expected_tokens
from .drafters.base import EMPTY_DRAFT, Drafter
from .errors import ConfigError, ContextOverflowError
from .events import RunStats, Source, StepEvent, TokenInfo
from .sampling import SamplingConfig, make_generator, probabilities
from .text import IncrementalText, find_stop, held_back
from .verify import verify_greedy, verify_sampled


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
    draft_length = draft_length or DraftLength(0 if drafter is None else "auto")
    costs = costs if costs is not None else CostModel()
    generator = make_generator(sampling.seed)
    eos = target.eos_ids
    if drafter is not None:
        drafter.reset()

    start = time.perf_counter()
    target.prefill(prompt[:-1])
    run = _Run(prefill_s=time.perf_counter() - start)
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

        # 1. Draft up to k tokens (and q, if the drafter has a distribution).
        t0 = time.perf_counter()
        draft = drafter.propose(context, k, sampling, generator) if k > 0 else EMPTY_DRAFT
        drafted = list(draft.tokens[:k])
        t1 = time.perf_counter()

        # 2. One target forward over the pending token and the drafts.
        logits = target.forward([context[-1], *drafted])  # (n+1, V)
        t2 = time.perf_counter()

        # 3. Verdict: keep the longest accepted prefix, then one token from p (or the residual).
        if sampling.greedy:
            verdict = verify_greedy(logits, drafted)
        else:
            q = draft.q[: len(drafted)] if draft.q is not None else None
            verdict = verify_sampled(probabilities(logits, sampling), q, drafted, generator)
        kept = verdict.accepted
        target.rollback(len(context) + kept)  # drop the rejected drafts' cache entries
        if drafter is not None and drafted:
            drafter.observe(len(drafted), kept)
            draft_length.observe(kept + (kept < len(drafted)), kept)
            costs.observe_draft(len(drafted), t1 - t0)
        costs.observe_verify(len(drafted) + 1, t2 - t1)

        # 4. Commit token by token, so EOS, stop strings and max tokens cut inside the block.
        finish = end = None
        for i, token in enumerate([*drafted[:kept], verdict.token]):
            info = _token_info(token, i, kept, verdict, draft)
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
        run.add(reply.count, len(drafted), kept, t1 - t0, t2 - t1, t3 - t2)
        yield run.event(
            index, tuple(infos), step_text, k, len(drafted), kept,
            t1 - t0, t2 - t1, t3 - t2, loop_start, costs, finish, end,
        )  # fmt: skip
        if finish is not None:
            return


def _token_info(token: int, i: int, kept: int, verdict, draft) -> TokenInfo:
    if i < kept:
        source, p = Source.ACCEPTED, verdict.p_draft[i]
        q = draft.q_token[i] if draft.q_token is not None else None
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

    def __init__(self, prefill_s: float) -> None:
        self.stats = RunStats(prefill_s=prefill_s)
        self.tokens = 0
        self.drafted_lengths: dict[int, int] = {}  # n drafted -> steps, for the predicted speedup

    def add(self, total_tokens: int, drafted: int, kept: int, draft_s: float, verify_s: float, other_s: float):
        s = self.stats
        self.tokens = total_tokens
        self.drafted_lengths[drafted] = self.drafted_lengths.get(drafted, 0) + 1
        self.stats = replace(
            s,
            steps=s.steps + 1,
            tokens=self.tokens,
            drafted=s.drafted + drafted,
            accepted=s.accepted + kept,
            tested=s.tested + kept + (kept < drafted),
            draft_s=s.draft_s + draft_s,
            verify_s=s.verify_s + verify_s,
            other_s=s.other_s + other_s,
            k=drafted,
        )

    def event(
        self, index, infos, text, k, drafted, kept, draft_s, verify_s, other_s, loop_start, costs, finish, end=None
    ):
        s = self.stats
        a = s.acceptance_rate
        # The formula applied to the drafts this run actually made: sum E(a, n) over steps
        # against sum of their costs in units of one plain forward.
        gain = sum(c * expected_tokens(a, n) for n, c in self.drafted_lengths.items())
        cost = sum(c * (n * costs.draft_ratio() + costs.verify_ratio(n + 1)) for n, c in self.drafted_lengths.items())
        mean_drafted = s.drafted / s.steps if s.steps else 0.0
        self.stats = replace(
            s,
            wall_s=time.perf_counter() - loop_start,
            draft_cost_ratio=costs.draft_ratio() if costs.verify_s else 0.0,
            verify_cost_ratio=costs.verify_ratio(round(mean_drafted) + 1) if costs.verify_s else 1.0,
            predicted_speedup=gain / cost if cost > 0 else 1.0,
        )
        return StepEvent(index, infos, text, k, drafted, kept, draft_s, verify_s, other_s, self.stats, finish, end)

