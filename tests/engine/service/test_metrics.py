"""/metrics: Prometheus' text format with vLLM's names, grown by exactly what each generation did.

A reply's draft tokens, accepted tokens (per draft position), prompt and reply tokens
are what the counters gain, whichever route made it: the OpenAI routes, and the app's
/specdeck/generate and /specdeck/compare.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from engine import SamplingConfig
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from engine.service import wire
from engine.service.client import EngineClient
from engine.service.metrics import Metrics

MESSAGES = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat"}]
P = "specdeck:"


def _step(index: int, drafted: int, accepted: int, tokens: int, finish: str | None = None) -> StepEvent:
    token = TokenInfo(1, "a", Source.PLAIN, 0.5, None)
    return StepEvent(
        index, (token,) * tokens, "a" * tokens, drafted, drafted, accepted, 0.0, 0.0, 0.0, RunStats(), finish
    )


def test_the_counters_follow_the_steps_and_read_as_prometheus_text():
    metrics = Metrics()
    for step in (_step(0, 3, 2, 3), _step(1, 0, 0, 1), _step(2, 4, 4, 5), _step(3, 2, 0, 1, finish="length")):
        metrics.observe(step, prompt_tokens=12)
    text = metrics.render(running=1, waiting=2)
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert samples[f"{P}spec_decode_num_drafts_total"] == "3"
    assert samples[f"{P}spec_decode_num_draft_tokens_total"] == "9"
    assert samples[f"{P}spec_decode_num_accepted_tokens_total"] == "6"
    per_position = [samples[f'{P}spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] for i in range(4)]
    assert per_position == ["2", "2", "1", "1"]  # 2 steps accepted a first draft token, 2 a second, 1 a third...
    assert samples[f"{P}prompt_tokens_total"] == "12" and samples[f"{P}generation_tokens_total"] == "10"
    assert samples[f'{P}request_success_total{{finished_reason="length"}}'] == "1"
    assert samples[f"{P}num_requests_running"] == "1" and samples[f"{P}num_requests_waiting"] == "2"
    for family in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        name, kind = family
        assert name.startswith(P) and kind in ("counter", "gauge", "histogram")
        assert name.endswith("_total") == (kind == "counter")


def test_the_batch_size_histogram_counts_the_steps_that_ran_a_forward():
    metrics = Metrics()
    ran = [dataclasses.replace(_step(i, 0, 0, 1), verify_s=0.01, batch=b) for i, b in enumerate((1, 3, 3, 2))]
    cancelled = _step(4, 0, 0, 0, finish="cancelled")  # ended before its forward: no batch size
    for step in (*ran, cancelled):
        metrics.observe(step, prompt_tokens=5)
    samples = dict(line.rsplit(" ", 1) for line in metrics.render(0, 0).splitlines() if not line.startswith("#"))
    buckets = [samples[f'{P}step_batch_size_bucket{{le="{bound}"}}'] for bound in (1, 2, 4, 64, "+Inf")]
    assert buckets == ["1", "2", "4", "4", "4"]  # cumulative, as Prometheus reads a histogram
    assert samples[f"{P}step_batch_size_sum"] == "9" and samples[f"{P}step_batch_size_count"] == "4"


def _deltas(before: dict, after: dict) -> dict:
    return {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}


@pytest.mark.slow
def test_an_openai_reply_adds_its_own_numbers(raw, openai_client):
    before = raw.metrics()
    reply = openai_client.chat.completions.create(
        model="any", messages=MESSAGES, temperature=0, max_tokens=16, extra_body={"specdeck": {"events": True}}
    )
    after = raw.metrics()
    steps = [wire.step_from_dict(item["step"]) for item in reply.model_extra["specdeck"]]
    timings, usage = reply.model_extra["timings"], reply.usage
    grown = _deltas(before, after)
    assert grown[f"{P}spec_decode_num_draft_tokens_total"] == timings["draft_n"] > 0
    assert grown.get(f"{P}spec_decode_num_accepted_tokens_total", 0) == timings["draft_n_accepted"]
    assert grown[f"{P}spec_decode_num_drafts_total"] == sum(1 for s in steps if s.drafted)
    assert grown[f"{P}prompt_tokens_total"] == usage.prompt_tokens
    assert grown[f"{P}generation_tokens_total"] == usage.completion_tokens
    engine_reason = steps[-1].finish_reason
    assert grown[f'{P}request_success_total{{finished_reason="{engine_reason}"}}'] == 1
    for position in range(max(s.accepted for s in steps)):
        name = f'{P}spec_decode_num_accepted_tokens_per_pos_total{{position="{position}"}}'
        assert grown[name] == sum(1 for s in steps if s.accepted > position)
    assert after[f"{P}num_requests_running"] == 0 and after[f"{P}num_requests_waiting"] == 0


@pytest.mark.slow
def test_the_apps_routes_are_counted_too(raw, server):
    client = EngineClient(server.url, api_key=server.key)
    before = raw.metrics()
    result = client.generate(MESSAGES, SamplingConfig(max_tokens=8))
    comparison = client.compare(MESSAGES, SamplingConfig(max_tokens=8))
    grown = _deltas(before, raw.metrics())
    runs = (result, comparison.vanilla, comparison.speculative)
    assert grown[f"{P}generation_tokens_total"] == sum(len(r.tokens) for r in runs)
    assert grown[f"{P}spec_decode_num_draft_tokens_total"] == sum(r.stats.drafted for r in runs)
    assert sum(v for name, v in grown.items() if name.startswith(f"{P}request_success_total")) == 3
