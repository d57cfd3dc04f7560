"""Chained drafters: several drafters, and each step the one expected to gain most drafts.

llama.cpp's server tries its speculative types in order; TensorRT-LLM asks its
suffix automaton before its neural drafter. Here a chain ("suffix+model") holds
its members in order and, each step, lets the member draft whose draft is
expected to pay best, by the article's formula with each member's own numbers:

    S_i(n) = E_i(n) * T(1) / (D_i + n * d_i + T(n + 1))

E_i(n) is member i's expected tokens per step for a draft of n tokens, from its
own acceptance per draft position (a `DraftLength` per member, fed only by the
steps that member drafted), or its own tree estimate for a tree drafter; D_i and
d_i are its own drafting costs, timed here (catching a draft model's cache up
excluded, as the decode loop does); T(n) is the target's verify-cost curve, the
engine's (`ReadsCosts.costs`), shared by all.

Members that cost nothing to ask (`FreeToAsk`: n-gram lookup, suffix decoding)
are asked every step, in order, and their draft is scored at its length (cut to
the length that scores best); a draft left unused changes nothing in them, and
is checked against the tokens committed after it, so their acceptance is
measured every step, not only on the steps they drafted. The others are scored
without drafting, at their best n: the one chosen drafts then. A draft model that
sat out steps catches its cache up in one prefill, as after plain steps; a member
that reads the target's hidden states gets them after every step, whoever
drafted. A member not measured yet is scored as if its drafts landed (a = 0.9,
as automatic k's first probe), so each gets tried.

Whether to draft at all is the decode loop's k (automatic or fixed, for the
chain as a whole): asked for k > 0, the chain drafts with its best member, at
most k tokens (a chain with a tree drafter in it takes k as a node budget, and
its chain members draft their own best length within it); only a chain of free
members that all found nothing makes the step plain. The verdict is the loop's,
whoever drafted: a chain is as lossless as its members.

The chain declares the opt-in protocols (engine/drafters/base.py) that some member has,
and forwards each call to the members that have it: a chain without a tree drafter
drafts no trees, one without a hidden-state reader is handed no hidden states.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.core.draft_length import K_LIMIT, CostModel, DraftLength, expected_tokens
from engine.drafters.base import (
    EMPTY_DRAFT,
    ChainDraft,
    Draft,
    Drafter,
    DraftsTrees,
    FreeToAsk,
    MeasuresCost,
    ReadsCosts,
    ReadsExtraRows,
    ReadsFeatures,
    RemembersReplies,
    TreeDraft,
    has,
    share_costs,
)
from engine.drafters.chain_spec import CHAIN_MARK, ChainStats

PROBE_ACCEPTANCE = 0.9  # a member not yet measured is scored as if drafts landed (as automatic k probes)
CALIBRATION_PRIOR = 2.0  # tokens' worth of trust in a drafter's own estimate (Draft.expected) before evidence
DECAY = 0.85  # as DraftLength's: the last few dozen drafts count
CATCH_UP_FREE = 2  # tokens a draft model feeds with its draft anyway (model.py STEP_LEFTOVER)
PREFILL_SHARE = 0.4  # a prefill's cost per token over a decode's, until measured (llama.cpp here: 2.5x cheaper)
FORWARDED = (ReadsFeatures, DraftsTrees, ReadsExtraRows, MeasuresCost, RemembersReplies)  # declared if a member has it


@dataclass
class MemberCosts(CostModel):
    """One member's drafting costs, timed on its own steps, over the engine's verify-cost curve."""

    shared: CostModel | None = None

    def verify_time(self, n: int) -> float:
        return self.shared.verify_time(n) if self.shared is not None else float(n)


class _Member:
    def __init__(self, name: str, drafter: Drafter) -> None:
        self.name, self.drafter = name, drafter
        self.trees, self.free = has(drafter, DraftsTrees), has(drafter, FreeToAsk)
        self.costs = MemberCosts()
        self.catch_up_per_token: float | None = None  # seconds per token of feeding it what it missed
        self.steps = self.accepted = 0
        self.forget_run()

    def forget_run(self) -> None:
        """A new generation: what this member's drafts were worth starts again from the prior."""
        self.length = DraftLength("auto", k_max=K_LIMIT)  # its acceptance per draft position
        self.proven = False  # a draft of this member was verified (or, for a free one, checked) this run
        # A free member's unused draft: (where it starts, its tokens not yet checked, its own estimate,
        # how many of its tokens matched so far)
        self.shadow: tuple[int, list[int], float | None, int] | None = None
        # Accepted tokens over what the drafter's own estimates (Draft.expected) said, decayed.
        self.matched = self.promised = CALIBRATION_PRIOR
        self.seen = self.proposed_at = 0  # committed tokens it has been fed (a draft model's cache)

    def expected(self, n: int, depth: int | None = None, totals: list[float] | None = None) -> float:
        """Expected tokens per step of an n-token draft of this member, or of an n-node tree (its
        own estimate, else the chain formula at the depth of its verified branch; `totals`: the
        chain formula's values, when the caller has them already)."""
        tree = self.drafter.tree_expected_tokens(n) if self.trees else None
        if tree is not None:
            return tree
        n = depth or n
        if not self.proven:  # nothing measured yet: a draft that lands would pay (DraftLength's probe)
            return expected_tokens(PROBE_ACCEPTANCE, n)
        return (totals or self.length.chain_expected_tokens())[min(n, K_LIMIT)]

    def speedup(
        self, n: int, depth: int | None = None, catch_up_s: float = 0.0, totals: list[float] | None = None
    ) -> float:
        """S of an n-token draft, or of an n-node tree whose verified branch is `depth` deep; with
        `catch_up_s`, what feeding the member the tokens it has not seen costs first."""
        if n <= 0:
            return 1.0
        c = self.costs
        cost = (c.draft_time(n) + catch_up_s + c.verify_time(n + 1)) / c.verify_time(1)
        return self.expected(n, depth, totals) / cost

    def catch_up_s(self, context: list[int]) -> float:
        """What this (not free) member would spend first on the committed tokens it has not seen: a
        draft model that sat out steps other members drafted feeds them in one prefill. Charged to its
        draft now, it is left for later while a free draft does about as well, and maybe never paid."""
        missing = len(context) - self.seen - CATCH_UP_FREE
        if missing <= 0:
            return 0.0
        per_token = self.catch_up_per_token or PREFILL_SHARE * self.costs.draft_s_per_token
        return missing * per_token

    def draft_speedup(self, draft: Draft) -> float:
        """S of this draft: from the drafter's own estimate where it gives one (calibrated by what its
        drafts were worth: a long match with every vote behind it is not a one-token guess), else
        from this member's acceptance per position."""
        if draft.expected is None:
            return self.speedup(len(draft), len(_branch(draft)) if _branches(draft) else None)
        return self.costs.speedup_for(1.0 + draft.expected * self.matched / self.promised, len(draft))

    def best(self, k: int, catch_up_s: float = 0.0) -> tuple[int, float]:
        """(n, S(n)) of the n <= k this member is expected to gain most with."""
        best_n, best = 0, 1.0
        totals = self.length.chain_expected_tokens()  # once, not once per n
        for n in range(1, min(k, K_LIMIT) + 1):
            s = self.speedup(n, catch_up_s=catch_up_s, totals=totals)
            if s > best * 1.02:  # a clear gain before adding tokens, as automatic k asks
                best_n, best = n, s
        return best_n, best

    def learn(self, tested: int, accepted: int, expected: float | None = None, matched: int | None = None) -> None:
        """A draft's verdict: `tested` positions, `accepted` of them; its own estimate `expected`
        against the tokens of it that matched in all (`matched`, = accepted unless said)."""
        self.proven = True
        self.length.observe(tested, accepted)
        if expected is not None:
            self.matched = self.matched * DECAY + (accepted if matched is None else matched)
            self.promised = self.promised * DECAY + expected

    def check_shadow(self, context: list[int]) -> None:
        """Score the free member's last unused draft against what was committed since: the
        committed token at a position is distributed as p, so it equals a point-mass draft's token
        with the probability the rule would have accepted it (greedy: exactly when accepted)."""
        if self.shadow is None:
            return
        start, tokens, expected, before = self.shadow
        committed = context[start:]
        matched = 0
        while matched < min(len(tokens), len(committed)) and tokens[matched] == committed[matched]:
            matched += 1
        if matched < len(committed) or matched == len(tokens):  # the verdict on it is known
            self.learn(min(matched + 1, len(tokens)), matched, expected, before + matched)
            self.shadow = None
        elif matched:  # so far so good, and the rest not committed yet: those positions count now
            self.length.observe(matched, matched)
            self.proven = True
            self.shadow = (start + matched, tokens[matched:], expected, before + matched)


