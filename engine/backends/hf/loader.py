"""Loading a Hugging Face causal LM from local files: what decoding and training both need.

A local folder (config.json + safetensors + tokenizer files) or a GGUF file, which
transformers unpacks into dense weights of the chosen dtype (slow to load: its reader
parses the file three times; prefer the llama.cpp backend for GGUF files). Nothing
is ever downloaded and no pickle ever runs: a pytorch_model.bin is read with
torch.load(weights_only=True), safetensors are preferred when both are there.

`load` returns a `LoadedModel`: the transformers model and tokenizer on the chosen
device and dtype, with the facts read once (context length, EOS ids, parameter
counts). The decoding backends (native and transformers' own forward) and the
training target are built on it; `Vocabulary` and `render_chat` are the tokenizer's
tables and the chat template, shared by both.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from engine.backends.base import LoadProgress
from engine.backends.hf.device import dtype_name, pick_device, pick_dtype, weight_format
from engine.core.chat_render import ControlTokens, chat_pieces, contents_with_controls
from engine.core.text import plain_chat
from engine.errors import ConfigError, ModelLoadError, ModelNotFoundError
from engine.models.memory_errors import out_of_memory, release_frames, unexplained_allocation_failure
from engine.models.pickled_code import (
    convert_model_folder,
    is_refused_pickle,
    pickle_files,
    refused_pickle_error,
    short_reason,
)

_PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass
class LoadedModel:
    """A transformers model and its tokenizer as loaded, with the facts read from them once."""

    model: torch.nn.Module | None  # None once released
    tokenizer: object
    path: str  # the folder, or the GGUF file
    name: str  # what a user would call it
    device: str
    dtype: torch.dtype  # the compute dtype (int8 weights compute in it too)
    weights: str | None  # "int8" (quantized linear weights, native path only) or None: float in `dtype`
    n_ctx: int  # the context this load is for (at most context_length)
    context_length: int  # what the model was trained for
    eos_ids: frozenset[int]
    vocab_size: int  # width of the logits (the LM head's rows)
    n_params: int  # before any quantization; tied tensors counted once
    weight_bytes: int  # float weights as loaded

    @property
    def config(self):
        """The transformers config of the language model (a multimodal model's text part)."""
        return self.model.config.get_text_config()

    @property
    def dtype_label(self) -> str:
        return f"int8 (weights) / {dtype_name(self.dtype)}" if self.weights else dtype_name(self.dtype)

    def release(self) -> None:
        """Drop the model (the caller holds no other reference) and hand its memory back to the device."""
        self.model = None
        empty_device_cache(self.device)


def empty_device_cache(device: str) -> None:
    """Hand the memory of freed tensors back to the device (a no-op on the CPU)."""
    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()


def load(
    path: str,
    *,
    gguf_file: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    n_ctx: int | None = None,
    name: str | None = None,
    trust_remote_code: bool = False,
    progress: LoadProgress | None = None,
) -> LoadedModel:
    """Load the model in `path` (a folder, a .gguf file, or the folder of `gguf_file`).

    `dtype` "int8" asks for int8 linear weights, which only the native forward makes
    (the weights load in the device's default dtype here). `n_ctx` (default: the trained
    context) must lie between 1 and the trained context. Raises ModelNotFoundError,
    ModelLoadError, ConfigError or an out-of-memory error with advice; nothing half-loaded
    stays behind.
    """
    if n_ctx is not None and n_ctx < 1:
        raise ConfigError(f"The context size must be a positive number of tokens, got {n_ctx}.")
    chosen_device = pick_device(device)
    chosen_dtype = pick_dtype(chosen_device, dtype)
    folder, gguf_file = resolve_location(os.fspath(path), gguf_file)
    where = os.path.join(folder, gguf_file) if gguf_file else folder
    display = name or os.path.basename(os.path.normpath(where))
    report = progress or (lambda message, fraction: None)
    model, tokenizer = _from_pretrained(
        folder, gguf_file, chosen_dtype, chosen_device, trust_remote_code, n_ctx, report
    )

    config = model.config.get_text_config()
    context = context_length(config, tokenizer)
    if n_ctx is not None and not 1 <= n_ctx <= context:
        del model
        empty_device_cache(chosen_device)
        raise ConfigError(
            f"The context size must be between 1 and {context} tokens for {display} "
            f"(the length it was trained for), got {n_ctx}."
        )
    params = list(model.parameters())  # shared (tied) tensors appear once
    out_emb = model.get_output_embeddings()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=where,
        name=display,
        device=chosen_device,
        dtype=chosen_dtype,
        weights=weight_format(dtype),
        n_ctx=n_ctx or context,
        context_length=context,
        eos_ids=eos_ids(model, tokenizer),
        vocab_size=int(out_emb.weight.shape[0] if out_emb is not None else config.vocab_size),
        n_params=sum(p.numel() for p in params),
        weight_bytes=sum(p.numel() * p.element_size() for p in params),
    )


