"""Drafter discovery: every drafter that could serve a target, ranked, and every model left out, with why.

The most reported speculative-decoding complaint in LM Studio's tracker is a draft list that
is empty or unexplained: nobody says why a model is not offered. `discover(target)` answers
from files alone (GGUF headers, config.json, safetensors headers; nothing loads, no torch
unless the target's config says it ships MTP layers), looking at:

- the target's own MTP layers (engine/heads/mtp.py `find_mtp`), when its config.json says it
  has some; a copy saved without them is left out with find_mtp's words;
- a Gemma 4 assistant beside the target or in a store (engine/heads/assistant.py);
- trained heads (Medusa, EAGLE, EAGLE-3) in the stores, beside the target, shipped with
  SpecDeck and in the folders given: a head whose shapes differ from the target's is left out
  naming the model it was made for;
- every model `list_models` finds (folders, the HF cache, llama.cpp's cache, Ollama, the
  embedded model), judged by the pair doctor's `check_pair`: another vocabulary or family, a
  parameter ratio outside what pays, or more than the memory left is a reason, in words;
- the drafters that need no files (registry specs with no `ready` and no model of their own),
  where the target's backend can serve them.

Ranking before any measurement is a prior, `score`: the model's own layers and heads made for
it first, then draft models in the useful ratio (closer to the middle of 8:1..70:1 first,
fewer warnings first), then the drafters that need no files, the backend's default first; a
drafter that moves a GGUF target from llama.cpp to PyTorch ranks lower. `measure` in
discovery_measure.py replaces the prior with measured speed.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.errors import SpecDeckError
from engine.heads.kinds import heads_config_kind
from engine.models.doctor import RATIO_MAX, RATIO_MIN, check_pair, format_params
from engine.models.locate import ModelRef, list_models, model_dirs, resolve
from engine.models.metadata import ModelMeta, read_metadata

MODEL, HEADS, MTP, ASSISTANT, NO_FILES = "model", "heads", "mtp", "assistant", "no files"
HEAD_NAMES = {"medusa": "Medusa heads", "eagle": "EAGLE head", "eagle3": "EAGLE-3 head"}
# The prior (higher first): what usually pays most, before anything is measured.
PRIOR = {"mtp": 90, "assistant": 88, "eagle3": 86, "eagle": 84, "medusa": 80, "model": 70}
NO_FILES_PRIOR = {"suffix": 60, "ngram": 60, "lookahead": 50, "early-exit": 45}
DEFAULT_BONUS = 5  # the backend's default drafter (measured fastest there, docs/benchmarks.md)
TORCH_ON_GGUF = 15  # a GGUF target then runs on PyTorch, dequantized, instead of llama.cpp
RATIO_SWEET = math.sqrt(RATIO_MIN * RATIO_MAX)  # the middle of the useful range, on a log scale
_MAX_WALK_DEPTH = 3
_MAX_FOLDERS = 4000  # a heads walk stops here: a store is not a whole disk
_HEADER_LIMIT = 64 * 2**20


@dataclass(frozen=True)
class Candidate:
    kind: str  # MODEL, HEADS, MTP, ASSISTANT or NO_FILES
    drafter: str  # the registry name to choose ("model", "medusa", "ngram"...)
    name: str  # what a user calls it
    path: str  # the file or folder; "" for a drafter that needs none
    why: str  # the check's words: what fits, what to expect
    score: float  # the prior (see the module doc); measured candidates rank by `speedup`
    option: str = ""  # the drafter's option that takes `spec` ("draft", "heads"); "" when none
    spec: str = ""  # what to give that option (a model spec, a folder)
    tokens_per_s: float | None = None  # measured (discovery_measure.py)
    speedup: float | None = None  # measured tokens/s over plain decoding's
    note: str = ""  # what the measurement said ("not measured: ...")

    @property
    def cli(self) -> str:
        """The command-line options that choose it: "--drafter model --draft SPEC"."""
        flag = {"draft": "--draft", "heads": "--heads"}.get(self.option, f"--{self.option.replace('_', '-')}")
        return f"--drafter {self.drafter}" + (f" {flag} {self.spec}" if self.option else "")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class LeftOut:
    kind: str  # what it would have been: MODEL, HEADS, MTP, ASSISTANT or NO_FILES
    name: str
    path: str
    reason: str  # why not, in words a user can act on

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LeftOut:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Discovery:
    target: str  # its name
    target_spec: str
    target_path: str
    backend: str  # where the target runs unless a drafter needs PyTorch: "llama.cpp" or "torch"
    candidates: tuple[Candidate, ...]  # ranked, best first
    left_out: tuple[LeftOut, ...]
    vanilla_tokens_per_s: float | None = None  # measured plain decoding (None: not measured)
    measured_s: float = 0.0  # seconds of generation the measurement took (loads not counted)

    @property
    def measured(self) -> bool:
        return self.vanilla_tokens_per_s is not None

    def to_dict(self) -> dict:
        return {
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("candidates", "left_out")},
            "candidates": [c.to_dict() for c in self.candidates],
            "left_out": [x.to_dict() for x in self.left_out],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Discovery:
        plain = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        plain["candidates"] = tuple(Candidate.from_dict(c) for c in data.get("candidates", ()))
        plain["left_out"] = tuple(LeftOut.from_dict(x) for x in data.get("left_out", ()))
        return cls(**plain)

    def __str__(self) -> str:
        return format_discovery(self)


@dataclass
class _Found:
    candidates: list[Candidate] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # real paths already judged

    def first_time(self, path: str) -> bool:
        key = os.path.realpath(path)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def discover(
    target: str | ModelRef,
    *,
    models: list[ModelRef] | None = None,
    extra_dirs=(),
    heads_dirs=(),
    n_ctx: int = 4096,
    backend: str = "auto",
) -> Discovery:
    """Every drafter that could serve `target` (a spec or a ModelRef), ranked, and what was left out
    with why. `models`: the models to judge (default: `list_models(extra_dirs)`); `heads_dirs`:
    more folders holding heads (the app's trained ones); `backend`: "auto" (a GGUF on llama.cpp, a
    folder on PyTorch; PyTorch drafters move the target there), "llama.cpp" or "torch". Raises the
    load's own error when the target cannot be found or read."""
    ref = target if isinstance(target, ModelRef) else resolve(str(target))
    meta = read_metadata(ref)
    runs_on = ("llama.cpp" if ref.kind == "gguf" else "torch") if backend == "auto" else backend
    models = list_models(extra_dirs) if models is None else models
    found = _Found()
    found.first_time(ref.path)
    config = _json(Path(ref.path) / "config.json") if ref.kind == "hf" else {}
    _own_layers(ref, config, found)
    roots = [*heads_dirs, *model_dirs(extra_dirs), *_shipped_roots()]
    folders = _walk(roots) + _beside(ref) + [Path(m.path) for m in models if m.kind == "hf"]
    for folder in folders:
        _judge_folder(folder, ref, meta, config, found)
    for model in models:
        if model.kind == "gguf" or not _folder_kind(Path(model.path)):
            _judge_model(model, meta, n_ctx, found)
    _no_files(runs_on, found)
    moved = ref.kind == "gguf" and backend == "auto"
    ranked = [_torch_cost(c, moved, backend, found) for c in found.candidates]
    ranked = [c for c in ranked if c is not None]
    ranked.sort(key=lambda c: (-c.score, c.name.lower()))
    return Discovery(ref.name, ref.spec, ref.path, runs_on, tuple(ranked), tuple(found.left_out))


