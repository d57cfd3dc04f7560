"""Benchmark prompt sets: JSON Lines files, one prompt per line.

    {"id": "fix-typos", "kind": "reuse", "messages": [{"role": "user", "content": "..."}]}

`id` names the prompt in reports (unique in the file), `kind` groups prompts
(the shipped set has "reuse": answers that repeat their input, "open":
answers that do not, and "multi-turn": conversations), `messages` is the chat
the reply follows. Blank lines are skipped; anything else that is wrong stops
the load with the line number, so a user's own file can be fixed from the
message alone.

A conversation adds `follow_ups`, user messages that continue it, each
answered in turn:

    {"id": "code-edit", "kind": "multi-turn", "messages": [{"role": "user", "content": "Write ..."}],
     "follow_ups": [{"role": "user", "content": "Now add type hints ..."}, ...]}

The benchmark runs it turn by turn (`BenchPrompt.turn`): turn 2 is the
messages, the first reply, and the first follow-up; and so on. Each turn is a
row of the report ("code-edit/2"), so a drafter that learns from earlier
replies is measured as a user meets it, later turns reusing earlier ones.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.core.text import MESSAGE_ROLES
from engine.errors import ConfigError

ROLES = MESSAGE_ROLES  # the roles every front end accepts (engine/core/text.py)
_KEYS = ("id", "kind", "messages")
TURN_MARK = "/"  # "code-edit/2": the second turn of the conversation "code-edit"
SHIPPED_FILE = Path("prompts") / "bench.jsonl"


class PromptFileError(ConfigError):
    """A prompts file that cannot be read, or a line in it that is not a valid prompt."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    kind: str
    messages: tuple[dict, ...]  # {"role": ..., "content": ...} each, the reply follows the last
    follow_ups: tuple[dict, ...] = ()  # user messages that continue the conversation, one per later turn

    @property
    def turns(self) -> int:
        return 1 + len(self.follow_ups)

    def turn(self, index: int, replies: list[str] | tuple[str, ...]) -> BenchPrompt:
        """Turn `index` (0-based) as a prompt of its own: the messages, then each earlier reply
        (`replies[:index]`, the assistant's) and follow-up in order. Its id is "<id>/<turn>"
        (from 1) in a conversation, the prompt's own id otherwise."""
        if not 0 <= index < self.turns:
            raise IndexError(f"{self.id!r} has {self.turns} turn(s), not a turn {index + 1}")
        if len(replies) < index:
            raise ValueError(f"turn {index + 1} of {self.id!r} follows {index} replies, got {len(replies)}")
        if not self.follow_ups:
            return self
        messages = list(self.messages)
        for reply, follow_up in zip(replies[:index], self.follow_ups):
            messages += [{"role": "assistant", "content": reply}, dict(follow_up)]
        return BenchPrompt(f"{self.id}{TURN_MARK}{index + 1}", self.kind, tuple(messages))

    def to_dict(self) -> dict:
        """JSON-ready: a line of a prompts file."""
        data = {"id": self.id, "kind": self.kind, "messages": [dict(m) for m in self.messages]}
        if self.follow_ups:
            data["follow_ups"] = [dict(m) for m in self.follow_ups]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> BenchPrompt:
        """The prompt `to_dict` wrote; one that is not valid raises PromptFileError, as a bad line would."""
        return _parse_record(data, "a prompt")


class Turns:
    """Each turn of each prompt as a prompt of its own (`BenchPrompt.turn`), built once, from the
    replies of its first run: later repeats of a benchmark decode the very same contexts."""

    def __init__(self) -> None:
        self._built: dict[tuple[str, int], BenchPrompt] = {}

    def get(self, prompt: BenchPrompt, index: int, replies: list[str]) -> tuple[BenchPrompt, bool]:
        """(turn `index` of `prompt`, whether it was built by this call)."""
        key = (prompt.id, index)
        if key in self._built:
            return self._built[key], False
        self._built[key] = prompt.turn(index, replies)
        return self._built[key], True

    def rows(self, prompts: tuple[BenchPrompt, ...]) -> tuple[BenchPrompt, ...]:
        """Every turn built so far, in the order of `prompts` and their turns: the report's rows."""
        return tuple(self._built[p.id, i] for p in prompts for i in range(p.turns) if (p.id, i) in self._built)


def count_prompts(prompts: tuple[BenchPrompt, ...]) -> str:
    """ "12 prompts", or "16 prompts (24 turns)" when conversations are among them."""
    turns = sum(p.turns for p in prompts)
    count = f"{len(prompts)} prompt{'s' if len(prompts) != 1 else ''}"
    return count if turns == len(prompts) else f"{count} ({turns} turns)"


