"""Training text: files, a built-in corpus, replies the target writes itself; then token windows.

Self-distillation needs no labels, only contexts the target will meet when it
decodes: its labels are its own distributions. So any text works, and chat
turns rendered through the target's chat template work best (that is what the
app sends). Three sources, freely combined:

- files: a .txt/.md file, a .jsonl file ({"text": ...}, {"messages": [...]},
  ShareGPT {"conversations": [...]}, or {"prompt", "response"}), or a folder
  of them (searched recursively, in sorted order);
- "builtin": text present on every install of Python: the docstrings of a fixed
  list of standard-library modules, and the descriptions and license texts of
  the installed packages (site-packages/*.dist-info), each rendered as an
  assistant reply to a matching request;
- replies the target writes itself (self_generate.py), to prompts taken from
  the bench prompts, the chat turns in the data, and a built-in list.

Everything is tokenized into one stream and cut into windows of seq_len tokens.
The last windows are held out for validation; the others are visited in a
seeded random order, epoch after epoch, so a batch depends only on its position
(which is what makes a resumed run continue exactly).
"""

from __future__ import annotations

import email
import glob
import hashlib
import importlib
import inspect
import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ConfigError
from engine.training.records import BUILTIN, DEFAULT_BUILTIN_CHARS  # noqa: F401 - defined with the settings

TEXT_SUFFIXES = (".txt", ".md", ".markdown")
JSONL_SUFFIXES = (".jsonl",)
MAX_VALIDATION_WINDOWS = 16  # 16 x 256 positions per head: top-1 agreement to about +-1%
BENCH_PROMPTS = Path(__file__).resolve().parents[2] / "resources" / "prompts" / "bench.jsonl"

# Standard-library modules whose documentation makes the built-in corpus. A fixed
# list, imported when the corpus is built: importing every module would run the
# ones with side effects (this, antigravity) and the GUI ones (tkinter, turtle).
STDLIB_MODULES = (
    "abc",
    "argparse",
    "array",
    "ast",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "cmath",
    "codecs",
    "collections",
    "colorsys",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "filecmp",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "html.parser",
    "http.client",
    "http.server",
    "imaplib",
    "importlib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "math",
    "mimetypes",
    "multiprocessing",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pkgutil",
    "platform",
    "plistlib",
    "pprint",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "token",
    "tokenize",
    "trace",
    "traceback",
    "types",
    "typing",
    "unicodedata",
    "unittest",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml.dom",
    "xml.etree.ElementTree",
    "zipfile",
    "zlib",
    "zoneinfo",
)

# Requests for self-generated replies when the data has none: varied on purpose
# (chat, explanation, code, lists, rewriting), as a desktop chat would see.
BUILTIN_PROMPTS = (
    "Explain how a hash table works, with a small example.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What are the main causes of the seasons on Earth?",
    "Give me five tips for writing clear emails.",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "Write a short poem about the sea at night.",
    "What is the difference between a list and a tuple in Python?",
    "How do I make a good cup of tea?",
    "Explain recursion to a ten-year-old.",
    "List the planets of the solar system in order from the sun.",
    "Write a haiku about autumn leaves.",
    "What is photosynthesis?",
    "Translate 'Good morning, how are you?' into French and Spanish.",
    "Write a SQL query that counts the orders per customer.",
    "Give a recipe for pancakes.",
    "What are the benefits of regular exercise?",
    "Explain what an API is in simple words.",
    "Write a limerick about a cat who loves boxes.",
    "How does a bicycle stay upright?",
    "Describe the water cycle step by step.",
    "Write a JavaScript function that reverses an array without using reverse().",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain the difference between weather and climate.",
    "Write a short story about a robot who learns to paint.",
    "How do vaccines work?",
    "Give me a packing list for a weekend camping trip.",
    "What is machine learning?",
    "Write a bash one-liner that counts the lines of all .py files in a folder.",
    "Explain the rules of chess briefly.",
    "Why is the sky blue?",
    "Write a polite message declining a meeting invitation.",
    "What are prime numbers? Give the first ten.",
    "Explain how compound interest works with an example.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "What is the difference between HTTP and HTTPS?",
    "Suggest three names for a bakery and explain each.",
    "How do I sort a dictionary by value in Python?",
    "Describe a typical day of a honey bee.",
    "What is the Pythagorean theorem? Show a worked example.",
    "Rewrite this sentence to be more formal: 'We gotta fix this bug asap.'",
    "Explain what Git branches are and why they are useful.",
    "Write a function in C that returns the maximum of an array of integers.",
    "What should I consider when buying a used car?",
    "Give me a study plan for learning basic Spanish in a month.",
    "Explain the difference between RAM and storage.",
    "Write a thank-you note to a teacher.",
    "How does a refrigerator keep food cold?",
    "What is a black hole?",
    "Write a regular expression that matches an email address, and explain it.",
    "Summarize the benefits and drawbacks of remote work.",
)


