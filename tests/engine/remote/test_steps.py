"""A remote server's chunks become the engine's steps: sources rebuilt from its draft counters."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.events import Source
from engine.remote.steps import StepBuilder


def _clock():
    t = [0.0]

    def tick() -> float:
        t[0] += 0.01
        return t[0]

    return tick


def test_llama_server_counters_rebuild_each_steps_sources():
    """Counters as llama-server sends them with timings_per_token: a step's drafts are counted before its
    tokens go out, one token per chunk."""
    builder = StepBuilder(clock=_clock())
    chunks = [  # (text, predicted_n, draft_n, draft_n_accepted)
        ("Once", 1, 0, 0),  # plain: nothing drafted
        (" upon", 2, 3, 2),
        (" a", 3, 3, 2),
        (" time", 4, 3, 2),  # drafted 3, accepted 2, then resampled
        (",", 5, 5, 4),
        (" there", 6, 5, 4),
        (" was", 7, 5, 4),  # drafted 2, accepted 2, then the bonus
        (" a", 8, 9, 4),  # drafted 4, accepted none: the target's own token
    ]
    steps = [step for text, n, d, a in chunks for step in builder.add(text, tokens=n, drafted=d, accepted=a)]
    result = builder.finish("length", wall_s=0.5, prefill_s=0.1)
    sources = [info.source for info in result.token_infos]
    assert sources == [
        Source.PLAIN,
        Source.ACCEPTED,
        Source.ACCEPTED,
        Source.RESAMPLED,
        Source.ACCEPTED,
        Source.ACCEPTED,
        Source.BONUS,
        Source.RESAMPLED,
    ]
    assert result.text == "Once upon a time, there was a"
    stats = result.stats
    assert (stats.tokens, stats.drafted, stats.accepted, stats.steps) == (8, 9, 4, 4)
    assert stats.tested == 4 + 2  # accepted, plus one per step that rejected a draft
    assert stats.wall_s == 0.5 and stats.prefill_s == 0.1 and stats.tokens_per_s == 16.0
    assert result.finish_reason == "length"
    assert [len(step.tokens) for step in result.events] == [1, 3, 3, 1]  # a step's tokens arrive together
    assert [step.text for step in steps] == ["Once", " upon a time", ", there was", " a"]
    assert all(math.isnan(info.p) and info.q is None for info in result.token_infos)


def test_a_chunk_of_several_tokens_is_one_step_with_its_text_on_the_first():
    builder = StepBuilder(clock=_clock())
    (step,) = builder.add(" the end", tokens=3, drafted=2, accepted=2)
    assert [i.source for i in step.tokens] == [Source.ACCEPTED, Source.ACCEPTED, Source.BONUS]
    assert [i.text for i in step.tokens] == [" the end", "", ""]
    assert builder.add("", tokens=3, drafted=2, accepted=2) == []  # no new token: no step


def test_one_step_per_chunk_with_known_k():
    """vLLM and SGLang send one chunk per step: m tokens accepted m - 1 drafts; with k known the last is
    the bonus when all k were accepted, else resampled."""
    builder = StepBuilder(step_per_chunk=True, draft_length=3, clock=_clock())
    builder.add("a b c d", tokens=4)
    builder.add(" e", tokens=5)
    result = builder.finish("stop")
    assert [i.source for i in result.token_infos] == [Source.ACCEPTED] * 3 + [Source.BONUS, Source.RESAMPLED]
    assert (result.stats.drafted, result.stats.accepted) == (6, 3)


def test_without_counters_tokens_are_unreported_and_the_totals_come_at_the_end():
    builder = StepBuilder(clock=_clock(), notes=("no per-token numbers",))
    for text in ("Hello", ",", " world", ",", " how", " are", " you", " to", "day"):
        builder.add(text)
    result = builder.finish("stop", drafted=10, accepted=6)
    assert {i.source for i in result.token_infos} == {Source.UNREPORTED}
    assert (result.stats.drafted, result.stats.accepted) == (10, 6)
    assert result.stats.steps == 9 - 6  # the steps the totals imply: each gave its drafts and one token
    assert result.stats.notes == ("no per-token numbers",)
    assert result.events[-1].finish_reason == "stop"


def test_a_reply_with_no_token_still_ends_with_one_step():
    result = StepBuilder(clock=_clock()).finish("cancelled")
    assert result.finish_reason == "cancelled" and result.text == "" and len(result.events) == 1


def test_a_step_cut_short_by_the_end_of_the_reply_keeps_tokens_equal_to_steps_plus_accepted():
    """llama-server counted 4 drafts accepted, but the reply ended (its end token, never sent) after two
    of them: the second is the step's own token, and the reply is 1 + 2 tokens from 2 steps."""
    builder = StepBuilder(clock=_clock())
    builder.add("Four", tokens=1, drafted=0, accepted=0)
    builder.add(".", tokens=2, drafted=4, accepted=4)
    builder.add(" Done", tokens=3, drafted=4, accepted=4)
    stats = builder.finish("stop").stats
    assert (stats.steps, stats.tokens, stats.accepted) == (2, 3, 1)
    assert stats.tokens == stats.steps + stats.accepted and stats.accepted <= stats.tested <= stats.drafted


def test_the_servers_totals_never_claim_more_accepted_drafts_than_the_tokens_allow():
    builder = StepBuilder(clock=_clock())
    for text in ("2", " +", " 2"):
        builder.add(text)
    stats = builder.finish("stop", drafted=4, accepted=4).stats  # the end token was the 4th: never sent
    assert (stats.tokens, stats.accepted, stats.steps) == (3, 2, 1)
    assert stats.tokens == stats.steps + stats.accepted and stats.tokens_per_step == 3.0


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=12),
    cut=st.integers(0, 5),
    totals=st.booleans(),
)
def test_rebuilt_steps_keep_tokens_equal_to_steps_plus_accepted(steps, cut, totals):
    """llama-server's counters over any run: steps of (drafted d, accepted a <= d), each sending a + 1
    tokens one chunk at a time, the last cut short by `cut` tokens (its end token is never sent)."""
    builder = StepBuilder(clock=_clock())
    sent = drafted = accepted = 0
    for number, (d, a) in enumerate(steps):
        a = min(a, d)
        drafted, accepted = drafted + d, accepted + a
        tokens = a + 1 if number < len(steps) - 1 else max(a + 1 - cut, 1)
        for _ in range(tokens):
            sent += 1
            builder.add("x", tokens=sent, drafted=drafted, accepted=accepted)
    stats = (builder.finish("stop", drafted=drafted, accepted=accepted) if totals else builder.finish("stop")).stats
    assert stats.tokens == sent == stats.steps + stats.accepted
    assert 0 <= stats.accepted <= stats.tested <= stats.drafted and stats.tokens_per_step >= 1
