"""What the two PyTorch backends share: a loaded transformers model, its tokenizer, its facts.

`NativeBackend` (our forward, engine/backends/hf/native_backend.py) and
`TransformersBackend` (transformers' own, engine/backends/hf/transformers_backend.py)
differ in how they run the model and keep its cache. Everything else is here once:
the model facts, the text side (tokenize, detokenize, token_text, the chat template),
a long prefill cut into slices, what a failed allocation says, and close.
"""

from __future__ import annotations

import abc

import torch

from engine.backends.base import Backend, ModelInfo
from engine.backends.hf.loader import (
    LoadedModel,
    Vocabulary,
    chat_template,
    empty_device_cache,
    is_oom,
    render_chat,
    rotary,
)
from engine.backends.threads import decode_threads, follow_in_torch
from engine.errors import OutOfMemoryError
from engine.models.memory_errors import model_out_of_memory

# Longest slice of a prompt run through the model at once: bounds the memory of a
# long prefill (activations and attention scores grow with the slice length).
PREFILL_CHUNK = 512

# torch's own choice of intra-op threads (the physical cores), the most a generation gets; a user
# who set OMP_NUM_THREADS keeps that count (torch read it), nothing here changes it.
_TORCH_THREADS = torch.get_num_threads()


# Said where the model loads (ModelInfo.placement): nothing in this project has run on Apple's MPS
# (no test, no recorded run); `--device auto` still picks it on a Mac, as the fastest device there.
NOT_RUN_ON_MPS = "on Apple's MPS, not yet run there in this project (--device cpu is the tested path)"


