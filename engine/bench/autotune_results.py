"""What auto-tune tries and what it found: candidates, their scores, the ranking (autotune.py runs it).

Light (no torch): the engine server sends these records to the app as JSON.
Each has `to_dict()`, its fields as JSON-ready data (the proposed EngineConfig as
`EngineConfig.to_dict` writes it), and `from_dict()`, which gives back an equal record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.bench.results import known_fields
from engine.config import EngineConfig
from engine.errors import ConfigError

CHAIN_KS = ("auto", 2, 4, 8)  # draft lengths tried for drafters that draft one chain
TREE_KS = ("auto", 8, 16)  # node budgets tried for tree drafters (on a backend that verifies trees)


@dataclass(frozen=True)
class AutotuneSettings:
    max_tokens: int = 48  # short replies: many candidates, each on every prompt
    warmup: bool = True  # one short generation per candidate on the first prompt, not measured

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max tokens must be at least 1, got {self.max_tokens}.")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AutotuneSettings:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True)
class Candidate:
    drafter: str  # a registry name; "model" = the loaded draft model
    k: int | str  # draft length, or node budget for a tree drafter; "auto" = chosen as it decodes
    budget: bool = False  # k is a tree's node budget (registry.node_budget: trees, on a target that verifies them)

    @property
    def label(self) -> str:
        if self.drafter == "none":
            return "plain decoding"
        return f"{self.drafter}, {'node budget' if self.budget else 'k'} {self.k}"

    def to_dict(self) -> dict:
        return {"drafter": self.drafter, "k": self.k, "budget": self.budget}

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        return cls(data["drafter"], data["k"], bool(data.get("budget", False)))


PLAIN = Candidate("none", 0)  # the baseline, ranked with the others: it may be the fastest


@dataclass(frozen=True)
class CandidateResult:
    candidate: Candidate
    speedup: float  # decoding speedup: geometric mean over prompts of speculative tokens/s / vanilla tokens/s
    tokens_per_s: float  # median over prompts
    acceptance: float  # pooled accepted / tested (per-token acceptance a)
    tokens_per_forward: float  # pooled (mean acceptance length)
    identical: int  # prompts whose output equals plain decoding's
    prompts: int
    draft_acceptance: float = 0.0  # pooled accepted / drafted (0 from an engine older than this field)

    def to_dict(self) -> dict:
        return {**asdict(self), "candidate": self.candidate.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> CandidateResult:
        return cls(**{**known_fields(cls, data), "candidate": Candidate.from_dict(data["candidate"])})


@dataclass(frozen=True)
class AutotuneResult:
    ranked: tuple[CandidateResult, ...]  # fastest first, plain decoding (speedup 1) among them
    vanilla_tps: float  # median over prompts
    best_config: EngineConfig  # the loaded config with the fastest candidate's drafter and k
    prompts: int
    max_tokens: int

    @property
    def best(self) -> CandidateResult:
        return self.ranked[0]

    @property
    def beats_vanilla(self) -> bool:
        return self.best.candidate != PLAIN

    def to_dict(self) -> dict:
        return {
            "ranked": [r.to_dict() for r in self.ranked],
            "vanilla_tps": self.vanilla_tps,
            "best_config": self.best_config.to_dict(),
            "prompts": self.prompts,
            "max_tokens": self.max_tokens,
        }

    @classmethod
    def from_dict(cls, data: dict) -> AutotuneResult:
        """Raises ConfigError when the proposed config names a drafter this SpecDeck does not know."""
        return cls(
            ranked=tuple(CandidateResult.from_dict(r) for r in data["ranked"]),
            vanilla_tps=data["vanilla_tps"],
            best_config=EngineConfig.from_dict(data["best_config"]),
            prompts=data["prompts"],
            max_tokens=data["max_tokens"],
        )


def format_autotune(result: AutotuneResult) -> str:
    """The ranked table as text, fastest first, and the proposal."""
    lines = [
        f"Auto-tune: {result.prompts} prompts, {result.max_tokens} tokens a reply, greedy; "
        f"plain decoding {result.vanilla_tps:.1f} tok/s; decoding speedup: geometric mean over the prompts",
        f"{'#':>2}  {'drafter':<14} {'k':>5} {'decoding speedup':>16} {'tok/s':>8} {'draft acceptance':>16} "
        f"{'mean acceptance length':>22} {'same':>6}",
    ]
    for rank, r in enumerate(result.ranked, start=1):
        lines.append(
            f"{rank:>2}  {r.candidate.drafter:<14} {str(r.candidate.k):>5} {r.speedup:>15.2f}× "
            f"{r.tokens_per_s:>8.1f} {r.draft_acceptance:>16.0%} {r.tokens_per_forward:>22.2f} "
            f"{r.identical:>3}/{r.prompts:<2}"
        )
    best = result.best
    verdict = "" if result.beats_vanilla else " (no candidate beat plain decoding here)"
    lines.append(f"Best: {best.candidate.label}, {best.speedup:.2f}× plain decoding{verdict}.")
    return "\n".join(lines)
