"""The long jobs on a server: benchmark, auto-tune, training, and reading a saved training run.

    POST /specdeck/bench       {"config", "prompts": [BenchPrompt.to_dict()], "settings": BenchSettings.to_dict(),
                                "prompts_source"?} -> stream of {"unloaded"}?, {"progress": {"message", "row"?,
                                "fraction"}}..., then {"report": BenchReport.to_dict()} or {"cancelled": true}
    POST /specdeck/autotune    {"config", "prompts", "settings": AutotuneSettings.to_dict(), "candidates"?:
                                [Candidate.to_dict()]} -> the same, ending {"result": AutotuneResult.to_dict()}
                                or {"cancelled": true}
    POST /specdeck/load-sweep  {"prompts", "settings": LoadSettings.to_dict()} -> stream of {"progress"}..., then
                                {"sweep": LoadSweep.to_dict()} or {"cancelled": true}, and {"reloaded"} last when
                                the pair was reloaded for the sweep
    POST /specdeck/train       {"options": train_heads' keyword options, "resume", "command"?} -> stream of
                                {"unloaded"}?, {"progress": TrainProgress.to_dict()}..., then {"result":
                                TrainResult.to_dict()} (a cancelled run too, its "cancelled" true, as in process)
    POST /specdeck/checkpoint  {"out_dir"} -> {"info": CheckpointInfo.to_dict() | null, "history": {"loss", ...} | {}}

Each job runs through the host, one at a time with loads and generations, and
stops at its next step when its cancel event is set (POST /specdeck/cancel, or
the client going away). Which engine it uses is the desktop app's rule for its
own dialogs: a benchmark or auto-tune of the config the server has loaded uses
the loaded engine, which stays loaded. For any other config, and for training
(which loads its own target), the server first frees its engine, so that a
machine never holds two copies of the models, and says so before anything else,
`{"unloaded": <the freed EngineConfig.to_dict()>}`. When the job ends, however it
ends, the server loads that pair again and says so last, `{"reloaded": "<a
sentence>"}`: a benchmark or a training run by one client never leaves the
others without a model. (Not the app's own engine, `Host.reload_after_jobs`
False: its one client loads its pair again when its dialog is done.) Requests are checked before that (a bad one is a 400; a
target that cannot be found is said before anything is freed), so a mistake never
costs the loaded pair.

The load test (engine/bench/load_sweep.py) runs on the loaded pair, with B requests in
flight at once; a pair loaded for fewer sequences than the largest B is loaded again
with parallel = that B for the sweep (its batch sizes and memory checked first, so a
request that cannot run costs nothing), and loaded back as it was afterwards, however
the sweep ended, which the stream's last item says (`{"reloaded": "<a sentence>"}`):
for every client, the app's own engine included, since the sweep changed the pair.

Paths are on the server's machine, and each is asked of the server's path policy
(engine/service/paths.py) before anything runs: a benchmark's llama-server is the
server's own, never the request's; for `specdeck-cli serve` a training's `out_dir`
and a checkpoint's are run names in the server's train folder, its data is under
the server's data folder, and models are those the server may read. The desktop
app's own engine process takes its one client's paths as given.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from engine.bench.autotune_results import AutotuneSettings, Candidate
from engine.bench.load_settings import LoadSettings
from engine.bench.prompts import BenchPrompt
from engine.bench.results import BenchmarkCancelled, BenchSettings, plain, progress_to_dict
from engine.config import EngineConfig
from engine.errors import ConfigError, SpecDeckError
from engine.service.errors import BadRequest
from engine.service.host import Host
from engine.service.http import event_stream
from engine.service.limits import limits_of
from engine.service.paths import ServerPaths, paths_of
from engine.training.records import TrainSettings

router = APIRouter()
CANCELLED = {"cancelled": True}
# The training options a client may send: TrainSettings' fields (its `target` travels as
# `target_spec`) and the folder; resume and command travel beside them, progress and cancel are the server's.
TRAIN_OPTIONS = frozenset({f.name for f in fields(TrainSettings)} - {"target"} | {"target_spec", "out_dir"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BenchRequest(_Strict):
    config: dict[str, Any]
    prompts: list[dict[str, Any]]
    settings: dict[str, Any] = {}
    prompts_source: str | None = None  # what the report names as its prompts file


class AutotuneRequest(_Strict):
    config: dict[str, Any]
    prompts: list[dict[str, Any]]
    settings: dict[str, Any] = {}
    candidates: list[dict[str, Any]] | None = None  # None: every drafter the target allows


class LoadSweepRequest(_Strict):
    prompts: list[dict[str, Any]]
    settings: dict[str, Any] = {}  # LoadSettings.to_dict(); missing keys keep their defaults


class TrainRequest(_Strict):
    options: dict[str, Any]
    resume: bool = True  # train_heads' default: continue the run saved in out_dir
    command: str | None = None  # the command line recorded in the heads' config (the app's equivalent)


class CheckpointRequest(_Strict):
    out_dir: str  # for specdeck-cli serve, a run name (paths.py)


def _host(request: Request) -> Host:
    return request.app.state.host


@router.post("/specdeck/bench")
async def bench(body: BenchRequest, request: Request):
    paths = paths_of(request)
    config, prompts = paths.check_config(EngineConfig.from_dict(body.config)), _prompts(body.prompts, "The benchmark")
    settings = paths.bench_settings(_record(BenchSettings.from_dict, body.settings, "benchmark settings"))
    host = _host(request)

    def job(cancel, emit) -> None:
        from engine.bench.runner import run_benchmark  # loads torch: only when a benchmark is asked for

        last = ["", 0.0]  # the last progress: a row rides on it (its message and fraction again)

        def progress(message: str, fraction: float) -> None:
            last[:] = [message, fraction]
            emit({"progress": progress_to_dict(message, fraction)})

        def on_row(row) -> None:
            emit({"progress": progress_to_dict(*last, row=row)})

        with _engine_for(host, config, emit) as engine:
            try:
                report = run_benchmark(
                    config,
                    prompts,
                    settings,
                    engine=engine,
                    cancel=cancel,
                    prompts_source=body.prompts_source or "",
                    progress=progress,
                    on_row=on_row,
                )
            except BenchmarkCancelled:
                emit(CANCELLED)
                return
            emit({"report": report.to_dict()})

    return await event_stream(host.run("bench", job, request))


@router.post("/specdeck/autotune")
async def autotune(body: AutotuneRequest, request: Request):
    config = paths_of(request).check_config(EngineConfig.from_dict(body.config))
    prompts = _prompts(body.prompts, "Auto-tune")
    settings = _record(AutotuneSettings.from_dict, body.settings, "auto-tune settings")
    candidates = None
    if body.candidates is not None:
        candidates = tuple(_record(Candidate.from_dict, c, "candidate") for c in body.candidates)
    host = _host(request)

    def job(cancel, emit) -> None:
        from engine.bench.autotune import run_autotune  # loads torch

        with _engine_for(host, config, emit) as engine:
            try:
                result = run_autotune(
                    config,
                    prompts,
                    settings,
                    engine=engine,
                    candidates=candidates,
                    cancel=cancel,
                    progress=_progress(emit),
                )
            except BenchmarkCancelled:
                emit(CANCELLED)
                return
            emit({"result": result.to_dict()})

    return await event_stream(host.run("autotune", job, request))


@router.post("/specdeck/load-sweep")
async def load_sweep(body: LoadSweepRequest, request: Request):
    prompts = _prompts(body.prompts, "The load test")
    settings = _record(LoadSettings.from_dict, body.settings, "load test settings")
    settings.check()
    host = _host(request)

    def job(cancel, emit) -> None:
        from engine.bench.load_sweep import run_load_sweep  # loads torch

        with _parallel_for(host, settings, emit) as engine:
            try:
                sweep = run_load_sweep(engine, prompts, settings, cancel=cancel, progress=_progress(emit))
            except BenchmarkCancelled:
                emit(CANCELLED)
                return
            emit({"sweep": sweep.to_dict()})

    # A sweep is many generations: it holds the engine no longer than one generation may (--timeout).
    limit = limits_of(request).generation_timeout_s
    return await event_stream(host.run("load-sweep", job, request, time_limit_s=limit))


@router.post("/specdeck/train")
async def train(body: TrainRequest, request: Request):
    paths = paths_of(request)
    (settings, out_dir), command = _train_settings(body.options, paths), paths.command(body.command)
    host = _host(request)

    def job(cancel, emit) -> None:
        from engine.training.medusa import train_heads  # loads torch

        with _memory_for(host, emit):  # training loads its own target
            result = train_heads(
                settings,
                out_dir,
                resume=body.resume,
                command=command,
                cancel=cancel,
                progress=lambda event: emit({"progress": event.to_dict()}),
            )
            emit({"result": result.to_dict()})

    return await event_stream(host.run("train", job, request))


@router.post("/specdeck/checkpoint")
async def checkpoint(body: CheckpointRequest, request: Request) -> dict:
    """A file read, not a job: it needs no model, and answers while a generation runs."""
    return await asyncio.to_thread(_read_checkpoint, paths_of(request).run_dir(body.out_dir))


# -- the engine a job uses -----------------------------------------------------------------------


@contextlib.contextmanager
def _engine_for(host: Host, config: EngineConfig, emit):
    """The host's engine when it was loaded from `config` (it stays loaded); else None, with the
    host's pair freed for the job, which loads and closes its own (`_memory_for`)."""
    if host.engine is not None and host.engine.config == config:
        yield host.engine
        return
    from engine.api import load_summary

    load_summary(config)  # a target that cannot be found is said before the loaded pair is freed
    with _memory_for(host, emit):
        yield None