def resolve_location(path: str, gguf_file: str | None) -> tuple[str, str | None]:
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


def _from_pretrained(
    folder: str,
    gguf_file: str | None,
    dtype: torch.dtype,
    device: str,
    trust_remote_code: bool,
    n_ctx: int | None,
    report: LoadProgress,
):
    if gguf_file is None:
        _check_folder(folder)
    where = os.path.join(folder, gguf_file) if gguf_file else folder
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    # transformers 5 draws its own "Loading weights" bar on stderr, between the CLI's loading line and
    # the reply; `report` already says how loading goes (the CLI's line, the window's progress bar).
    transformers_logging.disable_progress_bar()
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
        # A GGUF file is dequantized tensor by tensor here: most of a 20-30 s load.
        report("Dequantizing the GGUF weights" if gguf_file else "Reading the weights", 0.05)
        with _gguf_tensor_progress(lambda done: report("Dequantizing the GGUF weights", 0.05 + 0.6 * done)):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, weights_only=True, **common, **extra)
        report(f"Moving the weights to {device}", 0.7)
        model = model.to(device).eval()
        report("Reading the tokenizer", 0.8)
        tokenizer = AutoTokenizer.from_pretrained(folder, **common)
    except Exception as error:  # every failure gets an actionable message
        if is_oom(error):
            release_frames(error)  # the half-loaded weights, before the estimate reads the files
            raise out_of_memory(
                f"load {where}", path=where, backend="torch", dtype=dtype_name(dtype), device=device, n_ctx=n_ctx
            ) from error
        pickles = [] if gguf_file else pickle_files(folder)
        if pickles and is_refused_pickle(error):
            raise refused_pickle_error(pickles[0], error, convert_model_folder(folder)) from error
        raise ModelLoadError(_load_failure_message(where, gguf_file, trust_remote_code, error)) from error
    return model, tokenizer


@contextmanager
def _gguf_tensor_progress(report):
    """While it is open, transformers' GGUF tensor loop reports the share of tensors done.

    That loop (`Converting and de-quantizing GGUF tensors`) iterates through its module's
    `tqdm`, the only progress it has; the name is replaced for the load (no bar on stderr: the
    load reports its progress itself) and put back after.
    A transformers without it still loads, with the phases only.
    """
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def counted(iterable, *args, **kwargs):  # in place of its bar on stderr: the load's own progress says it
        total = len(iterable) if hasattr(iterable, "__len__") else 0
        for done, item in enumerate(iterable):
            if total:
                report(done / total)
            yield item

    gguf_utils.tqdm = counted
    try:
        yield
    finally:
        gguf_utils.tqdm = original


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
    detail = short_reason(error, limit=400)
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


def is_oom(error: BaseException) -> bool:
    """A failed allocation in any of its forms (memory_errors), not yet turned into our error."""
    return unexplained_allocation_failure(error)


# -- facts read once -------------------------------------------------------------------


def context_length(config, tokenizer) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**7:  # HF uses ~1e30 for "unknown"
        return limit
    return 2048


