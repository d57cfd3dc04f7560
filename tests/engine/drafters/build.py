"""How these tests make a drafter or a config the way they did before the registry: by kind and options."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.config import EngineConfig, from_legacy
from engine.drafters import registry


def make_drafter(kind: str, target, **options):
    """The registry's drafter `kind` on `target`, with these of its options."""
    return registry.make_drafter(target, EngineConfig().with_drafter(kind, **options))


def legacy_config(**flat) -> EngineConfig:
    """An EngineConfig from the flat fields EngineConfig took before version 1 (draft=, heads=, lookahead=...)."""
    return from_legacy(flat)


TOY_FOLDER = str(Path(__file__).parent / "toy")  # toy_spec.py: the "repeat" drafter, in one module


@contextmanager
def toy_drafter() -> Iterator[None]:
    """The toy "repeat" drafter registered for the block: its folder on `engine.drafters.__path__`,
    as a module installed there would be; gone again afterwards."""
    import engine.drafters

    engine.drafters.__path__.append(TOY_FOLDER)
    registry.rescan()
    try:
        yield
    finally:
        engine.drafters.__path__.remove(TOY_FOLDER)
        sys.modules.pop("engine.drafters.toy_spec", None)
        registry.rescan()
