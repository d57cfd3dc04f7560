"""Any attention pattern over new rows on llama.cpp, through sequence ids: TreeForward there.

llama.cpp has no custom attention masks, but a token of a `llama_batch` may belong to several
sequences, and a query attends to the cache cells of its first sequence id at positions up to its
own. So a block of n new rows with mask M (row i sees row j iff M[i, j]; every row sees the
cached tokens), row i at position base + offsets[i], runs in one decode as:

1. groups: sets of rows, each the rows some row sees (M[i]). Row i queries through a group g
   whose rows at positions <= its own are exactly M[i]; a row no group serves starts one.
   Deepest rows first, so a tree needs one group per leaf (its root-to-leaf path) and lookahead's
   window one per column (the pending token, level 0 up to that column, the column's levels);
2. every group gets a temporary sequence id, and the sequence's cached tokens are made visible to
   it: `llama_memory_seq_cp(mem, seq, tmp, -1, -1)` adds the id to those cells (no data copied);
3. row i goes into the batch with ids [tmp of its query group, tmp of every other group holding
   it], rows sorted by offset; one llama_decode, logits for every row.

`keep_rows(rows)` then adds the sequence's own id to the kept rows' cells (they sit at offsets
0, 1, 2... after the cache: `llama_memory_seq_cp` from the last kept row's group over those
positions), removes every temporary id (`llama_memory_seq_rm(mem, tmp, -1, -1)`; a cell left with
no id is free again) and makes `tokens` match. A rollback instead drops the temporary ids, and
keeps the block's first rows where it cuts inside them.

What llama.cpp asks of every sequence in a batch (llama_batch_allocr::init), and so of a mask:
a row sees itself; a row sees no row at a later position; a group's positions have no gap and
start right after the cache (the row at offset 0 must be seen, as trees and lookahead's blocks
see the pending token). Trees and lookahead's window (level l, column c at offset l + c sees
offsets 1..c of level 0 and c+1..c+l of its column) satisfy all three; any other mask that
does not raises MaskNotExpressible before anything runs.

Temporary ids: the context is made with n_seq_max = slots + TREE_SEQUENCES (the cache unified,
one buffer for every id), or fewer where n_batch is smaller: llama.cpp aborts on a context with more
sequences than a decode takes rows (a 32-token context did). The slots (engine/backends/llama_slots.py) are ids 0..slots-1, the
temporary ones come after them, shared by the slots of one context; a block holds its ids from its
forward to its keep or rollback. A tree of L leaves takes L ids, lookahead's step W + G at most. In
a batch of slots (`forward_batch`) the blocks of several slots and the chains of others run in the
same decode, each block on ids of its own.

A model with recurrent layers (engine/backends/llama_state.py) has none of this: its recurrent
state is one per sequence id and advances with every token of that sequence, so rows of other
branches would update the state a row reads (and each temporary id would need a state of its
own, from a copy of the sequence's). Such a backend has no TreeForward (its drafters say so).

Cost, measured with docs/bench/llama_tree_cost.py (the embedded SmolLM2-135M Q4_1, 1 thread, on a
2-core machine that other work kept busy: medians of 15 interleaved runs, two runs of the script,
so a few percent either way is noise). A masked step (forward_masked, keep_rows of 2, rollback)
against a chain forward of the same rows (and its rollback), in ms:

    after     block                        chain      masked      masked / chain
    100       lookahead (3, 3, 4), 15 rows   232, 204   249, 212    1.07, 1.04
    100       tree of 8, 9 rows              143, 140   160, 145    1.12, 1.03
    1000      lookahead (3, 3, 4), 15 rows   335, 401   381, 383    1.14, 0.96
    1000      tree of 8, 9 rows              227, 235   230, 256    1.01, 1.09

so about 5% more, within the noise of one run. The bookkeeping itself, timed apart: planning the
groups 0.2 ms for that 15-row block (7 groups), and a temporary id's copy and removal 0.02 ms after
100 cached tokens, 0.08 ms after 1,000, 0.36 ms after 4,000 (llama.cpp walks every cell), so a
block of g groups pays g times that. A one-token decode costs the same with the 64 extra ids as
without (after 100 tokens 32 and 36 ms with them, 34 and 33 without): plain decoding does not pay.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np
import torch

from engine.backends.base import finite_rows
from engine.backends.capabilities import TreeForward, require
from engine.core.tree import ancestor_mask, check_parents, depths
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.backends.llama_cpp import LlamaCppBackend

TREE_SEQUENCES = 64  # temporary sequence ids a context gets besides its slots' own


class MaskNotExpressible(ValueError):
    """An attention pattern llama.cpp's sequence ids cannot express."""


