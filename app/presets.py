"""What the pair dialog chooses, as one frozen value, and where it is kept.

`PairChoice` holds every setting the dialog shows and turns into the engine's
`EngineConfig` and `SamplingConfig`. `load_choice`/`save_choice` keep the last
choice in QSettings with typed reads (Frescobaldi's way: `value(key, default,
type)`, so an ini file never hands back the string "4" for an int). Presets are
named choices kept as one JSON object under a single key: a name may hold any
character, even "/" that QSettings would read as a group separator.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

from PySide6.QtCore import QSettings

from engine.sampling import SamplingConfig
from engine.session import EngineConfig

PREFIX = "pair_dialog"
PRESETS_KEY = f"{PREFIX}/presets"

BACKENDS = ("auto", "torch", "llama.cpp")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DRAFTERS = ("model", "ngram", "none", "medusa")


@dataclass(frozen=True)
class PairChoice:
    target: str = "default"
    drafter: str = "ngram"  # "model" | "ngram" | "none" | "medusa"
    draft: str = "default"  # used when drafter is "model"
    heads: str = ""  # Medusa heads folder, used when drafter is "medusa"; "" = the heads shipped for the target
    backend: str = "auto"
    draft_backend: str = "auto"
    k_auto: bool = True
    k: int = 4  # when not automatic
    k_max: int = 16
    ngram_max: int = 3
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 512  # as the main window's DEFAULT_SAMPLING
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 0  # 0: let the backend choose
    gpu_layers: int = 0
    n_ctx: int = 0  # 0: the backend's default for the model

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            target=self.target.strip(),
            drafter=self.drafter,
            draft=self.draft.strip() if self.drafter == "model" else None,
            heads=(self.heads.strip() or None) if self.drafter == "medusa" else None,
            backend=self.backend,
            draft_backend=self.draft_backend,
            device=self.device,
            dtype=self.dtype,
            n_ctx=self.n_ctx or None,
            threads=self.threads or None,
            gpu_layers=self.gpu_layers,
            k="auto" if self.k_auto else self.k,
            k_max=self.k_max,
            ngram_max=self.ngram_max,
        )

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
            max_tokens=self.max_tokens,
        )  # fmt: skip

    @classmethod
    def from_configs(cls, config: EngineConfig, sampling: SamplingConfig) -> "PairChoice":
        """The choice that gives back these configs (for a caller that keeps its own)."""
        model = config.draft is not None
        return cls.from_dict({
            "target": config.target, "drafter": "model" if model else config.drafter,
            "draft": config.draft if model else cls.draft, "heads": config.heads or "",
            "backend": config.backend,
            "draft_backend": config.draft_backend, "k_auto": config.k == "auto",
            "k": cls.k if config.k == "auto" else config.k, "k_max": config.k_max, "ngram_max": config.ngram_max,
            "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "seed": sampling.seed, "max_tokens": sampling.max_tokens, "device": config.device,
            "dtype": config.dtype, "threads": config.threads or 0, "gpu_layers": config.gpu_layers,
            "n_ctx": config.n_ctx or 0,
        })  # fmt: skip

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PairChoice":
        """A choice from stored data; unknown keys are ignored and bad values fall back to defaults."""
        default = cls()
        values = {}
        for f in fields(cls):
            value = data.get(f.name, getattr(default, f.name))
            values[f.name] = _coerce(value, getattr(default, f.name))
        return replace(default, **_clamp_choices(values))


def _coerce(value, default):
    """`value` as the type of `default`, or `default` when it cannot be (a hand-edited file)."""
    kind = type(default)
    try:
        if kind is bool:
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        return kind(value)
    except (TypeError, ValueError):
        return default


def _clamp_choices(values: dict) -> dict:
    for name, allowed in (("backend", BACKENDS), ("draft_backend", BACKENDS), ("device", DEVICES),
                          ("dtype", DTYPES), ("drafter", DRAFTERS)):  # fmt: skip
        if values[name] not in allowed:
            values[name] = allowed[0]
    return values


def load_choice(settings: QSettings) -> PairChoice:
    default = PairChoice()
    values = {}
    for f in fields(PairChoice):
        fallback = getattr(default, f.name)
        try:
            values[f.name] = settings.value(f"{PREFIX}/{f.name}", fallback, type=type(fallback))
        except (TypeError, ValueError):  # a value the type cannot take: keep the default
            values[f.name] = fallback
    return PairChoice.from_dict(values)


def save_choice(settings: QSettings, choice: PairChoice) -> None:
    for name, value in choice.as_dict().items():
        settings.setValue(f"{PREFIX}/{name}", value)


class PresetStore:
    """Named choices in QSettings."""

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings

    def names(self) -> list[str]:
        return sorted(self._all(), key=str.casefold)

    def get(self, name: str) -> PairChoice | None:
        data = self._all().get(name)
        return None if data is None else PairChoice.from_dict(data)

    def save(self, name: str, choice: PairChoice) -> None:
        name = name.strip()
        if not name:
            raise ValueError("a preset needs a name")
        presets = self._all()
        presets[name] = choice.as_dict()
        self._write(presets)

    def delete(self, name: str) -> None:
        presets = self._all()
        if presets.pop(name, None) is not None:
            self._write(presets)

    def _all(self) -> dict[str, dict]:
        text = self.settings.value(PRESETS_KEY, "", type=str)
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            return {}  # a damaged entry must not stop the dialog from opening
        return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}

    def _write(self, presets: dict) -> None:
        self.settings.setValue(PRESETS_KEY, json.dumps(presets, sort_keys=True))
