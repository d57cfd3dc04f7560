"""One generation's own drafter and bounds, judged by the engine from the drafter's spec (no server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.config import EngineConfig
from engine.core.draft_bounds import DraftBounds
from engine.core.draft_length import CostModel
from engine.drafters.per_request import NoDraftProbabilities, NotPerRequest, request_drafting
from engine.drafters.suffix import SuffixDrafter


def test_p_min_is_judged_from_the_spec_not_from_a_list_of_names():
    with_q = request_drafting(EngineConfig(drafter="model"), object(), None, DraftBounds(p_min=0.5))
    assert (with_q.drafter, with_q.own, with_q.bounds.p_min) == ("model", True, 0.5)
    chained = request_drafting(EngineConfig(drafter="suffix+model"), object(), None, DraftBounds(p_min=0.5))
    assert chained.drafter == "suffix+model"  # its model member's drafts carry q
    with pytest.raises(NoDraftProbabilities, match="the suffix drafter does not"):
        request_drafting(EngineConfig(drafter="suffix"), object(), None, DraftBounds(p_min=0.5))


def test_a_drafter_that_loads_a_model_is_never_made_for_one_generation():
    with pytest.raises(NotPerRequest) as refused:
        request_drafting(EngineConfig(drafter="ngram"), object(), "eagle")
    assert refused.value.loaded == "ngram" and "suffix" in refused.value.per_request
    assert "eagle" not in refused.value.per_request and "model" not in refused.value.per_request


@pytest.mark.parametrize("name", ["mtp", "assistant", "suffix+medusa"])
def test_a_request_never_makes_the_server_read_weights_of_a_drafter(name):
    """MTP layers and a Gemma 4 assistant are weights read from files, as heads are: a request that
    asks for one (or for a chain holding one) is refused, not served by loading them per request."""
    with pytest.raises(NotPerRequest) as refused:
        request_drafting(EngineConfig(drafter="ngram"), object(), name)
    assert not {"mtp", "assistant", "medusa", "eagle", "eagle3"} & set(refused.value.per_request)
    assert {"suffix", "lookahead"} <= set(refused.value.per_request)


def test_a_drafter_made_for_one_generation_shares_the_engine_costs_and_is_closed_after_it():
    from engine.core.draft_length import DraftLength

    engine = SimpleNamespace(
        target=SimpleNamespace(name="llama.cpp", capabilities=frozenset()),
        config=EngineConfig(drafter="ngram", k=6),
        drafter=object(),
        costs=CostModel(),
    )
    drafting = request_drafting(engine.config, engine.drafter, "suffix", DraftBounds(n_max=3))
    assert not drafting.own
    with drafting.drafter_for(engine) as drafter:
        assert isinstance(drafter, SuffixDrafter) and drafter is not engine.drafter
        drafter.history.add([1, 2, 3])
        assert drafter.history.tokens == 3
    assert drafter.history.tokens == 0  # closed: what it kept is gone
    length = drafting.draft_length(engine.config)
    assert isinstance(length, DraftLength) and length.fixed == 3  # k = 6, capped at n_max
