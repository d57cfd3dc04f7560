"""Is a GGUF's weight data intact? A cheap look for zeroed stretches, at load and in the doctor.

A download or copy that went wrong can leave part of a file zeroed (space reserved but never
written, a failed disk block): the header still parses, llama.cpp loads the file, and the model
answers plausibly, only worse, with no warning. In the weight data such a stretch shows as whole
rows of a matrix that are zero bytes: every weight and every quantization scale 0 (a Q4/Q8 block
with scale 0), which training does not produce.

What is checked, precisely:
- matrices only (2 or more dimensions): norms and biases may be zero by right (random test
  models write them so), and are small;
- not the tables with a row per token (token_embd, output, per-layer token tables): unused and
  padding tokens have zero rows in real models;
- a matrix is flagged when 2 or more consecutive rows, 4 KiB at least, are all zero bytes;
- files whose matrices hold up to 16 MiB (the tests' random models) are read whole; in larger
  ones a 16 KiB window every 256 KiB (a sixteenth of the data, up to 1 GiB of matrices), or
  every (matrix bytes / 4096) so that at most 64 MiB are read: a zeroed stretch longer than
  a stride and a window is always found, 272 KiB in files up to 1 GiB, about 4 MiB at 16 GiB.

The check runs once per file and modification time and is cached; what it costs on the default
model is in docs/benchmarks.md, "Measurements behind the code".
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

MIN_ZERO_ROWS = 2
MIN_ZERO_BYTES = 4096
FULL_SCAN_BYTES = 16 * 2**20  # matrices up to this size are read whole
WINDOW_BYTES = 16 * 2**10  # in larger files, a window this long...
MIN_STRIDE = 256 * 2**10  # ...every 256 KiB (a sixteenth of the data)...
SAMPLE_BYTES = 64 * 2**20  # ...or farther apart, so that at most this much is read
_SHOWN = 4  # tensor names a message lists before "and N more"

_CACHE: OrderedDict[tuple, tuple[str, ...]] = OrderedDict()
_LOCK = threading.Lock()


def zeroed_tensors(path: str) -> tuple[str, ...]:
    """Names of the matrices of the GGUF at `path` with zeroed rows (see the module doc), in file order;
    cached per file and modification time. Raises what reading the file raises."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    found = _scan(path)
    with _LOCK:
        _CACHE[key] = found
        while len(_CACHE) > 8:
            _CACHE.popitem(last=False)
    return found


def damage_message(path: str, name: str | None = None) -> str | None:
    """A sentence saying the file looks damaged and what to do, or None when it looks intact
    (or cannot be read here: loading it says why)."""
    try:
        tensors = zeroed_tensors(path)
    except Exception:  # unreadable or not a GGUF: the loader and the metadata reader say so in their words
        return None
    if not tensors:
        return None
    shown = ", ".join(tensors[:_SHOWN]) + (f" and {len(tensors) - _SHOWN} more" if len(tensors) > _SHOWN else "")
    count = f"{len(tensors)} weight tensor{'s' if len(tensors) > 1 else ''}"
    return (
        f"{name or os.path.basename(path)} looks damaged: {count} ({shown}) "
        f"{'have' if len(tensors) > 1 else 'has'} whole rows of zeros, which a trained model does not have "
        "(a download or copy that did not finish writing). It may still answer, but worse than it should. "
        "Download the file again."
    )


def load_notes(path: str, name: str | None = None) -> tuple[str, ...]:
    """What a backend loading this GGUF should say (its `load_notes`): the damage, if any."""
    message = damage_message(path, name)
    return (message,) if message else ()


# -- the scan ------------------------------------------------------------------------


