"""PairDialog: lists the models, refuses an incompatible pair, builds the configs, keeps settings and presets."""

from __future__ import annotations

import dataclasses
import json

import pytest
from PySide6.QtWidgets import QApplication, QDialog

from app.pair.dialog import AUTO_CHECK_MS, PairDialog
from app.pair.presets import PresetStore
from app.shell import settings as keys
from engine import EngineConfig, SamplingConfig
from engine.models.locate import default_model_path
from tests.app.conftest import STRICT_QT_LOG

CHECK_TIMEOUT_MS = 20_000  # metadata only, but a busy test machine is slow to read a 90 MB GGUF's vocabulary

pytestmark = STRICT_QT_LOG  # Qt warnings fail a test; tests/app/conftest.py keeps settings out of the user's


@pytest.fixture(scope="module")
def swapped_draft(tmp_path_factory) -> str:
    """A tiny HF model whose tokenizer has ids 1000 and 1001 swapped: same size, different vocabulary."""
    from tests.factories.hf_models import make_tiny_llama

    folder = make_tiny_llama(tmp_path_factory.mktemp("swapped") / "tiny-swapped")
    path = f"{folder}/tokenizer.json"
    with open(path, encoding="utf-8") as f:
        tokenizer = json.load(f)
    vocab = tokenizer["model"]["vocab"]
    by_id = {i: token for token, i in vocab.items()}
    vocab[by_id[1000]], vocab[by_id[1001]] = 1001, 1000
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tokenizer, f)
    return folder


def run_check(qtbot, dialog) -> bool:
    with qtbot.waitSignal(dialog.sig_check_finished, timeout=CHECK_TIMEOUT_MS) as blocker:
        dialog.check()
    return blocker.args[0]


def severities(dialog) -> dict[str, str]:
    return {f.title: f.severity for f in dialog.findings_list()}


def test_lists_the_default_model(dialog):
    combo = dialog.form.target.combo
    specs = [combo.itemData(i) for i in range(combo.count())]
    assert "default" in specs
    assert "SmolLM2-135M-Instruct" in combo.itemText(specs.index("default"))
    assert dialog.form.target.spec() == "default"  # the first run starts from the built-in model


def test_lists_the_model_installed_from_pypi_as_such(dialog):
    """Gemma 3 270M (the test extras install it) is in the target list, said to come from PyPI."""
    combo = dialog.form.target.combo
    specs = [combo.itemData(i) for i in range(combo.count())]
    assert "gemma3-270m  (installed from PyPI, Q4_K_M," in combo.itemText(specs.index("gemma3-270m"))


def test_every_drafter_can_be_chosen_and_none_is_a_placeholder(dialog):
    combo = dialog.form.drafter
    drafters = [combo.itemData(i) for i in range(combo.count())]
    # The drafters that load a draft model first, plain decoding last; the suggested chains among them.
    assert drafters == [
        "model",
        "suffix+model",
        "ngram",
        "suffix",
        "medusa",
        "eagle",
        "eagle3",
        "mtp",
        "assistant",
        "lookahead",
        "early-exit",
        "suffix+eagle",
        "suffix+medusa",
        "none",
    ]
    assert combo.itemText(1) == "Suffix decoding, then Draft model"
    assert all(combo.model().item(i).isEnabled() for i in range(combo.count()))
    assert not any("coming" in combo.itemText(i) for i in range(combo.count()))


def test_load_is_disabled_until_a_check_passes(dialog):
    assert not dialog.load_button.isEnabled()
    dialog.accept()  # Enter, or a caller, must not get around the disabled button
    assert dialog.result() != QDialog.Accepted


def test_incompatible_pair_shows_the_error_and_cannot_be_loaded(qtbot, dialog, settings, swapped_draft):
    dialog.set_config(EngineConfig(target="default").with_drafter("model", draft=swapped_draft))
    assert run_check(qtbot, dialog) is False
    assert severities(dialog)["Different vocabularies"] == "error"
    assert not dialog.report().compatible
    assert not dialog.load_button.isEnabled()
    assert "Cannot be loaded" in dialog.findings.verdict
    assert "Different vocabularies" in dialog.findings.toPlainText()
    assert QApplication.overrideCursor() is None  # the busy cursor is gone

    with qtbot.waitSignal(dialog.sig_check_finished, timeout=CHECK_TIMEOUT_MS):
        dialog.accept()  # refused: it checks again instead
    assert dialog.result() != QDialog.Accepted
    assert settings.value(keys.ENGINE_CONFIG, None) is None  # nothing saved for a refused pair


