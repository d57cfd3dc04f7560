"""Fake model stores written as the real tools write them: Ollama's and llama.cpp's download cache.

Both hold real (tiny) GGUF files, so what lists them, reads their quantization or
loads them sees what it would see on a user's machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
MODEL_LAYER = "application/vnd.ollama.image.model"


def write_quant_gguf(path, file_type: str = "Q4_K_M") -> str:
    """A tiny GGUF that says it is `file_type` (a gguf.LlamaFileType name without MOSTLY_/ALL_).

    Its one tensor is F32 whatever it says: enough for lists and metadata, not for llama.cpp.
    """
    import gguf

    members = {m.name.removeprefix("MOSTLY_").removeprefix("ALL_"): m for m in gguf.LlamaFileType}
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_file_type(members[file_type])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<s>", "</s>", "a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def add_ollama_model(root, name: str, gguf_path, *, host: str = "registry.ollama.ai", extra_layers=True) -> Path:
    """Pull `gguf_path` into the Ollama store at `root` as `name` ("llama3.2:1b", "me/mine:q4"); the blob's path.

    The manifest has the layers `ollama pull` writes: the model, plus a template and
    params layer (and their config blob) that are not models.
    """
    root = Path(root)
    path, _, tag = name.partition(":")
    pieces = path.split("/")
    namespace, model = pieces if len(pieces) == 2 else ["library", pieces[0]]
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)

    def blob(data: bytes | None = None, source=None) -> tuple[str, int]:
        digest = hashlib.sha256(data if data is not None else Path(source).read_bytes()).hexdigest()
        target = blobs / f"sha256-{digest}"
        if data is not None:
            target.write_bytes(data)
        else:
            shutil.copyfile(source, target)
        return f"sha256:{digest}", target.stat().st_size

    model_digest, model_size = blob(source=gguf_path)
    layers = [{"mediaType": MODEL_LAYER, "digest": model_digest, "size": model_size}]
    if extra_layers:
        for media, text in (("template", "{{ .Prompt }}"), ("params", '{"stop": ["</s>"]}')):
            digest, size = blob(text.encode())
            layers.append({"mediaType": f"application/vnd.ollama.image.{media}", "digest": digest, "size": size})
    config_digest, config_size = blob(json.dumps({"model_format": "gguf", "model_family": "llama"}).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": layers,
    }
    manifest_path = root / "manifests" / host / namespace / model / (tag or "latest")
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest))
    return blobs / f"sha256-{model_digest.partition(':')[2]}"


def add_llama_cache_file(cache, org: str, repo: str, gguf_path) -> Path:
    """Put a GGUF in llama.cpp's download cache as `llama-cli -hf org/repo` does, with its sidecars."""
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{org}_{repo}_{Path(gguf_path).name}"
    shutil.copyfile(gguf_path, target)
    Path(f"{target}.etag").write_text('"0123abcd"')
    Path(f"{target}.json").write_text(json.dumps({"url": f"https://huggingface.co/{org}/{repo}"}))
    (cache / f"manifest={org}={repo}=latest.json").write_text(json.dumps({"ggufFile": {"rfilename": target.name}}))
    return target
