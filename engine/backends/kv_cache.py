"""A preallocated key/value cache for one sequence, with O(1) rollback.

Each layer owns one buffer of shape (2 * n_kv_heads, capacity, head_dim): the
keys of every KV head, then the values (one copy per layer and step stores
both). Rows 0..length-1 hold the cached positions; whatever lies beyond
`length` is stale and never read, so a rollback only lowers `length`.

The capacity starts small and doubles (up to `max_length`, the backend's n_ctx)
when a forward needs more rows, so a 32k-context model does not allocate its
whole cache up front; growing copies the live rows once, which amortises to
O(1) per token.

`StaticKVCache` is the static-shape forward's (engine/backends/hf/static.py): the
same interface over one stacked buffer (n_layers, 2 * n_kv_heads, capacity,
head_dim), so that a layer is an index into one tensor and addresses change only
when the capacity doubles (what a CUDA graph replays).
"""

from __future__ import annotations

import torch

INITIAL_CAPACITY = 256


class KVCache:
    """Keys and values of every layer for positions 0..length-1."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        max_length: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.n_layers = n_layers
        self.shape = (n_kv_heads, head_dim)
        self.max_length = max_length
        self.dtype = dtype
        self.device = torch.device(device)
        self.length = 0
        self.capacity = 0
        self.buffers: list[torch.Tensor] = []  # per layer (2 * n_kv_heads, capacity, head_dim)

    def _grown_capacity(self, needed: int) -> int | None:
        """The capacity that holds `needed` rows, doubling up to max_length; None when it already does."""
        if needed <= self.capacity:
            return None
        if needed > self.max_length:
            raise ValueError(f"the cache holds at most {self.max_length} positions, {needed} were asked for")
        capacity = max(self.capacity, min(INITIAL_CAPACITY, self.max_length))
        while capacity < needed:
            capacity = min(capacity * 2, self.max_length)
        return capacity

    def reserve(self, needed: int) -> None:
        """Make room for `needed` rows in total (grows by doubling, capped at max_length)."""
        capacity = self._grown_capacity(needed)
        if capacity is None:
            return
        heads, dim = self.shape
        keep = self.length
        for layer in range(self.n_layers):
            grown = torch.empty(2 * heads, capacity, dim, dtype=self.dtype, device=self.device)
            if keep:
                grown[:, :keep] = self.buffers[layer][:, :keep]
            # Replace layer by layer: the old buffers go as we go, so the peak
            # is one layer above the new size rather than the old plus the new.
            if layer < len(self.buffers):
                self.buffers[layer] = grown
            else:
                self.buffers.append(grown)
        self.capacity = capacity

    def write(self, layer: int, start: int, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys then values kv (2 * n_kv_heads, n, head_dim) at rows start..start+n-1
        of `layer`; return views of the keys and values of rows 0..start+n-1 (what the
        new rows attend over), (n_kv_heads, start+n, head_dim) each."""
        end = start + kv.shape[1]
        buffer = self.buffers[layer]
        buffer[:, start:end] = kv
        heads = self.shape[0]
        return buffer[:heads, :end], buffer[heads:, :end]

    def truncate(self, length: int) -> None:
        self.length = length

    def keep_rows(self, start: int, rows: torch.Tensor) -> None:
        """Move rows `rows` (absolute indices >= start, increasing) to start, start+1, ...
        and make the cache end after them: what keeping one path of a token tree needs."""
        end = start + rows.numel()
        for buffer in self.buffers:
            # Indexing gathers into a new tensor before the write, so source and
            # destination rows may overlap safely.
            buffer[:, start:end] = buffer[:, rows]
        self.length = end

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers)


class StaticKVCache(KVCache):
    """A KVCache in one stacked buffer (n_layers, 2 * n_kv_heads, capacity + slack, head_dim).

    Rows past `capacity` are scratch for the padding rows of a bucketed forward, which
    write there and are never read. The capacity grows by doubling as KVCache's does (a
    model trained for 128k tokens does not allocate them all up front); each growth makes a
    new stacked tensor, so `stacked` changing is the signal that tensor addresses moved.
    `buffers[layer]` views the stacked buffer, so the eager forward runs on this cache too.
    The buffer starts zeroed: rows the mask hides must still be finite (0 * NaN is NaN).
    """

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        max_length: int,
        dtype: torch.dtype,
        device: torch.device | str,
        slack: int = 0,
    ) -> None:
        super().__init__(n_layers, n_kv_heads, head_dim, max_length, dtype, device)
        self.slack = slack
        self.stacked: torch.Tensor | None = None

    def reserve(self, needed: int) -> None:
        capacity = self._grown_capacity(needed)
        if capacity is None:
            return
        heads, dim = self.shape
        grown = torch.zeros(self.n_layers, 2 * heads, capacity + self.slack, dim, dtype=self.dtype, device=self.device)
        if self.length:  # the rows in use, with any scratch below `length` (early-exit drafting)
            grown[:, :, : self.length] = self.stacked[:, :, : self.length]
        self.stacked, self.capacity = grown, capacity
        self.buffers = list(grown.unbind(0))  # views, (2 * n_kv_heads, capacity + slack, head_dim) each

    def keep_rows(self, start: int, rows: torch.Tensor) -> None:
        end = start + rows.numel()
        self.stacked[:, :, start:end] = self.stacked[:, :, rows]  # one gather for every layer
        self.length = end