# -- the target's own layers --------------------------------------------------------------


def _own_layers(ref: ModelRef, config: dict, found: _Found) -> None:
    """MTP layers, looked for only when config.json says there are some: find_mtp imports torch."""
    if not _says_mtp(config):
        return
    from engine.heads.mtp import LAYOUTS, find_mtp

    name = f"MTP layers of {ref.name}"
    try:
        files = find_mtp(ref.path, config)
    except SpecDeckError as error:
        found.left_out.append(LeftOut(MTP, name, ref.path, str(error)))
        return
    why = f"the model's own {files.n_layers} MTP layer(s), {LAYOUTS[files.layout]}: nothing to download or train"
    found.candidates.append(Candidate(MTP, "mtp", name, ref.path, why, PRIOR["mtp"]))


def _says_mtp(config: dict) -> bool:
    """Whether a config.json declares multi-token-prediction layers (num_nextn_predict_layers,
    mtp_num_hidden_layers...) or is of an architecture that keeps them under mtp.* (Qwen3-Next)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for key, value in {**config, **text}.items():
        if ("nextn" in key or "mtp" in key) and isinstance(value, int) and value > 0:
            return True
    return "qwen3_next" in str(config.get("model_type") or "")


# -- folders: heads and assistants ------------------------------------------------------------


def _judge_folder(folder: Path, ref: ModelRef, meta: ModelMeta, config: dict, found: _Found) -> None:
    kind = _folder_kind(folder)
    if kind is None or not found.first_time(str(folder)):
        return
    data = _json(folder / "config.json")
    if kind == ASSISTANT:
        _judge_assistant(folder, data, ref, config, found)
    else:
        _judge_head(folder, kind, data, ref, meta, found)


def _folder_kind(folder: Path) -> str | None:
    """ASSISTANT, "medusa", "eagle", "eagle3" for such a folder; None for a model or anything else.
    An EAGLE head is a one-layer Llama config: ours says so ("specdeck": {"kind": "eagle"}), a
    published one has the fc projection in its weights."""
    data = _json(folder / "config.json")
    if not data:
        return None
    if _assistant_check() is not None and _assistant_check()[0](data):
        return ASSISTANT
    if "medusa_num_heads" in data or any(folder.glob("medusa_lm_head.*")):
        return "medusa"
    kind = heads_config_kind(data)
    if kind == "eagle3":
        return kind
    ours = data.get("specdeck") if isinstance(data.get("specdeck"), dict) else {}
    if ours.get("kind") == "eagle" or (data.get("num_hidden_layers") == 1 and "fc.weight" in _tensors(folder)):
        return "eagle"
    return None


def _judge_head(folder: Path, kind: str, data: dict, ref: ModelRef, meta: ModelMeta, found: _Found) -> None:
    what = HEAD_NAMES[kind]
    ours = data.get("specdeck") if isinstance(data.get("specdeck"), dict) else {}
    made_for = str(data.get("base_model_name_or_path") or ours.get("base_model") or data.get("_name_or_path") or "")
    name = f"{what} ({folder.name})"
    wrong = _shape_mismatch(folder, kind, data, meta)
    if wrong:
        whose = f"made for {made_for}" if made_for else "made for another model (its config does not name it)"
        found.left_out.append(
            LeftOut(
                HEADS,
                name,
                str(folder),
                f"{what} {whose}: its {wrong}. Use heads trained for {ref.name} "
                f"(Models > Train heads…, or `specdeck-cli train-heads --kind {kind}`).",
            )
        )
        return
    shipped = _shipped_for(kind, ref, meta)
    if shipped and os.path.realpath(shipped) == os.path.realpath(folder):
        ship = "ship" if what.endswith("heads") else "ships"
        why, score = f"{what} that {ship} with SpecDeck for {ref.name}", PRIOR[kind]
    elif made_for and _model_key(made_for) in _target_keys(ref):
        why, score = f"{what} trained for {made_for}", PRIOR[kind]
    elif made_for:
        why = (
            f"{what} trained for {made_for}, not by this target's name: their shapes fit {ref.name}, so "
            "they load, but heads trained on another model are accepted less often"
        )
        score = PRIOR[kind] - 20
    else:
        why, score = f"{what} whose config names no model; their shapes fit {ref.name}", PRIOR[kind] - 20
    found.candidates.append(Candidate(HEADS, kind, name, str(folder), why, score, "heads", str(folder)))


def _shape_mismatch(folder: Path, kind: str, data: dict, meta: ModelMeta) -> str:
    """What in the head's config differs from the target's shapes ("hidden size 896 (the target's:
    576)"), "" when they fit."""
    hidden = data.get("hidden_size")
    if hidden is None and kind == "medusa":
        shape = _tensors(folder).get("0.0.linear.weight")
        hidden = shape[1] if shape and len(shape) == 2 else None
    checks = [("hidden size", hidden, meta.hidden_size)]
    shared = (data.get("specdeck") or {}).get("shared_lm_head", False) if kind == "medusa" else False
    if not shared:
        checks.append(("vocabulary size", data.get("vocab_size"), meta.vocab_size))
    if kind != "medusa":
        heads = data.get("num_attention_heads")
        checks += [
            ("attention heads", heads, meta.n_heads),
            ("key/value heads", data.get("num_key_value_heads") or heads, meta.n_kv_heads),
        ]
    wrong = [f"{what} {theirs} (the target's: {ours})" for what, theirs, ours in checks if theirs and theirs != ours]
    return ", ".join(wrong)


