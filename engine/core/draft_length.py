"""How many tokens to draft: the article's formula, fed with measured costs.

With per-token acceptance a and draft length k, a step emits on average

    E(a, k) = (1 - a^(k+1)) / (1 - a)          tokens per target forward,

and costs  D + k * d + T(k+1)  seconds, where d is the drafter's time per token, D
its fixed time per drafting step (a draft model feeds itself the step's pending
tokens first; 0 for most drafters) and T(n) the target's time to run n tokens in
one forward (the pending token plus k drafts). Plain decoding emits 1 token for
T(1). So the predicted speedup is

    S(a, k) = E(a, k) * T(1) / (D + k * d + T(k+1))

and automatic k picks the k in 0..k_max that maximizes it, k = 0 meaning plain
decoding. On a recurrent or hybrid target a rejection also costs a restore and a
replay of the kept tokens, so the step's cost gains the expected rollback time
(engine/core/costs.py `rollback_time`: P(reject) * (R + T(E[accepted | reject] + 1))),
and automatic k drafts shorter where rejections are dear. E(a, k) assumes every position is accepted with the same a; a draft
model drifts from the target the further it runs, so for chains automatic k uses
the tree's per-depth sum below with alpha_d measured per draft position
(`DraftLength.chain_expected_tokens`), each leaning on the run's a until its
position has evidence. d is the draft's decode time only: a draft model catching
its cache up after plain steps does that in one prefill, timed apart
(`Draft.catch_up_s`). That is the article's failure modes made operational: with low a, or
when T(n) grows like n * T(1) (compute-bound verification, as llama.cpp on a
small CPU model), no k > 0 pays and the engine decodes plainly, drafting a probe
now and then to notice when acceptance recovers.

Trees (Medusa, EAGLE). For a tree drafter k is the number of nodes, verified in
one forward of k + 1 rows, so the cost is still D + k * d + T(k+1). The expected
tokens are no longer E(a, k): a step emits 1 + (accepted depth), and

    E_tree = 1 + sum over depths d of  alpha_1 * ... * alpha_d

where alpha_j is the acceptance at depth j given depth j - 1 was accepted (the
per-depth counts RunStats keeps: depth_accepted / depth_tested). Acceptance at
each depth grows with the nodes spent there, which only the drafter can model,
so automatic k asks the drafter for E(k) (`DraftsTrees.tree_expected_tokens`; for
Medusa, 1 + the sum of its k best nodes' estimated path probabilities, which is
the same per-depth sum: the depth-d term is the mass of its depth-d nodes).
"""

from __future__ import annotations

import bisect
import collections
import statistics
import time
from dataclasses import dataclass, field

from engine.core.costs import (  # noqa: F401 - expected_tokens and break_even_acceptance: re-exported
    CostFormulas,
    CostSnapshot,
    break_even_acceptance,
    expected_tokens,
    on_curve,
)
from engine.core.draft_bounds import K_LIMIT, NO_BOUNDS, DraftBounds
from engine.errors import ConfigError

# How far past the cost of splitting a forward into timed smaller ones a load-time number must be
# to count as a spike (CostModel._relevel): a quarter more, since at a tile boundary T(2m) = 2 T(m)
# exactly and a timing's noise must not flag a real cost. Twice let T(3) = 3.6 x T(2) through.
SPIKE_FACTOR = 1.25
CURVE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 33)
BATCH_SIZES = (48, 64, 96, 128, 192, 256, 384, 512)  # the curve's sizes past one sequence's drafts
DEPTH_PRIOR = 2.0  # tokens' worth of the run's acceptance that each draft position starts from


def expected_tokens_tree(depth_rates: list[float] | tuple[float, ...], depth: int) -> float:
    """E_tree = 1 + sum_{d=1..depth} prod_{j<=d} alpha_j, alpha_j the acceptance at depth j
    given depth j - 1 was accepted (depths without a measurement count as 0)."""
    total, reach = 1.0, 1.0
    for d in range(min(depth, len(depth_rates))):
        reach *= min(max(depth_rates[d], 0.0), 1.0)
        total += reach
    return total


