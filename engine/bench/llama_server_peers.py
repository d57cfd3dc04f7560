"""llama.cpp's own server as a benchmark peer: the same GGUF file, threads and context.

`specdeck-cli bench --peers` on a GGUF target runs, where a `llama-server` binary is
found (`--llama-server PATH`, $SPECDECK_LLAMA_SERVER, $PATH, or the one
`specdeck-cli llama-server build` cached):

- llama-server, plain (beside our vanilla run);
- llama-server with each n-gram type of `--spec-type` (beside our speculative run);
- llama-server with `--model-draft` (`draft-simple`) when our pair has a GGUF draft model.

Each is a server of its own on a loopback port, greedy, read through the remote
adapter, and timed by llama-server itself (`timings.predicted_n` / `predicted_ms`:
from the first generated token to the last, the prompt excluded, as ours is).
"""

from __future__ import annotations

from pathlib import Path

from engine.bench.peer import PeerOutput, PeerSpec
from engine.bench.prompts import BenchPrompt
from engine.bench.results import SPECULATIVE, VANILLA
from engine.core.sampling_config import SamplingConfig

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")


def llama_server_peers(
    binary: str | Path, model: str, n_ctx: int, threads: int, draft: str | None = None
) -> list[PeerSpec]:
    def peer(spec: list[str]):
        return lambda: LlamaServerPeer(binary, model, n_ctx, threads, spec)

    specs = [PeerSpec("llama-server", VANILLA, peer([]))]
    specs += [PeerSpec(f"llama-server {kind}", SPECULATIVE, peer(["--spec-type", kind])) for kind in NGRAM_TYPES]
    if draft is not None and str(draft).endswith(".gguf"):
        specs.append(PeerSpec("llama-server draft model", SPECULATIVE, peer(["--model-draft", str(draft)])))
    return specs


class LlamaServerPeer:
    """One llama-server process, greedy chat completions through the llama-server adapter."""

    def __init__(self, binary, model: str, n_ctx: int, threads: int, spec: list[str]) -> None:
        from engine.remote.llama_server import LlamaServerEngine
        from engine.remote.llama_server_process import LlamaServerProcess

        self.process = LlamaServerProcess(binary, model, threads=threads, n_ctx=n_ctx, spec=spec).start()
        try:
            self.remote = LlamaServerEngine(self.process.url)
            self.remote.connect()
        except Exception:
            self.process.stop()
            raise

    def generate(self, prompt: BenchPrompt, prompt_ids: list[int], max_tokens: int) -> PeerOutput:
        result = self.remote.generate([dict(m) for m in prompt.messages], SamplingConfig(max_tokens=max_tokens))
        stats = result.stats
        return PeerOutput(result.text, stats.tokens, stats.wall_s, stats.tokens)

    def close(self) -> None:
        self.process.stop()
