"""`SamplingConfig`: how tokens are drawn, as plain data (no torch).

`engine.core.sampling` turns it into distributions; this module only holds and
checks the settings, so the desktop app and the engine server's wire can use it
without loading torch.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, replace

from engine.errors import ConfigError

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off; else keep tokens at least min_p times as likely as the most likely one
    seed: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Infinite temperature passes `>= 0` and flattens p into uniform noise; NaN fails every
        # comparison. Both are typing mistakes, so say the range instead of sampling noise.
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ConfigError(
                f"temperature must be 0 (greedy) or a finite positive number (0.7 is typical), got {self.temperature}."
            )
        if self.top_k < 0:
            raise ConfigError(f"top-k must be 0 (off) or a positive number of tokens, got {self.top_k}.")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}; use 1 to turn it off.")
        if not (math.isfinite(self.min_p) and 0.0 <= self.min_p < 1.0):
            raise ConfigError(f"min-p must be in [0, 1), got {self.min_p}; use 0 to turn it off (0.05 is typical).")
        if not SEED_MIN <= self.seed <= SEED_MAX:  # what a random generator's seed can hold (torch's range)
            given = self.seed if abs(self.seed).bit_length() <= 128 else f"a {abs(self.seed).bit_length()}-bit number"
            raise ConfigError(f"the seed must be a whole number from {SEED_MIN} to {SEED_MAX}, got {given}.")
        if self.max_tokens < 1:
            raise ConfigError(f"max tokens must be at least 1, got {self.max_tokens}.")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must not be empty.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def for_chat(cls, recommended: dict | None = None) -> SamplingConfig:
        """CHAT_DEFAULT with what the model recommends in its files (engine.models.recommended),
        when that samples: a recommended temperature 0 is most often `do_sample: false`, the
        transformers default copied into generation_config.json, not a choice for chat."""
        recommended = dict(recommended or {})
        if not recommended or recommended.get("temperature", CHAT_DEFAULT.temperature) <= 0:
            return CHAT_DEFAULT
        # The model's own values replace ours; a filter it does not name is off, as the model was tuned.
        return replace(CHAT_DEFAULT, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **recommended})

    def as_greedy(self) -> SamplingConfig:
        """These settings decoding greedily (the side by side's: identical outputs are its point);
        the seed, length and stop strings stay."""
        return replace(self, temperature=0.0)

    def with_new_seed(self) -> SamplingConfig:
        """These settings with a fresh random seed (Regenerate: another draw, not the same reply)."""
        return replace(self, seed=secrets.randbits(63))


# What a chat reply is sampled with when neither the user nor the model says otherwise
# (`SamplingConfig.for_chat`): llama.cpp's own defaults (common_params_sampling: temperature 0.8,
# top-k 40, top-p 0.95, min-p 0.05), which llama-server, llama-cli and LM Studio start from and
# Ollama nearly shares (top-p 0.9). Greedy decoding gives the same reply every time, so Regenerate
# would show nothing new: a chat app samples. Greedy stays where identity is the point: the side by
# side. The dataclass's own default stays greedy: the CLI, the benchmark and tests decode greedily.
CHAT_DEFAULT = SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
