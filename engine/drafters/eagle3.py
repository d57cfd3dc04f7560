"""EAGLE-3 drafting: EAGLE-2's dynamic draft tree (eagle.py) with an EAGLE-3 head.

The head (engine/heads/eagle3.py) differs from EAGLE-1/2's in what it reads and how
it scores; the tree is grown, reranked, verified and calibrated exactly as eagle.py
does (point-mass candidates, so the output stays the target's). Notation as there:
x_{L-1} is pending, the target has cached x_0 .. x_{L-2}.

- A committed pair t carries u_t = fc(a_t), a_t the inputs of the head's three target
  layers at token t, which the target keeps for every cached token while this drafter
  is attached (`LayerFeatures.watch_layers`; closing the drafter stops it).
- A tree node carries its parent's guess g as it came out of the head's layer, before
  the final norm (no fc: the head was trained on its own outputs so, EAGLE-3's
  "training-time test").
- q is softmax(lm_head(norm(g))) over the head's D draft ids; draft id i proposes target
  id i + d2t[i]. There is no full-vocabulary LM head in a draft step at all.
"""

from __future__ import annotations

import torch

from engine.backends.capabilities import LayerFeatures
from engine.drafters.eagle import TOP_K, EagleDrafter
from engine.drafters.eagle_spec import MAX_DEPTH
from engine.heads.eagle3 import Eagle3Head


class Eagle3Drafter(EagleDrafter):
    name = "eagle3"
    label = "EAGLE-3"
    reads = LayerFeatures

    def __init__(self, head: Eagle3Head, target_backend, top_k: int = TOP_K, max_depth: int = MAX_DEPTH) -> None:
        super().__init__(head, target_backend, top_k, max_depth)
        target_backend.watch_layers(head.config.layers)  # from now on the target keeps a_t of every token

    def close(self) -> None:
        self.target.watch_layers(())  # the target stops paying for what only this head reads

    def _draft_vocab(self) -> torch.Tensor:
        return self.head.draft_ids.to(self.device)

    def _committed(self, start: int, end: int) -> torch.Tensor:
        """u_t = fc(a_t) (n, H) for the committed pairs t = start..end-1."""
        return self.head.project(self.target.cached_layer_features(start, end).to(self.dtype))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.head.embed_tokens is not None:
            return self.head.embed_tokens(ids)
        return super()._embed(ids)

    def _logits(self, guesses: torch.Tensor) -> torch.Tensor:
        return self.head.logits(guesses)
