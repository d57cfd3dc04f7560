"""Acceptance named as everyone names it: vLLM's and llama.cpp's draft acceptance rate and mean
acceptance length beside SpecDeck's per-token a, in the CLI (JSON and summary) and the chat footer."""

from __future__ import annotations

import json
import re

import pytest

from app.chat.view import reply_note
from engine.cli.main import main

COPY = (
    "Copy this sentence exactly: the quick brown fox jumps over the lazy dog, "
    "the quick brown fox jumps over the lazy dog."
)


def test_the_cli_json_and_summary_give_both_rates_and_the_mean_acceptance_length(capsys):
    common = [
        "generate",
        "--target",
        "default",
        "--drafter",
        "ngram",
        "--k",
        "4",
        "--threads",
        "1",
        "--max-tokens",
        "24",
        "--prompt",
        COPY,
    ]
    assert main(common + ["--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]

    assert stats["drafted"] > 0
    assert stats["draft_acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"], abs=1e-4)
    assert stats["mean_acceptance_length"] == stats["tokens_per_step"] > 1.0
    assert stats["draft_acceptance_rate"] <= stats["acceptance_rate"]  # tested <= drafted

    assert main(common) == 0
    err = capsys.readouterr().err
    share = (
        f"{stats['accepted'] / stats['drafted']:.0%} of drafted tokens accepted "
        f"({stats['accepted']} of {stats['drafted']})"
    )
    # engine/figures.py's names in its order: the two everyone knows, then the formula's a and its speedup
    assert re.search(
        re.escape(share) + r" · mean acceptance length \d\.\d\d · per-token acceptance a \d\.\d\d "
        r"\(\d+ of \d+ tested\) · predicted speedup \d+\.\d\dx",
        err,
    ), err
    assert "rate" not in err and "per target forward" not in err  # the names the glossary replaced


def test_the_chat_footer_leads_with_the_share_of_drafted_tokens_accepted_then_the_mean_acceptance_length():
    note = reply_note("stop", {"tokens": 30, "tokens_per_s": 40.0, "drafted": 20, "accepted": 18, "steps": 12})

    assert note == ("90% of drafted tokens accepted (18 of 20) · mean acceptance length 2.50 · 30 tokens at 40.0 tok/s")