def _judge_assistant(folder: Path, data: dict, ref: ModelRef, config: dict, found: _Found) -> None:
    name = f"Gemma 4 assistant ({folder.name})"
    if ref.kind != "hf":
        reason = (
            f"a Gemma 4 assistant drafts from its target's own folder (config.json), and {ref.name} is a GGUF "
            "file: choose the target's Hugging Face folder to use it."
        )
        found.left_out.append(LeftOut(ASSISTANT, name, str(folder), reason))
        return
    mismatch = _assistant_check()[1](config, data)
    if mismatch:
        found.left_out.append(LeftOut(ASSISTANT, name, str(folder), f"an assistant for another target: {mismatch}"))
        return
    drafter, option = _assistant_drafter()
    if drafter is None:
        reason = "an assistant for this target, but this SpecDeck has no drafter that runs Gemma 4 assistants yet."
        found.left_out.append(LeftOut(ASSISTANT, name, str(folder), reason))
        return
    why = f"a Gemma 4 assistant made for {ref.name}'s architecture"
    found.candidates.append(
        Candidate(ASSISTANT, drafter, name, str(folder), why, PRIOR[ASSISTANT], option, str(folder))
    )


def _assistant_check():
    """(is_assistant_config, assistant_mismatch) from engine/heads/assistant.py, None without it."""
    try:
        from engine.heads.assistant import assistant_mismatch, is_assistant_config
    except ImportError:
        return None
    return is_assistant_config, assistant_mismatch


