"""llama-server's per-request speculative options, on the pieces that carry them out (no server, no model).

n_max caps the draft, n_min is the shortest draft a step asks for and the shortest
chain draft it verifies, p_min cuts a draft at its first unlikely token; each
request gets its own draft length and, where asked, its own drafter, and a request
that asks for what its drafter cannot do is told which drafter can.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig
from engine.core.draft_bounds import DraftBounds
from engine.core.draft_length import CostModel, DraftLength
from engine.core.feeds import fit_draft
from engine.drafters.base import ChainDraft, ExtraRows, TreeDraft
from engine.errors import ConfigError
from engine.service.openai_api import ChatRequest, SpecDeckOptions
from engine.service.routes_openai import _drafting
from engine.service.server import BadRequest

FLAT = CostModel(verify_s={1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 33: 1.0})  # verifying is free: drafting pays
LINEAR = CostModel(verify_s={n: float(n) for n in (1, 2, 4, 8, 16, 33)})  # no parallelism: drafting never pays


def bounded(k, k_max: int = 16, **bounds) -> DraftLength:
    return DraftLength(k, k_max, bounds=DraftBounds(**bounds))


def test_n_max_caps_a_fixed_k_and_automatic_k():
    assert bounded(6, n_max=2).choose(FLAT) == 2
    automatic = bounded("auto", n_max=3)
    assert automatic.k_max == 3 and 1 <= automatic.choose(FLAT) <= 3
    assert bounded(6).choose(FLAT) == 6  # no options: the engine's k


def test_n_min_raises_a_draft_but_does_not_force_drafting_that_does_not_pay():
    assert bounded(2, n_min=5).choose(FLAT) == 5
    assert bounded(2, n_min=5, n_max=4).choose(FLAT) == 4  # clamped to n_max, as llama-server
    assert bounded("auto", n_min=4).choose(LINEAR) == 0
    with pytest.raises(ConfigError, match="draft length"):
        bounded("often", n_max=3)  # the engine's own message for a bad k


def chain(tokens, q=None, q_token=None) -> ChainDraft:
    return ChainDraft(tokens=tokens, q=q, q_token=q_token)


def test_p_min_cuts_a_draft_at_its_first_unlikely_token_where_it_is_fitted_to_k():
    draft = chain([5, 6, 7, 8], torch.eye(4), (0.9, 0.8, 0.3, 0.95))
    cut = fit_draft(draft, 4, True, bounds=DraftBounds(p_min=0.5))
    assert cut.tokens == [5, 6] and torch.equal(cut.q, torch.eye(4)[:2]) and cut.q_token == (0.9, 0.8)
    assert fit_draft(draft, 4, True, bounds=DraftBounds(p_min=0.95)).tokens == []  # not even the first
    assert fit_draft(draft, 4, True, bounds=DraftBounds(p_min=0.2)) is draft  # nothing below 0.2
    assert fit_draft(draft, 4, True) is draft  # no bounds: the draft as it came


def test_n_min_drops_a_shorter_chain_draft_but_never_a_tree_or_a_window():
    short = chain([5, 6], q_token=(0.9, 0.9))
    assert fit_draft(short, 3, True, bounds=DraftBounds(n_min=3)).tokens == []
    assert fit_draft(short, 3, True, bounds=DraftBounds(n_min=2)).tokens == [5, 6]
    tree = TreeDraft([5, 6], parents=(-1, -1))
    assert fit_draft(tree, 3, True, bounds=DraftBounds(n_min=3)).tokens == [5, 6]
    window = ChainDraft([5, 6], extra=ExtraRows((9,), (1,)))
    assert fit_draft(window, 3, True, bounds=DraftBounds(n_min=3)).tokens == [5, 6]


def test_the_bounds_reach_the_step_and_cut_what_the_target_verifies():
    """A fixed k of 4 from a drafter that drafts 2: n_min 3 makes every step plain, as llama-server."""
    from engine.core.decode import decode_steps
    from engine.core.sampling import SamplingConfig
    from tests.factories.fake import MarkovBackend, MarkovDrafter, cycle_transition

    transition = cycle_transition(8)

    class Two(MarkovDrafter):
        def propose(self, context, k, sampling, generator):
            return super().propose(context, min(k, 2), sampling, generator)

    def run(**bounds):
        steps = decode_steps(
            MarkovBackend(transition),
            [0, 1],
            SamplingConfig(max_tokens=12),
            drafter=Two(transition),
            draft_length=bounded(4, **bounds),
        )
        return [(step.k, step.drafted) for step in steps]

    assert {drafted for _, drafted in run()} == {2}
    assert {drafted for _, drafted in run(n_min=3)} == {0}  # asked for 3 or more, found 2: not verified
    assert {k for k, _ in run(n_max=1)} == {1}


def _engine(drafter: str = "ngram"):
    return SimpleNamespace(config=EngineConfig(drafter=drafter), drafter=None if drafter == "none" else object())


def _request(**fields) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}], **fields})


def test_a_request_plans_its_own_drafter_and_bounds():
    plan = _drafting(_engine(), _request(**{"speculative.n_max": 2, "speculative.n_min": 5}), SpecDeckOptions())
    assert (plan.drafter, plan.own, plan.bounds) == ("ngram", True, DraftBounds(n_min=2, n_max=2))  # clamped
    assert _drafting(_engine(), _request(**{"speculative.n_max": 0}), SpecDeckOptions()).drafter is None
    assert _drafting(_engine(), _request(), SpecDeckOptions(drafter="none")).drafter is None
    assert _drafting(_engine("none"), _request(), SpecDeckOptions()).drafter is None  # nothing loaded to draft with
    other = _drafting(_engine("none"), _request(), SpecDeckOptions(drafter="ngram"))
    assert (other.drafter, other.own) == ("ngram", False)  # made for this request: it loads nothing
    assert _drafting(_engine("model"), _request(**{"speculative.p_min": 0.6}), SpecDeckOptions()).bounds.p_min == 0.6
    assert plan.draft_length(EngineConfig(k=6)).choose(FLAT) == 2  # the bounds travel with the draft length


def test_a_request_is_refused_what_its_drafter_cannot_do():
    with pytest.raises(BadRequest, match=r"only the draft-model drafter \(model\) has draft probabilities"):
        _drafting(_engine(), _request(**{"speculative.p_min": 0.5}), SpecDeckOptions())
    for name in ("model", "medusa", "eagle"):
        with pytest.raises(BadRequest, match=f"the {name} drafter loads a model of its own.*--drafter {name}"):
            _drafting(_engine(), _request(), SpecDeckOptions(drafter=name))
    with pytest.raises(ConfigError, match="Unknown drafter 'nope'"):
        _drafting(_engine(), _request(), SpecDeckOptions(drafter="nope"))
