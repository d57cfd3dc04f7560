"""Drafting with the target's own multi-token-prediction layer (engine/heads/mtp.py), as
llama.cpp's `draft-mtp` and vLLM's `mtp` method do.

Notation as in engine/core/decode.py: the committed tokens are x_0 .. x_{L-1}, x_{L-1}
pending (not yet in the target's cache); the target has final-norm hidden states
h_0 .. h_{L-2} of the cached ones (`HiddenFeatures.cached_features`).

1. Catch up. The MTP layer's cache holds one row per position t, built from
   (e(x_{t+1}), h_t), for every t the target has a hidden state for. Rows the layer has
   not seen (the last step's accepted drafts and its pending token) go through it in one
   causal pass; the last, (e(x_{L-1}), h_{L-2}) at position L-2, gives g_{L-2}, whose
   logits are q for d_1 (the token after the pending one).

2. Draft a chain. d_1 ~ q_1 (its argmax when greedy). Each further draft feeds the
   layer its own output in place of the target's hidden state it has not got yet:
   (e(d_i), g_{L-3+i}) at position L-2+i gives q_{i+1}. One layer is reused for all k
   drafts (vLLM and llama.cpp do the same for k beyond a model's MTP layers).

3. The target verifies the chain with the usual rule: q is the drafted rows' processed
   distribution (the same SamplingConfig as p), so accepting with min(1, p/q) and
   resampling from norm(max(0, p - q)) stays lossless. The drafted rows were scratch:
   the layer's cache goes back to the committed rows, and the next catch-up replaces
   the guesses with the target's true hidden states of what was accepted.
"""

from __future__ import annotations

import torch

from engine.backends.capabilities import HiddenFeatures, ModelParts, require
from engine.core.sampling import SamplingConfig, draw
from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter
from engine.drafters.mtp_spec import MtpStats
from engine.heads.mtp import MtpHead


class MtpDrafter(Drafter):
    name = "mtp"

    def __init__(self, head: MtpHead, target, n_layers: int = 1) -> None:
        require(target, HiddenFeatures, "MTP drafting")
        require(target, ModelParts, "MTP drafting")
        self.head = head
        self.target = target
        self.n_layers = n_layers  # what the model ships; the first drafts every token
        param = next(head.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.reset()

    # -- the decode loop's calls ----------------------------------------------------------

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.rows = 0  # committed rows (e(x_{t+1}), h_t) in the layer's cache, t = 0..rows-1
        self.drafted = self.accepted = 0

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        length = len(context)
        if k <= 0 or length < 2:
            return EMPTY_DRAFT
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_token: list[float] = []
        with torch.inference_mode():
            g = self._catch_up(context)[-1:]  # g_{L-2}: (1, H)
            try:
                for i in range(k):
                    token, q, p = draw(self._logits(g)[0], sampling, generator)  # q's row for d_{i+1}
                    tokens.append(token)
                    q_token.append(p)
                    if q is not None:
                        q_rows.append(q)
                    if i + 1 < k:  # (e(d_{i+1}), g) at position L-1+i
                        g = self._run(torch.tensor([token], device=self.device), g, length - 1 + i)
            finally:
                self._truncate(self.rows)  # the drafted rows were scratch
        q = torch.stack(q_rows) if q_rows else None
        return ChainDraft(tokens=tokens, q=q, q_token=tuple(q_token))

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted

    def stats(self) -> MtpStats:
        return MtpStats(
            layers=self.n_layers,
            layout=self.head.layout,
            acceptance=round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
        )

    def close(self) -> None:
        self.cache = None

    # -- the layer ---------------------------------------------------------------------------

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Run the rows (e(x_{t+1}), h_t) the layer has not seen; return their outputs (n, H)."""
        length = len(context)
        # Within a generation the context only grows (reset() starts each at 0); recompute at
        # least the last row, whose output drafts d_1.
        have = min(self.rows, length - 2)
        self._truncate(have)
        hidden = self.target.cached_features(have, length - 1).to(self.dtype)  # h_have .. h_{L-2}
        ids = torch.tensor(context[have + 1 : length], dtype=torch.long, device=self.device)
        out = self._run(ids, hidden, have)
        self.rows = length - 1
        return out

    def _run(self, ids: torch.Tensor, hidden: torch.Tensor, start: int) -> torch.Tensor:
        """Append rows for tokens `ids` (n,) paired with `hidden` (n, H) at positions start..;
        each sees the cached rows and the new ones before it. Returns g (n, H)."""
        n = ids.numel()
        if self.cache.get_seq_length() != start:
            raise RuntimeError(f"the MTP cache holds {self.cache.get_seq_length()} rows, not {start}")
        positions = torch.arange(start, start + n, device=self.device)
        embeds = (self.head.embed_tokens(ids) if self.head.embed_tokens is not None else self.target.embed(ids)).to(
            self.dtype
        )
        cos, sin = self.target.rope(positions)
        mask = torch.zeros(n, start + n, dtype=self.dtype, device=self.device)
        mask[:, start:] = torch.full((n, n), torch.finfo(self.dtype).min, dtype=self.dtype).triu(1)
        position_embeddings = (cos.to(self.dtype)[None], sin.to(self.dtype)[None])
        return self.head(embeds, hidden.to(self.device), positions, position_embeddings, mask, self.cache)

    def _logits(self, g: torch.Tensor) -> torch.Tensor:
        x = self.head.logits_input(g)
        head = self.head.head if self.head.head is not None else self.target.lm_head
        return head(x.to(next(head.parameters()).dtype)).float()  # (n, V)

    def _truncate(self, rows: int) -> None:
        have = self.cache.get_seq_length()
        if rows == 0 and have:
            from transformers import DynamicCache

            self.cache = DynamicCache()
        elif rows < have:
            self.cache.crop(-(have - rows))
