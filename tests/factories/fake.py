"""A backend and a drafter whose distributions the test controls (a first-order Markov chain).

The next-token logits depend only on the last token: row `log P[last]`. That is
enough to exercise the decode loop (cache bookkeeping, rollback, EOS, stop
strings) and to compute exact output distributions for the losslessness tests.
"""

from __future__ import annotations

import torch

from engine.backends.base import Backend, ModelInfo
from engine.backends.capabilities import HiddenFeatures, Slots, TreeForward
from engine.backends.slots import SlotsFull
from engine.core.sampling import SamplingConfig, probabilities, sample
from engine.drafters.base import ChainDraft, Draft, Drafter, DraftsTrees, TreeDraft
from engine.errors import OutOfMemoryError

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


class MarkovSlotsBackend(MarkovBackend):
    """MarkovBackend holding several sequences (Slots): each slot a MarkovBackend on the same chain.
    `forward_batch` runs every call's rows in one call and records the rows of each (`batches`)."""

    capabilities = frozenset({Slots})

    def __init__(self, transition: torch.Tensor, eos: int | None = None, n_ctx: int = 256, max_slots: int = 4):
        super().__init__(transition, eos, n_ctx)
        self.max_slots = max_slots
        self.opened: list[MarkovBackend] = []
        self.batches: list[list[int]] = []  # rows of each call, per forward_batch
        self.memory_rows: int | None = None  # a forward_batch over more rows runs out of memory

    def open_slot(self) -> MarkovBackend:
        if len(self.opened) + 1 >= self.max_slots:
            raise SlotsFull(f"all {self.max_slots} sequences are in use")
        slot = MarkovBackend(self.transition, next(iter(self._eos), None), self._n_ctx)
        slot.close = lambda: self.opened.remove(slot)
        self.opened.append(slot)
        return slot

    def forward_batch(self, calls) -> list[torch.Tensor]:
        owned = [self, *self.opened]
        assert all(any(c.slot is o for o in owned) for c in calls), "a call on a slot of another backend"
        for call in calls:
            if len(call.slot.tokens) + len(call.tokens) > call.slot.n_ctx:
                raise call.slot._context_full("a batch call")
        if self.memory_rows is not None and sum(len(c.tokens) for c in calls) > self.memory_rows:
            raise OutOfMemoryError(f"{sum(len(c.tokens) for c in calls)} rows do not fit")
        self.batches.append([len(c.tokens) for c in calls])
        return [c.slot.forward(c.tokens) for c in calls]


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
        return ChainDraft(tokens, torch.stack(rows), tuple(float(r[t]) for r, t in zip(rows, tokens)))


def cycle_transition(vocab: int, noise: float = 0.02) -> torch.Tensor:
    """A chain that almost always goes from token i to i + 1 (mod vocab): a text that repeats itself."""
    t = torch.full((vocab, vocab), noise)
    for i in range(vocab):
        t[i, (i + 1) % vocab] = 1.0
    return t / t.sum(dim=-1, keepdim=True)


def random_transition(vocab: int, seed: int, sharpness: float = 2.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(vocab, vocab, generator=gen) * sharpness, dim=-1)


class MarkovTreeBackend(MarkovBackend):
    """MarkovBackend with tree attention and hidden states (a stand-in for the torch backend).

    Logits depend only on a node's own token, so a tree's rows are just log P[token]. The
    "hidden state" of a token is its one-hot vector (hidden_size = V) and `lm_head` maps it
    back to log P[token], so heads on these features can be built to predict exactly.
    With `tree=False` it verifies chains only (like llama.cpp) but still has features.
    """

    def __init__(self, transition: torch.Tensor, eos: int | None = None, n_ctx: int = 256, tree: bool = True):
        super().__init__(transition, eos, n_ctx)
        self.capabilities = frozenset({HiddenFeatures, TreeForward} if tree else {HiddenFeatures})
        vocab = transition.shape[0]
        self.lm_head = torch.nn.Linear(vocab, vocab, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.log(transition).T)  # one-hot(t) @ W.T = log P[t]
        self.tree_calls: list[tuple[int, ...]] = []  # parents of each forward_tree call
        self.kept_paths: list[list[int]] = []
        self._rows: list[int] = []  # tokens of the last forward's rows
        self._tree: tuple[list[int], list[int]] | None = None

    @property
    def hidden_size(self) -> int:
        return self.transition.shape[0]

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        self._rows = list(tokens)
        return super()._forward(tokens, all_logits)

    def forward_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        if not self.supports_tree:
            raise NotImplementedError("this stand-in verifies chains only (tree=False)")
        assert all(-1 <= p < i for i, p in enumerate(parents)), parents
        self.tree_calls.append(tuple(parents))
        self._tree = (len(self.tokens), list(parents))
        self.forward_calls.append(len(tokens))
        self._rows = list(tokens)
        self.tokens.extend(tokens)
        return torch.log(self.transition[torch.tensor(tokens)])  # (n, V)

    def keep_nodes(self, nodes: list[int]) -> None:
        if not self.supports_tree:
            raise NotImplementedError("this stand-in verifies chains only (tree=False)")
        assert self._tree is not None, "keep_nodes() without forward_tree()"
        base, parents = self._tree
        for i, node in enumerate(nodes):  # a path from a depth-0 node down
            assert parents[node] == (nodes[i - 1] if i else -1), (nodes, parents)
        self.kept_paths.append(list(nodes))
        kept = [self.tokens[base + node] for node in nodes]
        del self.tokens[base:]
        self.tokens.extend(kept)
        self._tree = None

    def last_features(self) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.tensor(self._rows), self.hidden_size).float()  # (n, V)


class MarkovTreeDrafter(Drafter):
    """A tree drafter that knows (a sharpened copy of) the chain: at every node, its `width`
    most likely next tokens, best first, until k nodes; the best branch follows first children."""

    name = "markov tree"
    capabilities = frozenset({DraftsTrees})

    def __init__(self, transition: torch.Tensor, width: int = 2, depth: int = 4) -> None:
        self.transition = transition
        self.width = width
        self.depth = depth
        self.observed: list[tuple[int, int]] = []

    def propose(self, context, k, sampling: SamplingConfig, generator) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(-1, context[-1], 0)]  # (node, token, depth): breadth first
        while frontier and len(tokens) < k:
            node, token, depth = frontier.pop(0)
            if depth >= self.depth:
                continue
            for child in torch.argsort(self.transition[token], descending=True)[: self.width].tolist():
                if len(tokens) == k:
                    break
                tokens.append(child)
                parents.append(node)
                frontier.append((len(tokens) - 1, child, depth + 1))
        return TreeDraft(tokens, parents=tuple(parents))

    def observe(self, drafted: int, accepted: int) -> None:
        self.observed.append((drafted, accepted))

    def tree_expected_tokens(self, nodes: int) -> None:
        return None  # no estimate of its own: automatic k uses the chain formula
