"""What a masked forward through sequence ids costs on llama.cpp against a chain of the same rows.

engine/backends/llama_tree.py runs a tree or lookahead's block as one llama_decode whose rows
belong to temporary sequence ids, which first get the cached tokens (llama_memory_seq_cp) and are
removed afterwards (llama_memory_seq_rm). This times, on the embedded model after a context of
`CONTEXT` tokens, at 1 thread, interleaved so that other load on the machine hits both alike:

- chain: `forward` of the block's n tokens, then a rollback of all but 2 (a chain step);
- masked: `forward_masked` of the same tokens with the block's mask, then `keep_rows` of 2;
- one token: `forward` of 1 token and its rollback, on this context (n_seq_max = 1 + 64,
  unified) and on one made without temporary ids (n_seq_max = 1), which plain decoding pays.

Medians of REPEATS (15) runs each.

    HF_HUB_OFFLINE=1 python docs/bench/llama_tree_cost.py
"""

from __future__ import annotations

import statistics
import time
from unittest import mock

from engine.backends import llama_tree
from engine.backends.llama_cpp import LlamaCppBackend
from engine.core.feeds import masked_block
from engine.drafters.base import ExtraRows, TreeDraft
from engine.drafters.lookahead import window_layout
from engine.models.locate import default_model_path

CONTEXT = (100, 1000)
REPEATS = 15


def blocks() -> dict[str, tuple[list[int], list[int], object]]:
    """Lookahead's block at its default (W, N, G) = (3, 3, 4) with a trie of 8 nodes, and a tree of 8."""
    offsets, mask = window_layout(3, 3)
    trie = TreeDraft([11, 12, 13, 14, 15, 16, 17, 18], parents=(-1, 0, -1, 2, -1, 4, -1, 6))
    look = TreeDraft(trie.tokens, parents=trie.parents, extra=ExtraRows(tuple(range(100, 106)), offsets, mask))
    tree = TreeDraft([11, 12, 13, 14, 15, 16, 17, 18], parents=(-1, 0, 0, 1, 1, 2, 3, -1))
    return {"lookahead 3,3,4": masked_block(42, look), "tree of 8": masked_block(42, tree)}


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main() -> None:
    text = "The quick brown fox jumps over the lazy dog. "
    with mock.patch.object(llama_tree, "tree_sequences", lambda model, room: 0):
        plain = LlamaCppBackend(default_model_path(), n_ctx=2048, n_threads=1)
    backend = LlamaCppBackend(default_model_path(), n_ctx=2048, n_threads=1)
    try:
        for n_context in CONTEXT:
            context = backend.tokenize(text * 200)[:n_context]
            for b in (backend, plain):
                b.prefill(context)
            base = len(context)
            print(f"after {n_context} tokens, 1 thread, medians of {REPEATS} (ms):")
            times: dict[str, list[float]] = {}
            for _ in range(REPEATS):
                for name, (tokens, offsets, mask) in blocks().items():

                    def chain(tokens=tokens):
                        backend.forward(tokens)
                        backend.rollback(base + 2)
                        backend.rollback(base)

                    def masked(tokens=tokens, offsets=offsets, mask=mask):
                        backend.forward_masked(tokens, offsets, mask)
                        backend.keep_rows([0, 1])
                        backend.rollback(base)

                    times.setdefault(f"{name}: chain of {len(tokens)}", []).append(timed(chain))
                    times.setdefault(f"{name}: masked {len(tokens)}", []).append(timed(masked))
                for label, b in (("one token, n_seq_max 65", backend), ("one token, n_seq_max 1", plain)):

                    def one(b=b):
                        b.forward([42])
                        b.rollback(base)

                    times.setdefault(label, []).append(timed(one))
            for label, values in times.items():
                print(f"  {label:32} {1000 * statistics.median(values):7.1f}")
    finally:
        backend.close()
        plain.close()


if __name__ == "__main__":
    main()
