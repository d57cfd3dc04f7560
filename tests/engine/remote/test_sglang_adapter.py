"""The SGLang adapter against a real HTTP server that answers as `sglang.launch_server` does (SGLang main,
August 2026, after PR #33518).

Shapes, and where they come from (python/sglang/srt/...):
- /v1/models: ModelCards `id`, `object`, `created`, `owned_by` "sglang", `root`, `max_model_len`:
  entrypoints/openai/protocol.py `ModelCard`, entrypoints/http_server.py `available_models`.
- /get_server_info: the ServerArgs dataclass flattened, the scheduler's info, `internal_states` and
  `version`: entrypoints/http_server.py `get_server_info`; speculative fields of server_args.py.
- The chat stream: a role chunk without usage; content chunks with `usage` when
  `stream_options.continuous_usage_stats` (serving_chat.py `_generate_stream_content`, built by
  sse_utils.py `build_sse_content`); a chunk with an empty delta and the finish reason and
  `matched_stop`; with `return_spec_tokens_details`, a chunk of no choices carrying
  `sglext.spec_tokens_details` (utils.py `spec_tokens_details_from_meta_info`; `usage` null, as
  pydantic's model_dump_json writes it); the usage chunk; `[DONE]`.
- 401: `{"error": "Unauthorized"}` from the API-key middleware, which guards all but /health and /metrics.
"""

from __future__ import annotations

import pytest

from engine.core.events import Comparison, Source
from engine.core.sampling_config import SamplingConfig
from engine.errors import SpecDeckError
from engine.remote import open_remote
from engine.remote.http import ServerRefused, ServerUnavailable
from engine.remote.sglang import NO_VANILLA, NOTES, SglangEngine
from tests.engine.remote import FakeServer, Reply, Stream, free_port

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
ASK = [{"role": "user", "content": "The quick brown fox?"}]
SAMPLING = SamplingConfig(max_tokens=32)
A, R, B, P, U = Source.ACCEPTED, Source.RESAMPLED, Source.BONUS, Source.PLAIN, Source.UNREPORTED

# (text, tokens the step made): an EAGLE3 chain of 3; the first token comes from the prefill.
STEPS = [("The", 1), (" quick brown fox", 4), (" jumps over", 2), (" the lazy dog", 3)]
# The same words where one step's text was held back: its chunk carries two steps (4 + 1 tokens).
MERGED = [("The", 1), (" quick brown fox", 4), (" jumps over the lazy", 5), (" dog.", 2)]
MERGED_DETAILS = {
    "spec_accept_rate": 7 / 12,
    "spec_accept_length": 3.0,
    "spec_cap_length": 0.0,
    "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": 7,
    "spec_num_proposed_drafts": 12,
    "spec_verify_ct": 4,
    "spec_correct_drafts_histogram": [1, 1, 0, 2],
    "spec_cap_lens_histogram": [],
}


def models() -> dict:
    return {
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": 1754000000,
                "owned_by": "sglang",
                "root": MODEL,
                "max_model_len": 131072,
            }
        ],
    }


def server_info(algorithm: str | None = "EAGLE3", steps: int = 3, topk: int = 1, draft_tokens: int = 4) -> dict:
    spec = {
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": DRAFT if algorithm else None,
        "speculative_num_steps": steps if algorithm else None,
        "speculative_eagle_topk": topk if algorithm else None,
        "speculative_num_draft_tokens": draft_tokens if algorithm else None,
    }
    return {
        "model_path": MODEL,
        "tokenizer_path": MODEL,
        "served_model_name": MODEL,
        "context_length": None,
        "host": "127.0.0.1",
        "port": 30000,
        "api_key": None,
        "tp_size": 1,
        "stream_interval": 1,
        "enable_metrics": False,
        **spec,
        "max_total_num_tokens": 412346,
        "max_req_input_len": 131066,
        "internal_states": [
            {
                "avg_spec_accept_length": 2.71,
                "last_gen_throughput": 181.4,
                "memory_usage": {"weight": 15.0, "kvcache": 50.3},
            }
        ],
        "version": "0.5.15.post1",
    }


