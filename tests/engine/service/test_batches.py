"""Steps on the wire in batches (engine/service/batches.py): fewer wake-ups, nothing lost, nothing late."""

from __future__ import annotations

import json
import math

import pytest

from engine.service import wire
from engine.service.batches import BATCH_S, CPU_BATCH_S, Batches, batch_interval

from .conftest import Raw


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_step_goes_at_once_then_a_batch_per_interval_and_the_last_with_its_step():
    clock, sent = Clock(), []
    with Batches(sent.append, interval_s=0.1, clock=clock) as send:
        send("a")  # the reply's first step: shown without waiting
        assert sent == [["a"]]
        clock.now += 0.03
        send("b")
        clock.now += 0.03
        send("c")
        assert len(sent) == 1  # held: the interval has not passed
        clock.now += 0.05
        send("d")  # 0.11 s since the last batch
        assert sent[-1] == ["b", "c", "d"]
        clock.now += 0.01
        send("e", last=True)  # the step that ends the run is not held back
        assert sent[-1] == ["e"]
    assert len(sent) == 3


def test_steps_held_when_the_run_fails_are_sent_before_the_error():
    sent = []
    with pytest.raises(RuntimeError):
        with Batches(sent.append, interval_s=10.0, clock=Clock()) as send:
            send("a")
            send("b")
            raise RuntimeError("the engine failed after b")
    assert sent == [["a"], ["b"]]


def sse_events(body: bytes) -> list[dict]:
    data = [line[len(b"data: ") :] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert data[-1] == b"[DONE]"
    return [json.loads(item) for item in data[:-1]]


def test_a_streamed_reply_comes_in_batches_that_hold_every_step_in_order(server):
    status, _, body = Raw(server.url, server.key).request(
        "POST",
        "/specdeck/generate",
        {
            "messages": [{"role": "user", "content": "Count from one to thirty in words."}],
            "sampling": {"temperature": 0, "max_tokens": 48},
        },
    )
    assert status == 200
    events = sse_events(body)
    assert all(set(event) == {"steps"} for event in events)
    assert len(events[0]["steps"]) == 1  # the first step at once: the time to the first token is not held
    steps = [wire.step_from_dict(item) for event in events for item in event["steps"]]
    assert [step.index for step in steps] == list(range(len(steps)))
    assert steps[-1].finish_reason is not None
    # Every token counted, the unshown ones that ended the reply too (an end token, a stop string's).
    assert sum(len(step.tokens) + step.ended_with for step in steps) == steps[-1].stats.tokens
    # At most one batch per interval of the run's own decoding time, besides the first and the last.
    assert len(events) <= 2 + math.ceil(steps[-1].stats.wall_s / BATCH_S)


def test_a_reply_decoded_on_the_cpu_goes_out_four_times_a_second(server):
    """Each batch wakes the server's event loop and the client's reader, on the cores that decode."""
    raw = Raw(server.url, server.key)
    device = json.loads(raw.request("GET", "/specdeck/info")[2])["loaded"]["target"]["device"]
    assert device.startswith("cpu")  # this suite's server decodes on this machine's cores
    status, _, body = raw.request(
        "POST",
        "/specdeck/generate",
        {
            "messages": [{"role": "user", "content": "Write a story about a lighthouse keeper."}],
            "sampling": {"temperature": 0, "max_tokens": 160},
        },
    )
    events = sse_events(body)
    steps = [wire.step_from_dict(item) for event in events for item in event["steps"]]
    assert sum(len(step.tokens) + step.ended_with for step in steps) == steps[-1].stats.tokens  # all, in fewer events
    assert len(events) <= 2 + math.ceil(steps[-1].stats.wall_s / CPU_BATCH_S)  # at 10 a second: 2 + 2.5x that


def test_steps_go_ten_times_a_second_from_a_gpu_and_four_from_the_cpu():
    assert batch_interval("cuda") == batch_interval("mps") == BATCH_S
    assert batch_interval("cpu") == batch_interval("cpu+12 gpu layers") == CPU_BATCH_S
