"""The self-distillation loss: each head's KL to the target's distribution k tokens ahead.

For head k at position t the label is p_{t+k}, the target's distribution of
token t + 1 + k (see medusa.py for the notation). p is never stored for a whole
batch: it is recomputed per chunk of positions from the hidden states (the LM
head is one matmul) and used by all K heads of that chunk before the next, so
memory is bounded by CHUNK_ROWS x V whatever the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.heads.medusa import MedusaHeads

# Positions per loss chunk (all batch rows together): bounds the (rows, V) tensors held at once. At
# 128 rows of a 49k vocabulary one is 25 MB, under glibc's largest mmap threshold, so the allocator
# reuses that memory instead of mapping (and page-faulting) fresh memory for every chunk.
CHUNK_ROWS = 128


def distill(
    heads: MedusaHeads, target, ids: torch.Tensor, weights: Sequence[float], train: bool, chunk_rows: int = CHUNK_ROWS
) -> tuple[list[float], list[float]]:
    """KL per head and top-1 agreement per head on the batch `ids` (B, T); with `train`, also backward().

    Gradients are accumulated chunk by chunk, each scaled so that their sum is
    the gradient of sum_k w_k * mean_t KL_k over the whole batch.
    """
    hidden = target.hidden_states(ids).float()  # (B, T, H), no grad
    B, T, _ = hidden.shape
    K = len(heads.heads)
    rows = [B * (T - k) for k in range(1, K + 1)]  # positions t with a label p_{t+k}
    kl_sums, hits = [0.0] * K, [0] * K
    span = max(1, chunk_rows // B)
    for a in range(0, T - 1, span):
        b = min(a + span, T - 1)
        with torch.no_grad():
            logits = target.logits(hidden[:, a + 1 : min(b + K, T)])  # (B, n, V): the target's p_{a+1..}
            top = logits.argmax(dim=-1)  # (B, n)
            p, neg_entropy = _softmax_and_neg_entropy(logits)
            del logits
        for k in range(1, K + 1):
            end = min(b, T - k)
            if end <= a:
                continue
            labels = slice(k - 1, k - 1 + end - a)  # p_{t+k} for t in [a, end)
            with torch.set_grad_enabled(train):
                z = heads.heads[k - 1](hidden[:, a:end])  # (B, m, H)
                student = target.logits(z)  # (B, m, V)
                hits[k - 1] += int((student.detach().argmax(dim=-1) == top[:, labels]).sum())
                cross_entropy = SoftCrossEntropy.apply(student, p[:, labels])
                if train:
                    (cross_entropy * (weights[k - 1] / rows[k - 1])).backward()
            # KL(p || q) = H(p, q) - H(p): the entropy term has no gradient, so it is only added for the report.
            kl_sums[k - 1] += float(cross_entropy.detach()) + float(neg_entropy[:, labels].sum())
    return [s / n for s, n in zip(kl_sums, rows)], [h / n for h, n in zip(hits, rows)]


def _softmax_and_neg_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(logits) and sum_v p log p per row; overwrites `logits`. (..., V) -> (..., V), (...)."""
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # (..., 1)
    p = torch.exp(logits - lse)
    neg_entropy = (p * logits).sum(-1) - lse.squeeze(-1)  # sum p log p = sum p * logits - lse
    return p, neg_entropy