def default_prompts_path() -> Path:
    """The shipped prompt set: resources/prompts/bench.jsonl beside the packages, or in a bundle."""
    roots = []
    bundle = getattr(sys, "_MEIPASS", None)  # PyInstaller's one-folder bundle (packaging/specdeck.spec)
    if bundle:
        roots.append(Path(bundle) / "resources")
    roots.append(Path(__file__).resolve().parents[2] / "resources")  # a source checkout / editable install
    for root in roots:
        if (root / SHIPPED_FILE).is_file():
            return root / SHIPPED_FILE
    raise PromptFileError(
        f"The shipped prompt set ({SHIPPED_FILE}) is not installed here; pass your own file with --prompts."
    )


def load_prompts(path: str | os.PathLike, kinds: tuple[str, ...] | None = None) -> tuple[BenchPrompt, ...]:
    """Every prompt in `path`, in file order; only those of `kinds` when given."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"No prompts file at {path}.") from None
    except IsADirectoryError:
        raise PromptFileError(f"{path} is a folder; give a .jsonl file with one prompt per line.") from None
    except UnicodeDecodeError as error:
        raise PromptFileError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}).") from None
    except OSError as error:
        raise PromptFileError(f"Cannot read {path}: {error.strerror or error}.") from None
    prompts = parse_prompts(text, str(path))
    if kinds:
        found = {p.kind for p in prompts}
        missing = [k for k in kinds if k not in found]
        if missing:
            raise PromptFileError(
                f"{path} has no prompts of kind {', '.join(map(repr, missing))}; "
                f"its kinds are {', '.join(sorted(found))}."
            )
        prompts = tuple(p for p in prompts if p.kind in kinds)
    return prompts


def parse_prompts(text: str, source: str = "<prompts>") -> tuple[BenchPrompt, ...]:
    prompts: list[BenchPrompt] = []
    seen: dict[str, int] = {}
    rows: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompt = _parse_line(line, f"{source}, line {number}")
        if prompt.id in seen:
            raise PromptFileError(
                f"{source}, line {number}: the id {prompt.id!r} is already used on line {seen[prompt.id]}; "
                "ids must be unique."
            )
        for row in _row_ids(prompt):  # a conversation's turns are rows "<id>/1", "<id>/2"... of the report
            if row in rows:
                raise PromptFileError(
                    f"{source}, line {number}: the report row {row!r} would also be line {rows[row]}'s; "
                    f"rename one of them (a conversation's turns are named <id>{TURN_MARK}1, <id>{TURN_MARK}2, ...)."
                )
            rows[row] = number
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{source} holds no prompts: write one JSON object per line.")
    return tuple(prompts)


def _row_ids(prompt: BenchPrompt) -> list[str]:
    if not prompt.follow_ups:
        return [prompt.id]
    return [f"{prompt.id}{TURN_MARK}{turn}" for turn in range(1, prompt.turns + 1)]


def _parse_line(line: str, where: str) -> BenchPrompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise PromptFileError(f"{where}: not valid JSON ({error.msg} at column {error.colno}).") from None
    return _parse_record(record, where)


def _parse_record(record, where: str) -> BenchPrompt:
    if not isinstance(record, dict):
        raise PromptFileError(f'{where}: expected a JSON object {{"id": ..., "kind": ..., "messages": [...]}}.')
    missing = [key for key in _KEYS if key not in record]
    if missing:
        raise PromptFileError(
            f"{where}: missing {', '.join(map(repr, missing))} (every line needs id, kind, messages)."
        )
    pid, kind, messages = record["id"], record["kind"], record["messages"]
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or not str(pid).strip():
        raise PromptFileError(f"{where}: 'id' must be a non-empty string or a number.")
    if not isinstance(kind, str) or not kind.strip():
        raise PromptFileError(f'{where}: \'kind\' must be a non-empty string, such as "reuse" or "open".')
    if not isinstance(messages, list) or not messages:
        raise PromptFileError(f'{where}: \'messages\' must be a non-empty list of {{"role", "content"}} objects.')
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str) or "role" not in message:
            raise PromptFileError(f'{where}: message {i + 1} must be {{"role": ..., "content": "text"}}.')
        if message["role"] not in ROLES:
            raise PromptFileError(
                f"{where}: message {i + 1} has the unknown role {message['role']!r}; use {', '.join(ROLES)}."
            )
    if messages[-1]["role"] == "assistant":
        raise PromptFileError(f"{where}: the last message is the assistant's; end with a user message to reply to.")
    follow_ups = record.get("follow_ups", [])
    if not isinstance(follow_ups, list) or not all(
        isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str) for m in follow_ups
    ):
        raise PromptFileError(
            f"{where}: 'follow_ups' must be a list of user messages "
            '{"role": "user", "content": "text"}, each answered in turn after the reply before it.'
        )
    clean = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    more = tuple({"role": "user", "content": m["content"]} for m in follow_ups)
    return BenchPrompt(str(pid).strip(), kind.strip(), clean, more)
