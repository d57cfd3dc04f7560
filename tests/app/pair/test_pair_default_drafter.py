"""The pair dialog's first run: until a drafter is chosen, it is the one measured fastest on the backend
that runs (suffix decoding on PyTorch, n-gram lookup on llama.cpp: docs/benchmarks.md); a drafter the user
picks, or a saved pair's, stays whatever the backend."""

from __future__ import annotations

from app.pair.dialog import PairDialog
from app.shell import settings as keys
from engine import EngineConfig
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


def choose(combo, value: str) -> None:
    combo.setCurrentIndex(combo.findData(value))


def test_on_a_first_run_the_drafter_follows_the_backend_until_one_is_chosen(dialog):
    form = dialog.form
    assert form.drafter.currentData() == "ngram"  # the embedded GGUF model runs on llama.cpp
    assert form.drafter.toolTip().endswith(
        "measured fastest on the backend the target runs on: N-gram lookup on llama.cpp, Suffix decoding on torch"
    )
    choose(form.backend, "torch")
    assert form.drafter.currentData() == "suffix" and dialog.engine_config().drafter == "suffix"
    choose(form.backend, "auto")
    assert form.drafter.currentData() == "ngram"
    choose(form.drafter, "eagle")  # the user's choice
    choose(form.backend, "torch")
    assert form.drafter.currentData() == "eagle"


def test_a_saved_pair_keeps_its_drafter_when_the_backend_changes(qtbot, settings):
    keys.set_engine_config(EngineConfig(drafter="ngram"), settings)
    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)
    choose(dialog.form.backend, "torch")
    assert dialog.form.drafter.currentData() == "ngram"
