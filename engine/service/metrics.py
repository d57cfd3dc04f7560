"""`GET /metrics`: the server's counters in Prometheus' text format, with vLLM's names.

    specdeck:spec_decode_num_drafts_total                   steps that drafted
    specdeck:spec_decode_num_draft_tokens_total             draft tokens sent to the target
    specdeck:spec_decode_num_accepted_tokens_total          draft tokens it accepted
    specdeck:spec_decode_num_accepted_tokens_per_pos_total  accepted at draft position 0, 1, ... (label `position`)
    specdeck:prompt_tokens_total, specdeck:generation_tokens_total
    specdeck:request_success_total                          finished generations (label `finished_reason`:
                                                            the engine's stop, stop_string, length, context, cancelled)
    specdeck:num_requests_running, specdeck:num_requests_waiting   (gauges: jobs holding the engine, and queued)

Counters run from the server's start and count every generation it makes: the
OpenAI routes, /specdeck/generate and both runs of /specdeck/compare. A step's
first `accepted` draft tokens are the accepted ones, so it adds one at positions
0 .. accepted - 1 (for a tree draft: the depths of the accepted path).

Written by hand (no client library): a few lines of text, counted under a lock
since steps are counted on the engine's thread and read on the event loop's.
"""

from __future__ import annotations

import threading

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from engine.core.events import StepEvent

PREFIX = "specdeck:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
router = APIRouter()

_COUNTERS = (
    ("spec_decode_num_drafts", "Steps that drafted (speculative decoding steps)."),
    ("spec_decode_num_draft_tokens", "Draft tokens sent to the target for verification."),
    ("spec_decode_num_accepted_tokens", "Draft tokens the target accepted."),
    ("prompt_tokens", "Prompt tokens prefilled."),
    ("generation_tokens", "Tokens of the replies (usage.completion_tokens: the end token or stop string not counted)."),
)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {name: 0 for name, _ in _COUNTERS}
        self._per_position: list[int] = []
        self._finished: dict[str, int] = {}

    def observe(self, step: StepEvent, prompt_tokens: int) -> None:
        """Count one step of a generation whose prompt is `prompt_tokens` long (counted at its first step)."""
        with self._lock:
            counts = self._counts
            if step.index == 0:
                counts["prompt_tokens"] += prompt_tokens
            counts["generation_tokens"] += len(step.tokens)
            if step.drafted:
                counts["spec_decode_num_drafts"] += 1
                counts["spec_decode_num_draft_tokens"] += step.drafted
                counts["spec_decode_num_accepted_tokens"] += step.accepted
                grow = step.accepted - len(self._per_position)
                if grow > 0:
                    self._per_position += [0] * grow
                for position in range(step.accepted):
                    self._per_position[position] += 1
            if step.finish_reason is not None:
                self._finished[step.finish_reason] = self._finished.get(step.finish_reason, 0) + 1

    def snapshot(self) -> dict:
        """The counters as plain data (a copy)."""
        with self._lock:
            return {
                **self._counts,
                "accepted_per_position": list(self._per_position),
                "request_success": dict(self._finished),
            }

    def render(self, running: int, waiting: int) -> str:
        """Prometheus' text exposition format (version 0.0.4)."""
        data = self.snapshot()
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, int]]) -> None:
            full = PREFIX + name + ("_total" if kind == "counter" else "")
            lines.extend((f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"))
            lines.extend(f"{full}{labels} {value}" for labels, value in samples)

        for name, help_text in _COUNTERS:
            family(name, "counter", help_text, [("", data[name])])
        family(
            "spec_decode_num_accepted_tokens_per_pos",
            "counter",
            "Draft tokens accepted, per draft position.",
            [(f'{{position="{i}"}}', n) for i, n in enumerate(data["accepted_per_position"])],
        )
        family(
            "request_success",
            "counter",
            "Generations finished, by the engine's finish reason.",
            [(f'{{finished_reason="{reason}"}}', n) for reason, n in sorted(data["request_success"].items())],
        )
        family("num_requests_running", "gauge", "Jobs holding the engine (0 or 1).", [("", running)])
        family("num_requests_waiting", "gauge", "Requests queued for the engine.", [("", waiting)])
        return "\n".join(lines) + "\n"


def metrics_of(app) -> Metrics:
    """The app's counters, made on first use (on the event loop: routes ask before starting a job)."""
    metrics = getattr(app.state, "metrics", None)
    if metrics is None:
        metrics = app.state.metrics = Metrics()
    return metrics


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    host = request.app.state.host
    text = metrics_of(request.app).render(running=int(host.job_name is not None), waiting=host.waiting)
    return PlainTextResponse(text, media_type=CONTENT_TYPE)
