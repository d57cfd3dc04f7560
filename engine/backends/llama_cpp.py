"""A GGUF model run by llama.cpp (through llama-cpp-python).

`llama_cpp.Llama` loads the model and owns the context, vocabulary and metadata,
but its `eval` can only ask for logits on every token or on the last one, and
copies them into a preallocated numpy array. Speculative decoding needs both
kinds of call in its hot loop, so decoding here goes through the low-level API
with our own `llama_batch`, whose arrays are numpy buffers allocated once
(nothing to free, nothing to build per call), and logits are `memmove`d straight
from llama.cpp's output buffer into a fresh torch tensor (engine/backends/llama_slots.py,
where the decode of every sequence lives).

KV cache rules this relies on (llama.cpp, checked on 0.3.36):
- a batch must start at the position right after the last cached one, so a
  rollback removes exactly positions >= length and the next decode starts there;
- logits buffers are overwritten by the next decode, hence the copy;
- re-decoding after a rollback reproduces the first pass bit for bit.
A model with recurrent layers (Qwen3.5, LFM2, Nemotron-H, Mamba...) cannot cut its state that way:
it saves the state before each forward and rolls back by restoring it (engine/backends/llama_state.py).
Loaded with slots=N, the context holds N sequences, decoded together by `forward_batch`
(engine/backends/llama_slots.py); the backend itself is sequence 0.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
from itertools import compress, repeat

import llama_cpp
import numpy as np
import torch

from engine.backends import (
    gpu_layers,  # its llama_cpp_offloads read at each call: tests fake a GPU build
    llama_tree,
)
from engine.backends.base import Backend, LoadProgress, ModelInfo
from engine.backends.capabilities import Slots, TreeForward
from engine.backends.llama_slots import LlamaSlot, Rows, SlotTable, decode_sequence, truncate_sequence
from engine.backends.llama_slots import forward_batch as run_batch
from engine.backends.llama_state import StateUnsupported, cache_kind, recurrent_checkpoints
from engine.backends.llama_state import unsupported_error as state_unsupported_error
from engine.backends.repack import llama_cpp_has_amx, repack_allowed
from engine.backends.threads import MAX_DEFAULT_THREADS, decode_threads, follow_in_torch
from engine.core.chat_render import ControlTokens, chat_pieces
from engine.core.text import plain_chat
from engine.errors import ConfigError, ContextOverflowError, ModelLoadError, ModelNotFoundError
from engine.models.gguf_check import load_notes as gguf_load_notes
from engine.models.memory_errors import is_allocation_failure, model_out_of_memory, out_of_memory, release_frames

DEFAULT_CONTEXT = 4096  # enough for a chat, small enough that the KV cache of a 7B model fits in RAM
MIN_CONTEXT = 16
BATCH_SIZE = 512  # tokens per llama_decode call; longer inputs are split

# -- logging ---------------------------------------------------------------------------
# llama.cpp logs hundreds of lines per load to stderr. We drop them but keep the
# last few errors, which name the cause of a failed load ("unknown model
# architecture", "failed to read header"...) and go into our error messages.

_GGML_LOG_ERROR = 4
_GGML_LOG_CONT = 5  # continuation of the previous message
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_last_level = 0


def _on_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    global _last_level
    if level != _GGML_LOG_CONT:
        _last_level = level
    if _last_level >= _GGML_LOG_ERROR and text:
        _recent_errors.append(text.decode("utf-8", errors="replace").strip())


_REPACK = repack_allowed(llama_cpp_has_amx(llama_cpp.llama_print_system_info().decode(errors="replace")))

# Module-level on purpose: llama.cpp keeps only a C pointer to this ctypes callback;
# if Python collected it, the next log line would jump into freed memory (segfault).
_LOG_CALLBACK = llama_cpp.llama_log_callback(_on_log)
llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


class _ProgressLlama(llama_cpp.Llama):
    """`llama_cpp.Llama` with llama.cpp's load progress callback, which its constructor
    does not take, and with weight repacking off where it would use AMX (engine/backends/
    repack.py: a segmentation fault at the first prompt there): both go into the model
    parameters as the constructor assigns them, before it loads the model. The context gets `sequences`
    ids (the constructor takes no n_seq_max) and, after them, the temporary ids of masked forwards
    (engine/backends/llama_tree.py; none for a model with recurrent layers, which is why they are set
    as the constructor reads the parameters to make the context, after the model loaded), with one
    cache buffer that every id draws from (engine/backends/llama_slots.py says why unified)."""

    def __init__(self, progress: LoadProgress | None, sequences: int = 1, **kwargs) -> None:
        self._on_progress = progress
        self._sequences = sequences
        # Kept on the object: llama.cpp holds only a C pointer to it while it loads.
        self._progress_callback = llama_cpp.llama_progress_callback(self._report)
        super().__init__(**kwargs)

    @property
    def model_params(self):
        return self.__dict__["model_params"]

    @model_params.setter
    def model_params(self, params) -> None:
        if self._on_progress is not None:
            params.progress_callback = self._progress_callback
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = _REPACK
        self.__dict__["model_params"] = params

    @property
    def context_params(self):
        params = self.__dict__["context_params"]
        if "_model" in self.__dict__:  # read to make the context
            room = min(params.n_batch, params.n_ubatch, llama_cpp.llama_max_parallel_sequences()) - self._sequences
            params.n_seq_max = self._sequences + llama_tree.tree_sequences(self._model.model, room)
            params.kv_unified = params.n_seq_max > 1
        return params

    @context_params.setter
    def context_params(self, params) -> None:
        self.__dict__["context_params"] = params

    def _report(self, fraction: float, _user_data: ctypes.c_void_p) -> bool:
        # Called from C: an exception here could not propagate, and False would abort the load.
        try:
            self._on_progress("Reading the weights", min(max(float(fraction), 0.0), 1.0))
        except Exception:  # noqa: BLE001 - a progress display must never stop a load
            pass
        return True


def open_llama(**options) -> llama_cpp.Llama:
    """`llama_cpp.Llama(**options)`, with repacking off where it would crash (as every load here):
    for code that drives llama-cpp-python's own API (the benchmark's peers)."""
    return _ProgressLlama(None, **options)


def _llama_said() -> str:
    """The first error llama.cpp logged since the last clear, as a clause for a message."""
    return f" (llama.cpp: {_recent_errors[0]})" if _recent_errors else ""


# -- small helpers -----------------------------------------------------------------------


def default_threads() -> int:
    """Threads a generation starting now gets when the user chose none: the CPUs this process may
    use (taskset, containers) that no other process keeps busy, capped at MAX_DEFAULT_THREADS
    (engine/backends/threads.py)."""
    return decode_threads(None, cap=MAX_DEFAULT_THREADS)


def _file_type_name(ftype: int) -> str:
    """llama_ftype -> "Q4_1", "F16", "Q4_K_M"... from the LLAMA_FTYPE_* constants."""
    ftype &= ~llama_cpp.LLAMA_FTYPE_GUESSED
    for attr, value in vars(llama_cpp).items():
        if attr.startswith("LLAMA_FTYPE_") and attr != "LLAMA_FTYPE_GUESSED" and value == ftype:
            return attr.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    return f"ftype {ftype}"


def _check_gguf_file(path: str) -> None:
    if not os.path.exists(path):
        raise ModelNotFoundError(f"No model file at {path}. Check the path, or download the model first.")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path} is a folder; the llama.cpp backend needs a single .gguf file.")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"Cannot read {path}: {e.strerror}. Check the file's permissions.") from e
    if magic != b"GGUF":
        raise ModelLoadError(
            f"{path} is not a GGUF file (it does not start with the GGUF signature). "
            "Pick a .gguf model file, or re-download it if the download saved an error page."
        )


class LlamaCppBackend(llama_tree.MaskedForwards, Backend):
    """One GGUF model and one sequence's KV cache in llama.cpp; with slots > 1, the first of several
    sequences on one context (Slots). Trees and other masked blocks run through temporary sequence
    ids (TreeForward, engine/backends/llama_tree.py), for models without recurrent layers."""

    name = "llama.cpp"
    max_slots: int = 1

    def __init__(
        self,
        path: str,
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_gpu_layers: int | str = gpu_layers.AUTO,
        name: str | None = None,
        progress: LoadProgress | None = None,
        slots: int = 1,
    ) -> None:
        """Load `path`.

        n_ctx: tokens the cache holds; default min(trained context, 4096). A larger
            value is clamped to the trained context, past which the model's output
            degrades into noise.
        n_threads: CPU threads for decoding, kept for the backend's life; default: chosen
            again before each generation (`prepare_threads`) from the cores free then.
        n_gpu_layers: layers to offload: "auto" (none: offload is opt-in until it has run on a GPU;
            engine/backends/gpu_layers.py), -1 = all, 0 = none; a CPU-only build ignores it.
        name: display name; default the file name.
        progress: called with (what is happening, fraction of this load done), from
            llama.cpp's own progress callback while the weights are read.
        slots: sequences held at once, each with a context of n_ctx tokens (`open_slot`,
            `forward_batch`); the cache takes slots x n_ctx cells.
        """
        super().__init__()
        self._llm: llama_cpp.Llama | None = None
        path = os.fspath(path)
        if n_ctx is not None and n_ctx < MIN_CONTEXT:
            raise ConfigError(f"The context size must be at least {MIN_CONTEXT} tokens, got {n_ctx}.")
        if n_threads is not None and n_threads < 1:
            raise ConfigError(f"The number of threads must be at least 1, got {n_threads}.")
        if not 1 <= slots <= llama_cpp.llama_max_parallel_sequences():
            raise ConfigError(
                f"llama.cpp holds 1 to {llama_cpp.llama_max_parallel_sequences()} sequences at once, "
                f"not {slots}: choose a --parallel in that range."
            )
        self._gpu_layers_auto = gpu_layers.is_auto(n_gpu_layers)  # the load line says how to opt in
        n_gpu_layers = gpu_layers.resolve_gpu_layers(n_gpu_layers)
        _check_gguf_file(path)

        self._path = path
        self._display_name = name or os.path.basename(path)
        self._fixed_threads = n_threads  # None: follow the free cores (prepare_threads)
        self._n_threads = n_threads or default_threads()
        self._n_gpu_layers = n_gpu_layers
        self._progress = progress
        self.max_slots = slots

        wanted = n_ctx or DEFAULT_CONTEXT
        llm = self._load(wanted)
        trained = llama_cpp.llama_model_n_ctx_train(llm._model.model)
        if 0 < trained < wanted:
            # Rare (old 2K-context models, or a user asking for more than the model
            # knows): reloading is simpler than pre-reading the header, and cheap.
            llm.close()
            wanted = trained
            llm = self._load(wanted)
        self._llm = llm
        self._model = llm._model.model
        self._vocab = llm._model.vocab
        self._ctx = llm._ctx.ctx
        self._mem = llama_cpp.llama_get_memory(self._ctx)

        # llama.cpp may round the context up; we promise only what was asked for, to each sequence.
        self._n_ctx = min(wanted, llama_cpp.llama_n_ctx(self._ctx) // slots)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._row_bytes = self._n_vocab * ctypes.sizeof(ctypes.c_float)
        self._bos = llama_cpp.llama_vocab_bos(self._vocab)
        self._eos = llama_cpp.llama_vocab_eos(self._vocab)
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        # Every id once (~20 ms for 49k ids): llama.cpp's EOG set also includes
        # tokens it recognises by their text (<|im_end|>, <|eot_id|>, FIM tokens...).
        is_eog = map(llama_cpp.llama_vocab_is_eog, repeat(self._vocab), range(self._n_vocab))
        self._eos_ids = frozenset(compress(range(self._n_vocab), is_eog))
        self._chat_formatter = None
        self._rows = Rows(llm.n_batch, slots)
        self._seq_id = 0  # the backend's own sequence; its slots are 1..slots-1
        self._slot_table = SlotTable(self, slots)
        if slots > 1:
            self.capabilities = self.capabilities | {Slots}
        try:  # None for a model whose whole cache is attention
            self._states = recurrent_checkpoints(
                self._model, self._ctx, self._mem, self._decode_plain, self._bos, sequences=slots
            )
        except StateUnsupported as e:
            self.close()
            raise state_unsupported_error(self._display_name, str(e)) from None
        self.replays_on_rollback = self._states is not None
        self._tree_ids = llama_tree.TreeIds(slots, llama_cpp.llama_n_seq_max(self._ctx) - slots)
        if self._states is None and self._tree_ids.count > 0:  # llama_tree.py: why not with recurrent layers
            self.capabilities = self.capabilities | {TreeForward}
        self._info = self._make_info()
        self.load_notes = gguf_load_notes(path, self._display_name)  # a damaged file (zeroed weights) said

    def _load(self, n_ctx: int, flash_attn: bool = True) -> llama_cpp.Llama:
        """The model and a context of `n_ctx` tokens for each of max_slots sequences."""
        _recent_errors.clear()
        try:
            llm = _ProgressLlama(
                self._progress,
                self.max_slots,
                model_path=self._path,
                n_ctx=n_ctx * self.max_slots,
                n_batch=BATCH_SIZE,
                n_ubatch=BATCH_SIZE,
                n_threads=self._n_threads,  # one-token decodes (drafting)
                n_threads_batch=self._n_threads,  # multi-token decodes (prefill, verification)
                n_gpu_layers=self._n_gpu_layers,
                # llama-server's default is "auto" (on wherever the device has it); llama-cpp-python's
                # is off. Measured here: +21% decode speed on 600-2,800-character inputs, +9% on short
                # ones (docs/benchmarks.md). A device without it falls back to plain attention.
                flash_attn=flash_attn,
                logits_all=False,  # we set per-token logits flags ourselves
                # A sliding-window model (Gemma 3, gpt-oss) keeps every token's KV, not only the last
                # window's: a rollback past a token the window had dropped would otherwise lose it.
                swa_full=True,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError, MemoryError) as e:
            failure = e
            if flash_attn and "Failed to create llama_context" in str(e) and not is_allocation_failure(e, ""):
                return self._load(n_ctx, flash_attn=False)  # a context that refuses flash attention
        else:
            _recent_errors.clear()  # what a later failed decode logs is then its own
            return llm
        said = _llama_said()
        if "Failed to create llama_context" in str(failure) or is_allocation_failure(failure, " ".join(_recent_errors)):
            release_frames(failure)  # the half-loaded model, before the estimate reads the file
            device = "cpu" if self._n_gpu_layers == 0 else "cpu and GPU"
            sequences = f" for each of {self.max_slots} sequences" if self.max_slots > 1 else ""
            raise out_of_memory(
                f"load {self._path} with a {n_ctx}-token context{sequences}",
                path=self._path,
                backend="llama.cpp",
                dtype=None,
                device=device,
                n_ctx=n_ctx * self.max_slots,
                first_try="fewer sequences at once (--parallel)" if self.max_slots > 1 else None,
                said=_recent_errors[0] if _recent_errors else "",
            ) from failure
        raise ModelLoadError(
            f"Could not load {self._path}: the file is corrupt or incomplete, or not a model this "
            f"llama.cpp ({llama_cpp.__version__}) can run{said}. Re-download it, or pick another .gguf file."
        ) from failure

    def _make_info(self) -> ModelInfo:
        metadata = self._llm.metadata
        n_layers = llama_cpp.llama_model_n_layer(self._model)
        offloads = gpu_layers.llama_cpp_offloads()
        if self._n_gpu_layers == 0 or not offloads:
            device = "cpu"
        else:
            on_gpu = n_layers if self._n_gpu_layers < 0 else min(self._n_gpu_layers, n_layers)
            device = f"cpu+{on_gpu} gpu layers"
        return ModelInfo(
            name=self._display_name,
            path=self._path,
            backend=self.name,
            architecture=metadata.get("general.architecture", "unknown"),
            n_params=llama_cpp.llama_model_n_params(self._model),
            weight_bytes=llama_cpp.llama_model_size(self._model),
            vocab_size=self._n_vocab,
            n_layers=n_layers,
            context_length=llama_cpp.llama_model_n_ctx_train(self._model),
            dtype=_file_type_name(llama_cpp.llama_model_ftype(self._model)),
            device=device,
            placement=gpu_layers.describe_offload(self._n_gpu_layers, n_layers, offloads, self._gpu_layers_auto),
            forward=cache_kind(self._model, self._states),
        )

    # -- model facts ---------------------------------------------------------------

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._eos_ids

    @property
    def chat_template(self) -> str | None:
        return self._llm.metadata.get("tokenizer.chat_template") if self._llm else None

    @property
    def n_threads(self) -> int:
        """The threads llama.cpp decodes with now (single-token and batch decodes alike)."""
        return self._n_threads

    def prepare_threads(self) -> None:
        """Unless the user fixed the count: set llama.cpp's threads to the cores free now. Its
        workers spin at each barrier, so one thread whose core another process takes stalls the
        rest (engine/backends/threads.py).

        torch's threads follow the same count, fixed or not: each step's logits go through torch
        (softmax, sampling), and a torch OpenMP worker left at its default count spins after
        every such op: with one of two cores busy elsewhere it took a third of the core that
        llama.cpp's one thread decoded on (docs/benchmarks.md, "Measurements behind the code")."""
        if self._llm is None:
            return
        if self._fixed_threads is None:
            n = default_threads()
            if n != self._n_threads:
                llama_cpp.llama_set_n_threads(self._ctx, n, n)
                self._n_threads = n
        follow_in_torch(self._n_threads)

    # -- the cache (hot loop: engine/backends/llama_slots.py) -------------------------------
    # The decode and rollback of one sequence live with the slots, which run the same code on their
    # own sequence ids; what is left here takes the sequence it works on: this backend (sequence 0)
    # or one of its slots, both with `tokens`, `_seq_id`, `_states` and `_replay`.

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        return decode_sequence(self, self, tokens, all_logits)

    def _truncate(self, length: int) -> None:
        truncate_sequence(self, self, length)

    def _replay(self, tokens: list[int], start: int) -> None:
        self._decode_plain(tokens, start, 0)

    def _decode_failed(self, rc: int, sequences: list[tuple[Backend, int]], tokens: list[int]) -> None:
        """Put each (sequence, start) back to its first `start` tokens and raise what `rc` means."""
        # Earlier chunks of this call (and after an abort, part of this one) stay in
        # the cache; drop them so the cache matches each sequence's tokens again.
        for s, start in sequences:
            if s._states is not None:  # the checkpoint saved at `start` by this very call
                s._states.rollback(start, s.tokens, s._replay)
            else:
                llama_cpp.llama_memory_seq_rm(self._mem, s._seq_id, start, -1)
        where = f"after {', '.join(str(start) for _, start in sequences)} cached tokens" + (
            f" of {len(sequences)} sequences" if len(sequences) > 1 else ""
        )
        if rc == 1:
            raise ContextOverflowError(
                f"llama.cpp found no room in the {self._n_ctx}-token context of {self._display_name} for "
                f"{len(tokens)} more tokens {where}. Start a new chat, shorten the prompt, "
                "or load the model with a larger context."
            )
        bad = [t for t in tokens if not 0 <= t < self._n_vocab]
        if rc == -1 and bad:
            raise ValueError(
                f"token ids {bad[:5]} are outside the vocabulary of {self._display_name} (0..{self._n_vocab - 1})"
            )
        if rc == -2 or is_allocation_failure(None, " ".join(_recent_errors)):  # -2: compute buffers failed to allocate
            said = _recent_errors[0] if _recent_errors else f"llama_decode returned {rc}"
            raise model_out_of_memory(
                f"run {self._display_name} on {sequences[0][1] + len(tokens)} tokens"
                if len(sequences) == 1
                else f"run {self._display_name} on {len(tokens)} more tokens {where}",
                self._info,
                self._n_ctx * self.max_slots,
                "a shorter prompt" if len(sequences) == 1 else "fewer sequences at once (--parallel)",
                said=said,
            )
        raise RuntimeError(f"llama_decode failed with code {rc}{_llama_said()} {where}.")

    def _decode_plain(self, tokens: list[int], start: int, seq_id: int = 0) -> None:
        """Decode `tokens` at positions start... of sequence `seq_id` without logits: a replay after a
        restored state."""
        rows = self._rows
        rows.all_in(seq_id)
        for offset in range(0, len(tokens), rows.size):
            m = min(rows.size, len(tokens) - offset)
            rows.tokens[:m] = tokens[offset : offset + m]
            np.add(rows.arange[:m], start + offset, out=rows.pos[:m])
            rows.flags[:m] = 0
            rc = rows.decode(self._ctx, m)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc}{_llama_said()} replaying {len(tokens)} tokens.")

    # -- several sequences (Slots, engine/backends/llama_slots.py) -------------------------

    def open_slot(self) -> LlamaSlot:
        """Sequence 1, 2... of this context as a Backend of its own; SlotsFull when max_slots are open."""
        self._check_open()
        return self._slot_table.open()

    def forward_batch(self, calls: list) -> list[torch.Tensor]:
        """One decode over the rows of this backend and of slots it opened (BatchCall; masked calls
        through sequence ids, engine/backends/llama_tree.py)."""
        return run_batch(self, calls)

    # -- text ----------------------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Ids of `text`, never with a BOS (apply_chat_template adds one if the model wants it).

        llama_tokenize itself, not Llama.tokenize: the latter allocates a buffer of the trained
        context per call (130 us for 8,192 ids), which a chat tokenized piece by piece pays per message.
        """
        self._check_open()
        data = text.encode("utf-8", errors="replace")
        size = len(data) + 2  # at most one id per byte, plus SentencePiece's space prefix
        for _ in range(2):  # a negative return is the size actually needed
            ids = (llama_cpp.llama_token * size)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), ids, size, False, special)
            if n >= 0:
                return ids[:n]
            size = -n
        raise RuntimeError("llama_tokenize kept asking for a larger buffer")

    def detokenize(self, ids: list[int]) -> str:
        # llama_detokenize, not Llama.detokenize: the latter decodes into a 32-byte
        # buffer per token and garbles longer pieces.
        if not ids:
            return ""
        self._check_ids(ids)
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        size = 8 * len(ids) + 16
        for _ in range(2):  # a negative return is the size actually needed
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self._vocab, arr, len(ids), buf, size, False, False)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n
        raise RuntimeError("llama_detokenize kept asking for a larger buffer")

    def token_text(self, token_id: int) -> str:
        self._check_ids([token_id])
        size = 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, size, 0, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n
        raise RuntimeError("llama_token_to_piece kept asking for a larger buffer")

    def _check_open(self) -> None:
        if self._llm is None:  # the C pointers we hold are freed: using them would crash
            raise RuntimeError(f"The llama.cpp backend of {self._display_name} was closed; load the model again.")

    def _check_ids(self, ids: list[int]) -> None:
        self._check_open()
        # llama.cpp looks ids up with std::vector::at: an unknown id would abort the process.
        bad = [t for t in ids if not 0 <= t < self._n_vocab]
        if bad:
            raise ValueError(
                f"token ids {bad[:5]} are outside the vocabulary of {self._display_name} (0..{self._n_vocab - 1})"
            )

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Ids of `messages` rendered with the model's Jinja chat template, ready for the reply.

        Only the template's own markup becomes control tokens: the rendering is tokenized in
        pieces (engine/core/chat_render.py), its control tokens kept as ids and the text between
        them, message contents included, tokenized with control tokens not parsed, so a
        `<|im_start|>` typed into a message stays text. That is also linear in the number of
        messages, where llama.cpp's own parse of control tokens is quadratic in their count. An
        ordinary chat gets the same ids as tokenizing the whole rendering with control tokens parsed.

        A model without a template gets engine.core.text.plain_chat: one "role: content" line
        per message and a final "assistant:", which base models continue reasonably.
        A BOS is added only when the model asks for one and the template did not.
        """
        template = self.chat_template
        if template is None:
            ids = self.tokenize(plain_chat(messages), special=False)
        else:
            ids = self._tokenize_pieces(
                chat_pieces(lambda chat: self._render(template, chat), messages, self._control_tokens)
            )
        if self._add_bos and self._bos >= 0 and (not ids or ids[0] != self._bos):
            ids.insert(0, self._bos)
        return ids

    def _tokenize_pieces(self, pieces: list[str | int]) -> list[int]:
        """Ids of chat_pieces' pieces in order: the control tokens as they are, each text piece
        tokenized with control tokens not parsed.

        llama.cpp spends ~70 us on every stretch of text between control tokens however short (its
        pre-tokenizer's regex is built per stretch), in one call or many; pieces that repeat (the
        "\n" between two turns) are tokenized once per chat.
        """
        ids: list[int] = []
        seen: dict[str, list[int]] = {}
        for piece in pieces:
            if isinstance(piece, int):
                ids.append(piece)
                continue
            if piece not in seen:
                seen[piece] = self.tokenize(piece, special=False)
            ids += seen[piece]
        return ids

    @functools.cached_property
    def _control_tokens(self) -> ControlTokens:
        """The strings tokenize(special=True) turns into one id each and special=False leaves as text:
        llama.cpp's CONTROL and UNKNOWN tokens (user-defined ones are parsed either way). Read once
        (~20 ms for 49k ids), with the lstrip/rstrip attributes its partition honours."""
        self._check_open()
        strings: dict[str, int] = {}
        lstrip, rstrip = set(), set()
        for token in range(self._n_vocab):
            attr = llama_cpp.llama_vocab_get_attr(self._vocab, token)
            if not attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN):
                continue
            try:
                string = llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8")
            except UnicodeDecodeError:  # matched as bytes by llama.cpp, never in text we render
                continue
            if not string or string in strings:  # a duplicate string: the lowest id kept (llama.cpp: unspecified)
                continue
            strings[string] = token
            if attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP:
                lstrip.add(string)
            if attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP:
                rstrip.add(string)
        return ControlTokens(strings, frozenset(lstrip), frozenset(rstrip))

    def _render(self, template: str, messages: list[dict]) -> str:
        import jinja2  # a dependency of llama-cpp-python
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        try:
            if self._chat_formatter is None:  # compiling the template takes a few ms: once
                self._chat_formatter = Jinja2ChatFormatter(
                    template=template,
                    eos_token=self.token_text(self._eos) if self._eos >= 0 else "",
                    bos_token=self.token_text(self._bos) if self._bos >= 0 else "",
                    add_generation_prompt=True,
                )
            return self._chat_formatter(messages=messages).prompt
        except (jinja2.TemplateError, ValueError, TypeError, KeyError) as e:
            # ValueError is what templates raise via raise_exception(), e.g. "roles must alternate".
            raise ConfigError(
                f"The chat template of {self._display_name} could not render this conversation: {e}"
            ) from e

    def close(self) -> None:
        """Free the model; its slots are closed with it."""
        self._slot_table.close_all()
        llm, self._llm = self._llm, None
        self._ctx = self._mem = None
        if llm is not None:
            llm.close()
