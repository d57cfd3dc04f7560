"""Steps on their way from the engine's thread to the window: `Step`, and `StepBatches`.

The window does its work on steps (the store's write, the transcript's text, the
charts' bookkeeping) once per batch, not once per step: each of those has a cost
per call whatever its size (a database commit, a text layout), and every
millisecond the window spends is taken from the engine's cores
(docs/benchmarks.md, "The app against the CLI").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from app.runtime.costs import CostSnapshot
from engine import BATCH_S, CPU_BATCH_S, Batches, LoadedPair, StepEvent, decodes_on_cpu


def shares_cores(pair, own_engine: bool) -> bool:
    """Whether `pair` decodes on the cores the window runs on: the window's own engine (`own_engine`),
    on the CPU. There the engine takes every core, and its threads wait for each other at every
    barrier: each moment the window takes stalls them all, so the engine loses about twice the
    window's share. On a GPU, or on a server elsewhere, the window's moments cost the engine nothing."""
    return own_engine and isinstance(pair, LoadedPair) and decodes_on_cpu(pair.target.device)


def hand_over_s(pair, own_engine: bool) -> float:
    """How often steps reach the GUI thread while `pair` replies: CPU_BATCH_S where it `shares_cores`
    with the window (the pace its engine sends them at), else BATCH_S. Fewer, larger hand-overs
    cost the window a fifth less (one store write, one text insertion and layout each) and the
    reply 2% of its speed on 2 cores (docs/benchmarks.md, "Hand-overs four times a second"); the
    text still grows four times a second."""
    return CPU_BATCH_S if shares_cores(pair, own_engine) else BATCH_S


class Step(NamedTuple):
    """One decoding step as the window receives it."""

    label: str
    """The run it belongs to: "speculative" or "vanilla" (a comparison has both)."""

    event: StepEvent

    stats: dict | None
    """The drafter's statistics right after this step (None: a plain run, no drafter, a remote server)."""

    costs: CostSnapshot | None
    """The engine's cost model right after this step (None: a llama-server, vLLM or SGLang step)."""


class StepBatches:
    """The client's `on_step`, handing steps to the GUI thread in batches, at most every `interval_s`
    (`hand_over_s`).

    Each hand-over wakes the GUI thread, and each wake-up takes a core from the engine
    process for a moment: with llama.cpp's threads waiting for each other at every
    barrier, a reply at 80 steps a second woken step by step ran 10-20% slower than with
    the GUI asleep. Batched, the window still shows each step, 4 to 10 times a second.
    `Batches` holds them (engine/service/batches.py, as the engine's server sends them):
    the first step and the last step of a run go at once, and whatever is held when the
    job ends (an engine that died mid-reply) is handed over then: nothing received is
    lost. The cost model is frozen here (the charts compare snapshots).
    """

    def __init__(self, report: Callable[[list[Step]], None], interval_s: float = BATCH_S, clock=time.monotonic) -> None:
        self._batches = Batches(report, interval_s, clock)

    def __enter__(self) -> Callable[[str, Any, Any, Any], None]:
        return self.on_step

    def __exit__(self, *exc) -> None:
        self.flush()

    def on_step(self, label: str, event: StepEvent, drafter_stats: dict | None, costs) -> None:
        step = Step(label, event, drafter_stats, None if costs is None else CostSnapshot.of(costs))
        self._batches.send(step, last=event.finish_reason is not None)

    def flush(self) -> None:
        self._batches.flush()