def test_compatible_pair_can_be_loaded_and_configs_follow_the_widgets(qtbot, dialog):
    form = dialog.form
    dialog.set_config(EngineConfig(target="default").with_drafter("model", draft="default"))
    form.k_auto.setChecked(False)
    form.k.setValue(6)
    form.temperature.setValue(0.7)
    form.top_k.setValue(40)
    form.top_p.setValue(0.9)
    form.seed.setValue(123)
    form.max_tokens.setValue(512)
    form.threads.setValue(4)
    form.n_ctx.setValue(2048)
    form.device.setCurrentIndex(form.device.findData("cpu"))

    assert run_check(qtbot, dialog) is True
    assert dialog.report() is not None and dialog.report().compatible
    assert severities(dialog)["Vocabularies match"] == "ok"
    assert dialog.load_button.isEnabled()
    dialog.accept()
    assert dialog.result() == QDialog.Accepted

    config = dialog.engine_config()
    assert (config.target, config.drafter, config.draft) == ("default", "model", "default")
    assert (config.k, config.threads, config.n_ctx, config.device) == (6, 4, 2048, "cpu")
    sampling = dialog.sampling_config()
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.7, 40, 0.9)
    assert (sampling.seed, sampling.max_tokens) == (123, 512)


def test_ngram_drafter_needs_no_draft_model(qtbot, dialog):
    dialog.set_config(EngineConfig(target="default", drafter="ngram"))
    assert not dialog.form.field("model", "draft").isEnabled()
    assert run_check(qtbot, dialog) is True
    assert "N-gram lookup needs no draft model" in severities(dialog)
    assert dialog.report() is None
    config = dialog.engine_config()
    assert (config.drafter, config.draft, config.k) == ("ngram", None, "auto")


def test_changing_the_models_voids_the_last_check(qtbot, dialog):
    dialog.set_config(EngineConfig(target="default", drafter="ngram"))
    assert run_check(qtbot, dialog) is True
    assert dialog.load_button.isEnabled()
    qtbot.keyClicks(dialog.form.target.combo.lineEdit(), "x")  # typing in the target field
    assert not dialog.load_button.isEnabled()
    assert "changed" in dialog.findings.verdict
    dialog.form.target.set_spec("default")
    dialog.form.drafter.setCurrentIndex(dialog.form.drafter.findData("model"))
    assert not dialog.load_button.isEnabled()


def test_a_result_for_a_selection_that_changed_meanwhile_does_not_enable_load(qtbot, dialog, tmp_path):
    dialog.set_config(EngineConfig(target="default", drafter="ngram"))
    with qtbot.waitSignal(dialog.sig_check_finished, timeout=CHECK_TIMEOUT_MS) as blocker:
        dialog.check()
        assert QApplication.overrideCursor() is not None  # busy while the worker reads metadata
        dialog.form.target.set_spec(str(tmp_path / "other.gguf"))  # changed before the result came back
    assert blocker.args[0] is False
    assert not dialog.load_button.isEnabled()
    assert QApplication.overrideCursor() is None


def test_closing_the_dialog_drops_the_check_a_change_had_scheduled(qtbot, dialog):
    with qtbot.waitSignal(dialog.sig_check_finished, timeout=CHECK_TIMEOUT_MS):
        dialog.show()  # checks the restored selection
    dialog.form.drafter.setCurrentIndex(dialog.form.drafter.findData("model"))  # schedules a check
    dialog.close()
    with qtbot.assertNotEmitted(dialog.sig_check_finished, wait=AUTO_CHECK_MS + 300):
        pass  # a check now would put a busy cursor over the main window, and could leave it there
    assert QApplication.overrideCursor() is None


def test_showing_the_dialog_checks_the_restored_selection(qtbot, dialog):
    with qtbot.waitSignal(dialog.sig_check_finished, timeout=CHECK_TIMEOUT_MS) as blocker:
        dialog.show()
    assert blocker.args[0] is True  # the defaults: the built-in model with n-gram lookup
    assert dialog.load_button.isEnabled()


def test_sampling_changes_keep_the_check(qtbot, dialog):
    dialog.set_config(EngineConfig(target="default", drafter="ngram"))
    assert run_check(qtbot, dialog) is True
    dialog.form.temperature.setValue(1.0)
    assert dialog.load_button.isEnabled()


def test_a_missing_model_shows_the_engines_message_not_a_traceback(qtbot, dialog, tmp_path):
    missing = str(tmp_path / "nowhere" / "model.gguf")
    dialog.set_config(EngineConfig(target=missing).with_drafter("model", draft="default"))
    assert run_check(qtbot, dialog) is False
    (finding,) = dialog.findings_list()
    assert finding.severity == "error" and finding.title == "Cannot use the target"
    assert "does not exist" in finding.detail and "specdeck-cli models" in finding.detail
    assert "Traceback" not in dialog.findings.toPlainText()


def test_llama_cpp_cannot_load_a_hugging_face_folder(qtbot, dialog, swapped_draft):
    dialog.set_config(EngineConfig(target=swapped_draft, backend="llama.cpp", drafter="ngram"))
    assert run_check(qtbot, dialog) is False
    assert severities(dialog)["llama.cpp cannot load this target"] == "error"


