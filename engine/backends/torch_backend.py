"""A Hugging Face transformers model as a `Backend`.

It loads a local folder (config.json + safetensors + tokenizer files) or a GGUF
file, which transformers unpacks into dense weights of the chosen dtype (slow
to load: its reader parses the file three times; prefer the llama.cpp backend
for GGUF files), keeps one `DynamicCache` for one sequence,
and rolls that cache back with `crop` so that rejected draft tokens cost nothing
to undo. Everything runs offline: nothing is ever downloaded.

Written against transformers 5.x, where the model's cache argument is named
`cache` (5.24; `past_key_values` before, still accepted until 5.40), positions
follow from the cache length (there is no `cache_position`), and
`DynamicCache.crop` only takes a negative number of tokens to remove.
"""

from __future__ import annotations

import inspect
import os
import re

import torch

from ..device import dtype_name, pick_device, pick_dtype
from ..errors import ConfigError, ModelLoadError, ModelNotFoundError, OutOfMemoryError
from .base import Backend, ModelInfo

# Longest slice of a prompt run through the model at once: bounds the memory of a
# long prefill (activations and attention scores grow with the slice length).
PREFILL_CHUNK = 512

_PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TorchBackend(Backend):
    """One transformers causal LM with a KV cache for one sequence."""

    name = "torch"

    def __init__(
        self,
        path: str,
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        n_ctx: int | None = None,
        name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        if n_ctx is not None and n_ctx < 1:
            raise ConfigError(f"The context size must be a positive number of tokens, got {n_ctx}.")
        self._device = pick_device(device)
        self._dtype = pick_dtype(self._device, dtype)
        folder, gguf_file = _resolve_location(os.fspath(path), gguf_file)
        self._path = os.path.join(folder, gguf_file) if gguf_file else folder
        display = name or os.path.basename(os.path.normpath(self._path))

        self._model, self._tok = _load(folder, gguf_file, self._dtype, self._device, trust_remote_code)
        config = self._model.config.get_text_config()

        # Facts the UI and the decode loop ask for, computed once.
        params = list(self._model.parameters())  # shared (tied) tensors appear once
        out_emb = self._model.get_output_embeddings()
        vocab = out_emb.weight.shape[0] if out_emb is not None else config.vocab_size
        context = _context_length(config, self._tok)
        self._info = ModelInfo(
            name=display,
            path=self._path,
            backend="torch",
            architecture=str(getattr(config, "model_type", "unknown")),
            n_params=sum(p.numel() for p in params),
            weight_bytes=sum(p.numel() * p.element_size() for p in params),
            vocab_size=int(vocab),
            n_layers=int(getattr(config, "num_hidden_layers", 0) or 0),
            context_length=context,
            dtype=dtype_name(self._dtype),
            device=self._device,
        )
        if n_ctx is not None and not 1 <= n_ctx <= context:
            self.close()
            raise ConfigError(
                f"The context size must be between 1 and {context} tokens for {display} "
                f"(the length it was trained for), got {n_ctx}."
            )
        self._n_ctx = n_ctx or context
        self._eos = _eos_ids(self._model, self._tok)
        self._added_ids = frozenset(self._tok.added_tokens_decoder)  # control tokens etc.
        self._byte_level = _is_byte_level(self._tok)

        # The model's forward names its cache argument differently across
        # versions and in remote code; look it up once, not on every step.
        params_of_forward = inspect.signature(self._model.forward).parameters
        self._cache_kw = "cache" if "cache" in params_of_forward else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params_of_forward
        self._cache, self._exact_crop = self._new_cache()

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
    def chat_template(self) -> str | None:
        template = getattr(self._tok, "chat_template", None)
        if isinstance(template, dict):  # several named templates: use the default one
            template = template.get("default")
        return template or None

    # -- the cache -----------------------------------------------------------------

    def _new_cache(self):
        from transformers import DynamicCache, cache_utils

        cache = DynamicCache(config=self._model.config)
        # `crop` is exact for full-attention layers, and for sliding-window
        # layers whose window is longer than the whole context (they then never
        # drop anything). Otherwise a sliding layer has forgotten what left its
        # window, and a recurrent (linear-attention) layer keeps no per-token
        # state at all, so a rollback there rebuilds the cache instead.
        full = tuple(getattr(cache_utils, n) for n in ("DynamicLayer", "DummyLayer") if hasattr(cache_utils, n))
        sliding = getattr(cache_utils, "DynamicSlidingWindowLayer", None)

        def exact(layer) -> bool:
            if type(layer) in full:
                return True
            return type(layer) is sliding and getattr(layer, "sliding_window", 0) > self._n_ctx

        return cache, all(exact(layer) for layer in cache.layers)

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
                    last = start + PREFILL_CHUNK >= len(tokens)
                    if all_logits or last:
                        rows.append(self._run(chunk, all_logits))
                    else:
                        self._run(chunk, False)
                logits = torch.cat(rows) if len(rows) > 1 else rows[0]
        except BaseException as error:
            # A failed or interrupted call may have appended keys and values for
            # some layers; put the cache back in line with self.tokens.
            self._repair_cache()
            if _is_oom(error):
                raise OutOfMemoryError(
                    f"{self._info.device} ran out of memory running {self._info.name} on "
                    f"{len(self.tokens) + len(tokens)} tokens. Use a shorter prompt or context, "
                    "a smaller dtype (bfloat16/float16) or a smaller model."
                ) from error
            raise
        # Copy out of inference mode: the caller gets an ordinary float32 CPU
        # tensor it may modify in place (inference tensors refuse that).
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    def _run(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        """One model call appending `tokens` to the cache; returns (n or 1, V) logits."""
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self._device)
        kwargs = {self._cache_kw: self._cache, "use_cache": True}
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 0 if all_logits else 1  # 0 = every position
        with torch.inference_mode():
            logits = self._model(input_ids=input_ids, **kwargs).logits[0]
        return logits if all_logits else logits[-1:]

    def _truncate(self, length: int) -> None:
        if length == 0:
            self._cache.reset()
        elif self._exact_crop:
            with torch.inference_mode():
                self._cache.crop(-(len(self.tokens) - length))
        else:
            self._rebuild(self.tokens[:length])

    def _rebuild(self, tokens: list[int]) -> None:
        """Recompute the cache for `tokens` from scratch (the slow but always exact way)."""
        self._cache, _ = self._new_cache()
        for start in range(0, len(tokens), PREFILL_CHUNK):
            self._run(tokens[start : start + PREFILL_CHUNK], False)

    def _repair_cache(self) -> None:
        keep = len(self.tokens)
        if not self._exact_crop:
            try:
                self._rebuild(self.tokens)
            except BaseException:  # noqa: BLE001 - start empty; the caller re-raises the first error
                self._cache, _ = self._new_cache()
                self.tokens.clear()
            return
        with torch.inference_mode():
            for layer in self._cache.layers:
                keys = getattr(layer, "keys", None)
                if keys is not None and keys.numel() and keys.shape[-2] > keep:
                    layer.crop(-(keys.shape[-2] - keep))

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
        """The vocabulary entry as text: 'ĠI' -> ' I', '▁the' -> ' the', '<0x0A>' -> '\\n'.

        Added/control tokens come back verbatim. Byte pieces that are not whole
        UTF-8 characters show as U+FFFD, as they do in llama.cpp's pieces.
        """
        piece = self._tok.convert_ids_to_tokens(int(token_id))
        if piece is None:
            return ""
        if int(token_id) in self._added_ids:
            return piece
        if self._byte_level:
            raw = bytes(_UNICODE_TO_BYTE.get(ch, 0x3F) for ch in piece)
            return raw.decode("utf-8", errors="replace")
        byte = _SPM_BYTE.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)]).decode("utf-8", errors="replace")
        return piece.replace("\u2581", " ")  # SentencePiece marks spaces with ▁

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Ids of the chat, ending where the assistant's reply starts.

        The template is rendered to text and then tokenized with control tokens
        parsed: this avoids the version-dependent return type of the tokenizer's
        own tokenizing path (list, BatchEncoding or dict across 4.x/5.x).
        Without a template (base models) the chat becomes "role: content" lines
        ending in "assistant:", after the tokenizer's usual prefix (e.g. BOS).
        """
        if self.chat_template:
            text = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return self.tokenize(text, special=True)
        prefix = list(self._tok("", add_special_tokens=True)["input_ids"])
        lines = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return prefix + self.tokenize(lines + "assistant:")

    def close(self) -> None:
        if getattr(self, "_model", None) is None:
            return
        device = self._device
        self._model = None
        self._cache = None
        self.tokens.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
        elif device == "mps":
            torch.mps.empty_cache()


# -- loading -------------------------------------------------------------------------


def _resolve_location(path: str, gguf_file: str | None) -> tuple[str, str | None]:
    """(folder, gguf basename or None); raises ModelNotFoundError for missing paths."""
    if gguf_file is None and path.lower().endswith(".gguf"):
        path, gguf_file = os.path.split(path)  # a .gguf path on its own is fine too
    if gguf_file is not None:
        full = os.path.join(path, gguf_file)  # an absolute gguf_file wins over path
        if not os.path.isfile(full):
            raise ModelNotFoundError(f"GGUF file not found: {full}. Check the path and file name.")
        folder, gguf_file = os.path.split(os.path.abspath(full))
        return folder, gguf_file
    if not os.path.exists(path):
        raise ModelNotFoundError(
            f"Model folder not found: {path}. Give the path of a local folder holding "
            "config.json, the weights (*.safetensors) and the tokenizer files."
        )
    if not os.path.isdir(path):
        raise ModelLoadError(
            f"{path} is a file, not a model folder. Give the folder holding config.json "
            "and the weights, or a .gguf file."
        )
    return os.path.abspath(path), None


def _check_folder(folder: str) -> None:
    """Refuse folders transformers would fail on with a confusing message."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ModelLoadError(
            f"{folder} has no config.json, so it is not a Hugging Face model folder. "
            "Point at the folder that holds config.json, the *.safetensors weights and the "
            "tokenizer files (download it whole), or at a .gguf file."
        )
    names = os.listdir(folder)
    has_safetensors = any(n.endswith(".safetensors") for n in names)
    has_pickle = any(n in _PICKLE_FILES or re.fullmatch(r"pytorch_model-.*\.bin", n) for n in names)
    if not has_safetensors and not has_pickle:
        raise ModelLoadError(
            f"{folder} has a config.json but no weights (no *.safetensors file). "
            "Download the model's weight files into that folder."
        )


