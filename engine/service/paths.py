"""`ServerPaths`: which programs, files and folders of its machine a server lets a request name.

Every route that takes something naming a file asks the server's one `ServerPaths`
(`paths_of(request)`): a new route touches this module, not a rule of its own.

Who sends a request is whoever reaches the port: for `specdeck-cli serve` (and
`python -m engine.service` started by hand), any user of the machine when it is
keyless on loopback, anyone holding the key otherwise. None of them is the
server's user, so for those servers (`ServerPaths.served`, the default) nothing on
the wire names a file freely:

- A program: never. A benchmark's llama-server peers run the operator's binary
  (`serve --llama-server PATH`, else $SPECDECK_LLAMA_SERVER, `llama-server` on
  $PATH, or the one `specdeck-cli llama-server build` cached); a request whose
  `settings.llama_server` is set is a 400.
- Writing: training writes only under the server's train folder (`--train-dir`,
  default $SPECDECK_CACHE/serve/train, that is ~/.cache/specdeck/serve/train; made
  mode 0700, and refused at start when another user owns it). A training's
  `out_dir`, and a checkpoint's, is a run name (`RUN_NAME`: letters, digits, '.',
  '_', '-', starting with a letter or digit), saved in <train dir>/<name>; a path
  (absolute, with a separator, or '..') is a 400. The result's `out_dir` is the
  folder the server chose, which a later load may name as heads.
- Reading: training data is "builtin" or a path relative to `--data-dir` (none by
  default: only "builtin"); a model (a config's target, draft model and heads, a
  training's target) is one the server was started with, "default", a name the
  Hugging Face cache or Ollama's store resolves ("org/name", "org/name:file.gguf",
  "ollama:llama3.2:1b"), or a path under a `--models-dir` (repeatable;
  $SPECDECK_MODEL_DIRS too) or the train folder (heads trained here). Anything else
  is a 400 that names the flag that would allow it. A path is judged by where it
  really is (symlinks followed) or where it lexically is, never with '..' in it.
- `command` (the command line recorded with trained heads) is text, one printable
  line, stored as JSON: nothing reads it back as a path or runs it.

The desktop app's private engine (`python -m engine.service --client-paths`, which
engine/service/process.py starts) takes its client's paths as given
(`ServerPaths.trusting_client()`): the user picks "Save heads in:" and any model
file in the dialogs, as they would type them on the command line. That is safe
because its one client is that user: it listens on loopback, with a random key
that only the window's process holds, handed over by environment (a process's
environment is readable only by its own user and root, /proc/PID/environ), so a
request that carries the key comes from the user who started it, who may read and
write those files anyway. Without a key that reasoning fails, so that mode refuses
to serve without one (`server_paths`); `specdeck-cli serve` has no flag for it, its
clients being other people. Even there a program never comes from the wire.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

CLIENT_PATHS_FLAG = "--client-paths"  # python -m engine.service: paths come from the one authenticated client
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A name the model caches resolve: "org/name", "org/name@rev", "org/name:file.gguf", Ollama's "ns/model:tag".
MODEL_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(?:/[\w.-]+)*(?:@[\w.-]+)?(?::[\w.-]+)?")
COMMAND_LIMIT = 2000  # characters of a recorded command line
BUILTIN = "builtin"  # engine.training.data's built-in corpus


def cache_root() -> Path:
    """SpecDeck's cache, as engine/remote/llama_server_binary.py's cache_dir finds it."""
    return Path(os.environ.get("SPECDECK_CACHE") or Path.home() / ".cache" / "specdeck")


def default_train_dir() -> Path:
    return cache_root() / "serve" / "train"


@dataclass(frozen=True)
class ServerPaths:
    trust_client: bool = False  # the app's private engine: paths are its one client's (module docstring)
    train_dir: Path = field(default_factory=default_train_dir)
    data_dir: Path | None = None  # None: training data is "builtin" only
    models_dirs: tuple[Path, ...] = ()
    started: tuple[str, ...] = ()  # the model specs the server was started with, and the real paths of those on disk
    llama_server: str | None = None  # the operator's binary for benchmark peers; None: found as bench finds it

    @classmethod
    def trusting_client(cls) -> ServerPaths:
        return cls(trust_client=True)

    @classmethod
    def served(
        cls,
        config=None,
        *,
        train_dir: str | os.PathLike | None = None,
        data_dir: str | os.PathLike | None = None,
        models_dirs=(),
        llama_server: str | os.PathLike | None = None,
    ) -> ServerPaths:
        """The policy of a server started with `config` (an EngineConfig, or None) and the operator's
        folders and binary, each checked now: a mistake is said at start, not at a client's request."""
        named = [p for p in os.environ.get("SPECDECK_MODEL_DIRS", "").split(os.pathsep) if p.strip()]
        folders = tuple(_folder(d, "--models-dir") for d in (*models_dirs, *named))
        binary = None
        if llama_server is not None:
            from engine.remote.llama_server_binary import find_llama_server

            binary = str(find_llama_server(llama_server).absolute())  # LlamaServerNotFound when it is not there
        train = Path(train_dir).expanduser().absolute() if train_dir is not None else default_train_dir()
        _check_owner(train)
        started: list[str] = []
        for _, spec in model_specs(config) if config is not None else ():
            started.append(spec)
            if Path(spec).expanduser().exists():
                started.append(os.path.realpath(Path(spec).expanduser()))
        return cls(
            train_dir=train,
            data_dir=_folder(data_dir, "--data-dir") if data_dir is not None else None,
            models_dirs=folders,
            started=tuple(started),
            llama_server=binary,
        )

    # -- what the routes ask ---------------------------------------------------------------------

    def bench_settings(self, settings):
        """BenchSettings with the server's own llama-server; a request that names one is a 400."""
        if settings.llama_server is not None:
            raise _refused(
                "A request may not name a program to run: 'settings.llama_server' must be left out. The benchmark's "
                "llama-server peers run the server's own binary (specdeck-cli serve --llama-server PATH, else "
                "$SPECDECK_LLAMA_SERVER, llama-server on $PATH, or `specdeck-cli llama-server build`'s)."
            )
        return replace(settings, llama_server=self.llama_server)

    def check_config(self, config):
        """`config` (an EngineConfig) when every model it names may be read here; else a 400."""
        for what, spec in model_specs(config):
            self.check_model(spec, what)
        return config

    def check_model(self, spec: str | None, what: str = "The model") -> None:
        """Nothing when model `spec` may be read here (module docstring); else a 400 naming --models-dir."""
        if self.trust_client or not spec:
            return
        text = spec.strip()
        if text in self.started or text == "default":
            return
        name = text[len("ollama:") :] if text.startswith("ollama:") else text
        path = Path(text).expanduser()
        if MODEL_NAME.fullmatch(name) and ".." not in name and not path.exists():
            return  # a name: the Hugging Face cache or Ollama's store resolves it, or nothing does
        if path.exists() and os.path.realpath(path) in self.started:
            return
        if _within(path, (*self.models_dirs, self.train_dir)):
            return
        folders = ", ".join(str(d) for d in self.models_dirs) or "none given"
        raise _refused(
            f"{what} {spec!r} is outside what this server may read. It loads the models it was started with, "
            "'default', models by name from the Hugging Face cache or Ollama's store, heads it trained, and files "
            f"under its model folders ({folders}): start it with --models-dir FOLDER to serve the models there."
        )

    def train_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """train_heads' options with the server's folders: out_dir from a run name, data under the data
        folder, the target checked; a 400 for anything else."""
        if self.trust_client:
            return dict(options)
        self.check_model(options.get("target_spec"), "The training's target")
        data = options.get("data")
        sources = (data,) if isinstance(data, str) else tuple(data or ())
        return {
            **options,
            "out_dir": str(self.run_dir(options.get("out_dir"), "out_dir")),
            "data": [self._data_source(source) for source in sources],
        }

    def run_dir(self, name, field_name: str = "out_dir") -> Path:
        """The folder of training run `name`: <train dir>/<name> (made here); for the app's engine, `name`."""
        if self.trust_client:
            return Path(str(name)).expanduser()
        if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
            raise _refused(
                f"This server keeps training runs in its own folder ({self.train_dir}, set by specdeck-cli serve "
                f"--train-dir): send '{field_name}' as a run name (letters, digits, '.', '_' or '-', starting with a "
                f"letter or digit), not a path; got {name!r}."
            )
        self.train_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = self.train_dir / name
        if not _within(folder, (self.train_dir,)):
            raise _refused(f"The run {name!r} is not a folder inside this server's train folder.")
        return folder

    def command(self, text: str | None) -> str | None:
        """The command line a client asks to record with the heads: one printable line, kept as text."""
        if text is None:
            return None
        if not isinstance(text, str) or len(text) > COMMAND_LIMIT or not text.isprintable():
            raise _refused(
                f"'command' is recorded as text: one line of printable characters, at most {COMMAND_LIMIT} of them."
            )
        return text

    def _data_source(self, source) -> str:
        if source == BUILTIN:
            return source
        where = (
            "its data folder, which was not given (specdeck-cli serve --data-dir DIR)"
            if self.data_dir is None
            else f"its data folder ({self.data_dir}, set by specdeck-cli serve --data-dir)"
        )
        if self.data_dir is not None and isinstance(source, str) and source.strip():
            relative = Path(source)
            if not relative.is_absolute() and ".." not in relative.parts and not source.startswith("~"):
                path = self.data_dir / relative
                if _within(path, (self.data_dir,)):
                    return str(path)
        raise _refused(
            f"This server reads training data only from {where}: send 'builtin' or a path relative to "
            f"that folder, without '..'; got {source!r}."
        )


