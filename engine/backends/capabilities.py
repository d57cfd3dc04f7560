"""What a backend can do beyond `Backend` (a chain forward over one KV cache), as typed protocols.

Every backend runs chains: append tokens, get their logits, roll back. Some drafters
need more from the target, and each such need is one protocol here. A backend
class says which it implements in `capabilities`; drafters and the decode step
take the target as the protocol they need, and `require` is the one place that
checks it and says, in one message per capability, why a backend falls short and
what to do.

    require(target, TreeForward, "EAGLE")   # raises ConfigError naming backend, model and the way out

Which backend has what: the torch backend's native path has all but CachedKV; transformers' own
forward (an architecture without a native path) has ModelParts, HiddenFeatures and CachedKV; llama.cpp
TreeForward (through sequence ids, engine/backends/llama_tree.py), except for models with recurrent layers.

    TreeForward      forward_tree / keep_nodes, forward_masked / keep_rows: any attention pattern
    HiddenFeatures   the final-norm hidden states of the rows just run and of every cached token
    LayerFeatures    the hidden states entering chosen layers, of every cached token (EAGLE-3), kept
                     only while a drafter watches those layers
    LayerExit        run only the first layers on scratch rows past the cache (never committed), then
                     finish the verifying forward from the residual stream they left (early exit)
    ModelParts       the target's embeddings, rotary embedding and LM head, for heads that reuse them
    CachedKV         the keys and values a decoder layer holds for the cached tokens (a Gemma 4 assistant
                     attends to them)
    Slots            several sequences on one loaded model, each with a cache of its own, and one forward
                     over rows of several of them (`forward_batch`): what a batch of requests runs on
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.errors import ConfigError

if TYPE_CHECKING:  # annotations only: the drafter registry imports this module without torch
    import torch

    from engine.backends.base import Backend
    from engine.drafters.base import Drafter


@runtime_checkable
class TreeForward(Protocol):
    """Forwards with any attention pattern over the new rows (trees, lookahead's window)."""

    def forward_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Run the model over a token tree placed after the cached tokens.

        `parents[i]` is the index (into `tokens`) of node i's parent, or -1 for a node that
        follows the cached tokens directly; parents come before their children (parents[i] < i).
        Node i sits at position len(self.tokens) + depth(i) - 1 (engine.core.tree.depths: 1 for
        a node without parent) and attends to the cache, its ancestors and itself only. Returns
        float32 logits (len(tokens), V); row i predicts the token after node i. Afterwards the
        cache holds every node (self.tokens lists them in node order) until `keep_nodes` picks
        one root-to-leaf path.
        """
        ...

    def keep_nodes(self, nodes: list[int]) -> None:
        """After `forward_tree`, keep the cache entries of `nodes` (a path from a depth-1 node
        down, in order) and drop every other node of the tree."""
        ...

    def forward_masked(
        self, tokens: list[int], offsets: list[int], mask: torch.Tensor, what: str = "a block"
    ) -> torch.Tensor:
        """Run `tokens` after the cached ones with any attention pattern: token i at position
        len(self.tokens) + offsets[i], attending to every cached token and to new token j where
        mask[i, j] (bool (n, n), diagonal included). Returns float32 logits (n, V); `keep_rows`
        then keeps the accepted tokens (forward_tree is the special case of a tree's mask)."""
        ...

    def keep_rows(self, rows: list[int]) -> None:
        """After forward_masked, keep new tokens `rows` (increasing indices into that call's
        tokens) right after the previously cached ones; drop the others."""
        ...


@runtime_checkable
class HiddenFeatures(Protocol):
    """Final-layer hidden states after the final norm: what Medusa and EAGLE heads read."""

    @property
    def hidden_size(self) -> int: ...

    def last_features(self) -> torch.Tensor:
        """Hidden states (n, hidden_size) of the rows of the last forward / forward_tree call, on
        the model's device (only the last row after a forward with all_logits=False)."""
        ...

    def cached_features(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Hidden states (end - start, hidden_size) of the cached tokens self.tokens[start:end]:
        what EAGLE reads."""
        ...


@runtime_checkable
class LayerFeatures(Protocol):
    """The residual stream entering chosen decoder layers, for every cached token: what an EAGLE-3
    head reads (the input of layer i is the output of layer i - 1, residual included; layer 0's is
    the embedding). Kept only while watched, so a target without such a drafter pays nothing."""

    def watch_layers(self, layers: tuple[int, ...]) -> None:
        """Keep the inputs of `layers` (increasing ids, 0..n_layers-1) for every token from now on;
        () stops. A new set forgets the cached tokens (their layers' inputs were not kept), so the
        next prefill runs them again."""
        ...

    def cached_layer_features(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """The watched layers' inputs (end - start, len(layers) * hidden_size) of the cached tokens
        self.tokens[start:end], concatenated in layer order, on the model's device."""
        ...


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


@runtime_checkable
class CachedKV(Protocol):
    """The keys and values in the target's cache, for a drafter that attends to them instead of keeping its own."""

    def cached_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (1, kv_heads, n, head_dim) that decoder layer `layer` holds for the cached
        tokens, as its attention reads them (after its norms and rotary embedding), oldest first and
        ending with the last cached token; a sliding-window layer may hold only the newest of them."""
        ...


@runtime_checkable
class Slots(Protocol):
    """Several sequences on one loaded model, run together in one forward (engine/core/batch.py).

    The backend itself is the first sequence; `open_slot` gives more, up to `max_slots` in all. A
    slot is a `Backend` of its own: its own `tokens` and cache, forward, rollback, prefill, and the
    owner's one-sequence capabilities (forward_masked / keep_rows, last_features...) for its rows,
    on the owner's weights. `close()` on a slot frees its cache, never the model.
    """

    max_slots: int  # sequences at once, the backend itself included (set when it loads)

    def open_slot(self) -> Backend:
        """A new, empty sequence on this model; SlotsFull (engine/backends/slots.py) when
        `max_slots` are open, an OutOfMemoryError when its cache does not fit."""
        ...

    def forward_batch(self, calls: list) -> list[torch.Tensor]:
        """One forward over the rows of several sequences (engine/backends/slots.py `BatchCall`: this
        backend or slots it opened, each at most once). Call i runs as `slot.forward(tokens)` would, or
        as `slot.forward_masked(tokens, offsets, mask)` when it has a mask, and leaves its slot as that
        call would (keep_rows works after a masked one); returns each call's float32 CPU logits
        (len(tokens), V). A call that would not fit its slot's context raises before anything runs."""
        ...


# What llama.cpp offers a drafter (ON_LLAMA_CPP): a drafter needing more needs the PyTorch backend
# (DrafterSpec.needs_torch). A model with recurrent layers lacks even these on llama.cpp.
ON_LLAMA_CPP = frozenset({TreeForward})

# Why a backend without the capability cannot serve a drafter, said once for every drafter.
WHY = {
    TreeForward: "verifies its drafts as a tree in one forward with a custom attention mask",
    HiddenFeatures: "reads the target's hidden states",
    LayerFeatures: "reads the hidden states of several of the target's layers",
    LayerExit: "runs the target's first layers on their own and finishes the forward from there",
    ModelParts: "shares the target's embeddings, rotary embedding and LM head",
    CachedKV: "attends to the keys and values the target's layers hold",
    Slots: "runs several sequences in one forward",
}


def has(obj: Backend | Drafter | None, capability: type) -> bool:
    """Whether `obj` implements `capability` (as its class declares, not by attribute sniffing): a backend
    one of the protocols here, a drafter one of engine/drafters/base.py's."""
    return capability in getattr(obj, "capabilities", frozenset())


def require(backend: Backend, capability: type, who: str) -> None:
    """Raise ConfigError, saying what `who` needs and how to get it, unless `backend` has `capability`."""
    if has(backend, capability):
        return
    if backend.name == "torch":  # on PyTorch already: its architecture runs on transformers' own forward
        way_out = (
            "only the native implementation can, which covers the llama, mistral, qwen2 and qwen3 architectures "
            f"({backend.info.architecture} runs on transformers' own forward): choose another drafter "
            "(n-gram lookup, suffix decoding or a draft model)."
        )
    elif backend.name == "llama.cpp" and capability in ON_LLAMA_CPP:  # llama_tree.py: not with recurrent layers
        way_out = (
            "its recurrent layers keep one state per sequence, which every new row advances, so rows of different "
            "branches cannot run side by side (llama.cpp and PyTorch can for models of attention layers): choose "
            "another drafter (n-gram lookup, suffix decoding or a draft model)."
        )
    else:
        way_out = (
            "load the target with the PyTorch backend (--backend torch, or Backend torch in the pair dialog; "
            "a GGUF file then loads through transformers, dequantized), or choose another drafter "
            "(n-gram lookup or a draft model)."
        )
    raise ConfigError(
        f"{who} {WHY[capability]}, which the {backend.name} backend cannot do for {backend.info.name}: {way_out}"
    )
