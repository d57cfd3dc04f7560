"""Self-speculative early exit: the target's own first L layers are the draft model.

As in LayerSkip (Elhoushi et al. 2024, arXiv 2404.16710) and Draft & Verify
(Zhang et al. 2023, arXiv 2309.08168), without their training: the draft runs
the target's layers 0..L-1 on each token, then the target's final norm and LM
head, and the full model verifies as usual. Nothing else is loaded, so drafting
costs no memory beyond a few cache rows, and the draft shares the target's
vocabulary and tokenizer by construction.

The cache is shared, not copied. By the decode loop's invariant the target's
KV cache holds every layer for the committed tokens x_1..x_{m-1}; x_m is pending.
Drafting runs the first L layers over x_m, d_1, d_2, ... one token at a time
(`TorchBackend.partial_forward`), reading the committed entries of those layers
as they are and writing its own keys and values of layers 0..L-1 into the SAME
cache at positions m-1, m, ... as scratch beyond `backend.tokens`. After every
call the cache's length is set back to len(backend.tokens), so nothing else ever
reads the scratch. So there is no second cache and no recomputation of
committed tokens for the draft.

The reuse goes the other way too, as in LayerSkip. The draft keeps the residual
stream after layer L of every token it ran (x_m, d_1, ..., d_{k-1}; `ChainDraft.
exit`), and the verification forward over [x_m, d_1, ..., d_k] starts
there (`TorchBackend.forward_from_exit`): only d_k goes through layers 0..L-1,
as one row reading the draft's scratch keys and values, and then all k + 1 rows
run layers L..n-1, whose keys and values are written as usual. The first L
layers of the verified rows are the draft's own, not recomputed: the same layers
on the same inputs, so in float32 the logits equal a full forward's to rounding
(tested), and in bf16 the rows are even closer to plain decoding (one row at a
time, as vanilla runs them). Rejected drafts' rows are dropped by the usual
rollback.

q for each draft token is the early-exit head's distribution after the same
`SamplingConfig` processing as the target's (engine/core/sampling.py), so the
rejection rule min(1, p/q) stays lossless; greedy drafts take the argmax.

Choosing L. Shallow exits are cheap and often wrong, deep ones right and
expensive. For an exit L with per-token acceptance a_L and a draft token costing
c_L target forwards (c_L ~ (L + h) / (n + h) for n layers and an LM head worth h
layers; measured, see below), a draft of k tokens is predicted to give, as in
engine/core/draft_length.py,

    S(L, k) = E(a_L, k) / (k * c_L + T(k+1) / T(1)),  E(a, k) = (1 - a^(k+1)) / (1 - a).

With layers="auto" the candidates are a handful of exits between ~1/4 and ~3/4
of the layers. Each drafts for EXPLORE_STEPS steps first (deepest first: the
likeliest to draft well while the others are tried); afterwards every
step takes the candidate with the highest S at the step's k, computed with an
optimistic acceptance (a discounted UCB rule, Garivier & Moulines 2008):

    a_L+ = a_L + UCB_BONUS * sqrt(ln N / n_L),

n_L the (discounted) draft tokens tested at exit L and N their sum over exits.
Counts fade by DISCOUNT per step, so an exit left alone grows uncertain again and
is retried now and then, which follows text that changes character (a quoted
passage after an open one). c_L is measured, not guessed: the drafter times its
own drafting per token for each exit (a moving average; the very first,
warm-up, draft is not timed), and T(1) is the target's time per plain forward
from the engine's `CostModel` when it has measured one (`costs`), else the same
per-layer timings extrapolated to all n layers. T(k+1)/T(1) comes from the
`CostModel` too (1, a memory-bound verify, without one).

L and k cooperate as coordinate ascent on the same formula: the decode loop's
`DraftLength` picks k from the running acceptance and the measured draft cost,
which once L settles are L's own; the drafter picks L for that k. Each choice
maximises S given the other, so neither undoes the other, and a fixed k (or a
fixed L) simply pins one coordinate. With automatic L (as with automatic k) the
choices depend on measured times, so a sampled run is reproducible from its seed
only with fixed layers and a fixed k; its output is distributed exactly as the
target's either way.

How well it drafts depends on the model. LayerSkip trains for it (layer dropout
and an early-exit loss); an ordinary model's early exits agree with its output
far less: on the embedded SmolLM2-135M the exits between layers 8 and 22 of 30
had 0-30% of their greedy drafts accepted, so there automatic k mostly decodes
plainly, while the output stays exactly the target's.

Needs the PyTorch backend's native implementation (llama, mistral, qwen2, qwen3),
the only one that can stop after L layers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from engine.backends.capabilities import LayerExit, has
from engine.core.draft_length import CostModel, expected_tokens
from engine.core.sampling import SamplingConfig, probabilities, sample, token_probability
from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter, ExitStart, ReadsCosts
from engine.drafters.early_exit_spec import EarlyExitStats, ExitCandidate
from engine.errors import ConfigError

EXIT_FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)  # candidate exits, as fractions of the layers
EXPLORE_STEPS = 2  # drafting steps each candidate gets before the rule below takes over
UCB_BONUS = 0.3  # optimism of the acceptance estimate: coefficient of sqrt(ln N / n_L)
DISCOUNT = 0.995  # per drafting step, on every exit's counts (a horizon of ~200 steps)
PRIOR_WEIGHT = 2.0  # the prior acceptance counts as this many tested tokens
TIME_SMOOTHING = 0.2  # moving average of the seconds per draft token


def candidate_exits(n_layers: int, fractions=EXIT_FRACTIONS) -> list[int]:
    """A handful of exits between ~1/4 and ~3/4 of `n_layers` (each 1..n_layers-1), increasing."""
    exits = {min(max(round(n_layers * f), 1), n_layers - 1) for f in fractions}
    return sorted(exits)


@dataclass
class _Exit:
    layer: int
    prior: float  # acceptance assumed before any evidence
    accepted: float = 0.0  # discounted counts of draft tokens accepted / tested at this exit
    tested: float = 0.0
    steps: int = 0  # drafting steps taken with this exit (not discounted)
    seconds: float | None = None  # moving average of the drafter's seconds per draft token

    @property
    def acceptance(self) -> float:
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.tested + PRIOR_WEIGHT)


class ExitChooser:
    """Which exit to draft with: measured acceptance and cost per candidate, and the rule
    (exploration, then the highest optimistic predicted speedup). Pure bookkeeping, no
    model: the drafter feeds it what it measures, tests feed it numbers."""

    def __init__(
        self,
        n_layers: int,
        candidates: list[int],
        head_layers: float = 1.0,
        *,
        explore_steps: int = EXPLORE_STEPS,
        bonus: float = UCB_BONUS,
        discount: float = DISCOUNT,
    ) -> None:
        self.n_layers = n_layers
        self.head_layers = max(head_layers, 0.0)  # the LM head's cost in layers (h)
        self.explore_steps = explore_steps
        self.bonus = bonus
        self.discount = discount
        # Deeper exits agree with the full model more often; the prior says so, weakly.
        self.exits = {L: _Exit(L, prior=0.2 + 0.6 * L / n_layers) for L in candidates}
        self._scale: float | None = None  # seconds per (layer + h), from every timed exit

    # -- what was measured ------------------------------------------------------------

    def observe(self, layer: int, tested: int, accepted: int) -> None:
        """One drafting step at `layer`: `tested` draft tokens met the rule, `accepted` passed."""
        for e in self.exits.values():
            e.accepted *= self.discount
            e.tested *= self.discount
        e = self.exits[layer]
        e.accepted += accepted
        e.tested += tested

    def observe_time(self, layer: int, seconds_per_token: float) -> None:
        e = self.exits[layer]
        old = e.seconds
        e.seconds = seconds_per_token if old is None else old + TIME_SMOOTHING * (seconds_per_token - old)
        per_unit = seconds_per_token / (layer + self.head_layers)
        self._scale = per_unit if self._scale is None else self._scale + TIME_SMOOTHING * (per_unit - self._scale)

    # -- the estimates ----------------------------------------------------------------

    def seconds(self, layer: int) -> float | None:
        """Seconds per draft token at `layer`: measured, else scaled from the other exits' times."""
        e = self.exits.get(layer)
        if e is not None and e.seconds is not None:
            return e.seconds
        return None if self._scale is None else self._scale * (layer + self.head_layers)

    def cost_ratio(self, layer: int, t1: float | None = None) -> float:
        """c_L: a draft token's cost in target forwards of one token (T(1) = t1 when known)."""
        seconds = self.seconds(layer)
        if seconds is None:  # nothing timed yet: the share of the weights read per token
            return (layer + self.head_layers) / (self.n_layers + self.head_layers)
        if not t1:
            t1 = self._scale * (self.n_layers + self.head_layers)
        return seconds / t1

    def acceptance(self, layer: int, optimistic: bool = False) -> float:
        e = self.exits[layer]
        if not optimistic:
            return e.acceptance
        total = sum(x.tested for x in self.exits.values()) + PRIOR_WEIGHT * len(self.exits)
        bonus = self.bonus * math.sqrt(math.log(max(total, math.e)) / (e.tested + PRIOR_WEIGHT))
        return min(1.0, e.acceptance + bonus)

    def speedup(
        self, layer: int, k: int, verify_ratio: float = 1.0, t1: float | None = None, optimistic: bool = False
    ) -> float:
        """S(L, k) = E(a_L, k) / (k * c_L + T(k+1) / T(1))."""
        if k <= 0:
            return 1.0
        a = self.acceptance(layer, optimistic)
        return expected_tokens(a, k) / (k * self.cost_ratio(layer, t1) + verify_ratio)

    # -- the rule ---------------------------------------------------------------------

    def choose(self, k: int, verify_ratio: float = 1.0, t1: float | None = None) -> int:
        """The exit for a draft of k tokens: an untried candidate (deepest first) while
        exploring, then the highest optimistic S(L, k); ties go to the shallower exit."""
        for e in sorted(self.exits.values(), key=lambda x: -x.layer):
            if e.steps < self.explore_steps:
                return e.layer
        best, best_s = None, -1.0
        for layer in sorted(self.exits):
            s = self.speedup(layer, max(k, 1), verify_ratio, t1, optimistic=True)
            if s > best_s:
                best, best_s = layer, s
        return best

    def count_step(self, layer: int) -> None:
        self.exits[layer].steps += 1