def test_settings_persist_across_dialogs(qtbot, settings):
    first = PairDialog(settings=settings)
    qtbot.addWidget(first)
    config = EngineConfig(target=default_model_path(), k=7, gpu_layers=-1, threads=2)
    chosen = (
        config.with_drafter("ngram", max_ngram=5),
        SamplingConfig(temperature=0.35, top_p=0.8, seed=9, max_tokens=100),
    )
    first.set_config(*chosen)
    first.resize(720, 700)  # within the offscreen screen (800 x 800): restoreGeometry clamps to the screen
    assert run_check(qtbot, first) is True
    first.accept()
    assert first.result() == QDialog.Accepted

    second = PairDialog(settings=settings)
    qtbot.addWidget(second)
    assert (second.engine_config(), second.sampling_config()) == chosen
    assert (second.size().width(), second.size().height()) == (720, 700)
    # stored typed: an int comes back as an int
    assert (keys.engine_config(settings), keys.sampling_config(settings)) == chosen


def test_presets_save_load_and_delete(dialog, settings):
    fast = (EngineConfig(target="default", drafter="ngram", k=3), SamplingConfig(temperature=0.0))
    careful = (
        EngineConfig(target="default", k_max=8).with_drafter("model", draft="default"),
        SamplingConfig(temperature=0.9, top_k=50),
    )
    dialog.set_config(*fast)
    dialog.save_preset("fast / greedy")  # a slash must not become a settings group
    dialog.set_config(*careful)
    dialog.save_preset("careful")
    assert dialog.preset_names() == ["careful", "fast / greedy"]

    assert dialog.load_preset("fast / greedy")
    assert (dialog.engine_config(), dialog.sampling_config()) == fast
    assert dialog.preset_combo.currentText() == "fast / greedy"
    assert not dialog.load_preset("nonexistent")

    dialog.delete_preset("fast / greedy")
    assert dialog.preset_names() == ["careful"]
    assert PresetStore(settings).get("careful") == careful  # what another dialog would read


def test_a_choice_round_trips_through_the_engine_configs(dialog):
    config = EngineConfig(
        target="a.gguf", backend="llama.cpp", k=5, threads=8, n_ctx=2048, gpu_layers=-1, compile="off"
    ).with_drafter("model", draft="b.gguf")
    sampling = SamplingConfig(temperature=0.5, top_k=20, seed=3, max_tokens=64)
    dialog.set_config(config, sampling)  # what the dialog shows is what it gives back
    assert dialog.engine_config() == config
    assert dialog.sampling_config() == sampling
    compile_combo = dialog.form.compile  # the PyTorch forward: shown, and chosen there
    assert compile_combo.currentData() == "off"
    compile_combo.setCurrentIndex(compile_combo.findData("on"))
    assert dialog.engine_config() == dataclasses.replace(config, compile="on")


def test_damaged_settings_still_open_a_usable_dialog(qtbot, settings):
    settings.setValue("pair_dialog/k", "many")
    settings.setValue("pair_dialog/backend", "quantum")
    settings.setValue("pair_dialog/top_p", "-3")
    settings.setValue("pair_dialog/presets", "{not json")
    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)
    config, sampling = dialog.engine_config(), dialog.sampling_config()
    assert config.backend == "auto"
    assert 1 <= dialog.form.k.value() <= 32 and 0 < sampling.top_p <= 1  # the widgets keep values in range
    assert dialog.preset_names() == []
    config.drafter_options(), sampling  # both valid: no ConfigError


def test_the_self_drafting_preset_comes_with_the_app(qtbot, dialog, settings):
    """The one real pair every install has: the embedded model on PyTorch, drafted by its own Q4_1
    GGUF on llama.cpp. Listed first, chosen like any preset, passes the check, cannot be deleted."""
    from app.pair.presets import SELF_DRAFT_PRESET
    from engine.models.load_options import draft_load_options, target_load_options

    assert dialog.preset_combo.itemText(1) == SELF_DRAFT_PRESET == "embedded model, drafted by its own Q4_1"
    dialog.preset_combo.setCurrentIndex(1)
    dialog.preset_combo.activated.emit(1)
    choice = dialog.engine_config()
    assert (choice.target, choice.backend, choice.drafter, choice.draft, choice.options.backend) == (
        "default",
        "torch",
        "model",
        "default",
        "llama.cpp",
    )
    assert choice.k == "auto"
    assert not dialog.delete_button.isEnabled()
    assert run_check(qtbot, dialog)
    # With a bf16 target the llama.cpp draft still loads in its file's own precision.
    config = dataclasses.replace(choice, dtype="bfloat16")
    assert (
        config.dtype == "bfloat16"
        and draft_load_options(config.drafter_options(), target_load_options(config))["dtype"] == "auto"
    )
    assert dialog.preset_names() == []  # not among the saved ones: nothing to delete
    dialog.save_preset(SELF_DRAFT_PRESET)  # a saved preset of the same name replaces it
    assert dialog.preset_combo.findText(SELF_DRAFT_PRESET) != -1 and dialog.delete_button.isEnabled()
