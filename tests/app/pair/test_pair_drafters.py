"""The pair dialog's EAGLE, lookahead and early-exit drafters: their fields, configs, checks and storage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.pair.dialog import PairDialog
from app.pair.heads import heads_root, known_heads, remember_trained
from app.pair.presets import PresetStore
from app.shell import settings as keys
from engine import EngineConfig, preflight
from engine.models.shipped import resources_dir
from tests.app.conftest import STRICT_QT_LOG
from tests.app.pair.test_pair_dialog import run_check, severities

pytestmark = STRICT_QT_LOG

NEW_DRAFTERS = ("eagle", "lookahead", "early-exit")
TORCH_NAMES = {"eagle": "EAGLE", "lookahead": "Lookahead decoding", "early-exit": "Early exit", "medusa": "Medusa"}
BASE = EngineConfig(backend="torch", k=5)
EVERYTHING = {
    "eagle": BASE.with_drafter("eagle", heads="/heads/eagle-x", tree_depth=6),
    "lookahead": BASE.with_drafter("lookahead", window=7, ngram="auto", candidates=5),
    "early-exit": BASE.with_drafter("early-exit", exit_layer=12),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from tests.factories.hf_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", seed=0)


def choose(form, drafter: str) -> None:
    form.drafter.setCurrentIndex(form.drafter.findData(drafter))


def test_the_drafter_list_offers_the_new_drafters_by_name(dialog):
    combo = dialog.form.drafter
    names = {combo.itemData(i): combo.itemText(i) for i in range(combo.count())}
    assert names["eagle"] == "EAGLE head"
    assert names["lookahead"] == "Lookahead decoding (no model)"
    assert names["early-exit"] == "Early exit: the target's first layers"


def test_the_app_knows_which_drafters_need_pytorch_as_the_engine_does(dialog):
    from engine import all_drafters, suggested_chains

    form = dialog.form  # the dialog's list is the engine's registry and its chains: nothing copied to drift
    DRAFTERS = [form.drafter.itemData(i) for i in range(form.drafter.count())]
    TORCH_DRAFTERS = [name for name in DRAFTERS if form.specs[name].needs_torch]
    offered = [*all_drafters(), *suggested_chains()]
    engine_drafters = {spec.name for spec in offered}
    engine_torch = {spec.name for spec in offered if spec.needs_torch}
    assert {"suffix+eagle", "suffix+medusa"} <= engine_torch and "suffix+model" not in engine_torch
    assert set(TORCH_DRAFTERS) == engine_torch and set(DRAFTERS) == engine_drafters


def test_only_the_chosen_drafters_settings_are_shown(dialog):
    from engine import option_settings

    form = dialog.form
    listed = [form.drafter.itemData(i) for i in range(form.drafter.count())]
    # Every listed drafter's own settings, from the registry (suffix, EAGLE-3, MTP, the chains: none left out).
    own = {drafter: {form.field(drafter, s.name) for s in option_settings(form.specs[drafter])} for drafter in listed}
    assert {"suffix", "eagle3", "mtp", "suffix+model"} <= set(own)
    assert own["eagle"] == {form.field("eagle", "heads"), form.field("eagle", "tree_depth")}
    every = set().union(*own.values())
    for drafter, widgets in own.items():
        choose(form, drafter)
        shown = {w for w in every if w.isVisibleTo(form) and w.isEnabled()}
        assert shown == widgets, drafter
        label = form._models_form.labelForField(form.field("eagle", "tree_depth"))
        assert label.isVisibleTo(form) == (drafter == "eagle")  # the row's label goes with it


def test_the_config_carries_what_the_form_shows(qtbot, dialog):
    form = dialog.form
    choose(form, "eagle")
    form.field("eagle", "heads").set_folder("/somewhere/eagle-head")
    form.field("eagle", "tree_depth").set_value("6")
    config = dialog.engine_config()
    assert (config.drafter, config.options.heads, config.options.tree_depth) == ("eagle", "/somewhere/eagle-head", 6)
    form.field("eagle", "tree_depth").set_value("auto")
    assert dialog.engine_config().options.tree_depth == "auto"  # the drafter's own default

    choose(form, "lookahead")
    window = form.field("lookahead", "window")
    window.lineEdit().clear()
    qtbot.keyClicks(window.lineEdit(), "7x")  # the letter is refused as it is typed
    form.field("lookahead", "candidates").set_value("5")
    config = dialog.engine_config()
    o = config.options
    assert (config.drafter, (o.window, o.ngram, o.candidates), config.draft) == ("lookahead", (7, "auto", 5), None)
    choose(form, "early-exit")
    form.field("early-exit", "exit_layer").set_value("12")
    config = dialog.engine_config()
    assert (config.drafter, config.options.exit_layer) == ("early-exit", 12)
    form.field("early-exit", "exit_layer").set_value("auto")
    assert dialog.engine_config().options.exit_layer == "auto"


def test_a_window_of_zero_is_refused_with_the_engines_reason(qtbot, dialog):
    dialog.set_config(EngineConfig().with_drafter("lookahead", window=0))
    assert run_check(qtbot, dialog) is False
    assert severities(dialog)["Lookahead W is out of range"] == "error"
    text = dialog.findings.toPlainText()
    assert "window W" in text and "from 1 to 64 or 'auto', got 0" in text
    assert not dialog.load_button.isEnabled()
    dialog.form.field("lookahead", "window").set_value("5")  # a settled edit voids the failed check...
    dialog.form.field("lookahead", "window").sig_chosen.emit()
    assert "changed" in dialog.findings.verdict
    assert run_check(qtbot, dialog) is True  # ...and the next one passes
    assert "W tokens ahead" in dialog.findings.toPlainText()  # what W, N and G are, in words


@pytest.mark.parametrize("drafter", ("eagle", "early-exit", "medusa"))
def test_pytorch_is_used_with_backend_auto_and_llama_cpp_is_refused(drafter):
    auto = preflight(EngineConfig(target="default", drafter=drafter, backend="auto"))
    titles = {f.title: f.severity for f in auto.findings}
    assert titles["The target runs on PyTorch"] == "info" and auto.compatible, auto.findings
    assert not any("needs the PyTorch backend" in t for t in titles)

    refused = preflight(EngineConfig(target="default", drafter=drafter, backend="llama.cpp"))
    assert not refused.compatible
    assert {f.title: f.severity for f in refused.findings}[
        f"{TORCH_NAMES[drafter]} needs the PyTorch backend"
    ] == "error"


def test_lookahead_stays_on_llama_cpp_which_runs_its_mask_through_sequence_ids():
    for backend in ("auto", "llama.cpp"):
        result = preflight(EngineConfig(target="default", drafter="lookahead", backend=backend))
        titles = {f.title for f in result.findings}
        assert result.compatible and "The target runs on PyTorch" not in titles, result.findings
        assert not any("needs the PyTorch backend" in t for t in titles)


def test_the_dialog_refuses_early_exit_on_llama_cpp_before_loading(qtbot, dialog):
    dialog.set_config(EngineConfig(target="default", drafter="early-exit", backend="llama.cpp"))
    assert run_check(qtbot, dialog) is False
    assert not dialog.load_button.isEnabled()
    assert "Early exit needs the PyTorch backend" in dialog.findings.toPlainText()


def test_early_exit_warns_that_acceptance_is_usually_low_and_checks_the_layer():
    result = preflight(EngineConfig(target="default", drafter="early-exit"))
    low = next(f for f in result.findings if f.title == "Acceptance is usually low")
    assert low.severity == "warning" and "LayerSkip" in low.detail and result.compatible
    too_deep = preflight(EngineConfig(target="default").with_drafter("early-exit", exit_layer=30))
    detail = {f.title: f.detail for f in too_deep.findings}["The exit layer is out of range"]
    assert not too_deep.compatible and "from 1 to 29" in detail


def test_eagle_without_a_shipped_head_says_to_train_one(tiny):
    result = preflight(EngineConfig(target=tiny, drafter="eagle"))
    (missing,) = [f for f in result.findings if f.severity == "error"]
    assert missing.title.startswith("No EAGLE head ships for")
    assert "Models ▸ Train heads…" in missing.detail and "folder" in missing.detail
    medusa = str(resources_dir() / "heads" / "medusa-smollm2-135m")
    wrong = preflight(EngineConfig(target="default").with_drafter("eagle", heads=medusa))
    assert not wrong.compatible and "Medusa heads, not an EAGLE head" in str(wrong.findings)
    shallow = preflight(EngineConfig(target="default").with_drafter("eagle", tree_depth=0))
    assert not shallow.compatible and "The tree depth must be 1 or more" in str(shallow.findings)


def test_new_fields_round_trip_through_settings_presets_and_configs(qtbot, settings):
    keys.set_engine_config(EVERYTHING["eagle"], settings)
    assert keys.engine_config(settings) == EVERYTHING["eagle"]  # typed back: nothing lost

    first = PairDialog(settings=settings)
    qtbot.addWidget(first)
    assert first.engine_config() == EVERYTHING["eagle"]  # the dialog restores every field
    for drafter in NEW_DRAFTERS:
        first.set_config(EVERYTHING[drafter])
        first.save_preset(drafter)
    second = PairDialog(settings=settings)
    qtbot.addWidget(second)
    for drafter in NEW_DRAFTERS:
        assert second.load_preset(drafter)
        assert (second.engine_config(), second.sampling_config()) == PresetStore(settings).get(
            drafter
        ) and second.engine_config().drafter == drafter
        config = second.engine_config()
        second.set_config(config, second.sampling_config())
        assert second.engine_config() == config

    # The main window keeps the engine config as JSON: the lookahead numbers must come back as they were.
    config = EngineConfig().with_drafter("lookahead", window=9, candidates=4)
    keys.set_engine_config(config, settings)
    assert keys.engine_config(settings) == config
    keys.set_engine_config(EngineConfig(), settings)
    assert keys.engine_config(settings) == keys.DEFAULT_ENGINE_CONFIG


def test_damaged_values_of_the_new_fields_fall_back_to_auto(qtbot, settings):
    settings.setValue("pair_dialog/drafter", "early-exit")
    settings.setValue("pair_dialog/exit_layer", "deep")
    settings.setValue("pair_dialog/lookahead_window", "-3")
    damaged = PairDialog(settings=settings)
    qtbot.addWidget(damaged)
    choice = damaged.engine_config()
    window = damaged.form.options["lookahead"]["window"].value()
    assert (choice.drafter, choice.options.exit_layer, window) == ("early-exit", "auto", "auto")


def test_the_eagle_picker_offers_eagle_heads_and_remembers_a_trained_one(qtbot, settings):
    eagle = Path(heads_root()) / "eagle-mine"
    eagle.mkdir(parents=True)
    (eagle / "config.json").write_text(
        json.dumps({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128})
    )
    (eagle / "model.safetensors").write_bytes(b"")
    medusa = Path(heads_root()) / "medusa-mine"
    medusa.mkdir()
    (medusa / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    (medusa / "medusa_lm_head.safetensors").write_bytes(b"")
    eagle3 = Path(heads_root()) / "eagle3-mine"  # SafeAILab's EAGLE-3 layout: a draft vocabulary of its own
    eagle3.mkdir()
    (eagle3 / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 64,
                "num_attention_heads": 4,
                "draft_vocab_size": 512,
            }
        )
    )
    (eagle3 / "pytorch_model.bin").write_bytes(b"")
    assert known_heads(settings, "eagle") == [str(eagle)] and known_heads(settings, "medusa") == [str(medusa)]
    assert known_heads(settings, "eagle3") == [str(eagle3)]

    remember_trained(str(eagle), settings, kind="eagle")
    picker_dialog = PairDialog(settings=settings)
    qtbot.addWidget(picker_dialog)
    eagle_heads, heads = picker_dialog.form.field("eagle", "heads"), picker_dialog.form.field("medusa", "heads")
    assert str(eagle) in eagle_heads.choices() and str(eagle) not in heads.choices()
    assert eagle_heads.folder() == str(eagle) and heads.folder() == ""
    assert eagle_heads.combo.itemText(0) == "Shipped EAGLE head (for smollm2-135m only)"
    assert "EAGLE head" in eagle_heads.combo.itemData(1, Qt.ToolTipRole)
    eagle3_heads = picker_dialog.form.field("eagle3", "heads")
    assert eagle3_heads.choices() == [str(eagle3)]  # no EAGLE-3 head ships: no entry says one does


def test_the_eagle3_field_offers_no_shipped_head_since_none_ships(qtbot, settings):
    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)
    eagle3 = dialog.form.field("eagle3", "heads")
    texts = [eagle3.combo.itemText(i) for i in range(eagle3.combo.count())]
    assert not any("Shipped" in text for text in texts) and eagle3.combo.currentText() == ""
    assert "no EAGLE-3 head ships" in eagle3.combo.lineEdit().placeholderText()
    assert eagle3.folder() == ""  # the engine's check then says that none ships, and asks for a folder
    medusa = dialog.form.field("medusa", "heads")
    assert medusa.combo.itemText(0).startswith("Shipped Medusa heads (for smollm2-135m")
