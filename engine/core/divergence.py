"""Explaining where a speculative greedy run and a vanilla greedy run part ways.

In float32 the two agree token for token. In bf16 and in quantized GGUF models a
token's logits computed inside a verification batch differ from the logits of a
one-token decode by rounding (up to ~0.9 in bf16, ~1.6 for Q4_1 in llama.cpp),
which flips the greedy choice where the top two candidates are that close.

A divergence at position i is *explained* when, with the same tokens before i:
  - the speculative token s is the argmax of the row the verification batch computed,
  - the vanilla token v is the argmax of the row the one-token decode computed, and
  - each row ranks the other run's token within the rounding bound of its own choice
    (l_batch[s] - l_batch[v] and l_single[v] - l_single[s] both small).
Anything else (a token far down the list, a different prefix) is a bug.
"""

from __future__ import annotations

from engine.backends.base import ModelInfo
from engine.core.events import Divergence, GenerationResult, TokenInfo


def rounding_bound(info: ModelInfo) -> float:
    """How far apart (in logits) batched and single-token evaluation can put two candidates."""
    dtype = info.dtype.lower()
    if dtype in ("float32", "fp32", "f32"):
        return 1e-3
    if info.backend == "llama.cpp":
        return 3.5  # quantized kernels: up to ~1.6 per row measured, twice for two rows
    return 2.0  # bf16 / fp16: up to ~0.9 per row measured


def first_divergence(speculative: GenerationResult, vanilla: GenerationResult, bound: float) -> Divergence | None:
    """None when the two token sequences are identical."""
    spec_infos = _with_end(speculative)
    van_infos = _with_end(vanilla)
    n = min(len(speculative.tokens), len(vanilla.tokens))
    index = next((i for i in range(n) if speculative.tokens[i] != vanilla.tokens[i]), None)
    if index is None:
        if len(speculative.tokens) == len(vanilla.tokens):
            return None
        index = n  # one run stopped (EOS or max tokens) where the other went on
    s = spec_infos[index] if index < len(spec_infos) else None
    v = van_infos[index] if index < len(van_infos) else None
    if s is None or v is None:
        reason = "one run reached its token limit at this position; the other ended or went on"
        return Divergence(index, s.id if s else -1, v.id if v else -1, True, reason)
    explained, reason = _explain(s, v, bound)
    return Divergence(index, s.id, v.id, explained, reason)


def _with_end(result: GenerationResult) -> list[TokenInfo]:
    infos = list(result.token_infos)
    end = result.events[-1].end_token if result.events else None
    if end is not None:
        infos.append(end)
    return infos


def _explain(s: TokenInfo, v: TokenInfo, bound: float) -> tuple[bool, str]:
    if not s.top_ids or not v.top_ids:
        return False, "no logits were recorded for this position (sampling run?)"
    if s.top_ids[0] != s.id or v.top_ids[0] != v.id:
        return False, "a greedy run emitted a token that is not the argmax of its own logits"
    if v.id not in s.top_ids or s.id not in v.top_ids:
        return False, (
            f"token {v.id} is not among the verification batch's top {len(s.top_ids)} candidates "
            f"(or {s.id} not among the single decode's): far more than rounding"
        )
    gap_batch = s.top_logits[0] - s.top_logits[s.top_ids.index(v.id)]
    gap_single = v.top_logits[0] - v.top_logits[v.top_ids.index(s.id)]
    detail = (
        f"the batch ranked {s.id} over {v.id} by {gap_batch:.3g} logits, "
        f"the one-token decode ranked {v.id} over {s.id} by {gap_single:.3g}"
    )
    if gap_batch <= bound and gap_single <= bound:
        return True, f"rounding: {detail} (within the {bound:g} bound for this precision)"
    return False, f"{detail}: beyond the {bound:g} rounding bound for this precision"
