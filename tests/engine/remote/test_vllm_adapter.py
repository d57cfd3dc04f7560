"""The vLLM adapter against a real HTTP server that answers as `vllm serve` does (vLLM 0.32).

Shapes, and where they come from:
- /v1/models: a ModelList of ModelCards (`id`, `object`, `created`, `owned_by` "vllm", `root`, `parent`,
  `max_model_len`, `permission`): vllm/entrypoints/openai/protocol.py, `ModelCard`.
- /inference/v1/config: `speculative_decoding` {enabled, method, num_speculative_tokens, draft_model} and
  `model.max_model_len`: vllm/entrypoints/serve/config/api_router.py, `_build_response`.
- The chat stream with stream_options include_usage + continuous_usage_stats: a first chunk with the
  role and `usage.completion_tokens` 0, one chunk per engine step with the running usage, the finish
  reason on the last content chunk, then a chunk of no choices with the totals (and, with
  --per-request-spec-decode-metrics, `metrics.speculative_decoding`), then `[DONE]`:
  vllm/entrypoints/openai/chat_completion/serving.py, `chat_completion_stream_generator`, and
  docs/features/speculative_decoding/acceptance_metrics.md.
- /metrics: prometheus_client's text format; the counters of vllm/v1/spec_decode/metrics.py
  `SpecDecodingProm` with labels model_name and engine (vllm/v1/metrics/loggers.py), the per-position
  counter with `position` 0 .. k - 1, each counter followed by its `_created` gauge.
- /version: `{"version": ...}` (vllm/entrypoints/openai/api_server.py `show_version`).
- 401: `{"error": "Unauthorized"}` from vLLM's API-key middleware, which guards /v1 paths only.
"""

from __future__ import annotations

import pytest

from engine.core.events import Comparison, Source
from engine.core.sampling_config import SamplingConfig
from engine.errors import SpecDeckError
from engine.remote import open_remote
from engine.remote.http import ServerRefused, ServerUnavailable
from engine.remote.prometheus import parse
from engine.remote.vllm import CONFIG_NOTE, NO_VANILLA, NOTES, VllmEngine, spec_counts
from tests.engine.remote import FakeServer, Reply, Stream, free_port

MODEL = "Qwen/Qwen3-8B"
DRAFT = "RedHatAI/Qwen3-8B-speculator.eagle3"
K = 3
ASK = [{"role": "user", "content": "The quick brown fox?"}]
SAMPLING = SamplingConfig(max_tokens=32)
A, R, B, P = Source.ACCEPTED, Source.RESAMPLED, Source.BONUS, Source.PLAIN

# One reply as an EAGLE server with k = 3 streams it: (text, tokens the step made, drafts it accepted).
# The first token comes from the prefill; every later step verified 3 drafts.
STEPS = [("The", 1, None), (" quick brown fox", 4, 3), (" jumps over", 2, 1), (" the lazy dog", 3, 2)]
# The same words where vLLM held one step's text back: its chunk carries two steps (4 + 1 tokens).
MERGED = [("The", 1, None), (" quick brown fox", 4, 3), (" jumps over the lazy", 5, (3, 0)), (" dog.", 2, 1)]


def models() -> dict:
    return {
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": 1754000000,
                "owned_by": "vllm",
                "root": MODEL,
                "parent": None,
                "max_model_len": 32768,
                "permission": [],
            }
        ],
    }


def config() -> dict:
    return {
        "model": {
            "served_model_names": [MODEL],
            "dtype": "bfloat16",
            "quantization": None,
            "max_model_len": 32768,
            "max_logprobs": 20,
        },
        "speculative_decoding": {
            "enabled": True,
            "method": "eagle3",
            "num_speculative_tokens": K,
            "draft_model": DRAFT,
        },
    }


