"""Training small modules on a frozen target by self-distillation (Medusa heads).

    from engine.training import TrainSettings, train_heads
    result = train_heads(TrainSettings.of("default", "builtin", steps=2000), "heads/medusa-smollm2")

The target never changes; its own next-token distributions are the labels, so
no labelled data set is needed: any text the target reads (files, a built-in
corpus, or replies the target writes itself) teaches the heads to predict what
the target would say a few tokens ahead.

The records (`records`: settings, progress, result, a saved run's summary) load
no torch and have `to_dict` / `from_dict`, for a client of the engine server.
Names are imported on first use, so importing a record, or
`engine.training.records`, does not load the training code (torch).
"""

from engine.lazy import lazy_getattr

# name -> the module under engine.training that defines it
_LAZY = {
    "CheckpointInfo": "records",
    "TrainProgress": "records",
    "TrainResult": "records",
    "TrainSettings": "records",
    "checkpoint_info": "checkpoint",  # loads torch (it reads the saved .pt file)
    "train_heads": "medusa",  # loads torch
}


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = sorted(_LAZY)
