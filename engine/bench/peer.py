"""A benchmark peer: what it is (`Peer`: generate, close), how it is named and made (`PeerSpec`) and
what one reply of it measured (`PeerOutput`).

A leaf, below peers.py (the peers run in this process, and running them) and llama_server_peers.py
(llama-server as peers), which peers.py imports when the target runs on llama.cpp: when these records
lived in peers.py, the two imported each other (issue 37, part 5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.bench.prompts import BenchPrompt


@dataclass(frozen=True)
class PeerOutput:
    text: str
    tokens: int  # generated token ids, the end-of-turn token not counted
    decode_s: float  # from the first generated token to the last
    decode_tokens: int  # tokens generated in decode_s
    token_ids: tuple[int, ...] | None = None  # when the peer exposes them

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


class Peer(Protocol):
    def generate(self, prompt: BenchPrompt, prompt_ids: list[int], max_tokens: int) -> PeerOutput: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PeerSpec:
    name: str
    mode: str  # VANILLA or SPECULATIVE: which of our runs it stands beside
    make: Callable[[], Peer]  # loads it; called when its turn comes, so a failed load is its own failure
