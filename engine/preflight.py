"""`preflight(config)`: can this EngineConfig load and draft, said before anything loads.

What the CLI, the app's pair dialog and a future engine service all call. It reads model
metadata only (headers and tokenizer files; well under a second) and never raises for a
bad model, path or setting: every problem is an "error" Finding whose detail is the
engine's own message, which says what to do.

The rules: the target (and a draft model) can be found; the pair doctor on them, or the
doctor on the target alone; the load options (engine/models/load_checks.py); llama.cpp
loads GGUF files only and in their own precision; a drafter that needs capabilities only
the PyTorch backend has gets the target there (Backend auto) or is refused (llama.cpp);
then the drafter's own rules (its registry spec's `preflight`: heads that fit the target,
the exit layer's range, lookahead's W, N, G, ...); the draft length. `Engine.load` runs the
same load-option, drafter-option and draft-length checks, raising where this reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SpecDeckError
from engine.models.doctor import Finding, PairReport

DEFAULT_CHECK_CONTEXT = 4096  # what the backends use when the context size is left on the model's default


@dataclass(frozen=True)
class Preflight:
    findings: tuple[Finding, ...]
    report: PairReport | None = None  # the pair doctor's report, when a draft model was checked

    @property
    def compatible(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    def to_dict(self) -> dict:
        """Plain JSON, as the engine server sends it (`from_dict` gives an equal Preflight back)."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "report": None if self.report is None else self.report.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Preflight:
        report = data.get("report")
        return cls(
            tuple(Finding.from_dict(f) for f in data["findings"]),
            None if report is None else PairReport.from_dict(report),
        )


class _Stop(Exception):
    """A finding that ends the check: nothing after it can be said (the model cannot be read)."""

    def __init__(self, *findings: Finding) -> None:
        self.findings = findings


class PreflightContext:
    """What a drafter's preflight rules may read: the config, the resolved target, its metadata
    (read once), where it will run, and helpers that phrase findings as the engine does."""

    def __init__(self, config, target) -> None:
        from engine.config import target_backend

        self.config = config
        self.target = target  # a ModelRef
        self.n_ctx = config.n_ctx or DEFAULT_CHECK_CONTEXT
        self.dtype = None if config.dtype == "auto" else config.dtype
        backend = target_backend(config)
        self.backend = backend  # as asked, "auto" made "torch" for drafters that need it
        self.runs_on = backend if backend != "auto" else ("llama.cpp" if target.kind == "gguf" else "torch")
        self.report: PairReport | None = None
        self._meta = None

    def meta(self):
        """The target's metadata, or an error Finding when it cannot be read."""
        if self._meta is None:
            from engine.models.metadata import read_metadata

            try:
                self._meta = read_metadata(self.target)
            except SpecDeckError as e:
                self._meta = Finding("error", "Cannot read the target", str(e))
        return self._meta

    def shipped_heads(self, kind: str) -> str | None:
        """The heads of `kind` SpecDeck ships for the target, if any (from metadata, not a load)."""
        from engine.backends.base import ModelInfo
        from engine.models.shipped import default_heads_dir

        meta = self.meta()
        if isinstance(meta, Finding):
            return None
        info = ModelInfo(
            name=self.target.name,
            path=self.target.path,
            backend=self.runs_on,
            architecture=meta.architecture,
            n_params=meta.n_params,
            weight_bytes=meta.weight_bytes,
            vocab_size=meta.vocab_size,
            n_layers=meta.n_layers,
            context_length=meta.context_length,
            dtype=meta.dtype,
            device="",
        )
        return default_heads_dir(kind, info)

    @staticmethod
    def placement(ref, backend: str, device: str, gpu_layers):
        """Where the model `ref` will sit when loaded on `backend` with these load options
        (engine/models/placement.py), for the doctor's memory check."""
        from engine.models.placement import model_placement

        return model_placement(ref, backend, device, gpu_layers)

    def target_placement(self):
        return self.placement(self.target, self.runs_on, self.config.device, self.config.gpu_layers)

    @staticmethod
    def native_architectures() -> tuple[str, ...]:
        """The architectures the torch backend's native path runs (the one with every capability),
        so that a drafter's rules need not import a backend."""
        from engine.backends.hf.architectures import SUPPORTED_ARCHITECTURES

        return tuple(SUPPORTED_ARCHITECTURES)

    def resolve(self, role: str, spec: str):
        """The model `spec` names, or a stop with the finding that says why it cannot be used."""
        found = _resolve(role, spec)
        if isinstance(found, Finding):
            raise _Stop(found)
        return found

    @staticmethod
    def stop(*findings: Finding) -> _Stop:
        """`raise ctx.stop(finding)`: the check ends with these findings only."""
        return _Stop(*findings)

    @staticmethod
    def backend_rules(role: str, ref, backend: str, dtype: str | None) -> list[Finding]:
        return backend_rules(role, ref, backend, dtype)


def preflight(config) -> Preflight:
    """Findings for `config` (see the module docstring). Never raises for a bad model or setting."""
    from engine.drafters.registry import drafter_spec

    target = _resolve("target", config.target)
    if isinstance(target, Finding):
        return Preflight((target,))
    try:
        spec = drafter_spec(config.drafter)
        options = config.drafter_options()
    except SpecDeckError as e:
        return Preflight((Finding("error", "Cannot use this drafter", str(e)),))
    try:
        ctx = PreflightContext(config, target)
        findings = _check(ctx, spec, options)
    except _Stop as stop:
        return Preflight(tuple(stop.findings))
    return Preflight(tuple(findings), ctx.report)


