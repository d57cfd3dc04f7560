"""llama.cpp's GPU layers: "auto" by default, which offloads nothing on any build until offload has
run on a GPU (issue 40); a count or "all" offloads; the choice said where a user sees the loaded model."""

from __future__ import annotations

import llama_cpp
import pytest

from engine.backends import gpu_layers
from engine.backends.gpu_layers import resolve_gpu_layers
from engine.backends.llama_cpp import LlamaCppBackend
from engine.cli.main import build_parser, main
from engine.cli.options import drafter_choice
from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.models.load_options import draft_load_options, target_load_options

CPU_BUILD = not llama_cpp.llama_supports_gpu_offload()


@pytest.fixture
def gpu_build(monkeypatch):
    """A llama.cpp build that offloads, as far as SpecDeck can tell."""
    monkeypatch.setattr(gpu_layers, "llama_cpp_offloads", lambda: True)


@pytest.mark.skipif(not CPU_BUILD, reason="this llama-cpp-python build offloads to a GPU")
def test_the_default_keeps_every_layer_on_the_cpu_of_a_cpu_only_build():
    assert EngineConfig().gpu_layers == "auto"
    assert resolve_gpu_layers(EngineConfig().gpu_layers) == 0


def test_the_default_offloads_nothing_even_on_a_build_that_offloads(gpu_build):
    assert resolve_gpu_layers(EngineConfig().gpu_layers) == 0


@pytest.mark.parametrize("offloads", [False, True])
@pytest.mark.parametrize("asked, count", [(0, 0), (12, 12), (-1, -1), ("all", -1), ("12", 12), (" Auto ", 0)])
def test_a_count_the_user_gave_is_passed_through_whatever_the_build(monkeypatch, offloads, asked, count):
    monkeypatch.setattr(gpu_layers, "llama_cpp_offloads", lambda: offloads)
    assert resolve_gpu_layers(asked) == count


@pytest.mark.parametrize("bad", ["lots", -2, "-2", 1.5, True, None])
def test_a_value_that_is_no_count_is_refused_with_what_to_give(bad):
    with pytest.raises(ConfigError, match=r"--draft-gpu-layers .*auto.*-1 or all.*0 \(none\)"):
        resolve_gpu_layers(bad, "--draft-gpu-layers")


def test_the_flags_parse_auto_all_and_counts_and_an_unset_draft_follows_the_target():
    parser = build_parser()
    assert parser.parse_args(["generate", "-p", "hi"]).gpu_layers == "auto"
    assert parser.parse_args(["generate", "-p", "hi", "-ngl", "30"]).gpu_layers == 30
    args = parser.parse_args(["generate", "-p", "hi", "--gpu-layers", "12", "--draft", "d.gguf"])
    name, options = drafter_choice(args)
    config = EngineConfig(gpu_layers=args.gpu_layers).with_drafter(name, draft=options.draft)
    assert draft_load_options(config.drafter_options(), target_load_options(config))["gpu_layers"] == 12
    args = parser.parse_args(["generate", "-p", "hi", "--draft", "d.gguf", "--draft-gpu-layers", "auto"])
    assert drafter_choice(args)[1].gpu_layers == "auto"


def test_a_bad_flag_is_one_clear_line_before_anything_loads(capsys):
    assert main(["generate", "--prompt", "hi", "--gpu-layers", "lots"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-layers lots" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["auto", 0, -1, 12])
def test_saved_configs_keep_their_gpu_layers(value):
    config = EngineConfig(gpu_layers=value).with_drafter("model", draft="d.gguf", gpu_layers=value)
    assert EngineConfig.from_dict(config.to_dict()) == config
    old = {"version": 1, "target": "default", "drafter": "ngram", "gpu_layers": 0}  # saved before "auto"
    assert EngineConfig.from_dict(old).gpu_layers == 0


# -- what the loaded model says --------------------------------------------------------------


@pytest.mark.skipif(not CPU_BUILD, reason="this llama-cpp-python build offloads to a GPU")
def test_a_cpu_only_build_says_its_layers_stay_on_the_cpu(default_gguf):
    backend = LlamaCppBackend(default_gguf, n_ctx=256)
    try:
        assert backend.info.placement == "on the CPU: this llama.cpp build has no GPU offload"
        assert backend.info.device == "cpu"
    finally:
        backend.close()


@pytest.mark.parametrize(
    "asked, said",
    [
        ("auto", "on the CPU: GPU offload is opt-in (--gpu-layers all or a count; not yet verified on a GPU)"),
        ("all", "all 30 layers on the GPU (opt-in, not yet verified on a GPU)"),
        (12, "12 of 30 layers on the GPU, the rest on the CPU (opt-in, not yet verified on a GPU)"),
        (0, "on the CPU (GPU layers 0)"),
    ],
)
def test_a_build_that_offloads_says_how_many_layers_went_on_the_gpu(default_gguf, gpu_build, asked, said):
    backend = LlamaCppBackend(default_gguf, n_ctx=256, n_gpu_layers=asked)  # this CPU build ignores them
    try:
        assert backend.info.placement == said
        assert backend.info.device == ("cpu" if asked in ("auto", 0) else f"cpu+{12 if asked == 12 else 30} gpu layers")
    finally:
        backend.close()


@pytest.mark.skipif(not CPU_BUILD, reason="this llama-cpp-python build offloads to a GPU")
def test_generate_says_where_the_layers_went(capsys):
    assert main(["generate", "--prompt", "Say hi.", "--max-tokens", "2", "--k", "2"]) == 0
    err = capsys.readouterr().err
    assert "SmolLM2-135M-Instruct" in err and "on the CPU: this llama.cpp build has no GPU offload" in err


def test_generate_on_a_gpu_build_says_offload_is_opt_in(capsys, gpu_build):
    assert main(["generate", "--prompt", "Say hi.", "--max-tokens", "2", "--k", "2"]) == 0
    err = capsys.readouterr().err
    assert "SmolLM2-135M-Instruct.Q4_1: on the CPU: GPU offload is opt-in (--gpu-layers all or a count" in err


def test_the_choice_reaches_the_window_over_the_wire_and_an_older_server_still_reads(default_llama):
    from dataclasses import asdict, replace

    from engine.service.wire import model_info_from_dict, model_info_to_dict

    info = replace(default_llama.info, placement="all 30 layers on the GPU")
    assert model_info_from_dict(model_info_to_dict(info)) == info
    older = {k: v for k, v in asdict(info).items() if k != "placement"}  # a server from before the field
    assert model_info_from_dict(older).placement == ""