class SoftCrossEntropy(torch.autograd.Function):
    """sum over rows of H(p, softmax(s)) = sum_rows (logsumexp(s) - p . s); gradient softmax(s) - p.

    One function instead of log_softmax + kl_div: the (rows, V) tensors are the
    largest thing in training, and this touches each of them a few times
    instead of a dozen, and keeps one tensor (the gradient) for backward.
    """

    @staticmethod
    def forward(ctx, s: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        top = s.amax(dim=-1, keepdim=True)  # (..., 1)
        e = torch.exp(s - top)  # (..., V)
        total = e.sum(dim=-1, keepdim=True)
        lse = top + total.log()
        loss = lse.sum() - (p * s).sum()
        ctx.save_for_backward(e.div_(total).sub_(p))  # softmax(s) - p
        return loss

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None


# -- the features objective ---------------------------------------------------------------
#
# Head k regresses the target's own hidden state: z_k(h_t) ~ h_{t+k}. Since LM is linear and
# shared, z_k = h_{t+k} reproduces p_{t+k} exactly. The error is measured where it matters, in
# logits: for an error e in feature space the logits move by W e (W: the (V, H) LM head), and
# softmax ignores a shift of all logits, so the error that counts is C W e with C the centring
# over the vocabulary. Its mean square over the vocabulary is e^T G e with G = W^T C W / V, an
# H x H matrix: the full-vocabulary logit MSE at the cost of a feature-space one. With
# G = M M^T, ||e M||^2 is that MSE. (Plain feature MSE would weigh every dimension alike, but on
# SmolLM2 a few dimensions move the logits 60x more than the median one.) Dividing by the
# target's own centred logit variance, mean_t ||h_t M||^2, makes the loss a fraction of
# variance unexplained, comparable across models.
#
# A cross-entropy term on a few random positions per head ties the regression to what decoding
# needs, the target's greedy token: CE(LM(z_k), argmax p_{t+k}), weighted TOKEN_WEIGHT.

TOKEN_ROWS = 64  # positions per head and step that go through the full LM head
TOKEN_WEIGHT = 0.1


def logit_metric(lm_weight: torch.Tensor) -> torch.Tensor:
    """M (H, H) with ||e M||^2 = mean over the vocabulary of the centred logit change W e, squared."""
    W = lm_weight.detach().double()  # (V, H)
    centred = W - W.mean(dim=0, keepdim=True)
    gram = centred.T @ centred / W.shape[0]  # (H, H)
    gram += torch.eye(W.shape[1], dtype=gram.dtype, device=gram.device) * 1e-8 * gram.diagonal().mean()
    return torch.linalg.cholesky(gram).float()  # lower L with L L^T = G: ||e L||^2 = e^T G e


def feature_scale(features: torch.Tensor, metric: torch.Tensor) -> float:
    """The target's mean centred logit variance, mean_t ||h_t M||^2, over (..., H) features."""
    return float((features.reshape(-1, features.shape[-1]) @ metric).pow(2).sum(-1).mean())


def regress(
    heads: MedusaHeads,
    lm_logits,
    features: torch.Tensor,
    labels: torch.Tensor,
    weights: Sequence[float],
    metric: torch.Tensor,
    scale: float,
    generator: torch.Generator,
    token_rows: int = TOKEN_ROWS,
) -> tuple[list[float], list[float]]:
    """Loss per head and top-1 agreement per head (on the sampled rows) for cached features (B, T, H).

    Calls backward() on sum_k w_k * loss_k; `labels` (B, T) are argmax p_t; `lm_logits` is the
    target's LM head, (..., H) -> float32 (..., V).
    """
    B, T, H = features.shape
    total = features.new_zeros(())
    losses, accuracy = [], []
    for k in range(1, len(heads.heads) + 1):
        z = heads.heads[k - 1](features[:, : T - k])  # (B, T-k, H): the guess of h_{t+k}
        error = (z - features[:, k:]) @ metric  # (B, T-k, H), in logit units
        regression = error.pow(2).sum(-1).mean() / scale
        rows = torch.randperm(B * (T - k), generator=generator)[:token_rows]
        chosen = z.reshape(-1, H)[rows]  # (R, H)
        target_tokens = labels[:, k:].reshape(-1)[rows]  # (R,): the target's greedy token t + k + 1
        logits = lm_logits(chosen)  # (R, V)
        token = torch.nn.functional.cross_entropy(logits, target_tokens)
        loss = regression + TOKEN_WEIGHT * token
        total = total + weights[k - 1] * loss
        losses.append(float(loss.detach()))
        accuracy.append(float((logits.detach().argmax(-1) == target_tokens).float().mean()))
    total.backward()
    return losses, accuracy
