"""The OpenAI routes with the real openai client: replies, streams, usage, timings, speculative options.

What a client of any OpenAI-compatible server would notice: the streamed reply is the
whole reply; usage counts the tokens; llama-server's timings are there and add up;
`speculative.n_max: 0` decodes plainly and (greedy) says the same; SpecDeck's events
carry every step, the same steps the app's own route streams.
"""

from __future__ import annotations

import pytest

from engine import SamplingConfig
from engine.service import wire
from engine.service.client import EngineClient

pytestmark = pytest.mark.slow

# A prompt whose reply repeats it, so that n-gram lookup drafts and some drafts are accepted.
MESSAGES = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat"}]
GREEDY = {"temperature": 0, "max_tokens": 16}
TIMINGS = (
    "prompt_n",
    "prompt_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
    "draft_n",
    "draft_n_accepted",
)


def test_a_chat_reply_counts_its_tokens_and_carries_llama_servers_timings(openai_client):
    reply = openai_client.chat.completions.create(model="any", messages=MESSAGES, **GREEDY)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    usage = reply.usage
    if choice.finish_reason == "length":
        assert usage.completion_tokens == GREEDY["max_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    timings = reply.model_extra["timings"]
    assert set(TIMINGS) <= set(timings)
    assert timings["predicted_n"] == usage.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["draft_n"] > 0  # the prompt repeats itself: n-gram lookup found drafts
    assert timings["predicted_per_second"] == pytest.approx(1000 * timings["predicted_n"] / timings["predicted_ms"])
    assert timings["predicted_per_token_ms"] == pytest.approx(timings["predicted_ms"] / timings["predicted_n"])


def test_a_streamed_chat_is_the_same_reply_in_pieces_with_usage_last(openai_client):
    whole = openai_client.chat.completions.create(model="any", messages=MESSAGES, **GREEDY)
    chunks = list(
        openai_client.chat.completions.create(
            model="any", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    finish_chunk = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finish_chunk.model_extra["timings"]["predicted_n"] == whole.usage.completion_tokens


def test_n_max_0_decodes_plainly_and_says_the_same_greedy_text(openai_client):
    speculative = openai_client.chat.completions.create(model="any", messages=MESSAGES, **GREEDY)
    plain = openai_client.chat.completions.create(
        model="any", messages=MESSAGES, **GREEDY, extra_body={"speculative.n_max": 0}
    )
    assert speculative.model_extra["timings"]["draft_n"] > 0
    assert plain.model_extra["timings"]["draft_n"] == 0
    assert plain.choices[0].message.content == speculative.choices[0].message.content
    none = openai_client.chat.completions.create(
        model="any", messages=MESSAGES, **GREEDY, extra_body={"specdeck": {"drafter": "none"}}
    )
    assert none.model_extra["timings"]["draft_n"] == 0
    assert none.choices[0].message.content == speculative.choices[0].message.content


def test_n_max_caps_each_draft_for_that_request_only(openai_client):
    def drafted(**speculative):
        reply = openai_client.chat.completions.create(
            model="any", messages=MESSAGES, **GREEDY, extra_body={**speculative, "specdeck": {"events": True}}
        )
        return [item["step"]["drafted"] for item in reply.model_extra["specdeck"]]

    assert max(drafted(**{"speculative.n_max": 1})) == 1
    assert max(drafted()) == 3  # the server's k: the cap did not stay behind


def test_a_completion_continues_the_prompt(openai_client):
    reply = openai_client.completions.create(model="any", prompt="One, two, three, four,", temperature=0, max_tokens=8)
    assert reply.object == "text_completion" and reply.choices[0].text
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 8
    streamed = list(
        openai_client.completions.create(
            model="any", prompt="One, two, three, four,", temperature=0, max_tokens=8, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_a_stop_string_ends_the_reply_before_it(openai_client):
    whole = openai_client.chat.completions.create(model="any", messages=MESSAGES, **GREEDY).choices[0].message.content
    stop = whole.split()[2]  # a word the greedy reply is known to reach
    cut = openai_client.chat.completions.create(model="any", messages=MESSAGES, **GREEDY, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and stop not in cut.message.content
    assert whole.startswith(cut.message.content)


def test_specdeck_events_rebuild_the_steps_the_apps_route_streams(openai_client, server):
    """Each streamed chunk's `specdeck` field is a step on the wire: the same tokens, sources, p and q
    as /specdeck/generate streams for the same request (fixed k and greedy: the same drafts)."""
    chunks = list(
        openai_client.chat.completions.create(
            model="any", messages=MESSAGES, stream=True, **GREEDY, extra_body={"specdeck": {"events": True}}
        )
    )
    items = [c.model_extra["specdeck"] for c in chunks if (c.model_extra or {}).get("specdeck")]
    steps = [wire.step_from_dict(item["step"]) for item in items]
    assert all(item["run"] == "speculative" and item["drafter_stats"] is not None for item in items)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "".join(step.text for step in steps) == text

    client = EngineClient(server.url, api_key=server.key)
    local = client.generate(MESSAGES, SamplingConfig(temperature=0.0, max_tokens=GREEDY["max_tokens"]))

    def colours(events):
        return [(t.id, t.text, t.source, t.p, t.q) for step in events for t in step.tokens]

    assert colours(steps) == colours(local.events)
    assert [s.drafted for s in steps] == [s.drafted for s in local.events]
    assert any(t.source.value == "accepted" for s in steps for t in s.tokens)

    reply = openai_client.chat.completions.create(
        model="any", messages=MESSAGES, **GREEDY, extra_body={"specdeck": {"events": True}}
    )
    listed = [wire.step_from_dict(item["step"]) for item in reply.model_extra["specdeck"]]
    assert colours(listed) == colours(steps)


def test_the_models_route_lists_the_loaded_model(openai_client):
    models = openai_client.models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct.Q4_1"]
    reply = openai_client.chat.completions.create(model=models[0].id, messages=MESSAGES, max_tokens=2)
    assert reply.model == models[0].id


def test_the_fields_clients_send_by_habit_are_accepted(openai_client):
    reply = openai_client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "developer", "content": "Be brief."}, *MESSAGES],
        max_completion_tokens=4,
        n=1,
        user="someone",
        presence_penalty=0,
        frequency_penalty=0,
        logprobs=False,
        seed=3,
        top_p=0.9,
        metadata={"run": "test"},
        extra_body={"top_k": 20, "min_p": 0.05},
    )
    assert reply.usage.completion_tokens <= 4 and reply.choices[0].message.content is not None
