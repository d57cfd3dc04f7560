"""A chat prompt split into the template's control tokens and plain text, so that message text stays text.

A chat template renders a conversation to one string. Tokenizing that string with control tokens
parsed (llama.cpp's `special=True`, a transformers tokenizer's default) also turns a `<|im_start|>`
that a user typed into a message into the control token: a user could write a system turn. And
llama.cpp's parse of control tokens is quadratic in their number in one text (8,000 short messages:
9 s; 100,000: 24 min). `chat_pieces` returns the rendering as a list of text pieces (str) and ids of
the template's own control tokens (int); a backend tokenizes each text piece with control tokens
NOT parsed and keeps the ids as they are. No engine code here: the backend gives the renderer and
its vocabulary's control strings.

Which text is the template's:
1. The chat is rendered with every message's content replaced by MARKER, a private-use character
   found in no message, no control string and not in the real rendering. If the result holds one
   marker per message and putting the contents back in order gives the real rendering exactly,
   the text outside the markers is the template's, and control strings are looked for there only.
2. Otherwise the template changed or inspected the contents (`content | trim`,
   `content.split('</think>')`, a message left out, a date that changed between the renders), and
   where the contents lie is unknown. Then every control string inside a content is replaced by a
   private-use character of its own before rendering (to the template, one ordinary character),
   control strings are looked for in the whole rendering, which holds only the template's, and
   the characters become their strings again inside the text pieces. Left open on this path: a
   control string that the template would complete across a content's edge (a content ending in
   `<|im_` before template text starting `start|>`); no template we know writes half a control
   token. A template that re-encodes a content (`tojson`) writes the escaped character instead.

Same ids as before for every chat whose messages hold no control string: the split follows
llama.cpp's own (`tokenizer_st_partition`): each control string, longest first, splits the text
pieces left to right, and a token with the lstrip/rstrip attribute drops the ASCII whitespace
beside it. llama.cpp tokenizes each text piece between control tokens on its own in any case
(BPE merges and SentencePiece's space prefix never cross a control token), so tokenizing the
pieces one by one gives the ids of tokenizing the whole rendering with control tokens parsed.
Two cases where they would differ, neither in a template we know: a control string overlapping
a user-defined token's string in the template's text (llama.cpp interleaves both by length; here
control strings split first), and control strings of equal length overlapping each other
(llama.cpp's sort leaves their order unspecified). Time is linear in the rendering's length.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# Supplementary Private Use Area-B: no tokenizer gives these a meaning and no text should hold them.
_PRIVATE_USE = range(0x100000, 0x10FFFE)
_ASCII_SPACE = " \t\n\v\f\r"  # what C's isspace() strips in llama.cpp's partition


@dataclass(frozen=True)
class ControlTokens:
    """A vocabulary's control tokens: the strings that tokenizing with control tokens parsed
    turns into one id each (llama.cpp: CONTROL and UNKNOWN tokens; transformers: special added tokens)."""

    ids: dict[str, int]  # string -> id; empty strings are left out
    lstrip: frozenset[str] = field(default_factory=frozenset)  # strings that drop the whitespace before them
    rstrip: frozenset[str] = field(default_factory=frozenset)  # ... and after them

    def found_in(self, text: str) -> list[str]:
        """The control strings that occur in `text`, longest (in UTF-8 bytes) first, as llama.cpp tries them."""
        present = [s for s in self.ids if s and s in text]
        return sorted(present, key=lambda s: (-len(s.encode("utf-8")), self.ids[s]))


def contents_with_controls(messages: list[dict], controls: ControlTokens) -> list[str]:
    """The control strings that occur in some message's content (empty for ordinary chats)."""
    return controls.found_in("\x00".join(m["content"] for m in messages))


def chat_pieces(render: Callable[[list[dict]], str], messages: list[dict], controls: ControlTokens) -> list[str | int]:
    """The rendering of `messages` as text pieces and the ids of the template's control tokens, in order.

    `render` turns messages into the template's text. Tokenize each str piece with control tokens
    not parsed and keep each int, and a content's control strings are text while the template's
    markup keeps its ids (module docstring: how the two are told apart, and why the ids of an
    ordinary chat do not change).
    """
    real = render(messages)
    contents = [m["content"] for m in messages]
    seen = "\x00".join([real, *contents, *controls.ids])
    spare = _unused_characters(seen)

    marker = next(spare)
    marked = render([{**m, "content": marker} for m in messages])
    if marked.count(marker) == len(contents) and _fill(marked, marker, contents) == real:
        order = iter(contents)
        return _finish(_partition(marked, controls), {marker: lambda: next(order)}, controls)

    escapes = {s: next(spare) for s in contents_with_controls(messages, controls)}
    rendered = real
    if escapes:
        escape = re.compile("|".join(re.escape(s) for s in escapes))  # longest first: found_in's order
        rendered = render([{**m, "content": escape.sub(lambda hit: escapes[hit[0]], m["content"])} for m in messages])
    restore = {char: (lambda s=s: s) for s, char in escapes.items()}
    return _finish(_partition(rendered, controls), restore, controls)


def _unused_characters(seen: str) -> Iterator[str]:
    """Private-use characters that do not occur in `seen`, one after the other."""
    return (char for char in map(chr, _PRIVATE_USE) if char not in seen)


def _fill(marked: str, marker: str, contents: list[str]) -> str:
    """`marked` with its markers replaced by `contents`, in order."""
    parts = marked.split(marker)
    out = [parts[0]]
    for content, part in zip(contents, parts[1:]):
        out += (content, part)
    return "".join(out)


def _partition(text: str, controls: ControlTokens) -> list[str | int]:
    """`text` split at control strings as llama.cpp's tokenizer_st_partition splits it: each control
    string in turn, longest first, cuts every text piece at its occurrences from the left."""
    pieces: list[str | int] = [text]
    for string in controls.found_in(text):
        token = controls.ids[string]
        split: list[str | int] = []
        for piece in pieces:
            if isinstance(piece, int) or string not in piece:
                split.append(piece)
                continue
            parts = piece.split(string)
            split.append(parts[0])
            for part in parts[1:]:
                split += (token, part)
        pieces = split
    return pieces


def _finish(pieces: list[str | int], markers: dict[str, Callable[[], str]], controls: ControlTokens) -> list[str | int]:
    """Markers back into their text, whitespace dropped beside lstrip/rstrip tokens, empty pieces dropped."""
    if markers:
        pattern = re.compile("|".join(map(re.escape, markers)))
        pieces = [p if isinstance(p, int) else pattern.sub(lambda hit: markers[hit[0]](), p) for p in pieces]
    if controls.lstrip or controls.rstrip:
        text_of = {token: string for string, token in controls.ids.items()}
        for i, piece in enumerate(pieces):
            if not isinstance(piece, int):
                continue
            string = text_of[piece]
            if string in controls.lstrip and i > 0 and isinstance(pieces[i - 1], str):
                pieces[i - 1] = pieces[i - 1].rstrip(_ASCII_SPACE)
            if string in controls.rstrip and i + 1 < len(pieces) and isinstance(pieces[i + 1], str):
                pieces[i + 1] = pieces[i + 1].lstrip(_ASCII_SPACE)
    return [p for p in pieces if p != ""]
