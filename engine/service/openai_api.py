"""OpenAI's chat and completions API, as the engine server reads and answers it.

Requests are pydantic models with extra="forbid": an unknown field is a 400
that names it. The standard fields clients send by habit are accepted and
ignored (`user`, `metadata`, `store`, `service_tier`, `parallel_tool_calls`,
`model`: any name, the server has one model), or honoured (`stream_options.
include_usage`); the standard ones this engine cannot honour are refused with a
400 saying so, but only with a value other than their default (`n: 1`,
`logprobs: false`, `presence_penalty: 0`, `tools: []` pass).

Sampling follows OpenAI's defaults where the client says nothing: temperature 1,
top_p 1, and a random seed (so two calls differ, as on OpenAI); `seed` makes a
call repeatable. Without `max_tokens` (or `max_completion_tokens`) the reply may
run to the end of the context window.

Replies carry `usage` and llama-server's `timings` object (in the non-streamed
response, and in the last chunk of a stream):

    prompt_n, prompt_ms        prompt tokens prefilled (those not in the cache) and the prefill's time
    prompt_per_token_ms, prompt_per_second
    predicted_n, predicted_ms  reply tokens and the decode loop's time (prefill excluded)
    predicted_per_token_ms, predicted_per_second
    draft_n, draft_n_accepted  draft tokens sent to the target, and those it accepted
    cache_n                    prompt tokens the target's cache already held (a follow-up in the same chat)
    batch_n_mean, batch_n_max  SpecDeck's: the batch size the reply's steps ran at (sequences in each step's
                               target forward, 1 unless the server runs --parallel N), mean and largest over
                               the steps that ran a forward

`finish_reason` is OpenAI's: the engine's "stop" (an end-of-generation token) and
"stop_string" (a `stop` string) are "stop"; "length" (max_tokens) and
"context" (the context window is full) are "length", as llama-server and vLLM
say for both; "cancelled" (POST /specdeck/cancel, or the server stopping) is
"stop": the reply ended early on purpose and is whole as far as it goes.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.core.events import StepEvent
from engine.core.sampling_config import SamplingConfig
from engine.core.text import check_messages
from engine.service.errors import BadRequest
from engine.service.metrics import ran_forward

FINISH_REASONS = {"stop": "stop", "stop_string": "stop", "length": "length", "context": "length", "cancelled": "stop"}
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's; accepted, not honoured (usage comes once, at the end)


class SpecDeckOptions(_Strict):
    """SpecDeck's own field: `events` adds each step's record (routes_specdeck.step_item) to the reply;
    `drafter` decodes this request with another drafter ("none": plainly)."""

    events: bool = False
    drafter: str | None = None


class _Completion(_Strict):
    """The fields chat and completions share."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # llama-server's and vLLM's, beside OpenAI's
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repeat_penalty: float | None = None  # llama-server's
    logit_bias: dict[str, float] | None = None
    # llama-server's per-request speculative options (top-level keys with a dot)
    n_max: int | None = Field(None, alias="speculative.n_max", ge=0)
    n_min: int | None = Field(None, alias="speculative.n_min", ge=0)
    p_min: float | None = Field(None, alias="speculative.p_min", ge=0.0, le=1.0)
    specdeck: SpecDeckOptions | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class ContentPart(_Strict):
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class Message(_Strict):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # What the openai client writes back for an assistant message it received: accepted when empty.
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class ChatRequest(_Completion):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Completion):
    prompt: str | list[str]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


# -- what cannot be honoured ----------------------------------------------------------------


def refuse_unsupported(body: _Completion) -> None:
    """A 400 for a standard field set to something other than its default that this engine cannot do."""
    checks = [
        (
            "n",
            body.n in (None, 1),
            "this server makes one choice per request: send n = 1 (or leave it out), "
            "and make several requests for several replies",
        ),
        ("frequency_penalty", not body.frequency_penalty, "penalties are not offered: send 0 or leave it out"),
        ("presence_penalty", not body.presence_penalty, "penalties are not offered: send 0 or leave it out"),
        ("repeat_penalty", body.repeat_penalty in (None, 1.0), "penalties are not offered: send 1 or leave it out"),
        ("logit_bias", not body.logit_bias, "logit biases are not offered: leave it out"),
    ]
    probabilities = (
        "log probabilities are not offered; SpecDeck's extension gives each token's target "
        'probability p (and the draft\'s q): send "specdeck": {"events": true}'
    )
    if isinstance(body, ChatRequest):
        checks += [
            ("logprobs", not body.logprobs, probabilities),
            ("top_logprobs", not body.top_logprobs, probabilities),
            ("tools", not body.tools and not body.functions, "tool calls are not offered: leave out tools"),
            (
                "tool_choice",
                body.tool_choice in (None, "none", "auto") and body.function_call in (None, "none", "auto"),
                "tool calls are not offered: leave out tool_choice",
            ),
            (
                "response_format",
                body.response_format in (None, {"type": "text"}),
                "only plain text replies are offered: leave out response_format",
            ),
            ("modalities", body.modalities in (None, ["text"]), "only text is offered"),
        ]
    else:
        checks += [
            ("logprobs", not body.logprobs, probabilities),
            ("echo", not body.echo, "echoing the prompt is not offered: leave it out"),
            ("suffix", not body.suffix, "a suffix (fill in the middle) is not offered: leave it out"),
            ("best_of", body.best_of in (None, 1), "one reply is made per request: send best_of = 1 or leave it out"),
        ]
    for name, fine, why in checks:
        if not fine:
            raise BadRequest(f"Bad request: '{name}' cannot be honoured: {why}.")