class HFBackend(Backend):
    """A transformers causal LM with a KV cache for one sequence; subclasses run the forward."""

    name = "torch"

    def __init__(self, loaded: LoadedModel, weight_bytes: int | None = None, forward: str = "") -> None:
        """`weight_bytes`: what a token reads when the forward holds the weights in another form
        (int8), instead of the float weights as loaded; `forward`: how the forward runs (ModelInfo)."""
        super().__init__()
        self._model, self._tok = loaded.model, loaded.tokenizer
        self._device, self._dtype = loaded.device, loaded.dtype
        self._n_ctx = loaded.n_ctx
        self._eos = loaded.eos_ids
        config = loaded.config
        self._hidden_size = int(getattr(config, "hidden_size", 0) or 0)
        # Final-norm hidden states (HiddenFeatures, for the subclasses that offer it): of the rows of
        # the last call (last_features) and of every cached position (cached_features, row i for
        # self.tokens[i], grown by doubling like the KV cache).
        self._features: torch.Tensor | None = None
        self._feature_store: torch.Tensor | None = None
        # The inputs of the watched layers (LayerFeatures, native forward only), stored the same way.
        self._watched: tuple[int, ...] = ()
        self._layer_store: torch.Tensor | None = None
        self._vocabulary = Vocabulary(loaded.tokenizer)
        self._template = chat_template(loaded.tokenizer)
        self._info = ModelInfo(
            name=loaded.name,
            path=loaded.path,
            backend="torch",
            architecture=str(getattr(config, "model_type", "unknown")),
            n_params=loaded.n_params,
            weight_bytes=loaded.weight_bytes if weight_bytes is None else weight_bytes,
            vocab_size=loaded.vocab_size,
            n_layers=int(getattr(config, "num_hidden_layers", 0) or 0),
            context_length=loaded.context_length,
            dtype=loaded.dtype_label,
            device=loaded.device,
            placement=NOT_RUN_ON_MPS if loaded.device == "mps" else "",
            forward=forward,
        )

    def prepare_threads(self) -> None:
        """torch's CPU threads for this generation: the free cores, up to torch's own default.
        Its OpenMP workers spin at barriers like llama.cpp's, so a thread that loses its core to
        another process stalls the others. The count is process-wide; every torch backend agrees."""
        follow_in_torch(decode_threads(None, cap=_TORCH_THREADS))

    # -- model facts ---------------------------------------------------------------

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def chat_template(self) -> str | None:
        return self._template

    @property
    def text_config(self):
        """The transformers config of the language model (layer sizes for draft heads)."""
        return self._model.config.get_text_config()

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (n, head_dim) of the target's rotary embedding at `positions` (n,), in
        the usual form (q * cos + rotate_half(q) * sin): draft heads with the target's
        attention shape place their rows as the target would."""
        return rotary(self._model, self._rope_reference(), positions.to(self._device))

    @abc.abstractmethod
    def _rope_reference(self) -> torch.Tensor:
        """A tensor in the dtype and on the device the forward computes in."""

    # -- the cache -----------------------------------------------------------------

    @abc.abstractmethod
    def _run(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        """One model call appending `tokens` to the cache; returns (n or 1, V) logits on the device."""

    @abc.abstractmethod
    def _repair_cache(self) -> None:
        """Put the cache back in line with self.tokens after a failed or interrupted call."""

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("this backend was closed")
        try:
            if len(tokens) <= PREFILL_CHUNK:  # the decode hot path: one call
                logits = self._run(tokens, all_logits)
            else:
                rows = []
                for start in range(0, len(tokens), PREFILL_CHUNK):
                    chunk = tokens[start : start + PREFILL_CHUNK]
                    if all_logits or start + PREFILL_CHUNK >= len(tokens):
                        rows.append(self._run(chunk, all_logits))
                    else:
                        self._run(chunk, False)
                logits = torch.cat(rows) if len(rows) > 1 else rows[0]
        except BaseException as error:
            # A failed or interrupted call may have appended keys and values for
            # some layers; put the cache back in line with self.tokens.
            self._repair_cache()
            if is_oom(error):
                raise self._out_of_memory(
                    f"run {self._info.name} on {len(self.tokens) + len(tokens)} tokens", "a shorter prompt"
                ) from error
            raise
        # Copy out of inference mode: the caller gets an ordinary float32 CPU
        # tensor it may modify in place (inference tensors refuse that).
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    def _out_of_memory(self, doing: str, first_try: str | None = None) -> OutOfMemoryError:
        """The error for a failed allocation while `doing` something with the loaded model;
        `first_try` is the advice that comes first ("a shorter prompt")."""
        return model_out_of_memory(doing, self._info, self._n_ctx, first_try)

    # -- hidden states of what was run and cached (HiddenFeatures) ------------------------------

    def last_features(self) -> torch.Tensor:
        """Final-norm hidden states (n, hidden) of the rows of the last forward (only the last
        row after a forward with all_logits=False)."""
        if self._features is None:
            raise RuntimeError("last_features() needs a forward first")
        return self._features.clone()  # an ordinary tensor, outside inference mode

    def cached_features(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Final-norm hidden states (end - start, hidden) of the cached tokens
        self.tokens[start:end], on the model's device (an ordinary tensor)."""
        end = len(self.tokens) if end is None else end
        if not 0 <= start <= end <= len(self.tokens):
            raise ValueError(f"no features for positions {start}..{end}: the cache holds {len(self.tokens)} tokens")
        if self._feature_store is None:
            return torch.zeros(0, self._hidden_size, dtype=self._feature_dtype(), device=self._device)
        return self._feature_store[start:end].clone()

    def _feature_dtype(self) -> torch.dtype:
        return self._dtype

    def _store_features(self, start: int, features: torch.Tensor) -> None:
        """Rows start.. of the store: `features` (n, hidden), the store doubling (up to n_ctx) when full."""
        self._feature_store = self._stored(self._feature_store, start, features)

    def _stored(self, store: torch.Tensor | None, start: int, rows: torch.Tensor) -> torch.Tensor:
        """`store` with rows start.. set to `rows` (n, width): the same tensor, or one twice as
        long (up to n_ctx) holding its first `start` rows when it was full."""
        end = start + rows.shape[0]
        if store is None or store.shape[0] < end or store.shape[1] != rows.shape[1]:
            doubled = max(256, 2 * (0 if store is None else store.shape[0]))
            grown = rows.new_empty(max(end, min(doubled, self.n_ctx)), rows.shape[1])
            if store is not None and start and store.shape[1] == rows.shape[1]:
                grown[:start] = store[:start]
            store = grown
        store[start:end] = rows
        return store

    # -- the inputs of chosen layers (LayerFeatures, for the subclasses that offer it) ------------

    def cached_layer_features(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """The watched layers' inputs (end - start, len(layers) * hidden) of the cached tokens
        self.tokens[start:end], concatenated in layer order, on the model's device."""
        end = len(self.tokens) if end is None else end
        if not self._watched:
            raise RuntimeError("cached_layer_features() needs watch_layers() first")
        if not 0 <= start <= end <= len(self.tokens):
            raise ValueError(f"no features for positions {start}..{end}: the cache holds {len(self.tokens)} tokens")
        if self._layer_store is None:
            width = len(self._watched) * self._hidden_size
            return torch.zeros(0, width, dtype=self._feature_dtype(), device=self._device)
        return self._layer_store[start:end].clone()

    def _store_layer_features(self, start: int, rows: torch.Tensor | None) -> None:
        if self._watched and rows is not None:
            self._layer_store = self._stored(self._layer_store, start, rows)

    @abc.abstractmethod
    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states (B, T, hidden) of `input_ids` (B, T) run causally
        from position 0, in no-grad mode and without touching the cache (for
        training draft heads on batches of text)."""

    # -- text ----------------------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        # HF tokenizers match special tokens written in the text by default;
        # split_special_tokens=True makes "<|im_start|>" typed by a user plain
        # text. (Added tokens that are not marked special still match.)
        encoded = self._tok(text, add_special_tokens=False, split_special_tokens=not special)
        return list(encoded["input_ids"])

    def detokenize(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as text: 'ĠI' -> ' I', '▁the' -> ' the', '<0x0A>' -> '\\n'."""
        return self._vocabulary.text(token_id)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Ids of the chat, ending where the assistant's reply starts (loader.render_chat)."""
        return render_chat(self._tok, messages, reply=True)

    def _corrupt_hint(self) -> str:
        if self._dtype == torch.float16:
            return " If the file is intact, the model may overflow in float16: load it in bfloat16 or float32."
        return ""

    def close(self) -> None:
        if getattr(self, "_model", None) is None:
            return
        self._model = None
        self._drop_cache()
        self.tokens.clear()
        empty_device_cache(self._device)

    @abc.abstractmethod
    def _drop_cache(self) -> None:
        """Let go of the KV cache and whatever else the forward holds (on close)."""