def paths_of(request) -> ServerPaths:
    """The server's policy (create_app keeps it in app.state)."""
    return request.app.state.paths


def server_paths(paths: ServerPaths | None, host, api_key: str | None) -> ServerPaths:
    """`paths`, or the served policy for a server holding `host`'s engine; the client's paths only with a key."""
    if paths is None:
        paths = ServerPaths.served(getattr(host.engine, "config", None))
    if paths.trust_client and not api_key:
        raise ConfigError(
            f"{CLIENT_PATHS_FLAG} takes paths from the server's one client, which must prove it is "
            "that client: start it with an API key ($SPECDECK_API_KEY)."
        )
    return paths


def model_specs(config) -> list[tuple[str, str]]:
    """(what, spec) for every model or folder `config` reads: the target, the draft model, heads."""
    from engine.drafters.registry import is_drafter, option_settings

    found = [("The target", config.target)]
    if is_drafter(config.drafter):
        options = config.drafter_options()
        for setting in option_settings(config.drafter):
            value = getattr(options, setting.name, None)
            if setting.kind in ("path", "model") and isinstance(value, str) and value:
                found.append((f"The {setting.label.lower()}", value))
    return found


# -- helpers -----------------------------------------------------------------------------------------


def _refused(message: str):
    """The server's 400 (imported here, not at the top: process.py reads CLIENT_PATHS_FLAG without FastAPI)."""
    from engine.service.errors import BadRequest

    return BadRequest(message)


def _within(path: Path, roots) -> bool:
    """Whether `path` is inside one of `roots`, really (symlinks followed) or lexically; never with '..'."""
    if ".." in Path(path).parts:
        return False
    path = Path(path).expanduser()
    real, plain = os.path.realpath(path), os.path.abspath(path)
    for root in roots:
        root = Path(root).expanduser()
        if _inside(real, os.path.realpath(root)) or _inside(plain, os.path.abspath(root)):
            return True
    return False


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _folder(path, flag: str) -> Path:
    folder = Path(path).expanduser().absolute()
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: there is no such folder.")
    return folder


def _check_owner(folder: Path) -> None:
    """A train folder another user owns could hold their links to anywhere: refused."""
    if hasattr(os, "getuid") and folder.exists() and folder.stat().st_uid != os.getuid():
        raise ConfigError(f"The train folder {folder} belongs to another user: choose one of yours with --train-dir.")