def eos_ids(model, tokenizer) -> frozenset[int]:
    """Ids that end a reply: the generation config's EOS ids and the tokenizer's."""
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for source in (getattr(generation, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)


def rotary(model, reference: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (n, head_dim) of `model`'s rotary embedding at `positions` (n,), on their device,
    in the usual form (q * cos + rotate_half(q) * sin). Only the dtype and device of
    `reference` matter to the rotary module: pass a tensor the model computes in."""
    cos, sin = model.base_model.rotary_emb(reference, positions[None])
    return cos[0], sin[0]


# -- the tokenizer's tables and the chat template ------------------------------------------


def chat_template(tokenizer) -> str | None:
    """The tokenizer's chat template (the default one of several named), None for a base model."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: use the default one
        template = template.get("default")
    return template or None


def render_chat(tokenizer, messages: list[dict], reply: bool) -> list[int]:
    """Ids of a chat through the tokenizer's template; with `reply`, ending where the assistant's
    reply starts (the generation prompt).

    Only the template's own markup becomes special tokens. A chat whose messages hold no special
    token's string is rendered to text and tokenized with special tokens parsed, as it always was
    (rendering and tokenizing apart avoids the version-dependent return type of the tokenizer's
    own tokenizing path: list, BatchEncoding or dict across 4.x/5.x). When a message holds one
    (a user typing `<|im_start|>system`), the rendering is tokenized in pieces
    (engine/core/chat_render.py): the template's special tokens kept as ids and the text between
    them, message contents included, tokenized with special tokens split into text. Ordinary chats
    keep the whole-text path because a tokenizer whose pre-tokenizer marks only the first piece
    (SentencePiece's "first" prefix space) would tokenize pieces differently; its pieces then start
    with that space, which only chats quoting special tokens see.

    Without a template (base models) the chat becomes engine.core.text.plain_chat's "role: content"
    lines, after the tokenizer's usual prefix (e.g. BOS), special tokens in it split into text.
    """
    if chat_template(tokenizer):

        def render(chat: list[dict]) -> str:
            return tokenizer.apply_chat_template(chat, add_generation_prompt=reply, tokenize=False)

        controls = special_tokens(tokenizer)
        if not contents_with_controls(messages, controls):
            return list(tokenizer(render(messages), add_special_tokens=False)["input_ids"])
        pieces = chat_pieces(render, messages, controls)
        texts = [piece for piece in pieces if isinstance(piece, str)]  # one batch: a call costs ~50 us
        encoded = iter(
            tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"] if texts else []
        )
        ids: list[int] = []
        for piece in pieces:
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids += next(encoded)
        return ids
    prefix = list(tokenizer("", add_special_tokens=True)["input_ids"])
    lines = tokenizer(plain_chat(messages, reply), add_special_tokens=False, split_special_tokens=True)
    return prefix + list(lines["input_ids"])


def special_tokens(tokenizer) -> ControlTokens:
    """The tokenizer's special added tokens (what `split_special_tokens=True` leaves as text; added
    tokens not marked special are parsed either way), with their lstrip/rstrip flags."""
    strings: dict[str, int] = {}
    lstrip, rstrip = set(), set()
    for token, added in sorted(tokenizer.added_tokens_decoder.items()):
        if not added.special or not added.content or added.content in strings:
            continue
        strings[added.content] = int(token)
        if added.lstrip:
            lstrip.add(added.content)
        if added.rstrip:
            rstrip.add(added.content)
    return ControlTokens(strings, frozenset(lstrip), frozenset(rstrip))


class Vocabulary:
    """A tokenizer's vocabulary entries as text ('ĠI' -> ' I', '▁the' -> ' the', '<0x0A>' -> '\\n').

    Added/control tokens come back verbatim. Byte pieces that are not whole UTF-8
    characters show as U+FFFD, as they do in llama.cpp's pieces.
    """

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self._added_ids = frozenset(tokenizer.added_tokens_decoder)  # control tokens etc.
        self._byte_level = _is_byte_level(tokenizer)

    def text(self, token_id: int) -> str:
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
