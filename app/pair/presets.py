"""Named model pairs: the engine's config and its sampling, kept under one settings key.

A preset is what the dialog edits, as the engine's own `EngineConfig` (its
versioned `to_dict()`) and `SamplingConfig`; `app.shell.settings` keeps them all
as one JSON object (a name may hold any character, even "/" that QSettings reads
as a group separator). `BUILTIN_PRESETS` come with the app: they are listed first
and cannot be deleted.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings

from app.shell import settings as keys
from engine import EngineConfig, SamplingConfig

# The pair every install has: the embedded model on PyTorch (bf16 where the CPU has it) as the
# target, drafted by its own Q4_1 GGUF on llama.cpp (same vocabulary; quantized self-drafting).
# The draft's dtype is the file's own: the target's dtype does not reach a llama.cpp draft.
SELF_DRAFT_PRESET = "embedded model, drafted by its own Q4_1"
BUILTIN_PRESETS = {
    SELF_DRAFT_PRESET: (
        EngineConfig(target="default", backend="torch").with_drafter("model", draft="default", backend="llama.cpp"),
        keys.DEFAULT_SAMPLING,
    ),
}


class PresetStore:
    """Named pairs in QSettings (`names`, `get`, `save`, `delete`); the built-in presets are
    `builtin_names`, and `get` falls back to them when no saved preset has the name."""

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings

    def names(self) -> list[str]:
        return sorted(keys.presets(self.settings), key=str.casefold)

    def builtin_names(self) -> list[str]:
        """Built-in presets that no saved one of the same name replaces."""
        saved = keys.presets(self.settings)
        return [name for name in BUILTIN_PRESETS if name not in saved]

    def get(self, name: str) -> tuple[EngineConfig, SamplingConfig] | None:
        """The preset's config and sampling; None when there is none of that name, or it cannot be read."""
        data = keys.presets(self.settings).get(name)
        if data is None:
            return BUILTIN_PRESETS.get(name)
        config = keys.config_from_json(data.get("config"))
        sampling = keys.sampling_from_dict(data.get("sampling", {}))
        return None if config is None or sampling is None else (config, sampling)

    def save(self, name: str, config: EngineConfig, sampling: SamplingConfig) -> None:
        name = name.strip()
        if not name:
            raise ValueError("a preset needs a name")
        presets = keys.presets(self.settings)
        presets[name] = keys.preset_value(config, sampling)
        keys.set_presets(presets, self.settings)

    def delete(self, name: str) -> None:
        presets = keys.presets(self.settings)
        if presets.pop(name, None) is not None:
            keys.set_presets(presets, self.settings)
