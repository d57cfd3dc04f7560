"""llama-server's per-request speculative options, on the pieces that carry them out (no server, no model).

n_max caps the draft, n_min is the shortest draft a step asks for and the shortest
chain draft it verifies, p_min cuts a draft at its first unlikely token; each
request gets its own draft length and, where asked, its own drafter, and a request
that asks for what its drafter cannot do is told which drafter can.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.config import EngineConfig
from engine.core.draft_length import CostModel
from engine.drafters.base import Draft, Drafter
from engine.errors import ConfigError
from engine.service.openai_api import ChatRequest, SpecDeckOptions
from engine.service.routes_openai import BoundedDrafter, RequestDraftLength, _plan
from engine.service.server import BadRequest

FLAT = CostModel(verify_s={1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 33: 1.0})  # verifying is free: drafting pays
LINEAR = CostModel(verify_s={n: float(n) for n in (1, 2, 4, 8, 16, 33)})  # no parallelism: drafting never pays


def test_n_max_caps_a_fixed_k_and_automatic_k():
    assert RequestDraftLength(6, 16, n_max=2).choose(FLAT) == 2
    automatic = RequestDraftLength("auto", 16, n_max=3)
    assert automatic.k_max == 3 and 1 <= automatic.choose(FLAT) <= 3
    assert RequestDraftLength(6, 16).choose(FLAT) == 6  # no options: the engine's k


def test_n_min_raises_a_draft_but_does_not_force_drafting_that_does_not_pay():
    assert RequestDraftLength(2, 16, n_min=5).choose(FLAT) == 5
    assert RequestDraftLength(2, 16, n_min=5, n_max=4).choose(FLAT) == 4  # clamped to n_max, as llama-server
    assert RequestDraftLength("auto", 16, n_min=4).choose(LINEAR) == 0
    with pytest.raises(ConfigError, match="draft length"):
        RequestDraftLength("often", 16, n_max=3)  # the engine's own message for a bad k


class _Chain(Drafter):
    name = "chain"

    def __init__(self, draft: Draft) -> None:
        self.draft, self.calls = draft, []

    def propose(self, context, k, sampling, generator) -> Draft:
        return self.draft

    def observe(self, drafted, accepted) -> None:
        self.calls.append(("observe", drafted, accepted))

    def reset(self) -> None:
        self.calls.append(("reset",))

    def close(self) -> None:
        self.calls.append(("close",))


def test_p_min_cuts_a_draft_at_its_first_unlikely_token():
    inner = _Chain(Draft(tokens=[5, 6, 7, 8], q=["q5", "q6", "q7", "q8"], q_token=(0.9, 0.8, 0.3, 0.95)))
    draft = BoundedDrafter(inner, p_min=0.5).propose([1, 2], 4, None, None)
    assert draft.tokens == [5, 6] and draft.q == ["q5", "q6"] and draft.q_token == (0.9, 0.8)
    assert BoundedDrafter(inner, p_min=0.95).propose([1], 4, None, None).tokens == []  # not even the first
    assert BoundedDrafter(inner, p_min=0.2).propose([1], 4, None, None) is inner.draft  # nothing below 0.2


def test_n_min_drops_a_shorter_chain_draft_but_never_a_tree():
    short = _Chain(Draft(tokens=[5, 6], q_token=(0.9, 0.9)))
    assert BoundedDrafter(short, n_min=3).propose([1], 3, None, None).tokens == []
    assert BoundedDrafter(short, n_min=2).propose([1], 3, None, None).tokens == [5, 6]
    tree = _Chain(Draft(tokens=[5, 6], parents=(-1, -1)))
    assert BoundedDrafter(tree, n_min=3).propose([1], 3, None, None).tokens == [5, 6]


def test_the_bounded_drafter_is_the_wrapped_one_for_everything_else():
    inner = _Chain(Draft(tokens=[5]))
    bounded = BoundedDrafter(inner, n_min=1)
    bounded.costs = "the cost model"
    bounded.reset()
    bounded.observe(3, 1)
    bounded.close()
    assert inner.costs == "the cost model" and bounded.name == "chain"
    assert inner.calls == [("reset",), ("observe", 3, 1), ("close",)]


def _engine(drafter: str = "ngram"):
    return SimpleNamespace(config=EngineConfig(drafter=drafter), drafter=None if drafter == "none" else object())


def _request(**fields) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}], **fields})


def test_a_request_plans_its_own_drafter_and_bounds():
    plan = _plan(_engine(), _request(**{"speculative.n_max": 2, "speculative.n_min": 5}), SpecDeckOptions())
    assert (plan.drafter, plan.own, plan.n_max, plan.n_min) == ("ngram", True, 2, 2)  # n_min clamped to n_max
    assert _plan(_engine(), _request(**{"speculative.n_max": 0}), SpecDeckOptions()).drafter is None
    assert _plan(_engine(), _request(), SpecDeckOptions(drafter="none")).drafter is None
    assert _plan(_engine("none"), _request(), SpecDeckOptions()).drafter is None  # nothing loaded to draft with
    other = _plan(_engine("none"), _request(), SpecDeckOptions(drafter="ngram"))
    assert (other.drafter, other.own) == ("ngram", False)  # made for this request: it loads nothing
    assert _plan(_engine("model"), _request(**{"speculative.p_min": 0.6}), SpecDeckOptions()).p_min == 0.6


def test_a_request_is_refused_what_its_drafter_cannot_do():
    with pytest.raises(BadRequest, match=r"only the draft-model drafter \(model\) has draft probabilities"):
        _plan(_engine(), _request(**{"speculative.p_min": 0.5}), SpecDeckOptions())
    for name in ("model", "medusa", "eagle"):
        with pytest.raises(BadRequest, match=f"the {name} drafter loads a model of its own.*--drafter {name}"):
            _plan(_engine(), _request(), SpecDeckOptions(drafter=name))
    with pytest.raises(ConfigError, match="Unknown drafter 'nope'"):
        _plan(_engine(), _request(), SpecDeckOptions(drafter="nope"))
