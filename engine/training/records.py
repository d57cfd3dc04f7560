"""What a training run takes and reports: settings, progress, the result, a saved run's summary.

Light (no torch): train_heads (medusa.py) and checkpoint_info (checkpoint.py) need
torch and run in the engine; these records travel from the engine server to the app
as JSON. Each has `to_dict()`, its fields as JSON-ready data (tuples as lists), and
`from_dict()`, which gives back an equal record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.errors import ConfigError

KINDS = ("medusa", "eagle", "eagle3")
EAGLE3_DEPTHS = 7  # how deep EAGLE-3's training-time test unrolls the head (engine/training/eagle3.py)
OBJECTIVES = ("features", "kl")
BUILTIN = "builtin"  # the data source that reads the built-in corpus (data.py)
DEFAULT_BUILTIN_CHARS = 4_000_000  # ~1M tokens: more than a few thousand steps of a small model need
DEFAULT_CACHE_TOKENS = 262_144  # hidden states cached for "features": ~10 minutes of a small target on 2 cores
DEFAULT_DRAFT_VOCAB = 8192  # ids the shipped EAGLE head may propose: most frequent in the training text


@dataclass(frozen=True)
class TrainProgress:
    """One report from a training run; the CLI prints some, the app draws all."""

    phase: str  # "data" | "generate" | "load" | "cache" | "train" | "checkpoint" | "validate" | "done" | "cancelled"
    step: int  # training steps done (in "generate": replies written; in "cache": windows cached)
    steps: int  # steps asked for (in "generate": replies asked for; in "cache": windows to cache)
    loss: float | None = None  # this step's weighted loss (sum_k 0.8^k loss_k; "kl": KL_k in nats)
    head_loss: tuple[float, ...] = ()  # loss per head, this step (held-out KL per head in "done")
    head_accuracy: tuple[float, ...] = ()  # share of positions where head k's argmax is the target's
    tokens_per_s: float = 0.0  # target tokens trained on per second (recent steps)
    eta_s: float | None = None
    message: str = ""
    step_s: float = 0.0  # seconds per training step (recent steps)

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.steps) if self.steps else 0.0

    def to_dict(self) -> dict:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> TrainProgress:
        return cls(**_with_tuples(cls, _known(cls, data)))


@dataclass(frozen=True)
class TrainResult:
    out_dir: str
    step: int
    steps: int
    cancelled: bool
    final_loss: float | None  # mean of the last steps' losses
    head_accuracy: tuple[float, ...]  # on the held-out windows; () when the run did not finish
    head_loss: tuple[float, ...]  # held-out KL per head
    tokens_per_s: float
    training: dict = field(default_factory=dict)  # what went into MedusaConfig.training

    def as_dict(self) -> dict:
        return asdict(self)

    def to_dict(self) -> dict:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> TrainResult:
        return cls(**_with_tuples(cls, _known(cls, data)))


@dataclass(frozen=True)
class TrainSettings:
    target: str
    data: tuple[str, ...]  # "builtin" and/or file or folder paths
    self_generate: int = 0  # prompts the target answers itself, added to the data
    num_heads: int = 4
    num_layers: int = 1
    steps: int = 2000
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    checkpoint_every: int = 100
    gen_max_tokens: int = 256
    gen_temperature: float = 0.0
    val_windows: int | None = None
    max_builtin_chars: int = DEFAULT_BUILTIN_CHARS
    objective: str = "features"
    cache_tokens: int = DEFAULT_CACHE_TOKENS  # "features": target hidden states to cache (0: the whole corpus)
    kind: str = "medusa"  # "medusa" | "eagle" | "eagle3"
    draft_vocab: int = DEFAULT_DRAFT_VOCAB  # eagle, eagle3: ids the head may propose (0 = the whole vocabulary)

    @classmethod
    def of(cls, target: str, data: str | Sequence[str] | None, **values) -> TrainSettings:
        """Settings for `target` trained on `data` (one source, several, or None with self_generate),
        the other fields as keywords: `TrainSettings.of("default", "builtin", steps=2000)`."""
        sources = (data,) if isinstance(data, str) else tuple(data or ())
        return cls(target=target, data=tuple(str(source) for source in sources), **values)

    def to_dict(self) -> dict:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> TrainSettings:
        return cls(**_with_tuples(cls, _known(cls, data)))

    def check(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"Unknown kind of heads {self.kind!r}: choose 'medusa', 'eagle' or 'eagle3'.")
        if self.kind in ("eagle", "eagle3") and self.objective != "features":
            raise ConfigError(
                "EAGLE and EAGLE-3 heads train on the target's cached features (--objective features); "
                "the kl objective is for Medusa heads."
            )
        if self.kind == "eagle3" and self.seq_len < EAGLE3_DEPTHS + 2:
            raise ConfigError(
                f"EAGLE-3 training unrolls the head {EAGLE3_DEPTHS} tokens deep, so the sequence length must be "
                f"at least {EAGLE3_DEPTHS + 2}, got {self.seq_len}."
            )
        if self.draft_vocab < 0:
            raise ConfigError(f"The draft vocabulary must be 0 (all ids) or more ids, got {self.draft_vocab}.")
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"Unknown training objective {self.objective!r}: choose 'features' (fast: regression on cached "
                "target features) or 'kl' (exact full-vocabulary distillation, slow)."
            )
        if self.cache_tokens < 0:
            raise ConfigError(f"The number of cached tokens must be 0 (all) or more, got {self.cache_tokens}.")
        if not self.data and self.self_generate <= 0:
            raise ConfigError("No training data: give --data (a file, a folder or 'builtin') and/or --self-generate N.")
        limits = (
            ("The number of heads", self.num_heads, 1, 16),
            ("The number of layers per head", self.num_layers, 1, 8),
            ("The number of steps", self.steps, 1, None),
            ("The batch size", self.batch_size, 1, None),
            ("The checkpoint interval", self.checkpoint_every, 1, None),
            ("The number of self-generated replies", self.self_generate, 0, None),
            ("The sequence length (longer than the number of heads + 1)", self.seq_len, self.num_heads + 2, None),
        )
        for name, value, low, high in limits:
            if value < low or (high is not None and value > high):
                bound = f"from {low} to {high}" if high is not None else f"at least {low}"
                raise ConfigError(f"{name} must be {bound}, got {value}.")
        if not self.lr > 0:
            raise ConfigError(f"The learning rate must be positive, got {self.lr}.")
        for source in self.data:  # before anything is replaced or loaded
            if source != BUILTIN and not Path(source).expanduser().exists():
                raise ConfigError(
                    f"No training data at {source}: give a .txt, .md or .jsonl file, a folder of them, or 'builtin'."
                )


@dataclass(frozen=True)
class CheckpointInfo:
    """What a folder's saved run is, for a front end that asks "resume or start over?"."""

    step: int
    steps: int
    finished: bool
    settings: dict  # the TrainSettings it was saved with, as a dict (older runs may lack newer fields)

    def to_dict(self) -> dict:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> CheckpointInfo:
        settings = dict(data["settings"])
        if isinstance(settings.get("data"), list):  # the one tuple in TrainSettings
            settings["data"] = tuple(settings["data"])
        return cls(int(data["step"]), int(data["steps"]), bool(data["finished"]), settings)


# -- plain data ---------------------------------------------------------------------------


def _plain(value):
    """`value` as JSON has it: tuples (inside dicts and lists too) as lists."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _known(cls, data: dict) -> dict:
    """The entries of `data` that are fields of `cls` (a newer engine's extra fields are left out)."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _with_tuples(cls, values: dict) -> dict:
    """Fields declared as tuples back as tuples (JSON has lists only)."""
    return {
        key: tuple(value) if isinstance(value, list) and key in _TUPLE_FIELDS[cls] else value
        for key, value in values.items()
    }


_TUPLE_FIELDS = {
    cls: {f.name for f in fields(cls) if str(f.type).startswith("tuple")}
    for cls in (TrainProgress, TrainResult, TrainSettings)
}
