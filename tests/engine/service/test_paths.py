"""ServerPaths, the server's rule for what a request may name on its machine: the cases a real
server is too slow to walk through one by one (test_serve_paths.py has the real server)."""

from __future__ import annotations

import os

import pytest

from engine import ConfigError, EngineConfig, SpecDeckError
from engine.bench.results import BenchSettings
from engine.service.paths import ServerPaths, server_paths


@pytest.fixture()
def served(tmp_path) -> ServerPaths:
    for name in ("models", "data", "train"):
        (tmp_path / name).mkdir()
    (tmp_path / "models" / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "data" / "fox.txt").write_text("the fox", encoding="utf-8")
    return ServerPaths.served(
        EngineConfig(target=str(tmp_path / "started.gguf")),
        train_dir=tmp_path / "train",
        data_dir=tmp_path / "data",
        models_dirs=[tmp_path / "models"],
    )


def refused(call, *args, match: str | None = None):
    with pytest.raises(SpecDeckError, match=match) as caught:
        call(*args)
    return str(caught.value)


def test_a_bench_never_runs_a_program_a_request_names_even_for_the_apps_engine(served):
    for paths in (served, ServerPaths.trusting_client()):
        message = refused(paths.bench_settings, BenchSettings(peers=True, llama_server="/tmp/evil.sh"))
        assert "--llama-server" in message
    assert served.bench_settings(BenchSettings(peers=True)).llama_server is None  # found the server's own way


def test_the_operators_llama_server_is_checked_at_start_and_used_by_every_bench(tmp_path):
    with pytest.raises(SpecDeckError, match="No llama-server program"):
        ServerPaths.served(llama_server=tmp_path / "missing")
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    paths = ServerPaths.served(llama_server=binary, train_dir=tmp_path / "train")
    assert paths.bench_settings(BenchSettings(peers=True)).llama_server == str(binary)


def test_models_are_the_started_ones_names_and_files_under_the_model_folders(served, tmp_path):
    for spec in (
        "default",
        str(tmp_path / "started.gguf"),
        "org/name",
        "org/name@main",
        "org/name:model.Q4_0.gguf",
        "ollama:llama3.2:1b",
        str(tmp_path / "models" / "m.gguf"),
        str(tmp_path / "train" / "run1"),
    ):
        served.check_config(EngineConfig(target=spec))
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(b"GGUF")
    outside = (
        str(secret),
        str(tmp_path / "models" / ".." / "secret.gguf"),
        "org/name:/etc/passwd",
        "org/name:../../../secret.gguf",
        "~/secret.gguf",
        "ollama:../../x",
    )
    for spec in outside:
        assert "--models-dir" in refused(served.check_config, EngineConfig(target=spec)), spec
    assert "draft model" in refused(served.check_config, EngineConfig().with_drafter("model", draft=str(secret)))
    assert "medusa heads" in refused(served.check_config, EngineConfig().with_drafter("medusa", heads=str(tmp_path)))
    ServerPaths.trusting_client().check_config(EngineConfig(target=str(secret)))  # the app's own engine


def test_a_model_folder_reached_through_a_link_counts_and_a_link_out_of_one_does_not(served, tmp_path):
    (tmp_path / "alias").symlink_to(tmp_path / "models")
    served.check_model(str(tmp_path / "alias" / "m.gguf"))  # really under --models-dir
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "s.gguf").write_bytes(b"GGUF")
    (tmp_path / "out").symlink_to(tmp_path / "secret")
    refused(served.check_model, str(tmp_path / "out" / "s.gguf"))  # neither really nor lexically under one


def test_training_writes_under_the_train_dir_by_run_name_and_reads_the_data_dir(served, tmp_path):
    options = served.train_options({"target_spec": "default", "out_dir": "run-1.b", "data": ["builtin", "fox.txt"]})
    assert options["out_dir"] == str(tmp_path / "train" / "run-1.b")
    assert options["data"] == ["builtin", str(tmp_path / "data" / "fox.txt")]
    for name in ("..", ".", "../x", "a/b", str(tmp_path / "x"), "", ".hidden", "a\\b", None, 3):
        assert "run name" in refused(served.train_options, {"target_spec": "default", "out_dir": name}), name
    for data in (str(tmp_path / "data" / "fox.txt"), "../secret", "~/x", str(tmp_path)):
        message = refused(served.train_options, {"target_spec": "default", "out_dir": "r", "data": [data]})
        assert "--data-dir" in message, data
    no_data = ServerPaths.served(train_dir=tmp_path / "train")
    assert "was not given" in refused(no_data.train_options, {"target_spec": "default", "out_dir": "r", "data": "x"})
    assert "--models-dir" in refused(served.train_options, {"target_spec": str(tmp_path), "out_dir": "r"})
    assert served.run_dir("run-1.b") == tmp_path / "train" / "run-1.b"
    assert "run name" in refused(served.run_dir, str(tmp_path / "train" / "run-1.b"))


def test_the_apps_engine_takes_its_clients_paths_only_with_a_key(tmp_path):
    trusting = ServerPaths.trusting_client()
    options = {"target_spec": str(tmp_path / "m"), "out_dir": str(tmp_path / "heads"), "data": [str(tmp_path)]}
    assert trusting.train_options(options) == options
    assert trusting.run_dir(str(tmp_path / "heads")) == tmp_path / "heads"
    with pytest.raises(ConfigError, match="API key"):
        server_paths(trusting, None, api_key=None)
    assert server_paths(trusting, None, api_key="k") is trusting


def test_the_recorded_command_is_one_printable_line(served):
    assert served.command("specdeck-cli train-heads --out 'my heads'") == "specdeck-cli train-heads --out 'my heads'"
    assert served.command(None) is None
    for text in ("a\nb", "a\x1b[2Jb", "x" * 5000):
        refused(served.command, text)


def test_a_train_dir_of_another_user_is_refused_at_start(tmp_path):
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("needs root, to own a folder as another user")
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chown(folder, 12345, 12345)
    with pytest.raises(ConfigError, match="another user"):
        ServerPaths.served(train_dir=folder)
