"""`specdeck-cli serve` as a user starts it, and `specdeck-cli generate --server` against it.

The session's server is `specdeck-cli serve --port 0 --api-key KEY` (conftest.py): it
said where it listens and serves there. Refusals come before any model loads: a
network address without a key, a port already taken.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from engine.cli.main import main
from tests.engine.service.conftest import cli_command

pytestmark = pytest.mark.slow

PROMPT = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat"


def _refused(*args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "SPECDECK_API_KEY"}
    return subprocess.run(cli_command("serve", *args), capture_output=True, text=True, timeout=60, env=env)


def test_serve_says_where_it_listens_and_serves_there(server, openai_client):
    found = re.fullmatch(
        r"serving SmolLM2-135M-Instruct\.Q4_1 at http://127\.0\.0\.1:(\d+) \(API key required\): "
        r"OpenAI's API at \S+/v1, metrics at \S+/metrics; Ctrl\+C stops",
        server.banner,
    )
    assert found, server.banner
    assert server.url.endswith(f":{found.group(1)}") and found.group(1) != "8000"  # --port 0: a free port
    assert (
        openai_client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        .choices[0]
        .message.content
        is not None
    )
    assert "loading SmolLM2-135M-Instruct.Q4_1 (llama.cpp)" in server.log.read_text()


def test_serve_refuses_a_network_address_without_a_key_before_loading():
    done = _refused("--host", "0.0.0.0")
    assert done.returncode == 2 and done.stdout == ""
    assert "error: Binding to 0.0.0.0 makes the engine reachable from other machines: give it an API key" in done.stderr
    assert "loading" not in done.stderr


def test_serve_says_a_taken_port_before_loading(server):
    port = server.url.rsplit(":", 1)[1]
    done = _refused("--port", port)
    assert done.returncode == 2 and f"Cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "loading" not in done.stderr


def test_generate_on_a_server_prints_what_local_generate_prints(server, openai_client, capsys):
    options = ["generate", "--server", server.url, "--api-key", server.key, "-p", PROMPT, "-n", "12"]
    assert main(options) == 0
    out, err = capsys.readouterr()
    expected = (
        openai_client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=12
        )
        .choices[0]
        .message.content
    )
    assert out == expected + "\n"
    assert f"generating on {server.url}: SmolLM2-135M-Instruct.Q4_1 (llama.cpp), drafter ngram" in err
    assert re.search(r"\d+ tokens in [\d.]+ s \([\d.]+ tok/s\), \d+ steps \(target forwards\)", err)
    assert "mean acceptance length" in err

    assert main([*options, "--json", "--compare"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["text"] == expected and report["identical"] is True
    assert report["stats"]["drafted"] > 0 and report["vanilla"]["stats"]["drafted"] == 0


def test_generate_on_a_server_refuses_the_options_of_a_local_model(server, capsys):
    base = ["generate", "--server", server.url, "--api-key", server.key, "-p", "Hi"]
    assert main([*base, "--target", "other.gguf"]) == 2
    assert "error: --target is about the model loaded here, but with --server" in capsys.readouterr().err
    assert main([*base, "--k", "5"]) == 2
    assert "--k" in capsys.readouterr().err
    assert main(["generate", "--server", server.url, "--api-key", "wrong", "-p", "Hi"]) == 2
    assert "The API key is wrong" in capsys.readouterr().err


def test_generate_on_a_server_says_what_cannot_work_there(server, capsys):
    """The kind is found out by asking the server: a SpecDeck server runs --compare's vanilla side itself,
    and an address where nothing listens is said, with what to do."""
    from engine.remote.llama_server_process import free_port

    base = ["generate", "--server", server.url, "--api-key", server.key, "-p", "Hi"]
    assert main([*base, "--vanilla-server", "http://127.0.0.1:9"]) == 2
    assert "--vanilla-server is for llama-server, vLLM and SGLang" in capsys.readouterr().err
    assert main(["generate", "--server", f"http://127.0.0.1:{free_port()}", "-p", "Hi"]) == 2
    assert "connection refused): start the server, or check the address and port" in capsys.readouterr().err
