"""One generation's own drafter and draft bounds, judged from the drafter's spec.

A front end may ask, for one generation, for another drafter than the engine's and for
draft bounds (engine/core/draft_bounds.py); llama-server's speculative.* fields and
SpecDeck's "specdeck": {"drafter": NAME} are such asks (engine/service/routes_openai.py
translates them). The rules, for every front end:

    drafter "none", or n_max = 0     plain decoding
    the loaded drafter's name        the loaded drafter (plainly when none is loaded)
    another registered drafter       made for this generation and closed after it, only when it loads
                                     nothing (no draft model, no heads): `NotPerRequest` otherwise
    p_min > 0                        only for a drafter whose drafts carry q (DrafterSpec.draft_probabilities):
                                     `NoDraftProbabilities` otherwise

The engine never changes: each generation gets its own DraftLength and, where asked,
its own drafter, so one generation's asks cannot leak into the next.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.draft_bounds import NO_BOUNDS, DraftBounds
from engine.drafters.base import share_costs
from engine.drafters.registry import DrafterSpec, drafter_names, drafter_spec, make_drafter
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.api import Engine
    from engine.config import EngineConfig
    from engine.core.draft_length import DraftLength
    from engine.drafters.base import Drafter


class NotPerRequest(ConfigError):
    """The drafter asked for loads a model of its own, so it is not made for one generation."""

    def __init__(self, name: str, loaded: str, per_request: tuple[str, ...]) -> None:
        self.name, self.loaded, self.per_request = name, loaded, per_request
        super().__init__(
            f"the {name} drafter loads a model of its own, so it cannot be chosen per request: load it on the "
            f"server (specdeck-cli serve --drafter {name} ..., or POST /specdeck/load). This server has {loaded} "
            f"loaded; per request it can also use {', '.join(per_request)} or none."
        )


class NoDraftProbabilities(ConfigError):
    """A least draft probability (p_min) asked of a drafter whose drafts carry no q."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"'speculative.p_min' is a minimum draft probability, and only the draft-model drafter (model) has "
            f"draft probabilities; the {name} drafter does not. Send 0, or leave it out."
        )


def made_per_request(spec: DrafterSpec) -> bool:
    """No draft model and no weights of its own (heads, MTP layers, an assistant): cheap enough to make
    for one generation, and nothing a request asks for makes the server read model files."""
    return not (spec.loads_model or spec.reads_weights)


@dataclass(frozen=True)
class RequestDrafting:
    """How one generation drafts: with which drafter (None: plainly), and within which bounds."""

    drafter: str | None  # a registry name; None: plain decoding
    own: bool  # the engine's loaded drafter (else one made for this generation)
    bounds: DraftBounds = NO_BOUNDS

    def draft_length(self, config: EngineConfig) -> DraftLength:
        from engine.core.draft_length import DraftLength

        return DraftLength(config.k, config.k_max, bounds=self.bounds)

    @contextlib.contextmanager
    def drafter_for(self, engine: Engine) -> Iterator[Drafter | None]:
        """The drafter to generate with (None: plainly); one made for this generation is closed after it."""
        if self.drafter is None or self.own:
            yield None if self.drafter is None else engine.drafter
            return
        drafter = make_drafter(engine.target, engine.config.with_drafter(self.drafter))
        share_costs(drafter, engine.costs)
        try:
            yield drafter
        finally:
            if drafter is not None:
                drafter.close()


def request_drafting(
    config: EngineConfig, loaded: Drafter | None, name: str | None = None, bounds: DraftBounds = NO_BOUNDS
) -> RequestDrafting:
    """What a generation that asks for drafter `name` (None: the loaded one's) and `bounds` gets, on an
    engine with `config` and the `loaded` drafter; ConfigError (NotPerRequest, NoDraftProbabilities,
    the registry's for an unknown name) for what it cannot have."""
    name = name or config.drafter
    if name == "none" or bounds.n_max == 0:
        return RequestDrafting(None, False, bounds)
    own = name == config.drafter
    if own and loaded is None:
        return RequestDrafting(None, False, bounds)
    spec = drafter_spec(name)  # an unknown name: the registry's ConfigError lists the drafters
    if not own and not made_per_request(spec):
        others = tuple(
            n for n in drafter_names() if n not in ("none", config.drafter) and made_per_request(drafter_spec(n))
        )
        raise NotPerRequest(name, config.drafter, others)
    if bounds.p_min > 0 and not spec.draft_probabilities:
        raise NoDraftProbabilities(name)
    return RequestDrafting(name, own, bounds)
