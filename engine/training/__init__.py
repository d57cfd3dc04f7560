"""Training small modules on a frozen target by self-distillation (Medusa heads).

    from engine.training import train_heads
    result = train_heads("default", "builtin", "heads/medusa-smollm2", steps=2000)

The target never changes; its own next-token distributions are the labels, so
no labelled data set is needed: any text the target reads (files, a built-in
corpus, or replies the target writes itself) teaches the heads to predict what
the target would say a few tokens ahead.
"""

from engine.training.checkpoint import CheckpointInfo, checkpoint_info
from engine.training.medusa import TrainProgress, TrainResult, train_heads

__all__ = ["CheckpointInfo", "TrainProgress", "TrainResult", "checkpoint_info", "train_heads"]
