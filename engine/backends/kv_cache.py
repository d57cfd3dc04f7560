"""A preallocated key/value cache for one sequence, with O(1) rollback.

Each layer owns one buffer of shape (2 * n_kv_heads, capacity, head_dim): the
keys of every KV head, then the values (one copy per layer and step stores
both). Rows 0..length-1 hold the cached positions; whatever lies beyond
`length` is stale and never read, so a rollback only lowers `length`.

The capacity starts small and doubles (up to `max_length`, the backend's n_ctx)
when a forward needs more rows, so a 32k-context model does not allocate its
whole cache up front; growing copies the live rows once, which amortises to
O(1) per token.

The static-shape forward (engine/backends/hf/static.py) keeps the keys and values of
all its sequences in one `StaticKVBuffer` (n_layers, 2 * n_kv_heads, capacity + slack,
slots, head_dim), so that a layer is an index into one tensor, one attention call can
read every sequence, and addresses change only when the capacity doubles (what a CUDA
graph replays). Each sequence sees its own slot through a `StaticKVCache`: the same
interface as KVCache, so the eager forward runs on it too.
"""

from __future__ import annotations

import torch

INITIAL_CAPACITY = 256


def grown_capacity(capacity: int, needed: int, max_length: int) -> int | None:
    """The capacity that holds `needed` rows, doubling `capacity` up to max_length; None when it already does."""
    if needed <= capacity:
        return None
    if needed > max_length:
        raise ValueError(f"the cache holds at most {max_length} positions, {needed} were asked for")
    grown = max(capacity, min(INITIAL_CAPACITY, max_length))
    while grown < needed:
        grown = min(grown * 2, max_length)
    return grown


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

    def reserve(self, needed: int) -> None:
        """Make room for `needed` rows in total (grows by doubling, capped at max_length)."""
        capacity = grown_capacity(self.capacity, needed, self.max_length)
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


class StaticKVBuffer:
    """The keys and values of up to `slots` sequences in one tensor, `stacked`:
    (n_layers, 2 * n_kv_heads, capacity + slack, slots, head_dim).

    The slot is the axis just inside the position, so `stacked[layer][:, :span]` viewed as
    (2 * n_kv_heads, span * slots, head_dim) is contiguous and holds the first `span`
    positions of every slot, position-major (column j * slots + s is position j of slot s):
    one attention call reads every sequence (static.py masks each row to its own slot).

    Positions past `capacity` are scratch for the padding rows of a bucketed forward, which
    write there and are never read. The capacity grows by doubling as KVCache's does (a model
    trained for 128k tokens does not allocate them all up front), for every slot at once;
    each growth, and a change of `slots`, makes a new tensor, so `stacked` changing is the
    signal that tensor addresses moved. The tensor starts zeroed: rows the mask hides must
    still be finite (0 * NaN is NaN). With one slot it is the size a single sequence's is.
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
        slots: int = 1,
    ) -> None:
        self.n_layers = n_layers
        self.shape = (n_kv_heads, head_dim)
        self.max_length = max_length
        self.dtype = dtype
        self.device = torch.device(device)
        self.slack = slack
        self.slots = slots
        self.capacity = 0
        self.stacked: torch.Tensor | None = None
        self._open: list[StaticKVCache | None] = [None] * slots  # the cache of each slot, None where free

    def open(self) -> StaticKVCache:
        """An empty cache on the first free slot."""
        index = next((i for i, cache in enumerate(self._open) if cache is None), None)
        if index is None:
            raise RuntimeError(f"all {self.slots} slots of the KV buffer are in use")
        cache = self._open[index] = StaticKVCache(self, index)
        return cache

    def release(self, cache: StaticKVCache) -> None:
        """Give `cache`'s slot back: a cache opened on it later starts empty (its length is 0, and no
        forward reads a slot's positions at or past its length)."""
        if self._open[cache.index] is cache:
            self._open[cache.index] = None

    def resize(self, slots: int) -> None:
        """Hold `slots` sequences from now on, keeping what the open ones hold."""
        if slots < 1 or any(cache is not None for cache in self._open[slots:]):
            raise ValueError(f"cannot hold {slots} slots: slots past it are open")
        if slots == self.slots:
            return
        self._move(self.capacity, slots)
        self._open = (self._open + [None] * slots)[:slots]

    def reserve(self, needed: int) -> None:
        """Make room for `needed` positions in every slot (grows by doubling, capped at max_length)."""
        capacity = grown_capacity(self.capacity, needed, self.max_length)
        if capacity is not None:
            self._move(capacity, self.slots)

    def _move(self, capacity: int, slots: int) -> None:
        heads, dim = self.shape
        if capacity:
            grown = torch.zeros(
                self.n_layers, 2 * heads, capacity + self.slack, slots, dim, dtype=self.dtype, device=self.device
            )
            if self.stacked is not None:
                # Every position below the old capacity: the rows in use and any scratch an
                # early-exit draft left past a sequence's length for its verify to pick up.
                kept = min(slots, self.slots)
                grown[:, :, : self.capacity, :kept] = self.stacked[:, :, : self.capacity, :kept]
            self.stacked = grown
        self.capacity, self.slots = capacity, slots

    def nbytes(self) -> int:
        return 0 if self.stacked is None else self.stacked.numel() * self.stacked.element_size()


class StaticKVCache(KVCache):
    """One sequence's slot of a StaticKVBuffer (`pool`, slot `index`), with KVCache's interface:
    `buffers[layer]` views the slot (2 * n_kv_heads, capacity + slack, head_dim), so the eager
    forward runs on it too; `reserve` grows the whole buffer."""

    def __init__(self, pool: StaticKVBuffer, index: int) -> None:
        # Not KVCache.__init__: the capacity and the buffers are the pool's.
        self.pool, self.index = pool, index
        self.n_layers, self.shape, self.max_length = pool.n_layers, pool.shape, pool.max_length
        self.dtype, self.device = pool.dtype, pool.device
        self.length = 0
        self._views: list[torch.Tensor] = []
        self._views_of: torch.Tensor | None = None  # the pool tensor `_views` look into

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    @property
    def buffers(self) -> list[torch.Tensor]:
        stacked = self.pool.stacked
        if self._views_of is not stacked:  # the pool grew (or was never viewed): view the new tensor
            self._views = [] if stacked is None else list(stacked[:, :, :, self.index].unbind(0))
            self._views_of = stacked
        return self._views

    def reserve(self, needed: int) -> None:
        self.pool.reserve(needed)

    def keep_rows(self, start: int, rows: torch.Tensor) -> None:
        end = start + rows.numel()
        stacked = self.pool.stacked
        stacked[:, :, start:end, self.index] = stacked[:, :, rows, self.index]  # one gather for every layer
        self.length = end