class Counters:
    """The server's spec-decode counters, which each reply raises as vLLM's scheduler does."""

    def __init__(self, k: int = K) -> None:
        self.k = k
        self.drafts, self.draft_tokens, self.accepted = 40, 120, 70  # earlier traffic
        self.per_pos = [30, 25, 15][:k]

    def verify(self, accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += self.k
        self.accepted += accepted
        for i in range(accepted):
            self.per_pos[i] += 1

    def text(self) -> str:
        labels = f'model_name="{MODEL}",engine="0"'
        lines = [
            "# HELP python_gc_objects_collected_total Objects collected during gc",
            "# TYPE python_gc_objects_collected_total counter",
            'python_gc_objects_collected_total{generation="0"} 5123.0',
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 0.0",
            "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            f'vllm:time_to_first_token_seconds_bucket{{le="0.001",{labels}}} 0.0',
            f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",{labels}}} 41.0',
            f"vllm:time_to_first_token_seconds_sum{{{labels}}} 3.25",
            f"vllm:time_to_first_token_seconds_count{{{labels}}} 41.0",
        ]
        for name, value, doc in (
            ("drafts", self.drafts, "Number of spec decoding drafts."),
            ("draft_tokens", self.draft_tokens, "Number of draft tokens."),
            ("accepted_tokens", self.accepted, "Number of accepted tokens."),
        ):
            lines += [
                f"# HELP vllm:spec_decode_num_{name}_total {doc}",
                f"# TYPE vllm:spec_decode_num_{name}_total counter",
                f"vllm:spec_decode_num_{name}_total{{{labels}}} {float(value)}",
                f"# HELP vllm:spec_decode_num_{name}_created {doc}",
                f"# TYPE vllm:spec_decode_num_{name}_created gauge",
                f"vllm:spec_decode_num_{name}_created{{{labels}}} 1.7540001234e+09",
            ]
        lines += [
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {float(n)}'
            for i, n in enumerate(self.per_pos)
        ]
        return "\n".join(lines) + "\n"


def chunk(delta: dict, tokens: int, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-8c1f",
        "object": "chat.completion.chunk",
        "created": 1754000100,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                **({"stop_reason": None} if finish else {}),
            }
        ],
        "usage": {"prompt_tokens": 12, "total_tokens": 12 + tokens, "completion_tokens": tokens},
    }


def stream(
    steps,
    counters: Counters | None,
    *,
    reported: dict | None = None,
    other_traffic: int = 0,
    break_after: int | None = None,
    how: str = "reset",
) -> Stream:
    """The chat stream of `steps`, raising `counters` as the steps are verified."""
    events, total = [chunk({"role": "assistant", "content": ""}, 0)], 0
    for n, (text, tokens, accepted) in enumerate(steps):
        total += tokens
        for a in accepted if isinstance(accepted, tuple) else (accepted,):
            if a is not None and counters is not None:
                counters.verify(a)
        events.append(chunk({"content": text}, total, "stop" if n == len(steps) - 1 else None))
    for _ in range(other_traffic):  # another client's steps, verified while this reply ran
        counters.verify(K)
    last = {
        "id": "chatcmpl-8c1f",
        "object": "chat.completion.chunk",
        "created": 1754000100,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 12, "total_tokens": 12 + total, "completion_tokens": total},
    }
    if reported is not None:
        last["metrics"] = {"speculative_decoding": reported}
    return Stream(events + [last], break_after, how)


def vllm_server(steps=STEPS, *, with_config=True, counters: Counters | None = None, **stream_options) -> FakeServer:
    counters = counters or Counters()
    routes = {
        "/v1/models": lambda body: Reply(body=models()),
        "/version": lambda body: Reply(body={"version": "0.32.0"}),
        "/metrics": lambda body: Reply(body=counters.text(), content_type="text/plain; version=0.0.4"),
        "/v1/chat/completions": lambda body: stream(steps, counters, **stream_options),
    }
    if with_config:
        routes["/inference/v1/config"] = lambda body: Reply(body=config())
    server = FakeServer(routes, protected=lambda path: path.startswith("/v1"))
    server.counters = counters
    return server


