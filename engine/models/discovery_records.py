"""The records of drafter discovery (discovery.py finds them): a candidate, a model left out, the whole
answer, and the answer in words. Light: the CLI prints them, the app shows them, and they travel as JSON.
"""

from __future__ import annotations

import os
import shlex
import textwrap
from dataclasses import asdict, dataclass, field, fields

MODEL, HEADS, MTP, ASSISTANT, NO_FILES = "model", "heads", "mtp", "assistant", "no files"
# The prior (higher first): what usually pays most, before anything is measured.
PRIOR = {"mtp": 90, "assistant": 88, "eagle3": 86, "eagle": 84, "medusa": 80, "model": 70}


@dataclass(frozen=True)
class Candidate:
    kind: str  # MODEL, HEADS, MTP, ASSISTANT or NO_FILES
    drafter: str  # the registry name to choose ("model", "medusa", "ngram"...)
    name: str  # what a user calls it
    path: str  # the file or folder; "" for a drafter that needs none
    why: str  # the check's words: what fits, what to expect
    score: float  # the prior (see the module doc); measured candidates rank by `speedup`
    option: str = ""  # the drafter's option that takes `spec` ("draft", "heads"); "" when none
    spec: str = ""  # what to give that option (a model spec, a folder)
    tokens_per_s: float | None = None  # measured (engine/bench/discovery_measure.py)
    speedup: float | None = None  # measured tokens/s over plain decoding's
    note: str = ""  # what the measurement said ("not measured: ...")

    @property
    def cli(self) -> str:
        """The command-line options that choose it: "--drafter model --draft SPEC"."""
        flag = {"draft": "--draft", "heads": "--heads"}.get(self.option, f"--{self.option.replace('_', '-')}")
        return f"--drafter {self.drafter}" + (f" {flag} {shlex.quote(self.spec)}" if self.option else "")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class LeftOut:
    kind: str  # what it would have been: MODEL, HEADS, MTP, ASSISTANT or NO_FILES
    name: str
    path: str
    reason: str  # why not, in words a user can act on

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LeftOut:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Discovery:
    target: str  # its name
    target_spec: str
    target_path: str
    backend: str  # where the target runs unless a drafter needs PyTorch: "llama.cpp" or "torch"
    candidates: tuple[Candidate, ...]  # ranked, best first
    left_out: tuple[LeftOut, ...]
    vanilla_tokens_per_s: float | None = None  # measured plain decoding (None: not measured)
    measured_s: float = 0.0  # seconds of generation the measurement took (loads not counted)

    @property
    def measured(self) -> bool:
        return self.vanilla_tokens_per_s is not None

    @property
    def verdict(self) -> str:
        """After a measurement, one sentence when no candidate beat plain decoding; "" otherwise."""
        speedups = [c.speedup for c in self.candidates if c.speedup is not None]
        if not self.measured or not speedups or max(speedups) > 1.0:
            return ""
        return (
            "None of them beat plain decoding on this machine now: decode without a drafter (--drafter none), "
            "or measure again when the machine is less busy."
        )

    def to_dict(self) -> dict:
        return {
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("candidates", "left_out")},
            "candidates": [c.to_dict() for c in self.candidates],
            "left_out": [x.to_dict() for x in self.left_out],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Discovery:
        plain = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        plain["candidates"] = tuple(Candidate.from_dict(c) for c in data.get("candidates", ()))
        plain["left_out"] = tuple(LeftOut.from_dict(x) for x in data.get("left_out", ()))
        return cls(**plain)

    def __str__(self) -> str:
        return format_discovery(self)


@dataclass
class Found:
    """What discovery has found so far (discovery.py and discovery_folders.py add to it)."""

    candidates: list[Candidate] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # real paths already judged

    def first_time(self, path: str) -> bool:
        key = os.path.realpath(path)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


# -- words ------------------------------------------------------------------------------------


def format_discovery(found: Discovery, width: int = 100) -> str:
    """The candidates, ranked, with how to choose each, then what was left out and why."""

    def wrap(text: str) -> list[str]:
        return textwrap.wrap(text, width, initial_indent=" " * 7, subsequent_indent=" " * 7)

    lines = [f"Drafters for {found.target} ({found.target_path}), runs on {found.backend}:"]
    if found.measured:
        lines.append(
            f"Measured for {found.measured_s:.1f} s of generation: plain decoding "
            f"{found.vanilla_tokens_per_s:.1f} tokens/s."
        )
        lines += [found.verdict] if found.verdict else []
    for i, c in enumerate(found.candidates, 1):
        where = f"  {c.path}" if c.path else ""
        lines.append(f"  {i:>2}. {c.name} [{c.drafter}]{where}")
        if c.speedup is not None:
            lines.append(f"       measured: {c.tokens_per_s:.1f} tokens/s, {c.speedup:.2f}x plain decoding")
        elif c.note:
            lines += wrap(c.note)
        lines += wrap(c.why)
        lines.append(f"       use: {c.cli}")
    if not found.candidates:
        lines.append("  (none)")
    lines += ["", f"Left out ({len(found.left_out)}):"]
    for x in found.left_out:
        lines.append(f"  - {x.name}  {x.path}".rstrip())
        lines += wrap(x.reason)
    if not found.left_out:
        lines.append("  (none)")
    return "\n".join(lines)
