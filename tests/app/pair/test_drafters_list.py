"""The pair dialog's "Find drafters…": for the embedded SmolLM2-135M and a store with one fitting draft
beside models and heads that do not fit, the list shows the candidates, ranked, and each model left
out with the engine's reason; a double-click makes a candidate the pair's drafter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.pair.drafters_list import DraftersPanel
from engine.models.discovery import discover
from tests.app.conftest import STRICT_QT_LOG
from tests.factories.discovery_stores import OTHER_BASE, make_drafter_store

pytestmark = STRICT_QT_LOG
FIND_TIMEOUT_MS = 60_000
MEASURE_TIMEOUT_MS = 180_000  # a child process: Python, the engine, the models, then a second per candidate


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict[str, str]:
    return make_drafter_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(autouse=True)
def only_this_store(store, tmp_path, monkeypatch):
    """The store is the only folder of models (the packaged models' cache stays, so nothing is rebuilt)."""
    monkeypatch.setenv("SPECDECK_CACHE", os.environ.get("SPECDECK_CACHE") or str(Path.home() / ".cache" / "specdeck"))
    for var, sub in (("HOME", "home"), ("HF_HUB_CACHE", "hub"), ("OLLAMA_MODELS", "ollama"), ("LLAMA_CACHE", "lc")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("SPECDECK_MODEL_DIRS", str(Path(store["tiny-draft"]).parents[1]))


def find(qtbot, dialog) -> DraftersPanel:
    dialog.form.target.set_spec("default")
    panel = dialog.drafters_button.dialog.panel
    with qtbot.waitSignal(panel.sig_found, timeout=FIND_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(dialog.drafters_button, Qt.LeftButton)
    assert blocker.args[0] is not None, panel.status.text()
    return panel


def double_click(qtbot, panel: DraftersPanel, name: str) -> None:
    served = panel.tree.topLevelItem(0)
    item = next(served.child(i) for i in range(served.childCount()) if served.child(i).text(0).endswith(f". {name}"))
    panel.tree.scrollToItem(item)
    where = panel.tree.visualItemRect(item).center()
    qtbot.mouseClick(panel.tree.viewport(), Qt.LeftButton, pos=where)  # a view's double-click needs its press first
    qtbot.mouseDClick(panel.tree.viewport(), Qt.LeftButton, pos=where)


def test_the_list_shows_the_fitting_draft_and_each_model_left_out_with_the_engines_reason(qtbot, dialog, store):
    panel = find(qtbot, dialog)

    names = [name for name, _ in panel.candidate_rows()]
    assert any(name.endswith(". tiny-draft") for name in names)
    assert names[0].startswith("1. ")
    shown = dict(panel.left_out_rows())
    said = {x.name: x.reason for x in discover("default").left_out}
    for name in ("speck", "other-vocab", "qwen-like", "Medusa heads (medusa-qwen)"):
        assert shown[name] == said[name]
    assert shown["speck"].startswith(
        "a parameter ratio of 170.0:1 (135M / 791K), outside what pays (about 8:1 to 70:1)"
    )
    assert shown["Medusa heads (medusa-qwen)"].startswith(f"Medusa heads made for {OTHER_BASE}: their hidden size 896")
    assert shown["qwen-like"].startswith("another family (qwen2; the target is llama)")
    assert panel.measure_button.isEnabled()  # measuring is offered once the list is there


def test_double_clicking_a_candidate_makes_it_the_pairs_drafter(qtbot, dialog, store):
    panel = find(qtbot, dialog)

    double_click(qtbot, panel, "tiny-draft")
    config = dialog.form.config()
    assert (config.drafter, config.draft) == ("model", store["tiny-draft"])

    double_click(qtbot, panel, "Medusa heads (medusa-smollm2)")
    config = dialog.form.config()
    assert (config.drafter, config.heads) == ("medusa", store["medusa-smollm2"])


def test_measure_ranks_the_candidates_by_speed_in_a_child_process(qtbot, store):
    panel = DraftersPanel(measure_seconds=1.0)
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.sig_found, timeout=FIND_TIMEOUT_MS):
        panel.find("default")
    with qtbot.waitSignal(panel.sig_found, timeout=MEASURE_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(panel.measure_button, Qt.LeftButton)

    assert blocker.args[0] is not None, panel.status.text()
    assert panel.status.text().startswith("Measured for ")
    rows = panel.candidate_rows()
    measured = [why for _, why in rows if "x plain decoding (" in why]
    assert len(measured) == 4  # the draft model, n-gram lookup, suffix and lookahead decoding: what runs on llama.cpp
    assert rows[0][1] in measured  # measured ones first
    speeds = [c.speedup for c in panel.found.candidates if c.speedup is not None]
    assert speeds == sorted(speeds, reverse=True) and all(c.tokens_per_s > 0 for c in panel.found.candidates[:4])
    rest = panel.found.candidates[4:]  # heads and early exit: the target would move to PyTorch
    assert rest and all(c.note.startswith("not measured: it runs the target on PyTorch") for c in rest)


def test_choosing_another_target_while_the_list_is_open_lists_its_drafters(qtbot, dialog, store):
    panel = find(qtbot, dialog)

    with qtbot.waitSignal(panel.sig_found, timeout=FIND_TIMEOUT_MS):
        dialog.form.target.set_spec(store["tiny-draft"])
        dialog.form.target.sig_chosen.emit()

    assert panel.target == store["tiny-draft"]
    assert dialog.drafters_button.dialog.windowTitle() == f"Drafters for {store['tiny-draft']}"
    shown = dict(panel.left_out_rows())
    assert shown["SmolLM2-135M-Instruct.Q4_1"].startswith("not smaller than the target")


def test_finding_drafters_loads_no_torch_or_llama_cpp_in_the_windows_process(store):
    import json
    import subprocess
    import sys

    from tests.app.shell.test_no_torch_in_gui import HEAVY, ROOT

    script = (
        "import json, sys\n"
        "from app.pair.drafters_list import discover_here\n"
        "found = discover_here('default', [])\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print(json.dumps([len(found.candidates), len(found.left_out), heavy]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    candidates, left_out, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert candidates >= 3 and left_out >= 4  # the store's, as in the dialog
    assert heavy == []