@contextlib.contextmanager
def _memory_for(host: Host, emit):
    """The host's pair freed while the job runs, and loaded again once it has ended, however it
    ended: a benchmark of another pair or a training never leaves the server's other clients
    without a model. Says both: `{"unloaded": config}` first, `{"reloaded": sentence}` last."""
    freed = host.free()
    if freed is not None:
        emit({"unloaded": freed.to_dict()})
    try:
        yield
    finally:
        if freed is not None and host.reload_after_jobs:
            emit({"reloaded": host.restore(freed)})


@contextlib.contextmanager
def _parallel_for(host: Host, settings: LoadSettings, emit):
    """The host's engine, holding the sweep's largest batch: as loaded when it holds that many
    sequences, else loaded again with parallel = that batch for the job and loaded back as it was
    after it, however it ended (`{"reloaded": sentence}` last)."""
    from engine.bench.load_predict import check_fits
    from engine.service.capacity import check_parallel

    if host.engine is None:
        raise ConfigError("No pair is loaded: load one (POST /specdeck/load), then run the load test on it.")
    config, most = host.engine.config, max(settings.batches)
    if config.parallel >= most:
        yield host.engine
        return
    wanted = dataclasses.replace(config, parallel=most)
    # Said before the loaded pair is touched. The memory is the server's own, as for serve --parallel:
    # a budget a request names only narrows it (else a client could claim a petabyte and load 256 caches).
    check_parallel(wanted)
    check_fits(wanted, settings)
    emit({"progress": progress_to_dict(f"Loading the pair for {most} sequences at once", 0.0)})
    host.replace(wanted)  # a load that fails loads the old pair again and says so
    try:
        yield host.engine
    finally:
        host.free()
        emit({"reloaded": host.restore(config)})


