"""The pair dialog's GPU layers: "auto" by default, "all" or a count typed or picked, the draft's
"as the target"; the check and the status line say what llama.cpp will do with them."""

from __future__ import annotations

from types import SimpleNamespace

import llama_cpp
import pytest
from PySide6.QtCore import Qt

from app.shell import main_window
from engine import EngineConfig, ModelInfo
from engine.backends import gpu_layers
from tests.app.conftest import STRICT_QT_LOG
from tests.app.pair.test_pair_dialog import run_check

pytestmark = STRICT_QT_LOG


def finding(dialog, title: str):
    matches = [f for f in dialog.findings_list() if f.title == title]
    assert matches, [f.title for f in dialog.findings_list()]
    return matches[0]


def type_into(qtbot, field, text: str) -> None:
    field.lineEdit().clear()
    qtbot.keyClicks(field.lineEdit(), text)
    qtbot.keyClick(field.lineEdit(), Qt.Key_Return)


def test_the_default_is_auto_and_typed_counts_and_all_come_back_as_numbers(qtbot, dialog):
    field = dialog.form.gpu_layers
    assert field.currentText() == "auto" and dialog.engine_config().gpu_layers == "auto"
    type_into(qtbot, field, "12")
    assert dialog.engine_config().gpu_layers == 12
    type_into(qtbot, field, "all")
    assert dialog.engine_config().gpu_layers == -1
    type_into(qtbot, field, "lots")  # refused as it is typed: no letter of it is taken; empty shows and means auto
    assert field.currentText() == "" and field.lineEdit().placeholderText() == "auto"
    assert dialog.engine_config().gpu_layers == "auto"


@pytest.mark.parametrize("value, shown", [("auto", "auto"), (-1, "all"), (0, "0"), (24, "24")])
def test_a_saved_value_shows_and_round_trips(dialog, value, shown):
    config = EngineConfig(target="a.gguf", gpu_layers=value).with_drafter("model", draft="b.gguf", gpu_layers=value)
    dialog.set_config(config)
    assert dialog.form.gpu_layers.currentText() == shown
    assert dialog.form.field("model", "gpu_layers").currentText() == shown
    assert dialog.engine_config() == config


def test_the_drafts_field_follows_the_target_until_told_otherwise(qtbot, dialog):
    dialog.set_config(EngineConfig(target="a.gguf").with_drafter("model", draft="b.gguf"))
    draft = dialog.form.field("model", "gpu_layers")
    assert draft.currentText() == "as the target" and dialog.engine_config().drafter_options().gpu_layers is None
    type_into(qtbot, draft, "auto")
    assert dialog.engine_config().drafter_options().gpu_layers == "auto"


@pytest.mark.skipif(llama_cpp.llama_supports_gpu_offload(), reason="this llama-cpp-python build offloads")
def test_the_check_says_a_cpu_only_build_keeps_the_layers_on_the_cpu(qtbot, dialog):
    dialog.set_config(EngineConfig(target="default"))
    assert run_check(qtbot, dialog) is True
    said = finding(dialog, "Layers on the GPU (llama.cpp)")
    assert said.severity == "info" and said.detail == "On the CPU: this llama.cpp build has no GPU offload."


def test_the_check_says_a_gpu_build_offloads_only_when_asked(qtbot, dialog, monkeypatch):
    monkeypatch.setattr(gpu_layers, "llama_cpp_offloads", lambda: True)
    dialog.set_config(EngineConfig(target="default").with_drafter("model", draft="default", gpu_layers=10))
    run_check(qtbot, dialog)
    said = finding(dialog, "Layers on the GPU (llama.cpp)").detail
    assert said == (
        "Target: on the CPU: GPU offload is opt-in (--gpu-layers all or a count; not yet verified on a GPU); "
        "draft: 10 of 30 layers on the GPU, the rest on the CPU (opt-in, not yet verified on a GPU)."
    )


def test_changing_the_gpu_layers_checks_again(qtbot, dialog, monkeypatch):
    """The check says where the layers go and looks at that memory: a new value makes it stale."""
    monkeypatch.setattr(gpu_layers, "llama_cpp_offloads", lambda: True)
    dialog.set_config(EngineConfig(target="default", gpu_layers=-1))
    assert run_check(qtbot, dialog) is True and dialog.can_load()
    type_into(qtbot, dialog.form.gpu_layers, "0")
    assert not dialog.can_load()  # the last check said the layers go on the GPU
    assert run_check(qtbot, dialog) is True
    assert finding(dialog, "Layers on the GPU (llama.cpp)").detail == "On the CPU (GPU layers 0)."
    assert dialog.can_load()


def test_the_status_line_says_where_the_layers_went():
    info = ModelInfo(
        name="SmolLM2",
        path="s.gguf",
        backend="llama.cpp",
        architecture="llama",
        n_params=1,
        weight_bytes=1,
        vocab_size=8,
        n_layers=30,
        context_length=8192,
        dtype="Q4_1",
        device="cpu",
        placement="all 30 layers on the GPU",
    )
    loaded = SimpleNamespace(config=EngineConfig(), target=info, speculative=True)
    assert "(Q4_1, llama.cpp, all 30 layers on the GPU)" in main_window.describe_engine(loaded)


def test_the_status_line_says_a_pytorch_model_on_cuda_runs_eager_with_graphs_opt_in():
    from dataclasses import replace

    eager = "native forward, eager (CUDA graphs are opt-in: --compile on; not yet verified on a GPU)"  # static.py's
    info = ModelInfo("SmolLM2", "s", "torch", "llama", 1, 1, 8, 30, 8192, "bfloat16", "cuda", forward=eager)
    line = main_window.describe_engine(SimpleNamespace(config=EngineConfig(), target=info, speculative=True))
    assert "(bfloat16, torch, native forward, eager (CUDA graphs are opt-in: --compile on; not yet verified" in line
    on_cpu = replace(info, device="cpu", forward="native forward, eager")  # the CPU's one path: not said
    line = main_window.describe_engine(SimpleNamespace(config=EngineConfig(), target=on_cpu, speculative=True))
    assert "(bfloat16, torch) · " in line
