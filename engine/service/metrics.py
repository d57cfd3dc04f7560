"""`GET /metrics`: the server's counters in Prometheus' text format, with vLLM's names.

    specdeck:spec_decode_num_drafts_total                   steps that drafted
    specdeck:spec_decode_num_draft_tokens_total             draft tokens sent to the target
    specdeck:spec_decode_num_accepted_tokens_total          draft tokens it accepted
    specdeck:spec_decode_num_accepted_tokens_per_pos_total  accepted at draft position 0, 1, ... (label `position`)
    specdeck:prompt_tokens_total, specdeck:generation_tokens_total
    specdeck:request_success_total                          finished generations (label `finished_reason`:
                                                            the engine's stop, stop_string, length, context, cancelled)
    specdeck:step_batch_size                                a histogram of the batch size each request's steps
                                                            ran at (sequences in the step's target forward: 1
                                                            unless the server runs --parallel N); _sum / _count
                                                            is the mean batch size over all requests' steps
    specdeck:num_requests_running, specdeck:num_requests_waiting   (gauges: jobs holding the engine, up to
                                                            --parallel generations at once, and queued)

Counters run from the server's start and count every generation it makes: the
OpenAI routes, /specdeck/generate and both runs of /specdeck/compare. A step's
first `accepted` draft tokens are the accepted ones, so it adds one at positions
0 .. accepted - 1 (for a tree draft: the depths of the accepted path). A step
counts in the batch-size histogram when it ran a target forward (a request
cancelled or out of context before it ends with a step that ran none).

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


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # the histogram's upper bounds, up to +Inf


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {name: 0 for name, _ in _COUNTERS}
        self._per_position: list[int] = []
        self._finished: dict[str, int] = {}
        self._batch_sizes: dict[int, int] = {}  # batch size -> steps that ran at it

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
            if ran_forward(step):
                self._batch_sizes[step.batch] = self._batch_sizes.get(step.batch, 0) + 1

    def snapshot(self) -> dict:
        """The counters as plain data (a copy)."""
        with self._lock:
            return {
                **self._counts,
                "accepted_per_position": list(self._per_position),
                "request_success": dict(self._finished),
                "batch_sizes": dict(self._batch_sizes),
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
        sizes = data["batch_sizes"]
        buckets = [(f'{{le="{bound}"}}', sum(n for b, n in sizes.items() if b <= bound)) for bound in BATCH_BUCKETS]
        family(
            "step_batch_size",
            "histogram",
            "Sequences in the target forward of each request's steps (the batch size it ran at).",
            [
                *((f"_bucket{labels}", n) for labels, n in buckets),
                ('_bucket{le="+Inf"}', sum(sizes.values())),
                ("_sum", sum(b * n for b, n in sizes.items())),
                ("_count", sum(sizes.values())),
            ],
        )
        family(
            "num_requests_running",
            "gauge",
            "Jobs holding the engine (0 or 1; up to --parallel generations decoding together).",
            [("", running)],
        )
        family("num_requests_waiting", "gauge", "Requests queued for the engine.", [("", waiting)])
        return "\n".join(lines) + "\n"


def ran_forward(step: StepEvent) -> bool:
    """Whether the step ran a target forward; a step that ends a request before one (cancelled, or no
    room left in its context) did not, and says no batch size."""
    return step.verify_s > 0


def metrics_of(app) -> Metrics:
    """The app's counters, made on first use (on the event loop: routes ask before starting a job)."""
    metrics = getattr(app.state, "metrics", None)
    if metrics is None:
        metrics = app.state.metrics = Metrics()
    return metrics


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    host = request.app.state.host
    text = metrics_of(request.app).render(running=host.running, waiting=host.waiting)
    return PlainTextResponse(text, media_type=CONTENT_TYPE)
