"""What a model is, read from its files without loading its weights.

`read_metadata` gives the shapes, parameter count, vocabulary, special tokens and
chat template of a GGUF file or a Hugging Face folder. It reads headers only: a
GGUF's key-value section and tensor table, a HF folder's JSON files and the JSON
header at the start of each .safetensors file. Weights are never read and
pickles (.bin) are never opened.

Vocabularies are comparable across the two formats: `vocab[i]` is the raw
vocabulary entry of id i as the tokenizer stores it ("Ġthe" for byte-level BPE,
"▁the" and "<0x0A>" for SentencePiece, "<|im_end|>" for added tokens), which is
what convert_hf_to_gguf copies into a GGUF. Ids the HF tokenizer leaves unused
are filled with "[PAD<id>]", as convert_hf_to_gguf does, so a GGUF and the folder
it was converted from give the same tuple.

The GGUF header is parsed here rather than with gguf.GGUFReader: the reader
builds a numpy view per vocabulary string and takes ~2 s on the 98 MB default
model, while this sequential parse takes a small fraction of that.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from engine.errors import ModelLoadError, ModelNotFoundError
from engine.models.model_ref import ModelRef


@dataclass(frozen=True)
class ModelMeta:
    ref: ModelRef
    architecture: str  # "llama", "qwen2", ...
    n_params: int  # weights, embeddings included, tied embeddings once
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    context_length: int  # what the model was trained for; 0 when the files do not say
    vocab_size: int  # width of the logits; more than len(vocab) when the output layer is padded
    vocab: tuple[str, ...] = field(repr=False)  # vocabulary entry of each id (see the module doc)
    bos_id: int | None
    eos_ids: tuple[int, ...]  # ids that end a reply, the main EOS first
    special_tokens: dict[str, int] = field(hash=False)  # "bos", "eos", "unk", "pad", "eot"... -> id
    chat_template: str | None = field(repr=False)
    dtype: str  # "Q4_1", "bfloat16", ...: how the weights are stored
    weight_bytes: int  # bytes the weights take as stored (GGUF tensors, safetensors data)
    # Layers that keep a KV cache entry per token: all of a transformer's, the attention layers of
    # a hybrid (Qwen3.5, LFM2, Nemotron-H...), none of a recurrent model's. None: every layer.
    kv_layers: int | None = None

    def summary(self) -> dict:
        """JSON-ready facts, without the vocabulary and the template text."""
        facts = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_IN_SUMMARY}
        ref = self.ref
        return {
            "name": ref.name,
            "path": ref.path,
            "format": ref.kind,
            "source": ref.source,
            "size_bytes": ref.size_bytes,
            **facts,
            "eos_ids": list(self.eos_ids),
            "special_tokens": dict(self.special_tokens),
            "n_tokens": len(self.vocab),
            "has_chat_template": self.chat_template is not None,
        }

    def to_dict(self) -> dict:
        """Every fact, the vocabulary and the template included, as plain JSON (`from_dict` reads it back)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            ref=self.ref.to_dict(),
            vocab=list(self.vocab),
            eos_ids=list(self.eos_ids),
            special_tokens=dict(self.special_tokens),
        )
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ModelMeta:
        """The ModelMeta `to_dict` wrote; fields a newer engine added are left out."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values.update(
            ref=ModelRef.from_dict(data["ref"]),
            vocab=tuple(data["vocab"]),
            eos_ids=tuple(int(i) for i in data["eos_ids"]),
            special_tokens={str(k): int(v) for k, v in data["special_tokens"].items()},
        )
        return cls(**values)


_NOT_IN_SUMMARY = ("ref", "vocab", "chat_template")


# -- entry point and cache -----------------------------------------------------------

_CACHE: OrderedDict[tuple, ModelMeta] = OrderedDict()
_CACHE_SIZE = 8  # a vocabulary is a few MB; a session looks at a handful of models
_LOCK = threading.Lock()


def read_metadata(ref: ModelRef) -> ModelMeta:
    """Facts about a resolved model; cached per file (or folder) and modification time."""
    key = _cache_key(ref)
    with _LOCK:
        meta = _CACHE.get(key)
        if meta is not None:
            _CACHE.move_to_end(key)
    if meta is None:
        try:
            meta = _read_gguf(ref) if ref.kind == "gguf" else _read_hf(ref)
        except (ModelLoadError, ModelNotFoundError):
            raise
        except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error, OverflowError) as e:
            what = "GGUF file" if ref.kind == "gguf" else "model folder"
            raise ModelLoadError(
                f"Cannot read the {what} {ref.path}: it looks corrupt or incomplete ({type(e).__name__}: {e}). "
                "Download or convert it again."
            ) from e
        with _LOCK:
            _CACHE[key] = meta
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return meta if meta.ref == ref else replace(meta, ref=ref)


def _cache_key(ref: ModelRef) -> tuple:
    path = Path(ref.path)
    try:
        if ref.kind == "gguf":
            st = path.stat()
            return (ref.kind, str(path), st.st_mtime_ns, st.st_size)
        # The folder's mtime changes when files come and go, a file's when it is edited.
        stamps = [path.stat().st_mtime_ns]
        for entry in os.scandir(path):
            try:
                stamps.append(entry.stat().st_mtime_ns)
            except OSError:
                pass  # a dangling link; _read_hf reports it if it matters
        return (ref.kind, str(path), max(stamps))
    except OSError as e:
        raise ModelNotFoundError(f"{ref.path} is no longer there ({e.strerror}). Pick the model again.") from e


# -- GGUF ----------------------------------------------------------------------------

# GGUF value types (gguf.GGUFValueType) -> struct format of one scalar.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _GGUFParser:
    """Sequential reader of a GGUF header: key-values, then the tensor table."""

    def __init__(self, buf) -> None:
        self.buf, self.pos, self.endian = buf, 0, "<"

    def unpack(self, fmt: str) -> tuple:
        s = struct.Struct(self.endian + fmt)
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values

    def tensor_table(self, n_tensors: int) -> list[tuple[str, list[int], int, int]]:
        """The tensor infos after the key-values: (name, shape, GGML type, offset in the data) each."""
        tensors = []
        for _ in range(n_tensors):
            name = self.strings(1)[0]
            (n_dims,) = self.unpack("I")
            shape = list(self.unpack(f"{n_dims}Q"))
            ttype, offset = self.unpack("IQ")
            tensors.append((name, shape, ttype, offset))
        return tensors

    def strings(self, n: int) -> list[str]:
        if n * 8 > len(self.buf) - self.pos:
            raise ValueError(f"an array of {n} strings cannot fit in the file")
        read_len, buf, pos, out = struct.Struct(self.endian + "Q").unpack_from, self.buf, self.pos, []
        for _ in range(n):  # the hot loop: ~100k vocabulary and merge strings
            (length,) = read_len(buf, pos)
            out.append(buf[pos + 8 : pos + 8 + length].decode("utf-8", errors="replace"))
            pos += 8 + length
        if pos > len(buf):
            raise ValueError("a string runs past the end of the file")
        self.pos = pos
        return out

    def value(self, vtype: int):
        if vtype == _STRING:
            return self.strings(1)[0]
        if vtype == _ARRAY:
            subtype, n = self.unpack("IQ")
            if subtype == _STRING:
                return self.strings(n)
            if subtype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(n)]
            return list(self.unpack(f"{n}{_SCALARS[subtype]}"))
        return self.unpack(_SCALARS[vtype])[0]


def _parse_gguf(path: str) -> tuple[dict, list[tuple[str, list[int], int, int]], int, int]:
    """(key-values, tensors as (name, GGML shape, type, offset), data start, file size) of a GGUF."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        p = _GGUFParser(buf)
        n_tensors, n_kv = _read_preamble(p, path)
        kv = {}
        for _ in range(n_kv):
            key = p.strings(1)[0]
            (vtype,) = p.unpack("I")
            kv[key] = p.value(vtype)
        tensors = p.tensor_table(n_tensors)
        align = int(kv.get("general.alignment", 32)) or 32
        data_start = -(-p.pos // align) * align
        return kv, tensors, data_start, len(buf)


def _read_preamble(p: _GGUFParser, path: str) -> tuple[int, int]:
    """Check the magic and version; (number of tensors, number of key-values)."""
    magic, version = p.unpack("4sI")
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file. Pass a .gguf model file.")
    if version & 0xFFFF == 0:  # a big-endian file reads as a huge version number
        p.endian = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version < 2:
        raise ModelLoadError(f"{path} is GGUF version {version}, which is too old. Convert the model again.")
    return p.unpack("QQ")


def _key_values(path: str):
    """(key, value) of a GGUF header's key-values in file order; a generator, so a caller that
    stops early reads only the pages it needs."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        p = _GGUFParser(buf)
        _, n_kv = _read_preamble(p, path)
        for _ in range(n_kv):
            key = p.strings(1)[0]
            (vtype,) = p.unpack("I")
            yield key, p.value(vtype)


_UNREADABLE = (OSError, ValueError, KeyError, struct.error, ModelLoadError)


def quantization(path: str) -> str:
    """A GGUF's quantization as llama-quantize names it ("Q4_K_M", "Q8_0", "F16"); "" when it does not say.

    For model lists: it reads key-values only up to general.file_type, which
    converters write before the vocabulary, so it costs a few pages of the file.
    """
    try:
        for key, value in _key_values(path):
            if key == "general.file_type":
                return file_type_name(value)
    except _UNREADABLE:
        pass  # unreadable or not a GGUF: listing it is someone else's concern
    return ""


def gguf_values(path: str, prefix: str) -> dict:
    """The key-values of a GGUF whose keys start with `prefix` ({} when the file cannot be read)."""
    try:
        return {key: value for key, value in _key_values(path) if key.startswith(prefix)}
    except _UNREADABLE:
        return {}


def file_type_name(file_type) -> str:
    """llama.cpp's name of a general.file_type value (gguf.LlamaFileType); "" for an unknown one."""
    from gguf import LlamaFileType

    try:  # llama.cpp ORs 1024 (LLAMA_FTYPE_GUESSED) into a type it guessed from the tensors
        member = LlamaFileType(int(file_type) & ~LlamaFileType.GUESSED)
    except (TypeError, ValueError):
        return ""
    return member.name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _read_gguf(ref: ModelRef) -> ModelMeta:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # constants only

    kv, tensors, data_start, file_size = _parse_gguf(ref.path)
    n_params = weight_bytes = data_end = 0
    bytes_by_type: Counter[str] = Counter()
    for name, shape, ttype, offset in tensors:
        try:
            qtype = GGMLQuantizationType(ttype)
        except ValueError:
            raise ModelLoadError(
                f"{ref.path} stores tensor {name} as GGML type {ttype}, which the installed gguf "
                "package does not know. Update it (`pip install -U gguf`) or use another quantization."
            ) from None
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        n = math.prod(shape)
        nbytes = n // block * block_bytes
        n_params += n
        weight_bytes += nbytes
        bytes_by_type[qtype.name] += nbytes
        data_end = max(data_end, data_start + offset + nbytes)
    if data_end > file_size:
        raise ModelLoadError(
            f"{ref.path} is truncated: its tensors need {data_end} bytes but the file has {file_size}. "
            "The download or conversion did not finish; get the file again."
        )

    arch = str(kv.get("general.architecture", "unknown"))

    def hp(key: str, default=0) -> int:  # a hyperparameter; per-layer arrays give their largest value
        value = kv.get(f"{arch}.{key}", default)
        return int(max(value, default=default) if isinstance(value, list) else value)

    def kv_layers() -> int | None:
        """A hybrid's attention layers: llama.cpp writes KV heads per layer (0 on a recurrent
        one), or for the Qwen3-Next family one full-attention layer per `full_attention_interval`.
        Called after n_heads is read."""
        if not n_heads:  # a recurrent model (Mamba, RWKV): no attention at all
            return 0
        per_layer = kv.get(f"{arch}.attention.head_count_kv")
        if isinstance(per_layer, list):
            return sum(1 for n in per_layer if n)
        interval = kv.get(f"{arch}.full_attention_interval")
        if isinstance(interval, int) and interval > 1:
            return hp("block_count") // interval
        return None

    n_heads = hp("attention.head_count")
    hidden = hp("embedding_length")
    tokens = tuple(kv.get("tokenizer.ggml.tokens") or ())
    if not tokens:
        raise ModelLoadError(f"{ref.path} has no vocabulary (tokenizer.ggml.tokens), so it cannot generate text.")
    embd = next((shape for name, shape, *_ in tensors if name == "token_embd.weight"), [])
    embd_rows = embd[1] if len(embd) > 1 else 0  # GGML order: (n_embd, n_vocab)
    special = {}
    for key, value in kv.items():  # tokenizer.ggml.<name>_token_id
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and isinstance(value, int):
            name = key[len("tokenizer.ggml.") : -len("_token_id")]
            special[_SPECIAL_ALIASES.get(name, name)] = value
    dtype = file_type_name(kv.get("general.file_type"))
    if not dtype:  # missing, or a file type newer than the gguf package
        dtype = bytes_by_type.most_common(1)[0][0] if bytes_by_type else "unknown"
    return ModelMeta(
        ref=ref,
        architecture=arch,
        n_params=n_params,
        n_layers=hp("block_count"),
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=hp("attention.head_count_kv", n_heads),
        head_dim=hp("attention.key_length") or (hidden // n_heads if n_heads else 0),
        context_length=hp("context_length"),
        vocab_size=hp("vocab_size") or embd_rows or len(tokens),
        vocab=tokens,
        bos_id=special.get("bos"),
        eos_ids=tuple(dict.fromkeys(special[k] for k in ("eos", "eot", "eom") if k in special)),
        special_tokens=special,
        chat_template=kv.get("tokenizer.chat_template") or None,
        dtype=dtype,
        weight_bytes=weight_bytes,
        kv_layers=kv_layers(),
    )


_SPECIAL_ALIASES = {"unknown": "unk", "padding": "pad", "seperator": "sep", "separator": "sep"}


# -- Hugging Face folder -------------------------------------------------------------

# safetensors dtype codes -> torch dtype names
_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_MAX_ST_HEADER = 100 * 2**20  # a real header is a few hundred KB; more means a corrupt file


# Layer kinds that keep a KV cache entry per token; "linear_attention" (a gated delta net) does not.
_KV_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention", "chunked_attention"})


def _hf_kv_layers(config: dict, n_layers: int | None) -> tuple[int | None, int | None]:
    """(layers, layers with a KV cache) of a hybrid's config.json: `layer_types` (Qwen3.5, LFM2,
    Granite 4), `layers_block_type` (Nemotron-H in transformers 5) or `hybrid_override_pattern`
    ('*' an attention layer, older Nemotron-H); (n_layers, None) for a model that does not say."""
    kinds = config.get("layer_types") or config.get("layers_block_type")
    if isinstance(kinds, list) and kinds:
        return n_layers or len(kinds), sum(1 for kind in kinds if kind in _KV_LAYER_TYPES)
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return n_layers or len(pattern), pattern.count("*")
    return n_layers, None


def _read_hf(ref: ModelRef) -> ModelMeta:
    folder = Path(ref.path)
    config = _json(folder / "config.json", required=True)
    c = config
    if "num_hidden_layers" not in c and isinstance(c.get("text_config"), dict):
        c = c["text_config"]  # multimodal configs keep the language model's sizes there
    n_layers = _first(c, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    n_layers, kv_layers = _hf_kv_layers(c, n_layers)
    hidden = _first(c, "hidden_size", "n_embd", "d_model")
    n_heads = _first(c, "num_attention_heads", "n_head", "n_heads")
    n_kv = _first(c, "num_key_value_heads", "n_head_kv") or n_heads
    head_dim = _first(c, "head_dim") or (hidden // n_heads if n_heads else 0)
    tok_cfg = _json(folder / "tokenizer_config.json")
    vocab = _hf_vocab(folder, tok_cfg)
    vocab_size = _first(c, "vocab_size", "padded_vocab_size") or len(vocab)

    n_params, weight_bytes, dtype = _safetensors_totals(folder)
    if not weight_bytes:  # only pickled weights: size from the files, count from the shapes
        bins = sorted(folder.glob("*.bin"))
        if not bins:
            raise ModelLoadError(
                f"The model folder {folder} has no weights (no .safetensors or .bin files). "
                "The download may be incomplete; download the model again."
            )
        weight_bytes = sum(p.stat().st_size for p in bins)
        dtype = str(_first(c, "dtype", "torch_dtype") or "float32")
        inter = _first(c, "intermediate_size") or 4 * hidden
        per_layer = 2 * hidden * head_dim * (n_heads + n_kv) + 3 * hidden * inter + 2 * hidden
        tied = config.get("tie_word_embeddings", True)
        n_params = n_layers * per_layer + vocab_size * hidden * (1 if tied else 2) + hidden  # an estimate

    ids = {text: i for i, text in enumerate(vocab)}
    special_map = _json(folder / "special_tokens_map.json")
    gen_cfg = _json(folder / "generation_config.json")
    special = {}
    for name in ("bos", "eos", "unk", "pad", "sep", "cls", "mask"):
        text = _token_content(tok_cfg.get(f"{name}_token") or special_map.get(f"{name}_token"))
        if text in ids:
            special[name] = ids[text]
        elif isinstance(_first(config, f"{name}_token_id"), int):
            special[name] = config[f"{name}_token_id"]
    eos_ids = [special["eos"]] if "eos" in special else []
    for source in (config, gen_cfg):
        value = source.get("eos_token_id")
        eos_ids += value if isinstance(value, list) else [value] if isinstance(value, int) else []
    bos_id = special.get("bos", _first(config, "bos_token_id") or _first(gen_cfg, "bos_token_id"))

    return ModelMeta(
        ref=ref,
        architecture=str(config.get("model_type", "unknown")),
        n_params=n_params,
        n_layers=n_layers or 0,
        hidden_size=hidden or 0,
        n_heads=n_heads or 0,
        n_kv_heads=n_kv or 0,
        head_dim=head_dim,
        context_length=_first(c, "max_position_embeddings", "n_positions", "seq_length", "max_seq_len") or 0,
        vocab_size=vocab_size,
        vocab=vocab,
        bos_id=bos_id if isinstance(bos_id, int) else None,
        eos_ids=tuple(dict.fromkeys(eos_ids)),
        special_tokens=special,
        chat_template=_hf_chat_template(folder, tok_cfg),
        dtype=dtype,
        weight_bytes=weight_bytes,
        kv_layers=kv_layers,
    )


def _safetensors_totals(folder: Path) -> tuple[int, int, str]:
    """(parameters, bytes, main dtype) from the JSON headers of the folder's .safetensors files."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # sharded; other .safetensors next to it (consolidated.*) are duplicates
        names = sorted(set(_json(index, required=True)["weight_map"].values()))
        files = [folder / name for name in names]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        files = sorted(folder.glob("*.safetensors"))
    n_params = n_bytes = 0
    bytes_by_dtype: Counter[str] = Counter()
    for path in files:
        if not path.is_file():
            raise ModelLoadError(
                f"The weight file {path.name} of {folder} is missing. The download is incomplete; "
                "download the model again."
            )
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > min(_MAX_ST_HEADER, path.stat().st_size - 8):
                raise ValueError(f"{path.name} has an impossible header size {size}")
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            n_params += math.prod(info["shape"])
            n_bytes += end - start
            bytes_by_dtype[_ST_DTYPES.get(info["dtype"], info["dtype"].lower())] += end - start
    dtype = bytes_by_dtype.most_common(1)[0][0] if bytes_by_dtype else "unknown"
    return n_params, n_bytes, dtype


def _hf_vocab(folder: Path, tok_cfg: dict) -> tuple[str, ...]:
    """Vocabulary entry of each id, read from the tokenizer's JSON files."""
    pieces: dict[int, str] = {}
    if (folder / "tokenizer.json").is_file():
        data = _json(folder / "tokenizer.json", required=True)
        vocab = (data.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: piece -> id
            pieces = {int(i): t for t, i in vocab.items()}
        elif isinstance(vocab, list):  # Unigram: [piece, score] by id
            pieces = {i: entry[0] for i, entry in enumerate(vocab)}
        for added in data.get("added_tokens") or []:
            pieces[int(added["id"])] = added["content"]
    elif (folder / "vocab.json").is_file():  # a slow GPT-2 style tokenizer: vocab.json + merges.txt
        pieces = {int(i): t for t, i in _json(folder / "vocab.json", required=True).items()}
        pieces.update({int(i): t for t, i in _json(folder / "added_tokens.json").items()})
    else:
        pieces = _vocab_from_transformers(folder)
    for i, entry in (tok_cfg.get("added_tokens_decoder") or {}).items():
        pieces.setdefault(int(i), _token_content(entry) or f"[PAD{i}]")
    if not pieces:
        raise ModelLoadError(f"The tokenizer of {folder} has an empty vocabulary. Download the model again.")
    size = max(pieces) + 1
    if size > 10_000_000 or min(pieces) < 0:
        raise ModelLoadError(f"The tokenizer of {folder} has impossible token ids. Download the model again.")
    return tuple(pieces.get(i, f"[PAD{i}]") for i in range(size))


def _vocab_from_transformers(folder: Path) -> dict[int, str]:
    """Last resort for a tokenizer with no JSON vocabulary (a SentencePiece tokenizer.model)."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        return {int(i): t for t, i in tok.get_vocab().items()}
    except Exception as e:  # transformers raises many types here; all mean "cannot read it"
        raise ModelLoadError(
            f"Cannot read the tokenizer of {folder} ({type(e).__name__}: {e}). The folder needs a "
            "tokenizer.json (or vocab.json, or a tokenizer transformers can open)."
        ) from e


def _hf_chat_template(folder: Path, tok_cfg: dict) -> str | None:
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not template and (folder / "chat_template.jinja").is_file():  # transformers >= 4.5x saves it apart
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if not template:
        template = _json(folder / "chat_template.json").get("chat_template")
    return template or None


def _token_content(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _first(d: dict, *keys):
    return next((d[k] for k in keys if d.get(k) is not None), None)


def _json(path: Path, required: bool = False) -> dict:
    """A JSON object from a file; {} for a missing optional file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        if not required:
            return {}
        raise ModelLoadError(f"{path} is missing. The model folder is incomplete; download it again.") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}). The file is damaged; download it again.") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object. The file is damaged; download it again.")
    return data