def _assistant_drafter() -> tuple[str | None, str]:
    """The registered drafter that runs assistants, and its option that takes the folder."""
    from engine.drafters.registry import all_drafters, option_settings

    for spec in all_drafters():
        if "assistant" in spec.name:
            option = next((s.name for s in option_settings(spec) if s.kind in ("path", "model")), "")
            return spec.name, option
    return None, ""


# -- models ----------------------------------------------------------------------------------


def _judge_model(model: ModelRef, meta: ModelMeta, n_ctx: int, found: _Found) -> None:
    if not found.first_time(model.path):
        return
    try:
        report = check_pair(meta, model, n_ctx=n_ctx)
    except SpecDeckError as error:
        found.left_out.append(LeftOut(MODEL, model.name, model.path, f"cannot be read: {error}"))
        return
    by_title = {f.title: f for f in report.findings}
    d = report.draft
    ratio = meta.n_params / max(d.n_params, 1)
    reason = _model_reason(meta, d, ratio, report.findings, by_title)
    if reason:
        found.left_out.append(LeftOut(MODEL, model.name, model.path, reason))
        return
    warnings = [f for f in report.findings if f.severity == "warning"]
    facts = [
        "same vocabulary"
        + ("" if "Vocabularies match" in by_title else f" ({len(d.vocab)} tokens, the target {len(meta.vocab)})"),
        f"{ratio:.0f}:1 parameters ({format_params(meta.n_params)} / {format_params(d.n_params)}), in the useful "
        f"{RATIO_MIN}:1 to {RATIO_MAX}:1",
        *(f.title.lower() for f in warnings),
    ]
    score = PRIOR[MODEL] - 3 * len(warnings) - abs(math.log(ratio / RATIO_SWEET))
    found.candidates.append(
        Candidate(MODEL, "model", model.name, model.path, "; ".join(facts), round(score, 2), "draft", model.spec)
    )