def chunk(choice: dict, usage: dict | None = None) -> dict:
    out = {
        "id": "9d0c4b6e",
        "object": "chat.completion.chunk",
        "created": 1754000100,
        "model": MODEL,
        "choices": [{"index": 0, "logprobs": None, "finish_reason": None, "matched_stop": None, **choice}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def usage(tokens: int) -> dict:
    return {
        "prompt_tokens": 12,
        "total_tokens": 12 + tokens,
        "completion_tokens": tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


def stream(steps, *, details: dict | None = None, continuous: bool = True, break_after: int | None = None) -> Stream:
    events, total = [chunk({"delta": {"role": "assistant", "content": ""}})], 0
    for text, tokens in steps:
        total += tokens
        events.append(chunk({"delta": {"content": text}}, usage(total) if continuous else None))
    events.append(chunk({"delta": {}, "finish_reason": "stop", "matched_stop": 128009}))
    tail = {"id": "9d0c4b6e", "object": "chat.completion.chunk", "created": 1754000100, "model": MODEL, "choices": []}
    if details is not None:
        events.append({**tail, "usage": None, "sglext": {"spec_tokens_details": details}})
    events.append({**tail, "usage": usage(total), "sglext": None})
    return Stream(events, break_after)


def sglang_server(
    steps=STEPS, *, info: dict | None = None, info_path: str = "/get_server_info", **stream_options
) -> FakeServer:
    info = info or server_info()
    return FakeServer(
        {
            "/v1/models": lambda body: Reply(body=models()),
            info_path: lambda body: Reply(body=info),
            "/v1/chat/completions": lambda body: stream(steps, **stream_options),
        }
    )


def vanilla_server() -> FakeServer:
    words = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog"]
    return sglang_server([(w, 1) for w in words], info=server_info(None))


def test_connect_describes_the_model_its_context_and_how_it_speculates():
    with sglang_server() as server:
        assert isinstance(open_remote("auto", server.url), SglangEngine)  # /get_server_info answers
        pair = open_remote("sglang", server.url).connect()
    assert (pair.kind, pair.model, pair.n_ctx, pair.speculative) == ("sglang", MODEL, 131072, True)
    assert pair.speculation == f"EAGLE3, up to 3 draft tokens a step (draft {DRAFT})"
    assert pair.notes == NOTES and pair.details["server_accept_length"] == 2.71
    assert pair.details["version"] == "0.5.15.post1"


def test_a_build_without_get_server_info_is_read_at_server_info():
    with sglang_server(info_path="/server_info") as server:
        pair = SglangEngine(server.url).connect()
        assert server.paths("GET")[-2:] == ["/get_server_info", "/server_info"]
    assert pair.speculative and pair.speculation.startswith("EAGLE3, up to 3")


def test_a_tree_draft_is_described_and_noted():
    with sglang_server(info=server_info("EAGLE", steps=5, topk=8, draft_tokens=64)) as server:
        pair = SglangEngine(server.url).connect()
    assert pair.speculation == f"EAGLE, up to 5 draft tokens a step (a tree of 63, top-k 8) (draft {DRAFT})"
    assert any("drafts a tree (top-k 8)" in note and "at most 5" in note for note in pair.notes)


def test_a_reply_takes_its_draft_totals_from_sglangs_own_count():
    """Read from the chunks alone, the merged chunk is one step of 4 drafts; SGLang counted two of 3."""
    with sglang_server(MERGED, details=MERGED_DETAILS) as server:
        result = SglangEngine(server.url).generate(ASK, SAMPLING)
        body = next(b for m, p, b in server.requests if p == "/v1/chat/completions")
    assert body["return_spec_tokens_details"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert result.text == "The quick brown fox jumps over the lazy dog." and result.finish_reason == "stop"
    assert [len(step.tokens) for step in result.events] == [1, 4, 5, 2]
    assert result.stats.drafted == 12 and result.stats.tokens == 12


def test_an_older_build_without_counts_infers_steps_and_totals_from_the_chunks():
    with sglang_server() as server:
        result = SglangEngine(server.url).generate(ASK, SAMPLING)
    assert [[t.source for t in step.tokens] for step in result.events] == [[P], [A, A, A, B], [A, R], [A, A, R]]
    stats = result.stats
    assert (stats.steps, stats.tokens, stats.drafted, stats.accepted, stats.tokens_per_step) == (4, 10, 9, 6, 2.5)


def test_without_usage_per_chunk_the_sources_are_not_claimed():
    """A server that ignores continuous_usage_stats: how many tokens a chunk holds is not known."""
    with sglang_server(continuous=False) as server:
        result = SglangEngine(server.url).generate(ASK, SAMPLING)
    assert result.text == "The quick brown fox jumps over the lazy dog"
    assert {t.source for t in result.token_infos} == {U}
    assert (result.stats.tokens, result.stats.drafted, result.stats.accepted) == (4, 0, 0)  # a token a chunk


def test_a_wrong_key_is_refused_with_a_message_that_says_to_give_the_key():
    with sglang_server() as server:
        server.api_key = "sk-right"
        with pytest.raises(ServerRefused) as refused:
            SglangEngine(server.url, "sk-wrong").connect()
    assert refused.value.status == 401 and "give the key the server was started with" in str(refused.value)


def test_nothing_listening_says_to_start_the_server():
    with pytest.raises(ServerUnavailable, match="connection refused"):
        SglangEngine(f"http://127.0.0.1:{free_port()}").connect()


def test_a_stream_that_breaks_off_raises_and_keeps_the_text_that_arrived():
    told = []
    with sglang_server(break_after=4) as server:  # the role chunk and three steps, then the connection resets
        with pytest.raises(ServerUnavailable, match="broke off in the middle of the answer"):
            SglangEngine(server.url).generate(ASK, SAMPLING, on_steps=lambda batch: told.extend(s.text for s in batch))
    assert "".join(told) == "The quick brown fox jumps over"


def test_the_side_by_side_without_a_vanilla_url_is_refused_before_any_request():
    with sglang_server() as server:
        with pytest.raises(SpecDeckError) as refused:
            SglangEngine(server.url).compare(ASK, SAMPLING)
        assert "/v1/chat/completions" not in server.paths("POST")
    assert str(refused.value) == NO_VANILLA and "without --speculative-algorithm" in NO_VANILLA


def test_the_side_by_side_with_a_vanilla_url_compares_the_two_servers():
    with sglang_server(MERGED, details=MERGED_DETAILS) as server, vanilla_server() as vanilla:
        comparison = SglangEngine(server.url, vanilla_url=vanilla.url).compare(ASK, SAMPLING)
        vanilla_body = next(b for m, p, b in vanilla.requests if p == "/v1/chat/completions")
    assert isinstance(comparison, Comparison) and "return_spec_tokens_details" not in vanilla_body
    assert comparison.vanilla.text == "The quick brown fox jumps over the lazy dog"
    assert (comparison.vanilla.stats.steps, comparison.vanilla.stats.drafted) == (9, 0)
    assert {t.source for t in comparison.vanilla.token_infos} == {P}
    assert comparison.speculative.stats.drafted == 12


def test_a_vanilla_url_that_drafts_too_is_refused():
    with sglang_server() as server, sglang_server() as other:
        with pytest.raises(SpecDeckError, match="decodes speculatively too"):
            SglangEngine(server.url, vanilla_url=other.url).connect()
