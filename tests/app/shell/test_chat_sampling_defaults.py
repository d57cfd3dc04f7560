"""Chats sample by default, as chat apps do (issue 36, item 9): the model's recommended settings
when its files have them, else llama.cpp's; an old store's untouched greedy default moves on,
a chosen greedy setting stays."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QSettings

from app.shell import settings as keys
from engine import EngineConfig, SamplingConfig
from engine.core.sampling_config import CHAT_DEFAULT
from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.hf_models import make_tiny_llama


@pytest.fixture
def store(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)


def test_a_fresh_profile_chats_with_sampling_not_greedy(store):
    sampling = keys.sampling_config(store)

    assert not sampling.greedy
    assert sampling == CHAT_DEFAULT  # the embedded model recommends nothing
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p) == (0.8, 40, 0.95, 0.05)


def test_a_fresh_profile_samples_as_the_saved_model_recommends(store, tmp_path):
    path = make_tiny_gguf(
        str(tmp_path / "tiny.gguf"), extra={"general.sampling.temp": 0.6, "general.sampling.top_p": 0.9}
    )
    keys.set_engine_config(EngineConfig(target=path), store)

    sampling = keys.sampling_config(store)

    assert sampling.temperature == pytest.approx(0.6) and sampling.top_p == pytest.approx(0.9)
    assert (sampling.top_k, sampling.min_p) == (0, 0.0)  # what the model does not name is off, as it was tuned


def test_a_models_do_sample_false_does_not_make_the_chat_greedy(store, tmp_path):
    folder = tmp_path / "tiny"
    make_tiny_llama(folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    keys.set_engine_config(EngineConfig(target=str(folder)), store)

    assert keys.sampling_config(store) == CHAT_DEFAULT


def old_store(store: QSettings, sampling: SamplingConfig) -> QSettings:
    """A store as the version before issue 36 left it: version 1, its sampling saved with the pair."""
    store.setValue(keys.VERSION, 1)
    store.setValue(keys.SAMPLING_CONFIG, json.dumps({**sampling.__dict__, "stop": list(sampling.stop)}))
    return store


def test_an_old_stores_untouched_greedy_default_becomes_the_chat_default_and_chosen_greedy_stays(tmp_path):
    def store(name: str) -> QSettings:
        return QSettings(str(tmp_path / f"{name}.ini"), QSettings.Format.IniFormat)

    untouched = old_store(store("untouched"), SamplingConfig(temperature=0.0, seed=0, max_tokens=256))
    chosen = SamplingConfig(temperature=0.0, seed=7, max_tokens=256)
    chosen_then = old_store(store("chosen"), chosen)
    greedy = SamplingConfig(temperature=0.0, seed=0, max_tokens=256)  # the old default, chosen on purpose now
    chosen_now = store("now")
    keys.set_sampling_config(greedy, chosen_now)

    assert keys.sampling_config(untouched) == CHAT_DEFAULT
    assert keys.read(untouched, keys.VERSION, 0) == keys.SETTINGS_VERSION
    assert keys.sampling_config(chosen_then) == chosen  # a seed was chosen: greedy was too
    assert keys.sampling_config(chosen_now) == greedy  # the user can still choose greedy for chat
