"""The frozen target as training sees it: final hidden states, its LM head, its tokenizer.

Training runs many tokens at once with no cache, which is not what a decoding
backend is for, so the model is loaded by the backends' loader
(engine/backends/hf/loader.py: local files only, never remote code, never a pickle
that runs code) and used as transformers built it. Every parameter is frozen; the
LM head is shared with the heads, so gradients flow *through* it to the heads but
never change it.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.backends.hf.loader import LoadedModel, load, render_chat, rotary
from engine.errors import ModelLoadError
from engine.models.locate import resolve


class FrozenTarget:
    """A causal LM loaded for training: `hidden_states(ids)` and `lm_head`, nothing learns."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.model = model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.name = name = loaded.name
        self.path = loaded.path
        self.device = loaded.device
        self.dtype = loaded.dtype
        self._stop_ids = loaded.eos_ids
        for param in model.parameters():
            param.requires_grad_(False)
        head = model.get_output_embeddings()
        if head is None:
            raise ModelLoadError(f"{name} has no output layer (LM head), so Medusa heads cannot share one.")
        self.lm_head: nn.Module = head
        self._body = getattr(model, model.base_model_prefix, None)
        if self._body is None:
            raise ModelLoadError(f"Cannot find the transformer body of {name} ({type(model).__name__}).")

    @property
    def hidden_size(self) -> int:
        return int(self.lm_head.weight.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def stop_ids(self) -> frozenset[int]:
        """Ids that end a reply: the generation config's EOS ids and the tokenizer's."""
        return self._stop_ids

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states after the final norm, (B, T) -> (B, T, H), in the target's dtype."""
        out = self._body(input_ids=input_ids.to(self.device), use_cache=False)
        return out.last_hidden_state  # (B, T, H)

    @torch.no_grad()
    def layer_states(self, input_ids: torch.Tensor, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the inputs of `layers` concatenated in layer order (B, T, len(layers) * H), the final hidden
        states (B, T, H)): what an EAGLE-3 head reads, and what its targets come from. transformers'
        hidden_states[i] is the input of layer i (the embeddings for i = 0)."""
        out = self._body(input_ids=input_ids.to(self.device), use_cache=False, output_hidden_states=True)
        return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.last_hidden_state

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's input embeddings (..., H) of ids, in its dtype (no grad flows into them)."""
        return self.model.get_input_embeddings()(ids.to(self.device))

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (n, head_dim) of the target's rotary embedding (for an EAGLE head)."""
        return rotary(self.model, self.lm_head.weight, positions.to(self.device))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on any (..., H) features -> float32 (..., V); differentiable in `hidden`."""
        return self.lm_head(hidden.to(self.dtype)).float()

    # -- text ----------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Plain text as the tokenizer encodes a document (with its BOS, if it adds one)."""
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def encode_chat(self, messages: list[dict], reply: bool = False) -> list[int]:
        """A conversation through the chat template, as the engine renders it (loader.render_chat);
        with `reply`, ending where the assistant's reply starts."""
        return render_chat(self.tokenizer, messages, reply)

    def close(self) -> None:
        self.model = self._body = self.lm_head = None


def load_target(spec: str, *, device: str = "auto", dtype: str = "auto") -> FrozenTarget:
    """Load `spec` ("default", a GGUF file, a model folder, a cached repo id) for training."""
    ref = resolve(spec)
    gguf = {"gguf_file": ref.path} if ref.kind == "gguf" else {}
    return FrozenTarget(load(ref.path, device=device, dtype=dtype, name=ref.name, **gguf))