class EarlyExitDrafter(Drafter):
    """Drafts a chain with the target's first L layers, its final norm and its LM head."""

    name = "early exit"
    capabilities = frozenset({ReadsCosts})

    def __init__(self, target_backend, layers: int | str = "auto", *, costs: CostModel | None = None) -> None:
        """`layers`: "auto" (chosen by measured acceptance and cost) or a fixed exit 1..n_layers-1.
        `costs`: the engine's CostModel (the one decode_steps gets), for T(1) and T(k+1)/T(1);
        it may also be set later as the `costs` attribute."""
        if not has(target_backend, LayerExit):
            name = getattr(target_backend, "name", "this")
            why = (
                "this target runs on transformers' own forward (impl='transformers', or an architecture "
                "the native implementation does not cover)"
                if name == "torch"
                else f"the {name} backend cannot stop a forward after some of the layers"
            )
            raise ConfigError(
                "Early exit drafts with the target's own first layers, which needs the PyTorch backend's "
                f"native implementation (llama, mistral, qwen2, qwen3 models); {why}. Load the target with "
                "--backend torch (implementation auto or native), or choose another drafter."
            )
        self.target = target_backend
        self.costs = costs
        info = target_backend.info
        n = int(info.n_layers)
        self.n_layers = n
        if n < 2:
            raise ConfigError(
                f"{info.name} has {n} layer{'s' if n != 1 else ''}: early exit needs at least 2 "
                "(it drafts with fewer layers than the target). Choose another drafter."
            )
        if layers == "auto":
            self.fixed: int | None = None
            exits = candidate_exits(n)
        else:
            try:
                if isinstance(layers, bool) or float(layers) != int(layers):
                    raise ValueError
                fixed = int(layers)
            except (TypeError, ValueError):
                fixed = None
            if fixed is None or not 1 <= fixed < n:
                raise ConfigError(
                    f"The early-exit layer must be 'auto' or a whole number from 1 to {n - 1} "
                    f"({info.name} has {n} layers; the draft runs that many of them, then the LM head), "
                    f"got {layers!r}. Use 'auto' to let the drafter pick it."
                )
            self.fixed = fixed
            exits = [fixed]
        self.chooser = ExitChooser(n, exits, head_layers=_head_layers(target_backend))
        self._layer: int | None = None  # the exit of the last draft (awaiting observe)
        self._last_k = 0
        self._timed_once = False  # the first draft (warm-up) is not timed

    # -- the decode loop's calls ------------------------------------------------------

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        target = self.target
        base = len(target.tokens)  # position of the pending token x_m
        # The decode loop's invariant: the cache holds the context but its last token.
        if k <= 0 or base != len(context) - 1 or target.tokens[-8:] != context[max(0, base - 8) : base]:
            return EMPTY_DRAFT
        k = min(k, target.n_ctx - len(context))  # what the verification forward can still hold
        if k <= 0:
            return EMPTY_DRAFT
        layer = self.fixed if self.fixed is not None else self.chooser.choose(k, *self._costs(k))
        start = time.perf_counter()
        logits = target.partial_forward([context[-1]], layer, base)[-1]
        hidden = [target.exit_hidden()]  # the verifying forward starts from these rows (forward_from_exit)
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_token: list[float] = []
        for i in range(k):
            if sampling.greedy:
                token = int(logits.argmax())
                q_token.append(token_probability(logits, token))
            else:
                q = probabilities(logits, sampling)  # (V,), processed as the target's p will be
                token = sample(q, generator)
                q_rows.append(q)
                q_token.append(float(q[token]))
            tokens.append(token)
            if i + 1 < k:  # d_{i+1} goes at position base + i + 1, after the scratch rows so far
                logits = target.partial_forward([token], layer, base + i + 1)[-1]
                hidden.append(target.exit_hidden())
        if self._timed_once:
            self.chooser.observe_time(layer, (time.perf_counter() - start) / k)
        self._timed_once = True
        self.chooser.count_step(layer)
        self._layer, self._last_k = layer, k
        return ChainDraft(
            tokens=tokens,
            q=torch.stack(q_rows) if q_rows else None,
            q_token=tuple(q_token),
            exit=ExitStart(torch.cat(hidden), layer),
        )

    def observe(self, drafted: int, accepted: int) -> None:
        if self._layer is None or drafted <= 0:
            return
        tested = accepted + (1 if accepted < drafted else 0)  # the rejected one was tested too
        self.chooser.observe(self._layer, tested, accepted)

    def reset(self) -> None:
        """A new generation. What was learnt about the exits is kept: it is a property of the
        model (and the kind of text), and exploring again would cost drafts."""
        self._layer = None

    # -- for the UI --------------------------------------------------------------------

    @property
    def exit_layer(self) -> int:
        """The exit in use: the last one drafted with (or the one the next draft would take)."""
        if self.fixed is not None:
            return self.fixed
        if self._layer is not None:
            return self._layer
        k = max(self._last_k, 1)
        return self.chooser.choose(k, *self._costs(k))

    def stats(self) -> EarlyExitStats:
        k = max(self._last_k, 1)
        verify_ratio, t1 = self._costs(k)
        candidates = []
        for layer, e in sorted(self.chooser.exits.items()):
            seconds = self.chooser.seconds(layer) if e.seconds is not None else None
            candidates.append(
                ExitCandidate(
                    layer=layer,
                    acceptance=e.accepted / e.tested if e.tested > 0 else None,  # measured; None: not yet
                    tested=round(e.tested, 2),
                    steps=e.steps,
                    ms_per_token=None if seconds is None else 1000.0 * seconds,
                    cost_ratio=self.chooser.cost_ratio(layer, t1),
                    predicted_speedup=self.chooser.speedup(layer, k, verify_ratio, t1),
                )
            )
        return EarlyExitStats(
            exit_layer=self.exit_layer,
            n_layers=self.n_layers,
            layers="auto" if self.fixed is None else self.fixed,
            candidates=tuple(candidates),
        )

    # -- helpers -----------------------------------------------------------------------

    def _costs(self, k: int) -> tuple[float, float | None]:
        """(T(k+1) / T(1), T(1) in seconds or None) from the engine's cost model, where measured."""
        costs = self.costs
        if costs is None or not costs.verify_s:
            return 1.0, None
        return costs.verify_ratio(k + 1), costs.verify_s.get(1)


def _head_layers(backend) -> float:
    """The LM head's share of the weights read per draft token, in layers (h): vocab x hidden
    parameters against the per-layer parameters; only a prior until drafts are timed."""
    info = backend.info
    hidden = int(getattr(backend, "hidden_size", 0) or 0)
    head = info.vocab_size * hidden
    if not head or info.n_layers <= 0 or info.n_params <= head:
        return 1.0
    return head / ((info.n_params - head) / info.n_layers)
