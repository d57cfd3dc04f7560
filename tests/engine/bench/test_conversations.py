"""Multi-turn prompts: a conversation runs turn by turn, later turns answering after earlier replies."""

from __future__ import annotations

import json

import pytest

from engine import ConfigError, EngineConfig
from engine.api import Engine
from engine.bench import (
    AutotuneSettings,
    BenchSettings,
    Candidate,
    PromptFileError,
    count_prompts,
    default_prompts_path,
    format_text,
    load_prompts,
    parse_prompts,
    run_autotune,
    run_benchmark,
)
from engine.bench.prompts import BenchPrompt
from engine.bench.results import SPECULATIVE, VANILLA
from engine.core.draft_length import CostModel
from engine.drafters.base import FreeToAsk, RemembersReplies
from engine.drafters.ngram import NgramDrafter

FIRST = {"role": "user", "content": "Write a haiku about tea."}
AGAIN = {"role": "user", "content": "Write it again, word for word."}
THIRD = {"role": "user", "content": "Once more, the same."}


def test_a_conversations_turns_follow_the_replies_before_them():
    (talk,) = parse_prompts(
        json.dumps({"id": "tea", "kind": "multi-turn", "messages": [FIRST], "follow_ups": [AGAIN, THIRD]})
    )
    assert talk.turns == 3 and talk.follow_ups == (AGAIN, THIRD)
    assert talk.turn(0, []) == BenchPrompt("tea/1", "multi-turn", (FIRST,))
    third = talk.turn(2, ["Leaves steep.", "Leaves steep again."])
    assert third.id == "tea/3" and third.messages == (
        FIRST,
        {"role": "assistant", "content": "Leaves steep."},
        AGAIN,
        {"role": "assistant", "content": "Leaves steep again."},
        THIRD,
    )
    assert BenchPrompt.from_dict(json.loads(json.dumps(talk.to_dict()))) == talk
    single = BenchPrompt("hi", "open", (FIRST,))
    assert single.turns == 1 and single.turn(0, []) is single and "follow_ups" not in single.to_dict()
    with pytest.raises(ValueError, match="turn 2 of 'tea' follows 1 replies"):
        talk.turn(1, [])


@pytest.mark.parametrize(
    ("follow_ups", "message"),
    [
        ("Again!", r"line 1: 'follow_ups' must be a list of user messages"),
        ([{"role": "assistant", "content": "x"}], r"'follow_ups' must be a list of user messages"),
        ([{"role": "user"}], r"'follow_ups' must be a list of user messages"),
    ],
)
def test_bad_follow_ups_are_refused_with_the_line_number(follow_ups, message):
    with pytest.raises(PromptFileError, match=message):
        parse_prompts(json.dumps({"id": "a", "kind": "k", "messages": [FIRST], "follow_ups": follow_ups}), "p.jsonl")


def test_a_prompt_named_like_a_conversations_turn_is_refused():
    text = "\n".join(
        json.dumps(r)
        for r in (
            {"id": "tea", "kind": "k", "messages": [FIRST], "follow_ups": [AGAIN]},
            {"id": "tea/2", "kind": "k", "messages": [FIRST]},
        )
    )
    with pytest.raises(PromptFileError, match=r"line 2: the report row 'tea/2' would also be line 1's"):
        parse_prompts(text, "p.jsonl")


def test_the_shipped_set_has_conversations_that_reuse_earlier_replies():
    shipped = load_prompts(default_prompts_path(), kinds=("multi-turn",))
    assert len(shipped) >= 3 and all(p.turns >= 3 for p in shipped)
    assert {"code-edit", "same-schema", "tool-loop"} <= {p.id for p in shipped}  # the three cases
    assert count_prompts(shipped) == f"{len(shipped)} prompts ({sum(p.turns for p in shipped)} turns)"


# -- real runs on the embedded model ---------------------------------------------------------


@pytest.fixture(scope="module")
def llama(default_gguf):
    from engine.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(default_gguf, n_ctx=2048, n_threads=1)  # one thread: see test_bench.py
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def conversations():
    shipped = {p.id: p for p in load_prompts(default_prompts_path(), kinds=("multi-turn",))}
    return shipped["code-edit"], shipped["revise-email"]


def test_the_benchmark_runs_each_conversation_turn_by_turn(llama, conversations, monkeypatch):
    engine = Engine(llama, NgramDrafter(), EngineConfig(k=4, measure_costs=False, threads=1), CostModel())
    forgotten = []
    monkeypatch.setattr(engine.drafter, "forget", lambda: forgotten.append(True), raising=False)
    monkeypatch.setattr(engine.drafter, "begin", lambda prompt: None, raising=False)
    # a drafter that keeps earlier replies (RemembersReplies, as suffix decoding) is told to forget them
    monkeypatch.setattr(engine.drafter, "capabilities", frozenset({FreeToAsk, RemembersReplies}))
    report = run_benchmark(
        engine.config,
        conversations,
        BenchSettings(max_tokens=40, repeat=2, warmup=0, measure_bandwidth=False),
        engine=engine,
    )

    assert [p.id for p in report.prompts] == [
        "code-edit/1",
        "code-edit/2",
        "code-edit/3",
        "revise-email/1",
        "revise-email/2",
        "revise-email/3",
    ]
    assert [k.name for k in report.kinds] == ["multi-turn"] and report.settings["prompts"] == 6
    assert all(p.identical for p in report.prompts)  # lossless at every turn
    # The drafter forgets at each conversation's start only: later turns may draft from earlier ones.
    assert len(forgotten) == 2 * 2
    # Later turns rewrite the earlier reply, which the context now holds: they draft far more of it.
    rows = {p.id: p for p in report.prompts}
    for talk in conversations:
        assert rows[f"{talk.id}/3"].tokens_per_forward > rows[f"{talk.id}/1"].tokens_per_forward + 0.5
    # Both repeats decode the same contexts: the same replies, turn by turn.
    for mode in (VANILLA, SPECULATIVE):
        by_repeat = [[r.token_ids for r in report.runs if r.mode == mode and r.repeat == n] for n in (0, 1)]
        assert by_repeat[0] == by_repeat[1]
    assert "code-edit/3" in format_text(report) and "6 prompts (6 multi-turn)" in format_text(report)


def test_a_conversation_too_long_for_the_context_is_refused_before_anything_runs(llama):
    long = {"role": "user", "content": "Then say all of this back to me: " + "tea leaves and honey " * 250}
    talk = BenchPrompt("long", "multi-turn", (FIRST,), (long, long))
    engine = Engine(llama, NgramDrafter(), EngineConfig(k=4, measure_costs=False, threads=1), CostModel())
    progress = []
    with pytest.raises(
        ConfigError,
        match=r"Conversation 'long' needs up to \d+ tokens of context by its turn 3 .* "
        r"the context holds 2048: load the model with a larger context",
    ):
        run_benchmark(
            engine.config,
            (talk,),
            BenchSettings(max_tokens=128, repeat=1),
            engine=engine,
            progress=lambda message, fraction: progress.append(message),
        )
    assert not any(message.startswith("Repeat") for message in progress)


def test_auto_tune_scores_every_turn(llama, conversations):
    engine = Engine(llama, NgramDrafter(), EngineConfig(k=4, measure_costs=False, threads=1), CostModel())
    result = run_autotune(
        engine.config,
        conversations[1:],
        AutotuneSettings(max_tokens=24, warmup=False),
        engine=engine,
        candidates=(Candidate("ngram", 4),),
    )
    assert result.prompts == 3 and all(r.prompts == 3 and r.identical == 3 for r in result.ranked)
