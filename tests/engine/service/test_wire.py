"""The wire's JSON (engine/service/wire.py): what the standard library reads as the same values, exactly."""

from __future__ import annotations

import dataclasses
import http.server
import json
import math
import threading

import numpy as np
import pytest

from engine.core.costs import CostSnapshot, break_even_acceptance
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from engine.service import wire
from engine.service.client import EngineClient, EngineUnavailable


def a_step(p: float = 0.1 + 0.2) -> StepEvent:
    token = TokenInfo(
        id=9318,
        text=" stood\u00e9",
        source=Source.ACCEPTED,
        p=p,
        q=1 / 3,
        top_ids=(9318, 19529),
        top_logits=(15.909194946289062, 14.382877349853516),
    )
    stats = RunStats(
        steps=41,
        tokens=42,
        drafted=6,
        accepted=1,
        tested=4,
        wall_s=1.056468948000031,
        predicted_speedup=0.8889322115701908,
        depth_tested=(3, 1),
        depth_accepted=(1, 0),
        notes=("a note",),
    )
    return StepEvent(
        index=40,
        tokens=(token,),
        text=token.text,
        k=3,
        drafted=3,
        accepted=1,
        draft_s=1.03049999893301e-05,
        verify_s=0.03116016699999591,
        other_s=4.77e-4,
        stats=stats,
        finish_reason="stop_string",
        stop_tokens=(TokenInfo(id=2, text="END", source=Source.BONUS, p=0.5, q=None),),
    )


def test_a_step_reads_back_equal_here_and_in_any_json_reader():
    item = {"run": "speculative", "step": wire.step_to_dict(a_step()), "drafter_stats": {"hits": 3}}
    encoded = wire.dumps(item)
    assert json.loads(encoded) == item  # the standard library (and so an OpenAI client) reads the same values
    assert wire.step_from_dict(wire.loads(encoded)["step"]) == a_step()  # every float exactly, the stop's tokens too


def test_a_batch_is_the_event_its_items_make():
    items = [{"step": 1}, {"step": 2, "x": [0.5]}]
    batch = wire.batch([wire.dumps(item) for item in items])
    assert wire.loads(batch) == {"steps": items}


def test_numpy_numbers_and_big_integers_are_written_too():
    assert wire.loads(wire.dumps({"a": np.float64(0.25), "b": np.int64(7), "c": np.float32(1.5)})) == {
        "a": 0.25,
        "b": 7,
        "c": 1.5,
    }
    assert wire.loads(wire.dumps({"big": 2**70})) == {"big": 2**70}


def test_a_token_whose_probability_is_not_a_number_arrives_as_not_a_number():
    data = wire.loads(wire.dumps(wire.step_to_dict(a_step(p=float("nan")))))
    assert data["tokens"][0]["p"] is None  # JSON has no NaN
    assert math.isnan(wire.step_from_dict(data).tokens[0].p)


def a_record() -> StepEvent:
    """A step as the engine records it for a reader elsewhere: its run, the drafter's statistics, the costs."""
    from engine.core.draft_length import CostModel
    from engine.drafters.early_exit_spec import EarlyExitStats, ExitCandidate

    costs = CostModel(verify_s={1: 0.0101, 2: 0.0123, 4: 0.0152, 8: 0.0211}, draft_s_per_token=0.0031)
    costs.draft_fixed_s = 0.0007
    candidates = (ExitCandidate(6, 0.71, 12.5, 30, 2.25, 0.19, 1.62), ExitCandidate(9, None, 0.0, 0, None, 0.3, 1.0))
    stats = EarlyExitStats(exit_layer=6, n_layers=30, layers="auto", candidates=candidates)
    return dataclasses.replace(a_step(), run="speculative", drafter_stats=stats, costs=costs.snapshot())


def test_a_record_crosses_the_wire_as_itself_its_statistics_tagged_with_their_drafter():
    record = a_record()
    data = wire.loads(wire.dumps(wire.step_to_dict(record)))
    assert data["run"] == "speculative"
    assert data["drafter_stats"]["drafter"] == "early-exit"  # whose they are, not guessed from the field names
    assert data["drafter_stats"]["candidates"][0]["layer"] == 6
    back = wire.step_from_dict(data)
    assert back == record  # the same record: the statistics' type and nested records, the cost snapshot
    assert type(back.drafter_stats) is type(record.drafter_stats)
    assert type(back.drafter_stats.candidates[0]) is type(record.drafter_stats.candidates[0])
    assert isinstance(back.costs, CostSnapshot)
    # The charts' formulas give what the engine's own model gave, the draft's fixed cost included.
    assert back.costs.speedup(0.8, 4) == record.costs.speedup(0.8, 4)
    assert back.costs.verify_time(3) == record.costs.verify_time(3)
    assert break_even_acceptance(back.costs, 4) == break_even_acceptance(record.costs, 4)


def test_a_chain_s_and_a_plain_run_s_steps_read_back_as_they_were():
    from engine.drafters.chain_spec import ChainStats

    stats = ChainStats(drafted_by=2, members=("suffix", "model"), steps=(40, 12), accepted=(312, 30))
    chain = dataclasses.replace(a_step(), run="speculative", drafter_stats=stats)
    data = wire.loads(wire.dumps(wire.step_to_dict(chain)))
    assert data["drafter_stats"]["drafter"] == "chain"
    assert wire.step_from_dict(data) == chain
    plain = dataclasses.replace(a_step(), run="vanilla")
    assert wire.step_from_dict(wire.loads(wire.dumps(wire.step_to_dict(plain)))) == plain


def test_each_step_reads_back_the_costs_it_carried_when_they_change_from_step_to_step():
    from engine.core.draft_length import CostModel

    model = CostModel(verify_s={1: 0.010, 2: 0.012})
    records = []
    for seconds in (0.011, 0.011, 0.030):  # a low median: the third timing leaves the costs as they were
        model.observe_verify(1, seconds)
        records.append(dataclasses.replace(a_step(), costs=model.snapshot()))
    back = [wire.step_from_dict(wire.loads(wire.dumps(wire.step_to_dict(r)))) for r in records]
    assert [b.costs for b in back] == [r.costs for r in records]
    assert back[0].costs.verify_time(1) == 0.010 and back[2].costs.verify_time(1) == 0.011  # the low median


def test_statistics_of_no_registered_drafter_are_left_out_rather_than_guessed():
    odd = dataclasses.replace(a_step(), drafter_stats={"hits": 3})  # a plain dict: whose is it?
    assert wire.step_to_dict(odd)["drafter_stats"] is None
    assert wire.step_to_dict(odd)["drafter_stats"] is None  # the second time from what the first found
    assert wire.drafter_stats_from_dict({"drafter": "no-such-drafter", "hits": 3}) is None


def test_a_client_refuses_a_server_that_sends_steps_in_the_old_shape():
    """Version 1 sent {"run", "step", "drafter_stats", "costs"} items: read as steps, nothing would fit."""

    class OldServer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            body = json.dumps({"wire_version": 1, "status": "idle", "loaded": None}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), OldServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EngineUnavailable, match="speaks wire version 1, this SpecDeck 2"):
            EngineClient(f"http://127.0.0.1:{server.server_address[1]}").loaded()
    finally:
        server.shutdown()
        server.server_close()
