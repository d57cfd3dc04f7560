"""Errors the engine raises, each with a message a user can act on.

Every error is a `SpecDeckError`, so a front end (the CLI, the desktop app) can
catch one type and show `str(error)` as it is: the message says what went wrong
and what to do about it. Errors are data; no front end formatting lives here.
"""

from __future__ import annotations


class SpecDeckError(Exception):
    """Base class of every error the engine raises on purpose."""


class ModelNotFoundError(SpecDeckError):
    """A model path, file or repo id that does not exist on this machine."""


class ModelLoadError(SpecDeckError):
    """A file or folder that exists but is not a model we can load (or is corrupt)."""


class CorruptModelError(ModelLoadError):
    """A model that loads but computes NaN or infinite logits: its weights are damaged."""


class IncompatiblePairError(SpecDeckError):
    """A draft and target that cannot be used together (different vocabularies...)."""


class ContextOverflowError(SpecDeckError):
    """A prompt that does not fit in the model's context window."""


class ConfigError(SpecDeckError):
    """A setting out of range or unknown (k, backend, dtype, sampling values...)."""


class OutOfMemoryError(SpecDeckError):
    """The device ran out of memory while loading or running a model."""
