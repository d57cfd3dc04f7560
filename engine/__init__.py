"""SpecDeck's decoding engine: lossless speculative decoding on local models.

No Qt here: the desktop app (`app/`), the command line (`engine.cli.main`) and the
tests all drive the same Python API:

    from engine import Engine, EngineConfig, SamplingConfig
    engine = Engine.load(EngineConfig(target="default", drafter="ngram"))
    prompt = engine.prompt_ids("Summarize: ...")
    for step in engine.stream(prompt, SamplingConfig(max_tokens=128)):
        print(step.text, end="")
"""

from importlib import import_module

from engine.errors import (
    ConfigError,
    ContextOverflowError,
    IncompatiblePairError,
    ModelLoadError,
    ModelNotFoundError,
    OutOfMemoryError,
    SpecDeckError,
)

# Everything else loads torch; import it on first use so `specdeck-cli models`
# and `doctor` start quickly.
_LAZY = {
    "Divergence": "core.events", "GenerationResult": "core.events", "RunStats": "core.events",
    "Source": "core.events", "StepEvent": "core.events", "TokenInfo": "core.events",
    "SamplingConfig": "core.sampling", "Comparison": "api", "Engine": "api", "EngineConfig": "api",
}  # fmt: skip


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "Comparison",
    "ConfigError",
    "ContextOverflowError",
    "Divergence",
    "Engine",
    "EngineConfig",
    "GenerationResult",
    "IncompatiblePairError",
    "ModelLoadError",
    "ModelNotFoundError",
    "OutOfMemoryError",
    "RunStats",
    "SamplingConfig",
    "Source",
    "SpecDeckError",
    "StepEvent",
    "TokenInfo",
]
