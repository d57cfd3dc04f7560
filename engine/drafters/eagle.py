"""EAGLE drafting with EAGLE-2's dynamic draft tree.

The head (engine/heads/eagle.py) guesses the target's next feature from the
current feature and the next token; the target's LM head turns a guess into
q. Notation as in engine/core/decode.py: the committed tokens are x_0 .. x_{L-1},
x_{L-1} is pending (not yet in the target's cache), and the target has final
features f_0 .. f_{L-2} for the cached ones (`HiddenFeatures.cached_features`).

1. Catch up. The head's cache holds one row per pair (f_t, x_{t+1}), at
   position t, for every t the target has committed a feature for. New pairs
   (the accepted drafts and the last step's token) go through the head in one
   causal pass; the last one, (f_{L-2}, x_{L-1}), gives g_{L-1}, the guessed
   feature of the pending token, whose LM-head row is q for the first draft.

2. Grow the tree (EAGLE-2). A node's value is log q summed along its path:
   the draft's own estimate that the whole path is accepted. Depth 1 holds the
   top K tokens of q(. | g_{L-1}). Each round takes the K best nodes of the
   deepest level, pairs each token z with its parent's guessed feature g (at
   z's parent's position, attending to the committed pairs and to the rows of
   its own ancestors only: a tree mask over the head's cache), gets z's guessed
   feature and the top K children of it. A round stops the growth when its best
   node is worse than the budget's worst kept one (no descendant could make the
   cut: values only fall down a path), or at MAX_DEPTH.

3. Rerank. Of all nodes made, the k with the highest value (k = the decode
   loop's node budget) form the draft tree; a parent always outranks its
   children, so the chosen set is a tree. The head's cache goes back to the
   committed pairs: the tree's rows were scratch. The target verifies the tree
   (engine/core/verify_tree.py, candidates as point masses: lossless), and the next
   catch-up feeds the head the target's true features of what was accepted.

Automatic k: the sum of exp(value) over a tree's nodes is the draft's
estimate of the accepted length. Scaled by how well those estimates matched
the accepted lengths so far (a running ratio), the last tree's sorted values
give `tree_expected_tokens(n)` for every budget n, which DraftLength weighs
against the measured verify-cost curve.

Only the ids in the head's draft vocabulary (if it has one) are proposed; the
LM head is then scored on those rows only, which on a CPU is most of what a
round costs for a small target.

EAGLE-3 (eagle3.py) drafts the same way with another head: what the committed
pairs carry (`_committed`: the head's projection of three target layers' inputs
instead of f_t), how guesses become q (`_logits`: the head's own LM head) and its
draft vocabulary are the three places it differs, and it overrides those.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.backends.capabilities import HiddenFeatures, has
from engine.backends.kv_cache import KVCache
from engine.core.draft_length import K_LIMIT
from engine.core.sampling import SamplingConfig
from engine.core.tree import depths, path_to
from engine.drafters.base import EMPTY_DRAFT, Draft, Drafter, DraftsTrees, TreeDraft
from engine.drafters.eagle_spec import MAX_DEPTH, EagleStats
from engine.errors import ConfigError
from engine.heads.eagle import EagleHead

TOP_K = 8  # children per expanded node, and nodes expanded per round
PRIOR_WEIGHT = 4.0  # the estimates' calibration starts as if 4 tokens had matched them


class EagleDrafter(Drafter):
    name = "eagle"
    label = "EAGLE"  # for messages
    reads = HiddenFeatures  # what the committed pairs need from the target
    # It reads the target's hidden states of the cached tokens itself (cached_features), so it
    # needs no observe_features: the constructor checks the target has them.
    capabilities = frozenset({DraftsTrees})

    def __init__(self, head: EagleHead, target_backend, top_k: int = TOP_K, max_depth: int = MAX_DEPTH) -> None:
        if not has(target_backend, self.reads):
            raise ConfigError(
                f"{self.label} reads the target's hidden states, which the {target_backend.name} backend does not "
                "expose: load the target with the PyTorch backend (--backend torch)."
            )
        if top_k < 1 or max_depth < 1:
            raise ConfigError(f"{self.label} needs top_k >= 1 and max_depth >= 1, got {top_k} and {max_depth}.")
        self.head = head
        self.target = target_backend
        config = head.config
        self.max_depth = max_depth
        self.groups = config.num_heads // config.num_kv_heads
        param = next(head.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = KVCache(1, config.num_kv_heads, config.head_dim, target_backend.n_ctx, self.dtype, self.device)
        self.vocab = self._draft_vocab()  # the target ids the head may propose (None = all)
        self.top_k = min(top_k, target_backend.vocab_size if self.vocab is None else self.vocab.numel())
        self.reset()

    # -- the decode loop's calls ----------------------------------------------------------

    def reset(self) -> None:
        self.cache.truncate(0)
        self._pairs = 0  # committed pairs (f_t, x_{t+1}) in the head's cache, t = 0.._pairs-1
        self._values: list[float] = _prior_values(self.top_k)  # sorted path probabilities of the last tree
        self._predicted = self._matched = PRIOR_WEIGHT
        self._proposed_mass = 0.0
        self.nodes = self.depth = 0
        self.rounds = 0

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        if k <= 0 or len(context) < 2:
            return EMPTY_DRAFT
        with torch.inference_mode():
            guess = self._catch_up(context)  # g_{L-1}: (H,)
            tokens, parents, values, every_value = self._grow(guess, len(context), k)
        probs = [math.exp(v) for v in values]
        self._values = sorted((math.exp(v) for v in every_value), reverse=True)[:K_LIMIT]
        self._proposed_mass = sum(probs)
        # The branch to verify where trees cannot be: the most expected accepted tokens.
        reach: list[float] = []
        for parent, p in zip(parents, probs):
            reach.append((reach[parent] if parent >= 0 else 0.0) + p)
        best = max(range(len(tokens)), key=reach.__getitem__)
        self.nodes = len(tokens)
        self.depth = max(depths(parents))
        return TreeDraft(tokens, parents=tuple(parents), best_path=tuple(path_to(parents, best)))

    def observe(self, drafted: int, accepted: int, decay: float = 0.9) -> None:
        # How far the draft's own path probabilities over- or under-estimate acceptance.
        self._predicted = self._predicted * decay + self._proposed_mass
        self._matched = self._matched * decay + accepted

    def tree_expected_tokens(self, nodes: int) -> float:
        scale = self._matched / self._predicted if self._predicted > 0 else 1.0
        return 1.0 + scale * sum(self._values[:nodes])

    def stats(self) -> EagleStats:
        return EagleStats(
            nodes=self.nodes,
            depth=self.depth,
            rounds=self.rounds,
            top_k=self.top_k,
            draft_vocab=int(self.vocab.numel()) if self.vocab is not None else self.target.vocab_size,
            calibration=round(self._matched / self._predicted, 4) if self._predicted > 0 else 1.0,
        )

    # -- 1. catching up with the committed context --------------------------------------------

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Run the head over the pairs (f_t, x_{t+1}) it has not seen; return g_{L-1}."""
        length = len(context)
        # Within a generation the context only grows (reset() starts each one at 0); recompute
        # at least the last pair, whose output is g_{L-1}.
        have = min(self._pairs, length - 2)
        features = self._committed(have, length - 1)  # f_have .. f_{L-2}
        ids = torch.tensor(context[have + 1 : length], dtype=torch.long, device=self.device)
        self.cache.truncate(have)
        n = ids.numel()
        chain = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        out = self._forward(ids, features, torch.arange(have, length - 1, device=self.device), chain)
        self._pairs = length - 1
        return out[-1]

    def _committed(self, start: int, end: int) -> torch.Tensor:
        """What the committed pairs t = start..end-1 carry besides their token: f_t (n, H)."""
        return self.target.cached_features(start, end).to(self.dtype)

    # -- 2. and 3. the tree ----------------------------------------------------------------------

    def _grow(self, guess: torch.Tensor, length: int, budget: int):
        """EAGLE-2: expand the best nodes level by level, then keep the `budget` best.
        Returns the chosen nodes' tokens, parents and values, and every node's value."""
        committed = self.cache.length
        k = self.top_k
        logq, ids = self._top(guess[None])  # (1, K)
        tokens, parents, values = ids[0].tolist(), [-1] * k, logq[0].tolist()
        depth = [1] * k  # node -> its depth (a level's nodes all share one)
        rows: dict[int, int] = {}  # node -> its row in the head's cache (expanded nodes only)
        features = {-1: guess}  # node -> its guessed feature
        level = list(range(k))
        self.rounds = 1
        while level and self.rounds < self.max_depth:
            level = sorted(level, key=values.__getitem__, reverse=True)[:k]
            if len(values) >= budget and values[level[0]] < sorted(values, reverse=True)[budget - 1]:
                break  # nothing below this level can enter the best `budget` nodes
            start = self.cache.length
            ancestors = torch.zeros(len(level), start + len(level), dtype=torch.bool, device=self.device)
            ancestors[:, :committed] = True
            for i, node in enumerate(level):
                ancestors[i, start + i] = True
                parent = parents[node]
                while parent >= 0:
                    ancestors[i, rows[parent]] = True
                    parent = parents[parent]
            for i, node in enumerate(level):
                rows[node] = start + i
            parent_features = torch.stack([features[parents[node]] for node in level])
            ids_in = torch.tensor([tokens[node] for node in level], dtype=torch.long, device=self.device)
            positions = torch.full((len(level),), length - 2 + depth[level[0]], dtype=torch.long, device=self.device)
            out = self._forward(ids_in, parent_features, positions, ancestors[:, start:], full_mask=ancestors)
            child_logq, child_ids = self._top(out)  # (n, K)
            next_level = []
            for i, node in enumerate(level):
                features[node] = out[i]
                base = values[node]
                for lq, token in zip(child_logq[i].tolist(), child_ids[i].tolist()):
                    parents.append(node)
                    tokens.append(token)
                    values.append(base + lq)
                    depth.append(depth[node] + 1)
                    next_level.append(len(tokens) - 1)
            level = next_level
            self.rounds += 1
        self.cache.truncate(committed)  # the tree's rows were scratch
        # The best `budget` nodes; on equal values the shallower first, so parents precede children.
        chosen = sorted(range(len(tokens)), key=lambda i: (-values[i], depth[i]))[: min(budget, K_LIMIT)]
        chosen.sort(key=lambda i: (depth[i], -values[i]))
        index = {node: i for i, node in enumerate(chosen)}
        chosen = [i for i in chosen if parents[i] < 0 or parents[i] in index]  # ties at the cut
        index = {node: i for i, node in enumerate(chosen)}
        return (
            [tokens[i] for i in chosen],
            [index[parents[i]] if parents[i] >= 0 else -1 for i in chosen],
            [values[i] for i in chosen],
            values,
        )

    # -- the head ----------------------------------------------------------------------------------

    def _forward(self, ids, features, positions, mask, full_mask=None) -> torch.Tensor:
        """Append rows (token ids, their paired features) to the head's cache at `positions`;
        each attends to the committed rows and to the new rows `mask` (n, n) allows (or to
        the columns of `full_mask` (n, cache + n) when given). Returns guessed features (n, H)."""
        head = self.head
        n = ids.numel()
        start = self.cache.length
        end = start + n
        self.cache.reserve(end)
        x, residual = head.inputs(self._embed(ids), features)
        cos, sin = self.target.rope(positions)
        q, key, value = head.qkv(x, cos.to(self.dtype), sin.to(self.dtype))  # (n, heads|kv, dim)
        keys, values = self.cache.write(0, start, torch.cat((key, value), dim=1).transpose(0, 1))
        self.cache.length = end
        if full_mask is None:
            full_mask = torch.ones(n, end, dtype=torch.bool, device=self.device)
            full_mask[:, start:] = mask
        kv_heads, dim = self.head.config.num_kv_heads, self.head.config.head_dim
        # Fold the query heads that share a KV head into rows (as the native target does).
        q = q.view(n, kv_heads, self.groups, dim).permute(1, 2, 0, 3).reshape(1, kv_heads, self.groups * n, dim)
        attn = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=full_mask.repeat(self.groups, 1))
        attn = attn.view(kv_heads, self.groups, n, dim).permute(2, 0, 1, 3).reshape(n, -1)
        return head.finish(residual, attn)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids).to(self.dtype)

    def _top(self, guesses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log q and ids of the top K draft tokens for each guessed feature (n, H)."""
        logq = torch.log_softmax(self._logits(guesses).float(), dim=-1)
        top, index = torch.topk(logq, self.top_k, dim=-1)
        ids = self.vocab[index] if self.vocab is not None else index
        return top, ids

    def _draft_vocab(self) -> torch.Tensor | None:
        """The head's draft vocabulary, and the LM head's rows for it (a small copy, when it has float
        weights: scoring those rows only is the saving)."""
        vocab = self.head.draft_vocab.to(self.device) if self.head.draft_vocab is not None else None
        self._lm_weight = _draft_lm_weight(self.target.lm_head, vocab, self.dtype)
        return vocab

    def _logits(self, guesses: torch.Tensor) -> torch.Tensor:
        """Logits (n, len(vocab)) over the draft vocabulary of guessed features (n, H)."""
        if self._lm_weight is not None:
            return guesses @ self._lm_weight.t()
        logits = self.target.lm_head(guesses)
        return logits[:, self.vocab] if self.vocab is not None else logits


def _draft_lm_weight(lm_head, vocab: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The LM head's rows for the draft vocabulary (a small copy), or None to call the head itself
    (a full vocabulary, or an int8 head without float weights)."""
    weight = getattr(lm_head, "weight", None)
    if vocab is None or not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        return None
    if getattr(lm_head, "bias", None) is not None:
        return None
    with torch.no_grad():
        return weight.detach()[vocab].to(dtype).contiguous()


def _prior_values(k: int) -> list[float]:
    """Path probabilities assumed before the first tree: the best child right 60% of the time,
    the others ever less often."""
    values = [0.6**d * 0.3**r for d in range(1, MAX_DEPTH + 1) for r in range(k)]
    return sorted(values, reverse=True)[:K_LIMIT]
