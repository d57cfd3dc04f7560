"""Checking a `PairChoice` before anything loads: the engine's doctor plus the backend rules.

No Qt here: the dialog runs `check_choice` on a worker thread. It reads model
metadata only (headers and tokenizer files), so it takes well under a second.
It never raises for a bad model or path: every problem becomes an "error"
finding whose detail is the engine's own message, which says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.doctor import Finding, PairReport, check_model, check_pair
from engine.errors import SpecDeckError
from engine.models.locate import ModelRef, resolve

from app.pair.presets import AUTO, TORCH_DRAFTERS, PairChoice

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
        if choice.drafter in TORCH_DRAFTERS:
            findings += _torch_findings(target, choice)
            findings += {"medusa": _medusa_findings, "eagle": _eagle_findings, "lookahead": _lookahead_findings,
                         "early-exit": _early_exit_findings}[choice.drafter](target, choice)  # fmt: skip
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
    backend = choice.backend
    if backend == "auto" and choice.drafter in TORCH_DRAFTERS:
        backend = "torch"  # as engine.api.target_backend: these drafters load the target on PyTorch
    findings += _backend_rules("target", target, backend, choice.dtype)
    return CheckResult(tuple(findings), report)


# What each PyTorch-only drafter needs that llama.cpp lacks: (its name in a title, why).
_TORCH_NEEDS = {
    "medusa": ("Medusa", "Medusa heads read the target's hidden states, which llama.cpp does not expose."),
    "eagle": ("EAGLE", ("An EAGLE head reads the target's hidden states and drafts a tree of candidates; "
                        "llama.cpp exposes neither.")),
    "lookahead": ("Lookahead decoding", ("Lookahead decoding verifies its window and its candidate n-grams in one "
                                         "forward with a custom attention mask, which llama.cpp does not offer "
                                         "here.")),
    "early-exit": ("Early exit", ("Early exit stops the target's forward after its first layers, which llama.cpp "
                                  "cannot do.")),
}  # fmt: skip


def _torch_findings(target: ModelRef, choice: PairChoice) -> list[Finding]:
    """These drafters need the target on PyTorch: Backend auto loads it there, llama.cpp is refused."""
    name, why = _TORCH_NEEDS[choice.drafter]
    if choice.backend == "auto" and target.kind == "gguf":
        return [Finding(
            "info", "The target runs on PyTorch",
            f"{why} So Backend auto loads this GGUF file through transformers, dequantized (it takes longer "
            "to load and runs slower than on llama.cpp).",
        )]  # fmt: skip
    if choice.backend == "llama.cpp":
        return [Finding(
            "error", f"{name} needs the PyTorch backend",
            f"{why} Set Backend to torch (or auto): a GGUF file then loads through transformers, dequantized "
            "(it takes longer to load).",
        )]  # fmt: skip
    return []


def _runs_on(choice: PairChoice) -> str:
    return choice.backend if choice.backend != "auto" else "torch"  # the engine's auto picks torch for these


def _read_meta(target: ModelRef):
    from engine.models.metadata import read_metadata

    try:
        return read_metadata(target)
    except SpecDeckError as e:
        return Finding("error", "Cannot read the target", str(e))


def _medusa_findings(target: ModelRef, choice: PairChoice) -> list[Finding]:
    """Medusa needs heads made for the target's hidden size."""
    from engine.heads.medusa import read_config

    from app.pair.heads import describe_heads

    findings = []
    meta = _read_meta(target)
    if isinstance(meta, Finding):
        return [meta]
    folder = choice.heads.strip() or _shipped_heads("medusa", target, meta, _runs_on(choice))
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


def _eagle_findings(target: ModelRef, choice: PairChoice) -> list[Finding]:
    """EAGLE needs a head made for the target's hidden size and vocabulary, and a tree depth of 1 or more."""
    from engine.heads.eagle import read_config

    from app.pair.heads import describe_heads

    findings = []
    if choice.tree_depth != AUTO and int(choice.tree_depth) < 1:
        findings.append(Finding(
            "error", "The tree depth must be 1 or more",
            f"The EAGLE tree depth is the deepest level drafted; {choice.tree_depth} cannot be used. Leave it on "
            "auto (8 levels) or give a whole number of 1 or more.",
        ))  # fmt: skip
    meta = _read_meta(target)
    if isinstance(meta, Finding):
        return findings + [meta]
    folder = choice.eagle_heads.strip() or _shipped_heads("eagle", target, meta, _runs_on(choice))
    if not folder:
        return findings + [Finding(
            "error", f"No EAGLE head ships for {target.name}",
            "SpecDeck ships an EAGLE head for its built-in model only. Train one for this target "
            "(Models ▸ Train heads…, Kind EAGLE), or choose an EAGLE head folder.",
        )]  # fmt: skip
    try:
        config = read_config(folder)
    except SpecDeckError as e:
        return findings + [Finding("error", "Cannot use this EAGLE head", str(e))]
    mismatch = []
    if meta.hidden_size and config.hidden_size != meta.hidden_size:
        mismatch.append(f"a hidden size of {config.hidden_size} ({target.name} has {meta.hidden_size})")
    if meta.vocab_size and config.vocab_size and config.vocab_size != meta.vocab_size:
        mismatch.append(f"a vocabulary of {config.vocab_size} tokens ({target.name} has {meta.vocab_size})")
    if mismatch:
        return findings + [Finding(
            "error", "This EAGLE head belongs to another model",
            f"It was trained for {config.base_model or 'another model'} with {' and '.join(mismatch)}. "
            "Train a head for this target (Models ▸ Train heads…, Kind EAGLE).",
        )]  # fmt: skip
    where = "shipped with SpecDeck" if not choice.eagle_heads.strip() else folder
    depth = "up to 8 levels (auto)" if choice.tree_depth == AUTO else f"up to {choice.tree_depth} levels"
    return findings + [Finding(
        "ok", "The EAGLE head fits the target",
        f"{describe_heads(folder)} ({where}). Draft trees grow {depth}, where the head is most confident.",
    )]  # fmt: skip


