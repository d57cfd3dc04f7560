"""Which kind of draft heads a folder's config.json describes, read without torch (the app asks).

Medusa heads   medusa_num_heads (engine/heads/medusa.py)
EAGLE-3 head   draft_vocab_size, or an architecture named *Eagle3* (engine/heads/eagle3.py)
EAGLE head     any other config (a one-layer Llama config, engine/heads/eagle.py)
"""

from __future__ import annotations


def heads_config_kind(config: dict) -> str:
    """ "medusa", "eagle3" or "eagle" for a heads folder's config.json, as a dict."""
    if "medusa_num_heads" in config:
        return "medusa"
    architectures = config.get("architectures") or []
    if "draft_vocab_size" in config or any("eagle3" in str(a).lower() for a in architectures):
        return "eagle3"
    return "eagle"
