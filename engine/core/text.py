"""Streaming ids to text, stop strings, and the shape of chat messages.

Tokens do not map to whole characters: a byte-level BPE token can end in the
middle of a UTF-8 sequence, and some tokenizers change a token's text depending
on its left neighbour. `IncrementalText` decodes a short window of recent ids
and releases text only once it no longer ends in a replacement character, the
way vLLM and transformers' streamers do, so the pieces add up to exactly the
decoded reply.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.errors import ConfigError

REPLACEMENT = "\ufffd"
# The roles every chat template renders (the bench's prompt files allow the same three).
# Not "tool": a tool's result only means something after the assistant's tool call, which
# nothing here produces, and templates without tool support write it as an unknown speaker.
# Anything else (Gemma's "model", Llama's "ipython", a typo) SmolLM2's template would write
# verbatim, a turn of a speaker the model never saw.
MESSAGE_ROLES = ("system", "user", "assistant")


class IncrementalText:
    def __init__(self, detokenize: Callable[[list[int]], str]) -> None:
        self._detokenize = detokenize
        self.ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0  # window start: context for the tokenizer's spacing rules
        self._read_offset = 0  # ids before this have been released as text

    def push(self, token_id: int) -> str:
        """Add one id; return the text it releases (possibly "", held back for now)."""
        self.ids.append(token_id)
        prefix = self._detokenize(self.ids[self._prefix_offset : self._read_offset])
        window = self._detokenize(self.ids[self._prefix_offset :])
        if len(window) <= len(prefix) or window.endswith(REPLACEMENT):
            return ""
        piece = window[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.ids)
        self.text += piece
        return piece

    def flush(self) -> str:
        """Release whatever is held back (the end of the reply), even an incomplete character."""
        prefix = self._detokenize(self.ids[self._prefix_offset : self._read_offset])
        window = self._detokenize(self.ids[self._prefix_offset :])
        piece = window[len(prefix) :] if len(window) > len(prefix) else ""
        self._prefix_offset = self._read_offset = len(self.ids)
        self.text += piece
        return piece


def find_stop(text: str, stops: tuple[str, ...], start: int) -> int:
    """Index in `text` where the earliest stop string begins, searching from `start`; -1 if none."""
    best = -1
    for stop in stops:
        at = text.find(stop, max(0, start - len(stop) + 1))
        if at != -1 and (best == -1 or at < best):
            best = at
    return best


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could be the beginning of a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def check_messages(messages: object, source: str = "The messages") -> list[dict]:
    """`messages` if it is a non-empty list of {"role", "content"} objects with known roles and
    text content; otherwise a ConfigError that names the first bad message. Needs no model."""
    shape = '{"role": ..., "content": ...}'
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{source} must hold a non-empty list of {shape} objects.")
    allowed = ", ".join(MESSAGE_ROLES)
    for n, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ConfigError(f"{source}: message {n} is not a {shape} object: {message!r:.80}")
        role, content = message["role"], message["content"]
        if role not in MESSAGE_ROLES:
            raise ConfigError(f"{source}: message {n} has the role {role!r}; the roles are {allowed}.")
        if not isinstance(content, str):
            raise ConfigError(f"{source}: the content of message {n} must be text, not {type(content).__name__}.")
    return messages


def plain_chat(messages: list[dict], reply: bool = True) -> str:
    """A chat as plain "role: content" lines, for a model without a chat template (a base model),
    ending in "assistant:" when the reply comes next; base models continue that reasonably.
    The one rendering every backend and training use, so heads train on what they will see."""
    lines = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return lines + "assistant:" if reply else lines
