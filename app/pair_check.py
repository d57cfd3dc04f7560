"""Checking a `PairChoice` before anything loads: the engine's doctor plus the backend rules.

No Qt here: the dialog runs `check_choice` on a worker thread. It reads model
metadata only (headers and tokenizer files), so it takes well under a second.
It never raises for a bad model or path: every problem becomes an "error"
finding whose detail is the engine's own message, which says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.doctor import Finding, PairReport, check_model, check_pair
from engine.errors import SpecDeckError
from engine.models import ModelRef, resolve

from .presets import PairChoice

DEFAULT_CHECK_CONTEXT = 4096  # what the backends use when the context size is left on "model default"


@dataclass(frozen=True)
class CheckResult:
    findings: tuple[Finding, ...]
    report: PairReport | None = None  # the doctor's report, when a draft model was checked

    @property
    def compatible(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)


def check_choice(choice: PairChoice) -> CheckResult:
    n_ctx = choice.n_ctx or DEFAULT_CHECK_CONTEXT
    dtype = None if choice.dtype == "auto" else choice.dtype
    target = _resolve("target", choice.target)
    if isinstance(target, Finding):
        return CheckResult((target,))
    findings: list[Finding] = []
    report = None
    if choice.drafter == "model":
        draft = _resolve("draft model", choice.draft)
        if isinstance(draft, Finding):
            return CheckResult((draft,))
        try:
            report = check_pair(target, draft, n_ctx=n_ctx, dtype=dtype)
        except SpecDeckError as e:
            return CheckResult((Finding("error", "Cannot check this pair", str(e)),))
        findings += report.findings
        findings += _backend_rules("draft model", draft, choice.draft_backend, choice.dtype)
    else:
        try:
            findings += check_model(target, n_ctx=n_ctx, dtype=dtype)
        except SpecDeckError as e:  # a bad context size or dtype
            return CheckResult((Finding("error", "Cannot check this model", str(e)),))
        if choice.drafter == "medusa":
            findings += _medusa_findings(target, choice)
        elif choice.drafter == "ngram":
            findings.append(Finding(
                "ok", "N-gram lookup needs no draft model",
                "Draft tokens are copied from earlier text in the conversation, so nothing can mismatch. "
                "It helps most when the reply repeats the prompt (code edits, summaries, lists).",
            ))  # fmt: skip
        else:
            findings.append(Finding(
                "info", "No drafter",
                "Every token comes from the target alone: speculative runs are refused, plain decoding works. "
                "Choose n-gram lookup or a draft model to decode speculatively.",
            ))  # fmt: skip
    findings += _backend_rules("target", target, choice.backend, choice.dtype)
    return CheckResult(tuple(findings), report)


def _medusa_findings(target: ModelRef, choice: PairChoice) -> list[Finding]:
    """Medusa reads the target's hidden states (PyTorch only) and needs heads made for its hidden size."""
    from engine.heads.medusa import read_config
    from engine.metadata import read_metadata

    from .heads import describe_heads

    runs_on = choice.backend if choice.backend != "auto" else "torch"  # the engine's auto picks torch for Medusa
    findings = []
    if choice.backend == "auto" and target.kind == "gguf":
        findings.append(Finding(
            "info", "The target runs on PyTorch",
            "Medusa reads the target's hidden states, which llama.cpp does not expose, so Backend auto "
            "loads this GGUF file through transformers, dequantized (it takes longer to load).",
        ))  # fmt: skip
    if runs_on == "llama.cpp":
        findings.append(Finding(
            "error", "Medusa needs the PyTorch backend",
            "Medusa heads read the target's hidden states, which llama.cpp does not expose. Set Backend to "
            "torch: a GGUF file then loads through transformers, dequantized (it takes longer to load).",
        ))  # fmt: skip
    try:
        meta = read_metadata(target)
    except SpecDeckError as e:
        return findings + [Finding("error", "Cannot read the target", str(e))]
    folder = choice.heads.strip() or _shipped_heads(target, meta, runs_on)
    if not folder:
        return findings + [Finding(
            "error", f"No Medusa heads ship for {target.name}",
            "Train heads for this target (Models ▸ Train heads…), or choose a heads folder.",
        )]  # fmt: skip
    try:
        config = read_config(folder)
    except SpecDeckError as e:
        return findings + [Finding("error", "Cannot use these Medusa heads", str(e))]
    if meta.hidden_size and config.hidden_size != meta.hidden_size:
        return findings + [Finding(
            "error", "These heads belong to another model",
            f"They were trained for a hidden size of {config.hidden_size} "
            f"({config.base_model or 'unknown base model'}); {target.name} has {meta.hidden_size}. "
            "Train heads for this target (Models ▸ Train heads…).",
        )]  # fmt: skip
    where = "shipped with SpecDeck" if not choice.heads.strip() else folder
    return findings + [Finding("ok", "Medusa heads fit the target", f"{describe_heads(folder)} ({where}).")]


def _shipped_heads(target: ModelRef, meta, runs_on: str) -> str | None:
    from engine.backends.base import ModelInfo
    from engine.shipped import default_heads_dir

    info = ModelInfo(
        name=target.name, path=target.path, backend=runs_on, architecture=meta.architecture,
        n_params=meta.n_params, weight_bytes=meta.weight_bytes, vocab_size=meta.vocab_size,
        n_layers=meta.n_layers, context_length=meta.context_length, dtype=meta.dtype, device="",
    )  # fmt: skip
    return default_heads_dir("medusa", info)


def _resolve(role: str, spec: str) -> ModelRef | Finding:
    if not spec.strip():
        return Finding("error", f"No {role} chosen", f"Choose a {role}: pick one from the list or browse for a file.")
    try:
        return resolve(spec)
    except SpecDeckError as e:
        return Finding("error", f"Cannot use the {role}", str(e))


def _backend_rules(role: str, ref: ModelRef, backend: str, dtype: str) -> list[Finding]:
    """The loading rules of engine.loading.load_backend, checked before loading instead of after.

    They repeat engine/loading.py's two ConfigErrors; an engine-side
    `check_settings` would let both callers share them.
    """
    runs_on = backend if backend != "auto" else ("llama.cpp" if ref.kind == "gguf" else "torch")
    if runs_on == "llama.cpp" and ref.kind != "gguf":
        return [Finding(
            "error", f"llama.cpp cannot load this {role}",
            f"{ref.name} is a Hugging Face folder; llama.cpp needs a GGUF file. Choose the torch backend "
            "(or auto), or convert the model to GGUF.",
        )]  # fmt: skip
    if runs_on == "llama.cpp" and dtype != "auto":
        return [Finding(
            "error", f"The dtype does not apply to the {role}",
            "The llama.cpp backend runs a GGUF file in the precision it was saved in. Set dtype to auto, "
            "or choose the torch backend to pick a precision.",
        )]  # fmt: skip
    return []
