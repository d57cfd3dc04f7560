"""vLLM's OpenAI-compatible server (`vllm serve`) as a remote engine.

What it says (vLLM 0.32, docs.vllm.ai/en/v0.32.0; sources vllm/v1/spec_decode/metrics.py,
vllm/v1/metrics/loggers.py, vllm/entrypoints/openai/chat_completion/serving.py,
vllm/entrypoints/serve/config/api_router.py), and so what SpecDeck shows:

- /v1/models: each model card's `id` and `max_model_len` (the context a request gets). Newer builds
  also answer /inference/v1/config, whose `speculative_decoding` says `enabled`, `method`,
  `num_speculative_tokens` and `draft_model`. Where it does not answer, /metrics tells: the
  spec-decode counters exist only on a server started with --speculative-config, and the
  per-position counter has one `position` label per draft position, 0 to k - 1.
- Streamed with stream_options `include_usage` and `continuous_usage_stats`, every chunk carries
  `usage.completion_tokens`, the tokens so far. vLLM sends what one engine step made as one chunk,
  so a chunk of m tokens is a verify step that accepted m - 1 drafts (StepBuilder's
  `step_per_chunk`), except the first token: it comes from the prefill, where no draft is verified.
  Where vLLM holds a delta back (a tool-call parser waiting for more, text that is not yet whole
  characters) the next chunk carries two steps, and reads as one.
- /metrics counters `vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
  `..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total{position}`, summed over
  the `engine` label (data-parallel engines), are read before and after each request: the difference
  is that request's, if nothing else ran on the server meanwhile. A server started with
  --per-request-spec-decode-metrics summary sends the request's own counts in the last usage chunk
  (`metrics.speculative_decoding`, docs features/speculative_decoding/acceptance_metrics.md): those
  are taken instead.
- The vanilla run of a side by side: vLLM reads no per-request option that stops drafting, so it
  needs a second server started without --speculative-config (`vanilla_url`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import SpecDeckError
from engine.remote.base import RemotePair, StepPerChunkEngine, model_cards
from engine.remote.http import JsonServer, ServerRefused, ServerUnavailable
from engine.remote.prometheus import Scrape, difference, parse
from engine.remote.steps import StepBuilder

NOTES = (
    "vLLM sends no probabilities: p and q are not shown.",
    "vLLM sends no draft counts per token: the token colours are inferred from how many tokens each step "
    "gave (a step of m tokens accepted m - 1 drafts), and two steps vLLM sends as one chunk read as one.",
    "The reply's draft totals are the difference of the server's /metrics counters before and after it: they "
    "are only right when no other request runs on that server at the same time (a server started with "
    "--per-request-spec-decode-metrics summary sends each reply's own counts, which are used instead).",
    "vLLM reports no cost model: the theory panel draws the formula without measured costs.",
)
CONFIG_NOTE = (
    "This vLLM server does not describe its speculative config (it has no /inference/v1/config): that "
    "it drafts, and how many tokens a step, are inferred from its /metrics counters."
)
NO_VANILLA = (
    "vLLM cannot turn speculative decoding off for one request: the side by side needs a vanilla URL, "
    "a second vLLM server with the same model started without --speculative-config."
)

DRAFTS = "vllm:spec_decode_num_drafts_total"  # verify steps that had drafts
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label `position`: 0 .. k - 1


@dataclass(frozen=True)
class SpecCounts:
    """One request's speculative counters, as vLLM counts them."""

    drafts: int  # verify steps that had drafts
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...] = ()  # per draft position: the drafts that accepted it


def spec_counts(before: Scrape, after: Scrape) -> SpecCounts | None:
    """What the spec-decode counters rose by between two scrapes; None where a counter is missing."""
    drafts, draft_tokens, accepted = (difference(before, after, name) for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED))
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    old, new = before.by_label(PER_POSITION, "position"), after.by_label(PER_POSITION, "position")
    positions = sorted(new, key=lambda p: int(p) if p.isdigit() else -1)
    per_pos = tuple(round(new[p] - old.get(p, 0.0)) for p in positions)
    return SpecCounts(round(drafts), round(draft_tokens), round(accepted), per_pos)


def reported_counts(metrics: dict) -> SpecCounts | None:
    """A request's own counts from `metrics.speculative_decoding` (--per-request-spec-decode-metrics)."""
    try:
        histogram = [int(n) for n in metrics.get("acceptance_histogram") or ()]  # [j]: steps that accepted j
        per_pos = tuple(sum(histogram[i + 1 :]) for i in range(max(0, len(histogram) - 1)))
        return SpecCounts(
            int(metrics["num_spec_steps"]),
            int(metrics["num_draft_tokens"]),
            int(metrics["num_accepted_draft_tokens"]),
            per_pos,
        )
    except (KeyError, TypeError, ValueError):
        return None


