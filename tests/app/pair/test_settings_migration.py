"""One model pair under one key: settings files written by SpecDeck before issue 13, migrated once.

The files in old_settings/ were written by that version's own code (PairChoice,
save_choice, PresetStore and the window's set_engine_config), so these tests read
exactly what a user's disk holds:
- eagle.ini: the dialog's keys and the window's key agree (EAGLE, a head, depth 6), four presets;
- builtin_after_failure.ini: after "Use the built-in model" the window's key holds the built-in pair
  and the dialog's keys still hold the pair that failed to load;
- dialog_only.ini: only the dialog's keys (Medusa with a heads folder), the window saved nothing.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.pair.dialog import PairDialog
from app.pair.presets import PresetStore
from app.shell import settings as keys
from engine import CONFIG_VERSION, EngineConfig, SamplingConfig
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

OLD = Path(__file__).parent / "old_settings"


def old_settings(tmp_path, name: str) -> QSettings:
    path = tmp_path / name
    shutil.copy(OLD / name, path)
    return QSettings(str(path), QSettings.Format.IniFormat)


def stored_keys(settings: QSettings) -> set[str]:
    return set(settings.allKeys())


def test_a_store_that_agreed_keeps_the_pair_its_sampling_and_presets(tmp_path):
    settings = old_settings(tmp_path, "eagle.ini")

    resets = []
    config = keys.engine_config(settings, resets)

    assert resets == []
    # gpu_layers 0 was the only default before "auto": a saved 0 is kept as it was
    assert config == EngineConfig(
        target="/models/qwen.gguf",
        backend="torch",
        dtype="bfloat16",
        n_ctx=2048,
        threads=4,
        gpu_layers=0,
        k=5,
        k_max=12,
    ).with_drafter("eagle", heads="/heads/eagle-qwen", tree_depth=6)
    assert keys.sampling_config(settings) == SamplingConfig(temperature=0.7, top_p=0.9, seed=7, max_tokens=300)
    presets = PresetStore(settings)
    assert presets.names() == ["exit", "fast / greedy", "look", "pair"]
    fast, fast_sampling = presets.get("fast / greedy")
    assert fast == EngineConfig(target="default", k=3, gpu_layers=0).with_drafter("ngram", max_ngram=4)
    look, look_sampling = presets.get("look")
    assert look == EngineConfig(gpu_layers=0).with_drafter("lookahead", window=7, candidates=5)
    assert look_sampling.temperature == 0.5
    assert presets.get("exit")[0] == EngineConfig(backend="torch", gpu_layers=0).with_drafter(
        "early-exit", exit_layer=12
    )
    pair, pair_sampling = presets.get("pair")
    assert (pair.draft, pair.options.backend, pair_sampling.top_k) == ("/models/small.gguf", "llama.cpp", 40)
    assert fast_sampling.max_tokens == 512  # the dialog's default then

    left = stored_keys(settings)
    assert not any(key.startswith("pair_dialog/") for key in left - {"pair_dialog/geometry", "pair_dialog/browse_dir"})
    assert {"pair_dialog/geometry", "pair_dialog/browse_dir", "medusa/trained", "window/tab"} <= left
    assert json.loads(settings.value(keys.ENGINE_CONFIG))["version"] == CONFIG_VERSION
    assert keys.read(settings, keys.VERSION, 0) == keys.SETTINGS_VERSION


def test_the_migration_runs_once(tmp_path):
    settings = old_settings(tmp_path, "dialog_only.ini")
    keys.migrate(settings)
    chosen = EngineConfig(target="elsewhere.gguf")
    keys.set_engine_config(chosen, settings)
    settings.setValue("pair_dialog/drafter", "eagle")  # what an older SpecDeck started beside this one may write

    assert keys.engine_config(settings) == chosen  # not migrated a second time
    assert settings.value("pair_dialog/drafter") == "eagle"


def test_after_use_the_built_in_model_the_window_key_wins(qtbot, tmp_path):
    """The bug of issue 13: the dialog showed the pair that had failed, not the one loaded."""
    settings = old_settings(tmp_path, "builtin_after_failure.ini")

    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)

    assert dialog.engine_config().target == "default" and dialog.engine_config().draft is None
    # the built-in pair as it was saved then, GPU layers 0 included (0 was the default before "auto")
    assert dialog.engine_config() == dataclasses.replace(keys.DEFAULT_ENGINE_CONFIG, gpu_layers=0)
    assert dialog.sampling_config().temperature == 0.3  # the window's sampling key was saved with the failed pair
    assert dialog.notice.isHidden()


def test_the_dialogs_keys_count_where_the_window_saved_nothing(qtbot, tmp_path):
    settings = old_settings(tmp_path, "dialog_only.ini")

    config = keys.engine_config(settings)

    assert config == EngineConfig(k_max=8, gpu_layers=-1).with_drafter("medusa", heads="/heads/medusa-x")
    assert keys.sampling_config(settings) == SamplingConfig(min_p=0.05, max_tokens=512)
    assert not any(key.startswith("pair_dialog/") for key in stored_keys(settings))


@pytest.mark.parametrize(
    "saved",
    [
        {"version": CONFIG_VERSION + 1, "target": "default", "drafter": "telepathy", "options": {"depth": 3}},
        "{not json",
        {"version": CONFIG_VERSION, "target": "default", "drafter": "ngram", "options": {"max_ngram": "three"}},
    ],
)
def test_a_newer_or_damaged_pair_falls_back_to_the_defaults_and_the_dialog_says_so(qtbot, tmp_path, saved):
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    keys.migrate(settings)
    settings.setValue(keys.ENGINE_CONFIG, saved if isinstance(saved, str) else json.dumps(saved))

    resets = []
    assert keys.engine_config(settings, resets) == keys.DEFAULT_ENGINE_CONFIG
    assert resets == [keys.ENGINE_CONFIG]

    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)
    assert dialog.engine_config().target == "default"
    assert not dialog.notice.isHidden() and "model pair" in dialog.notice.text()


def test_a_store_from_a_newer_specdeck_is_not_migrated(tmp_path):
    settings = old_settings(tmp_path, "dialog_only.ini")
    settings.setValue(keys.VERSION, keys.SETTINGS_VERSION + 1)

    keys.migrate(settings)

    assert settings.value("pair_dialog/drafter") == "medusa"  # left for the SpecDeck that wrote it
    assert keys.engine_config(settings) == keys.DEFAULT_ENGINE_CONFIG


def test_an_unreadable_preset_is_listed_but_not_loaded(qtbot, tmp_path):
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    keys.set_presets({"broken": {"config": {"version": 99}, "sampling": {}}}, settings)
    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)

    assert dialog.preset_names() == ["broken"]
    assert not dialog.load_preset("broken")
    assert "could not be read" in dialog.findings.verdict