def _check(ctx: PreflightContext, spec, options) -> list[Finding]:
    config, target = ctx.config, ctx.target
    findings: list[Finding] = []
    if not spec.loads_model:
        try:
            findings += check_model_findings(target, ctx.n_ctx, ctx.dtype, ctx.target_placement())
        except SpecDeckError as e:  # a bad context size or dtype
            raise _Stop(Finding("error", "Cannot check this model", str(e))) from e
        if spec.needs_torch:
            findings += _torch_findings(spec, target, config.backend)
    if spec.preflight is not None:
        findings += spec.preflight(ctx, options)
    findings += _settings_findings(spec, options)
    findings += backend_rules("target", target, ctx.backend, config.dtype)
    findings += _load_option_findings(config, ctx.backend, findings)
    findings += _draft_length_findings(config)
    return findings


def _draft_length_findings(config) -> list[Finding]:
    """k and k_max as Engine.load checks them (DraftLength)."""
    from engine.core.draft_length import DraftLength

    try:
        DraftLength(config.k, config.k_max)
    except SpecDeckError as e:
        return [Finding("error", "The draft length cannot be used", f"{str(e)[:1].upper()}{str(e)[1:]}")]
    return []


def check_model_findings(target, n_ctx: int, dtype: str | None, on=None) -> tuple[Finding, ...]:
    from engine.models.doctor import check_model
    from engine.models.placement import CPU

    return check_model(target, n_ctx=n_ctx, dtype=dtype, on=on or CPU)


def _torch_findings(spec, target, backend: str) -> list[Finding]:
    """A drafter that needs what only PyTorch has: Backend auto loads the target there, llama.cpp is refused."""
    why = spec.torch_reason or f"{spec.label} needs what only the PyTorch backend offers."
    if backend == "auto" and target.kind == "gguf":
        return [
            Finding(
                "info",
                "The target runs on PyTorch",
                f"{why} So Backend auto loads this GGUF file through transformers, dequantized (it takes longer "
                "to load and runs slower than on llama.cpp).",
            )
        ]
    if backend == "llama.cpp":
        return [
            Finding(
                "error",
                f"{spec.label} needs the PyTorch backend",
                f"{why} Set Backend to torch (or auto): a GGUF file then loads through transformers, dequantized "
                "(it takes longer to load).",
            )
        ]
    return []


def _settings_findings(spec, options) -> list[Finding]:
    """A number outside its setting's range (settings that also take "auto" are the drafter's own rules)."""
    from engine.drafters.registry import option_settings

    findings = []
    for s in option_settings(spec):
        value = getattr(options, s.name)
        if s.auto or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low = s.minimum is not None and value < s.minimum
        high = s.maximum is not None and value > s.maximum
        if low or high:
            bounds = [
                f"at least {s.minimum}" if s.minimum is not None else "",
                f"at most {s.maximum}" if s.maximum is not None else "",
            ]
            findings.append(
                Finding(
                    "error",
                    f"{s.label} is out of range",
                    f"The {spec.label} setting {s.label} must be {' and '.join(b for b in bounds if b)}, got {value}.",
                )
            )
    return findings


def _load_option_findings(config, backend: str, so_far: list[Finding]) -> list[Finding]:
    """The load-option rules Engine.load applies (engine/models/load_checks.py), when no finding
    above is an error already (one of them says the same of a dtype on llama.cpp)."""
    from engine.models.load_checks import check_load_options

    if any(f.severity == "error" for f in so_far):
        return []
    try:
        check_load_options(config, backend)
    except SpecDeckError as e:
        return [Finding("error", "These load options cannot work", str(e))]
    return []


def _resolve(role: str, spec: str):
    from engine.models.locate import resolve

    if not (spec or "").strip():
        return Finding("error", f"No {role} chosen", f"Choose a {role}: pick one from the list or browse for a file.")
    try:
        return resolve(spec.strip())
    except SpecDeckError as e:
        return Finding("error", f"Cannot use the {role}", str(e))


def backend_rules(role: str, ref, backend: str, dtype: str | None) -> list[Finding]:
    """engine.models.loading.load_backend's two ConfigErrors, checked before loading instead of after."""
    runs_on = backend if backend != "auto" else ("llama.cpp" if ref.kind == "gguf" else "torch")
    if runs_on == "llama.cpp" and ref.kind != "gguf":
        return [
            Finding(
                "error",
                f"llama.cpp cannot load this {role}",
                f"{ref.name} is a Hugging Face folder; llama.cpp needs a GGUF file. Choose the torch backend "
                "(or auto), or convert the model to GGUF.",
            )
        ]
    if runs_on == "llama.cpp" and (dtype or "auto") != "auto":
        return [
            Finding(
                "error",
                f"The dtype does not apply to the {role}",
                "The llama.cpp backend runs a GGUF file in the precision it was saved in. Set dtype to auto, "
                "or choose the torch backend to pick a precision.",
            )
        ]
    return []