def tree_sequences(model, room: int) -> int:
    """The temporary ids a context of `model` gets: TREE_SEQUENCES, none for recurrent or hybrid models;
    at most `room`, as llama.cpp holds no more sequences than a decode takes rows (n_batch: a context
    of fewer tokens than that, whose batch is shorter, gets fewer)."""
    if llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model):
        return 0
    return max(0, min(TREE_SEQUENCES, room))


# -- the groups a mask needs -------------------------------------------------------------------


@dataclass(frozen=True)
class Groups:
    """Row i queries through group query[i] and belongs to every group g with members[g, i]."""

    query: np.ndarray  # (n,) int
    members: np.ndarray  # (g, n) bool
    order: np.ndarray  # (n,) rows by offset: the batch's row order


def plan_groups(offsets: np.ndarray, mask: np.ndarray) -> Groups:
    """The groups (module docstring, step 1) of a block; MaskNotExpressible when there are none."""
    n = len(offsets)
    if not mask.diagonal().all():
        i = int(np.flatnonzero(~mask.diagonal())[0])
        raise MaskNotExpressible(f"row {i} does not see itself, and a llama.cpp token always attends to itself")
    later = mask & (offsets[None, :] > offsets[:, None])
    if later.any():
        i, j = (int(x) for x in np.argwhere(later)[0])
        raise MaskNotExpressible(
            f"row {i} (offset {offsets[i]}) sees row {j} at a later offset ({offsets[j]}), and a llama.cpp "
            "token sees only cells at positions up to its own"
        )
    members = np.zeros((0, n), dtype=bool)
    query = np.zeros(n, dtype=np.int64)
    for i in sorted(range(n), key=lambda i: (-offsets[i], i)):
        serves = ((members & (offsets <= offsets[i])) == mask[i]).all(axis=1)  # (g,)
        if serves.any():
            query[i] = int(np.flatnonzero(serves)[0])
            continue
        seen = np.unique(offsets[mask[i]])
        if seen[0] != 0 or len(seen) != seen[-1] + 1:
            raise MaskNotExpressible(
                f"row {i} sees rows at offsets {seen.tolist()}, and llama.cpp needs the positions of a "
                "sequence's new rows to start right after the cache (offset 0) and to leave no gap"
            )
        query[i] = len(members)
        members = np.vstack([members, mask[i][None, :]])
    return Groups(query, members, np.argsort(offsets, kind="stable"))


# -- a block between its forward and its keep ------------------------------------------------------


@dataclass
class Block:
    """A masked forward's rows in the cache, held by temporary ids until kept or rolled back."""

    base: int  # the sequence's cached tokens before it
    offsets: np.ndarray  # (n,)
    mask: np.ndarray  # (n, n) bool
    groups: Groups
    ids: list[int]  # the temporary sequence id of each group
    parents: list[int] | None = None  # forward_tree's, for keep_nodes


class TreeIds:
    """The temporary sequence ids of one context, lent to blocks."""

    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count
        self._free = list(range(first + count - 1, first - 1, -1))  # pop() gives the lowest

    def take(self, n: int, what: str, name: str) -> list[int]:
        if n > len(self._free):
            raise ConfigError(
                f"llama.cpp needs {n} sequence ids to run {what} of {name} (one per branch), and "
                f"{len(self._free)} of the {self.count} this context has are free: draft smaller trees "
                "(a lower k, or fewer lookahead candidates G and a narrower window W)."
            )
        return [self._free.pop() for _ in range(n)]

    def give(self, ids: list[int]) -> None:
        self._free.extend(reversed(ids))


