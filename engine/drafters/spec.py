"""A drafter's registry entry, `DrafterSpec`, and what its `make` gets besides the target and the
options (`Load`).

A leaf, below the registry (registry.py: the list of entries, found by scanning for spec modules)
and chain_spec.py (which makes a chain's entry from its members' and which the registry asks about
chains): when these lived in registry.py, the two imported each other (issue 37, part 5).
registry.py re-exports both, as spec modules import them from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.drafters.options import NoStats

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.drafters.base import Drafter
    from engine.models.doctor import Finding
    from engine.preflight import PreflightContext


@dataclass(frozen=True)
class Load:
    """What `make` gets besides the target and the options: the target's load options (a draft
    model follows them where its own are unset) and the progress of a draft model's load."""

    target_options: dict
    progress: Callable[[str, float], None] | None = None


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the CLI's and the config's value: "eagle"
    label: str  # for people: "EAGLE head"
    summary: str  # one sentence, for the pair dialog
    options: type  # a frozen dataclass of `setting` fields; its defaults are the drafter's defaults
    make: Callable[[Backend, Any, Load], Drafter | None]
    needs: tuple[type, ...] = ()  # capability protocols of engine/backends/capabilities.py
    preflight: Callable[[PreflightContext, Any], list[Finding]] | None = None  # metadata-only checks
    stats: type = NoStats  # the DrafterStats subclass its Drafter.stats() returns
    loads_model: bool = False  # loads a model of its own (the draft model): a share of the load's progress
    # Reads weights of its own from files (trained heads, the model's MTP layers, a Gemma 4 assistant):
    # like a draft model, too slow to load for one generation, and never loaded because a request asks.
    reads_weights: bool = False
    torch_reason: str = ""  # why the target must run on PyTorch, one sentence (a spec with `needs`)
    choice_label: str = ""  # how the pair dialog lists it, where that says more than `label` ("" = label)
    trees: bool = False  # drafts trees where the target verifies them (`node_budget`): k is then a node budget
    draft_probabilities: bool = False  # its drafts carry the drafter's probabilities q (a request's p_min applies)
    order: int = 1000  # where lists put it (lower first; equal orders by name): a new drafter comes last
    short_name: str = ""  # what the status bar calls it once loaded ("n-gram drafter"; "" = label)
    depth_label: str = ""  # what the charts' per-depth acceptance bars count: "head", "depth" or "position"
    #                        ("" = "depth" for a drafter of trees, else "position")
    # Whether a loaded target can serve it with these options and nothing more (heads on disk, the
    # model's own MTP layers, a loaded draft model), besides `needs`: auto-tune's candidates. None: always.
    ready: Callable[[Backend, Any], bool] | None = None
    default_on: tuple[str, ...] = ()  # the backends where it is the default drafter (measured fastest there)

    @property
    def needs_torch(self) -> bool:
        """Whether the target must run on the PyTorch backend: it needs what llama.cpp does not offer."""
        from engine.backends.capabilities import ON_LLAMA_CPP

        return any(need not in ON_LLAMA_CPP for need in self.needs)

    def trees_on(self, backend: str) -> bool:
        """Whether it drafts trees on a target of `backend` (see `node_budget`)."""
        from engine.backends.capabilities import ON_LLAMA_CPP, TreeForward

        return self.trees and (backend == "torch" or TreeForward in ON_LLAMA_CPP)

    @property
    def short(self) -> str:
        """Its name in a sentence about what is loaded: `short_name`, else `label`."""
        return self.short_name or self.label

    @property
    def depth_unit(self) -> str:
        """What one bar of the per-depth acceptance counts: "head", "depth" or "position"."""
        return self.depth_label or ("depth" if self.trees else "position")

    def can_serve(self, target: Backend, options: Any = None) -> bool:
        """Whether the loaded `target` has every capability it needs and, with `options` (None: its
        defaults), whatever else `ready` asks: what auto-tune tries."""
        from engine.backends.capabilities import has

        if not all(has(target, need) for need in self.needs):
            return False
        return self.ready is None or bool(self.ready(target, self.options() if options is None else options))
