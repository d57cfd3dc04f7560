"""Ollama's model store, read from disk: no Ollama server is needed or asked.

Ollama keeps models as a content-addressed store (the Docker registry layout):

    <root>/manifests/<host>/<namespace>/<model>/<tag>   JSON, schemaVersion 2
    <root>/blobs/sha256-<hex>                           the layers; the model layer is a GGUF file

A manifest's `layers` list names each layer by mediaType and digest; the one
with mediaType application/vnd.ollama.image.model is the weights. The others
(template, params, license, a vision projector) are not language models.

A model is called as Ollama calls it: `<model>:<tag>` for the library on
registry.ollama.ai ("llama3.2:1b"), `<namespace>/<model>:<tag>` for a user's
model there, and `<host>/<namespace>/<model>:<tag>` for another registry
("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"). A name without a tag
means ":latest".

The roots are Ollama's own: $OLLAMA_MODELS when it is set (the server then uses
it instead of the defaults), else ~/.ollama/models (`ollama serve` run by a user)
and /usr/share/ollama/.ollama/models (the Linux service's user).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
_USUAL_ROOTS = ("~/.ollama/models", "/usr/share/ollama/.ollama/models")


@dataclass(frozen=True)
class OllamaModel:
    name: str  # "llama3.2:1b", as `ollama list` shows it
    blob: Path  # the GGUF file of its model layer


def ollama_roots() -> list[Path]:
    """The Ollama model folders on this machine that exist."""
    custom = os.environ.get("OLLAMA_MODELS", "").strip()
    entries = [custom] if custom else list(_USUAL_ROOTS)
    roots = []
    for entry in entries:
        path = Path(entry).expanduser()
        try:
            if (path / "manifests").is_dir() and path.absolute() not in roots:
                roots.append(path.absolute())
        except OSError:
            continue  # a root we may not read (another user's service folder)
    return roots


def ollama_models() -> list[OllamaModel]:
    """Every pulled model whose model layer is on disk, sorted by name; the first root wins a name."""
    found: dict[str, OllamaModel] = {}
    for root in ollama_roots():
        for manifest in sorted((root / "manifests").glob("*/*/*/*")):
            if not manifest.is_file():
                continue
            host, namespace, model, tag = parts = manifest.relative_to(root / "manifests").parts
            if any(part.startswith(".") for part in parts):
                continue  # a hidden file in the manifests is not a model anyone named
            name = display_name(host, namespace, model, tag)
            blob = _model_blob(root, manifest)
            if blob is not None and name not in found:
                found[name] = OllamaModel(name, blob)
    return [found[name] for name in sorted(found)]


def find_ollama_model(name: str) -> OllamaModel | None:
    """The pulled model an Ollama name means ("llama3.2", "llama3.2:1b", "me/mine:q8"), or None."""
    parts = _name_parts(name)
    if parts is None:
        return None
    for root in ollama_roots():
        manifest = root / "manifests" / Path(*parts)
        blob = _model_blob(root, manifest) if manifest.is_file() else None
        if blob is not None:
            return OllamaModel(display_name(*parts), blob)
    return None


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    """Ollama's short name: the default host and the library namespace are left out."""
    prefix = "" if host == DEFAULT_HOST else f"{host}/{namespace}/"
    if not prefix and namespace != DEFAULT_NAMESPACE:
        prefix = f"{namespace}/"
    return f"{prefix}{model}:{tag}"


def _name_parts(name: str) -> tuple[str, str, str, str] | None:
    """(host, namespace, model, tag) of a name, filling in Ollama's defaults."""
    path, _, tag = name.strip().partition(":")
    pieces = path.split("/")
    if not tag:
        tag = DEFAULT_TAG
    if len(pieces) == 1:
        pieces = [DEFAULT_HOST, DEFAULT_NAMESPACE, *pieces]
    elif len(pieces) == 2:
        pieces = [DEFAULT_HOST, *pieces]
    if len(pieces) != 3 or not all(pieces) or ":" in tag or any(p in (".", "..") for p in (*pieces, tag)):
        return None
    return (*pieces, tag)


def _model_blob(root: Path, manifest: Path) -> Path | None:
    """The model layer's blob named by a manifest, when the manifest reads and the blob is there."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
    except (OSError, ValueError, AttributeError):
        return None  # half-written by a pull in progress, or not a manifest
    for layer in layers:
        if not isinstance(layer, dict) or layer.get("mediaType") != MODEL_LAYER:
            continue
        algorithm, _, digest = str(layer.get("digest", "")).partition(":")
        if not digest.isalnum():
            return None
        # Ollama writes "sha256-<hex>"; older versions wrote "sha256:<hex>".
        for blob in (root / "blobs" / f"{algorithm}-{digest}", root / "blobs" / f"{algorithm}:{digest}"):
            if blob.is_file():
                return blob
        return None
    return None
