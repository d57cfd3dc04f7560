"""A backend and a drafter whose distributions the test controls (a first-order Markov chain).

The next-token logits depend only on the last token: row `log P[last]`. That is
enough to exercise the decode loop (cache bookkeeping, rollback, EOS, stop
strings) and to compute exact output distributions for the losslessness tests.
"""

from __future__ import annotations

import torch

from engine.backends.base import Backend, ModelInfo
from engine.drafters.base import Draft, Drafter
from engine.sampling import SamplingConfig, probabilities, sample

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class MarkovBackend(Backend):
    name = "fake"

    def __init__(self, transition: torch.Tensor, eos: int | None = None, n_ctx: int = 256) -> None:
        super().__init__()
        self.transition = transition  # (V, V) row-stochastic: P[next | last]
        self._eos = frozenset() if eos is None else frozenset({eos})
        self._n_ctx = n_ctx
        self.forward_calls: list[int] = []  # tokens per forward, to check what the loop fed

    @property
    def info(self) -> ModelInfo:
        v = self.transition.shape[0]
        return ModelInfo("markov", "-", "fake", "markov", v * v, v * v * 4, v, 1, self._n_ctx, "float32", "cpu")

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def chat_template(self) -> str | None:
        return None

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        self.forward_calls.append(len(tokens))
        rows = torch.log(self.transition[torch.tensor(tokens)])  # (n, V)
        return rows if all_logits else rows[-1:]

    def _truncate(self, length: int) -> None:
        pass

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return [LETTERS.index(c) for c in text]

    def detokenize(self, ids: list[int]) -> str:
        return "".join(LETTERS[i] for i in ids if i not in self._eos)

    def token_text(self, token_id: int) -> str:
        return LETTERS[token_id]

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return self.tokenize("".join(m["content"] for m in messages))


class MarkovDrafter(Drafter):
    """Drafts from its own Markov chain q, with the distribution (a model drafter in miniature)."""

    name = "markov draft"
    has_distribution = True

    def __init__(self, transition: torch.Tensor) -> None:
        self.transition = transition

    def propose(self, context, k, sampling: SamplingConfig, generator) -> Draft:
        tokens, rows = [], []
        last = context[-1]
        for _ in range(k):
            q = probabilities(torch.log(self.transition[last]), sampling)
            last = int(q.argmax()) if sampling.greedy else sample(q, generator)
            tokens.append(last)
            rows.append(q)
        return Draft(tokens, torch.stack(rows), tuple(float(r[t]) for r, t in zip(rows, tokens)))


def random_transition(vocab: int, seed: int, sharpness: float = 2.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(vocab, vocab, generator=gen) * sharpness, dim=-1)