class VllmEngine(StepPerChunkEngine):
    kind = "vllm"
    name = "vLLM server"
    no_vanilla = NO_VANILLA

    def __init__(
        self, url: str, api_key: str | None = None, *, vanilla_url: str | None = None, model: str | None = None
    ) -> None:
        super().__init__(url, api_key, vanilla_url=vanilla_url, model=model)
        self._reported: dict | None = None  # one generate call's: the counts the server reported for it

    def _describe(self) -> RemotePair:
        cards = model_cards(self.server)
        card = next((c for c in cards if c["id"] == self.model), cards[0])
        model = self.model or card["id"]
        n_ctx = card.get("max_model_len")
        config = self._config()
        scrape = self._scrape(self.server)
        positions = len(scrape.by_label(PER_POSITION, "position")) if scrape else 0
        if config is not None:
            speculative = bool(config.get("enabled"))
            k = int(config.get("num_speculative_tokens") or positions or 0)
        else:
            speculative = scrape is not None and scrape.total(DRAFTS) is not None
            k = positions
        self.draft_length = k if speculative else 0
        how = ""
        if speculative:
            method = (config or {}).get("method") or "speculative decoding"
            how = f"{method}, up to {k} draft tokens a step" if k else str(method)
            if (config or {}).get("draft_model"):
                how += f" (draft {config['draft_model']})"
            if config is None:
                how += " (from /metrics)"
        if self.vanilla is not None:
            self._check_vanilla_server()
        notes = NOTES + ((CONFIG_NOTE,) if speculative and config is None else ())
        return RemotePair(
            self.kind,
            self.url,
            model,
            speculative,
            how,
            int(n_ctx) if n_ctx else None,
            notes,
            self.vanilla.url if self.vanilla else None,
            details={"models": [c["id"] for c in cards], "speculative_config": config, "root": card.get("root")},
        )

    def _builder_options(self, vanilla: bool) -> dict:
        self._reported = None
        return super()._builder_options(vanilla)

    def _counters(self, chunk: dict, builder: StepBuilder) -> dict:
        metrics = chunk.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            self._reported = metrics["speculative_decoding"]  # rides the last usage chunk
        return super()._counters(chunk, builder)

    def _before(self, server: JsonServer) -> Any:
        return None if self._plain_run else self._scrape(server)

    def _after(self, server: JsonServer, before: Any, timings: dict) -> dict:
        if self._plain_run:
            return {}
        counts = reported_counts(self._reported) if self._reported is not None else None
        if counts is None and before is not None:
            try:
                after = self._scrape(server)
            except ServerUnavailable:  # the reply arrived; only its totals are lost
                after = None
            counts = spec_counts(before, after) if after is not None else None
        if counts is None:
            return {}
        out = {"drafted": counts.draft_tokens, "accepted": counts.accepted}
        if counts.accepted_per_pos:
            # Position i is tested when the drafts before it were all accepted: by every draft at 0.
            tested = (counts.drafts, *counts.accepted_per_pos[:-1])
            out.update(depth_tested=tested, depth_accepted=counts.accepted_per_pos)
        return out

    # -- what the server says --------------------------------------------------------------

    def _config(self) -> dict | None:
        """The speculative part of /inference/v1/config; None on a build without it."""
        try:
            config = self.server.get("/inference/v1/config", timeout=10.0)
        except ServerRefused:  # 404: a build without the endpoint
            return None
        except ServerUnavailable as error:
            if "did not answer with JSON" in str(error):
                return None
            raise
        spec = config.get("speculative_decoding") if isinstance(config, dict) else None
        if isinstance(spec, dict):
            return spec
        features = config.get("features") if isinstance(config, dict) else None  # an earlier shape: a flag
        if isinstance(features, dict) and "speculative_decoding" in features:
            return {"enabled": bool(features["speculative_decoding"])}
        return None

    def _scrape(self, server: JsonServer) -> Scrape | None:
        """/metrics, read; None where the server has none or it is not Prometheus text."""
        try:
            return parse(server.get_text("/metrics", timeout=10.0))
        except (ServerRefused, ValueError):
            return None

    def _check_vanilla_server(self) -> None:
        scrape = self._scrape(self.vanilla)
        if scrape is not None and scrape.total(DRAFTS) is not None:
            raise SpecDeckError(
                f"The {self.vanilla.name} decodes speculatively too (it has spec-decode counters): "
                "give as vanilla URL a server started without --speculative-config."
            )
