"""A model that is not on this machine: the message says what to do in the window as well as in a terminal
(the same text reaches both, through the pair dialog's check and the CLI)."""

import pytest

from engine.errors import ModelNotFoundError
from engine.models.locate import resolve


@pytest.mark.parametrize("spec", ["missing-model.gguf", "ollama:not-pulled"])
def test_a_missing_model_tells_a_window_user_where_to_choose_one(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as error:
        resolve(spec)
    message = str(error.value)
    assert "in the window: the model lists of Models > Model pair…" in message
    assert "in a terminal: `specdeck-cli models`" in message
