"""`EngineClient`: a SpecDeck engine server, used as the in-process `Engine` is used.

    client = EngineClient("http://127.0.0.1:8000", api_key=None)
    pair = client.load(EngineConfig(target="default"), progress=print)
    result = client.generate([{"role": "user", "content": "Hi"}], SamplingConfig(max_tokens=64),
                             on_steps=lambda steps: print("".join(step.text for step in steps), end=""))

Steps arrive as the engine records them and come back as the same `StepEvent`s
(`wire`: the run each belongs to, the drafter's statistics and the cost model
included), handed on in the batches the server sent them in (ten a second, four
where the engine decodes on the CPU: engine/service/batches.py); the reply is
collected from them as `Engine.generate` collects it.
Errors are the engine's own: a server's error names its class (`type`), and the
client raises that `SpecDeckError` subclass with the server's message. A server
that cannot be reached, or that goes away mid-reply, is `EngineUnavailable`.

Blocking, on the standard library's http.client: it runs on a worker thread (the
app) or the main one (the CLI), and imports nothing heavy. Cancelling: set the
`cancel` event a call was given; the server is asked to stop the job, and the
stream ends with the engine's last, "cancelled" step, as in process.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from engine import errors
from engine.backends.info import ModelInfo
from engine.config import EngineConfig
from engine.core.costs import CostSnapshot
from engine.core.events import Comparison, GenerationResult, StepEvent
from engine.core.sampling_config import SamplingConfig
from engine.errors import SpecDeckError
from engine.remote.http import CONNECT_TIMEOUT_S, open_connection, parse_address, sse_payloads
from engine.service import wire
from engine.service.host import JOB_HEADER

StepsCallback = Callable[[list[StepEvent]], None]  # a batch of steps, in order, as the server sent it
CANCEL_RETRY_S = 0.05  # asking the server to cancel a job it has not begun yet, again
DONE_CHECK_S = 1.0  # how long a cancel watcher outlives its stream, at most
PREFLIGHT_TIMEOUT_S = 120.0  # the first check imports torch and llama.cpp in the server


class EngineUnavailable(SpecDeckError):
    """The server cannot be reached, or stopped answering."""


@dataclass(frozen=True)
class LoadedPair:
    """What a server says about the pair it has loaded."""

    config: EngineConfig
    target: ModelInfo
    n_ctx: int
    speculative: bool  # there is a drafter
    notes: tuple[str, ...]  # Engine.notes: e.g. a tree drafter cut to one branch on llama.cpp
    costs: CostSnapshot  # the cost model as measured at load

    @classmethod
    def from_dict(cls, data: dict) -> LoadedPair:
        return cls(
            EngineConfig.from_dict(data["config"]),
            wire.model_info_from_dict(data["target"]),
            int(data["n_ctx"]),
            bool(data["speculative"]),
            tuple(data["notes"]),
            wire.costs_from_dict(data["costs"]),
        )


class EngineClient:
    def __init__(self, url: str, api_key: str | None = None) -> None:
        self._address = address = parse_address(url)
        self.url, self._base = address.url, address.base
        self._headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    # -- the engine's calls -----------------------------------------------------------------

    def health(self, timeout: float = 5.0) -> dict:
        return self.request("GET", "/health", timeout=timeout)

    def loaded(self) -> LoadedPair | None:
        data = self.request("GET", "/specdeck/info")
        if data.get("wire_version") != wire.WIRE_VERSION:
            raise EngineUnavailable(
                f"The server at {self.url} speaks wire version {data.get('wire_version')}, this "
                f"SpecDeck {wire.WIRE_VERSION}: run the same SpecDeck version on both."
            )
        return None if data.get("loaded") is None else LoadedPair.from_dict(data["loaded"])

    def load(self, config: EngineConfig, progress: Callable[[str, float], None] | None = None) -> LoadedPair:
        for item in self.stream("/specdeck/load", {"config": config.to_dict()}):
            if "progress" in item and progress is not None:
                progress(item["progress"]["message"], float(item["progress"]["fraction"]))
            elif "loaded" in item:
                return LoadedPair.from_dict(item["loaded"])
        raise EngineUnavailable(f"The server at {self.url} ended the load without saying whether it worked.")

    def unload(self) -> None:
        self.request("POST", "/specdeck/unload", {})

    def generate(
        self,
        messages: list[dict],
        sampling: SamplingConfig,
        *,
        speculative: bool | None = None,
        cancel: threading.Event | None = None,
        on_steps: StepsCallback | None = None,
    ) -> GenerationResult:
        """One reply, as `Engine.generate`; `speculative` None: as the loaded pair decodes."""
        body = {"messages": messages, "sampling": wire.sampling_to_dict(sampling), "speculative": speculative}
        steps, _ = self._run("/specdeck/generate", body, cancel, on_steps)
        return wire.result_from_steps(steps)

    def compare(
        self,
        messages: list[dict],
        sampling: SamplingConfig,
        *,
        cancel: threading.Event | None = None,
        on_steps: StepsCallback | None = None,
    ) -> Comparison:
        """Vanilla, then speculative decoding of the same input, as `Engine.compare`."""
        body = {"messages": messages, "sampling": wire.sampling_to_dict(sampling)}
        steps, end = self._run("/specdeck/compare", body, cancel, on_steps)
        if end is None:
            raise EngineUnavailable(f"The server at {self.url} ended the comparison before its result.")
        runs: dict[str, list[StepEvent]] = {"vanilla": [], "speculative": []}
        for step in steps:
            runs[step.run].append(step)
        return wire.comparison_from_runs(runs["vanilla"], runs["speculative"], end["divergence"])

    def _run(
        self, path: str, body: dict, cancel: threading.Event | None, on_steps: StepsCallback | None
    ) -> tuple[list[StepEvent], dict | None]:
        """A reply's or a comparison's steps, each batch handed to `on_steps` as it arrived, and the
        comparison's last item ({"divergence"}; None for a reply)."""
        steps: list[StepEvent] = []
        for item in self.stream(path, body, cancel=cancel):
            if "divergence" in item:
                return steps, item
            batch = [wire.step_from_dict(step) for step in item["steps"]]
            steps.extend(batch)
            if on_steps is not None:
                on_steps(batch)
        return steps, None

    def preflight(self, config: EngineConfig, timeout: float = PREFLIGHT_TIMEOUT_S):
        """`engine.preflight(config)` in the server's process (its files, its devices) -> Preflight.
        It reads metadata only and does not wait for a running job; the first one imports what the
        check needs there (torch, llama.cpp), hence the generous timeout."""
        from engine.preflight import Preflight

        return Preflight.from_dict(
            self.request("POST", "/specdeck/preflight", {"config": config.to_dict()}, timeout=timeout)
        )

    def close(self) -> None:
        """Nothing to stop: a SpecDeck server starts nothing for its clients (as RemoteEngine.close)."""

    def cancel(self, job: str | None = None) -> bool:
        """Stop job `job` (a stream's; default: whatever runs on the server) at its next step."""
        body = {} if job is None else {"job": job}
        return bool(self.request("POST", "/specdeck/cancel", body, timeout=CONNECT_TIMEOUT_S).get("cancelled"))

    # -- long jobs: benchmark, auto-tune, training (engine/service/routes_jobs.py) ----------------
    # On the loaded pair's config a benchmark or auto-tune uses the server's engine, which stays
    # loaded; on any other config, and for a training, the server frees its engine first and
    # `on_unloaded(freed_config)` is called before anything else: load the pair again afterwards.

    def bench(
        self,
        config: EngineConfig,
        prompts,
        settings,
        *,
        prompts_source: str | None = None,
        progress: Callable[[str, float], None] | None = None,
        cancel: threading.Event | None = None,
        on_unloaded: Callable[[EngineConfig], None] | None = None,
        on_row=None,
    ):
        """`run_benchmark` on the server: `prompts` (BenchPrompt), `settings` (BenchSettings) ->
        BenchReport; `progress(message, fraction)` and `on_row(PromptSummary)` as run_benchmark's.
        Raises BenchmarkCancelled when `cancel` stops it."""
        from engine.bench.results import BenchReport, PromptSummary, progress_from_dict

        def report(data: dict) -> None:
            if data.get("row") is not None:  # a row just measured, on its progress item
                if on_row is not None:
                    on_row(PromptSummary.from_dict(data["row"]))
            elif progress is not None:
                progress(*progress_from_dict(data))

        body = {
            "config": config.to_dict(),
            "prompts": [p.to_dict() for p in prompts],
            "settings": settings.to_dict(),
            "prompts_source": prompts_source,
        }
        item = self._job("/specdeck/bench", body, "report", report, cancel, on_unloaded, "the benchmark")
        return BenchReport.from_dict(item)

    def autotune(
        self,
        config: EngineConfig,
        prompts,
        settings,
        *,
        candidates=None,
        progress: Callable[[str, float], None] | None = None,
        cancel: threading.Event | None = None,
        on_unloaded: Callable[[EngineConfig], None] | None = None,
    ):
        """`run_autotune` on the server: `settings` (AutotuneSettings), `candidates` (Candidate;
        None: every drafter the target allows) -> AutotuneResult. Raises BenchmarkCancelled."""
        from engine.bench.autotune_results import AutotuneResult

        body = {
            "config": config.to_dict(),
            "prompts": [p.to_dict() for p in prompts],
            "settings": settings.to_dict(),
            "candidates": None if candidates is None else [c.to_dict() for c in candidates],
        }
        item = self._job(
            "/specdeck/autotune", body, "result", self._bench_progress(progress), cancel, on_unloaded, "auto-tune"
        )
        return AutotuneResult.from_dict(item)

    def load_sweep(
        self,
        prompts,
        settings,
        *,
        progress: Callable[[str, float], None] | None = None,
        cancel: threading.Event | None = None,
    ):
        """The load test (engine/bench/load_sweep.py `run_load_sweep`) on the server's loaded pair ->
        LoadSweep (engine/bench/load_results.py: the points, predictions, break-evens, memory and the
        failure-mode sentence the Load view draws).

        `prompts`: BenchPrompt records (each runs its first turn; the shipped set is
        `load_prompts(default_prompts_path())`). `settings`: a LoadSettings (engine/bench/load_settings.py):
        `batches`, the B to sweep (requests in flight at once, 1 to 256); `contexts`, prompt lengths in
        tokens to pad to (empty: the prompts as they are); `k`, the fixed-k mode's draft length (0: no
        fixed-k mode); `auto`, whether to run automatic k; `max_tokens` per reply; `repeat`, runs per point;
        `warmup`; `requests` per run (0: max(prompts, 2 B)); `temperature` (0: greedy); and
        `memory_budget_bytes` for the draft's memory (0: what the server's machine has available).
        A pair loaded for fewer sequences than max(batches) is reloaded with parallel = max(batches) for
        the sweep and loaded back as it was afterwards; the app need not reload it.
        `progress(message, fraction)` as run_benchmark's. Raises BenchmarkCancelled when `cancel` is set
        (the server stops between steps), ConfigError for settings no sweep can run or when no pair is
        loaded, EngineUnavailable when the server goes away."""
        from engine.bench.load_results import LoadSweep

        body = {"prompts": [p.to_dict() for p in prompts], "settings": settings.to_dict()}
        item = self._job(
            "/specdeck/load-sweep", body, "sweep", self._bench_progress(progress), cancel, None, "the load test"
        )
        return LoadSweep.from_dict(item)

    def train(
        self,
        options: dict,
        *,
        resume: bool,
        command: str | None = None,
        progress=None,
        cancel: threading.Event | None = None,
        on_unloaded: Callable[[EngineConfig], None] | None = None,
    ):
        """`train_heads(**options, resume=, command=)` on the server (paths are the server's) ->
        TrainResult; `progress(TrainProgress)` as train_heads'. A cancelled run returns its result
        (`cancelled` True, a checkpoint saved), as in process."""
        from engine.training.records import TrainProgress, TrainResult

        def report(data: dict) -> None:
            if progress is not None:
                progress(TrainProgress.from_dict(data))

        body = {"options": options, "resume": resume, "command": command}
        return TrainResult.from_dict(
            self._job("/specdeck/train", body, "result", report, cancel, on_unloaded, "the training")
        )

    def checkpoint(self, out_dir: str):
        """(CheckpointInfo | None, history) of the training run saved in `out_dir` on the server: what
        `checkpoint_info(out_dir)` and `load_checkpoint_state(out_dir)["history"]` give in process
        (history: {"loss": [...], "head_loss": [[...]...], "head_accuracy": [[...]...]}, {} without a run)."""
        from engine.training.records import CheckpointInfo

        data = self.request("POST", "/specdeck/checkpoint", {"out_dir": str(out_dir)}, timeout=120.0)
        info = None if data.get("info") is None else CheckpointInfo.from_dict(data["info"])
        return info, dict(data.get("history") or {})

    @staticmethod
    def _bench_progress(progress: Callable[[str, float], None] | None) -> Callable[[dict], None] | None:
        """A benchmark's {"message", "fraction"} as run_benchmark's progress(message, fraction)."""
        if progress is None:
            return None
        from engine.bench.results import progress_from_dict

        return lambda data: progress(*progress_from_dict(data))

    def _job(
        self,
        path: str,
        body: dict,
        key: str,
        progress: Callable[[dict], None] | None,
        cancel: threading.Event | None,
        on_unloaded: Callable[[EngineConfig], None] | None,
        what: str,
    ) -> dict:
        """A job's `key` item; {"cancelled": true} raises BenchmarkCancelled. The stream is read to its
        end mark, which the server sends once the engine is free: a next request finds it idle."""
        outcome: dict = {}
        for item in self.stream(path, body, cancel=cancel):
            if "progress" in item:
                if progress is not None:
                    progress(item["progress"])
            elif "unloaded" in item:
                if on_unloaded is not None:
                    on_unloaded(EngineConfig.from_dict(item["unloaded"]))
            elif item.get("cancelled") is True or key in item:
                outcome = item
        if outcome.get("cancelled") is True:
            from engine.bench.results import BenchmarkCancelled

            raise BenchmarkCancelled(f"{what[0].upper()}{what[1:]} was cancelled.")
        if key not in outcome:
            raise EngineUnavailable(f"The server at {self.url} ended {what} without its result.")
        return outcome[key]

    # -- HTTP -------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = 30.0) -> dict:
        connection = self._open(timeout)
        try:
            response = self._send(connection, method, path, body)
            data = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise self._unavailable(error) from error
        finally:
            connection.close()
        return _json(data, self.url)

    def stream(self, path: str, body: Any, cancel: threading.Event | None = None) -> Iterator[dict]:
        """The server-sent events of POST `path`, each a dict; an `{"error"}` item is raised."""
        connection = self._open(None)  # a load or a long reply may take minutes between two items
        done = threading.Event()
        job = secrets.token_hex(8)  # names this job for the cancel, which then stops no one else's
        if cancel is not None:
            threading.Thread(
                target=self._cancel_when_set, args=(cancel, done, job), daemon=True, name="specdeck-cancel-watch"
            ).start()
        try:
            response = self._send(connection, "POST", path, body, {JOB_HEADER: job})
            for data in sse_payloads(response):
                if data == "[DONE]":
                    return
                item = wire.loads(data)
                if "error" in item:
                    raise _engine_error(item["error"])
                yield item
            raise EngineUnavailable(
                f"The engine at {self.url} stopped in the middle of its answer (the stream "
                "ended without its end mark): the server stopped or was stopped."
            )
        except (OSError, http.client.HTTPException) as error:
            raise self._unavailable(error, mid_stream=True) from error
        finally:
            done.set()
            connection.close()

    def _cancel_when_set(self, cancel: threading.Event, done: threading.Event, job: str) -> None:
        # `cancel.wait` returns the moment Stop sets it, whatever its timeout: the timeout only
        # says how soon a watcher whose stream has ended notices. A short one woke the app's
        # process 20 times a second while a reply streamed, each time taking a core from the
        # engine for a moment.
        while not done.is_set():
            if cancel.wait(DONE_CHECK_S):
                # Until the server has begun the request it knows no such job (False): ask again.
                while not done.is_set():
                    try:
                        if self.cancel(job):
                            return
                    except SpecDeckError:
                        return  # the server is gone: the stream says so
                    done.wait(CANCEL_RETRY_S)
                return

    def _open(self, timeout: float | None) -> http.client.HTTPConnection:
        try:
            return open_connection(self._address, timeout)
        except OSError as error:
            raise self._unavailable(error) from error

    def _send(
        self, connection, method: str, path: str, body: Any, headers: dict | None = None
    ) -> http.client.HTTPResponse:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, self._base + path, body=payload, headers={**self._headers, **(headers or {})})
        response = connection.getresponse()
        if response.status >= 400:
            data = response.read()
            try:
                error = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                error = {
                    "message": f"The server at {self.url} answered {response.status} {response.reason}.",
                    "type": "http_error",
                }
            raise _engine_error(error)
        return response

    def _unavailable(self, error: BaseException, mid_stream: bool = False) -> EngineUnavailable:
        if isinstance(error, ConnectionRefusedError):
            return EngineUnavailable(
                f"Nothing answers at {self.url} (connection refused): start the server, or check the address and port."
            )
        if isinstance(error, socket.timeout):
            return EngineUnavailable(f"The server at {self.url} did not answer in time.")
        if mid_stream:
            return EngineUnavailable(
                f"The connection to the engine at {self.url} broke off ({_reason(error)}): "
                "the server stopped or was stopped."
            )
        return EngineUnavailable(f"Cannot reach the server at {self.url} ({_reason(error)}).")


def _engine_error(error: dict) -> SpecDeckError:
    """The server's error as the engine's own exception class when it names one, else SpecDeckError."""
    kind = getattr(errors, str(error.get("specdeck_type")), None)
    message = str(error.get("message") or "The server reported an error without a message.")
    if isinstance(kind, type) and issubclass(kind, SpecDeckError):
        return kind(message)
    if error.get("type") == "server_busy":
        return EngineUnavailable(message)
    return SpecDeckError(message)


def _json(data: bytes, url: str) -> dict:
    try:
        return json.loads(data)
    except ValueError as error:
        raise EngineUnavailable(f"The server at {url} did not answer with JSON: is it a SpecDeck server?") from error


def _reason(error: BaseException) -> str:
    return str(error) or type(error).__name__