# -- the request as the engine takes it ------------------------------------------------------


def sampling_of(body: _Completion) -> SamplingConfig:
    """The request's sampling settings (the engine's ConfigError, a 400, for a bad value);
    max_tokens is 1 when not given: the job sets it once it knows the prompt's length."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    given = body.requested_max_tokens()
    values = {
        "temperature": OPENAI_DEFAULTS["temperature"] if body.temperature is None else body.temperature,
        "top_p": OPENAI_DEFAULTS["top_p"] if body.top_p is None else body.top_p,
        "top_k": body.top_k or 0,
        "min_p": body.min_p or 0.0,
        "seed": secrets.randbits(31) if body.seed is None else body.seed,
        "max_tokens": 1 if given is None else given,
        "stop": tuple(stop),
    }
    return SamplingConfig(**values)


def chat_messages(messages: list[Message]) -> list[dict]:
    """The request's messages as the engine's {"role", "content"} dicts: text parts joined, OpenAI's
    "developer" role read as "system"; a 400 naming the message for what a text model cannot read."""
    out = []
    for n, message in enumerate(messages, start=1):
        if message.tool_calls or message.function_call or message.audio or message.role in ("tool", "function"):
            raise BadRequest(f"Bad request: message {n} carries a tool call or its result; tool calls are not offered.")
        content = message.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise BadRequest(f"Bad request: message {n} has a '{part.type}' part; this model reads text only.")
                texts.append(part.text)
            content = "\n".join(texts)
        role = "system" if message.role == "developer" else message.role
        out.append({"role": role, "content": content if content is not None else ""})
    check_messages(out, source="The request")  # the engine's message for an unknown role or no messages
    return out


def completion_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1:
        return prompt[0]
    raise BadRequest(f"Bad request: 'prompt' holds {len(prompt)} prompts; this server takes one per request.")


# -- the reply ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """How long the prompt was, and how much of it the target's cache already held."""

    tokens: int
    cached: int = 0


@dataclass(frozen=True)
class Reply:
    """One reply's identity and shape: `chat` (chat.completion) or not (text_completion)."""

    chat: bool
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = 0

    @classmethod
    def start(cls, chat: bool, model: str, include_usage: bool = False) -> Reply:
        prefix = "chatcmpl-" if chat else "cmpl-"
        return cls(chat, model, include_usage, prefix + secrets.token_hex(12), int(time.time()))

    def chunk(self, text: str | None = None, finish: str | None = None, *, role: bool = False, **extra) -> dict:
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if self.include_usage:
            body["usage"] = None  # as OpenAI: null on every chunk but the last
        return {**body, **extra}

    def usage_chunk(self, steps: list[StepEvent], prompt: Prompt) -> dict:
        """The last chunk when `stream_options.include_usage`: no choices, the usage (and timings)."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(steps, prompt),
            "timings": timings(steps, prompt),
        }

    def response(self, steps: list[StepEvent], prompt: Prompt, events: list[dict] | None = None) -> dict:
        """The whole, non-streamed reply."""
        text = "".join(step.text for step in steps)
        finish = finish_reason(steps)
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        body = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(steps, prompt),
            "timings": timings(steps, prompt),
        }
        if events is not None:
            body["specdeck"] = events
        return body


def finish_reason(steps: list[StepEvent]) -> str:
    reason = steps[-1].finish_reason if steps else None
    return FINISH_REASONS.get(reason or "length", "stop")


def completion_tokens(steps: list[StepEvent]) -> int:
    return sum(len(step.tokens) for step in steps)


def usage(steps: list[StepEvent], prompt: Prompt) -> dict:
    made = completion_tokens(steps)
    return {
        "prompt_tokens": prompt.tokens,
        "completion_tokens": made,
        "total_tokens": prompt.tokens + made,
        "prompt_tokens_details": {"cached_tokens": prompt.cached},
    }


def timings(steps: list[StepEvent], prompt: Prompt) -> dict:
    """llama-server's `timings` (see the module docstring), from the run's last statistics."""
    stats = steps[-1].stats if steps else None
    prompt_tokens = prompt.tokens - prompt.cached
    prompt_ms = 1000.0 * stats.prefill_s if stats else 0.0
    predicted_ms = 1000.0 * stats.wall_s if stats else 0.0
    predicted = completion_tokens(steps)
    return {
        "cache_n": prompt.cached,
        "prompt_n": prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_tokens if prompt_tokens else 0.0,
        "prompt_per_second": 1000.0 * prompt_tokens / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
        "predicted_per_second": 1000.0 * predicted / predicted_ms if predicted_ms > 0 else 0.0,
        "draft_n": stats.drafted if stats else 0,
        "draft_n_accepted": stats.accepted if stats else 0,
        **batch_sizes(steps),
    }


def batch_sizes(steps: list[StepEvent]) -> dict:
    """`batch_n_mean` and `batch_n_max` of `timings` (see the module docstring); 1 for a reply that ran
    no forward (cancelled before its first step)."""
    sizes = [step.batch for step in steps if ran_forward(step)]
    return {"batch_n_mean": sum(sizes) / len(sizes) if sizes else 1.0, "batch_n_max": max(sizes, default=1)}
