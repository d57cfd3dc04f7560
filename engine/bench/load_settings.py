"""What a load test runs: the batch sizes, the context lengths, the modes and the reply length.

Light (no torch): the CLI checks these before anything loads, the server's bench job reads
them from a request and the client sends them (`to_dict` / `from_dict`). The sweep itself is
engine/bench/load_sweep.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from engine.bench.load_results import AUTO, VANILLA
from engine.errors import ConfigError

MAX_CONCURRENCY = 256  # requests in flight at once: far past where any CPU or GPU stops gaining
DEFAULT_FIXED_K = 4  # the fixed draft length swept beside automatic k when none is given (the article's k)
DEFAULT_BATCHES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class LoadSettings:
    batches: tuple[int, ...] = DEFAULT_BATCHES  # B: requests kept in flight at once
    # Tokens of context each request decodes after: every prompt padded to that many tokens. Empty:
    # the prompts as they are (the points then carry the median prompt length as their context).
    contexts: tuple[int, ...] = ()
    k: int = DEFAULT_FIXED_K  # the fixed-k mode's draft length; 0: no fixed-k mode
    auto: bool = True  # the automatic-k mode
    max_tokens: int = 128  # tokens per reply
    repeat: int = 1  # runs of each point (modes interleaved): the aggregate is their median
    warmup: int = 1  # warm-up runs per context before measuring (one request of each mode)
    requests: int = 0  # requests per run; 0: max(prompts, 2 B), so the batch is full for most of the run
    temperature: float = 0.0  # 0: greedy, as the benchmark
    memory_budget_bytes: int = 0  # for the draft's memory (failure mode 3); 0: the machine's available memory

    @property
    def modes(self) -> tuple[str, ...]:
        """Vanilla first, then the speculative modes, in the order each point runs them."""
        return (VANILLA,) + ((f"k={self.k}",) if self.k > 0 else ()) + ((AUTO,) if self.auto else ())

    def check(self) -> None:
        """ConfigError for a value no sweep can run, said before anything loads."""
        check_batches(self.batches)
        for context in self.contexts:
            if isinstance(context, bool) or not isinstance(context, int) or context < 1:
                raise ConfigError(f"A context length is a number of tokens, 1 or more, not {context!r}.")
        if not self.auto and self.k <= 0:
            raise ConfigError("The load test compares speculative decoding with plain: give it a k of 1 or more.")
        if self.k < 0:
            raise ConfigError(f"The fixed draft length must be 0 (none) or more, not {self.k}.")
        for name in ("max_tokens", "repeat"):
            if getattr(self, name) < 1:
                raise ConfigError(f"The load test's {name.replace('_', ' ')} must be 1 or more.")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"The temperature must be 0 (greedy) or a positive number, not {self.temperature}.")
        if self.warmup < 0 or self.requests < 0 or self.memory_budget_bytes < 0:
            raise ConfigError("The load test's warm-up, requests and memory budget cannot be negative.")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LoadSettings:
        values = dict(data)
        for name in ("batches", "contexts"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)


def parse_numbers(text: str, flag: str, what: str) -> tuple[int, ...]:
    """ "1,2,4" -> (1, 2, 4), sorted, each once; a ConfigError naming `flag` for anything else
    (an empty list, a word, a fraction, 0 or below)."""
    values = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(f"{flag} takes {what} separated by commas (such as 1,2,4,8), not {part!r}.") from None
        if value < 1:
            raise ConfigError(f"{flag} takes {what} of 1 or more, not {value}.")
        values.append(value)
    return tuple(sorted(set(values)))


def check_batches(batches) -> None:
    if not batches:
        raise ConfigError("The load test needs at least one batch size (--concurrency 1,2,4).")
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(f"A batch size is a number of requests in flight, 1 or more, not {b!r}.")
        if b > MAX_CONCURRENCY:
            raise ConfigError(
                f"A batch of {b} requests is more than the load test runs ({MAX_CONCURRENCY} at most): "
                "speculation stops paying long before that."
            )
