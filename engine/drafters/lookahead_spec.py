"""The lookahead drafter's registry entry: its W, N, G and their limits (lookahead.py is the algorithm)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.backends.capabilities import TreeForward
from engine.drafters.registry import AUTO, DrafterSpec, DrafterStats, auto_or_int, setting, stat
from engine.lazy import named

LIMITS = {"window": 64, "ngram": 16, "candidates": 64}
MINIMUMS = {"window": 1, "ngram": 2, "candidates": 1}
NAMES = {
    "window": "window W (future positions guessed per step)",
    "ngram": "n-gram size N",
    "candidates": "number of candidates G (n-grams verified per step)",
}


@dataclass(frozen=True)
class LookaheadOptions:
    window: int | str = setting(
        AUTO,
        label="Window W",
        minimum=1,
        maximum=LIMITS["window"],
        auto=True,
        help="lookahead: Jacobi window W (default auto)",
    )
    ngram: int | str = setting(
        AUTO,
        label="N-gram size N",
        minimum=2,
        maximum=LIMITS["ngram"],
        auto=True,
        help="lookahead: n-gram size N (default auto)",
    )
    candidates: int | str = setting(
        AUTO,
        label="Candidates G",
        minimum=1,
        maximum=LIMITS["candidates"],
        auto=True,
        help="lookahead: n-grams verified per step G (default auto)",
    )


@dataclass(frozen=True)
class LookaheadStats(DrafterStats):
    window: int = stat(label="Window W", chart=False)
    ngram: int = stat(label="N-gram size N", chart=False)
    max_candidates: int = stat(label="Candidates G", chart=False)
    extra_rows: int = stat(label="Window rows", chart=False)
    pool_size: int = stat(label="N-gram pool", unit="n-grams")  # from the window...
    pool_jacobi: int = stat(label="From the window", unit="n-grams")
    pool_text: int = stat(label="From the text", unit="n-grams")  # ...and from the prompt and reply
    steps: int = stat(label="Window steps", unit="steps")  # steps that ran the window
    pool_hits: int = stat(label="Steps with a hit", unit="steps")  # a candidate had a token accepted
    accepted: int = stat(label="Accepted", unit="tokens", chart=False)
    candidates: int = stat(label="Candidates in the tree", chart=False)  # in this step's tree
    nodes: int = stat(label="Tree nodes", chart=False)


def check_parameters(window, ngram, candidates) -> tuple[int | None, int | None, int | None]:
    """W, N and G as given (each "auto" or a whole number): ints, None for "auto"; a
    ConfigError saying which is out of range otherwise."""
    return _parameter(window, "window"), _parameter(ngram, "ngram"), _parameter(candidates, "candidates")


def _parameter(value, what: str) -> int | None:
    return auto_or_int(
        value,
        f"The lookahead {NAMES[what]}",
        MINIMUMS[what],
        LIMITS[what],
        "Use 'auto' to fit it to this machine's verify costs.",
    )


def make(target, options: LookaheadOptions, load):
    LookaheadDrafter = named("engine.drafters.lookahead:LookaheadDrafter")  # lookahead.py imports this module

    return LookaheadDrafter(target, window=options.window, ngram=options.ngram, candidates=options.candidates)


def preflight(ctx, options: LookaheadOptions) -> list:
    """Lookahead needs no model; W, N and G are each auto or within the engine's limits."""
    from engine.errors import SpecDeckError
    from engine.models.doctor import Finding

    findings = [
        Finding(
            "ok",
            "Lookahead decoding needs no draft model",
            "Each step the target also guesses W tokens ahead (the window, refined a little every step), "
            "collects the runs of N tokens those guesses form, and checks up to G of them that continue the text, "
            "all in the same forward pass. auto fits each to how much a wider forward costs on this machine.",
        )
    ]
    for letter, what in (("W", "window"), ("N", "ngram"), ("G", "candidates")):
        try:
            _parameter(getattr(options, what), what)
        except SpecDeckError as e:
            findings.append(Finding("error", f"Lookahead {letter} is out of range", str(e)))
    return findings


DRAFTER = DrafterSpec(
    name="lookahead",
    label="Lookahead decoding",
    choice_label="Lookahead decoding (no model)",
    summary="The target guesses ahead itself (a Jacobi window) and verifies n-grams it has seen.",
    options=LookaheadOptions,
    needs=(TreeForward,),
    make=make,
    preflight=preflight,
    stats=LookaheadStats,
    # needs_torch is False: llama.cpp runs the mask through sequence ids (engine/backends/llama_tree.py),
    # but not for a model with recurrent layers, which the drafter refuses when it is made.
    trees=True,
    order=80,
    short_name="lookahead decoding",
)
