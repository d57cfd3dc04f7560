"""The pair doctor: can this draft speed up this target, before anything loads?

`check_pair` reads both models' metadata (headers only, see metadata.py) and
reports findings a user can act on: do the vocabularies match (the one hard
requirement: draft tokens are target tokens), do the special tokens and chat
templates agree, is the size ratio in the useful range, does the pair fit in
memory. Only a vocabulary mismatch is an "error"; everything else lowers the
speedup or risks running out of memory, so it is a "warning" at most.

The ratio guidance is the seed article's (section 6): target:draft parameters
between 8:1 and 70:1. Below 8:1 the draft's own cost eats the speedup; above
70:1 the draft agrees with the target too rarely and acceptance collapses.
"""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import asdict, dataclass

from engine.errors import ConfigError, SpecDeckError
from engine.models.gguf_check import damage_message
from engine.models.hf_support import transformers_problem
from engine.models.locate import ModelRef, resolve
from engine.models.metadata import ModelMeta, read_metadata
from engine.models.placement import CPU, Placement

RATIO_MIN, RATIO_MAX = 8, 70
MEMORY_FRACTION = 0.8  # above this share of free memory, the OS starts paging or killing
GGUF_KV_BYTES = 2  # llama.cpp's KV cache is float16 unless told otherwise

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# Weight formats that are not a compute dtype: bytes per weight; the KV cache stays in the compute dtype.
_WEIGHT_BYTES = {"int8": 1}
_DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "float": "float32"}


@dataclass(frozen=True)
class Finding:
    severity: str  # "ok" | "info" | "warning" | "error"
    title: str
    detail: str  # plain words a user can act on

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Finding:
        return cls(str(data["severity"]), str(data["title"]), str(data["detail"]))


