"""SpecDeck's decoding engine: lossless speculative decoding on local models.

No Qt here: the desktop app (`app/`), the command line (`engine.cli`) and the
tests all drive the same Python API:

    from engine import Engine, EngineConfig, SamplingConfig
    engine = Engine.load(EngineConfig(target="default", drafter="ngram"))
    prompt = engine.prompt_ids("Summarize: ...")
    for step in engine.stream(prompt, SamplingConfig(max_tokens=128)):
        print(step.text, end="")
"""

from .errors import (
    ConfigError,
    ContextOverflowError,
    IncompatiblePairError,
    ModelLoadError,
    ModelNotFoundError,
    OutOfMemoryError,
    SpecDeckError,
)
from .events import Divergence, GenerationResult, RunStats, Source, StepEvent, TokenInfo
from .sampling import SamplingConfig
from .session import Comparison, Engine, EngineConfig

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
