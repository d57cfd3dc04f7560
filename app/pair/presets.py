"""What the pair dialog chooses, as one frozen value, and where it is kept.

`PairChoice` holds every setting the dialog shows and turns into the engine's
`EngineConfig` and `SamplingConfig`. `load_choice`/`save_choice` keep the last
choice in QSettings with typed reads (Frescobaldi's way: `value(key, default,
type)`, so an ini file never hands back the string "4" for an int). Presets are
named choices kept as one JSON object under a single key: a name may hold any
character, even "/" that QSettings would read as a group separator.
`BUILTIN_PRESETS` come with the app: they are listed first and cannot be deleted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

from PySide6.QtCore import QSettings

from engine.core.sampling import SamplingConfig
from engine.api import EngineConfig

PREFIX = "pair_dialog"
PRESETS_KEY = f"{PREFIX}/presets"

BACKENDS = ("auto", "torch", "llama.cpp")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DRAFTERS = ("model", "ngram", "none", "medusa", "eagle", "lookahead", "early-exit")
# Drafters that need the target on PyTorch (as engine.models.loading.TORCH_DRAFTERS; not imported: it loads torch).
TORCH_DRAFTERS = ("medusa", "eagle", "lookahead", "early-exit")
AUTO = "auto"
# Settings that are "auto" or a whole number, kept as text: what the user typed, even a bad "0",
# reaches the check, which says what is wrong (the engine's own rules), instead of vanishing.
AUTO_NUMBERS = ("tree_depth", "lookahead_window", "lookahead_ngram", "lookahead_candidates", "exit_layer")


@dataclass(frozen=True)
class PairChoice:
    target: str = "default"
    drafter: str = "ngram"  # one of DRAFTERS
    draft: str = "default"  # used when drafter is "model"
    heads: str = ""  # Medusa heads folder, used when drafter is "medusa"; "" = the heads shipped for the target
    eagle_heads: str = ""  # EAGLE head folder, used when drafter is "eagle"; "" = the head shipped for the target
    tree_depth: str = AUTO  # EAGLE: deepest level of the draft tree, "auto" or a number
    lookahead_window: str = AUTO  # lookahead: W, future positions guessed per step
    lookahead_ngram: str = AUTO  # lookahead: N, tokens per n-gram
    lookahead_candidates: str = AUTO  # lookahead: G, n-grams verified per step
    exit_layer: str = AUTO  # early exit: the draft runs the target's first L layers
    backend: str = "auto"
    draft_backend: str = "auto"
    k_auto: bool = True
    k: int = 4  # when not automatic
    k_max: int = 16
    ngram_max: int = 3
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
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
            heads=self.heads_folder() or None,
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
            tree_depth=_number(self.tree_depth, None) if self.drafter == "eagle" else None,
            lookahead=self.lookahead() if self.drafter == "lookahead" else (AUTO, AUTO, AUTO),
            exit_layer=_number(self.exit_layer, AUTO) if self.drafter == "early-exit" else AUTO,
        )

    def heads_folder(self) -> str:
        """The heads folder the chosen drafter reads ("" = the shipped one, or a drafter without heads)."""
        folder = {"medusa": self.heads, "eagle": self.eagle_heads}.get(self.drafter, "")
        return folder.strip()

    def lookahead(self) -> tuple:
        """(W, N, G) for EngineConfig.lookahead: each "auto" or an int."""
        return tuple(_number(v, AUTO) for v in (self.lookahead_window, self.lookahead_ngram,
                                                  self.lookahead_candidates))  # fmt: skip

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed,
            max_tokens=self.max_tokens,
        )  # fmt: skip

    @classmethod
    def from_configs(cls, config: EngineConfig, sampling: SamplingConfig) -> "PairChoice":
        """The choice that gives back these configs (for a caller that keeps its own)."""
        model = config.draft is not None
        window, ngram, candidates = (tuple(config.lookahead) + (AUTO,) * 3)[:3]
        return cls.from_dict({
            "target": config.target, "drafter": "model" if model else config.drafter,
            "draft": config.draft if model else cls.draft,
            "heads": (config.heads or "") if config.drafter == "medusa" else "",
            "eagle_heads": (config.heads or "") if config.drafter == "eagle" else "",
            "tree_depth": AUTO if config.tree_depth is None else config.tree_depth,
            "lookahead_window": window, "lookahead_ngram": ngram, "lookahead_candidates": candidates,
            "exit_layer": config.exit_layer,
            "backend": config.backend,
            "draft_backend": config.draft_backend, "k_auto": config.k == "auto",
            "k": cls.k if config.k == "auto" else config.k, "k_max": config.k_max, "ngram_max": config.ngram_max,
            "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p,
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
    for name in AUTO_NUMBERS:
        values[name] = auto_or_number(values[name])
    return values


def auto_or_number(text) -> str:
    """"auto" or the digits of a whole number ("0" too: the check explains why it will not do);
    anything else (a hand-edited file) becomes "auto"."""
    text = str(text).strip().lower().removeprefix("+")
    return str(int(text)) if text.isdigit() and text.isascii() else AUTO


def _number(text: str, auto):
    """An AUTO_NUMBERS setting for EngineConfig: `auto` for "auto", else the int."""
    text = auto_or_number(text)
    return auto if text == AUTO else int(text)


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


# The pair every install has: the embedded model on PyTorch (bf16 where the CPU has it) as the
# target, drafted by its own Q4_1 GGUF on llama.cpp (same vocabulary; quantized self-drafting).
# The draft's dtype is the file's own: the target's dtype does not reach a llama.cpp draft.
SELF_DRAFT_PRESET = "embedded model, drafted by its own Q4_1"
BUILTIN_PRESETS = {
    SELF_DRAFT_PRESET: PairChoice(target="default", backend="torch", drafter="model", draft="default",
                                  draft_backend="llama.cpp", k_auto=True),  # fmt: skip
}


class PresetStore:
    """Named choices in QSettings (`names`, `get`, `save`, `delete`); the built-in presets are
    `builtin_names`, and `get` falls back to them when no saved preset has the name."""

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings

    def names(self) -> list[str]:
        return sorted(self._all(), key=str.casefold)

    def builtin_names(self) -> list[str]:
        """Built-in presets that no saved one of the same name replaces."""
        saved = self._all()
        return [name for name in BUILTIN_PRESETS if name not in saved]

    def get(self, name: str) -> PairChoice | None:
        data = self._all().get(name)
        return BUILTIN_PRESETS.get(name) if data is None else PairChoice.from_dict(data)

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