@dataclass(frozen=True)
class PairReport:
    target: ModelMeta
    draft: ModelMeta
    findings: tuple[Finding, ...]

    @property
    def compatible(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict:
        """The whole report as plain JSON, both models' metadata included (`from_dict` reads it back);
        `as_dict` is the shorter summary the CLI prints."""
        return {
            "target": self.target.to_dict(),
            "draft": self.draft.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, data: dict) -> PairReport:
        return cls(
            ModelMeta.from_dict(data["target"]),
            ModelMeta.from_dict(data["draft"]),
            tuple(Finding.from_dict(f) for f in data["findings"]),
        )

    def as_dict(self) -> dict:
        return {
            "compatible": self.compatible,
            "target": self.target.summary(),
            "draft": self.draft.summary(),
            "findings": [asdict(f) for f in self.findings],
        }

    def __str__(self) -> str:
        lines = [f"Target: {describe(self.target)}", f"Draft:  {describe(self.draft)}", ""]
        lines += [format_finding(f) for f in self.findings]
        warnings = sum(f.severity == "warning" for f in self.findings)
        if not self.compatible:
            verdict = "NOT compatible: these models cannot be used together (see the error above)."
        elif warnings:
            verdict = f"compatible, with {warnings} warning{'s' if warnings > 1 else ''}."
        else:
            verdict = "compatible."
        return "\n".join(lines + ["", f"Verdict: {verdict}"])


def check_pair(
    target: str | ModelRef | ModelMeta,
    draft: str | ModelRef | ModelMeta,
    *,
    n_ctx: int = 4096,
    dtype: str | None = None,
    target_on: Placement = CPU,
    draft_on: Placement = CPU,
    architectures: bool = True,
) -> PairReport:
    """Check a target/draft pair from their files (or from metadata already read).

    `dtype` is the dtype Hugging Face models will be loaded in (None: as stored);
    GGUF models keep their quantization. `target_on` and `draft_on` say where each will
    sit (engine/models/placement.py): a GPU's memory is checked for what goes there,
    system RAM for the rest. `architectures=False` leaves out whether transformers can
    build each folder's architecture (a loaded target could). Raises ModelNotFoundError /
    ModelLoadError when a model cannot be found or read, ConfigError for a bad n_ctx or dtype.
    """
    _check_n_ctx(n_ctx)
    t, d = _meta(target), _meta(draft)
    placed = {"target": (t, target_on), "draft": (d, draft_on)}
    findings = (
        *_files({"the target": t, "the draft": d}, architectures),
        _vocabulary(t, d),
        _special_tokens(t, d),
        _chat_templates(t, d),
        _size_ratio(t, d),
        _context(n_ctx, {"the target": t, "the draft": d}),
        *_offload(placed),
        _memory(n_ctx, dtype, placed),
    )
    return PairReport(t, d, findings)


def check_model(
    spec: str | ModelRef | ModelMeta, *, n_ctx: int = 4096, dtype: str | None = None, on: Placement = CPU
) -> tuple[Finding, ...]:
    """Findings for one model: can it be read, what is it, does it fit where it will sit (`on`).
    Never raises for a bad model."""
    _check_n_ctx(n_ctx)
    try:
        meta = _meta(spec)
    except SpecDeckError as e:
        return (Finding("error", "Cannot use this model", str(e)),)
    findings = [Finding("ok", "Readable", describe(meta)), *_files({"": meta}), _context(n_ctx, {meta.ref.name: meta})]
    if meta.chat_template is None:
        findings.append(
            Finding(
                "info",
                "No chat template",
                f"{meta.ref.name} has no chat template, so it can only continue plain text. "
                "For chat, pick an instruct/chat version of the model.",
            )
        )
    placed = {"model": (meta, on)}
    findings += [*_offload(placed), _memory(n_ctx, dtype, placed)]
    return tuple(findings)


# -- the checks ----------------------------------------------------------------------


def _files(models: dict[str, ModelMeta], architectures: bool = True) -> list[Finding]:
    """A folder whose architecture the installed transformers cannot build (hf_support.py), a GGUF
    whose weights have zeroed stretches (gguf_check.py); `models`: role ("" for one model) -> meta."""
    findings = []
    for role, meta in models.items():
        whose = f" ({role})" if role else ""
        if meta.ref.kind == "hf" and architectures and (problem := transformers_problem(meta.ref.path)):
            findings.append(Finding("error", f"transformers cannot load this architecture{whose}", problem))
        if meta.ref.kind == "gguf" and (damage := damage_message(meta.ref.path, meta.ref.name)):
            findings.append(Finding("warning", f"The file looks damaged{whose}", damage))
    return findings


def _vocabulary(t: ModelMeta, d: ModelMeta) -> Finding:
    a, b = t.vocab, d.vocab
    n = min(len(a), len(b))
    if a[:n] != b[:n]:
        first = next(i for i in range(n) if a[i] != b[i])
        n_diff = sum(x != y for x, y in zip(a, b))
        return Finding(
            "error",
            "Different vocabularies",
            f"Token {first} is {a[first]!r} in the target but {b[first]!r} in the draft "
            f"({n_diff} of the first {n} ids differ; the target has {len(a)} tokens, the draft {len(b)}). "
            "The draft must use the target's tokenizer, so these models cannot be used together; "
            "pick a draft from the same family as the target.",
        )
    if len(a) != len(b):
        longer, shorter = ("target", "draft") if len(a) > len(b) else ("draft", "target")
        consequence = (
            "the draft can never propose the target's extra tokens"
            if longer == "target"
            else "the target rejects any extra token the draft proposes"
        )
        return Finding(
            "warning",
            "Vocabulary sizes differ",
            f"The target has {len(a)} tokens and the draft {len(b)}. The first {n} are identical, so the "
            f"{longer} only adds tokens at the end (padding or extra special tokens) and the pair works: "
            f"{consequence}. Output is unchanged; acceptance may be slightly lower.",
        )
    if t.vocab_size != d.vocab_size:
        return Finding(
            "info",
            "Vocabularies match",
            f"Both models use the same {n}-token vocabulary. Their output layers are padded to different "
            f"widths ({t.vocab_size} in the target, {d.vocab_size} in the draft); the padding ids are never "
            "real tokens.",
        )
    return Finding("ok", "Vocabularies match", f"Both models use the same {n}-token vocabulary.")


def _special_tokens(t: ModelMeta, d: ModelMeta) -> Finding:
    # A special token is the same in both models when it has the same id *and* that id has the
    # same text in each vocabulary: equal ids alone would call '<s>' the draft's '<|im_start|>'.
    same_bos = (t.bos_id, _text(t, t.bos_id)) == (d.bos_id, _text(d, d.bos_id))
    same_eos = {(i, _text(t, i)) for i in t.eos_ids} == {(i, _text(d, i)) for i in d.eos_ids}
    specials = {_text(t, t.bos_id), *(_text(t, i) for i in t.eos_ids)}
    markers = [m for m in _template_markers(t) if m not in specials]  # the others a template writes
    moved = [m for m in markers if _token_id(d, m) != _token_id(t, m)]
    if same_bos and same_eos and not moved:
        shared = f"; the chat template's {_quoted(markers)} are the same tokens in both" if markers else ""
        return Finding("ok", "Special tokens match", f"Both use {_specials(t)}{shared}.")
    details = []
    if not (same_bos and same_eos):
        details.append(f"The target uses {_specials(t)}; the draft uses {_specials(d)}.")
    for marker in moved:
        i, j = _token_id(t, marker), _token_id(d, marker)
        where = f"token {j} in the draft" if j is not None else "not a token of the draft"
        details.append(
            f"The target's chat template writes {marker!r}, token {i} in the target but {where}"
            + (f" (the draft's token {i} is {_text(d, i)!r})." if _text(d, i) is not None else ".")
        )
    return Finding(
        "warning",
        "Special tokens differ",
        " ".join(details) + " Replies start and end the target's way; a draft that expects other markers "
        "guesses worse, so acceptance may be lower. Usually this means the two were converted differently "
        "or come from different families.",
    )


def _chat_templates(t: ModelMeta, d: ModelMeta) -> Finding:
    if t.chat_template is None and d.chat_template is None:
        return Finding(
            "info",
            "No chat templates",
            "Neither model has a chat template: use plain text completion, or pick instruct/chat versions.",
        )
    if t.chat_template is None:
        return Finding(
            "warning",
            "The target has no chat template",
            "Chat prompts cannot be formatted for the target. Use plain text completion, or pick an "
            "instruct/chat version of the target.",
        )
    if d.chat_template is None:
        return Finding(
            "info",
            "The draft has no chat template",
            "That is fine: prompts are formatted with the target's template and the draft reads the same "
            "tokens. A base (non-chat) draft may agree less often with a chat target.",
        )
    if t.chat_template != d.chat_template:
        return Finding(
            "info",
            "Chat templates differ",
            "Prompts are formatted with the target's template and the draft reads the same tokens. If the "
            "draft was tuned on another chat format, acceptance may be lower.",
        )
    return Finding("ok", "Chat templates match", "Both models format chats the same way.")


def _size_ratio(t: ModelMeta, d: ModelMeta) -> Finding:
    ratio = t.n_params / max(d.n_params, 1)
    sizes = (
        f"The target has {format_params(t.n_params)} parameters and the draft {format_params(d.n_params)} "
        f"({ratio:.1f}:1; the draft reads {format_bytes(d.weight_bytes)} of weights per token, the target "
        f"{format_bytes(t.weight_bytes)})."
    )
    guidance = f"The useful range is about {RATIO_MIN}:1 to {RATIO_MAX}:1."
    if d.n_params >= t.n_params:
        return Finding(
            "warning",
            "The draft is not smaller than the target",
            f"{sizes} A draft only speeds things up when it is much cheaper than the target. {guidance} "
            "Pick a smaller model of the same family as the draft.",
        )
    if ratio < RATIO_MIN:
        return Finding(
            "warning",
            "The draft is large for this target",
            f"{sizes} {guidance} Below {RATIO_MIN}:1 the draft's own cost eats most of the speedup; "
            "a smaller draft of the same family would likely be faster.",
        )
    if ratio > RATIO_MAX:
        return Finding(
            "warning",
            "The draft is very small for this target",
            f"{sizes} {guidance} Above {RATIO_MAX}:1 the draft agrees with the target too rarely and "
            "acceptance collapses; a larger draft of the same family would likely be faster.",
        )
    return Finding("ok", "Size ratio in the useful range", f"{sizes} {guidance}")


def _context(n_ctx: int, models: dict[str, ModelMeta]) -> Finding:
    trained = [(role, m.context_length) for role, m in models.items() if m.context_length]
    too_long = [(name, ctx) for name, ctx in trained if n_ctx > ctx]
    if too_long:
        names = ", ".join(f"{name} ({ctx} tokens)" for name, ctx in too_long)
        return Finding(
            "warning",
            "Context longer than trained",
            f"A context of {n_ctx} tokens is more than {names} was trained for; quality drops beyond that. "
            f"Use a context of at most {min(ctx for _, ctx in too_long)} tokens.",
        )
    if not trained:
        return Finding("info", "Context length unknown", "The model files do not say what context was trained.")
    known = ", ".join(f"{name}: {ctx}" for name, ctx in trained)
    return Finding("ok", "Context fits", f"A context of {n_ctx} tokens is within what was trained ({known}).")


def _offload(models: dict[str, tuple[ModelMeta, Placement]]) -> list[Finding]:
    """What llama.cpp's GPU layers chose for each model on it (none for PyTorch models)."""
    said = [f"{role}: {on.said}" if len(models) > 1 else on.said for role, (_, on) in models.items() if on.said]
    if not said:
        return []
    text = "; ".join(said)
    return [Finding("info", "Layers on the GPU (llama.cpp)", f"{text[:1].upper()}{text[1:]}.")]


def _memory(n_ctx: int, dtype: str | None, models: dict[str, tuple[ModelMeta, Placement]]) -> Finding:
    """Does each model fit where it will sit: a GPU's free memory for what goes there, system RAM
    for the rest (a llama.cpp model with some layers offloaded is split by its share of layers)."""
    pools: dict[str, list] = {}  # device -> [bytes, parts]
    for role, (meta, on) in models.items():
        weights, kv = estimate_memory(meta, n_ctx, dtype)
        share = 1.0 if not on.on_gpu or on.layers is None else min(on.layers / max(meta.n_layers, 1), 1.0)
        for device, part in ((on.device, share), ("cpu", 1.0 - share)) if on.on_gpu else (("cpu", 1.0),):
            if part <= 0:
                continue
            pool = pools.setdefault(device, [0, []])
            pool[0] += round((weights + kv) * part)
            pool[1].append(
                f"{role} {format_bytes(round(weights * part))} of weights + "
                f"{format_bytes(round(kv * part))} of KV cache"
            )
    gpu = any(device != "cpu" for device in pools)
    verdicts = [_fits(device, needed, parts, n_ctx, gpu) for device, (needed, parts) in pools.items()]
    rank = {"warning": 0, "info": 1, "ok": 2}
    severity = min((v[0] for v in verdicts), key=rank.__getitem__)
    titles = {"warning": "May not fit in memory", "info": "Memory needed", "ok": "Fits in memory"}
    title = titles[severity] + (" (GPU and system RAM)" if gpu and "cpu" in pools else " (GPU)" if gpu else "")
    return Finding(severity, title, " ".join(v[1] for v in verdicts))


def _fits(device: str, needed: int, parts: list[str], n_ctx: int, gpu: bool) -> tuple[str, str]:
    """(severity, sentences) for `needed` bytes on one device (`gpu`: some of the models go on a GPU)."""
    where = f" on {device}" if device != "cpu" else " in system RAM" if gpu else ""
    needs = f"Needs about {format_bytes(needed)}{where} ({'; '.join(parts)}, at {n_ctx} tokens of context)."
    if device == "cpu":
        available = available_memory_bytes()
        if available is None:
            return "info", f"{needs} Could not read how much memory is free."
        if needed > MEMORY_FRACTION * available:
            return "warning", (
                f"{needs} That is more than {MEMORY_FRACTION:.0%} of the {format_bytes(available)} "
                "free now. Close other programs, use a shorter context, or pick more quantized "
                "models."
            )
        return "ok", f"{needs} {format_bytes(available)} is free."
    memory = device_memory(device)
    if memory is None:
        return "info", f"{needs} Could not read how much memory {device} has free."
    free, total = memory
    if needed > MEMORY_FRACTION * free:
        return "warning", (
            f"{needs} That is more than {MEMORY_FRACTION:.0%} of the {format_bytes(free)} of "
            f"{format_bytes(total)} free on {device}. Free the GPU (other programs, another model), "
            "use a shorter context, pick more quantized models, or put fewer layers on the GPU."
        )
    return "ok", f"{needs} {format_bytes(free)} of {format_bytes(total)} is free on {device}."


# -- estimates and helpers ---------------------------------------------------------------


def estimate_memory(meta: ModelMeta, n_ctx: int, dtype: str | None = None) -> tuple[int, int]:
    """(weights, KV cache) bytes of a loaded model holding n_ctx tokens.

    GGUF models run on llama.cpp: weights stay as stored, the KV cache is float16.
    HF models hold weights and cache in `dtype` (None: the dtype they are stored in). Int8
    weights ("int8", or a loaded model's "int8 (weights) / float32") take a byte per weight
    and keep the cache in the compute dtype (the stored one when not said).
    """
    weight_format, compute = _split_dtype(dtype)
    if meta.ref.kind == "gguf":
        weights, kv_elem = meta.weight_bytes, GGUF_KV_BYTES
    elif weight_format is not None:
        kv_elem = _DTYPE_BYTES[normalize_dtype(compute)] if compute else _DTYPE_BYTES.get(meta.dtype, 2)
        weights = meta.n_params * _WEIGHT_BYTES[weight_format]
    elif dtype is not None:
        kv_elem = _DTYPE_BYTES[normalize_dtype(dtype)]
        weights = meta.n_params * kv_elem
    else:
        weights, kv_elem = meta.weight_bytes, _DTYPE_BYTES.get(meta.dtype, 2)
    layers = meta.n_layers if meta.kv_layers is None else meta.kv_layers  # a hybrid's recurrent layers keep none
    kv = 2 * layers * meta.n_kv_heads * meta.head_dim * n_ctx * kv_elem  # keys and values
    return weights, kv


def _split_dtype(dtype: str | None) -> tuple[str | None, str | None]:
    """(weight format, compute dtype) of "int8" / "int8 (weights) / float32"; (None, dtype) otherwise."""
    if dtype is None:
        return None, None
    head, _, compute = dtype.partition("/")
    name = head.replace("(weights)", "").strip().lower()
    if name in _WEIGHT_BYTES:
        return name, compute.strip() or None
    return None, dtype


def normalize_dtype(dtype: str) -> str:
    name = _DTYPE_ALIASES.get(dtype.lower().removeprefix("torch."), dtype.lower().removeprefix("torch."))
    if name not in _DTYPE_BYTES:
        raise ConfigError(f"Unknown dtype '{dtype}'. Use float32, bfloat16 or float16.")
    return name


def available_memory_bytes() -> int | None:
    """Memory the OS can give us now without swapping, or None if it cannot be read."""
    try:
        with open("/proc/meminfo") as f:  # Linux: MemAvailable counts reclaimable cache too
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # macOS and Windows, when installed

        return int(psutil.virtual_memory().available)
    except Exception:  # missing, or failing on an unusual system: fall through
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_memory(device: str) -> tuple[int, int] | None:
    """(free, total) bytes of a GPU ("cuda", "cuda:1", "mps"), or None if they cannot be read.
    CUDA: the driver's numbers (torch.cuda.mem_get_info); MPS: what Metal recommends as the
    working set, less what torch holds now. Imports torch."""
    try:
        import torch

        if device.startswith("cuda"):
            if not torch.cuda.is_available():
                return None
            free, total = torch.cuda.mem_get_info(torch.device(device))
            return int(free), int(total)
        mps = getattr(torch, "mps", None)
        recommended = getattr(mps, "recommended_max_memory", None)
        allocated = getattr(mps, "current_allocated_memory", None)
        if device == "mps" and recommended is not None and allocated is not None:
            total = int(recommended())
            return max(total - int(allocated()), 0), total
    except Exception:  # no torch, no driver, an unusual system: the finding says it could not read
        pass
    return None


def describe(meta: ModelMeta) -> str:
    """One line about a model: 'name (llama, 135M parameters, Q4_1 GGUF, 30 layers, context 8192)'."""
    fmt = "GGUF" if meta.ref.kind == "gguf" else "Hugging Face"
    ctx = f"context {meta.context_length}" if meta.context_length else "context unknown"
    return (
        f"{meta.ref.name} ({meta.architecture}, {format_params(meta.n_params)} parameters, {meta.dtype} {fmt}, "
        f"{meta.n_layers} layers, {ctx}, {len(meta.vocab)} tokens)"
    )


def format_finding(f: Finding, width: int = 100) -> str:
    head = f"  [{f.severity}]".ljust(12) + f.title
    body = textwrap.fill(f.detail, width, initial_indent=" " * 12, subsequent_indent=" " * 12)
    return f"{head}\n{body}"


def format_params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


def format_bytes(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _text(meta: ModelMeta, i: int | None) -> str | None:
    """The vocabulary entry of id i in this model, None for no id or one outside the vocabulary."""
    return meta.vocab[i] if i is not None and 0 <= i < len(meta.vocab) else None


def _token_id(meta: ModelMeta, text: str) -> int | None:
    try:
        return meta.vocab.index(text)
    except ValueError:
        return None


# Turn markers as chat templates write them: <|im_start|>, <|eot_id|>, <start_of_turn>, [INST].
_MARKER = re.compile(r"<\|[^|\s]+\|>|<[A-Za-z_][\w/]*>|\[/?[A-Z_]+\]")


def _template_markers(meta: ModelMeta) -> list[str]:
    """The special-looking strings of the chat template that are whole tokens of the model."""
    found = dict.fromkeys(_MARKER.findall(meta.chat_template or ""))
    return [m for m in found if _token_id(meta, m) is not None]


def _quoted(texts: list[str]) -> str:
    return ", ".join(repr(t) for t in texts)


def _specials(meta: ModelMeta) -> str:
    def token(i: int | None) -> str:
        text = meta.vocab[i] if i is not None and 0 <= i < len(meta.vocab) else "?"
        return "none" if i is None else f"{i} {text!r}"

    eos = ", ".join(token(i) for i in meta.eos_ids) or "none"
    return f"BOS {token(meta.bos_id)} and EOS {eos}"


def _meta(model: str | ModelRef | ModelMeta) -> ModelMeta:
    if isinstance(model, ModelMeta):
        return model
    return read_metadata(model if isinstance(model, ModelRef) else resolve(str(model)))


def _check_n_ctx(n_ctx: int) -> None:
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise ConfigError(f"The context length must be a positive number of tokens, not {n_ctx!r}.")
