"""llama.cpp's weight repacking, off where its AMX kernels would crash the first prompt."""

from __future__ import annotations

import llama_cpp
import pytest

from engine.backends import repack
from engine.backends.llama_cpp import LlamaCppBackend, open_llama
from engine.remote.llama_server_process import LlamaServerProcess
from tests.factories.gguf_models import default_gguf_path

XEON = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n"
DESKTOP = "processor\t: 0\nflags\t\t: fpu sse avx2 fma f16c\n"
# Longer than the few tokens llama.cpp decodes without its batched matrix kernels.
SENTENCE = "A lighthouse keeper finds a message in a bottle on the rocks below the tower."
LONG_PROMPT = " ".join([SENTENCE] * 4) + " " + SENTENCE.removesuffix(" tower.")


@pytest.fixture(autouse=True)
def no_choice(monkeypatch):
    monkeypatch.delenv(repack.ENV, raising=False)


def test_the_cpus_amx_flag_is_read_from_cpuinfo(tmp_path):
    (tmp_path / "xeon").write_text(XEON)
    (tmp_path / "desktop").write_text(DESKTOP)
    assert repack.cpu_has_amx(str(tmp_path / "xeon"))
    assert not repack.cpu_has_amx(str(tmp_path / "desktop"))
    assert not repack.cpu_has_amx(str(tmp_path / "missing"))  # not Linux: nothing to say


def test_repacking_is_off_where_amx_is_unless_the_user_chooses(monkeypatch):
    assert repack.repack_allowed(amx=False) and not repack.repack_allowed(amx=True)
    monkeypatch.setenv(repack.ENV, "1")
    assert repack.repack_allowed(amx=True)
    monkeypatch.setenv(repack.ENV, "0")
    assert not repack.repack_allowed(amx=False)


def test_llama_servers_are_started_without_repacking_on_an_amx_cpu(monkeypatch):
    server = LlamaServerProcess("llama-server", "model.gguf")
    monkeypatch.setattr(repack, "cpu_has_amx", lambda: True)
    assert "--no-repack" in server.command()
    monkeypatch.setattr(repack, "cpu_has_amx", lambda: False)
    assert "--no-repack" not in server.command()


def test_models_load_as_this_machines_llama_cpp_allows():
    """On this build: repacking exactly where its CPU backend has no AMX."""
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    llm = open_llama(model_path=default_gguf_path(), n_ctx=256, verbose=False)
    try:
        assert llm.model_params.use_extra_bufts == repack.repack_allowed(repack.llama_cpp_has_amx(info))
    finally:
        llm.close()


def test_a_prompt_of_many_tokens_decodes_on_this_cpu():
    """A segmentation fault here on an AMX Xeon (before repacking was turned off there)."""
    backend = LlamaCppBackend(default_gguf_path(), n_ctx=512)
    try:
        ids = backend.tokenize(LONG_PROMPT)
        assert len(ids) > 60
        logits = backend.forward(ids)
        assert logits.shape[0] == len(ids)
        assert backend.token_text(int(logits[-1].argmax())) == " tower"  # the sentence, once more
    finally:
        backend.close()
