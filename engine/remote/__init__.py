"""Remote engines: llama-server, vLLM and SGLang behind the engine's own calls.

    remote = open_remote("auto", "http://127.0.0.1:8080")     # or "llama-server", "vllm", "sglang"
    pair = remote.connect()
    remote.generate(messages, sampling, on_steps=...)          # StepEvents, as a local run's
    remote.compare(messages, sampling)                          # vanilla (a second URL, or n_max 0) vs speculative

A SpecDeck server is not among them: `EngineClient` (engine/service/client.py)
speaks its own API, with every per-token event. `detect_kind` tells the kinds apart
by what each server alone answers. Light: no torch, no llama.cpp, no Qt.
"""

from __future__ import annotations

from engine.errors import ConfigError
from engine.remote.base import RemoteEngine, RemotePair
from engine.remote.http import JsonServer, ServerRefused, ServerUnavailable

KINDS = ("specdeck", "llama-server", "vllm", "sglang")


def adapters() -> dict[str, type[RemoteEngine]]:
    from engine.remote.llama_server import LlamaServerEngine
    from engine.remote.sglang import SglangEngine
    from engine.remote.vllm import VllmEngine

    return {"llama-server": LlamaServerEngine, "vllm": VllmEngine, "sglang": SglangEngine}


def detect_kind(url: str, api_key: str | None = None) -> str:
    """Which kind of server answers at `url`: "specdeck", "llama-server", "vllm" or "sglang".
    ServerUnavailable when nothing answers; ConfigError when it is none of them."""
    server = JsonServer(url, api_key, "server")
    probes = (
        ("/specdeck/info", "specdeck", lambda d: "wire_version" in d),
        ("/props", "llama-server", lambda d: "default_generation_settings" in d or "build_info" in d),
        ("/get_server_info", "sglang", lambda d: isinstance(d, dict)),
        ("/version", "vllm", lambda d: isinstance(d, dict) and "version" in d),
    )
    for path, kind, looks_right in probes:
        try:
            if looks_right(server.get(path, timeout=10.0)):
                return kind
        except ServerRefused as refused:
            if refused.status in (401, 403):
                raise
        except ServerUnavailable as error:
            if "did not answer with JSON" not in str(error):
                raise
    raise ConfigError(
        f"The server at {server.url} is none of SpecDeck, llama-server, vLLM or SGLang (it answered "
        "none of their own endpoints): choose its kind, or check the address."
    )


def open_remote(
    kind: str, url: str, api_key: str | None = None, *, vanilla_url: str | None = None, model: str | None = None
) -> RemoteEngine:
    """The adapter for `kind` ("auto": detected). A SpecDeck server has its own client: ConfigError."""
    if kind == "auto":
        kind = detect_kind(url, api_key)
    if kind == "specdeck":
        raise ConfigError("A SpecDeck server is used through EngineClient, with every per-token event.")
    try:
        adapter = adapters()[kind]
    except KeyError:
        raise ConfigError(f"Unknown server kind {kind!r}: choose one of {', '.join(KINDS)} or auto.") from None
    return adapter(url, api_key, vanilla_url=vanilla_url, model=model)


__all__ = ["KINDS", "RemoteEngine", "RemotePair", "adapters", "detect_kind", "open_remote"]