def _load(folder: str, gguf_file: str | None, dtype: torch.dtype, device: str, trust_remote_code: bool):
    if gguf_file is None:
        _check_folder(folder)
    where = os.path.join(folder, gguf_file) if gguf_file else folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    extra = {}
    if gguf_file:
        common["gguf_file"] = gguf_file
        extra = _dense_gguf_options()
    try:
        # weights_only=True: a pytorch_model.bin (pickle) is read with
        # torch.load(weights_only=True), which runs no code from the file;
        # transformers 5 also refuses that path on torch < 2.6 (CVE-2025-32434).
        # Safetensors files are preferred whenever both are present.
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, weights_only=True, **common, **extra)
        model = model.to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, **common)
    except (torch.OutOfMemoryError, MemoryError) as error:
        raise OutOfMemoryError(
            f"Not enough memory on {device} to load {where} in {dtype_name(dtype)}. "
            "Try a smaller dtype (bfloat16 or float16), a smaller model, or close other programs."
        ) from error
    except Exception as error:  # every failure gets an actionable message
        if _is_oom(error):
            raise OutOfMemoryError(
                f"Not enough memory on {device} to load {where}. Try a smaller dtype or model."
            ) from error
        raise ModelLoadError(_load_failure_message(where, gguf_file, trust_remote_code, error)) from error
    return model, tokenizer