def vanilla_server() -> FakeServer:
    """The same model on a server without --speculative-config: no spec-decode counters, a token a step."""
    words = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog"]
    routes = {
        "/v1/models": lambda body: Reply(body=models()),
        "/metrics": lambda body: Reply(
            body="# HELP vllm:num_requests_running Number of requests.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{MODEL}",engine="0"}} 0.0\n',
            content_type="text/plain; version=0.0.4",
        ),
        "/v1/chat/completions": lambda body: stream([(w, 1, None) for w in words], None),
    }
    return FakeServer(routes)


def test_connect_describes_the_model_its_context_and_how_it_speculates():
    with vllm_server() as server:
        assert isinstance(open_remote("auto", server.url), VllmEngine)  # /version answers, /get_server_info does not
        pair = open_remote("vllm", server.url).connect()
    assert (pair.kind, pair.model, pair.n_ctx, pair.speculative) == ("vllm", MODEL, 32768, True)
    assert pair.speculation == f"eagle3, up to {K} draft tokens a step (draft {DRAFT})"
    assert pair.notes == NOTES and any("only right when no other request runs" in note for note in pair.notes)


def test_without_a_config_endpoint_speculation_is_inferred_from_the_counters():
    with vllm_server(with_config=False) as server:
        pair = VllmEngine(server.url).connect()
    assert (
        pair.speculative and pair.speculation == f"speculative decoding, up to {K} draft tokens a step (from /metrics)"
    )
    assert CONFIG_NOTE in pair.notes and "inferred from its /metrics counters" in CONFIG_NOTE


def test_a_reply_gives_its_text_steps_sources_and_the_metrics_totals():
    seen = []
    with vllm_server() as server:
        result = VllmEngine(server.url).generate(
            ASK, SAMPLING, on_steps=lambda batch: seen.extend(s.run for s in batch)
        )
        body = next(b for m, p, b in server.requests if p == "/v1/chat/completions")
    assert body["stream"] and body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert result.text == "The quick brown fox jumps over the lazy dog" and result.finish_reason == "stop"
    assert [len(step.tokens) for step in result.events] == [1, 4, 2, 3]
    assert [[t.source for t in step.tokens] for step in result.events] == [[P], [A, A, A, B], [A, R], [A, A, R]]
    stats = result.stats
    assert (stats.steps, stats.tokens, stats.drafted, stats.accepted) == (4, 10, 9, 6)
    assert stats.tokens_per_step == 2.5 and stats.notes == NOTES
    assert seen == ["speculative"] * 4  # each step told once


def test_the_per_request_counts_are_the_difference_of_two_scrapes():
    counters = Counters()
    before = parse(counters.text())
    for accepted in (3, 1, 2):
        counters.verify(accepted)
    counts = spec_counts(before, parse(counters.text()))
    assert (counts.drafts, counts.draft_tokens, counts.accepted, counts.accepted_per_pos) == (3, 9, 6, (3, 2, 1))


def test_two_steps_in_one_chunk_take_the_drafted_total_from_the_metrics():
    """Read from the chunks alone, the merged chunk is one step of 4 drafts; the counters saw two of 3."""
    with vllm_server(MERGED) as server:
        result = VllmEngine(server.url).generate(ASK, SAMPLING)
    assert [len(step.tokens) for step in result.events] == [1, 4, 5, 2]
    assert result.stats.drafted == 12  # 4 verify steps of 3 drafts, from the metrics difference


def test_two_steps_in_one_chunk_take_the_accepted_total_from_the_metrics():
    with vllm_server(MERGED) as server:
        result = VllmEngine(server.url).generate(ASK, SAMPLING)
    assert result.stats.accepted == 7