def _lookahead_findings(target: ModelRef, choice: PairChoice) -> list[Finding]:
    """Lookahead needs no model; W, N and G are each auto or within the engine's limits."""
    from engine.drafters.lookahead import check_parameters  # the engine's own rules and messages

    findings = [Finding(
        "ok", "Lookahead decoding needs no draft model",
        "Each step the target also guesses W tokens ahead (the window, refined a little every step), "
        "collects the runs of N tokens those guesses form, and checks up to G of them that continue the text, "
        "all in the same forward pass. auto fits each to how much a wider forward costs on this machine.",
    )]  # fmt: skip
    auto = "auto"
    for letter, values in (("W", (choice.lookahead_window, auto, auto)),
                           ("N", (auto, choice.lookahead_ngram, auto)),
                           ("G", (auto, auto, choice.lookahead_candidates))):  # fmt: skip
        try:
            check_parameters(*values)
        except SpecDeckError as e:
            findings.append(Finding("error", f"Lookahead {letter} is out of range", str(e)))
    return findings


def _early_exit_findings(target: ModelRef, choice: PairChoice) -> list[Finding]:
    """Early exit needs the native PyTorch implementation and an exit below the last layer."""
    from engine.backends.hf.native import SUPPORTED_ARCHITECTURES

    meta = _read_meta(target)
    if isinstance(meta, Finding):
        return [meta]
    findings = []
    arch, n = meta.architecture, int(meta.n_layers or 0)
    if arch and arch != "unknown" and arch not in SUPPORTED_ARCHITECTURES:
        findings.append(Finding(
            "error", "Early exit cannot run this target",
            f"Early exit drafts with the target's own first layers, which needs SpecDeck's native PyTorch "
            f"implementation ({', '.join(SUPPORTED_ARCHITECTURES)} models); {target.name} is a {arch} model. "
            "Choose another drafter.",
        ))  # fmt: skip
    if 0 < n < 2:
        findings.append(Finding(
            "error", "Early exit needs at least 2 layers",
            f"{target.name} has {n} layer: early exit drafts with fewer layers than the target. "
            "Choose another drafter.",
        ))  # fmt: skip
    elif choice.exit_layer != AUTO and (int(choice.exit_layer) < 1 or (n and int(choice.exit_layer) >= n)):
        top = f"from 1 to {n - 1} ({target.name} has {n} layers)" if n else "of 1 or more"
        findings.append(Finding(
            "error", "The exit layer is out of range",
            f"The early-exit layer must be auto or a whole number {top}, got {choice.exit_layer}: the draft runs "
            "that many of the target's layers, then its LM head. Use auto to let the drafter pick it.",
        ))  # fmt: skip
    if "layerskip" in f"{target.name} {target.path}".lower():
        findings.append(Finding(
            "ok", "Trained for early exit",
            "This looks like a LayerSkip model, trained so that its early layers already predict well: "
            "early exit should be accepted often.",
        ))  # fmt: skip
    else:
        findings.append(Finding(
            "warning", "Acceptance is usually low",
            "Ordinary models are not trained to predict from their early layers, so the first layers' guesses "
            "often miss and decoding may be no faster than plain. Models trained for early exit (LayerSkip) "
            "do much better.",
        ))  # fmt: skip
    if not any(f.severity == "error" for f in findings):
        layers = (f"a few exits between 1/4 and 3/4 of the {n} layers, the best by measured acceptance and cost"
                  if choice.exit_layer == AUTO else f"layers 1 to {choice.exit_layer} of {n or 'the'}")  # fmt: skip
        findings.append(Finding("ok", "Early exit drafts with the target itself",
                                f"No draft model and nothing extra in memory: the draft runs {layers}."))
    return findings


def _shipped_heads(kind: str, target: ModelRef, meta, runs_on: str) -> str | None:
    from engine.backends.base import ModelInfo
    from engine.models.shipped import default_heads_dir

    info = ModelInfo(
        name=target.name, path=target.path, backend=runs_on, architecture=meta.architecture,
        n_params=meta.n_params, weight_bytes=meta.weight_bytes, vocab_size=meta.vocab_size,
        n_layers=meta.n_layers, context_length=meta.context_length, dtype=meta.dtype, device="",
    )  # fmt: skip
    return default_heads_dir(kind, info)


def _resolve(role: str, spec: str) -> ModelRef | Finding:
    if not spec.strip():
        return Finding("error", f"No {role} chosen", f"Choose a {role}: pick one from the list or browse for a file.")
    try:
        return resolve(spec)
    except SpecDeckError as e:
        return Finding("error", f"Cannot use the {role}", str(e))


def _backend_rules(role: str, ref: ModelRef, backend: str, dtype: str) -> list[Finding]:
    """The loading rules of engine.models.loading.load_backend, checked before loading instead of after.

    They repeat engine/models/loading.py's two ConfigErrors; an engine-side
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
