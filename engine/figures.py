"""One name per number: what each figure of a run is called and what it means.

Every surface (the chat's footer, the charts' headline and titles, the benchmark, the side by
side, the CLI, the server's JSON) names a quantity with the words here and explains it with
the tooltip here, so a user meets each number under one name. The keys of `RunStats.as_dict`
stay as they are (clients read them); these are the words people read.

The two figures a user reads first are the ones llama.cpp, LM Studio and vLLM print:
- draft acceptance: the share of drafted tokens the target accepted (accepted / drafted);
- mean acceptance length: the tokens a reply gains per target forward (tokens / steps).
The article's per-token acceptance a (accepted / tested) belongs to its formula and is shown
where the formula is: the theory panel, Help > What the numbers mean, the CLI's details.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.draft_length import expected_tokens
from engine.core.events import RunStats


@dataclass(frozen=True)
class Figure:
    name: str  # what the figure is called, lower case, as it reads inside a sentence
    tip: str  # one or two sentences for a tooltip: what it is and how it is computed


DRAFT_ACCEPTANCE = Figure(
    "draft acceptance",
    "The share of drafted tokens the target accepted: accepted / drafted. "
    "llama.cpp and LM Studio report the same figure.",
)
ACCEPTANCE_LENGTH = Figure(
    "mean acceptance length",
    "Tokens the reply gained per step (one target forward): the accepted drafts plus the one token "
    "the target adds itself. 1.00 means drafting gained nothing; k + 1 is the most a step can give.",
)
PER_TOKEN_ACCEPTANCE = Figure(
    "per-token acceptance a",
    "The article's a: accepted / tested, where a drafted token is tested when every token before it "
    "was accepted (the tokens after a rejection are never looked at). The speedup formula uses it.",
)
STEP = Figure(
    "step",
    "One forward pass of the target model. Vanilla decoding gives one token per step; speculative "
    "decoding tests the drafted tokens in the same step and keeps the accepted ones.",
)
DRAFT_LENGTH = Figure(
    "draft length k",
    "How many tokens the drafter proposed for the step (automatic k chooses it from the measured costs).",
)
PREDICTED_SPEEDUP = Figure(
    "predicted speedup",
    "The article's formula with this run's numbers: (1 - a^(k+1)) / ((1 - a)(1 + c)), where c is the "
    "cost of drafting and verifying measured against one plain target forward.",
)
DECODE_SPEEDUP = Figure(
    "decoding speedup",
    "Decoding time of the vanilla run over that of the speculative run for the same prompt. Prefill "
    "(reading the prompt) is left out: speculation changes only the decoding phase.",
)
BREAK_EVEN = Figure(
    "break-even a",
    "The per-token acceptance a at which speculation is as fast as vanilla decoding with this draft "
    "length and these costs; below it, speculation is slower.",
)
TIME_TO_FIRST_TOKEN = Figure(
    "time to first token",
    "From sending the prompt to the first token of the reply: mostly prefill, reading the prompt.",
)


def draft_acceptance_text(stats: RunStats) -> str:
    """'88% of drafted tokens accepted (22 of 25)', or '' when nothing was drafted."""
    if not stats.drafted:
        return ""
    return f"{stats.draft_acceptance_rate:.0%} of drafted tokens accepted ({stats.accepted} of {stats.drafted})"


def acceptance_length_text(stats: RunStats) -> str:
    """'mean acceptance length 2.29', or '' before the first step."""
    if not stats.steps:
        return ""
    return f"{ACCEPTANCE_LENGTH.name} {stats.mean_acceptance_length:.2f}"


def per_token_acceptance_text(stats: RunStats) -> str:
    """'per-token acceptance a 0.94 (22 of 24 tested)', or '' when no draft was tested."""
    if not stats.tested:
        return ""
    return f"{PER_TOKEN_ACCEPTANCE.name} {stats.acceptance_rate:.2f} ({stats.accepted} of {stats.tested} tested)"


def predicted_speedup_text(stats: RunStats) -> str:
    """'predicted speedup 1.29x', or '' before the first step."""
    return f"{PREDICTED_SPEEDUP.name} {stats.predicted_speedup:.2f}x" if stats.steps else ""


def details(stats: RunStats) -> str:
    """The leading figures, then the article's a and the speedup its formula predicts (the CLI's line)."""
    parts = [summary(stats), per_token_acceptance_text(stats), predicted_speedup_text(stats)]
    return " · ".join(part for part in parts if part)


def summary(stats: RunStats) -> str:
    """The run in one line, the leading figures first: what a chat reply's footer says."""
    parts = [draft_acceptance_text(stats), acceptance_length_text(stats)]
    return " · ".join(part for part in parts if part)


def tips(*figures: Figure) -> str:
    """A tooltip for several figures: each one's name and what it means, a paragraph each."""
    return "\n\n".join(f"{figure.name[0].upper()}{figure.name[1:]}: {figure.tip}" for figure in figures)


@dataclass(frozen=True)
class FormulaExample:
    """The article's formula with one run's numbers plugged in (Help > What the numbers mean)."""

    a: float  # per-token acceptance: accepted / tested
    k: int  # draft length: the run's drafted tokens per step, rounded
    c: float  # a step's cost beyond one plain forward: verifying k + 1 tokens and drafting k, in forwards
    expected: float  # E[tokens per step] = (1 - a^(k+1)) / (1 - a)
    speedup: float  # expected / (1 + c)
    break_even: float | None  # the a at which expected = 1 + c; None when no a <= 1 gets there


def formula_example(stats: RunStats) -> FormulaExample | None:
    """The formula for this run, or None when it drafted nothing. The cost is the run's measured
    cost ratios (RunStats.verify_cost_ratio at the run's mean draft length, draft_cost_ratio per
    drafted token); RunStats.predicted_speedup weighs each step's own draft length and the drafting
    time as timed, so the two agree exactly for a run that drafted k tokens at every step."""
    if not stats.steps or not stats.tested:
        return None
    k = max(1, round(stats.drafted / stats.steps))
    a = stats.acceptance_rate
    c = max(stats.verify_cost_ratio + k * stats.draft_cost_ratio - 1.0, 0.0)
    expected = expected_tokens(a, k)
    return FormulaExample(a, k, c, expected, expected / (1.0 + c), _break_even(k, c))


def _break_even(k: int, c: float) -> float | None:
    """The a where (1 - a^(k+1)) / (1 - a) = 1 + c (it grows with a, up to k + 1 at a = 1)."""
    if expected_tokens(1.0, k) <= 1.0 + c:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) <= 1.0 + c else (lo, mid)
    return hi
