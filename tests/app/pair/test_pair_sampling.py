"""The pair dialog's sampling: min-p, the order the processors apply in, the model's recommendation."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings

from app.pair.dialog import PairDialog
from app.shell import settings as keys
from engine import EngineConfig, SamplingConfig
from tests.app.conftest import STRICT_QT_LOG
from tests.factories.gguf_models import make_tiny_gguf

pytestmark = STRICT_QT_LOG


@pytest.fixture
def dialog(qtbot, tmp_path):
    d = PairDialog(settings=QSettings(str(tmp_path / "pair.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(d)
    return d


def test_min_p_goes_into_the_sampling_and_comes_back(dialog):
    dialog.set_config(EngineConfig(), SamplingConfig(temperature=0.8, min_p=0.05))

    assert dialog.sampling_config().min_p == pytest.approx(0.05)
    keys.set_sampling_config(dialog.sampling_config(), dialog.settings)  # kept as the dialog saves it
    assert keys.sampling_config(dialog.settings).min_p == pytest.approx(0.05)
    assert dialog.form.order.text() == "Applied to p and q alike, in order:\ntemperature, top-k, top-p, min-p"


def test_the_models_recommended_sampling_is_offered_and_applied(dialog, tmp_path):
    recommends = make_tiny_gguf(
        str(tmp_path / "recommends.gguf"), extra={"general.sampling.temp": 0.6, "general.sampling.top_p": 0.95}
    )

    dialog.set_config(EngineConfig(target=recommends))

    assert not dialog.form.recommended.isHidden()
    assert dialog.form.recommended.text() == "The model recommends temperature 0.6, top-p 0.95."
    assert dialog.sampling_config() == keys.DEFAULT_SAMPLING  # offered, not imposed
    dialog.form.use_recommended.click()
    sampling = dialog.sampling_config()
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == pytest.approx((0.6, 0.95, 0, 0))

    dialog.set_config(EngineConfig(target="default"))  # the embedded model recommends nothing
    assert dialog.form.recommended.isHidden() and dialog.form.use_recommended.isHidden()


def test_the_sampling_summary_names_min_p():
    from app.shell.settings import describe_sampling
    from engine import SamplingConfig

    assert describe_sampling(SamplingConfig(temperature=0.7, min_p=0.05, max_tokens=64)) == (
        "temperature 0.7, min-p 0.05, seed 0, up to 64 tokens"
    )