@dataclass(frozen=True)
class Document:
    """One piece of training text: plain text, or a conversation for the chat template."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) pairs
    source: str = ""

    def chat(self) -> list[dict]:
        return [{"role": role, "content": content} for role, content in self.messages or ()]


# -- reading files ----------------------------------------------------------------------


def read_documents(path: str | os.PathLike) -> list[Document]:
    """Documents from a .txt/.md/.jsonl file or a folder of them; ConfigError when there are none."""
    root = Path(path).expanduser()
    if not root.exists():
        raise ConfigError(
            f"No training data at {root}: give a .txt, .md or .jsonl file, a folder of them, or 'builtin'."
        )
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES)
        if not files:
            raise ConfigError(f"The folder {root} holds no .txt, .md or .jsonl files to train on.")
    elif root.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES:
        files = [root]
    else:
        raise ConfigError(f"{root} is not a .txt, .md or .jsonl file: those are the training data formats.")
    documents: list[Document] = []
    for file in files:
        documents += _read_file(file)
    if not documents:
        raise ConfigError(f"{root} holds no text to train on (empty files, or .jsonl lines without text).")
    return documents


def _read_file(path: Path) -> list[Document]:
    try:
        content = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise ConfigError(f"Cannot read {path}: {error.strerror or error}.") from error
    if path.suffix.lower() not in JSONL_SUFFIXES:
        return [Document(text=content, source=str(path))] if content.strip() else []
    documents = []
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            document = jsonl_document(json.loads(line), f"{path}:{number}")
        except ValueError:
            document = None  # a broken line is skipped, like a line with no text
        if document is not None:
            documents.append(document)
    return documents


_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "bot": "assistant",
    "model": "assistant",
}


def jsonl_document(record, source: str = "") -> Document | None:
    """One .jsonl record as a Document, or None when it holds no text we know how to read."""
    if not isinstance(record, dict):
        return None
    turns = record.get("messages") or record.get("conversations")
    if isinstance(turns, list):
        pairs = []
        for turn in turns:
            if not isinstance(turn, dict):
                continue
            role = _ROLES.get(str(turn.get("role", turn.get("from", ""))).lower())
            content = turn.get("content", turn.get("value"))
            if role and isinstance(content, str) and content.strip():
                pairs.append((role, content))
        return Document(messages=tuple(pairs), source=source) if pairs else None
    prompt = record.get("prompt") or record.get("instruction")
    reply = record.get("response") or record.get("completion") or record.get("output")
    if isinstance(prompt, str) and isinstance(reply, str) and reply.strip():
        return Document(messages=(("user", prompt), ("assistant", reply)), source=source)
    text = record.get("text")
    if isinstance(text, str) and text.strip():
        return Document(text=text, source=source)
    return None


# -- the built-in corpus ------------------------------------------------------------------


def builtin_documents(max_chars: int = DEFAULT_BUILTIN_CHARS) -> list[Document]:
    """Text every install has: stdlib documentation, package descriptions and licenses.

    Interleaved (one stdlib module, one package, ...) so that a smaller `max_chars`
    still gets a mix, and deterministic for a given Python and set of packages.
    """
    stdlib = [d for d in (_module_document(name) for name in STDLIB_MODULES) if d is not None]
    packages = _package_documents()
    documents, total = [], 0
    for i in range(max(len(stdlib), len(packages))):
        for pool in (stdlib, packages):
            if i < len(pool) and total < max_chars:
                documents.append(pool[i])
                total += sum(len(c) for _, c in pool[i].messages or ())
    return documents


def _module_document(name: str, max_chars: int = 60_000) -> Document | None:
    try:
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a module this Python lacks (a trimmed install): skip it
        return None
    parts = [inspect.getdoc(module) or ""]
    for attr, value in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if not (inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value)):
            continue
        doc = inspect.getdoc(value)
        if not doc:
            continue
        try:
            signature = str(inspect.signature(value))
        except (TypeError, ValueError):
            signature = "(...)" if callable(value) else ""
        kind = "class " if inspect.isclass(value) else ""
        parts.append(f"{kind}{attr}{signature}\n\n{doc}")
    text = "\n\n".join(p for p in parts if p).strip()[:max_chars]
    if len(text) < 200:
        return None
    request = f"Explain the Python standard library module `{name}` and its main functions and classes."
    return Document(messages=(("user", request), ("assistant", text)), source=f"stdlib:{name}")


def _package_documents(max_chars: int = 40_000) -> list[Document]:
    """Descriptions (README) and license texts of the installed distributions, duplicates once."""
    folders = sorted({os.path.realpath(p) for d in sys.path if os.path.isdir(d) for p in glob.glob(f"{d}/*.dist-info")})
    documents, seen = [], set()
    for folder in folders:
        name = os.path.basename(folder).split("-")[0]
        try:
            with open(os.path.join(folder, "METADATA"), encoding="utf-8", errors="replace") as f:
                meta = email.message_from_file(f)
            body = meta.get_payload() if not meta.is_multipart() else ""
            description = (body if isinstance(body, str) and body.strip() else meta.get("Description") or "").strip()
        except OSError:
            description = ""
        texts = []
        if len(description) >= 400:
            texts.append((f"What is the Python package {name}, and how do I use it?", description))
        for license_file in sorted(glob.glob(f"{folder}/**/LICEN[CS]E*", recursive=True))[:1]:
            try:
                text = Path(license_file).read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            if len(text) >= 400:
                texts.append((f"Show me the license of the Python package {name}.", text))
        for request, text in texts:
            key = hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()
            if key not in seen:
                seen.add(key)
                documents.append(
                    Document(messages=(("user", request), ("assistant", text[:max_chars])), source=f"package:{name}")
                )
    return documents


def bench_prompts(path: Path = BENCH_PROMPTS) -> list[str]:
    """User prompts from the shipped bench prompts (resources/prompts/bench.jsonl), when present."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    prompts = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, str):
            prompts.append(record)
            continue
        document = jsonl_document(record) if isinstance(record, dict) else None
        if document is not None and document.messages:
            users = [c for r, c in document.messages if r == "user"]
            prompts += users[:1]
            follow_ups = record.get("follow_ups") if isinstance(record, dict) else None  # a conversation's turns
            for message in follow_ups if isinstance(follow_ups, list) else ():
                if isinstance(message, dict) and isinstance(message.get("content"), str):
                    prompts.append(message["content"])
        elif isinstance(record, dict) and isinstance(record.get("prompt"), str):
            prompts.append(record["prompt"])
    return [p for p in prompts if p.strip()]