def _model_reason(t: ModelMeta, d: ModelMeta, ratio: float, findings, by_title: dict) -> str:
    """Why a model cannot serve as this target's draft, "" when it can."""
    for f in findings:
        if f.severity == "error" and f.title != "Different vocabularies":
            return f"{f.title}: {f.detail}"
    if "Different vocabularies" in by_title:
        said = by_title["Different vocabularies"].detail.partition(" The draft must")[0]
        if d.architecture != t.architecture:
            return f"another family ({d.architecture}; the target is {t.architecture}), with another vocabulary: {said}"
        return f"another vocabulary: {said} The draft must use the target's tokenizer."
    if "The file looks damaged" in by_title:
        return f"the file looks damaged: {by_title['The file looks damaged'].detail}"
    sizes = f"{format_params(t.n_params)} / {format_params(d.n_params)}"
    pays = f"outside what pays (about {RATIO_MIN}:1 to {RATIO_MAX}:1)"
    if d.n_params >= t.n_params:
        return f"not smaller than the target: a parameter ratio of {ratio:.1f}:1 ({sizes}), {pays}."
    if ratio < RATIO_MIN:
        return (
            f"a parameter ratio of {ratio:.1f}:1 ({sizes}), {pays}: below {RATIO_MIN}:1 the draft's own cost eats "
            "the speedup. A smaller model of the same family would do."
        )
    if ratio > RATIO_MAX:
        return (
            f"a parameter ratio of {ratio:.1f}:1 ({sizes}), {pays}: above {RATIO_MAX}:1 the draft agrees with the "
            "target too rarely. A larger model of the same family would do."
        )
    memory = next((f for f in findings if f.title.startswith("May not fit in memory")), None)
    if memory is not None:
        return f"too big for the memory left: {memory.detail}"
    return ""


# -- drafters that need no files ----------------------------------------------------------------


def _no_files(runs_on: str, found: _Found) -> None:
    from engine.drafters.registry import all_drafters, default_drafter

    default = default_drafter(runs_on)
    for spec in all_drafters():
        if spec.name == "none" or spec.loads_model or spec.ready is not None:
            continue  # plain decoding, and drafters that need a model or heads (judged above)
        score = NO_FILES_PRIOR.get(spec.name, 40) + (DEFAULT_BONUS if spec.name == default else 0)
        why = spec.summary + (f" The default on {runs_on}: measured fastest there." if spec.name == default else "")
        why = why.replace(" (PyTorch only).", ".")  # said below, where it matters
        found.candidates.append(Candidate(NO_FILES, spec.name, spec.label, "", why, score))


def _torch_cost(c: Candidate, moved: bool, backend: str, found: _Found) -> Candidate | None:
    """A drafter that needs PyTorch: left out on a target pinned to llama.cpp; ranked lower when it
    moves a GGUF target from llama.cpp to PyTorch."""
    from dataclasses import replace

    from engine.drafters.registry import drafter_spec

    spec = drafter_spec(c.drafter)
    if not spec.needs_torch:
        return c
    if backend == "llama.cpp":
        found.left_out.append(LeftOut(c.kind, c.name, c.path, f"needs the PyTorch backend: {spec.torch_reason}"))
        return None
    if moved:
        note = " It runs the target on PyTorch, dequantized from the GGUF, instead of llama.cpp."
        return replace(c, why=c.why.rstrip(".") + "." + note, score=c.score - TORCH_ON_GGUF)
    return c


# -- helpers ------------------------------------------------------------------------------------


