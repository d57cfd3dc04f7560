"""Drafter discovery's look at folders: trained heads (Medusa, EAGLE, EAGLE-3) and Gemma 4 assistants,
in the stores, beside the target and shipped with SpecDeck, each judged against the target's shapes.

A heads folder is told from a model folder by its config.json and files (engine/heads/kinds.py,
app/pair/heads.py): Medusa's keys or medusa_lm_head.*, an EAGLE-3 config, our "specdeck" section,
or a one-layer config with the fc projection in its weights (a published EAGLE head). Headers only:
safetensors' JSON headers give the tensor names and shapes, no weight is read and no torch loads.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

from engine.heads.kinds import heads_config_kind
from engine.models.discovery_records import ASSISTANT, HEADS, PRIOR, Candidate, Found, LeftOut
from engine.models.locate import ModelRef
from engine.models.metadata import ModelMeta

HEAD_NAMES = {"medusa": "Medusa heads", "eagle": "EAGLE head", "eagle3": "EAGLE-3 head"}
NAME_ONLY = 20  # heads whose shapes fit but which were trained for a model of another name rank this much lower
_MAX_WALK_DEPTH = 3
_MAX_FOLDERS = 4000  # a walk stops here: a store is not a whole disk
_HEADER_LIMIT = 64 * 2**20


def judge_folder(folder: Path, ref: ModelRef, meta: ModelMeta, config: dict, found: Found) -> None:
    kind = folder_kind(folder)
    if kind is None or not found.first_time(str(folder)):
        return
    data = read_json(folder / "config.json")
    if kind == ASSISTANT:
        _judge_assistant(folder, data, ref, config, found)
    else:
        _judge_head(folder, kind, data, ref, meta, found)


def folder_kind(folder: Path) -> str | None:
    """ASSISTANT, "medusa", "eagle", "eagle3" for such a folder; None for a model or anything else.
    An EAGLE head is a one-layer Llama config: ours says so ("specdeck": {"kind": "eagle"}), a
    published one has the fc projection in its weights."""
    data = read_json(folder / "config.json")
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
    if ours.get("kind") == "eagle" or (data.get("num_hidden_layers") == 1 and _eagle_weights(folder)):
        return "eagle"
    return None


def _eagle_weights(folder: Path) -> bool:
    """A one-layer folder whose weights are an EAGLE head's: the fc projection in its safetensors, or
    the published heads' pytorch_model.bin alone (a pickle is never opened here)."""
    if any(folder.glob("*.safetensors")):
        return "fc.weight" in _tensors(folder)
    return (folder / "pytorch_model.bin").is_file()


def display_name(folder: Path) -> str:
    """What a user calls a folder: its name, or for a Hugging Face cache snapshot the repo id."""
    repo = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--") :].replace("--", "/")
    return folder.name


def _judge_head(folder: Path, kind: str, data: dict, ref: ModelRef, meta: ModelMeta, found: Found) -> None:
    what = HEAD_NAMES[kind]
    ours = data.get("specdeck") if isinstance(data.get("specdeck"), dict) else {}
    made_for = str(data.get("base_model_name_or_path") or ours.get("base_model") or data.get("_name_or_path") or "")
    name = f"{what} ({display_name(folder)})"
    wrong = _shape_mismatch(folder, kind, data, meta)
    if wrong:
        whose = f"made for {made_for}" if made_for else "made for another model (its config does not name it)"
        found.left_out.append(
            LeftOut(
                HEADS,
                name,
                str(folder),
                f"{what} {whose}: {'their' if what.endswith('heads') else 'its'} {wrong}. Use heads trained for {ref.name} "
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
        score = PRIOR[kind] - NAME_ONLY
    else:
        why, score = f"{what} whose config names no model; their shapes fit {ref.name}", PRIOR[kind] - NAME_ONLY
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


def _judge_assistant(folder: Path, data: dict, ref: ModelRef, config: dict, found: Found) -> None:
    name = f"Gemma 4 assistant ({display_name(folder)})"
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


def walk(roots) -> list[Path]:
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


def beside(ref: ModelRef) -> list[Path]:
    """The folders next to the target (its parent's children): where heads and assistants are often kept."""
    parent = Path(ref.path).parent
    try:
        return sorted(p for p in parent.iterdir() if p.is_dir() and (p / "config.json").is_file())
    except OSError:
        return []


def shipped_roots() -> list[Path]:
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


def read_json(path: Path) -> dict:
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
