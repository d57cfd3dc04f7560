"""The target's final hidden states, computed once and kept on disk (the `features` objective).

The target is frozen, so its hidden states h_t (after the final norm) and its
greedy next tokens argmax p_t never change: running it at every step of every
epoch is wasted work. The cache runs it once over a seeded random subset of the
training windows, in large chunks under inference_mode, and writes

    training/features.bin   (N, T, W) in the target's dtype as 16-bit words (bfloat16 or float16),
                            or float32 for a float32 target; a memory-mapped raw array. W = H,
                            or for EAGLE-3 (`layers`) the inputs of those layers then h_t,
                            (len(layers) + 1) * H
    training/labels.bin     (N, T) int32: argmax p_t, the target's greedy token t + 1
    training/features.pt    what the arrays hold and how many windows are written so far

The meta file is rewritten (atomically) after each chunk is flushed, so a
cancelled or crashed build continues from its last chunk, and a finished cache
is reused as it is by a resumed run. Chunk boundaries never move, so a
continued build writes the same bits as an uninterrupted one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from engine.training import checkpoint as ckpt

FEATURES_FILE = "features.bin"
LABELS_FILE = "labels.bin"
META_FILE = "features.pt"
CHUNK_WINDOWS = 16  # windows per target forward: 4096 tokens at seq_len 256
_STORAGE = {
    torch.bfloat16: (np.uint16, "bfloat16"),
    torch.float16: (np.uint16, "float16"),
    torch.float32: (np.float32, "float32"),
}
_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def cached_windows(n_train: int, n_cache: int, seed: int) -> list[int]:
    """Which training windows the cache holds: a seeded random subset (all when n_cache >= n_train), sorted."""
    if n_cache >= n_train:
        return list(range(n_train))
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 999_983)
    return sorted(torch.randperm(n_train, generator=generator)[:n_cache].tolist())


class FeatureCache:
    """Hidden states and greedy labels of the cached windows; `batch(position, B)` serves them epoch after epoch."""

    def __init__(
        self,
        folder: Path,
        windows: list[int],
        seq_len: int,
        hidden_size: int,
        dtype: torch.dtype,
        fingerprint: str,
        seed: int,
        layers: tuple[int, ...] = (),
    ) -> None:
        self.folder = Path(folder)
        self.windows = windows
        self.seq_len = seq_len
        self.hidden_size = hidden_size
        self.layers = tuple(layers)
        self.width = (len(self.layers) + 1) * hidden_size if self.layers else hidden_size
        self.dtype = dtype if dtype in _STORAGE else torch.float32
        self.seed = seed
        self.meta = {
            "format": ckpt.FORMAT,
            "windows": windows,
            "seq_len": seq_len,
            "hidden_size": hidden_size,
            "dtype": _STORAGE[self.dtype][1],
            "fingerprint": fingerprint,
            "built": 0,
        }
        if self.layers:  # only then: a cache of final features written before layers existed stays valid
            self.meta["layers"] = list(self.layers)
        self.built_now = 0  # windows this process ran the target on (0 when a finished cache was reused)
        self.build_tokens_per_s = 0.0
        self._order: tuple[int, torch.Tensor] | None = None
        saved = self._saved_meta()
        same = saved is not None and saved.get("layers") == self.meta.get("layers")
        if same and all(saved.get(k) == v for k, v in self.meta.items() if k not in ("built", "dtype")):
            self.meta["built"] = int(saved["built"])
            self.meta["dtype"] = saved["dtype"]  # a cache made in another dtype stays valid
            self.dtype = _TORCH[saved["dtype"]]
        mode = "r+" if self.meta["built"] > 0 else "w+"
        n, T, W = len(windows), seq_len, self.width
        self._features = np.memmap(
            self.folder / FEATURES_FILE, dtype=_STORAGE[self.dtype][0], mode=mode, shape=(n, T, W)
        )
        self._labels = np.memmap(self.folder / LABELS_FILE, dtype=np.int32, mode=mode, shape=(n, T))

    @property
    def complete(self) -> bool:
        return self.meta["built"] >= len(self.windows)

    @property
    def built(self) -> int:
        return int(self.meta["built"])

    def build(
        self, target, all_windows: torch.Tensor, progress: Callable[[int, int, float], None], cancel: threading.Event
    ) -> bool:
        """Run the target over the windows not cached yet; False when cancelled (what is written is kept)."""
        started, done_here = time.perf_counter(), 0
        n = len(self.windows)
        while self.built < n:
            if cancel.is_set():
                return False
            a = self.built
            b = min(a + CHUNK_WINDOWS, n)
            ids = all_windows[self.windows[a:b]]  # (C, T)
            with torch.inference_mode():
                hidden, labels = target_rows(target, ids, self.layers)
            self._features[a:b] = _to_numpy(hidden.to(self.dtype))
            self._labels[a:b] = labels.to(torch.int32).cpu().numpy()
            self._features.flush()
            self._labels.flush()
            self.meta["built"] = b
            ckpt.save_atomically(self.meta, self.folder / META_FILE)
            done_here += b - a
            self.built_now += b - a
            self.build_tokens_per_s = done_here * self.seq_len / (time.perf_counter() - started)
            progress(b, n, self.build_tokens_per_s)
        return True

    def rows(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows as float32 features (B, T, W) and int64 labels (B, T)."""
        index = np.asarray(rows)
        raw = torch.from_numpy(np.ascontiguousarray(self._features[index]))
        features = raw.view(self.dtype) if self.dtype != torch.float32 else raw
        return features.float(), torch.from_numpy(np.ascontiguousarray(self._labels[index])).long()

    def labels(self) -> torch.Tensor:
        """Every cached greedy label, (N, T) int64."""
        return torch.from_numpy(np.ascontiguousarray(self._labels)).long()

    def batch(self, position: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The training batch at `position` (windows served so far): a fresh seeded order every epoch."""
        return self.rows([self._index(position + i) for i in range(batch_size)])

    def batch_windows(self, position: int, batch_size: int) -> list[int]:
        """Which training windows `batch(position, batch_size)` serves, in order."""
        return [self.windows[self._index(position + i)] for i in range(batch_size)]

    def _index(self, position: int) -> int:
        epoch, index = divmod(position, len(self.windows))
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(len(self.windows), generator=generator))
        return int(self._order[1][index])

    def _saved_meta(self) -> dict | None:
        path = self.folder / META_FILE
        if not path.is_file() or not (self.folder / FEATURES_FILE).is_file():
            return None
        try:
            return ckpt.load_file(path)
        except Exception:  # noqa: BLE001 - an unreadable cache is rebuilt, never trusted
            return None


def target_rows(target, ids: torch.Tensor, layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """What the cache holds for windows `ids` (C, T): the features (C, T, W) in the target's dtype
    (h_t, or the inputs of `layers` then h_t) and the greedy labels (C, T), argmax p_t."""
    if layers:
        inputs, hidden = target.layer_states(ids, layers)
        features = torch.cat([inputs, hidden], dim=-1)
    else:
        features = hidden = target.hidden_states(ids)  # (C, T, H)
    return features, target.lm_head(hidden).argmax(dim=-1)  # labels: the greedy token t + 1


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()
