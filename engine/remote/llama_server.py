"""llama.cpp's `llama-server` as a remote engine.

What it says, and so what SpecDeck shows (llama.cpp build 11434, tools/server):

- `/props`: the model (`model_alias`, `model_path`), the context per slot, the build;
  `/slots` (unless started with `--no-slots`): whether each slot speculates, and with
  which `speculative.types`.
- With `timings_per_token` every streamed chunk carries `timings`: `predicted_n` (tokens
  so far), `draft_n` and `draft_n_accepted` (drafts proposed and accepted so far). The
  server adds a step's drafts to its counters before it sends that step's tokens, so
  the steps, and each token's source (accepted, the bonus, resampled, plain), are
  rebuilt exactly (`StepBuilder`). p and q are not sent.
- `/metrics` (a server started with `--metrics`): `llamacpp:spec_decode_num_drafts_total`,
  `..._num_draft_tokens_total` and `..._num_accepted_tokens_total`, read before and after each
  reply; their difference is kept as `last_metrics`, a check on the counters the steps were rebuilt
  from (the two agree when nothing else ran on the server meanwhile).
- The vanilla run of a side by side: this build reads no per-request speculative
  options (its `speculative.n_max` field is compiled out: server-schema.cpp, `#if 0`),
  so it needs a second server started without `--spec-type` / `--model-draft`
  (`vanilla_url`). For a server on this machine whose model file is here too, SpecDeck
  starts that twin itself (the same file and context, a free loopback port, stopped by
  `close()` or when this process exits), if a llama-server binary is found. A request sent
  with `speculative.n_max: 0` is still tried where no second server is given: a build
  that honours it gives the vanilla run, one that does not is caught by its draft
  counters and the user told to give a vanilla URL.
"""

from __future__ import annotations

import atexit
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.remote.base import RemoteEngine, RemotePair
from engine.remote.http import JsonServer, ServerRefused, ServerUnavailable
from engine.remote.prometheus import Scrape, difference, parse
from engine.remote.steps import StepBuilder

METRICS = {
    "drafts": "llamacpp:spec_decode_num_drafts_total",  # verification steps that had drafts
    "drafted": "llamacpp:spec_decode_num_draft_tokens_total",
    "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TWIN_NOTE = (
    "The side by side's vanilla run is on a second llama-server SpecDeck started on the same model file "
    "without speculative options ({url}): this build reads no per-request draft settings."
)
UNNAMED = "speculative decoding (its type is named after a first reply)"  # /slots says it only then
NOTES = (
    "llama-server sends its draft counters with each token: the token colours are rebuilt from them, "
    "but it sends no probabilities, so p and q are not shown.",
    "llama-server reports no cost model: the theory panel draws the formula without measured costs.",
)


