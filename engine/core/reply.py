"""A reply's tokens and text as the step hands them out: what might start a stop string is held back.

A token's text is the span of decoded text from its start to the next token's start.
Tokens are released (to the UI) once their text cannot become part of a stop string;
at a stop string the reply is cut where it begins, and the stop string's own tokens are
handed back apart (StepEvent.stop_tokens), not shown.
"""

from __future__ import annotations

from dataclasses import replace

from engine.core.events import TokenInfo
from engine.core.text import IncrementalText, find_stop, held_back


class ReplyText:
    """The reply's tokens and text; holds back what might be the start of a stop string."""

    def __init__(self, detokenize, stops: tuple[str, ...]) -> None:
        self.text = IncrementalText(detokenize)
        self.stops = stops
        self.pending: list[tuple[TokenInfo, int]] = []  # (token, offset of its text)
        self.count = 0  # tokens in the reply so far (released or pending)
        self.cut: int | None = None

    def add(self, info: TokenInfo) -> bool:
        """Append a token; True when it completes a stop string."""
        start = len(self.text.text)
        piece = self.text.push(info.id)
        self.pending.append((info, start))
        self.count += 1
        if self.stops and piece:
            at = find_stop(self.text.text, self.stops, start)
            if at != -1:
                self.cut = at
                return True
        return False

    def release(self, final: bool) -> tuple[tuple[TokenInfo, ...], str, tuple[TokenInfo, ...]]:
        """(the tokens now safe to show, their text, the stop string's tokens once the reply ends at one)."""
        if final and self.cut is None:
            self.text.flush()
        full = self.text.text
        if self.cut is not None:
            safe = self.cut
        else:
            safe = len(full) if final else len(full) - held_back(full, self.stops)
        out: list[TokenInfo] = []
        stop: tuple[TokenInfo, ...] = ()
        while self.pending:
            info, start = self.pending[0]
            end = self.pending[1][1] if len(self.pending) > 1 else len(full)
            if final and self.cut is not None and start >= self.cut:
                stop = tuple(replace(token, text="") for token, _ in self.pending)  # the stop string's own
                self.count -= len(self.pending)
                self.pending.clear()
                break
            if not final and end > safe:
                break
            out.append(replace(info, text=full[start : min(end, safe)]))
            self.pending.pop(0)
        if final and self.cut is not None:
            self.text.text = full[: self.cut]
        return tuple(out), "".join(info.text for info in out), stop