@dataclass
class CostModel(CostFormulas):
    """Seconds per target forward of n tokens, and per drafted token.

    Starts from a curve measured when the model loads and follows the times
    measured during decoding, so it adapts to context length and to whatever
    else the machine is doing. Each number is the low median of its last `window`
    timings, the value known before its first timing (the load-time measurement,
    or the curve's guess for a size it lacks) counting as one of them: a lasting
    change wins within a few steps, while one forward slowed by another process
    (common on a shared 2-core machine) moves nothing. Such noise is one-sided
    (a busy machine only ever makes a forward slower), so of two timings the model
    believes the faster: a size's first timing replaces a dearer load-time number at
    once, and a cheaper guess needs two timings against it. The load-time numbers
    used to count as 3 timings each; one taken while another process held the CPU
    (T(2) at 9x here) then outvoted every probe and automatic k decoded whole replies
    plainly.

    Sizes of the load-time curve that this session has not timed follow the ones it
    has: each is its load-time value times the ratio of timed to load-time cost at
    the nearest timed sizes (`_relevel`). So when plain steps find T(1) 20x cheaper
    than the load measured, T(2..33) drop with it instead of keeping a spike from
    the load; and when a longer context makes the timed sizes dearer, the untimed
    ones are not left cheaper than they are.
    """

    verify_s: dict[int, float] = field(default_factory=dict)  # n tokens -> seconds
    draft_s_per_token: float = 0.0  # a draft's cost per token (the marginal one, see draft_time)
    window: int = 7
    draft_fixed_s: float = 0.0  # and its fixed cost per drafting step
    replays: bool = False  # the target's rollback restores a state and replays (Backend.replays_on_rollback)
    rollback_fixed_s: float = 0.0  # R: a rollback's seconds beyond the forward of the tokens it replays
    _sorted_sizes: list[int] = field(default_factory=list, init=False, repr=False, compare=False)
    _recent: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # key -> deque
    _seed: dict | None = field(default=None, init=False, repr=False, compare=False)  # the curve before any timing
    _draft_seed: float | None = field(default=None, init=False, repr=False, compare=False)  # d before any timing
    _draft_k: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # k -> seconds to draft k

    def verify_time(self, n: int) -> float:
        """T(n), interpolated linearly between measured sizes (and extrapolated past them)."""
        if not self.verify_s:
            return float(n)  # unmeasured: assume no parallelism at all (the pessimistic case)
        return on_curve(self.verify_s, self._sizes(), n)

    def _sizes(self) -> list[int]:
        # Called for every candidate k on every step: keep the sorted sizes until a new one
        # is measured (sizes are only ever added).
        if len(self._sorted_sizes) != len(self.verify_s):
            self._sorted_sizes = sorted(self.verify_s)
        return self._sorted_sizes

    def observe_verify(self, n: int, seconds: float) -> None:
        if self._seed is None:
            self._seed = dict(self.verify_s)  # the load-time curve, which _relevel scales
        known = self.verify_time(n) if self.verify_s else None  # a size not yet measured: the curve's guess
        self.verify_s[n] = self._median_with(n, known, seconds)
        self._relevel()

    def _relevel(self) -> None:
        """Each size of the load-time curve not timed since: its load-time value times the ratio
        timed / load-time at the nearest timed sizes (interpolated between two, the nearest one's
        beyond them), kept between the costs of those sizes. A value far dearer than running the
        same rows as forwards of a timed smaller size (T(n) > SPIKE_FACTOR * ceil(n/m) * T(m))
        is no cost of this backend but a spike during the load (docs/benchmarks.md, "Measurements behind the code"), so that size follows
        the curve of the others instead, and gets tried."""
        seed = self._seed
        timed = sorted(key for key in self._recent if isinstance(key, int))
        if not seed or not timed:
            return
        seed_sizes = sorted(seed)
        ratios = [self.verify_s[m] / on_curve(seed, seed_sizes, m) for m in timed]
        kept = {m: self.verify_s[m] for m in timed}  # the timed sizes, then each load-time one that passes
        for m in seed_sizes:
            if m in self._recent:
                continue
            i = bisect.bisect_left(timed, m)
            if i == 0 or i == len(timed):
                ratio = ratios[0] if i == 0 else ratios[-1]
            else:
                t = (m - timed[i - 1]) / (timed[i] - timed[i - 1])
                ratio = ratios[i - 1] * (1 - t) + ratios[i] * t
            # between its timed neighbours: more rows never cost less (a load-time spike that hit
            # one size harder than another must not make T(2) look cheaper than T(1))
            low = self.verify_s[timed[i - 1]] if i > 0 else 0.0
            high = self.verify_s[timed[i]] if i < len(timed) else float("inf")
            value = min(max(seed[m] * ratio, low), max(high, low))
            if any(value > SPIKE_FACTOR * -(-m // j) * self.verify_s[j] for j in timed[:i]):
                value = max(on_curve(kept, sorted(kept), m), low)
            kept[m] = self.verify_s[m] = value

    def observe_draft(self, tokens: int, seconds: float) -> None:
        """`tokens` drafted in `seconds`, catching up excluded (`Draft.catch_up_s`)."""
        if tokens <= 0:
            return
        if self._draft_seed is None:
            self._draft_seed = self.draft_s_per_token  # the load-time decode (0: not measured)
        known = self.draft_time(tokens) if self.draft_s_per_token > 0 else None
        self._draft_k[tokens] = self._median_with(("draft", tokens), known, seconds)
        self._fit_draft()

    def observe_rollback(self, replayed: int, seconds: float) -> None:
        """A rollback that restored a state and replayed `replayed` tokens in `seconds`. What it took
        beyond a forward of those tokens, T(replayed), is the restore's cost R (the low median of
        the last `window`; never below 0: a replay is a forward, as dear as the curve says)."""
        if replayed <= 0:
            return
        self.replays = True
        beyond = max(0.0, seconds - self.verify_time(replayed)) if self.verify_s else seconds
        self.rollback_fixed_s = self._median_with("rollback", None, beyond)

    def _fit_draft(self) -> None:
        """draft_time(k) = draft_fixed_s + k * draft_s_per_token from the timings per draft length:
        the cost per token is the lowest per-token time of any length (the longest drafts spread
        the fixed part thinnest) or the load-time decode if that is lower, and the fixed part the
        median of what each length's time leaves beyond its tokens. A straight-line fit through a
        few noisy lengths halved the cost per token, with a fixed part big enough that automatic k
        decoded plainly until its first probe (docs/benchmarks.md, "Measurements behind the code")."""
        per_token = min(t / k for k, t in self._draft_k.items())
        d = min(self._draft_seed, per_token) if self._draft_seed else per_token
        self.draft_s_per_token = d
        self.draft_fixed_s = statistics.median_low([max(0.0, t - k * d) for k, t in self._draft_k.items()])

    def _median_with(self, key, known: float | None, value: float) -> float:
        """The low median of the last `window` values of `key` after adding `value`; the value
        known before the first one (the load-time curve, or its guess) starts the window."""
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = collections.deque([known] if known is not None else [], maxlen=self.window)
        recent.append(value)
        return statistics.median_low(recent)

    def snapshot(self) -> CostSnapshot:
        """The numbers now, frozen, with the same formulas; call it on the thread that updates this model."""
        return CostSnapshot(
            tuple(sorted(self.verify_s.items())),
            self.draft_s_per_token,
            self.draft_fixed_s,
            self.window,
            self.replays,
            self.rollback_fixed_s,
        )


def curve_sizes(parallel: int = 1, k_max: int = 16) -> tuple[int, ...]:
    """The sizes the load-time curve times: one sequence's drafts (CURVE_SIZES), and for a batch of
    `parallel` sequences the larger row counts it runs, up to parallel * (k_max + 1)."""
    most = parallel * (k_max + 1)
    return CURVE_SIZES + tuple(n for n in BATCH_SIZES if parallel > 1 and n <= max(most, BATCH_SIZES[0]))


def measure_verify_curve(
    backend, sizes=CURVE_SIZES, repeats: int = 3, context: int = 64, budget_s: float = 3.0
) -> dict[int, float]:
    """Time one forward of n tokens for each n (the fastest of `repeats`), at a short context.

    The sizes are timed in turn, `repeats` passes over all of them, and each keeps its fastest
    time: whatever else runs on the machine only ever adds to a forward's time, and comes in
    bursts (a window painting its progress, another program). Timed three times in a row, a
    size whose repeats a burst covered kept a time twice its own as its median, which made
    longer drafts look dear and automatic k draft short for a whole session; spread over the
    passes, the burst falls on one timing of several sizes and the fastest of each is its cost.

    The first pass stops early once its share of `budget_s` is spent (a big model on a CPU);
    `CostModel` extrapolates past the last size measured. A small context window shrinks the
    measurement to fit (half the window of context, the sizes that fit behind it), so any
    n_ctx the backend accepts loads. Runs on the backend's own cache and leaves it as it
    found it.
    """
    context = max(1, min(context, backend.n_ctx // 2))
    if context + 1 > backend.n_ctx:  # no room for even one token after the context
        return {}
    saved = list(backend.tokens)
    filler = _filler_tokens(backend, context + max(sizes))
    curve: dict[int, float] = {}

    def timed(n: int) -> float:
        start = time.perf_counter()
        backend.forward(filler[context : context + n])
        seconds = time.perf_counter() - start
        backend.rollback(context)
        return seconds

    deadline = time.perf_counter() + budget_s / max(1, repeats)
    try:
        backend.prefill(filler[:context])
        backend.forward(filler[context : context + 1])  # warm-up
        backend.rollback(context)
        for n in sizes:
            if context + n > backend.n_ctx or (len(curve) >= 2 and time.perf_counter() > deadline):
                break
            curve[n] = timed(n)
        for _ in range(repeats - 1):
            for n in curve:
                curve[n] = min(curve[n], timed(n))
    finally:
        backend.prefill(saved) if saved else backend.rollback(0)
    return curve


def measure_draft_cost(backend, repeats: int = 5, context: int = 64) -> float:
    """Seconds for one one-token decode of a draft model (the median of `repeats`), at a
    short context: `CostModel.draft_s_per_token` before the loop has timed any drafting.
    Leaves the backend's cache as it found it."""
    context = max(1, min(context, backend.n_ctx - 1))
    saved = list(backend.tokens)
    filler = _filler_tokens(backend, context + 1)
    try:
        backend.prefill(filler[:context])
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            backend.forward(filler[context:])
            times.append(time.perf_counter() - start)
            backend.rollback(context)
    finally:
        backend.prefill(saved) if saved else backend.rollback(0)
    times = sorted(times[1:])
    return times[len(times) // 2]


def _filler_tokens(backend, n: int) -> list[int]:
    text = "The quick brown fox jumps over the lazy dog while the cat watches. " * (n // 8 + 2)
    ids = backend.tokenize(text)
    return (ids * (n // max(len(ids), 1) + 1))[:n]


class DraftLength:
    """Fixed k, or automatic k from the running acceptance estimate and the cost model; held to a
    generation's `bounds` (engine/core/draft_bounds.py): k at most n_max, and at least n_min when
    it drafts at all. The bounds travel with it to where the step fits its draft to k."""

    def __init__(
        self, k: int | str = "auto", k_max: int = 16, probe_every: int = 16, bounds: DraftBounds = NO_BOUNDS
    ) -> None:
        if k == "auto":
            self.fixed: int | None = None
        else:
            try:
                k = int(k)
            except (TypeError, ValueError):
                raise ConfigError(f"draft length must be a number from 0 to {K_LIMIT} or 'auto', got {k!r}.") from None
            if not 0 <= k <= K_LIMIT:
                raise ConfigError(f"draft length k must be between 0 and {K_LIMIT} (or 'auto'), got {k}.")
            self.fixed = k
        if not 1 <= k_max <= K_LIMIT:
            raise ConfigError(f"the largest automatic draft length must be between 1 and {K_LIMIT}, got {k_max}.")
        self.bounds = bounds
        if bounds.n_max is not None:  # k and k_max checked above as given, then capped
            self.fixed = None if self.fixed is None else min(self.fixed, bounds.n_max)
            k_max = max(1, min(k_max, bounds.n_max))
        self._bounded = bounds != NO_BOUNDS
        self.k_max = k_max
        self.probe_every = probe_every
        # Decayed counts of accepted and tested draft tokens; the prior (a ~ 0.67 from 3
        # tokens) is weak, so a couple of steps of evidence outweigh it.
        self._accepted = 2.0
        self._tested = 3.0
        # The same counts per draft position (depth d was tested when every earlier token was
        # accepted). Acceptance falls with depth, as a draft drifts from the target: one
        # number per run cannot say so, and made automatic k choose long drafts whose last
        # tokens were mostly rejected. Each depth leans on the run's number (DEPTH_PRIOR
        # tokens' worth) until it has evidence of its own.
        self._depth_accepted: list[float] = []
        self._depth_tested: list[float] = []
        self._plain_steps = 0
        self._probe_interval = probe_every
        self._probing = False
        self._unproven = True  # no draft of this run verified yet
        self._costs: CostModel | None = None
        self._tree_expected = None  # nodes -> expected tokens, for tree drafters (see use_tree_estimate)

    def use_tree_estimate(self, expected) -> None:
        """Choose k as a tree's node budget, with `expected(k)` tokens per step (None = chain formula)."""
        self._tree_expected = expected

    @property
    def auto(self) -> bool:
        return self.fixed is None

    @property
    def acceptance(self) -> float:
        return self._accepted / self._tested

    def chain_expected_tokens(self) -> list[float]:
        """E(k) for k = 0..k_max from the per-depth estimates: 1 + sum over d <= k of
        alpha_1 * ... * alpha_d (expected_tokens_tree's sum, for a chain)."""
        prior, totals, reach = self.acceptance, [1.0], 1.0
        for d in range(self.k_max):
            if d < len(self._depth_tested):
                alpha = (self._depth_accepted[d] + DEPTH_PRIOR * prior) / (self._depth_tested[d] + DEPTH_PRIOR)
            else:
                alpha = prior
            reach *= alpha
            totals.append(totals[-1] + reach)
        return totals

    def choose(self, costs: CostModel) -> int:
        return self.bounded(self._choose(costs))

    def bounded(self, k: int) -> int:
        """k held to this generation's bounds (n_max; n_min when it drafts at all)."""
        return self.bounds.length(k) if self._bounded else k

    def expected_by_k(self) -> list[tuple[float, float | None]]:
        """For k = 0..k_max: the expected tokens of a step drafting k, and the probability that it
        keeps all k (None for a tree, whose drafter estimates the tokens): what a batch weighs when it
        shares one forward between sequences (engine/core/batch_k.py)."""
        chain = self.chain_expected_tokens()
        curve: list[tuple[float, float | None]] = [(1.0, 1.0)]
        for k in range(1, self.k_max + 1):
            tree = self._tree_expected(k) if self._tree_expected is not None else None
            curve.append((tree, None) if tree is not None else (chain[k], chain[k] - chain[k - 1]))
        return curve

    def _choose(self, costs: CostModel) -> int:
        if self.fixed is not None:
            return self.fixed
        self._costs = costs
        best_k = self._best_k(costs)
        if best_k > 0:
            self._plain_steps = 0
            self._probe_interval = self.probe_every
            return best_k
        # Plain decoding. Look again now and then, since acceptance may recover (the reply
        # starts quoting its input, say). A probe stays open until the drafter actually
        # drafts (an n-gram drafter with no match costs nothing), and each probe that
        # finds nothing doubles the wait, so where drafting never pays probes cost ~0.
        # A reply whose drafts have not been tried yet starts with a probe where drafts that
        # land would pay: its acceptance is only the prior's guess (0.67), which for a draft
        # model accepted at 0.98 meant 16 plain tokens before the first draft, on 3 of 6 prompts.
        if not self._probing:
            probe = self._unproven and self._best_k(costs, 0.9) > 0
            self._plain_steps += 1
            if self._plain_steps < self._probe_interval and not probe:
                return 0
            self._plain_steps = 0
            self._probing = True
        return max(1, min(self._best_k(costs, 0.9), 4))  # the draft that would pay if drafts did land

    def _best_k(self, costs: CostModel, acceptance: float | None = None) -> int:
        """The k that maximizes the predicted speedup, from the measured per-depth acceptance
        (or, given `acceptance`, from that one number at every depth)."""
        chain = self.chain_expected_tokens() if acceptance is None else None
        best_k, best = 0, 1.0
        for k in range(1, self.k_max + 1):
            tree = self._tree_expected(k) if self._tree_expected is not None else None
            if tree is None:
                # P(all k kept) = alpha_1 * ... * alpha_k, the last term of the chain's sum
                s = (
                    costs.speedup(acceptance, k)
                    if chain is None
                    else costs.speedup_for(chain[k], k, chain[k] - chain[k - 1])
                )
            else:
                s = costs.speedup_for(tree, k)
            if s > best * 1.02:  # ask for a clear gain before adding tokens
                best_k, best = k, s
        return best_k

    def observe(self, tested: int, accepted: int, decay: float = 0.85) -> None:
        if tested <= 0:
            return
        self._unproven = False
        self._accepted = self._accepted * decay + accepted
        self._tested = self._tested * decay + tested
        grow = max(0, tested - len(self._depth_tested))
        self._depth_tested += [0.0] * grow
        self._depth_accepted += [0.0] * grow
        for d in range(tested):  # depths this step did not reach keep their evidence
            self._depth_tested[d] = self._depth_tested[d] * decay + 1
            self._depth_accepted[d] = self._depth_accepted[d] * decay + (d < accepted)
        if self._probing:
            self._probing = False
            if self._costs is not None and self._best_k(self._costs) == 0:
                self._probe_interval = min(self._probe_interval * 2, 512)
