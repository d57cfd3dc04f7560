"""Drafter discovery: every drafter that could serve a target, ranked, and every model left out, with why.

The most reported speculative-decoding complaint in LM Studio's tracker is a draft list that
is empty or unexplained: nobody says why a model is not offered. `discover(target)` answers
from files alone (GGUF headers, config.json, safetensors headers; nothing loads, no torch
unless the target's config says it ships MTP layers), looking at:

- the target's own MTP layers (engine/heads/mtp.py `find_mtp`), when its config.json says it
  has some; a copy saved without them is left out with find_mtp's words;
- a Gemma 4 assistant beside the target or in a store (engine/heads/assistant.py);
- trained heads (Medusa, EAGLE, EAGLE-3) in the model folders, the Hugging Face cache, beside
  the target, shipped with SpecDeck and in the folders given: a head whose shapes differ from the target's is left out
  naming the model it was made for;
- every model `list_models` finds (folders, the HF cache, llama.cpp's cache, Ollama, the
  embedded model), judged by the pair doctor's `check_pair`: another vocabulary or family, a
  parameter ratio outside what pays, or more than the memory left is a reason, in words;
- the drafters that need no files (registry specs with no `ready` and no model of their own),
  where the target's backend can serve them.

Ranking before any measurement is a prior, `score`: the model's own layers and heads made for
it first, then draft models in the useful ratio (closer to the middle of 8:1..70:1 first,
fewer warnings first), then the drafters that need no files, the backend's default first; a
drafter that moves a GGUF target from llama.cpp to PyTorch ranks lower. `measure`
(engine/bench/discovery_measure.py) replaces the prior with measured speed. Heads and
assistants are judged in discovery_folders.py; the records and their words are in
discovery_records.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine.errors import SpecDeckError
from engine.models.discovery_folders import beside, folder_kind, judge_folder, read_json, shipped_roots, walk
from engine.models.discovery_records import (  # noqa: F401 (re-exported: callers import them from here)
    ASSISTANT,
    HEADS,
    MODEL,
    MTP,
    NO_FILES,
    PRIOR,
    Candidate,
    Discovery,
    Found,
    LeftOut,
    format_discovery,
)
from engine.models.doctor import RATIO_MAX, RATIO_MIN, check_pair, format_params
from engine.models.locate import ModelRef, hf_cache_dir, list_models, model_dirs, resolve
from engine.models.metadata import ModelMeta, read_metadata
from engine.models.placement import Placement

NO_FILES_PRIOR = {"suffix": 60, "ngram": 60, "lookahead": 50, "early-exit": 45}
DEFAULT_BONUS = 5  # the backend's default drafter (measured fastest there, docs/benchmarks.md)
# A GGUF target then runs on PyTorch, dequantized, instead of llama.cpp: ranked below the drafters that keep
# it there, since on a CPU the dequantized target alone decodes about 3x slower (SmolLM2: 110 against 35 tok/s,
# docs/benchmarks.md), more than such a drafter wins back. Measuring ranks by what this machine does.
TORCH_ON_GGUF = 40
RATIO_SWEET = math.sqrt(RATIO_MIN * RATIO_MAX)  # the middle of the useful range, on a log scale


def discover(
    target: str | ModelRef,
    *,
    models: list[ModelRef] | None = None,
    extra_dirs=(),
    heads_dirs=(),
    n_ctx: int = 4096,
    backend: str = "auto",
    place: Callable[[ModelRef], Placement] | None = None,
) -> Discovery:
    """Every drafter that could serve `target` (a spec or a ModelRef), ranked, and what was left out
    with why. `models`: the models to judge (default: `list_models(extra_dirs)`); `heads_dirs`:
    more folders holding heads (the app's trained ones); `backend`: "auto" (a GGUF on llama.cpp, a
    folder on PyTorch; PyTorch drafters move the target there), "llama.cpp" or "torch"; `place`: where
    each model will sit, for the memory check (engine/models/placement.py `model_placement`, which
    asks the devices; default: system RAM, which asks nothing). Raises the
    load's own error when the target cannot be found or read."""
    ref = target if isinstance(target, ModelRef) else resolve(str(target))
    meta = read_metadata(ref)
    runs_on = ("llama.cpp" if ref.kind == "gguf" else "torch") if backend == "auto" else backend
    models = list_models(extra_dirs) if models is None else models
    found = Found()
    found.first_time(ref.path)
    config = read_json(Path(ref.path) / "config.json") if ref.kind == "hf" else {}
    _own_layers(ref, config, found)
    roots = [*heads_dirs, *model_dirs(extra_dirs), hf_cache_dir(), *shipped_roots()]
    folders = walk(roots) + beside(ref) + [Path(m.path) for m in models if m.kind == "hf"]
    for folder in folders:
        judge_folder(folder, ref, meta, config, found)
    for model in models:
        if model.kind == "gguf" or not folder_kind(Path(model.path)):
            _judge_model(model, meta, n_ctx, found, place)
    _no_files(runs_on, found)
    moved = ref.kind == "gguf" and backend == "auto"
    ranked = [_torch_cost(c, moved, backend, found) for c in found.candidates]
    ranked = [c for c in ranked if c is not None]
    ranked.sort(key=lambda c: (-c.score, c.name.lower()))
    kinds = (MTP, ASSISTANT, HEADS, MODEL, NO_FILES)  # left out: the target's own first, then by kind and name
    left_out = sorted(found.left_out, key=lambda x: (kinds.index(x.kind), x.name.lower()))
    return Discovery(ref.name, ref.spec, ref.path, runs_on, tuple(ranked), tuple(left_out))


# -- the target's own layers --------------------------------------------------------------


def _own_layers(ref: ModelRef, config: dict, found: Found) -> None:
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


# -- models ----------------------------------------------------------------------------------


def _judge_model(model: ModelRef, meta: ModelMeta, n_ctx: int, found: Found, place=None) -> None:
    if not found.first_time(model.path):
        return
    try:
        on = {"target_on": place(meta.ref), "draft_on": place(model)} if place is not None else {}
        report = check_pair(meta, model, n_ctx=n_ctx, **on)
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


def _no_files(runs_on: str, found: Found) -> None:
    from engine.drafters.registry import all_drafters, default_drafter

    default = default_drafter(runs_on)
    for spec in all_drafters():
        if spec.name == "none" or spec.loads_model or spec.ready is not None:
            continue  # plain decoding, and drafters that need a model or heads (judged above)
        score = NO_FILES_PRIOR.get(spec.name, 40) + (DEFAULT_BONUS if spec.name == default else 0)
        why = spec.summary + (f" The default on {runs_on}: measured fastest there." if spec.name == default else "")
        why = why.replace(" (PyTorch only).", ".")  # said below, where it matters
        found.candidates.append(Candidate(NO_FILES, spec.name, spec.label, "", why, score))


def _torch_cost(c: Candidate, moved: bool, backend: str, found: Found) -> Candidate | None:
    """A drafter that needs PyTorch: left out on a target pinned to llama.cpp; ranked lower when it
    moves a GGUF target from llama.cpp to PyTorch."""
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
