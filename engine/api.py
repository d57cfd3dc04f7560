"""`Engine`: a loaded target, an optional drafter and their measured costs.

This is what the CLI and the desktop app hold. Layers, as in mlx-lm:
`decode.decode_steps` yields steps -> `Engine.stream` adds the engine's drafter,
draft length and cost model -> `Engine.generate` collects a result ->
`Engine.compare` runs vanilla and speculative decoding on the same input.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Generator, Iterator

from engine.backends.base import Backend
from engine.batching import EngineBatch, check_batchable
from engine.config import EngineConfig, target_backend
from engine.core.decode import decode_steps, run_notes
from engine.core.divergence import first_divergence, rounding_bound
from engine.core.draft_length import CostModel, DraftLength, curve_sizes, measure_verify_curve
from engine.core.events import (  # noqa: F401 - re-exported
    SPECULATIVE,
    VANILLA,
    Comparison,
    Divergence,
    GenerationResult,
    StepEvent,
    collect,
)
from engine.core.sampling import SamplingConfig
from engine.core.text import check_messages
from engine.drafters.base import Drafter, drafter_stats, measured_token_cost, share_costs  # noqa: F401 - re-exported
from engine.drafters.registry import drafter_spec, make_drafter
from engine.errors import ConfigError, SpecDeckError
from engine.models.load_checks import check_load_options
from engine.models.load_options import target_load_options
from engine.models.loading import load_backend
from engine.models.locate import resolve
from engine.models.memory_errors import model_out_of_memory, out_of_memory, unexplained_allocation_failure

Progress = Callable[[str, float], None]  # (what is happening, fraction done)
log = logging.getLogger(__name__)


def _steady(report: Progress) -> Progress:
    """`report`, called only when the message changes or the fraction grows by a percent,
    and never with a smaller fraction than before (a reload restarts a backend's count)."""
    last = ["", -1.0]

    def steady(message: str, fraction: float) -> None:
        fraction = max(fraction, last[1], 0.0)
        if message == last[0] and fraction < min(last[1] + 0.01, 1.0):
            return
        last[:] = [message, fraction]
        report(message, fraction)

    return steady


def _part(report: Progress, whose: str, start: float, end: float) -> Progress:
    """A backend's own progress (0 to 1) as the stretch `start`..`end` of the whole load."""
    return lambda message, fraction: report(
        f"{whose}: {message[:1].lower()}{message[1:]}", start + (end - start) * fraction
    )


class Engine:
    def __init__(self, target: Backend, drafter: Drafter | None, config: EngineConfig, costs: CostModel) -> None:
        self.target = target
        self.drafter = drafter
        self.config = config
        self.costs = costs
        share_costs(drafter, costs)  # the one cost model: drafters that size themselves read it (ReadsCosts)
        DraftLength(config.k, config.k_max)  # validate k early, before any generation

    @classmethod
    def load(cls, config: EngineConfig, progress: Progress | None = None) -> Engine:
        report = _steady(progress or (lambda message, fraction: None))
        DraftLength(config.k, config.k_max)
        spec = drafter_spec(config.drafter)  # an unknown drafter, or options of another one: said before loading
        check_batchable(config.drafter, config.parallel)
        check_load_options(config, target_backend(config))
        options = target_load_options(config)
        report("Loading the target model", 0.0)
        target_share = 0.5 if spec.loads_model else 0.8  # a drafter without a model of its own loads in moments
        try:
            target = load_backend(
                config.target,
                backend=target_backend(config),
                **options,
                progress=_part(report, "Target", 0.0, target_share),
            )
        except Exception as error:
            if not unexplained_allocation_failure(error):
                raise
            raise out_of_memory(
                f"load {config.target}",
                path=config.target,
                backend=_chosen_backend(config),
                dtype=None if config.dtype == "auto" else config.dtype,
                device="this machine" if config.device == "auto" else config.device,
                n_ctx=config.n_ctx,
            ) from error
        try:
            report("Loading the drafter", target_share)
            draft_progress = _part(report, "Draft", target_share, 0.8) if spec.loads_model else None
            drafter = make_drafter(target, config, draft_progress)
            costs = CostModel()
            if config.measure_costs:
                report("Measuring the target's verify costs", 0.8)
                # up to the rows a full batch drafts: T(rows) is what automatic k weighs at every load
                costs.verify_s.update(measure_verify_curve(target, curve_sizes(config.parallel, config.k_max)))
                if drafter is not None:
                    costs.draft_s_per_token = measured_token_cost(drafter) or 0.0
        except BaseException as error:
            target.close()
            if unexplained_allocation_failure(error):
                doing = f"prepare the {config.drafter} drafter for {target.info.name}"
                raise model_out_of_memory(doing, target.info, target.n_ctx) from error
            raise
        report("Ready", 1.0)
        return cls(target, drafter, config, costs)

    @property
    def notes(self) -> tuple[str, ...]:
        """Sentences for the UI about this target/drafter pair (each run's RunStats.notes too),
        e.g. that a tree drafter's trees are cut to one branch on a chain-only backend."""
        return run_notes(self.target, self.drafter)

    @property
    def placement(self) -> tuple[str, ...]:
        """Where the layers of each loaded model went, where its backend says (llama.cpp's GPU
        layers; PyTorch on MPS): "SmolLM2-135M-Instruct: on the CPU: GPU offload is opt-in (...)"."""
        draft = getattr(self.drafter, "backend", None)  # the model drafter's draft model
        models = [self.target] + ([draft] if isinstance(draft, Backend) else [])
        return tuple(f"{m.info.name}: {m.info.placement}" for m in models if m.info.placement)

    def prompt_ids(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Token ids for a plain string (as a user message when `chat`) or a list of chat messages."""
        if isinstance(prompt, str):
            if not chat:
                return self.target.tokenize(prompt)
            prompt = [{"role": "user", "content": prompt}]
        return self.target.apply_chat_template(check_messages(prompt))

    def stream(
        self,
        prompt: list[int],
        sampling: SamplingConfig,
        *,
        speculative: bool = True,
        cancel: threading.Event | None = None,
        drafter: Drafter | None = None,
        draft_length: DraftLength | None = None,
        snapshots: bool = False,
    ) -> Iterator[StepEvent]:
        """The steps of one generation. `drafter` and `draft_length` replace the engine's own for
        this generation only (a server request's own drafter and limits); they need `speculative`.
        `snapshots`: each step says its run and carries the drafter's statistics and the cost model
        as they stood right after it, copied here between two steps, for a reader on another thread
        or in another process (a server's client); without, the steps cost nothing more."""
        drafter = (drafter or self.drafter) if speculative else None
        if speculative and drafter is None:
            raise ConfigError("No drafter is loaded: choose n-gram lookup or a draft model to decode speculatively.")
        if drafter is not None and draft_length is None:
            draft_length = DraftLength(self.config.k, self.config.k_max)
        steps = decode_steps(
            self.target,
            prompt,
            sampling,
            drafter=drafter,
            draft_length=draft_length,
            costs=self.costs,
            cancel=cancel,
        )
        if snapshots:
            steps = _recorded(steps, SPECULATIVE if speculative else VANILLA, drafter, self.costs)
        return _out_of_memory_said(steps, self.target)

    def generate(
        self,
        prompt: list[int],
        sampling: SamplingConfig,
        *,
        speculative: bool = True,
        cancel: threading.Event | None = None,
        on_event: Callable[[StepEvent], None] | None = None,
        snapshots: bool = False,
    ) -> GenerationResult:
        """One reply, its steps handed to `on_event` as they come (`snapshots`: as `stream`'s)."""
        events = []
        for event in self.stream(prompt, sampling, speculative=speculative, cancel=cancel, snapshots=snapshots):
            events.append(event)
            if on_event is not None:
                on_event(event)
        return collect(events)

    def compare(
        self,
        prompt: list[int],
        sampling: SamplingConfig,
        *,
        cancel: threading.Event | None = None,
        on_event: Callable[[str, StepEvent], None] | None = None,
        snapshots: bool = False,
    ) -> Comparison:
        """Vanilla, then speculative decoding, with the same sampling settings and seed;
        `on_event(run, step)` for each step (`snapshots`: as `stream`'s).

        Each run starts from empty caches and reads the prompt itself: the speculative run
        second would otherwise find the prompt in the cache the vanilla run filled, and show a
        prefill (and a time to first token) of nearly nothing, as if speculation removed it."""
        runs = {}
        for label, speculative in ((VANILLA, False), (SPECULATIVE, True)):
            self.clear_prompt_caches()
            callback = (lambda event, label=label: on_event(label, event)) if on_event else None
            runs[label] = self.generate(
                prompt, sampling, speculative=speculative, cancel=cancel, on_event=callback, snapshots=snapshots
            )
        divergence = None
        if sampling.greedy and runs["vanilla"].tokens != runs["speculative"].tokens:
            divergence = first_divergence(runs["speculative"], runs["vanilla"], rounding_bound(self.target.info))
        return Comparison(runs["vanilla"], runs["speculative"], divergence)

    def batch(self, capacity: int | None = None) -> EngineBatch:
        """Several generations decoded together, one target forward per step (engine/batching.py), up
        to `capacity` (default: the `parallel` the engine was loaded for) at once."""
        return EngineBatch(self, capacity)

    def clear_prompt_caches(self) -> None:
        """Empty the KV caches of the target and of every draft model: the next generation
        prefills its whole prompt, as the first one after loading does."""
        for backend in _backends(self.target, self.drafter):
            backend.rollback(0)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()


def load_summary(config: EngineConfig) -> str:
    """What `Engine.load(config)` is about to load, for a status line: "SmolLM2-135M-Instruct (llama.cpp)".
    Raises the load's own error for a target that cannot be found."""
    name = resolve(config.target).name
    draft = f" with draft {config.draft}" if config.draft else ""
    return f"{name} ({_chosen_backend(config)}){draft}"


def _chosen_backend(config: EngineConfig) -> str:
    """The backend load_backend picks for the target ("auto": llama.cpp for a GGUF file)."""
    backend = target_backend(config)
    if backend != "auto":
        return backend
    try:
        return "llama.cpp" if resolve(config.target).kind == "gguf" else "torch"
    except SpecDeckError:
        return "torch"


def _backends(target: Backend, drafter: Drafter | None) -> list[Backend]:
    """The target and the draft models behind `drafter` (a chain's members' too), each once."""
    found, drafters = [target], [drafter] if drafter is not None else []
    while drafters:
        current = drafters.pop()
        drafters.extend(member.drafter for member in getattr(current, "members", ()))
        backend = getattr(current, "backend", None)  # a draft model's own (ModelDrafter.backend)
        if isinstance(backend, Backend) and all(backend is not seen for seen in found):
            found.append(backend)
    return found


def _recorded(
    steps: Generator[StepEvent, None, None], run: str, drafter: Drafter | None, costs: CostModel
) -> Iterator[StepEvent]:
    """`steps`, each with its run and copies of the drafter's statistics and the cost model as they
    stand right after it (both change as decoding goes on; the copies never do). Closing it closes
    `steps` at once, whose own end rolls the caches back."""
    try:
        for step in steps:
            yield dataclasses.replace(step, run=run, drafter_stats=drafter_stats(drafter), costs=costs.snapshot())
    finally:
        steps.close()


def _out_of_memory_said(steps: Iterator[StepEvent], target: Backend) -> Iterator[StepEvent]:
    """`steps`, with a failed allocation anywhere in the loop (a drafter, sampling) said as
    OutOfMemoryError; the backends already say so for their own forwards."""
    try:
        yield from steps
    except Exception as error:
        if not unexplained_allocation_failure(error):
            raise
        doing = f"generate with {target.info.name}"
        raise model_out_of_memory(doing, target.info, target.n_ctx, "a shorter prompt") from error