class LlamaServerEngine(RemoteEngine):
    kind = "llama-server"
    name = "llama-server"
    last_metrics: dict[str, int] | None = None  # the last reply's /metrics difference (--metrics only)
    start_twin = True  # a side by side without vanilla_url starts a vanilla twin where it can
    _twin = None  # the LlamaServerProcess started for it

    def ensure_vanilla(self) -> None:
        if self.vanilla is None and self.start_twin:
            self._start_vanilla_twin()

    def close(self) -> None:
        if self._twin is not None:
            self._twin.stop()
            self._twin = None

    def _start_vanilla_twin(self) -> None:
        """The vanilla twin of a server on this machine whose model file is here: the same file and
        context without speculative options; nothing where that is not so (the counters then tell)."""
        pair = self.pair or self.connect()
        path = pair.details.get("model_path")
        if self.server.address.host not in LOOPBACK or not path or not Path(path).is_file():
            return
        from engine.remote.llama_server_binary import find_llama_server
        from engine.remote.llama_server_process import LlamaServerProcess

        binary = find_llama_server()
        if binary is None:
            return
        self._twin = LlamaServerProcess(binary, path, n_ctx=pair.n_ctx or 4096).start()
        atexit.register(self.close)  # never left running after this process
        self.vanilla = JsonServer(self._twin.url, None, "vanilla llama-server (started by SpecDeck)")
        self.pair = replace(pair, vanilla_url=self._twin.url, notes=(*pair.notes, TWIN_NOTE.format(url=self._twin.url)))

    def _describe(self) -> RemotePair:
        props = self.server.get("/props")
        alias, path = props.get("model_alias") or "", str(props.get("model_path") or "")
        model = self.model or (Path(path).name if not alias or alias == path else alias) or "model"
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        speculative, types = self._speculation(self.server)
        how = ", ".join(types) if types else UNNAMED
        return RemotePair(
            self.kind,
            self.url,
            model,
            speculative,
            how if speculative else "",
            int(n_ctx) if n_ctx else None,
            NOTES,
            self.vanilla.url if self.vanilla else None,
            details={
                "build_info": props.get("build_info"),
                "model_path": props.get("model_path"),
                "metrics": bool(props.get("endpoint_metrics")),
            },
        )

    def _after_reply(self) -> None:
        """/slots names the speculative types only once a request has run: name them then. A server that
        went away right after a whole reply leaves them unnamed; the reply is kept, and the next
        request says the server is gone."""
        if self.pair is not None and self.pair.speculation == UNNAMED:
            try:
                speculative, types = self._speculation(self.server)
            except ServerUnavailable:
                return
            if types:
                self.pair = replace(self.pair, speculation=", ".join(types))

    def _speculation(self, server: JsonServer) -> tuple[bool, tuple[str, ...]]:
        """(whether it drafts, its speculative types) from /slots; (True, ()) when /slots is off: the
        draft counters then tell."""
        try:
            slots = server.get("/slots")
        except ServerRefused:  # started with --no-slots (501), or an older build
            return True, ()
        slots = slots if isinstance(slots, list) else []
        speculative = any(bool(slot.get("speculative")) for slot in slots if isinstance(slot, dict))
        types: list[str] = []
        for slot in slots:
            named = str(((slot or {}).get("params") or {}).get("speculative.types") or "")
            types += [t for t in named.replace(",", " ").split() if t and t != "none" and t not in types]
        return speculative, tuple(types)

    def _body(self, messages, sampling, vanilla: bool) -> dict:
        body = super()._body(messages, sampling, vanilla)
        body["timings_per_token"] = True
        # A side by side's runs each read the prompt: on one server the second run would find it cached
        # and show no prefill. vLLM and SGLang have no such switch per request (their notes say so).
        body["cache_prompt"] = not self.cold_prompts
        if vanilla and self.vanilla is None:
            body["speculative.n_max"] = 0  # honoured by builds that read it; checked afterwards
        return body

    def _counters(self, chunk: dict, builder: StepBuilder) -> dict:
        timings = chunk.get("timings") or {}
        if "predicted_n" not in timings:
            return {}
        return {
            "tokens": int(timings["predicted_n"]),
            "drafted": int(timings.get("draft_n", 0)),
            "accepted": int(timings.get("draft_n_accepted", 0)),
        }

    def _before(self, server: JsonServer) -> Scrape | None:
        return self._scrape(server) if self.pair is not None and self.pair.details.get("metrics") else None

    def _scrape(self, server: JsonServer) -> Scrape | None:
        try:
            return parse(server.get_text("/metrics", timeout=10.0))
        except (ServerRefused, ServerUnavailable, ValueError):
            return None  # the numbers of the reply itself stand; only the check is lost

    def _after(self, server: JsonServer, before: Any, timings: dict) -> dict:
        if server is self.server:
            self._after_reply()
        self.last_metrics = None
        after = self._scrape(server) if before is not None else None
        if after is not None:
            rises = {key: difference(before, after, name) for key, name in METRICS.items()}
            if all(rise is not None for rise in rises.values()):
                self.last_metrics = {key: round(rise) for key, rise in rises.items()}
        out: dict = {}
        if timings.get("predicted_ms"):
            out["wall_s"] = float(timings["predicted_ms"]) / 1000.0
        if timings.get("prompt_ms") is not None:
            out["prefill_s"] = float(timings["prompt_ms"]) / 1000.0
        return out
