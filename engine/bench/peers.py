"""The systems a user would otherwise pick, run in this process on the same model file.

- llama.cpp backend: llama-cpp-python's own `create_chat_completion` (vanilla),
  and the same with `LlamaPromptLookupDecoding(num_pred_tokens=10)` as its draft
  model (speculative, prompt lookup). Same file, context size and threads as ours.
- torch backend: transformers' `generate` (vanilla), with
  `prompt_lookup_num_tokens=10`, and with `assistant_model=` when a draft model
  is loaded (speculative). They run on the very model objects our backend loaded
  (same file, dtype and device, no second copy in memory); a draft model that our
  engine runs on llama.cpp is loaded through transformers for the assistant peer.

Every peer is greedy, reads the same messages, and is timed the same way as our
engine: decode speed, prefill excluded, from its first generated token to its
last, counting generated token ids (the end-of-turn token not included). A peer
that fails to load or to run becomes a failure row, never a missing one.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from engine.bench.peer import Peer, PeerOutput, PeerSpec  # noqa: F401 (the peers' records, imported from here too)
from engine.bench.prompts import BenchPrompt
from engine.bench.results import SPECULATIVE, VANILLA, BenchmarkCancelled, PeerPromptResult, PeerResult

LOOKUP_TOKENS = 10  # prompt lookup's draft length, as both libraries document it
PEER_WARMUP_TOKENS = 8


# -- running -----------------------------------------------------------------------------


def run_peers(
    specs: list[PeerSpec],
    prompts: tuple[BenchPrompt, ...],
    prompt_ids: dict[str, list[int]],
    reference: dict[str, tuple[str, tuple[int, ...]]],  # prompt id -> our vanilla (text, token ids)
    max_tokens: int,
    repeat: int,
    *,
    warmup: int = 1,
    progress: Callable[[str, float], None] | None = None,
    cancel: threading.Event | None = None,
) -> tuple[PeerResult, ...]:
    results = []
    for index, spec in enumerate(specs):
        if progress is not None:
            progress(f"Peer {spec.name}", index / max(len(specs), 1))
        results.append(_run_one(spec, prompts, prompt_ids, reference, max_tokens, repeat, warmup, cancel))
    return tuple(results)


def _run_one(spec, prompts, prompt_ids, reference, max_tokens, repeat, warmup, cancel) -> PeerResult:
    peer = None
    try:
        peer = spec.make()
        for _ in range(warmup):
            first = prompts[0]
            peer.generate(first, prompt_ids[first.id], min(PEER_WARMUP_TOKENS, max_tokens))
        outputs: dict[str, list[PeerOutput]] = {p.id: [] for p in prompts}
        for _ in range(repeat):
            for prompt in prompts:
                if cancel is not None and cancel.is_set():
                    raise BenchmarkCancelled()
                outputs[prompt.id].append(peer.generate(prompt, prompt_ids[prompt.id], max_tokens))
        rows = tuple(_summarize(prompt, outputs[prompt.id], reference.get(prompt.id)) for prompt in prompts)
        return PeerResult(spec.name, spec.mode, rows)
    except BenchmarkCancelled:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of a peer is a result to report
        return PeerResult(spec.name, spec.mode, error=f"{type(error).__name__}: {error}".strip())
    finally:
        if peer is not None:
            try:
                peer.close()
            except Exception:  # noqa: BLE001 - closing a failed peer must not hide its failure
                pass


def _summarize(prompt: BenchPrompt, outputs: list[PeerOutput], reference) -> PeerPromptResult:
    first = outputs[0]
    identical = None
    if reference is not None:
        text, ids = reference
        if first.token_ids is not None:
            identical = tuple(first.token_ids) == tuple(ids)
        else:
            identical = first.text.strip() == text.strip()
    return PeerPromptResult(
        prompt_id=prompt.id,
        kind=prompt.kind,
        tokens=round(statistics.median(o.tokens for o in outputs)),
        tokens_per_s=statistics.median(o.tokens_per_s for o in outputs),
        identical=identical,
        text=first.text,
    )


# -- which peers -------------------------------------------------------------------------


def default_peers(engine, llama_server: str | None = None) -> list[PeerSpec]:
    """The peers matching the engine's target backend (see the module docstring); on llama.cpp also
    llama-server's (engine/bench/llama_server_peers.py) when a binary is found (`llama_server`: its
    path, which must exist)."""
    target = engine.target
    if target.info.backend == "llama.cpp":
        from engine.backends.llama_cpp import default_threads
        from engine.bench.llama_server_peers import llama_server_peers
        from engine.remote.llama_server_binary import find_llama_server

        path, n_ctx, threads = target.info.path, target.n_ctx, engine.config.threads or default_threads()
        specs = [
            PeerSpec("llama-cpp-python chat completion", VANILLA, lambda: LlamaChatPeer(path, n_ctx, threads)),
            PeerSpec(
                f"llama-cpp-python prompt lookup ({LOOKUP_TOKENS})",
                SPECULATIVE,
                lambda: LlamaChatPeer(path, n_ctx, threads, lookup=True),
            ),
        ]
        binary = find_llama_server(llama_server)
        if binary is not None:
            draft = getattr(getattr(getattr(engine.drafter, "backend", None), "info", None), "path", None)
            specs += llama_server_peers(binary, path, n_ctx, threads, draft)
        return specs
    specs = [
        PeerSpec("transformers generate", VANILLA, lambda: TransformersPeer(engine)),
        PeerSpec(
            f"transformers prompt lookup ({LOOKUP_TOKENS})",
            SPECULATIVE,
            lambda: TransformersPeer(engine, prompt_lookup_num_tokens=LOOKUP_TOKENS),
        ),
    ]
    draft = getattr(engine.drafter, "backend", None)
    if draft is not None:
        specs.append(
            PeerSpec("transformers assistant model", SPECULATIVE, lambda: TransformersPeer(engine, assistant=draft))
        )
    return specs


class LlamaChatPeer:
    """llama-cpp-python's high-level chat completion, greedy."""

    def __init__(self, path: str, n_ctx: int, threads: int, lookup: bool = False) -> None:
        from engine.backends.llama_cpp import open_llama

        options = dict(
            model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False
        )
        if lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            options["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS)
        self.llm = open_llama(**options)
        # Timing only: note when the first token is sampled (the prompt has been evaluated by then).
        # Overriding the bound method on this instance changes nothing in how it decodes.
        self._first_token_at: float | None = None
        sample = self.llm.sample

        def timed_sample(*args, **kwargs):
            token = sample(*args, **kwargs)
            if self._first_token_at is None:
                self._first_token_at = time.perf_counter()
            return token

        self.llm.sample = timed_sample

    def generate(self, prompt: BenchPrompt, prompt_ids: list[int], max_tokens: int) -> PeerOutput:
        self._first_token_at = None
        response = self.llm.create_chat_completion(
            messages=[dict(m) for m in prompt.messages], max_tokens=max_tokens, temperature=0.0, seed=0
        )
        end = time.perf_counter()
        tokens = int(response["usage"]["completion_tokens"])
        text = response["choices"][0]["message"]["content"] or ""
        start = self._first_token_at if self._first_token_at is not None else end
        return PeerOutput(text, tokens, end - start, max(tokens - 1, 0))

    def close(self) -> None:
        self.llm.close()


class TransformersPeer:
    """transformers' `generate`, greedy, on the model our torch backend loaded."""

    def __init__(self, engine, assistant=None, **generate_options) -> None:
        self.model, self.tokenizer = _hf_model(engine.target, engine.target.info.dtype)
        self.device = self.model.device
        self.eos = set(engine.target.eos_ids)
        self.detokenize = engine.target.detokenize
        self.options = dict(generate_options)
        if assistant is not None:
            self.options["assistant_model"] = _hf_model(assistant, engine.target.info.dtype, self.device)[0]

    def generate(self, prompt: BenchPrompt, prompt_ids: list[int], max_tokens: int) -> PeerOutput:
        import torch

        streamer = _Timing()
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        pad = next(iter(self.eos)) if self.eos else None
        with torch.inference_mode():
            output = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=max_tokens,
                streamer=streamer,
                pad_token_id=pad,
                **self.options,
            )
        end = time.perf_counter()
        ids = output[0, len(prompt_ids) :].tolist()
        while ids and ids[-1] in self.eos:  # the end-of-turn token is not part of the reply
            ids.pop()
        start = streamer.first_at if streamer.first_at is not None else end
        return PeerOutput(
            self.detokenize(ids), len(ids), end - start, max(len(ids) - streamer.first_count, 0), tuple(ids)
        )

    def close(self) -> None:
        self.model = self.options = None  # the model belongs to our backend: nothing to free here


class _Timing:
    """A transformers streamer that only notes when the first generated tokens arrive."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_at: float | None = None
        self.first_count = 0

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:  # the first put is the prompt itself
            self.first_at = time.perf_counter()
            self.first_count = int(value.numel())

    def end(self) -> None:
        pass


def _hf_model(backend, dtype: str, device=None):
    """(model, tokenizer) of a torch backend as loaded, or the same file loaded through transformers."""
    model = getattr(backend, "_model", None)  # TorchBackend keeps the transformers model it loaded
    if model is not None:
        return model, getattr(backend, "_tok", None)
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.backends.hf.device import pick_dtype

    path = backend.info.path
    folder, gguf = os.path.split(path) if path.lower().endswith(".gguf") else (path, None)
    options = {"local_files_only": True, **({"gguf_file": gguf} if gguf else {})}
    torch_dtype = pick_dtype("cpu", dtype if dtype in ("float32", "bfloat16", "float16") else "auto")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, **options).eval()
    if device is not None:
        model = model.to(device)
    return model, AutoTokenizer.from_pretrained(folder, **options)
