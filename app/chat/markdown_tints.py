"""Where each token of a reply landed once the reply is drawn as Markdown.

Rendering Markdown drops its syntax (`**`, `#`, list markers, table pipes, link
targets) and turns line breaks into paragraph or cell boundaries, but the words
come through in order. So the source (the tokens' text, joined) is aligned to the
rendered text by walking both: equal characters match, whitespace of any kind
(newline, paragraph separator, a table cell's frame mark) matches whitespace, and
on a mismatch the source is searched a little ahead for the rendered text that
follows (the longest piece found wins, so "bold words" skips the `**` between).
A token keeps the rendered characters its own characters matched; a token made
only of syntax ("**", "# ") matches nothing and is left without a span.

Pure Python, no Qt: the token view applies the tints at the positions found here.
"""

from __future__ import annotations

# Rendered characters that stand for whitespace in the source: paragraph and line
# separators, QTextDocument's frame marks around table cells, an object (image).
_SPACE_LIKE = frozenset("\u2029\u2028\ufdd0\ufdd1\ufdd2\ufffc\xa0\t\n\r\f\v ")
_REACH = 2000  # how far ahead in the source the rendered text may resume (past a long link target)
_CANDIDATES = 64  # places tried there, nearest first
_CONTEXT = 48  # characters compared at each
_SPACE_REACH = 8  # rendered whitespace matches source whitespace at most this far ahead ("**\n")


def _normal(text: str) -> str:
    return "".join(" " if c in _SPACE_LIKE or c.isspace() else c for c in text)


def align(source: str, rendered: str) -> list[int]:
    """For each character of `source`, the index of the rendered character it became (-1: none)."""
    src, out = _normal(source), _normal(rendered)
    where = [-1] * len(src)
    i = j = 0
    while i < len(src) and j < len(out):
        if src[i] == out[j]:
            where[i] = j
            i, j = i + 1, j + 1
            continue
        if out[j] == " ":  # a separator the renderer made (or the source's, a few characters on)
            after = j
            while after < len(out) and out[after] == " ":
                after += 1
            if after < len(out) and out[after] == src[i]:
                j = after  # spaces the renderer drew (a tab in code) before what comes next
                continue
            found = src.find(" ", i, i + _SPACE_REACH)
            if found < 0:
                j += 1  # inserted by the renderer (a tab drawn as spaces, a cell boundary)
            else:
                i = found
            continue
        found = _best_resumption(src, i, out, j)
        if found < 0:
            j += 1  # a character the source does not have nearby (an entity drawn as "&")
        else:
            i = found  # what lies between was syntax: it matches nothing
    return where


def token_spans(token_texts: list[str], rendered: str, offset: int = 0) -> list[tuple[int, int]]:
    """Each token's (start, end) in the rendered text, plus `offset`; empty where it matched nothing.

    Spans never overlap and only grow, as the token view's lookup (bisect) needs."""
    where = align("".join(token_texts), rendered)
    spans: list[tuple[int, int]] = []
    position = end_so_far = 0
    for text in token_texts:
        matched = [w for w in where[position : position + len(text)] if w >= 0]
        position += len(text)
        if matched:
            start = max(matched[0], end_so_far)
            end_so_far = max(matched[-1] + 1, start)
            spans.append((offset + start, offset + end_so_far))
        else:
            spans.append((offset + end_so_far, offset + end_so_far))
    return spans


def _best_resumption(src: str, i: int, out: str, j: int) -> int:
    """Where in src[i:] the rendered text out[j:] resumes: the place that agrees with it for
    longest, the nearest on a tie; at the rendered text's end, the last (the syntax after a
    link is shorter than its target: "[a](x.com)." ends with the ".", not the one in "x.com")."""
    best, best_length = -1, 0
    limit = min(len(src), i + _REACH)
    found = src.find(out[j], i, limit)
    for _ in range(_CANDIDATES):
        if found < 0:
            break
        length = 0
        while (
            length < _CONTEXT
            and j + length < len(out)
            and found + length < len(src)
            and src[found + length] == out[j + length]
        ):
            length += 1
        if length > best_length or (length == best_length and j + length == len(out)):
            best, best_length = found, length
        found = src.find(out[j], found + 1, limit)
    return best
