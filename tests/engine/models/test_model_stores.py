"""Models where users keep them: Ollama's store and llama.cpp's download cache, with their quantization.

The stores are written by the test (tests/factories/model_stores.py) in a
temporary folder that OLLAMA_MODELS and LLAMA_CACHE point at; HOME is a fresh
folder too, so a real ~/.ollama is never read.
"""

from __future__ import annotations

import json

import pytest

from engine.errors import ModelNotFoundError
from engine.models.locate import list_models, resolve
from engine.models.metadata import file_type_name, quantization, read_metadata
from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.model_stores import add_llama_cache_file, add_ollama_model, write_quant_gguf


@pytest.fixture(autouse=True)
def isolated_stores(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("SPECDECK_MODEL_DIRS", raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    return tmp_path


@pytest.fixture
def ollama(tmp_path):
    """An Ollama store with a library model, a user's model and one pulled from hf.co."""
    root = tmp_path / "ollama"
    add_ollama_model(root, "tiny:1b", write_quant_gguf(tmp_path / "a.gguf", "Q4_K_M"))
    add_ollama_model(root, "me/mine:q8", write_quant_gguf(tmp_path / "b.gguf", "Q8_0"))
    add_ollama_model(root, "org/Repo-GGUF:IQ4_XS", write_quant_gguf(tmp_path / "c.gguf", "IQ4_XS"), host="hf.co")
    return root


def by_name(refs):
    return {ref.name: ref for ref in refs}


# -- quantization names ----------------------------------------------------------------


@pytest.mark.parametrize(
    "file_type, name",
    [
        (0, "F32"),
        (1, "F16"),
        (32, "BF16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (7, "Q8_0"),
        (15, "Q4_K_M"),
        (1024 + 15, "Q4_K_M"),
        (99999, ""),
        (None, ""),
    ],
)
def test_file_type_has_llama_cpp_name(file_type, name):
    assert file_type_name(file_type) == name


def test_quantization_read_from_the_header(tmp_path, default_gguf):
    assert quantization(default_gguf) == "Q4_1"
    assert quantization(write_quant_gguf(tmp_path / "k.gguf", "Q5_K_S")) == "Q5_K_S"
    (tmp_path / "text.gguf").write_text("not a model")
    assert quantization(str(tmp_path / "text.gguf")) == ""
    assert resolve(default_gguf).quant == "Q4_1"


# -- Ollama ----------------------------------------------------------------------------


def test_ollama_models_are_listed_by_their_ollama_names(ollama):
    refs = by_name(list_models())
    for name, quant in (("tiny:1b", "Q4_K_M"), ("me/mine:q8", "Q8_0"), ("hf.co/org/Repo-GGUF:IQ4_XS", "IQ4_XS")):
        ref = refs[name]
        assert (ref.kind, ref.source, ref.spec, ref.quant) == ("gguf", "ollama", f"ollama:{name}", quant)
        assert ref.path.startswith(str(ollama / "blobs" / "sha256-"))
    # the template and params layers are blobs too, but not models
    assert sum(ref.source == "ollama" for ref in refs.values()) == 3


def test_listed_ollama_model_resolves_with_or_without_the_prefix(ollama):
    listed = by_name(list_models())["tiny:1b"]
    assert resolve(listed.spec) == listed
    bare = resolve("tiny:1b")
    assert (bare.path, bare.source, bare.name, bare.quant) == (listed.path, "ollama", "tiny:1b", "Q4_K_M")
    assert resolve("me/mine:q8").name == "me/mine:q8"
    assert resolve("ollama:hf.co/org/Repo-GGUF:IQ4_XS").quant == "IQ4_XS"
    assert read_metadata(bare).dtype == "Q4_K_M"


def test_every_ollama_name_of_a_shared_blob_is_listed(ollama, tmp_path):
    """`ollama cp`, or a model's :latest and :1b tags, give one blob several names; a user looks for theirs."""
    add_ollama_model(ollama, "copy:mine", write_quant_gguf(tmp_path / "a.gguf", "Q4_K_M"))
    refs = by_name(list_models())
    assert refs["copy:mine"].path == refs["tiny:1b"].path
    assert resolve("copy:mine").name == "copy:mine"


def test_ollama_name_without_tag_means_latest(ollama, tmp_path):
    with pytest.raises(ModelNotFoundError, match="ollama pull tiny"):
        resolve("ollama:tiny")  # only tiny:1b is pulled
    add_ollama_model(ollama, "tiny", write_quant_gguf(tmp_path / "l.gguf", "F16"))
    assert resolve("ollama:tiny").name == "tiny:latest"
    assert resolve("tiny").quant == "F16"


def test_a_cached_hugging_face_repo_wins_over_a_bare_ollama_name(ollama, tmp_path):
    """'me/mine:q8' reads as the file q8 of the repo me/mine too; the HF cache keeps its meaning."""
    snapshot = tmp_path / "hub" / "models--me--mine" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    write_quant_gguf(snapshot / "q8", "Q6_K")
    assert resolve("me/mine:q8").source == "hf-cache"
    assert resolve("ollama:me/mine:q8").source == "ollama"


def test_a_missing_path_is_not_looked_for_in_ollama(ollama, tmp_path):
    with pytest.raises(ModelNotFoundError) as error:
        resolve(str(tmp_path / "no-such.gguf"))
    assert "Ollama" not in str(error.value)
    with pytest.raises(ModelNotFoundError, match=r"the Ollama model 'tiny:7b' \(not pulled\)"):
        resolve("tiny:7b")


def test_broken_or_half_pulled_ollama_models_are_left_out(ollama, tmp_path):
    blob = add_ollama_model(ollama, "gone:1b", write_quant_gguf(tmp_path / "g.gguf", "Q3_K_S"))
    blob.unlink()  # removed by hand, or a pull that never finished
    bad = ollama / "manifests" / "registry.ollama.ai" / "library" / "bad" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    add_ollama_model(ollama, "hidden:.partial", write_quant_gguf(tmp_path / "h.gguf", "Q2_K"))
    names = set(by_name(list_models()))
    assert "tiny:1b" in names and not names & {"gone:1b", "bad:latest", "hidden:.partial"}
    with pytest.raises(ModelNotFoundError, match="No Ollama model 'gone:1b'"):
        resolve("ollama:gone:1b")


def test_no_ollama_store_lists_nothing_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    assert not any(ref.source == "ollama" for ref in list_models())
    with pytest.raises(ModelNotFoundError, match="set OLLAMA_MODELS"):
        resolve("ollama:llama3.2:1b")


def test_ollama_model_loads_and_generates_on_llama_cpp(tmp_path):
    from engine import EngineConfig, SamplingConfig
    from engine.api import Engine

    tiny = make_tiny_gguf(str(tmp_path / "t.gguf"), tensor_type="Q8_0")
    add_ollama_model(tmp_path / "ollama", "tiny-random:q8", tiny)
    engine = Engine.load(EngineConfig(target="ollama:tiny-random:q8", drafter="ngram", k=2, measure_costs=False))
    try:
        assert (engine.target.info.backend, engine.target.info.name) == ("llama.cpp", "tiny-random:q8")
        result = engine.generate(engine.prompt_ids("Hello"), SamplingConfig(max_tokens=3))
        assert len(result.tokens) == 3
    finally:
        engine.close()


def test_ollama_model_loads_on_pytorch_too(tmp_path):
    """Medusa, EAGLE, lookahead and early exit need PyTorch: a blob without .gguf must load there as well."""
    from engine.models.loading import load_backend

    tiny = make_tiny_gguf(str(tmp_path / "t.gguf"), tensor_type="F16")
    add_ollama_model(tmp_path / "ollama", "tiny-random:f16", tiny)
    backend = load_backend("tiny-random:f16", backend="torch", dtype="float32")
    try:
        assert (backend.info.backend, backend.info.name) == ("torch", "tiny-random:f16")
        assert backend.info.path.startswith(str(tmp_path / "ollama" / "blobs"))
    finally:
        backend.close()


def test_out_of_memory_on_pytorch_suggests_llama_cpp_for_an_ollama_blob(ollama):
    from engine.models.memory_errors import _what_to_try

    tries = _what_to_try(resolve("tiny:1b").path, "torch", "float32", "cpu")
    assert "the llama.cpp backend (it runs the GGUF file quantized, not unpacked)" in tries


# -- llama.cpp's download cache ----------------------------------------------------------


def test_llama_cpp_cache_files_are_listed_without_their_sidecars(tmp_path):
    cache = tmp_path / "llama.cpp"
    path = add_llama_cache_file(cache, "bartowski", "Tiny-GGUF", write_quant_gguf(tmp_path / "Tiny-Q4_0.gguf", "Q4_0"))
    ours = [ref for ref in list_models() if ref.source == "llama.cpp-cache"]
    assert [(r.name, r.path, r.quant) for r in ours] == [("bartowski_Tiny-GGUF_Tiny-Q4_0", str(path), "Q4_0")]
    assert resolve(ours[0].spec).path == str(path)


def test_llama_cpp_cache_defaults_to_the_user_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    add_llama_cache_file(tmp_path / "xdg" / "llama.cpp", "org", "r", write_quant_gguf(tmp_path / "m.gguf", "BF16"))
    assert [r.quant for r in list_models() if r.source == "llama.cpp-cache"] == ["BF16"]


def test_llama_cpp_cache_on_macos_is_in_library_caches(monkeypatch, tmp_path):
    from engine.models.locate import llama_cache_dir

    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setattr("sys.platform", "darwin")
    assert llama_cache_dir() == tmp_path / "home" / "Library" / "Caches" / "llama.cpp"


# -- the command line ----------------------------------------------------------------------


def test_cli_models_lists_both_stores_with_quantization(ollama, tmp_path, capsys):
    from engine.cli.main import main

    add_llama_cache_file(tmp_path / "llama.cpp", "org", "R-GGUF", write_quant_gguf(tmp_path / "R-Q6_K.gguf", "Q6_K"))
    assert main(["models", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert (listed["tiny:1b"]["spec"], listed["tiny:1b"]["quant"]) == ("ollama:tiny:1b", "Q4_K_M")
    assert listed["org_R-GGUF_R-Q6_K"]["quant"] == "Q6_K"
    assert listed["SmolLM2-135M-Instruct.Q4_1"]["quant"] == "Q4_1"
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    assert "gguf Q4_K_M" in table and "tiny:1b" in table
