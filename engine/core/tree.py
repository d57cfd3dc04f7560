"""Token trees: the shape shared by tree drafters (Medusa, EAGLE) and the backends.

A tree of n draft nodes is given by `parents`: parents[i] is the index of node
i's parent (always < i), or -1 when node i follows the pending token directly.
A chain is the tree with parents[i] == i - 1. Node i sits at depth(i) (1 for a
child of the pending token) and, in a verification forward, attends to the
cached tokens, its ancestors and itself.
"""

from __future__ import annotations

import torch


def check_parents(parents: list[int] | tuple[int, ...]) -> None:
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: a parent must be -1 or an earlier node")


def depths(parents: list[int] | tuple[int, ...]) -> list[int]:
    """Depth of every node: 1 for a child of the root (the pending token)."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def path_to(parents: list[int] | tuple[int, ...], node: int) -> list[int]:
    """Node indices from depth 1 down to `node` (empty for node -1, the root)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def ancestor_mask(parents: list[int] | tuple[int, ...], device: str | torch.device = "cpu") -> torch.Tensor:
    """Bool (n, n): [i, j] is True when node j is node i or one of its ancestors."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask.to(device)
