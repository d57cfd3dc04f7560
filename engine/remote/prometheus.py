"""Prometheus text exposition format (version 0.0.4), read exactly: what vLLM and SGLang serve at /metrics.

    scrape = parse(server.get_text("/metrics"))
    scrape.total("vllm:spec_decode_num_drafts_total")                 # summed over every label set
    scrape.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")  # {"0": 12.0, ...}
    difference(before, after, "vllm:spec_decode_num_drafts_total")   # what one request added

The format (https://prometheus.io/docs/instrumenting/exposition_formats/): one sample a line,
`name{label="value",...} value [timestamp_ms]`; label values escape `\\`, `\"` and `\n`; values are
Go floats (`NaN`, `+Inf`, `-Inf` included); `# HELP name text` and `# TYPE name type` describe a
family, any other `#` line is a comment. A line that is none of these raises ValueError with its
number: a scrape is either read as the server wrote it or not at all.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted by label name
    value: float
    timestamp_ms: int | None = None

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class Scrape:
    """One /metrics answer: its samples in order, and each family's # TYPE and # HELP."""

    samples: tuple[Sample, ...] = ()
    types: dict[str, str] = field(default_factory=dict)
    help: dict[str, str] = field(default_factory=dict)

    def matching(self, name: str, **labels: str) -> list[Sample]:
        """The samples named `name` whose labels include every `labels` item."""
        return [s for s in self.samples if s.name == name and all(s.label(k) == v for k, v in labels.items())]

    def total(self, name: str, **labels: str) -> float | None:
        """The sum of the matching samples (a counter over several engines or label sets); None when
        the scrape has none, which is not the same as a counter at 0."""
        found = self.matching(name, **labels)
        return math.fsum(s.value for s in found) if found else None

    def by_label(self, name: str, key: str, **labels: str) -> dict[str, float]:
        """The matching samples summed per value of label `key` (e.g. vLLM's per-position counters)."""
        out: dict[str, float] = {}
        for sample in self.matching(name, **labels):
            value = sample.label(key)
            if value is not None:
                out[value] = out.get(value, 0.0) + sample.value
        return out


def difference(before: Scrape, after: Scrape, name: str, **labels: str) -> float | None:
    """How much a counter rose between two scrapes; None when either lacks it, or when it fell (the
    server restarted in between: the rise is not known)."""
    old, new = before.total(name, **labels), after.total(name, **labels)
    if old is None or new is None or new < old:
        return None
    return new - old


def parse(text: str) -> Scrape:
    samples: list[Sample] = []
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            if line.startswith("#"):
                _comment(line, types, helps)
            else:
                samples.append(_sample(line))
        except ValueError as error:
            raise ValueError(f"line {number} of the metrics is not Prometheus text ({error}): {line[:120]!r}") from None
    return Scrape(tuple(samples), types, helps)


# -- one line -------------------------------------------------------------------------------


def _comment(line: str, types: dict[str, str], helps: dict[str, str]) -> None:
    parts = line[1:].lstrip().split(None, 2)
    if len(parts) >= 2 and parts[0] in ("HELP", "TYPE"):
        if not _NAME.fullmatch(parts[1]):
            raise ValueError(f"bad metric name {parts[1]!r}")
        rest = parts[2] if len(parts) == 3 else ""
        if parts[0] == "TYPE":
            types[parts[1]] = rest.strip()
        else:
            helps[parts[1]] = re.sub(r"\\([\\n])", lambda m: "\n" if m.group(1) == "n" else "\\", rest)


def _sample(line: str) -> Sample:
    match = _NAME.match(line)
    if not match:
        raise ValueError("no metric name")
    name, pos = match.group(), match.end()
    labels: list[tuple[str, str]] = []
    if pos < len(line) and line[pos] == "{":
        labels, pos = _labels(line, pos + 1)
    fields = line[pos:].split()
    if not fields or len(fields) > 2 or (pos < len(line) and not line[pos].isspace()):
        raise ValueError("expected a value and at most a timestamp after the name and labels")
    value = _float(fields[0])
    timestamp = int(fields[1]) if len(fields) == 2 else None
    return Sample(name, tuple(sorted(labels)), value, timestamp)


def _labels(line: str, pos: int) -> tuple[list[tuple[str, str]], int]:
    """The label set starting at `pos` (just after `{`), and where the text after `}` starts."""
    labels: list[tuple[str, str]] = []
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match or line[match.end() : match.end() + 2] != '="':
            raise ValueError('expected label="value"')
        value, pos = _quoted(line, match.end() + 2)
        labels.append((match.group(), value))
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":  # a trailing comma before } is allowed
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            raise ValueError("expected , or } after a label")


def _quoted(line: str, pos: int) -> tuple[str, int]:
    """The escaped label value starting at `pos` (just after the opening quote), and the position after
    its closing quote."""
    out: list[str] = []
    while pos < len(line):
        char = line[pos]
        if char == '"':
            return "".join(out), pos + 1
        if char == "\\":
            escaped = line[pos + 1 : pos + 2]
            if escaped not in _ESCAPES:
                raise ValueError(f"bad escape \\{escaped} in a label value")
            out.append(_ESCAPES[escaped])
            pos += 2
        else:
            out.append(char)
            pos += 1
    raise ValueError("unterminated label value")


def _float(text: str) -> float:
    special = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
    if text.lower() in special:
        return special[text.lower()]
    if "_" in text:  # Python's float() takes 1_000; the format does not
        raise ValueError(f"bad value {text!r}")
    return float(text)  # ValueError for anything else
