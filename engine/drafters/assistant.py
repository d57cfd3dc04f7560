"""Drafting with a Gemma 4 assistant (engine/heads/assistant.py), as transformers' generation drives it
(`SinglePositionMultiTokenCandidateGenerator`, generation/candidate_generator.py).

Notation as in engine/core/decode.py: the committed tokens are x_0 .. x_{L-1}, x_{L-1}
pending (not yet in the target's cache); the target holds, for x_0 .. x_{L-2}, its final-norm
hidden states h_t (HiddenFeatures) and each layer's keys and values (CachedKV).

1. Read the target. The assistant has no cache and no key or value projections: each of its
   layers attends to the keys and values of the target's last layer of the same type (the
   "store" layers of the target's config: one full-attention, one sliding-window), for
   x_0 .. x_{L-2}, as the target's cache holds them. Its own mask keeps a sliding layer's
   attention within the window.

2. Draft a chain, at one position. The input is the target's embedding of the last token
   beside a hidden state: (e(x_{L-1}), h_{L-2}) first, whose logits are q for d_1. Each
   further draft feeds the assistant its own output in place of the target's hidden state it
   has not got yet, (e(d_i), g_i) with g_i = post_projection(assistant's last hidden state),
   still at position L-1 and over the same keys and values: the assistant was trained to
   draft that way (all drafts at the pending token's position).

3. The target verifies the chain with the usual rule: q is each drafted row's distribution
   processed with the same SamplingConfig as p, so accepting with min(1, p/q) and resampling
   from norm(max(0, p - q)) stays lossless. The assistant keeps nothing between steps: the
   next proposal reads the target's cache again, after its rollback.
"""

from __future__ import annotations

import torch

from engine.backends.capabilities import CachedKV, HiddenFeatures, ModelParts, require
from engine.core.sampling import SamplingConfig, draw
from engine.drafters.assistant_spec import AssistantStats
from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter


def store_layers(text_config) -> dict[str, int]:
    """Attention type -> the target layer whose keys and values an assistant reads: the last layer of
    each type that computes its own (Gemma 4's `kv_sharing_modes` marks them "store")."""
    modes = getattr(text_config, "kv_sharing_modes", None) or ()
    return {text_config.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}


class AssistantDrafter(Drafter):
    name = "assistant"

    def __init__(self, assistant, target) -> None:
        for capability in (HiddenFeatures, ModelParts, CachedKV):
            require(target, capability, "The Gemma 4 assistant")
        self.assistant = assistant
        self.target = target
        self.layers = store_layers(target.text_config)
        wanted = set(assistant.config.get_text_config().layer_types)
        if not wanted <= set(self.layers):
            raise ValueError(f"the target stores keys for {sorted(self.layers)}, the assistant reads {sorted(wanted)}")
        param = next(assistant.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.drafted = self.accepted = 0

    # -- the decode loop's calls ----------------------------------------------------------

    def reset(self) -> None:
        self.drafted = self.accepted = 0

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        length = len(context)
        if k <= 0 or length < 2:
            return EMPTY_DRAFT
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_token: list[float] = []
        with torch.inference_mode():
            shared = self._shared_kv(length - 1)
            hidden = self.target.cached_features(length - 2, length - 1).to(self.device, self.dtype)  # h_{L-2}: (1, H)
            position = torch.tensor([[length - 1]], device=self.device)  # every draft at the pending token's
            token = context[-1]
            for _ in range(k):
                embed = self.target.embed(torch.tensor([token])).to(self.device, self.dtype)  # (1, H)
                out = self.assistant(
                    inputs_embeds=torch.cat([embed, hidden], dim=-1)[None],  # (1, 1, 2H)
                    position_ids=position,
                    shared_kv_states=shared,
                    attention_mask=None,
                    use_cache=False,
                )
                token, q, p = draw(out.logits[0, -1].float(), sampling, generator)  # q's row for this draft
                tokens.append(token)
                q_token.append(p)
                if q is not None:
                    q_rows.append(q)
                hidden = out.last_hidden_state[0].to(self.dtype)  # g: the assistant's own state, (1, H)
        q = torch.stack(q_rows) if q_rows else None
        return ChainDraft(tokens=tokens, q=q, q_token=tuple(q_token))

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted

    def stats(self) -> AssistantStats:
        text = self.assistant.config.get_text_config()
        return AssistantStats(
            layers=int(text.num_hidden_layers),
            ordered_head="yes" if self.assistant.config.use_ordered_embeddings else "no",
            acceptance=round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
        )

    def close(self) -> None:
        self.assistant = None

    # -- the target's keys and values ---------------------------------------------------------

    def _shared_kv(self, cached: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values (1, kv_heads, n, head_dim) of the target's store layers for the `cached`
        tokens x_0 .. x_{L-2} (a windowed layer may hold only the newest), by attention type."""
        shared = {}
        for kind, layer in self.layers.items():
            keys, values = self.target.cached_kv(layer)
            if keys.shape[-2] > cached:  # never a token past the committed ones
                raise RuntimeError(f"target layer {layer} holds {keys.shape[-2]} keys for {cached} cached tokens")
            shared[kind] = (keys.to(self.device, self.dtype), values.to(self.device, self.dtype))
        return shared
