"""SGLang's server (`python -m sglang.launch_server`) as a remote engine.

What it says (SGLang main of August 2026, after PR #33518; sources python/sglang/srt/entrypoints/
openai/serving_chat.py, utils.py `spec_tokens_details_from_meta_info`, protocol.py `SglExt`,
http_server.py `get_server_info`), and so what SpecDeck shows:

- /v1/models: the card's `id` (the served model name), `root` and `max_model_len` (the context).
- /get_server_info (/server_info on builds that dropped the old name): the server's arguments, among
  them `speculative_algorithm` (EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM..., or null),
  `speculative_num_steps` (the draft's depth), `speculative_eagle_topk` (its branching: 1 is a chain),
  `speculative_num_draft_tokens` (tokens verified a step, the root included) and
  `speculative_draft_model_path`; and `internal_states[0].avg_spec_accept_length`, a running average
  over the server's whole life, kept in the description's details and not used for a reply.
- Streamed with stream_options `continuous_usage_stats`, every content chunk carries
  `usage.completion_tokens`, the tokens so far. SGLang streams every decode step (its default
  --stream-interval 1), and a verify step is one, so a chunk of m tokens is a step that accepted
  m - 1 drafts, as on vLLM; SGLang sends no chunk for a step whose text is empty (part of a
  character), and that step's tokens come with the next.
- Per-request counts: asked with `return_spec_tokens_details`, SGLang sends, before the usage chunk,
  a chunk of no choices with `sglext.spec_tokens_details`: `spec_verify_ct`,
  `spec_num_proposed_drafts`, `spec_num_correct_drafts`, `spec_accept_rate`, `spec_accept_length`,
  `spec_correct_drafts_histogram` (the `meta_info` fields of the native /generate). They are the
  request's own, whatever else the server runs. A build before PR #33518 ignores the field: the
  totals are then those inferred from the chunks. /metrics (with --enable-metrics) has only gauges
  for speculation (`sglang:spec_accept_length`, `sglang:spec_accept_rate`, over the last logging
  interval): nothing to difference around one request, so they are not read.
- The vanilla run of a side by side: SGLang reads no per-request option that stops drafting, so it
  needs a second server started without --speculative-algorithm (`vanilla_url`).
"""

from __future__ import annotations

from typing import Any

from engine.errors import SpecDeckError
from engine.remote.base import RemotePair, StepPerChunkEngine, model_cards
from engine.remote.http import JsonServer, ServerRefused

NOTES = (
    "SGLang sends no probabilities: p and q are not shown.",
    "SGLang sends no draft counts per token: the token colours are inferred from how many tokens each step "
    "gave (a step of m tokens accepted m - 1 drafts), and two steps SGLang sends as one chunk read as one.",
    "The reply's draft totals are SGLang's own count for it where the server sends one (builds from August "
    "2026 on, asked with return_spec_tokens_details); an older server sends none, and they are inferred "
    "from the tokens per step.",
    "SGLang reports no cost model: the theory panel draws the formula without measured costs.",
)
TREE_NOTE = (
    "This SGLang server drafts a tree (top-k {topk}): each step verifies {nodes} draft tokens but can "
    "accept at most {depth}; the colours count drafts along the accepted path only."
)
NO_VANILLA = (
    "SGLang cannot turn speculative decoding off for one request: the side by side needs a vanilla URL, "
    "a second SGLang server with the same model started without --speculative-algorithm."
)


class SglangEngine(StepPerChunkEngine):
    kind = "sglang"
    name = "SGLang server"
    no_vanilla = NO_VANILLA

    def __init__(
        self, url: str, api_key: str | None = None, *, vanilla_url: str | None = None, model: str | None = None
    ) -> None:
        super().__init__(url, api_key, vanilla_url=vanilla_url, model=model)
        self._sglext: dict = {}  # one generate call's: what its chunks' `sglext` said

    def _describe(self) -> RemotePair:
        cards = model_cards(self.server)
        card = next((c for c in cards if c["id"] == self.model), cards[0])
        info = self._server_info(self.server)
        algorithm = info.get("speculative_algorithm")
        speculative = bool(algorithm)
        steps, topk = int(info.get("speculative_num_steps") or 0), int(info.get("speculative_eagle_topk") or 1)
        nodes = int(info.get("speculative_num_draft_tokens") or 0) - 1  # the root is the target's own token
        depth = steps or max(nodes, 0)
        self.draft_length = depth if speculative else 0
        how, notes = "", NOTES
        if speculative:
            how = f"{algorithm}, up to {depth} draft tokens a step" if depth else str(algorithm)
            if topk > 1 and nodes > depth:
                how += f" (a tree of {nodes}, top-k {topk})"
                notes += (TREE_NOTE.format(topk=topk, nodes=nodes, depth=depth),)
            if info.get("speculative_draft_model_path"):
                how += f" (draft {info['speculative_draft_model_path']})"
        if self.vanilla is not None:
            vanilla_info = self._server_info(self.vanilla)
            if vanilla_info.get("speculative_algorithm"):
                raise SpecDeckError(
                    f"The {self.vanilla.name} decodes speculatively too "
                    f"({vanilla_info['speculative_algorithm']}): give as vanilla URL a server started "
                    "without --speculative-algorithm."
                )
        n_ctx = card.get("max_model_len") or info.get("context_length")
        state = (info.get("internal_states") or [{}])[0] or {}
        details = {
            "version": info.get("version"),
            "model_path": info.get("model_path") or card.get("root"),
            "server_accept_length": state.get("avg_spec_accept_length"),
        }  # over the server's life
        return RemotePair(
            self.kind,
            self.url,
            self.model or card["id"],
            speculative,
            how,
            int(n_ctx) if n_ctx else None,
            notes,
            self.vanilla.url if self.vanilla else None,
            details=details,
        )

    def _body(self, messages, sampling, vanilla: bool) -> dict:
        body = super()._body(messages, sampling, vanilla)
        if not vanilla:
            body["return_spec_tokens_details"] = True  # ignored by builds before it
        return body

    def _before(self, server: JsonServer) -> Any:
        self._sglext = {}

    def _observe(self, chunk: dict) -> None:
        # SGLang sends the request's counts in a chunk of neither choices nor usage.
        if isinstance(chunk.get("sglext"), dict):
            self._sglext.update(chunk["sglext"])

    def _after(self, server: JsonServer, before: Any, timings: dict) -> dict:
        details = self._sglext.get("spec_tokens_details")
        if self._plain_run or not isinstance(details, dict):
            return {}
        proposed = details.get("spec_num_proposed_drafts", details.get("spec_proposed_drafts"))
        correct = details.get("spec_num_correct_drafts", details.get("spec_accepted_drafts"))
        if proposed is None or correct is None:
            return {}
        return {"drafted": int(proposed), "accepted": int(correct)}

    # -- what the server says --------------------------------------------------------------

    def _server_info(self, server: JsonServer) -> dict:
        try:
            info = server.get("/get_server_info")
        except ServerRefused as refused:
            if refused.status != 404:
                raise
            info = server.get("/server_info")  # the newer name, where the old one is gone
        if isinstance(info, dict) and isinstance(info.get("decode"), list) and info["decode"]:
            info = info["decode"][0]  # a prefill/decode disaggregated router: the decode side speculates
        return info if isinstance(info, dict) else {}
