"""Regenerate writes another reply (issue 36, item 9): a new seed each time, a line that says
why a greedy reply comes back the same, and the side by side still greedy."""

from __future__ import annotations

from dataclasses import replace

from app.chat.session import GREEDY_REGENERATE
from app.shell.settings import DEFAULT_SAMPLING as CHAT_DEFAULT
from engine import EngineClient, SamplingConfig
from tests.app.conftest import REPLY_TIMEOUT_MS, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG

SAMPLED = replace(CHAT_DEFAULT, max_tokens=24)


def requests_of(window) -> list[SamplingConfig]:
    """The sampling of every chat request the window sends to its engine (the calls go through)."""
    sent = []
    chat = window.controller.chat

    def recorded(messages, sampling):
        sent.append(sampling)
        chat(messages, sampling)

    window.controller.chat = recorded
    return sent


def regenerate(qtbot, window):
    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        window.actions.regenerate.trigger()
    return finished.args[1]


def test_each_regenerate_draws_a_new_seed_and_writes_another_reply(make_window, qtbot):
    window = make_window(sampling=SAMPLED)
    sent = requests_of(window)
    first = send_and_wait(qtbot, window, "Write one sentence about the sea.")

    replies = [first.text, regenerate(qtbot, window).text, regenerate(qtbot, window).text]

    seeds = [sampling.seed for sampling in sent]
    assert len(seeds) == 3 and len(set(seeds)) == 3  # the first reply's seed, then a new one each time
    assert all(replace(sampling, seed=0) == replace(SAMPLED, seed=0) for sampling in sent)  # only the seed moves
    assert len(set(replies)) > 1  # 24 tokens drawn at temperature 0.8 from three seeds
    assert GREEDY_REGENERATE not in window.banner.text()


def test_a_greedy_regenerate_says_why_the_reply_is_the_same(make_window, qtbot):
    window = make_window(sampling=SamplingConfig(max_tokens=16))
    first = send_and_wait(qtbot, window, "Name a colour.")

    again = regenerate(qtbot, window)

    assert again.text == first.text
    assert GREEDY_REGENERATE in window.banner.text() and "temperature" in window.banner.text()


def test_the_side_by_side_runs_greedy_when_the_chat_samples(make_window, qtbot, monkeypatch):
    asked = []
    compare = EngineClient.compare

    def recorded(self, messages, sampling, **options):
        asked.append(sampling)
        return compare(self, messages, sampling, **options)

    monkeypatch.setattr(EngineClient, "compare", recorded)
    window = make_window(sampling=SAMPLED)

    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        window.run_comparison("Copy this: the cat sat on the mat, the cat sat on the mat.")

    assert [s.greedy for s in asked] == [True]
    assert (asked[0].seed, asked[0].max_tokens) == (SAMPLED.seed, SAMPLED.max_tokens)
    assert finished.args[1].vanilla.stats.tokens > 0
