"""The MTP drafter's refusal of a GGUF target names the model, not where it lies on disk."""

from pathlib import Path

from engine import EngineConfig
from engine.preflight import preflight


def test_the_refusal_of_a_gguf_target_names_the_file_not_its_path(default_gguf):
    result = preflight(EngineConfig(target=default_gguf).with_drafter("mtp"))
    (refusal,) = [f for f in result.findings if f.severity == "error"]
    assert Path(default_gguf).name in refusal.detail
    assert str(Path(default_gguf).parent) not in refusal.detail  # the embedded model sits inside site-packages