def _seq(s: Backend) -> int:
    return getattr(s, "_seq_id", 0)


# -- TreeForward on one sequence -------------------------------------------------------------------


class MaskedForwards:
    """TreeForward's methods for a sequence of a llama.cpp context (a LlamaCppBackend, each of its slots)."""

    _block: Block | None = None  # the last masked forward's rows, until kept or rolled back

    def _context_owner(self) -> LlamaCppBackend:
        """The backend whose context runs this sequence."""
        return self

    def forward_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        return forward_tree(self._context_owner(), self, tokens, parents)

    def keep_nodes(self, nodes: list[int]) -> None:
        keep_nodes(self._context_owner(), self, nodes)

    def forward_masked(
        self, tokens: list[int], offsets: list[int], mask: torch.Tensor, what: str = "a block"
    ) -> torch.Tensor:
        return forward_masked(self._context_owner(), self, tokens, offsets, mask, what)

    def keep_rows(self, rows: list[int]) -> None:
        keep_rows(self._context_owner(), self, rows)


def forward_tree(owner: LlamaCppBackend, s: Backend, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """TreeForward.forward_tree on sequence `s`: node i at offset depth(i) - 1, seeing its ancestors."""
    if not tokens or len(tokens) != len(parents):
        raise ValueError(f"forward_tree() needs one parent per token: {len(tokens)} tokens, {len(parents)} parents")
    check_parents(parents)
    offsets = [d - 1 for d in depths(parents)]
    logits = forward_masked(owner, s, tokens, offsets, ancestor_mask(parents), "a tree")
    s._block.parents = list(parents)
    return logits


def forward_masked(
    owner: LlamaCppBackend, s: Backend, tokens: list[int], offsets: list[int], mask: torch.Tensor, what: str
) -> torch.Tensor:
    """TreeForward.forward_masked on sequence `s` (module docstring); float32 logits (n, V)."""
    owner._check_open()
    block = prepare(owner, s, tokens, offsets, mask, what)
    return run(owner, [Part(s, list(tokens), block.base, block)])[0]


@dataclass
class Part:
    """One sequence's rows in a decode: a chain after its cache (block None), or a masked block."""

    s: Backend
    tokens: list[int]
    start: int
    block: Block | None = None


def prepare(owner: LlamaCppBackend, s: Backend, tokens: list[int], offsets: list[int], mask, what: str) -> Block:
    """Check a masked block of `s`, plan its groups and give each a temporary id that sees s's cache."""
    require(owner, TreeForward, "A masked forward")  # not a model with recurrent layers
    n = len(tokens)
    if not n or len(offsets) != n or tuple(mask.shape) != (n, n):
        raise ValueError(f"forward_masked() needs one offset and one mask row per token ({n} tokens)")
    if s._block is not None:
        raise RuntimeError("keep_rows() or a rollback must follow forward_masked() before the next forward")
    base = len(s.tokens)
    if base + n > s.n_ctx or base + max(offsets) >= s.n_ctx:
        raise s._context_full(f"{base} are in use and {what} of {n} more was asked for")
    off = np.asarray(offsets, dtype=np.int64)
    if (off < 0).any():
        raise ValueError(f"forward_masked() offsets must be 0 or more, got {list(offsets)}")
    dense = mask.to(device="cpu", dtype=torch.bool).numpy()
    groups = plan_groups(off, dense)
    ids = owner._tree_ids.take(len(groups.members), what, owner.info.name)
    for tmp in ids:  # the cached tokens, seen by every group
        llama_cpp.llama_memory_seq_cp(owner._mem, _seq(s), tmp, -1, -1)
    return Block(base, off, dense, groups, ids)


def forward_batch(owner: LlamaCppBackend, calls: list) -> list[torch.Tensor]:
    """Slots.forward_batch with masked calls among them (BatchCall, checked by the caller): every
    call's rows in one decode, a chain's on its sequence, a block's on temporary ids; each slot is
    left as its own forward or forward_masked would leave it (keep_rows, or keep_nodes for a tree's
    call, then keeps a block's rows)."""
    parts: list[Part] = []
    try:
        for call in calls:
            s = call.slot
            block = prepare(owner, s, call.tokens, call.offsets, call.mask, call.what) if call.masked else None
            if block is not None and call.parents is not None:
                block.parents = list(call.parents)
            parts.append(Part(s, list(call.tokens), len(s.tokens), block))
    except BaseException:
        for part in parts:
            if part.block is not None:
                _drop(owner, part.block)
        raise
    return run(owner, parts)


def _rows(part: Part) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], np.ndarray]:
    """A part's rows as the batch takes them: tokens, positions, each row's sequence ids (the one
    it queries through first), and the part's row of each batch row (a block's rows by offset)."""
    n = len(part.tokens)
    block = part.block
    if block is None:
        seq = np.array([_seq(part.s)], dtype=np.int32)
        order = np.arange(n)
        return np.asarray(part.tokens, dtype=np.int32), part.start + order, [seq] * n, order
    groups, order = block.groups, block.groups.order
    ids = np.asarray(block.ids, dtype=np.int32)
    others = groups.members.copy()
    others[groups.query, np.arange(n)] = False
    row_ids = [np.concatenate(([ids[groups.query[i]]], ids[others[:, i]])) for i in order]
    return np.asarray(part.tokens, dtype=np.int32)[order], block.base + block.offsets[order], row_ids, order