def _dense_gguf_options() -> dict:
    """Ask transformers to unpack GGUF weights into plain dense tensors.

    Recent 5.x can keep GGUF blocks packed, but only with the `kernels` package
    and a kernel downloaded from the Hub, which an offline app never has; it
    then falls back to dense anyway, after a warning about float32 that does not
    apply. Asking for dense up front is what happens in practice, said plainly.
    """
    try:
        from transformers import GgufConfig
    except ImportError:  # older 5.x: dense is the only path
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _load_failure_message(where: str, gguf_file: str | None, trust_remote_code: bool, error: Exception) -> str:
    detail = f"{type(error).__name__}: {error}".strip()
    if len(detail) > 400:
        detail = detail[:400] + "..."
    hint = (
        "The GGUF file may be corrupt, or use an architecture or quantization transformers cannot "
        "dequantize; try the llama.cpp backend for it."
        if gguf_file
        else "The files may be incomplete or corrupt (download them again), or the architecture may "
        "need a newer transformers"
        + ("" if trust_remote_code else " or trust_remote_code (only for code you trust)")
        + "."
    )
    return f"Could not load the model in {where}. {hint} ({detail})"


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    # MPS reports running out of memory as a plain RuntimeError.
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _context_length(config, tokenizer) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**7:  # HF uses ~1e30 for "unknown"
        return limit
    return 2048


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for source in (getattr(generation, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)


def _is_byte_level(tokenizer) -> bool:
    """Whether vocabulary entries are GPT-2 style byte-level strings ('Ġ' for a space)."""
    from tokenizers.decoders import ByteLevel

    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and isinstance(backend.decoder, ByteLevel)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


_UNICODE_TO_BYTE = {ch: b for b, ch in _bytes_to_unicode().items()}
