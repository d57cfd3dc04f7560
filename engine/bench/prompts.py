"""Benchmark prompt sets: JSON Lines files, one prompt per line.

    {"id": "fix-typos", "kind": "reuse", "messages": [{"role": "user", "content": "..."}]}

`id` names the prompt in reports (unique in the file), `kind` groups prompts
(the shipped set has "reuse": answers that repeat their input, and "open":
answers that do not), `messages` is the chat the reply follows. Blank lines
are skipped; anything else that is wrong stops the load with the line number,
so a user's own file can be fixed from the message alone.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError
from engine.core.text import MESSAGE_ROLES

ROLES = MESSAGE_ROLES  # the roles every front end accepts (engine/core/text.py)
_KEYS = ("id", "kind", "messages")
SHIPPED_FILE = Path("prompts") / "bench.jsonl"


class PromptFileError(ConfigError):
    """A prompts file that cannot be read, or a line in it that is not a valid prompt."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    kind: str
    messages: tuple[dict, ...]  # {"role": ..., "content": ...} each, the reply follows the last

    def to_dict(self) -> dict:
        """JSON-ready: a line of a prompts file."""
        return {"id": self.id, "kind": self.kind, "messages": [dict(m) for m in self.messages]}

    @classmethod
    def from_dict(cls, data: dict) -> BenchPrompt:
        """The prompt `to_dict` wrote; one that is not valid raises PromptFileError, as a bad line would."""
        return _parse_record(data, "a prompt")


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
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompt = _parse_line(line, f"{source}, line {number}")
        if prompt.id in seen:
            raise PromptFileError(
                f"{source}, line {number}: the id {prompt.id!r} is already used on line {seen[prompt.id]}; "
                "ids must be unique."
            )
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{source} holds no prompts: write one JSON object per line.")
    return tuple(prompts)


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
        raise PromptFileError(f"{where}: missing {', '.join(map(repr, missing))} (every line needs id, kind, messages).")
    pid, kind, messages = record["id"], record["kind"], record["messages"]
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or not str(pid).strip():
        raise PromptFileError(f"{where}: 'id' must be a non-empty string or a number.")
    if not isinstance(kind, str) or not kind.strip():
        raise PromptFileError(f"{where}: 'kind' must be a non-empty string, such as \"reuse\" or \"open\".")
    if not isinstance(messages, list) or not messages:
        raise PromptFileError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str) or "role" not in message:
            raise PromptFileError(f'{where}: message {i + 1} must be {{"role": ..., "content": "text"}}.')
        if message["role"] not in ROLES:
            raise PromptFileError(
                f"{where}: message {i + 1} has the unknown role {message['role']!r}; use {', '.join(ROLES)}."
            )
    if messages[-1]["role"] == "assistant":
        raise PromptFileError(f"{where}: the last message is the assistant's; end with a user message to reply to.")
    clean = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    return BenchPrompt(str(pid).strip(), kind.strip(), clean)
