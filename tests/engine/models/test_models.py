"""Resolving model specs, listing models, and reading metadata without loading weights.

The tiny fixtures here (`write_gguf`, `write_hf_folder`, `make_hf_cache_repo`) are
also used by test_doctor.py. Every test points HOME and the Hugging Face cache at
a temporary folder, so the user's real model folders are never read.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelLoadError, ModelNotFoundError
from engine.models.locate import DEFAULT_SPEC, default_model_path, list_models, model_dirs, resolve
from engine.models.metadata import read_metadata
from engine.models.packaged import installed_specs, models_cache_dir

TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "Ġthe", "Ġcat", "ĠĠ", "Ċ"]
CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


# -- fixtures shared with test_doctor.py -------------------------------------------


def write_gguf(
    path,
    tokens=TOKENS,
    *,
    n_layers=2,
    n_embd=16,
    n_heads=4,
    n_kv=2,
    ctx=512,
    bos=1,
    eos=2,
    template=CHATML,
    extra_params=0,
) -> str:
    """A tiny llama GGUF: embeddings, one norm per layer, optionally a filler tensor."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(n_layers)
    w.add_context_length(ctx)
    w.add_embedding_length(n_embd)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(tokens))
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if template:
        w.add_chat_template(template)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), n_embd), np.float32))
    for i in range(n_layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
    if extra_params:
        w.add_tensor("filler.weight", np.zeros(extra_params, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def write_hf_folder(
    folder,
    tokens=TOKENS,
    *,
    n_layers=2,
    hidden=16,
    n_heads=4,
    n_kv=2,
    ctx=512,
    bos="<|im_start|>",
    eos="<|im_end|>",
    template=CHATML,
    merges=(),
) -> Path:
    """A tiny HF model folder: config.json, a real tokenizer.json, float16 safetensors."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": n_layers,
        "hidden_size": hidden,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "max_position_embeddings": ctx,
        "vocab_size": len(tokens),
        "eos_token_id": 2,
        "bos_token_id": 1,
        "torch_dtype": "float16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, list(merges)))
    tok.save(str(folder / "tokenizer.json"))
    tok_cfg = {"bos_token": bos, "eos_token": {"content": eos}, "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    tensors = {"model.embed_tokens.weight": np.zeros((len(tokens), hidden), np.float16)}
    for i in range(n_layers):
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.ones(hidden, np.float16)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def make_hf_cache_repo(cache: Path, repo: str, commit: str = "0123abcd", gguf_files=()) -> Path:
    """A cached repo laid out like huggingface_hub does it: weights are links to blobs."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    if gguf_files:
        snapshot.mkdir(parents=True)
        for name in gguf_files:
            write_gguf(snapshot / name)
    else:
        write_hf_folder(snapshot)
        blob = repo_dir / "blobs" / "deadbeef"
        blob.parent.mkdir()
        (snapshot / "model.safetensors").rename(blob)
        (snapshot / "model.safetensors").symlink_to(os.path.relpath(blob, snapshot))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """HOME, the HF cache, Ollama's and llama.cpp's stores, SPECDECK_MODEL_DIRS: empty temporary folders."""
    home = tmp_path / "home"
    home.mkdir()
    # Models installed from PyPI stay joined where they are (packaged.py): not 250 MB again per test.
    monkeypatch.setenv("SPECDECK_CACHE", str(models_cache_dir().parent))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    monkeypatch.delenv("SPECDECK_MODEL_DIRS", raising=False)
    return home


# -- resolve -------------------------------------------------------------------------


def test_resolve_default_is_the_embedded_gguf():
    ref = resolve(DEFAULT_SPEC)
    assert (ref.kind, ref.source, ref.spec) == ("gguf", "embedded", "default")
    assert ref.path == default_model_path() and ref.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert ref.size_bytes == os.path.getsize(ref.path) > 90e6


def test_resolve_gguf_path_with_tilde(isolated_home):
    write_gguf(isolated_home / "tiny.gguf")
    ref = resolve("~/tiny.gguf")
    assert (ref.kind, ref.source, ref.name) == ("gguf", "file", "tiny")
    assert ref.path == str(isolated_home / "tiny.gguf")


def test_resolve_hf_folder_and_its_config(tmp_path):
    folder = write_hf_folder(tmp_path / "tiny-llama")
    ref = resolve(str(folder))
    assert (ref.kind, ref.source, ref.name, ref.path) == ("hf", "folder", "tiny-llama", str(folder))
    assert ref.size_bytes == (folder / "model.safetensors").stat().st_size
    assert resolve(str(folder / "config.json")).path == str(folder)


def test_resolve_folder_with_one_gguf_ignores_projectors(tmp_path):
    write_gguf(tmp_path / "model-Q4_K_M.gguf")
    write_gguf(tmp_path / "mmproj-model-f16.gguf")
    assert resolve(str(tmp_path)).path == str(tmp_path / "model-Q4_K_M.gguf")


def test_resolve_folder_with_several_ggufs_asks_to_pick(tmp_path):
    write_gguf(tmp_path / "a.gguf")
    write_gguf(tmp_path / "b.gguf")
    with pytest.raises(ModelLoadError, match=r"several GGUF.*a\.gguf, b\.gguf.*Pick one"):
        resolve(str(tmp_path))


def test_resolve_repo_id_from_the_hf_cache(tmp_path):
    snapshot = make_hf_cache_repo(tmp_path / "hub", "org/tiny-llama")
    ref = resolve("org/tiny-llama")
    assert (ref.kind, ref.source, ref.name, ref.path) == ("hf", "hf-cache", "org/tiny-llama", str(snapshot))
    assert ref.size_bytes > 0  # the snapshot's link to the blob is followed
    assert resolve("org/tiny-llama@0123abcd").path == str(snapshot)
    assert resolve("org/tiny-llama@main").path == str(snapshot)


def test_resolve_gguf_inside_a_cached_repo(tmp_path):
    snapshot = make_hf_cache_repo(tmp_path / "hub", "org/tiny-GGUF", gguf_files=["t-Q8_0.gguf", "t-F16.gguf"])
    ref = resolve("org/tiny-GGUF:t-Q8_0.gguf")
    assert (ref.kind, ref.source, ref.path) == ("gguf", "hf-cache", str(snapshot / "t-Q8_0.gguf"))
    with pytest.raises(ModelLoadError, match="org/tiny-GGUF:t-F16.gguf"):
        resolve("org/tiny-GGUF")


def test_missing_model_says_what_was_tried(tmp_path):
    with pytest.raises(ModelNotFoundError) as e:
        resolve(str(tmp_path / "nope.gguf"))
    assert "nope.gguf" in str(e.value) and "specdeck-cli models" in str(e.value)
    with pytest.raises(ModelNotFoundError) as e:
        resolve("org/not-downloaded")
    message = str(e.value)
    assert "Hugging Face cache" in message and str(tmp_path / "hub") in message
    assert "specdeck-cli models" in message


def test_not_a_model_is_a_load_error(tmp_path):
    (tmp_path / "notes.gguf").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        resolve(str(tmp_path / "notes.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="neither a config.json"):
        resolve(str(tmp_path / "empty"))


# -- listing -------------------------------------------------------------------------


def test_model_dirs_puts_named_folders_first(tmp_path, isolated_home, monkeypatch):
    (isolated_home / "models").mkdir()
    env_dir, extra_dir = tmp_path / "env", tmp_path / "extra"
    env_dir.mkdir()
    extra_dir.mkdir()
    monkeypatch.setenv("SPECDECK_MODEL_DIRS", os.pathsep.join([str(env_dir), str(tmp_path / "missing")]))
    assert model_dirs([extra_dir, env_dir]) == [env_dir, extra_dir, isolated_home / "models"]


def test_list_models_finds_files_folders_and_cached_repos(tmp_path, isolated_home, monkeypatch):
    env_dir = tmp_path / "env"
    (env_dir / "publisher" / "repo").mkdir(parents=True)
    write_gguf(env_dir / "publisher" / "repo" / "x.gguf")
    (env_dir / "junk.gguf").write_text("not a model")
    extra = tmp_path / "extra"
    write_hf_folder(extra / "hf-model")
    lmstudio = isolated_home / ".lmstudio" / "models"
    lmstudio.mkdir(parents=True)
    write_gguf(lmstudio / "y.gguf")
    make_hf_cache_repo(tmp_path / "hub", "org/cached")
    monkeypatch.setenv("SPECDECK_MODEL_DIRS", str(env_dir))

    refs = list_models(extra_dirs=[extra, env_dir])  # env_dir twice: listed once
    assert refs[0].spec == "default" and refs[0].source == "embedded"
    names = [r.name for r in refs]
    packaged = installed_specs()  # models installed from PyPI (the test extras bring gemma3-270m)
    assert names == ["SmolLM2-135M-Instruct.Q4_1", *packaged, "x", "hf-model", "y", "org/cached"]
    for ref in refs:  # every listed spec resolves back to the same model
        assert resolve(ref.spec).path == ref.path


# -- metadata ------------------------------------------------------------------------


def test_metadata_of_the_default_model_is_quick_and_right():
    ref = resolve("default")
    start = time.perf_counter()
    meta = read_metadata(ref)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"reading the default model's metadata took {elapsed:.2f} s"
    assert (meta.architecture, meta.n_layers, meta.hidden_size, meta.n_heads, meta.n_kv_heads) == (
        "llama",
        30,
        576,
        9,
        3,
    )
    assert (meta.head_dim, meta.context_length, meta.vocab_size, len(meta.vocab)) == (64, 8192, 49152, 49152)
    assert meta.vocab[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert "Ġthe" in meta.vocab
    assert (meta.bos_id, meta.eos_ids, meta.dtype) == (1, (2,), "Q4_1")
    assert meta.special_tokens["unk"] == 0
    assert "<|im_start|>" in meta.chat_template
    assert meta.n_params == 134_515_008  # embeddings tied: no output.weight
    assert 90e6 < meta.weight_bytes < ref.size_bytes
    assert read_metadata(ref) is meta  # cached


def test_gguf_metadata_matches_gguf_reader(tmp_path):
    import gguf

    path = write_gguf(tmp_path / "t.gguf", extra_params=100)
    meta = read_metadata(resolve(path))
    reader = gguf.GGUFReader(path)
    assert list(meta.vocab) == reader.fields["tokenizer.ggml.tokens"].contents()
    assert meta.n_params == sum(int(t.n_elements) for t in reader.tensors) == 10 * 16 + 2 * 16 + 100
    assert meta.weight_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert (meta.dtype, meta.head_dim, meta.n_kv_heads, meta.chat_template) == ("F32", 4, 2, CHATML)


def test_metadata_cache_notices_a_changed_file(tmp_path):
    path = write_gguf(tmp_path / "t.gguf", ctx=512)
    assert read_metadata(resolve(path)).context_length == 512
    write_gguf(path, ctx=1024)
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)  # some filesystems keep mtimes coarse
    assert read_metadata(resolve(path)).context_length == 1024


def test_hf_metadata(tmp_path):
    tokens = TOKENS[:6] + ["[PAD6]"] + TOKENS[7:]  # id 6 is missing from the tokenizer below
    folder = write_hf_folder(tmp_path / "m", TOKENS)
    data = json.loads((folder / "tokenizer.json").read_text())
    del data["model"]["vocab"]["Ġthe"]
    data["added_tokens"] = [{"id": 10, "content": "<extra>", "special": True}]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    meta = read_metadata(resolve(str(folder)))
    assert meta.vocab == tuple(tokens) + ("<extra>",)
    assert (meta.architecture, meta.n_layers, meta.hidden_size, meta.n_kv_heads, meta.head_dim) == (
        "llama",
        2,
        16,
        2,
        4,
    )
    assert (meta.context_length, meta.bos_id, meta.eos_ids, meta.chat_template) == (512, 1, (2,), CHATML)
    assert (meta.n_params, meta.weight_bytes, meta.dtype) == (10 * 16 + 2 * 16, 2 * (10 * 16 + 2 * 16), "float16")


def test_hf_metadata_of_a_sharded_model_counts_each_weight_once(tmp_path):
    from safetensors.numpy import save_file

    folder = write_hf_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    save_file({"a": np.zeros((10, 16), np.float32)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b": np.zeros(16, np.float32)}, str(folder / "model-00002-of-00002.safetensors"))
    both = {"a": np.zeros((10, 16), np.float32), "b": np.zeros(16, np.float32)}
    save_file(both, str(folder / "consolidated.safetensors"))  # Mistral-style duplicate: not counted
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    named_templates = {"chat_template": [{"name": "default", "template": "T"}]}
    (folder / "tokenizer_config.json").write_text(json.dumps(named_templates))
    meta = read_metadata(resolve(str(folder)))
    assert (meta.n_params, meta.weight_bytes, meta.dtype, meta.chat_template) == (176, 704, "float32", "T")
    assert (meta.bos_id, meta.eos_ids) == (1, (2,))  # from config.json when the tokenizer config says nothing


def test_same_tokenizer_gives_the_same_vocab_in_both_formats(tmp_path):
    gguf_meta = read_metadata(resolve(write_gguf(tmp_path / "t.gguf")))
    hf_meta = read_metadata(resolve(str(write_hf_folder(tmp_path / "hf"))))
    assert gguf_meta.vocab == hf_meta.vocab
    assert (gguf_meta.bos_id, gguf_meta.eos_ids) == (hf_meta.bos_id, hf_meta.eos_ids)


def test_corrupt_files_are_load_errors(tmp_path):
    path = Path(write_gguf(tmp_path / "t.gguf", extra_params=1000))
    data = path.read_bytes()
    path.write_bytes(data[:-2000])  # an interrupted download
    with pytest.raises(ModelLoadError, match="truncated"):
        read_metadata(resolve(str(path)))
    path.write_bytes(data[:40])  # cut inside the key-value section
    with pytest.raises(ModelLoadError, match="corrupt"):
        read_metadata(resolve(str(path)))
    folder = write_hf_folder(tmp_path / "hf")
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelLoadError):
        read_metadata(resolve(str(folder)))
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights"):
        read_metadata(resolve(str(folder)))
