"""The footer under a reply leads with the figures llama.cpp and LM Studio users know, named as
engine/figures.py names them, and its tooltip says what they are."""

from __future__ import annotations

import pytest

from app.chat.view import FOOTER_TIP, ChatView
from engine.core.decode import decode_steps
from engine.core.draft_length import DraftLength
from engine.core.events import collect
from engine.core.sampling import SamplingConfig
from engine.drafters.ngram import NgramDrafter
from engine.figures import ACCEPTANCE_LENGTH, DRAFT_ACCEPTANCE


@pytest.fixture(scope="module")
def real_stats(default_llama) -> dict:
    """A real reply's statistics as the chat stores them (RunStats.as_dict)."""
    prompt = default_llama.apply_chat_template([{"role": "user", "content": "Repeat: one two three, one two three."}])
    steps = decode_steps(
        default_llama, prompt, SamplingConfig(max_tokens=24), drafter=NgramDrafter(), draft_length=DraftLength(4)
    )
    stats = collect(list(steps)).stats
    assert stats.drafted > 0
    return stats.as_dict()


def footer_line(view: ChatView) -> tuple[str, int]:
    """The last block of the transcript (the footer) and its position in the document."""
    block = view.transcript.document().lastBlock()
    return block.text(), block.position()


def test_the_footer_leads_with_draft_acceptance_then_the_mean_acceptance_length(qtbot, real_stats):
    view = ChatView()
    qtbot.addWidget(view)
    view.add_user_message("Repeat")
    view.begin_reply()
    view.end_reply("stop", real_stats)
    text, _ = footer_line(view)
    s = real_stats
    share = f"{s['accepted'] / s['drafted']:.0%} of drafted tokens accepted ({s['accepted']} of {s['drafted']})"
    assert text.startswith(f"{share} · mean acceptance length {s['tokens'] / s['steps']:.2f} · ")
    assert "per forward" not in text and "drafts accepted" not in text  # the old names are gone
    assert f"{s['tokens']} tokens at" in text


def test_hovering_the_footer_explains_its_figures_and_a_token_keeps_its_own_tip(qtbot, real_stats):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(900, 600)
    view.show()
    qtbot.waitExposed(view)
    view.add_user_message("Repeat")
    view.begin_reply()
    view.end_reply("stop", real_stats)
    _, position = footer_line(view)
    cursor = view.transcript.textCursor()
    cursor.setPosition(position + 2)
    on_footer = view.transcript.cursorRect(cursor).center()
    assert view.footer_tip_at(on_footer) == FOOTER_TIP
    assert DRAFT_ACCEPTANCE.tip in FOOTER_TIP and ACCEPTANCE_LENGTH.tip in FOOTER_TIP
    cursor.setPosition(0)
    assert view.footer_tip_at(view.transcript.cursorRect(cursor).center()) == ""  # the user's message: no tip
