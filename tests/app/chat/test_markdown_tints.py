"""Where each token lands in a reply drawn as Markdown: the alignment alone, without Qt."""

from __future__ import annotations

from app.chat.markdown_tints import token_spans


def landed(tokens: list[str], rendered: str) -> list[str]:
    return [rendered[start:end] for start, end in token_spans(tokens, rendered)]


def test_syntax_tokens_land_nowhere_and_words_land_on_themselves():
    tokens = ["# Ti", "tle\n\n", "Some ", "**", "bold", "**", " and", " [link](http://x.com/and)", "."]
    rendered = "Title\u2029Some bold and link."

    assert landed(tokens, rendered) == ["Ti", "tle\u2029", "Some ", "", "bold", "", " and", " link", "."]


def test_table_cells_lists_and_a_tab_drawn_as_spaces_keep_their_order():
    tokens = ["- one\n", "- two\n\n", "| a |", " b |\n|---|---|\n", "| 1 | 2 |\n\n", "```\n\tx\n```\n", "end"]
    rendered = "one\u2029two\u2029\ufdd0a\ufdd0b\ufdd01\ufdd02\ufdd1\u2029    x\u2029end"

    shown = landed(tokens, rendered)
    assert [s.strip("\u2029\ufdd0\ufdd1 ") for s in shown] == ["one", "two", "a", "b", "1\ufdd02", "x", "end"]


def test_spans_only_grow_so_a_position_finds_one_token():
    tokens = ["**", "a", "**", "**", "b", "**"]
    spans = token_spans(tokens, "ab", offset=10)

    assert spans == sorted(spans) and [s for s in spans if s[0] != s[1]] == [(10, 11), (11, 12)]
