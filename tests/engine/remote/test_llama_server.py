"""A real llama-server (llama.cpp built from source, `engine/remote/llama_server_binary.py`) behind the
remote adapter, on the embedded model and a loopback port."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from engine.core.events import Source
from engine.core.sampling_config import SamplingConfig
from engine.errors import SpecDeckError
from engine.remote import detect_kind, open_remote
from engine.remote.http import ServerRefused, ServerUnavailable
from engine.remote.llama_server_binary import find_llama_server
from engine.remote.llama_server_process import LlamaServerProcess

# A reply that copies its input: n-gram drafts land, so every part of the counters moves.
COPY = [
    {
        "role": "user",
        "content": "Repeat this list exactly, twice: apple, banana, cherry, date, elderberry, "
        "fig, grape, honeydew, kiwi, lemon, mango, nectarine, orange, papaya.",
    }
]
# A reply of hundreds of tokens: seconds of streaming, so a kill at its first steps lands mid-reply (the
# copy prompt's reply can arrive whole in the first batch of steps on a quiet machine, and then the kill
# finds nothing to break).
COUNT = [{"role": "user", "content": "Count from 1 to 300, one number per line, and nothing else."}]
SPEC = ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"]


@pytest.fixture(scope="session")
def llama_server_binary() -> str:
    """The binary found: README's install command builds it into the cache (10-30 minutes, longer than
    a test may take), so that no test waits for a compiler."""
    found = find_llama_server()
    if found is None:
        pytest.fail(
            "No llama-server binary: run `specdeck-cli llama-server build` (the second half of README's "
            "install command), or set $SPECDECK_LLAMA_SERVER."
        )
    return str(found)


@pytest.fixture(scope="session")
def speculative_server(llama_server_binary, default_gguf):
    with LlamaServerProcess(llama_server_binary, default_gguf, threads=2, n_ctx=2048, spec=SPEC) as server:
        yield server


@pytest.fixture(scope="session")
def vanilla_server(llama_server_binary, default_gguf):
    with LlamaServerProcess(llama_server_binary, default_gguf, threads=2, n_ctx=2048) as server:
        yield server


def test_the_kind_is_detected_and_the_pair_described(speculative_server):
    assert detect_kind(speculative_server.url) == "llama-server"
    pair = open_remote("auto", speculative_server.url).connect()
    assert pair.kind == "llama-server" and pair.speculative and pair.n_ctx == 2048
    assert pair.model == "SmolLM2-135M-Instruct.Q4_1.gguf"
    remote = open_remote("llama-server", speculative_server.url)
    remote.connect()
    remote.generate(COPY, SamplingConfig(max_tokens=4))  # /slots names the types once a request has run
    assert remote.pair.speculation == "ngram-simple"
    assert pair.notes and "p and q are not shown" in pair.notes[0]


def test_a_streamed_reply_has_steps_rebuilt_from_the_draft_counters(speculative_server):
    remote = open_remote("llama-server", speculative_server.url)
    seen = []
    result = remote.generate(COPY, SamplingConfig(max_tokens=24), on_steps=seen.extend)
    stats = result.stats
    assert "apple, banana" in result.text
    assert [step.index for step in seen] == list(range(len(result.events)))  # each step told once, in order
    assert "".join(step.text for step in seen) == result.text
    assert stats.tokens == len(result.token_infos) == 24 and result.finish_reason == "length"
    assert stats.drafted > 0 and 0 < stats.accepted <= stats.drafted
    sources = {info.source for info in result.token_infos}
    assert Source.ACCEPTED in sources and Source.UNREPORTED not in sources
    assert stats.steps == stats.tokens - stats.accepted  # each target forward gives its accepted drafts + 1
    assert stats.tokens_per_s > 0 and stats.prefill_s > 0


def test_the_vanilla_side_of_a_comparison_runs_on_the_second_server(speculative_server, vanilla_server):
    remote = open_remote("llama-server", speculative_server.url, vanilla_url=vanilla_server.url)
    comparison = remote.compare(COPY, SamplingConfig(max_tokens=32))
    assert comparison.vanilla.stats.drafted == 0 and comparison.speculative.stats.drafted > 0
    assert {i.source for i in comparison.vanilla.token_infos} == {Source.PLAIN}
    assert comparison.vanilla.text.startswith(comparison.speculative.text[:10])


def test_each_run_of_a_side_by_side_reads_the_prompt_itself(speculative_server, vanilla_server):
    """On one server the speculative run would find the prompt the vanilla run cached (prefill 0.00 s)."""
    remote = open_remote("llama-server", speculative_server.url, vanilla_url=vanilla_server.url)
    remote.connect()
    bodies, body = [], remote._body
    remote._body = lambda *args: bodies.append(body(*args)) or bodies[-1]
    remote.generate(COPY, SamplingConfig(max_tokens=4))  # a chat reply: the prompt cache helps the next turn
    comparison = remote.compare(COPY, SamplingConfig(max_tokens=8))
    assert [b["cache_prompt"] for b in bodies] == [True, False, False]
    assert comparison.speculative.stats.prefill_s > 0 and comparison.vanilla.stats.prefill_s > 0


def test_without_a_vanilla_server_specdeck_starts_the_twin_of_a_local_one(speculative_server):
    remote = open_remote("llama-server", speculative_server.url)
    try:
        comparison = remote.compare(COPY, SamplingConfig(max_tokens=16))
        twin = remote.pair.vanilla_url
        assert twin and twin != speculative_server.url and "started on the same model file" in remote.pair.notes[-1]
        assert comparison.vanilla.stats.drafted == 0 and comparison.speculative.stats.drafted > 0
    finally:
        remote.close()
    with pytest.raises(ServerUnavailable, match="connection refused"):
        open_remote("llama-server", twin).connect()  # stopped with the engine


def test_without_a_twin_a_vanilla_run_that_drafts_is_said(speculative_server):
    """This llama.cpp build reads no per-request speculative.n_max (compiled out), so a request that
    asks for no drafts still drafts: caught by its counters, and said."""
    remote = open_remote("llama-server", speculative_server.url)
    remote.start_twin = False  # a server elsewhere, or its model file not on this machine
    with pytest.raises(SpecDeckError, match="give a vanilla URL"):
        remote.compare(COPY, SamplingConfig(max_tokens=16))


def test_a_server_killed_mid_reply_is_said_and_what_arrived_is_kept(llama_server_binary, default_gguf):
    server = LlamaServerProcess(llama_server_binary, default_gguf, threads=2, n_ctx=2048, spec=SPEC).start()
    try:
        remote = open_remote("llama-server", server.url)
        received: list[str] = []

        def on_steps(batch):
            received.extend(step.text for step in batch)
            server.kill()  # at the first steps: a reply this long is still streaming then

        with pytest.raises(ServerUnavailable, match="broke off|stopped"):
            remote.generate(COUNT, SamplingConfig(max_tokens=400), on_steps=on_steps)
        assert received and "".join(received)
    finally:
        server.stop()


def test_a_wrong_key_and_a_dead_address_say_what_to_do(llama_server_binary, default_gguf):
    with LlamaServerProcess(llama_server_binary, default_gguf, n_ctx=512, api_key="right-key") as server:
        with pytest.raises(ServerRefused, match="refused the API key.*give the key"):
            open_remote("llama-server", server.url, api_key="wrong-key").generate(COPY, SamplingConfig(max_tokens=4))
        reply = open_remote("llama-server", server.url, api_key="right-key").generate(
            COPY, SamplingConfig(max_tokens=4)
        )
        assert reply.stats.tokens == 4
        url = server.url
    with pytest.raises(ServerUnavailable, match="connection refused"):
        open_remote("llama-server", url).connect()


def test_a_cancelled_reply_ends_cancelled_with_its_text(speculative_server):
    cancel = threading.Event()
    remote = open_remote("llama-server", speculative_server.url)
    result = remote.generate(COPY, SamplingConfig(max_tokens=400), cancel=cancel, on_steps=lambda batch: cancel.set())
    assert result.finish_reason == "cancelled" and result.text and result.stats.tokens < 400


def test_the_cli_generates_on_llama_server(speculative_server, vanilla_server):
    command = [
        sys.executable,
        "-m",
        "engine.cli.main",
        "generate",
        "--server",
        speculative_server.url,
        "--vanilla-server",
        vanilla_server.url,
        "--compare",
        "--json",
        "-n",
        "24",
        "-p",
        COPY[0]["content"],
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["stats"]["drafted"] > 0 and report["vanilla"]["stats"]["drafted"] == 0


def test_llama_server_peers_run_beside_ours(llama_server_binary, default_gguf):
    from engine.bench.llama_server_peers import llama_server_peers
    from engine.bench.peers import run_peers
    from engine.bench.prompts import BenchPrompt

    prompt = BenchPrompt("copy", "reuse", tuple(COPY))
    specs = llama_server_peers(llama_server_binary, default_gguf, 1024, 2)
    assert [s.name for s in specs] == [
        "llama-server",
        "llama-server ngram-simple",
        "llama-server ngram-map-k",
        "llama-server ngram-mod",
        "llama-server ngram-cache",
    ]
    results = run_peers(specs[:2], (prompt,), {"copy": []}, {}, max_tokens=16, repeat=1, warmup=0)
    for result in results:
        assert result.error is None, result.error
        (row,) = result.prompts
        assert row.tokens == 16 and row.tokens_per_s > 0 and "apple" in row.text


def test_the_metrics_of_a_server_started_with_metrics_agree_with_the_rebuilt_steps(llama_server_binary, default_gguf):
    with LlamaServerProcess(llama_server_binary, default_gguf, n_ctx=1024, spec=[*SPEC, "--metrics"]) as server:
        remote = open_remote("llama-server", server.url)
        result = remote.generate(COPY, SamplingConfig(max_tokens=24))
    stats = result.stats
    drafting_steps = sum(1 for step in result.events if step.drafted)
    assert remote.last_metrics == {"drafts": drafting_steps, "drafted": stats.drafted, "accepted": stats.accepted}
    assert stats.drafted > 0


def test_the_benchmark_runs_on_a_llama_server_with_its_vanilla_twin(speculative_server):
    from engine.bench import format_text
    from engine.bench.prompts import BenchPrompt
    from engine.bench.remote import run_remote_benchmark
    from engine.bench.results import BenchSettings

    remote = open_remote("llama-server", speculative_server.url)
    hi = BenchPrompt(
        "hi",
        "multi-turn",
        ({"role": "user", "content": "Hi!"},),
        follow_ups=({"role": "user", "content": "Say that again, word for word."},),
    )
    prompts = (BenchPrompt("copy", "reuse", tuple(COPY)), hi)
    try:
        report = run_remote_benchmark(remote, prompts, BenchSettings(max_tokens=16, repeat=1, warmup=0))
    finally:
        remote.close()
    vanilla = [r for r in report.runs if r.mode == "vanilla"]
    speculative = [r for r in report.runs if r.mode == "speculative"]
    # The conversation runs turn by turn, each turn a row: the server is asked again with its first reply.
    assert [p.id for p in report.prompts] == ["copy", "hi/1", "hi/2"]
    assert [k.name for k in report.kinds] == ["reuse", "multi-turn"] and report.settings["prompts"] == 3
    assert len(vanilla) == len(speculative) == 3 and all(r.drafted == 0 for r in vanilla)
    assert speculative[0].drafted > 0 and all(r.tokens_per_s > 0 for r in report.runs)
    text = format_text(report)
    assert "llama-server" in text and "copy" in text and report.settings["vanilla_url"]