def _scan(path: str) -> tuple[str, ...]:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    layout = gguf_layout(path)
    matrices = []  # (name, start byte, rows, bytes per row)
    for name, shape, ttype, offset in layout.tensors:
        if len(shape) < 2 or _per_token(name, shape, layout.vocab_sizes):
            continue
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            continue  # a type the gguf package does not know: the metadata reader says so
        row_bytes, rows = shape[0] // block * block_bytes, math.prod(shape[1:])
        start = layout.data_start + offset
        if row_bytes and rows and start + rows * row_bytes <= layout.file_size:
            matrices.append((name, start, rows, row_bytes))
    total = sum(rows * row_bytes for _, _, rows, row_bytes in matrices)
    stride = None if total <= FULL_SCAN_BYTES else max(MIN_STRIDE, WINDOW_BYTES * total // SAMPLE_BYTES)
    found, done = [], 0  # done: bytes of the matrices before this one, for windows a stride apart across them
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for name, start, rows, row_bytes in matrices:
            need = max(MIN_ZERO_ROWS, -(-MIN_ZERO_BYTES // row_bytes))  # consecutive zero rows that flag
            word = next(w for w in (8, 4, 2, 1) if row_bytes % w == 0 and start % w == 0)
            data = np.frombuffer(buf, np.dtype(f"u{word}"), rows * row_bytes // word, start)
            data = data.reshape(rows, row_bytes // word)  # (rows, words per row)
            if stride is None:
                windows = [(0, rows)]
            else:
                size = max(2 * need, WINDOW_BYTES // row_bytes)  # rows per window
                first = (-done) % stride
                windows = [(at // row_bytes, size) for at in range(first, rows * row_bytes, stride)]
            if rows >= need and any(_zero_run(~data[r : r + n].any(axis=1), need) for r, n in windows):
                found.append(name)
            done += rows * row_bytes
            del data  # no view may outlive the mapping
    return tuple(found)


def _zero_run(zero_rows, need: int) -> bool:
    """True when `zero_rows` (one bool per row) holds `need` consecutive True."""
    import numpy as np

    if np.count_nonzero(zero_rows) < need:
        return False
    edges = np.diff(np.concatenate(([0], zero_rows.astype(np.int8), [0])))
    return bool((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).max() >= need)


@dataclass(frozen=True)
class Layout:
    tensors: tuple[tuple[str, list[int], int, int], ...]  # (name, GGML shape, type, offset in the data)
    data_start: int
    file_size: int
    vocab_sizes: frozenset[int]  # the tokenizer's token count and the declared vocab_size


def gguf_layout(path: str) -> Layout:
    """Where a GGUF's tensors are. Like metadata's parse, but strings are skipped, not decoded:
    a third of the time on a vocabulary and merges of 100k strings."""
    from engine.models.metadata import _GGUFParser, _read_preamble

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        p = _GGUFParser(buf)
        n_tensors, n_kv = _read_preamble(p, path)
        length = struct.Struct(p.endian + "Q").unpack_from
        vocab_sizes, alignment = set(), 32
        for _ in range(n_kv):
            key = p.strings(1)[0]
            (vtype,) = p.unpack("I")
            if vtype == _ARRAY and p.unpack("I")[0] == _STRING:
                (n,) = p.unpack("Q")
                if key == "tokenizer.ggml.tokens":
                    vocab_sizes.add(n)
                pos = p.pos
                for _ in range(n):  # the hot loop: ~100k strings
                    pos += 8 + length(buf, pos)[0]
                p.pos = pos
                continue
            if vtype == _ARRAY:
                p.pos -= 4  # the element type, read again by value()
            value = p.value(vtype)
            if key == "general.alignment":
                alignment = int(value) or 32
            elif key.endswith(".vocab_size") and isinstance(value, int):
                vocab_sizes.add(value)
        tensors = tuple(p.tensor_table(n_tensors))
        return Layout(tensors, -(-p.pos // alignment) * alignment, len(buf), frozenset(vocab_sizes))


_STRING, _ARRAY = 8, 9  # GGUF value types


def _per_token(name: str, shape: list[int], vocab_sizes: frozenset[int]) -> bool:
    """A table with a row per token: GGML shapes list the row length first, the rows last."""
    return "token_embd" in name or name.startswith("output.") or shape[-1] in vocab_sizes