def test_the_replys_own_counts_win_over_a_busy_servers_metrics():
    """--per-request-spec-decode-metrics summary: another client's 5 steps raise /metrics meanwhile."""
    reported = {
        "mean_acceptance_length": 2.75,
        "draft_acceptance_rate": 7 / 12,
        "acceptance_histogram": [1, 1, 0, 2],
        "acceptance_histogram_by_draft_length": {"3": [1, 1, 0, 2]},
        "num_spec_steps": 4,
        "num_accepted_draft_tokens": 7,
        "num_draft_tokens": 12,
        "num_spec_tokens": 3,
    }
    with vllm_server(MERGED, reported=reported, other_traffic=5) as server:
        result = VllmEngine(server.url).generate(ASK, SAMPLING)
    assert result.stats.drafted == 12  # the counters rose by 27


def test_a_wrong_key_is_refused_with_a_message_that_says_to_give_the_key():
    with vllm_server() as server:
        server.api_key = "sk-right"
        with pytest.raises(ServerRefused) as refused:
            VllmEngine(server.url, "sk-wrong").connect()
    assert refused.value.status == 401
    assert "refused the API key" in str(refused.value) and "give the key the server was started with" in str(
        refused.value
    )


def test_nothing_listening_says_to_start_the_server():
    with pytest.raises(ServerUnavailable, match="connection refused"):
        VllmEngine(f"http://127.0.0.1:{free_port()}").connect()


def test_a_stream_that_breaks_off_raises_and_keeps_the_text_that_arrived():
    told = []
    with vllm_server(break_after=4) as server:  # the role chunk and three steps, then the connection resets
        with pytest.raises(ServerUnavailable, match="broke off in the middle of the answer"):
            VllmEngine(server.url).generate(ASK, SAMPLING, on_steps=lambda batch: told.extend(s.text for s in batch))
    assert "".join(told) == "The quick brown fox jumps over"


def test_a_stream_closed_before_done_is_an_error_not_a_finished_reply():
    with vllm_server(break_after=4, how="close") as server:
        with pytest.raises(ServerUnavailable, match="broke off"):
            VllmEngine(server.url).generate(ASK, SAMPLING)


def test_the_side_by_side_without_a_vanilla_url_is_refused_before_any_request():
    with vllm_server() as server:
        engine = VllmEngine(server.url)
        with pytest.raises(SpecDeckError) as refused:
            engine.compare(ASK, SAMPLING)
        assert "/v1/chat/completions" not in server.paths("POST")
    assert str(refused.value) == NO_VANILLA
    assert "vanilla URL" in NO_VANILLA and "without --speculative-config" in NO_VANILLA


def test_the_side_by_side_with_a_vanilla_url_compares_the_two_servers():
    with vllm_server() as server, vanilla_server() as vanilla:
        engine = VllmEngine(server.url, vanilla_url=vanilla.url)
        comparison = engine.compare(ASK, SAMPLING)
        assert vanilla.paths("POST") == ["/v1/chat/completions"] and server.paths("POST") == ["/v1/chat/completions"]
    assert isinstance(comparison, Comparison) and engine.pair.vanilla_url == vanilla.url
    assert comparison.vanilla.text == comparison.speculative.text == "The quick brown fox jumps over the lazy dog"
    assert (comparison.vanilla.stats.steps, comparison.vanilla.stats.drafted) == (9, 0)
    assert {t.source for t in comparison.vanilla.token_infos} == {P}
    assert comparison.speculative.stats.drafted == 9


def test_a_server_that_does_not_speculate_gives_plain_tokens():
    with vanilla_server() as server:
        engine = VllmEngine(server.url)
        result = engine.generate(ASK, SAMPLING)
    assert not engine.pair.speculative and engine.pair.speculation == ""
    assert {t.source for t in result.token_infos} == {P} and result.stats.drafted == 0


def test_a_vanilla_url_that_drafts_too_is_refused():
    with vllm_server() as server, vllm_server() as other:
        with pytest.raises(SpecDeckError, match="decodes speculatively too"):
            VllmEngine(server.url, vanilla_url=other.url).connect()
