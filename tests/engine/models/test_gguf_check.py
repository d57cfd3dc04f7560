"""A GGUF with a zeroed stretch of weights loads and answers plausibly: the load notes and the doctor
say it looks damaged, and intact files (the embedded model, the tests' random ones) say nothing."""

from __future__ import annotations

import os
import shutil

import pytest

from engine.models.doctor import check_model, check_pair
from engine.models.gguf_check import gguf_layout, zeroed_tensors
from tests.engine.models.test_models import write_gguf
from tests.factories.gguf_models import make_tiny_gguf


def zero_out(source: str, copy, start: int, length: int) -> str:
    """A copy of `source` with `length` bytes zeroed from `start`, as a download that did not finish writing."""
    shutil.copyfile(source, copy)
    with open(copy, "r+b") as f:
        f.seek(start)
        f.write(bytes(length))
    return str(copy)


def damaged(findings):
    return [f for f in findings if "damaged" in f.title]


@pytest.fixture(scope="module")
def damaged_default(default_gguf, tmp_path_factory):
    """The embedded model with 4 MiB zeroed in the middle of the file (inside the layers' weights)."""
    size = os.path.getsize(default_gguf)
    return zero_out(default_gguf, tmp_path_factory.mktemp("damaged") / "SmolLM2-damaged.gguf", size // 2, 4 * 2**20)


@pytest.mark.parametrize("tensor_type", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"])
def test_the_tests_random_models_look_intact(tmp_path, tensor_type):
    tiny = make_tiny_gguf(str(tmp_path / "tiny.gguf"), tensor_type=tensor_type)
    assert zeroed_tensors(tiny) == ()
    assert not damaged(check_model(tiny))


def test_zero_embeddings_biases_and_norms_are_no_alarm(tmp_path):
    """write_gguf's embedding table and filler tensor are all zeros; norms and biases may be too."""
    path = write_gguf(tmp_path / "zeros.gguf", extra_params=4096)
    assert zeroed_tensors(path) == ()
    assert not damaged(check_pair(path, path).findings)


def test_the_embedded_model_looks_intact_to_the_doctor_and_at_load(default_gguf, default_llama):
    assert zeroed_tensors(default_gguf) == ()
    assert not damaged(check_model("default"))
    assert default_llama.load_notes == ()


def test_a_copy_with_4_mib_zeroed_is_said_damaged_by_the_doctor(damaged_default):
    report = check_pair(damaged_default, "default")
    (warning,) = damaged(report.findings)
    assert warning.severity == "warning" and warning.title == "The file looks damaged (the target)"
    assert "SmolLM2-damaged looks damaged" in warning.detail and "blk." in warning.detail
    assert "Download the file again" in warning.detail
    assert "The file looks damaged" in str(report)
    assert damaged(check_model(damaged_default))


def test_a_copy_with_4_mib_zeroed_is_said_damaged_when_it_loads(damaged_default, capsys):
    from engine.cli.main import main

    assert main(["generate", "-m", damaged_default, "-p", "Hi", "-n", "2", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    note = next(line for line in err.splitlines() if "looks damaged" in line)
    assert note.startswith("note: SmolLM2-damaged looks damaged") and "Download the file again" in note


def test_a_tiny_model_with_a_zeroed_stretch_is_said_damaged_when_it_loads(tmp_path):
    """The tiny model's layers hold 78 KB of Q8_0 weights; 16 KiB zeroed in the middle of them (a
    matrix is flagged from 4 KiB of zero rows on) names the tensors it hit."""
    from engine.backends.llama_cpp import LlamaCppBackend

    tiny = make_tiny_gguf(str(tmp_path / "tiny.gguf"), tensor_type="Q8_0")
    layout = gguf_layout(tiny)
    layers = [layout.data_start + offset for name, _, _, offset in layout.tensors if name.startswith("blk.")]
    middle = (min(layers) + layout.file_size) // 2
    broken = zero_out(tiny, tmp_path / "tiny-damaged.gguf", middle, 16 * 2**10)
    hit = zeroed_tensors(broken)
    assert hit and all(name.startswith("blk.1.") for name in hit)
    backend = LlamaCppBackend(broken, n_ctx=64, n_threads=1)
    try:
        (note,) = backend.load_notes
    finally:
        backend.close()
    assert "tiny-damaged.gguf looks damaged" in note and hit[0] in note
