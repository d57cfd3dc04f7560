"""The one small interface every model backend implements.

A backend owns one model and one KV cache for one sequence. It knows the token
ids whose keys and values are in its cache (`tokens`), can append tokens and
return the logits of every one of them (`forward`), and can cut the cache back to
a shorter length (`rollback`) without recomputing what stays. Everything above it
(the decode loop, drafters, the verifier) speaks token ids and logits only.

Logits come back as float32 CPU tensors of shape (n, vocab_size): row i holds
the next-token logits after `tokens[i]` of the call.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch

from engine.backends.capabilities import HiddenFeatures, LayerExit, TreeForward
from engine.backends.info import ModelInfo  # noqa: F401 - re-exported: it is part of this interface
from engine.errors import ContextOverflowError, CorruptModelError

# What loading one model is doing and the fraction of it done (0 to 1), called as it goes.
LoadProgress = Callable[[str, float], None]


def _capability_flag(capability: type, meaning: str) -> property:
    """A bool property that is True when the backend has `capability` (`meaning` says what that gives)."""

    def get(self) -> bool:
        return capability in self.capabilities

    def set(self, value: bool) -> None:
        self.capabilities = self.capabilities | {capability} if value else self.capabilities - {capability}

    return property(get, set, doc=f"True when {meaning} ({capability.__name__} in capabilities).")


class Backend(abc.ABC):
    """A model with a KV cache for one sequence."""

    name: str = "base"
    load_notes: tuple[str, ...] = ()  # what loading found that a user should hear (Engine.notes)
    # True for a recurrent or hybrid model: a rollback restores a saved state and runs the model
    # over the kept tokens again (engine/backends/checkpoints.py), a cost the decoding loop measures.
    replays_on_rollback: bool = False
    # Such a backend saves its state before each forward while this is True; a run without a drafter
    # turns it off for its steps (engine/core/decode.py), since nothing is rolled back inside it.
    checkpoint_forwards: bool = True

    def __init__(self) -> None:
        self.tokens: list[int] = []  # ids whose KV entries are in the cache, in order

    # -- model facts ---------------------------------------------------------------

    @property
    @abc.abstractmethod
    def info(self) -> ModelInfo: ...

    @property
    @abc.abstractmethod
    def n_ctx(self) -> int:
        """Longest sequence (prompt + reply) this backend instance can hold."""

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    @abc.abstractmethod
    def eos_ids(self) -> frozenset[int]:
        """Ids that end generation (end of turn / end of text)."""

    @property
    @abc.abstractmethod
    def chat_template(self) -> str | None: ...

    # -- the cache -----------------------------------------------------------------

    @abc.abstractmethod
    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        """Append `tokens` at positions len(self.tokens)...; return logits (n or 1, V)."""

    @abc.abstractmethod
    def _truncate(self, length: int) -> None:
        """Drop cache entries at positions >= length (length < len(self.tokens))."""

    def forward(self, tokens: list[int], all_logits: bool = True) -> torch.Tensor:
        """Run the model over `tokens` after the cached ones.

        Returns float32 logits (len(tokens), V), or (1, V) for the last token only
        when all_logits is False (a prefill, where the other rows are not needed).
        """
        if not tokens:
            raise ValueError("forward() needs at least one token")
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise self._context_full(f"{len(self.tokens)} are in use and {len(tokens)} more were asked for")
        logits = self._forward(list(tokens), all_logits)
        self.tokens.extend(tokens)
        if not finite_rows(logits):
            self.rollback(len(self.tokens) - len(tokens))
            raise self.corrupt_error()
        return logits

    def _context_full(self, asked: str) -> ContextOverflowError:
        """The error for a call that would run past n_ctx; `asked` says what was asked for."""
        return ContextOverflowError(
            f"The context window of {self.info.name} is full ({self.n_ctx} tokens): {asked}. "
            "Start a new chat, shorten the prompt, or load the model with a larger context."
        )

    def corrupt_error(self) -> CorruptModelError:
        """The error for logits that came out NaN or infinite: the weights are damaged."""
        return CorruptModelError(
            f"{self.info.path} computes NaN or infinite logits, so its weights are corrupt (a damaged "
            "download, a disk error or a bad conversion); it cannot give a reply. Download or convert "
            f"the model again.{self._corrupt_hint()}"
        )

    def _corrupt_hint(self) -> str:
        """More to say about non-finite logits on this backend ("" by default)."""
        return ""

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens; accepted positions are never recomputed."""
        if length < 0 or length > len(self.tokens):
            raise ValueError(f"cannot roll back to {length}: the cache holds {len(self.tokens)} tokens")
        if length < len(self.tokens):
            self._truncate(length)
            del self.tokens[length:]

    # -- what it can do beyond chains -----------------------------------------------

    # The protocols of engine/backends/capabilities.py the backend implements (trees, hidden
    # features, early exit, the model's parts); callers ask has(backend, C) or require(...).
    capabilities: frozenset[type] = frozenset()

    # The flags callers read before capabilities, derived from them. Setting one on an instance
    # adds or removes the capability for that instance (test stand-ins do).
    supports_tree = _capability_flag(TreeForward, "forward_tree accepts any tree, not just chains")
    supports_features = _capability_flag(HiddenFeatures, "last_features() returns hidden states")
    supports_early_exit = _capability_flag(LayerExit, "partial_forward() runs the first layers only")

    def prepare_threads(self) -> None:
        """Called once at the start of each generation, before the prefill: a CPU backend whose
        thread count the user left open sets it to the cores free now (engine/backends/threads.py).
        A no-op by default."""

    def prefill(self, tokens: list[int]) -> None:
        """Make the cache hold exactly `tokens`, reusing the longest common prefix."""
        keep = common_prefix_length(self.tokens, tokens)
        self.rollback(keep)
        if keep < len(tokens):
            self.forward(tokens[keep:], all_logits=False)

    # -- text ----------------------------------------------------------------------

    @abc.abstractmethod
    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Text to ids; `special` parses control tokens like <|im_start|> as single ids."""

    @abc.abstractmethod
    def detokenize(self, ids: list[int]) -> str:
        """Ids to text, control tokens left out. Incomplete UTF-8 shows as U+FFFD."""

    @abc.abstractmethod
    def token_text(self, token_id: int) -> str:
        """The vocabulary entry of one id, control tokens included (for comparing vocabularies)."""

    @abc.abstractmethod
    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for the reply."""

    def close(self) -> None:
        """Free the model; the backend is unusable afterwards."""


def finite_rows(logits: torch.Tensor) -> bool:
    """Whether every row (n, V) can be sampled from: one reduction per call, cheap enough for
    every step. A row's max is NaN when any entry is NaN (max propagates NaN), +inf when any
    is +inf and -inf when all are; a single -inf is a masked token, which is fine."""
    return bool(torch.isfinite(logits.amax(dim=-1)).all())


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
