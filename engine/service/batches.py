"""Steps on the wire in batches: one server-sent event every BATCH_S, not one per step.

Each event sent wakes the server's event loop (serialising, writing the socket) and
the client's reader (reading, parsing), and on a machine whose cores all decode,
each wake-up takes a core from the engine's threads for a moment. llama.cpp's
threads wait for each other at every barrier, so that moment stalls all of them:
on 2 cores, a reply streamed step by step to a client that only read it decoded clearly
slower than the same reply in process (docs/benchmarks.md, "Measurements behind the code"). A batch goes out as soon as BATCH_S
has passed since the last one, so a client still sees the reply grow about ten
times a second; the first step goes at once (the time to the first token is not
held back) and the last with the step that ends the run. Where the engine decodes
on the CPU (`batch_interval`), every batch is taken from the cores that decode, so
a batch goes every CPU_BATCH_S instead: a client sees the reply grow four times a
second, and the server's event loop and the client's reader wake 4 times a second,
not 10.

On the wire a batch is `{"steps": [step, ...]}`, each step the engine's record
(`wire.step_to_dict`). The client hands each batch on as it arrived
(`EngineClient.generate`'s `on_steps`): the desktop window gets its steps from its
reader thread on its GUI thread at the server's pace, with no second batching. Only
a foreign server (llama-server, vLLM, SGLang) that streams a chunk at a time is
batched again, with `Batches`, by its adapter (engine/remote/base.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

BATCH_S = 0.1
CPU_BATCH_S = 0.25  # where the engine decodes on this machine's CPU cores


def decodes_on_cpu(device: str) -> bool:
    """Whether a model on `device` (ModelInfo.device: "cpu", "cuda", "cpu+20 gpu layers"...) keeps
    CPU cores busy while it decodes: any of it on the CPU."""
    return device.startswith("cpu")


def batch_interval(device: str) -> float:
    """How often steps decoded on `device` go out: CPU_BATCH_S where the model decodes on the CPU,
    whose cores the sending takes from the decoding threads, else BATCH_S."""
    return CPU_BATCH_S if decodes_on_cpu(device) else BATCH_S


class Batches:
    """`send(item, last)` for each step, in a `with` block; `emit` gets each batch, a list of items.
    Whatever is held when the block ends, normally or by an error, is emitted then: nothing
    decoded is lost."""

    def __init__(self, emit: Callable[[Any], None], interval_s: float = BATCH_S, clock=time.monotonic) -> None:
        self._emit, self._interval_s, self._clock = emit, interval_s, clock
        self._held: list[Any] = []
        self._sent = float("-inf")  # the first step goes at once

    def __enter__(self) -> Callable[..., None]:
        return self.send

    def __exit__(self, *exc) -> None:
        self.flush()

    def send(self, item: Any, last: bool = False) -> None:
        self._held.append(item)
        if last or self._clock() - self._sent >= self._interval_s:
            self.flush()

    def flush(self) -> None:
        if self._held:
            batch, self._held = self._held, []
            self._emit(batch)
        self._sent = self._clock()
