"""A separate, smaller draft model on either backend.

The draft model keeps its own KV cache in step with the committed text: before
drafting it rolls back to the longest prefix it shares with the context (which
drops the drafts the target rejected and keeps the accepted ones), feeds what is
missing, then decodes k tokens one at a time. After a drafting step at most two
tokens are missing (the last draft when all were kept, and the target's token);
more means plain steps went by (automatic k chose 0) or a new prompt came, and
those go in first as one prefill, timed apart as `ChainDraft.catch_up_s`: a prefill of
n tokens costs far less than n decodes, and charging it per drafted token made a
probe after plain steps look like drafting cost ten times what it does. q for each token is the draft's
distribution after the same processing as the target's (temperature, top-k,
top-p), in the target's vocabulary width.

In a batch (engine/core/batch.py) each sequence has a drafter of its own on a slot of the
same draft model (`owner`, engine/backends/capabilities.py Slots), and they draft together
(`propose_together`): each draft position is one forward of the draft model over every
sequence that still drafts, as the target's verify forward is one over every sequence.
"""

from __future__ import annotations

import time

import torch

from engine.backends.base import Backend, common_prefix_length
from engine.backends.capabilities import Slots, has
from engine.backends.slots import BatchCall, run_calls
from engine.core.draft_length import measure_draft_cost
from engine.core.sampling import SamplingConfig, draw
from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter, DraftsTogether, MeasuresCost
from engine.errors import IncompatiblePairError

STEP_LEFTOVER = 2  # tokens a drafting step leaves for the next one to feed (see the docstring)


class ModelDrafter(Drafter):
    name = "draft model"
    capabilities = frozenset({MeasuresCost, DraftsTogether})

    def __init__(self, backend: Backend, target_vocab_size: int, owner: Backend | None = None) -> None:
        """`backend`: the draft model, or a slot of it (`owner`, the model the slot was opened on)."""
        self.backend = backend
        self.owner = owner if owner is not None else backend
        self.target_vocab_size = target_vocab_size
        if backend.vocab_size < target_vocab_size - 128 or backend.vocab_size > target_vocab_size + 1024:
            raise IncompatiblePairError(
                f"The draft model's vocabulary has {backend.vocab_size} entries and the target's "
                f"{target_vocab_size}: they are not the same tokenizer. Pick a draft model from the "
                "target's family (run the pair check to see what differs)."
            )

    def reset(self) -> None:
        """At the start of each generation: the draft model's threads follow the free cores too."""
        self.backend.prepare_threads()

    def _to_target_width(self, logits: torch.Tensor) -> torch.Tensor:
        """Cut or pad (with -inf) the draft's logits to the target's vocabulary width."""
        width = self.target_vocab_size
        if logits.shape[-1] == width:
            return logits
        if logits.shape[-1] > width:
            return logits[..., :width]
        pad = torch.full((*logits.shape[:-1], width - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        return self.propose_together([self], [context], [k], [sampling], [generator])[0]

    def together_key(self) -> object:
        """Drafters on slots of one draft model draft together; one without slots drafts alone."""
        return id(self.owner) if has(self.owner, Slots) else id(self)

    @classmethod
    def propose_together(cls, drafters: list, contexts: list, ks: list, samplings: list, generators: list) -> list:
        """Each drafter's ChainDraft: its cache synced to its context, then one draft-model forward per
        draft position over every drafter still drafting (one drafter alone: its own forwards)."""
        owner = drafters[0].owner
        drafts: list[Draft] = [EMPTY_DRAFT] * len(drafters)
        chains = []  # (index, k, the tokens to feed first, catch_up_s)
        for i, (drafter, context, k) in enumerate(zip(drafters, contexts, ks)):
            k = min(k, drafter.backend.n_ctx - len(context))
            if k > 0:
                chains.append((i, k, *drafter._sync(context)))
        rows = {i: [] for i, *_ in chains}  # index -> (token, q, p) drawn so far
        feeds = {i: missing for i, _, missing, _ in chains}
        longest = max((k for _, k, *_ in chains), default=0)
        for depth in range(longest):
            if len(feeds) == 1:  # one sequence: its own forward, the last row only
                ((i, feed),) = feeds.items()
                blocks = [drafters[i].backend.forward(feed, all_logits=False)]
            else:
                blocks = run_calls(owner, [BatchCall(drafters[i].backend, feeds[i]) for i in feeds])
            for i, logits in zip(list(feeds), blocks):
                rows[i].append(draw(drafters[i]._to_target_width(logits[-1]), samplings[i], generators[i]))
            feeds = {i: [rows[i][-1][0]] for i, k, *_ in chains if depth + 1 < k}
        for i, _, _, catch_up_s in chains:
            tokens = [token for token, _, _ in rows[i]]
            q_rows = [q for _, q, _ in rows[i] if q is not None]
            q = torch.stack(q_rows) if q_rows else None
            drafts[i] = ChainDraft(tokens=tokens, q=q, q_token=tuple(p for *_, p in rows[i]), catch_up_s=catch_up_s)
        return drafts

    def _sync(self, context: list[int]) -> tuple[list[int], float]:
        """Cut the cache back to the prefix it shares with `context` (but always feed at least the last
        token); more than a step's leftover missing is caught up in one prefill, timed apart. Returns
        the tokens still to feed (one or two) and the catch-up's seconds."""
        keep = min(common_prefix_length(self.backend.tokens, context), len(context) - 1)
        self.backend.rollback(keep)
        missing = context[keep:]
        catch_up_s = 0.0
        if len(missing) > STEP_LEFTOVER:  # catching up after plain steps: one prefill, timed apart
            start = time.perf_counter()
            self.backend.forward(missing[:-1], all_logits=False)
            catch_up_s = time.perf_counter() - start
            missing = missing[-1:]
        return missing, catch_up_s

    def measure_token_cost(self) -> float:
        return measure_draft_cost(self.backend)

    def close(self) -> None:
        self.backend.close()
