"""Training small modules on a frozen target by self-distillation (Medusa heads).

    from engine.training import train_heads
    result = train_heads("default", "builtin", "heads/medusa-smollm2", steps=2000)

The target never changes; its own next-token distributions are the labels, so
no labelled data set is needed: any text the target reads (files, a built-in
corpus, or replies the target writes itself) teaches the heads to predict what
the target would say a few tokens ahead.

The records (`records`: settings, progress, result, a saved run's summary) load
no torch and have `to_dict` / `from_dict`, for a client of the engine server.
Names are imported on first use, so importing a record, or
`engine.training.records`, does not load the training code (torch).
"""

from importlib import import_module

# name -> the module under engine.training that defines it
_LAZY = {
    "CheckpointInfo": "records", "TrainProgress": "records", "TrainResult": "records", "TrainSettings": "records",
    "checkpoint_info": "checkpoint",  # loads torch (it reads the saved .pt file)
    "train_heads": "medusa",  # loads torch
}  # fmt: skip


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine.training' has no attribute {name!r}")


__all__ = sorted(_LAZY)