def _walk(roots) -> list[Path]:
    """Folders holding a config.json under each root (a root may be one), at most _MAX_WALK_DEPTH
    down; a model folder is not entered."""
    out: list[Path] = []
    visited: set[str] = set()
    stack = [(Path(r).expanduser(), 0) for r in roots]
    while stack and len(visited) < _MAX_FOLDERS:
        folder, depth = stack.pop(0)
        real = os.path.realpath(folder)
        if real in visited or not folder.is_dir():
            continue
        visited.add(real)
        if (folder / "config.json").is_file():
            out.append(folder)
            continue
        if depth < _MAX_WALK_DEPTH:
            try:
                subs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
            except OSError:
                continue
            stack += [(p, depth + 1) for p in subs]
    return out


def _beside(ref: ModelRef) -> list[Path]:
    """The folders next to the target (its parent's children): where heads and assistants are often kept."""
    parent = Path(ref.path).parent
    try:
        return sorted(p for p in parent.iterdir() if p.is_dir() and (p / "config.json").is_file())
    except OSError:
        return []


def _shipped_roots() -> list[Path]:
    from engine.models.shipped import resources_dir

    roots = [resources_dir() / "heads"]
    data = os.environ.get("SPECDECK_DATA_DIR")
    return roots + ([Path(data) / "heads"] if data else [])


def _shipped_for(kind: str, ref: ModelRef, meta: ModelMeta) -> str | None:
    from types import SimpleNamespace

    from engine.models.shipped import default_heads_dir

    info = SimpleNamespace(
        name=ref.name, path=ref.path, architecture=meta.architecture, vocab_size=meta.vocab_size, n_layers=meta.n_layers
    )
    return default_heads_dir(kind, info)


def _model_key(name: str) -> str:
    """A model's name without its folder, format and quantization: "smollm2-135m-instruct"."""
    base = re.split(r"[/\\:]", name.rstrip("/\\"))[-1].lower().replace("_", "-")
    base = re.sub(r"\.gguf$", "", base)
    while True:
        shorter = re.sub(r"[-.](gguf|f16|f32|bf16|fp16|i?q\d[\w-]*)$", "", base)
        if shorter == base:
            return base
        base = shorter


def _target_keys(ref: ModelRef) -> set[str]:
    return {_model_key(ref.name), _model_key(ref.path), _model_key(ref.spec)}


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tensors(folder: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the JSON headers of the folder's .safetensors files (no weights read)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                if size > _HEADER_LIMIT:
                    continue
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            continue
        shapes.update({k: v.get("shape") for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)})
    return shapes


# -- words ------------------------------------------------------------------------------------


def format_discovery(found: Discovery, width: int = 100) -> str:
    """The candidates, ranked, with how to choose each, then what was left out and why."""
    import textwrap

    def wrap(text: str) -> list[str]:
        return textwrap.wrap(text, width, initial_indent=" " * 7, subsequent_indent=" " * 7)

    lines = [f"Drafters for {found.target} ({found.target_path}), runs on {found.backend}:"]
    if found.measured:
        lines.append(
            f"Measured for {found.measured_s:.1f} s of generation: plain decoding "
            f"{found.vanilla_tokens_per_s:.1f} tokens/s."
        )
    for i, c in enumerate(found.candidates, 1):
        where = f"  {c.path}" if c.path else ""
        lines.append(f"  {i:>2}. {c.name} [{c.drafter}]{where}")
        if c.speedup is not None:
            lines.append(f"       measured: {c.tokens_per_s:.1f} tokens/s, {c.speedup:.2f}x plain decoding")
        elif c.note:
            lines += wrap(c.note)
        lines += wrap(c.why)
        lines.append(f"       use: {c.cli}")
    if not found.candidates:
        lines.append("  (none)")
    lines += ["", f"Left out ({len(found.left_out)}):"]
    for x in found.left_out:
        lines.append(f"  - {x.name}  {x.path}".rstrip())
        lines += wrap(x.reason)
    if not found.left_out:
        lines.append("  (none)")
    return "\n".join(lines)
