"""Training an EAGLE-3 head on the frozen target's cached layer inputs, with EAGLE-3's training-time test.

Notation as in engine/heads/eagle3.py and engine/training/eagle.py: the window's tokens
x_0 .. x_{T-1}; the feature cache (features.py, `layers`) holds per token the inputs a_t of
the head's three target layers, the target's final hidden state h_t and its greedy token
y_t = argmax p_t (the target's guess of x_{t+1}). Pair t carries u_t = fc(a_t).

The training-time test (Li et al. 2025, section 3.3): the head is unrolled DEPTHS deep on
its own outputs, as drafting feeds it (eagle.unroll: depth d pairs x_{t+d} with the head's
depth d - 1 guess at position t + d - 1, attending to the depth-1 rows up to t and to its own
ancestors, the attention mask of a draft tree). There is no feature regression: each depth
is scored on tokens only, against the target's distribution over the draft vocabulary,

    p_d(t)   = softmax over the draft ids of LM(h_{t+d})        (the target's, renormalized)
    loss_d   = mean_t [y_{t+d} in the draft vocabulary] * H(p_d(t), q_d(t)),
    q_d(t)   = softmax(lm_head(norm(g_d(t))))                   (the head's, over the draft ids)
    loss     = sum_d DEPTH_DECAY^(d-1) loss_d

as SafeAILab's trainer does (positions whose greedy token the head cannot propose are left
out; the weights 0.8^(d-1) and the 7 depths are theirs). The reported "head" numbers are per
depth: top-1 agreement of the head's draft id, mapped to its target id, with y_{t+d}.

The draft vocabulary is the DEFAULT_DRAFT_VOCAB ids the target predicts most often on the
cached windows (its greedy tokens y_t; eagle.draft_vocabulary, EOS always in; medusa.py
chooses it before the first step), stored as d2t / t2d; the head is saved in the published
layout (engine/heads/eagle3.py), which SpecDeck, SafeAILab's code and vLLM read.
"""

from __future__ import annotations

import torch

from engine.heads.eagle3 import Eagle3Config, Eagle3Head
from engine.training.eagle import unroll
from engine.training.loss import SoftCrossEntropy
from engine.training.records import EAGLE3_DEPTHS

DEPTHS = EAGLE3_DEPTHS
DEPTH_DECAY = 0.8


def make_head(target, base_model: str, seed: int, draft_vocab: int) -> Eagle3Head:
    """A fresh head for `target` (float32, on its device) with room for `draft_vocab` draft ids (0: the
    whole vocabulary; which ids, set_draft_vocab says), initialised from `seed` alone (the global
    RNG is left as it was)."""
    config = Eagle3Config.for_target(
        target.model.config.get_text_config(),
        base_model=base_model,
        draft_vocab_size=min(draft_vocab, target.vocab_size) or None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = Eagle3Head(config)
    head.set_draft_vocab(torch.arange(config.draft_vocab_size))
    return head.to(target.device)


def eagle3_losses(
    head: Eagle3Head, target, ids: torch.Tensor, cached: torch.Tensor, labels: torch.Tensor, train: bool
) -> tuple[list[float], list[float]]:
    """Loss and top-1 agreement per depth on windows `ids` (B, T) with cached rows (B, T, 4H: the
    layers' inputs, then h_t) and greedy labels (B, T); with `train`, backward() on the weighted sum."""
    B, T, _ = cached.shape
    H = head.config.hidden_size
    device = cached.device
    dtype = next(head.parameters()).dtype
    cached = cached.to(dtype)
    layer_inputs, final = cached[..., :-H], cached[..., -H:]
    labels = labels.to(device)
    embeds = target.embed(ids.to(device)).to(dtype)  # (B, T, H): e(x_t)
    cos, sin = (t.to(dtype) for t in target.rope(torch.arange(T, device=device)))  # (T, dim)
    guesses = unroll(head, embeds, head.project(layer_inputs[:, : T - 1]), cos, sin, DEPTHS)
    draft_ids = head.draft_ids
    with torch.no_grad():  # the target's logits over the draft ids, and where its greedy token is one
        weight = target.lm_head.weight.detach()[draft_ids]
        teacher = torch.nn.functional.linear(final.to(weight.dtype), weight).float()  # (B, T, D)
        proposable = head.t2d[labels]  # (B, T)
    total = torch.zeros((), device=device)
    losses, accuracy = [], []
    for depth, guess in enumerate(guesses, 1):
        logits = head.logits(guess).float()  # (B, T-depth, D)
        keep = proposable[:, depth:]
        p = torch.softmax(teacher[:, depth:][keep], dim=-1)  # (rows kept, D)
        loss = SoftCrossEntropy.apply(logits[keep], p) / keep.numel()  # the mean over all rows, as SafeAILab's
        total = total + DEPTH_DECAY ** (depth - 1) * loss
        losses.append(float(loss.detach()))
        hits = draft_ids[logits.detach().argmax(-1)] == labels[:, depth:]
        accuracy.append(float(hits.float().mean()))
    if train:
        total.backward()
    return losses, accuracy
