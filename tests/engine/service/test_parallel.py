"""A server with --parallel N: requests decode together, each exactly as it would alone.

The server runs here, in a thread (uvicorn on a free loopback port, the real Host and
routes), over an engine on the fake Slots backend (tests/factories/fake.py): a Markov
chain whose every forward is held while the test's `gate` is shut, and lasts a few
milliseconds once it is open, so that requests overlap in the batch as the test arranges.
Prompts are letters a..h (the fake's vocabulary). "Alone" means the same request sent
when nothing else runs: a batch of one, the path a --parallel 1 server takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit

import openai
import pytest

from engine.api import Engine
from engine.config import EngineConfig
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.registry import make_drafter
from engine.service.batch_loop import Generation
from engine.service.host import Host
from engine.service.paths import ServerPaths
from tests.engine.service.conftest import Raw, cli_command
from tests.factories.fake import MarkovSlotsBackend, random_transition

KEY = "parallel-key-5e1f7c"
PATH = "/v1/chat/completions"
P = random_transition(8, seed=3, sharpness=1.5)
REQUESTS = [  # (content, max_tokens, extra fields): each request's own settings, drafter and stop strings
    ("abcabcab", 30, {}),
    ("hgfhgf", 24, {"specdeck": {"drafter": "none"}}),
    ("ddaadd", 36, {"temperature": 1.0, "seed": 7}),
    ("cbacba", 28, {"speculative.n_max": 1}),
    ("ddaadd", 30, {"specdeck": {"drafter": "suffix"}}),  # a drafter made for this request alone
    ("gegege", 26, {"stop": ["egbe"]}),
]


class PacedSlots(MarkovSlotsBackend):
    """The fake Slots backend with every forward (the target's and its slots') held while `gate` is
    shut, then `delay_s` long: a request joins a batch the test can see, and steps take time."""

    def __init__(self, *args, delay_s: float = 0.004, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.delay_s = delay_s
        self.refuse_slots = False  # open_slot fails as an allocation does when memory runs out

    def _pace(self) -> None:
        assert self.gate.wait(60), "the test never opened the gate"
        time.sleep(self.delay_s)

    def _forward(self, tokens, all_logits):
        self._pace()
        return super()._forward(tokens, all_logits)

    def open_slot(self):
        if self.refuse_slots:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        slot = super().open_slot()
        plain = slot._forward

        def paced(tokens, all_logits):
            self._pace()
            return plain(tokens, all_logits)

        slot._forward = paced
        return slot


def fake_engine(parallel: int, n_ctx: int = 256) -> Engine:
    target = PacedSlots(P, n_ctx=n_ctx, max_slots=max(parallel, 1))
    config = EngineConfig(target="default", drafter="ngram", k=3, parallel=parallel, measure_costs=False)
    return Engine(target, make_drafter(target, config), config, CostModel())


@contextlib.contextmanager
def serving(parallel: int = 2, queue: int = 1, n_ctx: int = 256):
    """A real server on loopback over `fake_engine(parallel)`: (its url, its Host, the backend)."""
    import uvicorn

    from engine.service.run import LOOPBACK, bind
    from engine.service.server import create_app

    engine = fake_engine(parallel, n_ctx)
    host = Host(engine, queue_limit=queue)
    sock = bind(LOOPBACK, 0)
    app = create_app(host, api_key=KEY, paths=ServerPaths.trusting_client())
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://{LOOPBACK}:{sock.getsockname()[1]}", host, engine.target
    finally:
        engine.target.gate.set()
        server.should_exit = True
        thread.join(10)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def ask(url: str, content: str, max_tokens: int, extra: dict, headers: dict | None = None) -> tuple[str, dict, str]:
    """A streamed chat reply: (its text, its timings, its finish reason)."""
    fields = {"temperature": 0.0, **extra}
    standard = {k: fields.pop(k) for k in ("temperature", "seed") if k in fields}
    chunks = client(url).chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        stream=True,
        extra_body=fields,
        extra_headers=headers,
        **standard,
    )
    text, timings, finish = "", {}, None
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
            timings = chunk.model_extra.get("timings", {})
    return text, timings, finish


def at_once(url: str, requests: list) -> tuple[list[threading.Thread], list]:
    """Each request on a thread of its own, a moment apart: the threads, and where their results (or
    errors) will be, in order."""
    results: list = [None] * len(requests)

    def run(i: int) -> None:
        try:
            results[i] = ask(url, *requests[i])
        except Exception as error:  # noqa: BLE001 - the test looks at it
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # in this order: the first ones join the batch, the last one waits
    return threads, results


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.01)


def test_three_requests_with_parallel_two_decode_two_at_a_time_each_as_alone():
    with serving(parallel=2, queue=1) as (url, host, backend):
        chosen = REQUESTS[:3]
        alone = [ask(url, *request) for request in chosen]
        assert all(t["batch_n_max"] == 1 for _, t, _ in alone)
        backend.gate.clear()
        threads, results = at_once(url, chosen)
        wait_for(lambda: host.running == 2 and host.waiting == 1)
        health = Raw(url, KEY).json("GET", "/health")[1]
        assert (health["job"], health["running"], health["waiting"]) == ("generate", 2, 1)
        backend.gate.set()
        for thread in threads:
            thread.join(60)
        for (text, _, finish), (text_alone, _, finish_alone) in zip(results, alone):
            assert (text, finish) == (text_alone, finish_alone)
        assert max(len(b) for b in backend.batches) == 2  # two sequences in a forward, never three
        together = [timings for _, timings, _ in results if timings["batch_n_max"] == 2]
        assert len(together) >= 2 and all(1 < timings["batch_n_mean"] <= 2 for timings in together)


def test_requests_that_join_mid_run_change_no_others_tokens():
    with serving(parallel=3, queue=len(REQUESTS)) as (url, host, backend):
        alone = [ask(url, *request) for request in REQUESTS]
        threads, results = at_once(url, REQUESTS)  # each joins a batch that is already decoding
        for thread in threads:
            thread.join(60)
        assert [r[0] for r in results] == [a[0] for a in alone]
        assert [r[2] for r in results] == [a[2] for a in alone] and results[-1][2] == "stop"  # its stop string
        assert max(len(b) for b in backend.batches) >= 2


def _stream(url: str, content: str, max_tokens: int, job: str) -> tuple[http.client.HTTPConnection, object]:
    """A streaming chat request named `job` (X-SpecDeck-Job) whose first chunk has come."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", "X-SpecDeck-Job": job}
    connection.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: {")
    return connection, response


def _text(response) -> tuple[str, str | None]:
    """The rest of a stream: its text and finish reason."""
    text, finish = "", None
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        choice = json.loads(line[6:])["choices"][0]
        text += choice["delta"].get("content") or ""
        finish = choice.get("finish_reason") or finish
    return text, finish


@pytest.mark.parametrize("how", ["job cancel", "disconnect"])
def test_cancelling_one_request_leaves_the_others_tokens_unchanged(how):
    with serving(parallel=2, queue=1) as (url, host, backend):
        raw = Raw(url, KEY)
        other_alone = ask(url, "hgfhgf", 60, {})
        whole = ask(url, "abcabcab", 200, {})[0]
        backend.delay_s = 0.01  # the other reply outlasts the cancel by far
        connection, cancelled = _stream(url, "abcabcab", 200, job="first")
        threads, results = at_once(url, [("hgfhgf", 60, {})])
        wait_for(lambda: host.running == 2)
        if how == "job cancel":
            assert raw.json("POST", "/specdeck/cancel", {"job": "first"})[1] == {"cancelled": True}
            text, finish = _text(cancelled)
            assert finish == "stop" and len(text) < len(whole) and whole.startswith(text)
        else:
            connection.sock.shutdown(socket.SHUT_RDWR)
            cancelled.close()
        connection.close()
        wait_for(lambda: host.running == 1)  # the first has left the batch; the other decodes on
        threads[0].join(60)
        assert results[0][0] == other_alone[0]
        assert raw.metrics()['specdeck:request_success_total{finished_reason="cancelled"}'] == 1


def test_a_job_that_needs_the_engine_alone_waits_for_the_batch_to_drain_and_later_replies_wait_for_it():
    engine = fake_engine(parallel=2)
    host = Host(engine, queue_limit=4)
    log: list = []

    def start_of(name: str, content: str, n: int):
        def start(engine, cancel, emit) -> Generation:
            def on_step(step) -> None:
                log.append((name, "step", step.batch))
                emit(step)

            prompt = engine.prompt_ids([{"role": "user", "content": content}])
            sampling = SamplingConfig(temperature=0.0, max_tokens=n)
            return Generation(prompt, sampling, on_step, close=lambda: log.append((name, "end")))

        return start

    def load(cancel, emit) -> None:  # what a load or a benchmark sees of the engine
        log.append(("load", "runs", host.running, host.batch_loop.batch is None))

    async def drain(items) -> list:
        return [item async for item in items]

    async def scenario() -> None:
        engine.target.gate.clear()
        first = [asyncio.create_task(drain(host.generate(start_of(f"g{i}", "abc", 20 + i)))) for i in (1, 2)]
        while host.running < 2:
            await asyncio.sleep(0.01)
        alone = asyncio.create_task(drain(host.run("load", load)))
        await asyncio.sleep(0.05)
        later = asyncio.create_task(drain(host.generate(start_of("g3", "hgf", 10))))
        await asyncio.sleep(0.05)
        assert (host.running, host.waiting) == (2, 2)
        engine.target.gate.set()
        await asyncio.gather(*first, alone, later)

    asyncio.run(scenario())
    ends = {entry[0]: i for i, entry in enumerate(log) if entry[1] in ("end", "runs")}
    assert ends["g1"] < ends["load"] and ends["g2"] < ends["load"]
    assert log[ends["load"]] == ("load", "runs", 1, True)  # alone (itself), the batch's slots freed
    assert min(i for i, entry in enumerate(log) if entry[0] == "g3") > ends["load"]
    assert 2 in {entry[2] for entry in log if entry[0] in ("g1", "g2") and entry[1] == "step"}


def test_past_the_queue_a_request_gets_503_while_the_others_are_served():
    with serving(parallel=2, queue=1) as (url, host, backend):
        backend.gate.clear()
        threads, results = at_once(url, REQUESTS[:3])
        wait_for(lambda: host.running == 2 and host.waiting == 1)
        with pytest.raises(openai.APIStatusError) as refused:
            ask(url, "abc", 5, {})
        assert refused.value.status_code == 503
        assert "busy" in refused.value.body["message"] and refused.value.body["type"] == "server_busy"
        backend.gate.set()
        for thread in threads:
            thread.join(60)
        assert all(isinstance(result, tuple) and result[2] == "length" for result in results)


def test_a_request_without_room_is_refused_and_the_running_ones_go_on():
    with serving(parallel=2, queue=1, n_ctx=64) as (url, host, backend):
        alone = ask(url, "abcabcab", 40, {})
        backend.delay_s = 0.01
        backend.gate.clear()
        threads, results = at_once(url, [("abcabcab", 40, {})])
        wait_for(lambda: host.running == 1)
        backend.refuse_slots = True  # the second sequence's cache cannot be allocated
        threading.Timer(0.3, backend.gate.set).start()  # once the next request waits to join
        with pytest.raises(openai.APIStatusError) as no_memory:
            ask(url, "hgf", 5, {})
        said = no_memory.value.body["message"]
        assert said.startswith("Not enough memory to open the cache of one more sequence beside the 1") and (
            "--parallel" in said
        )
        backend.refuse_slots = False
        with pytest.raises(openai.BadRequestError) as too_long:  # its prompt does not fit its slot's context
            ask(url, "abcdefgh" * 9, 5, {})
        assert "context window holds 64" in too_long.value.body["message"]
        threads[0].join(60)
        assert results[0][0] == alone[0]


def test_metrics_count_the_batch_size_each_step_ran_at():
    with serving(parallel=2, queue=1) as (url, host, backend):
        raw = Raw(url, KEY)
        ask(url, "abc", 10, {})
        alone = raw.metrics()
        assert alone['specdeck:step_batch_size_bucket{le="1"}'] == alone["specdeck:step_batch_size_count"] > 0
        backend.gate.clear()
        threads, _ = at_once(url, REQUESTS[:2])
        wait_for(lambda: host.running == 2)
        assert raw.metrics()["specdeck:num_requests_running"] == 2
        backend.gate.set()
        for thread in threads:
            thread.join(60)
        after = raw.metrics()
        together = after["specdeck:step_batch_size_count"] - alone["specdeck:step_batch_size_count"]
        at_two = after['specdeck:step_batch_size_bucket{le="2"}'] - after['specdeck:step_batch_size_bucket{le="1"}']
        assert at_two > 0 and together > at_two  # both requests' steps at 2; the longer one's last alone
        assert after["specdeck:step_batch_size_sum"] > after["specdeck:step_batch_size_count"]


def test_each_request_in_a_batch_gets_its_own_steps_provenance():
    """`specdeck.events` in a batch: each request's steps, with its own drafter's statistics (one of the
    pool for the second request) or none for the plain one, tokens marked by where they came from."""
    with serving(parallel=2, queue=1) as (url, host, backend):
        raw = Raw(url, KEY)

        def body(content: str, drafter: str | None) -> dict:
            options = {"events": True, **({"drafter": drafter} if drafter else {})}
            messages = [{"role": "user", "content": content}]
            return {"messages": messages, "max_tokens": 30, "temperature": 0, "specdeck": options}

        replies: dict = {}
        backend.gate.clear()
        asks = {"ngram": body("abcabcab", None), "pool": body("cbacbacb", None), "plain": body("hgfhgf", "none")}
        threads = []
        for name, request in asks.items():
            threads.append(
                threading.Thread(target=lambda n=name, r=request: replies.update({n: raw.json("POST", PATH, r)}))
            )
            threads[-1].start()
            time.sleep(0.05)
        wait_for(lambda: host.running == 2)
        backend.gate.set()
        for thread in threads:
            thread.join(60)
        for name, (status, reply) in replies.items():
            assert status == 200
            events = reply["specdeck"]
            text = "".join(item["step"]["text"] for item in events)
            assert text == reply["choices"][0]["message"]["content"]
            sources = {token["source"] for item in events for token in item["step"]["tokens"]}
            if name == "plain":
                assert {item["run"] for item in events} == {"vanilla"} and sources == {"plain"}
            else:
                assert {item["run"] for item in events} == {"speculative"}
                assert all(item["drafter_stats"] is not None for item in events)
        assert max(item["step"]["batch"] for _, reply in replies.values() for item in reply["specdeck"]) == 2


def test_specdecks_own_generate_joins_the_batch_with_its_steps_records():
    with serving(parallel=2, queue=1) as (url, host, backend):
        raw = Raw(url, KEY)
        body = {"messages": [{"role": "user", "content": "abcabc"}], "sampling": {"temperature": 0, "max_tokens": 20}}
        backend.gate.clear()
        threads, results = at_once(url, [("hgfhgf", 30, {})])
        wait_for(lambda: host.running == 1)
        threading.Timer(0.2, backend.gate.set).start()
        status, _, data = raw.request("POST", "/specdeck/generate", body)
        assert status == 200
        steps = [s for line in data.splitlines() if line.startswith(b"data: {") for s in json.loads(line[6:])["steps"]]
        assert steps[-1]["finish_reason"] == "length" and steps[0]["run"] == "speculative"
        assert steps[-1]["costs"] is not None and steps[-1]["drafter_stats"] is not None
        assert max(step["batch"] for step in steps) == 2
        threads[0].join(60)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--parallel", "0"], "--parallel must be a whole number of 1 or more"),
        (["--parallel", "-1"], "--parallel must be a whole number of 1 or more"),
        (["--parallel", "two"], "--parallel must be a whole number of 1 or more"),
        (["--parallel", "100000"], "At most"),  # 100000 caches of 4096 tokens: the number that fits is said
        (["--parallel", "2", "--drafter", "medusa"], "drafts for one sequence at a time"),
    ],
)
def test_serve_refuses_a_parallel_it_cannot_serve_before_loading(args, said):
    done = subprocess.run(
        cli_command("serve", "-m", "default", *args, "--port", "0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and said in done.stderr
    assert "loading" not in done.stderr and done.stdout == ""


def test_a_load_request_with_a_parallel_it_cannot_serve_is_a_400():
    with serving(parallel=2) as (url, host, _):
        raw = Raw(url, KEY)
        config = EngineConfig(target="default").to_dict()
        for value, said in ((0, "--parallel must be a whole number"), (-3, "whole number"), (10**6, "At most")):
            status, body = raw.json("POST", "/specdeck/load", {"config": {**config, "parallel": value}})
            assert status == 400 and said in body["error"]["message"]
        assert host.engine.config.parallel == 2  # nothing was freed or loaded
