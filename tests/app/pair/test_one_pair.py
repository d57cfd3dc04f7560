"""One model pair, one store: what the window loads is what the pair dialog shows."""

from __future__ import annotations

from app.shell import settings as keys
from engine import EngineConfig
from tests.app.conftest import LOAD_TIMEOUT_MS, STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


def test_after_use_the_built_in_model_the_dialog_shows_the_pair_that_loaded(qtbot, make_window, tmp_path, monkeypatch):
    """Issue 13's bug: the dialog kept its own copy of the pair, so after a failed load and "Use the
    built-in model" it reopened on the pair that had failed."""
    window = make_window(load=False)
    window.choose_models()
    dialog = window.pair_dialog
    failing = EngineConfig(target=str(tmp_path / "gone.gguf"), drafter="ngram")
    dialog.set_config(failing)
    monkeypatch.setattr(type(dialog), "can_load", lambda self: True)  # past the check: a pair that fails to load
    with qtbot.waitSignal(window.controller.sig_load_failed, timeout=LOAD_TIMEOUT_MS):
        dialog.accept()
    monkeypatch.undo()
    assert keys.engine_config() == failing  # the dialog saved what it loaded
    (use_built_in,) = [b for b in window.banner._actions if b.text() == "Use the built-in model"]

    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        use_built_in.click()
    window.choose_models()

    assert window.pair_dialog is not dialog
    assert window.pair_dialog.engine_config() == keys.DEFAULT_ENGINE_CONFIG == window.controller.loaded.config
    window.pair_dialog.reject()