def run(owner: LlamaCppBackend, parts: list[Part]) -> list[torch.Tensor]:
    """Decode every part's rows together (several decodes past n_batch rows, cut only between two
    positions of a block, so each group's positions continue from where the last decode left them);
    each part's float32 logits (its n, V) in its own row order. Afterwards each sequence holds its
    rows, a block's until kept; on an error none does, and the blocks' ids are given back."""
    pieces = [_rows(part) for part in parts]
    tokens = np.concatenate([p[0] for p in pieces])
    pos = np.concatenate([p[1] for p in pieces]).astype(np.int32)
    row_ids = [ids for p in pieces for ids in p[2]]
    counts = np.array([len(ids) for ids in row_ids], dtype=np.int32)
    flat = np.concatenate(row_ids).astype(np.int32)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    pointers = (flat.ctypes.data + starts * flat.itemsize).astype(np.uintp)
    sizes = [len(part.tokens) for part in parts]
    # A decode may end before row k unless k continues a block at the same position.
    in_block = np.concatenate([np.full(n, part.block is not None) for n, part in zip(sizes, parts)])
    first = np.zeros(len(tokens), dtype=bool)
    first[np.cumsum([0, *sizes[:-1]])] = True
    cut = first | ~in_block | (pos != np.roll(pos, 1))
    flags = np.ones(len(tokens), dtype=np.int8)

    total, row_bytes = len(tokens), owner._row_bytes
    out = torch.empty((total, owner.vocab_size), dtype=torch.float32)  # (rows, V) in batch order
    done = 0
    try:
        while done < total:
            m = min(owner._rows.size, total - done)
            while done + m < total and m > 1 and not cut[done + m]:
                m -= 1
            batch = llama_cpp.llama_batch()
            batch.n_tokens = m
            batch.token = tokens[done:].ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
            batch.embd = None
            batch.pos = pos[done:].ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
            batch.n_seq_id = counts[done:].ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            batch.seq_id = ctypes.cast(
                pointers[done:].ctypes.data, ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id))
            )
            batch.logits = flags[done:].ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
            rc = llama_cpp.llama_decode(owner._ctx, batch)
            if rc != 0:
                for part in parts:  # a block's cells go with its ids; a chain's are cut below
                    if part.block is not None:
                        _drop(owner, part.block)
                owner._decode_failed(rc, [(part.s, part.start) for part in parts], tokens.tolist())
            ctypes.memmove(out.data_ptr() + done * row_bytes, llama_cpp.llama_get_logits(owner._ctx), m * row_bytes)
            done += m
    except BaseException:
        for part in parts:
            if part.block is not None and part.block.ids:
                _drop(owner, part.block)
        raise

    results = []
    for part, piece, rows in zip(parts, pieces, out.split(sizes)):
        order = piece[3]
        if part.block is not None and not (order == np.arange(len(order))).all():
            back = torch.empty_like(rows)
            back[torch.from_numpy(order)] = rows
            rows = back
        part.s.tokens.extend(part.tokens)
        part.s._block = part.block
        results.append(rows)
    if not all(finite_rows(rows) for rows in results):
        for part in parts:
            part.s.rollback(part.start)
        raise owner.corrupt_error()
    return results


