"""Replies the target writes itself: the training data closest to what the heads will see.

Medusa's self-distillation (Cai et al. 2024, section 3.2.2) trains on the
target's own outputs, so the heads learn the continuations the target actually
produces. The replies come from the engine itself (plain decoding, no drafter),
so a GGUF target generates on llama.cpp, much faster on a CPU than the
transformers model that training loads afterwards. Each reply is appended to a
JSON-lines file as soon as it is written: a cancelled or crashed run keeps the
replies it has and the next start only writes the missing ones.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

from .data import Document, jsonl_document


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
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[Document]:
    """The target's replies to `prompts`, continuing the file at `path`; returns every reply in it.

    Greedy by default: that is how the app decodes unless told otherwise, so the
    heads learn the continuations they will be asked to guess.
    """
    from ..sampling import SamplingConfig
    from ..session import Engine, EngineConfig

    done = read_replies(path)
    todo = prompts[len(done) :]
    if not todo or (cancel is not None and cancel.is_set()):
        return done
    engine = Engine.load(EngineConfig(target=target_spec, drafter="none", measure_costs=False))
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            for i, prompt in enumerate(todo):
                if cancel is not None and cancel.is_set():
                    break
                sampling = SamplingConfig(temperature=temperature, seed=seed + len(done), max_tokens=max_tokens)
                result = engine.generate(engine.prompt_ids(prompt), sampling, speculative=False, cancel=cancel)
                if result.finish_reason == "cancelled":
                    break
                record = {"messages": [{"role": "user", "content": prompt},
                                       {"role": "assistant", "content": result.text}]}  # fmt: skip
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                done.append(jsonl_document(record, path))
                if progress is not None:
                    progress(len(done), len(prompts))
    finally:
        engine.close()
    return done
