"""The load test's context axis: the prompt set padded to a context length, and what fits.

MagicDec (arXiv 2408.11049) finds that at long contexts reading the KV cache, not the
weights, dominates a batched forward, and speculation pays again at batch sizes where it
had stopped: the break-even B moves with the context. To see it, every prompt is made
`context` tokens long by putting text before its question, as a long chat or a pasted
document would. The text is the other prompts of the set, in turn (real sentences in the
language of the prompts; a string repeated over and over would hand an n-gram drafter
matches a real context does not have), so the question and the reply stay the prompt's own.

A load test runs more requests than the set has prompts. Each later copy of a prompt starts
with "Request N." so that no request finds its whole prompt already in a slot's cache: the
requests of different users share no more than the chat template's first tokens, and which
slot a request lands on (and so whether its prefill is free) would otherwise differ from one
mode to the next and be counted as the mode's speed.
"""

from __future__ import annotations

import statistics

from engine.bench.prompts import BenchPrompt
from engine.bench.runner import encode_prompt

PADDING_NOTE = "Earlier notes, for reference:\n\n"
TRIES = 4  # re-encodings to land on the length (a token can merge across the cut)


def prompt_ids(engine, prompts: tuple[BenchPrompt, ...], context: int | None, count: int = 0) -> list[list[int]]:
    """The ids of `count` requests (default one per prompt): the prompts in turn (each its first
    turn; copies after the first marked, see above), padded to `context` tokens when given; a
    prompt already longer runs as it is."""
    requests = []
    for i in range(max(count, len(prompts))):
        prompt, copy = prompts[i % len(prompts)], i // len(prompts)
        mark = f"Request {copy + 1}.\n\n" if copy else ""  # first, so that it ends the shared prefix
        ids = encode_prompt(engine, _with_text_before(prompt, mark) if mark else prompt)
        if context is not None and len(ids) < context:
            ids = _padded(engine, prompt, mark, ids, prompts, context)
        requests.append(ids)
    return requests


def median_length(ids: list[list[int]]) -> int:
    return int(statistics.median(len(i) for i in ids))


def room_needed(context: int, max_tokens: int, k_max: int) -> int:
    """Context window one request of the sweep needs: its prompt, its reply, and a last draft's rows."""
    return context + max_tokens + k_max + 1


def _padded(engine, prompt: BenchPrompt, mark: str, ids: list[int], prompts, context: int) -> list[int]:
    """`prompt` with `mark`, then text of the other prompts, before its first user message, cut to make
    it `context` tokens long (within a token or two: the chat template and the cut may merge)."""
    target = engine.target
    filler = _filler_ids(target, prompt, prompts, context)
    want = context - len(ids)
    best = ids
    for _ in range(TRIES):
        text = target.detokenize(filler[: max(want, 0)])
        padded = encode_prompt(engine, _with_text_before(prompt, mark + PADDING_NOTE + text))
        best = padded
        miss = len(padded) - context
        if miss == 0 or want <= 0:
            break
        want -= miss
    return best


def _filler_ids(target, prompt: BenchPrompt, prompts, context: int) -> list[int]:
    """Token ids of the other prompts' messages, in turn, at least `context` of them."""
    others = [m["content"] for p in prompts if p.id != prompt.id for m in p.messages] or [
        m["content"] for m in prompt.messages
    ]
    ids: list[int] = []
    while len(ids) < context:
        before = len(ids)
        for text in others:
            ids += target.tokenize(text + "\n\n")
            if len(ids) >= context:
                break
        if len(ids) == before:  # a tokenizer that makes nothing of this text: the prompt stays short
            break
    return ids


def _with_text_before(prompt: BenchPrompt, text: str) -> BenchPrompt:
    messages = [dict(m) for m in prompt.messages]
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), 0)
    messages[first]["content"] = f"{text.rstrip()}\n\n{messages[first]['content']}"
    return BenchPrompt(prompt.id, prompt.kind, tuple(messages))
