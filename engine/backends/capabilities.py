"""What a backend can do beyond `Backend` (a chain forward over one KV cache), as typed protocols.

Every backend runs chains: append tokens, get their logits, roll back. Some drafters
need more from the target, and each such need is one protocol here. A backend
class says which it implements in `capabilities`; drafters and the decode step
take the target as the protocol they need, and `require` is the one place that
checks it and says, in one message per capability, why a backend falls short and
what to do.

    require(target, TreeForward, "EAGLE")   # raises ConfigError naming backend, model and the way out

Which backend has what: the torch backend's native path has all; transformers' own
forward (an architecture without a native path) has ModelParts only; llama.cpp none.

    TreeForward      forward_tree / keep_nodes, forward_masked / keep_rows: any attention pattern
    HiddenFeatures   the final-norm hidden states of the rows just run and of every cached token
    LayerExit        run only the first layers on scratch rows past the cache (never committed), then
                     finish the verifying forward from the residual stream they left (early exit)
    ModelParts       the target's embeddings, rotary embedding and LM head, for heads that reuse them
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.errors import ConfigError

if TYPE_CHECKING:  # annotations only: the drafter registry imports this module without torch
    import torch

    from engine.backends.base import Backend


@runtime_checkable
class TreeForward(Protocol):
    """Forwards with any attention pattern over the new rows (trees, lookahead's window)."""

    def forward_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor: ...

    def keep_nodes(self, nodes: list[int]) -> None: ...

    def forward_masked(self, tokens: list[int], offsets: list[int], mask: torch.Tensor,
                       what: str = "a block") -> torch.Tensor: ...  # fmt: skip

    def keep_rows(self, rows: list[int]) -> None: ...


@runtime_checkable
class HiddenFeatures(Protocol):
    """Final-layer hidden states after the final norm: what Medusa and EAGLE heads read."""

    @property
    def hidden_size(self) -> int: ...

    def last_features(self) -> torch.Tensor: ...

    def cached_features(self, start: int = 0, end: int | None = None) -> torch.Tensor: ...


@runtime_checkable
class LayerExit(Protocol):
    """Run the first layers only, on scratch rows past the committed cache (the cache's length is set
    back afterwards), and later finish a forward from the residual stream they left."""

    def partial_forward(self, tokens: list[int], n_layers: int, start: int) -> torch.Tensor: ...

    def exit_hidden(self) -> torch.Tensor: ...

    def forward_from_exit(self, tokens: list[int], hidden: torch.Tensor, exit_layer: int) -> torch.Tensor: ...


@runtime_checkable
class ModelParts(Protocol):
    """The target's own modules, for draft heads that share them (EAGLE: embeddings, rope, LM head)."""

    @property
    def lm_head(self) -> torch.nn.Module: ...

    @property
    def text_config(self): ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor: ...

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


# Why a backend without the capability cannot serve a drafter, said once for every drafter.
WHY = {
    TreeForward: "verifies its drafts as a tree in one forward with a custom attention mask",
    HiddenFeatures: "reads the target's hidden states",
    LayerExit: "runs the target's first layers on their own and finishes the forward from there",
    ModelParts: "shares the target's embeddings, rotary embedding and LM head",
}


def has(backend: Backend, capability: type) -> bool:
    """Whether `backend` implements `capability` (as its class declares, not by attribute sniffing)."""
    return capability in getattr(backend, "capabilities", frozenset())


def require(backend: Backend, capability: type, who: str) -> None:
    """Raise ConfigError, saying what `who` needs and how to get it, unless `backend` has `capability`."""
    if has(backend, capability):
        return
    raise ConfigError(
        f"{who} {WHY[capability]}, which the {backend.name} backend cannot do for {backend.info.name}: "
        "load the target with the PyTorch backend (--backend torch, or Backend torch in the pair dialog; "
        "a GGUF file then loads through transformers, dequantized), or choose another drafter "
        "(n-gram lookup or a draft model)."
    )