def _progress(emit) -> Callable[[str, float], None]:
    return lambda message, fraction: emit({"progress": progress_to_dict(message, fraction)})


# -- reading requests ----------------------------------------------------------------------------


def _record(from_dict, data, what: str):
    """`from_dict(data)`; a value of the wrong type is a 400 that names what it was for."""
    try:
        return from_dict(data)
    except SpecDeckError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise BadRequest(f"Bad {what}: {type(error).__name__}: {error}.") from error


def _prompts(data: list[dict], who: str) -> tuple[BenchPrompt, ...]:
    prompts = tuple(_record(BenchPrompt.from_dict, p, "prompt") for p in data)
    if not prompts:
        raise ConfigError(f"{who} needs at least one prompt.")
    return prompts


def _train_settings(options: dict[str, Any], paths: ServerPaths) -> tuple[TrainSettings, str]:
    """The client's training options as train_heads' (settings, output folder), with the server's
    folders (`paths`), checked as train_heads checks them (settings, data paths) before the job
    starts: a mistake must not free the loaded pair first."""
    unknown = sorted(set(options) - TRAIN_OPTIONS)
    if unknown:
        raise BadRequest(
            f"Unknown training option(s) {', '.join(map(repr, unknown))}; train_heads takes "
            f"{', '.join(sorted(TRAIN_OPTIONS))}."
        )
    missing = [name for name in ("target_spec", "out_dir") if not options.get(name)]
    if missing:
        raise BadRequest(f"The training options lack {' and '.join(map(repr, missing))}.")
    options = paths.train_options(options)
    data = options.get("data")
    sources = (data,) if isinstance(data, str) else tuple(data or ())
    values = {k: v for k, v in options.items() if k not in ("target_spec", "out_dir", "data")}
    settings = _record(
        TrainSettings.from_dict, {**values, "target": options["target_spec"], "data": sources}, "training options"
    )
    _record(lambda _: settings.check(), None, "training options")
    return settings, options["out_dir"]


def _read_checkpoint(out_dir) -> dict:
    from engine.training.checkpoint import checkpoint_info, load_state  # load torch (torch.load)

    info = checkpoint_info(out_dir)
    history: dict = {}
    if info is not None:
        try:
            history = plain(dict((load_state(out_dir) or {}).get("history", {})))
        except ConfigError:
            pass  # checkpoint_info read it a moment ago; a run that replaced it since has no history yet
    return {"info": None if info is None else info.to_dict(), "history": history}