class ChainDrafter(Drafter):
    def __init__(self, members: list[tuple[str, Drafter]]) -> None:
        self.members = [_Member(name, drafter) for name, drafter in members]
        self.name = CHAIN_MARK.join(m.name for m in self.members)
        self.capabilities = frozenset(
            {ReadsCosts, *(p for p in FORWARDED if any(has(m.drafter, p) for m in self.members))}
        )
        self._last: _Member | None = None  # the member that drafted the last proposal
        self._last_depth = 0  # the depth of that draft's verified branch (what the verdict can test)
        self._last_expected: float | None = None  # that draft's own estimate of its accepted tokens
        self._costs: CostModel | None = None

    # The engine hands the chain its one cost model (ReadsCosts): the members that read one get it too
    # (lookahead and early exit size themselves from it), and each member's costs read its curve.
    @property
    def costs(self) -> CostModel | None:
        return self._costs

    @costs.setter
    def costs(self, costs: CostModel | None) -> None:
        self._costs = costs
        for m in self.members:
            share_costs(m.drafter, costs)
            m.costs.shared = costs

    def propose(self, context, k, sampling, generator) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        best: tuple[float, _Member, Draft | None, int] | None = None  # (S, member, its draft or None, n)
        found: dict[int, Draft] = {}
        for i, m in enumerate(self.members):
            if m.free:
                m.check_shadow(context)
                draft, seconds = self._timed(m, context, k, sampling, generator)
                if not len(draft):
                    continue
                m.costs.observe_draft(len(draft), seconds)
                found[i] = draft = _cut(draft, m)
                n, s = len(draft), m.draft_speedup(draft)
            else:  # scored at its best length (the loop's k when none pays: the loop chose to draft)
                catch_up = m.catch_up_s(context)
                n, s = m.best(k, catch_up)
                if n == 0:
                    n, s = k, m.speedup(k, catch_up_s=catch_up)
                draft = None
            if best is None or s > best[0]:
                best = (s, m, draft, n)
        chosen = best[1] if best is not None else None
        for i, draft in found.items():  # unused free drafts are checked against what comes
            m = self.members[i]
            m.shadow = None if m is chosen else (len(context), _branch(draft), draft.expected, 0)
        if best is None:
            self._last = None
            return EMPTY_DRAFT
        _, m, draft, n = best
        if draft is None:
            missing = len(context) - m.seen
            draft, seconds = self._timed(m, context, n, sampling, generator)
            m.costs.observe_draft(len(draft), seconds)
            if draft.catch_up_s > 0 and missing > CATCH_UP_FREE:
                per_token = draft.catch_up_s / (missing - 1)  # all but the last, which starts the draft
                m.catch_up_per_token = (
                    per_token
                    if m.catch_up_per_token is None
                    else (DECAY * m.catch_up_per_token + (1 - DECAY) * per_token)
                )
        m.proposed_at = len(context)
        self._last = m if len(draft) else None
        self._last_depth = len(_branch(draft))
        self._last_expected = draft.expected
        return draft

    @staticmethod
    def _timed(m: _Member, context, k, sampling, generator) -> tuple[Draft, float]:
        start = time.perf_counter()
        draft = m.drafter.propose(context, k, sampling, generator)
        return draft, max(time.perf_counter() - start - draft.catch_up_s, 0.0)

    def observe(self, drafted: int, accepted: int) -> None:
        m = self._last
        if m is None:
            return
        m.drafter.observe(drafted, accepted)
        m.seen = m.proposed_at + accepted  # what its cache holds of the text now (the model drafter's)
        m.steps += 1
        m.accepted += accepted
        # The verdict tests depth d only when depths 1..d-1 were accepted (a rejection ends it).
        depth = min(drafted, self._last_depth or drafted)
        m.learn(min(accepted + 1, depth), accepted, self._last_expected)

    def observe_features(self, features) -> None:
        for m in self.members:
            if has(m.drafter, ReadsFeatures):
                m.drafter.observe_features(features)

    def observe_extra(self, logits) -> None:
        if self._last is not None and has(self._last.drafter, ReadsExtraRows):
            self._last.drafter.observe_extra(logits)

    def tree_expected_tokens(self, nodes: int) -> float | None:
        """The best member's expected tokens at this budget (automatic k sizes the chain by it)."""
        return max(m.expected(nodes) for m in self.members)

    def measure_token_cost(self) -> float | None:
        """Each member's load-time cost per token seeds its own; the chain's is its dearest member's."""
        costs = []
        for m in self.members:
            cost = m.drafter.measure_token_cost() if has(m.drafter, MeasuresCost) else None
            if cost:
                m.costs.draft_s_per_token = cost
                costs.append(cost)
        return max(costs) if costs else None

    def reset(self) -> None:
        for m in self.members:
            m.drafter.reset()
            m.forget_run()
        self._last = None

    def begin(self, prompt: list[int]) -> None:
        for m in self.members:
            if has(m.drafter, RemembersReplies):
                m.drafter.begin(prompt)

    def forget(self) -> None:
        for m in self.members:
            if has(m.drafter, RemembersReplies):
                m.drafter.forget()

    def stats(self) -> ChainStats:
        drafted_by = 0 if self._last is None else self.members.index(self._last) + 1
        return ChainStats(
            drafted_by=drafted_by,
            members=tuple(m.name for m in self.members),
            steps=tuple(m.steps for m in self.members),
            accepted=tuple(m.accepted for m in self.members),
        )

    def close(self) -> None:
        for m in self.members:
            m.drafter.close()


def _branches(draft: Draft) -> bool:
    return isinstance(draft, TreeDraft) and draft.branches


def _branch(draft: Draft) -> list[int]:
    """The tokens of the branch a chain-only target would verify (the whole draft for a chain)."""
    if _branches(draft):
        path = draft.best_path if draft.best_path is not None else ()
        return [draft.tokens[i] for i in path]
    return list(draft.tokens)


def _cut(draft: Draft, m: _Member) -> Draft:
    """A free member's point-mass chain, cut to the length it is expected to gain most with (one
    that sized itself by its own estimate, Draft.expected, is left as it is)."""
    if _branches(draft) or (isinstance(draft, ChainDraft) and draft.q is not None):
        return draft
    if draft.expected is not None or len(draft) <= 1:
        return draft
    n, _ = m.best(len(draft))
    return ChainDraft(tokens=list(draft.tokens[: max(n, 1)])) if n < len(draft) else draft
