"""`specdeck-cli serve` and a hostile user of the same machine: what a request may name on the server's machine.

A real server, as `specdeck-cli serve -m default --port 0` starts it, keyless on loopback
(any local user reaches it), in a working folder of its own, with its cache ($SPECDECK_CACHE,
so its train folder) and a model folder ($SPECDECK_MODEL_DIRS, holding a tiny Llama) in the
test's temporary folder. Each test sends what an attacker would and looks where they would:
the marker a script writes, the bytes of a config.json, the folders that appear.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.engine.service.conftest import Raw, start_server, stop_server

pytestmark = pytest.mark.slow

PROMPT = {"id": "hello", "kind": "open", "messages": [{"role": "user", "content": "Say hello."}]}
RUN = "fox-run"
COMMAND = "specdeck-cli train-heads --out fox-run"


class Served:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.train_dir = root / "cache" / "serve" / "train"
        self.models = root / "models"
        self.cwd = root / "work" / "here"  # where relative paths would land: inside the test's folder


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.factories.hf_models import make_tiny_llama

    served = Served(tmp_path_factory.mktemp("serve-paths"))
    served.cwd.mkdir(parents=True)
    make_tiny_llama(served.models / "tiny-llama", seed=0)
    env = {"SPECDECK_CACHE": str(served.root / "cache"), "SPECDECK_MODEL_DIRS": str(served.models)}
    args = ["-m", "default", "--backend", "llama.cpp", "--drafter", "ngram", "-c", "512"]
    server = start_server(args, served.root / "stderr.log", env=env, cwd=served.cwd)
    served.raw = Raw(server.url, None)  # no key: anyone on the machine
    served.config = loaded(served)  # what it was started with
    yield served
    stop_server(server)


def post(served: Served, path: str, body: dict, timeout: float = 600) -> tuple[int, list[dict]]:
    """The status and the JSON items of the reply: one object, or a stream's events."""
    status, _, data = served.raw.request("POST", path, body, key=None, timeout=timeout)
    text = data.decode()
    if not text.startswith("data: "):
        return status, [json.loads(text)]
    return status, [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def message(items: list[dict]) -> str:
    return items[-1].get("error", {}).get("message", "") if items else ""


def train(served: Served, out_dir: str, data=("builtin",), **more) -> tuple[int, list[dict]]:
    options = {
        "target_spec": str(served.models / "tiny-llama"),
        "data": list(data),
        "out_dir": out_dir,
        "steps": 2,
        "batch_size": 2,
        "seq_len": 32,
        "val_windows": 2,
        "max_builtin_chars": 4000,
        "checkpoint_every": 100,
    }
    return post(served, "/specdeck/train", {"options": {**options, **more}, "resume": False, "command": COMMAND})


def loaded(served: Served) -> dict | None:
    status, _, data = served.raw.request("GET", "/specdeck/info", key=None)
    assert status == 200
    pair = json.loads(data)["loaded"]
    return None if pair is None else pair["config"]


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def trained(served) -> list[dict]:
    status, items = train(served, RUN)
    assert status == 200 and "result" in items[-2], items[-3:]
    return items


def test_a_bench_request_cannot_make_the_server_run_a_program(served, tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    script.chmod(0o755)
    settings = {
        "max_tokens": 4,
        "repeat": 1,
        "warmup": 0,
        "peers": True,
        "measure_bandwidth": False,
        "llama_server": str(script),
    }

    body = {"config": served.config, "prompts": [PROMPT], "settings": settings}
    status, items = post(served, "/specdeck/bench", body)

    assert not marker.exists()  # the script never ran
    assert status == 400 and "--llama-server" in message(items), items[-1:]


def test_training_cannot_write_into_a_folder_the_client_names(served, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    original = b'{"owner": "root", "model_type": "llama"}\n'
    (victim / "config.json").write_bytes(original)

    status, items = train(served, str(victim))

    assert (victim / "config.json").read_bytes() == original
    assert files_under(victim) == ["config.json"]  # no training/ beside it
    assert status == 400 and "run name" in message(items), items[-1:]


def test_run_names_that_climb_or_are_paths_are_refused_and_write_nothing(served, tmp_path):
    work = served.cwd.parent  # ".." from the server's working folder
    before = files_under(work)
    for name in ("..", "../../escaped", str(tmp_path / "absolute"), "a/b"):
        status, items = train(served, name)
        assert status == 400 and "run name" in message(items), (name, items[-1:])
    assert files_under(work) == before
    assert not (served.root / "escaped").exists() and not (tmp_path / "absolute").exists()
    assert not (served.train_dir / "a").exists()


def test_training_data_outside_the_server_is_refused(served, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "diary.txt").write_text("the combination is 12-34-56 " * 200, encoding="utf-8")

    status, items = train(served, "reads-secret", data=[str(secret)])

    assert status == 400 and "--data-dir" in message(items), items[-1:]
    assert not (served.train_dir / "reads-secret").exists()


def test_a_run_name_trains_into_the_servers_own_train_folder(served, trained):
    result = trained[-2]["result"]
    folder = served.train_dir / RUN
    assert result["out_dir"] == str(folder) and (result["step"], result["cancelled"]) == (2, False)
    assert json.loads((folder / "config.json").read_text())["specdeck"]["training"]["command"] == COMMAND  # as sent
    assert (folder / "training").is_dir()
    assert oct(served.train_dir.stat().st_mode & 0o777) == oct(0o700)  # no other user plants links there

    status, items = post(served, "/specdeck/checkpoint", {"out_dir": RUN})
    assert status == 200 and items[0]["info"]["step"] == 2 and len(items[0]["history"]["loss"]) == 2


def test_a_checkpoint_is_read_only_from_the_servers_train_folder(served, trained, tmp_path):
    copy = tmp_path / "elsewhere"
    shutil.copytree(served.train_dir / RUN, copy)  # a real run, outside the server's folder

    for out_dir in (str(copy), str(served.train_dir / RUN), "../" + RUN):
        status, items = post(served, "/specdeck/checkpoint", {"out_dir": out_dir})
        assert status == 400 and "run name" in message(items), (out_dir, items)


def test_a_model_outside_the_servers_folders_is_refused_and_the_loaded_pair_stays(served, tmp_path):
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(b"GGUF" + b"\0" * 64)
    status, _ = post(served, "/specdeck/load", {"config": served.config})  # the model it was started with
    assert status == 200 and loaded(served) == served.config
    outside = {**served.config, "target": str(secret)}

    for path, body in (
        ("/specdeck/load", {"config": outside}),
        ("/specdeck/preflight", {"config": outside}),
        ("/specdeck/bench", {"config": outside, "prompts": [PROMPT], "settings": {"max_tokens": 2}}),
    ):
        status, items = post(served, path, body)
        assert status == 400 and "--models-dir" in message(items), (path, items[-1:])
    assert loaded(served) == served.config

    inside = {**served.config, "target": str(served.models / "tiny-llama"), "backend": "auto"}
    status, items = post(served, "/specdeck/preflight", {"config": inside})  # $SPECDECK_MODEL_DIRS: allowed
    assert status == 200, items


def test_a_load_that_fails_leaves_the_pair_that_was_loaded_answering(served):
    broken = served.models / "broken.gguf"  # a file the server may read, whose load fails past the header
    broken.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 4096)
    assert loaded(served) == served.config

    status, items = post(served, "/specdeck/load", {"config": {**served.config, "target": str(broken)}})

    assert "was loaded again and answers as before" in message(items), (status, items[-1:])  # the stream's last word
    assert loaded(served) == served.config
    status, items = post(served, "/v1/chat/completions", {"messages": PROMPT["messages"], "max_tokens": 4})
    assert status == 200 and items[0]["choices"][0]["message"]["content"]


def test_after_a_training_the_pair_that_was_loaded_answers_again(served, trained):
    assert trained[0] == {"unloaded": served.config}
    assert "was loaded again" in trained[-1]["reloaded"] and "result" in trained[-2]
    assert loaded(served) == served.config
    status, items = post(served, "/v1/chat/completions", {"messages": PROMPT["messages"], "max_tokens": 4})
    assert status == 200 and items[0]["choices"][0]["message"]["content"]