def generation_prompts(documents: list[Document], n: int, seed: int = 0) -> list[str]:
    """n prompts for self-generated replies: the data's first user turns, then built-in ones.

    When there are fewer than n, requests about stdlib modules fill up the list. The
    benchmark's prompts (resources/prompts/bench.jsonl) are never among them, so heads
    are measured on replies they were not trained on.
    """
    seen, prompts = set(), []

    def add(prompt: str) -> None:
        prompt = prompt.strip()
        if prompt and prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)

    for document in documents:
        for role, content in document.messages or ():
            if role == "user":
                add(content)
                break
    seen.update(p.strip() for p in bench_prompts())
    for prompt in BUILTIN_PROMPTS:
        add(prompt)
    for name in STDLIB_MODULES:
        add(f"What is the Python module `{name}` for? Show a short example.")
        add(f"Write a small program that uses Python's `{name}` module, and explain it.")
    random.Random(seed).shuffle(prompts)
    return prompts[:n]


# -- tokens and windows -------------------------------------------------------------------


def tokenize_documents(target, documents: list[Document]) -> torch.Tensor:
    """All documents as one int32 token stream, each ended by the end-of-sequence token."""
    eos = target.eos_id
    ids: list[int] = []
    for document in documents:
        if document.messages:
            if all(role == "user" for role, _ in document.messages):
                continue  # a lone prompt teaches nothing about replies: it only seeds self-generation
            piece = target.encode_chat(document.chat())
        else:
            piece = target.encode_text(document.text or "")
        if eos is not None and (not piece or piece[-1] != eos):
            piece.append(eos)
        ids += piece
    return torch.tensor(ids, dtype=torch.int32)


def fingerprint(tokens: torch.Tensor) -> str:
    """A short hash of a token stream (to notice data that changed under a resumed run)."""
    return hashlib.sha1(tokens.to(torch.int32).numpy().tobytes()).hexdigest()[:16]


class Windows:
    """The token stream as windows of seq_len: the last ones for validation, the rest for training."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, seed: int, val_windows: int | None = None) -> None:
        count = len(tokens) // seq_len
        if count < 2:
            raise ConfigError(
                f"Not enough training text: {len(tokens)} tokens make {count} window(s) of {seq_len} tokens, "
                "and training needs at least 2 (one is held out for validation). Add data, use --data builtin "
                "or --self-generate, or a shorter --seq-len."
            )
        self.windows = tokens[: count * seq_len].view(count, seq_len).long()  # (N, T)
        if val_windows is None:
            val_windows = min(MAX_VALIDATION_WINDOWS, max(1, count // 50))
        self.n_val = max(1, min(val_windows, count - 1))
        self.n_train = count - self.n_val
        self.seed = seed
        self._order: tuple[int, torch.Tensor] | None = None

    def train_batch(self, position: int, batch_size: int) -> torch.Tensor:
        """The batch at `position` (a count of windows served so far): (B, T) token ids."""
        rows = [self._train_index(position + i) for i in range(batch_size)]
        return self.windows[rows]

    def validation_batches(self, batch_size: int):
        for start in range(self.n_train, self.n_train + self.n_val, batch_size):
            yield self.windows[start : min(start + batch_size, self.n_train + self.n_val)]

    def _train_index(self, position: int) -> int:
        epoch, index = divmod(position, self.n_train)
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(self.n_train, generator=generator))
        return int(self._order[1][index])
