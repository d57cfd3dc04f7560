"""Replies the target writes itself: the training data closest to what the heads will see.

Medusa's self-distillation (Cai et al. 2024, section 3.2.2) trains on the
target's own outputs, so the heads learn the continuations the target actually
produces. The replies come from the engine itself (plain decoding, no drafter),
so a GGUF target generates on llama.cpp, much faster on a CPU than the
transformers model that training loads afterwards. On a CUDA device one reply at
a time would leave the GPU idle, so there the replies come in batches from
transformers' `generate` (left-padded prompts, the same greedy or sampled rule).
Each reply (or batch) is appended to a JSON-lines file as soon as it is written:
a cancelled or crashed run keeps the replies it has and the next start only
writes the missing ones.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

from engine.training.data import Document, jsonl_document

BATCH = 128  # replies per generate() call on a GPU


def read_replies(path: str) -> list[Document]:
    """The conversations written so far (a torn last line is ignored)."""
    documents = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    document = jsonl_document(json.loads(line), path)
                except ValueError:
                    continue
                if document is not None:
                    documents.append(document)
    except FileNotFoundError:
        pass
    return documents


def generate_replies(
    target_spec: str,
    prompts: list[str],
    path: str,
    *,
    max_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    device: str = "auto",
    dtype: str = "auto",
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[Document]:
    """The target's replies to `prompts`, continuing the file at `path`; returns every reply in it.

    Greedy by default: that is how the app decodes unless told otherwise, so the
    heads learn the continuations they will be asked to guess. `batch_size`: None
    means batches of BATCH on a CUDA device and the engine, one reply at a time,
    elsewhere; a number forces batches of that size (on any device).
    """
    from engine.api import Engine, EngineConfig
    from engine.core.sampling import SamplingConfig

    done = read_replies(path)
    todo = prompts[len(done) :]
    if not todo or (cancel is not None and cancel.is_set()):
        return done
    if batch_size is None:
        from engine.backends.hf.device import pick_device

        batch_size = BATCH if pick_device(device) == "cuda" else 0
    if batch_size > 0:
        return _generate_batched(
            target_spec, prompts, done, path, max_tokens, temperature, seed, device, dtype, batch_size, progress, cancel
        )
    engine = Engine.load(EngineConfig(target=target_spec, drafter="none", measure_costs=False))
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            for prompt in todo:
                if cancel is not None and cancel.is_set():
                    break
                sampling = SamplingConfig(temperature=temperature, seed=seed + len(done), max_tokens=max_tokens)
                result = engine.generate(engine.prompt_ids(prompt), sampling, speculative=False, cancel=cancel)
                if result.finish_reason == "cancelled":
                    break
                record = {
                    "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": result.text}]
                }
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                done.append(jsonl_document(record, path))
                if progress is not None:
                    progress(len(done), len(prompts))
    finally:
        engine.close()
    return done


def _generate_batched(
    target_spec, prompts, done, path, max_tokens, temperature, seed, device, dtype, batch_size, progress, cancel
) -> list[Document]:
    """Batches of replies through transformers' generate (left padding), appended batch by batch."""
    import torch

    from engine.training.target import load_target

    target = load_target(target_spec, device=device, dtype=dtype)
    tokenizer, model = target.tokenizer, target.model
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else target.eos_id
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            while len(done) < len(prompts):
                if cancel is not None and cancel.is_set():
                    break
                batch = prompts[len(done) : len(done) + batch_size]
                rows = [_chat_ids(target, prompt) for prompt in batch]
                width = max(len(r) for r in rows)
                ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=target.device)
                mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=target.device)
                torch.manual_seed(seed + len(done))  # generate() samples with the global generator
                with torch.inference_mode():
                    out = model.generate(
                        input_ids=ids,
                        attention_mask=mask,
                        max_new_tokens=max_tokens,
                        pad_token_id=pad,
                        do_sample=temperature > 0,
                        temperature=temperature if temperature > 0 else None,
                        top_k=None,
                        top_p=None,
                    )
                for prompt, reply in zip(batch, out[:, width:].tolist()):
                    reply = _until_end(reply, target.stop_ids(), pad)
                    text = tokenizer.decode(reply, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                    record = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]}
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    done.append(jsonl_document(record, path))
                f.flush()
                if progress is not None:
                    progress(len(done), len(prompts))
    finally:
        target.close()
    return done


def _chat_ids(target, prompt: str) -> list[int]:
    """The prompt as a user turn, through the chat template, ready for the reply."""
    return target.encode_chat([{"role": "user", "content": prompt}], reply=True)


def _until_end(reply: list[int], stops: frozenset[int], pad: int | None) -> list[int]:
    for i, token in enumerate(reply):
        if token in stops or token == pad:
            return reply[:i]
    return reply