def keep_nodes(owner: LlamaCppBackend, s: Backend, nodes: list[int]) -> None:
    """TreeForward.keep_nodes: keep a path of the last forward_tree's nodes."""
    block = s._block
    if block is None or block.parents is None:
        raise RuntimeError("keep_nodes() needs a forward_tree() call first (and nothing in between)")
    nodes = [int(i) for i in nodes]
    expected_parent = -1
    for node in nodes:
        if not 0 <= node < len(block.parents) or block.parents[node] != expected_parent:
            raise ValueError(f"nodes {nodes} are not a path down from a depth-1 node of the tree")
        expected_parent = node
    keep_rows(owner, s, nodes)


def keep_rows(owner: LlamaCppBackend, s: Backend, rows: list[int]) -> None:
    """TreeForward.keep_rows: keep rows (increasing, at offsets 0, 1, 2...) after the cache, drop the rest."""
    block = s._block
    if block is None:
        raise RuntimeError("keep_rows() needs a forward_masked() or forward_tree() call first")
    rows = [int(i) for i in rows]
    n = len(block.offsets)
    if any(not 0 <= r < n for r in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
        raise ValueError(f"rows {rows} are not increasing indices of the {n} tokens of the last call")
    _keep(owner, s, block, rows)
    new = s.tokens[block.base :]
    s.tokens[block.base :] = [new[r] for r in rows]


def _keep(owner: LlamaCppBackend, s: Backend, block: Block, rows: list[int]) -> None:
    """Give `rows`' cells the sequence's id (module docstring), then drop the block's ids."""
    if [int(block.offsets[r]) for r in rows] != list(range(len(rows))):
        raise ValueError(
            f"rows {rows} sit at offsets {[int(block.offsets[r]) for r in rows]}; llama.cpp keeps a cell at "
            "its position, so the kept rows must sit at offsets 0, 1, 2..."
        )
    groups, mem, seq, base = block.groups, owner._mem, _seq(s), block.base
    if rows and set(np.flatnonzero(block.mask[rows[-1]]).tolist()) == set(rows):
        # the last row's group holds exactly the kept rows up to its position: one copy
        llama_cpp.llama_memory_seq_cp(mem, block.ids[groups.query[rows[-1]]], seq, base, base + len(rows))
    else:  # row by row, from each row's own group, where no other row of it shares the position
        for r in rows:
            if (block.mask[r] & (block.offsets == block.offsets[r])).sum() != 1:
                raise ValueError(f"row {r} sees another row at its own offset; llama.cpp cannot keep one of them")
        for r in rows:
            p = base + int(block.offsets[r])
            llama_cpp.llama_memory_seq_cp(mem, block.ids[groups.query[r]], seq, p, p + 1)
    _drop(owner, block)
    s._block = None


def _drop(owner: LlamaCppBackend, block: Block) -> None:
    """Remove the block's temporary ids from every cell and give them back."""
    if owner._mem is not None:
        for tmp in block.ids:
            llama_cpp.llama_memory_seq_rm(owner._mem, tmp, -1, -1)
    owner._tree_ids.give(block.ids)
    block.ids = []


def settle(owner: LlamaCppBackend, s: Backend, length: int) -> bool:
    """Before a rollback of `s` to `length` while a block is held: keep the block's rows up to
    `length` (the first rows, where they sit at offsets 0, 1...) or drop it whole. True when the
    cache then holds `length` tokens, False when the rollback must still cut the sequence."""
    block = s._block
    if length > block.base:
        try:
            _keep(owner, s, block, list(range(length - block.base)))
            return True
        except ValueError:  # those rows were not a chain from offset 0: the whole block goes
            _drop(owner, block)
            s._block = None
            del s.tokens[block.base :]
            raise
    _drop(owner, block)
    s._block = None
    return False
