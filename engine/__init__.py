"""SpecDeck's decoding engine: lossless speculative decoding on local models.

No Qt here: the desktop app (`app/`), the command line (`engine.cli.main`) and the
tests all drive the same Python API:

    from engine import Engine, EngineConfig, SamplingConfig
    engine = Engine.load(EngineConfig(target="default", drafter="ngram"))
    prompt = engine.prompt_ids("Summarize: ...")
    for step in engine.stream(prompt, SamplingConfig(max_tokens=128)):
        print(step.text, end="")

What this module exports is the engine's public API: `app/` imports from `engine` only
(tests/test_boundary.py). Everything is imported on first use, so `import engine` loads
no torch (the CLI's `models` and `doctor` start fast, the app reads the drafter registry
and the config on its GUI thread); names from modules that load torch load it when used.
"""

from engine.cli.interrupt import exit_quietly_in_program as _exit_quietly_in_program

_exit_quietly_in_program()  # specdeck-cli: Ctrl+C exits quietly from here on, even inside the imports below

from importlib import import_module  # noqa: E402

from engine.errors import (  # noqa: E402, F401 (the public API's errors)
    ConfigError,
    ContextOverflowError,
    IncompatiblePairError,
    ModelLoadError,
    ModelNotFoundError,
    OutOfMemoryError,
    SpecDeckError,
)
from engine.lazy import function_over_module  # noqa: E402

# name -> (module under engine, attribute there; None = the same name)
_LAZY = {
    # the configuration and the drafter registry (light)
    "EngineConfig": ("config", None),
    "CONFIG_VERSION": ("config", None),
    "BACKENDS": ("config", None),
    "DEVICES": ("config", None),
    "DTYPES": ("config", None),
    "COMPILES": ("config", None),
    "target_backend": ("config", None),
    "config_from_legacy": ("config", "from_legacy"),
    "options_from_dict": ("config", None),
    "DrafterSpec": ("drafters.spec", None),
    "DrafterStats": ("drafters.options", None),
    "Setting": ("drafters.options", None),
    "Stat": ("drafters.options", None),
    "all_drafters": ("drafters.registry", None),
    "drafter_spec": ("drafters.registry", None),
    "drafter_names": ("drafters.registry", None),
    "option_settings": ("drafters.registry", None),
    "stat_fields": ("drafters.options", None),
    "stats_owner": ("drafters.registry", None),
    "stats_specs": ("drafters.registry", None),
    "suggested_chains": ("drafters.registry", None),
    "is_drafter": ("drafters.registry", None),
    # checking before loading (light)
    "Preflight": ("preflight", None),
    "Finding": ("models.doctor", None),
    "PairReport": ("models.doctor", None),
    "check_pair": ("models.doctor", None),
    "check_model": ("models.doctor", None),
    "format_finding": ("models.doctor", None),
    "format_bytes": ("models.doctor", None),
    "ModelRef": ("models.locate", None),
    "resolve": ("models.locate", None),
    "list_models": ("models.locate", None),
    "read_metadata": ("models.metadata", None),
    "ModelMeta": ("models.metadata", None),
    "discover_drafters": ("models.discovery", "discover"),
    "Discovery": ("models.discovery_records", None),
    "DrafterCandidate": ("models.discovery_records", "Candidate"),
    "measure_drafters": ("bench.discovery_measure", "measure"),
    "recommended_sampling": ("models.recommended", None),
    "describe_recommended": ("models.recommended", "describe"),
    # the engine and what it reports
    "Engine": ("api", None),
    "Comparison": ("core.events", None),
    "collect": ("core.events", None),
    "load_summary": ("api", None),
    "ModelInfo": ("backends.info", None),
    "SamplingConfig": ("core.sampling_config", None),
    "Divergence": ("core.events", None),
    "GenerationResult": ("core.events", None),
    "RunStats": ("core.events", None),
    "Source": ("core.events", None),
    "StepEvent": ("core.events", None),
    "TokenInfo": ("core.events", None),
    "CostModel": ("core.draft_length", None),
    "CostSnapshot": ("core.costs", None),
    "K_LIMIT": ("core.draft_length", None),
    "break_even_acceptance": ("core.costs", None),
    "expected_tokens": ("core.costs", None),
    # the engine as a service: its client, and the private engine process the app starts (light)
    "EngineClient": ("service.client", None),
    "EngineUnavailable": ("service.client", None),
    "Batches": ("service.batches", None),
    "BATCH_S": ("service.batches", None),
    "CPU_BATCH_S": ("service.batches", None),
    "decodes_on_cpu": ("service.batches", None),
    # other servers: llama-server, vLLM, SGLang (light)
    "open_remote": ("remote", None),
    "detect_kind": ("remote", None),
    "RemoteEngine": ("remote", None),
    "RemotePair": ("remote", None),
    "REMOTE_KINDS": ("remote", "KINDS"),
    "ServerUnavailable": ("remote.http", None),
    "ServerRefused": ("remote.http", None),
    "LoadedPair": ("service.client", None),
    "EngineProcess": ("service.process", None),
    # trained heads and training
    "read_medusa_config": ("heads.medusa", "read_config"),
    "read_eagle_config": ("heads.eagle", "read_config"),
    "default_heads_dir": ("models.shipped", None),
    "describe_heads": ("drafters.heads_loading", None),
    "heads_config_kind": ("heads.kinds", None),
    "train_heads": ("training.medusa", None),
    "checkpoint_info": ("training.checkpoint", None),  # load torch
    "load_checkpoint_state": ("training.checkpoint", "load_state"),  # loads torch
    "TrainSettings": ("training.records", None),
    "TrainProgress": ("training.records", None),
    "TrainResult": ("training.records", None),
    "CheckpointInfo": ("training.records", None),
    # benchmarks (light, but for run_autotune and run_benchmark, which load torch)
    "AutotuneResult": ("bench.autotune_results", None),
    "AutotuneSettings": ("bench.autotune_results", None),
    "Candidate": ("bench.autotune_results", None),
    "format_autotune": ("bench.autotune_results", None),
    "BenchmarkCancelled": ("bench.results", None),
    "BenchReport": ("bench.results", None),
    "BenchSettings": ("bench.results", None),
    "EFFICIENCY_LIMIT": ("bench.results", None),
    "SPECULATIVE": ("bench.results", None),
    "VANILLA": ("bench.results", None),
    "PromptSummary": ("bench.results", None),
    "bench_report_so_far": ("bench.results", "report_so_far"),
    "bench_progress_to_dict": ("bench.results", "progress_to_dict"),
    "bench_progress_from_dict": ("bench.results", "progress_from_dict"),
    "BenchPrompt": ("bench.prompts", None),
    "default_prompts_path": ("bench.prompts", None),
    "load_prompts": ("bench.prompts", None),
    "count_prompts": ("bench.prompts", None),
    "write_json": ("bench.report", None),
    "run_autotune": ("bench.autotune", None),
    "run_benchmark": ("bench.runner", None),
}


# Modules that are part of the public API themselves.
_MODULES = ("figures",)  # the name and the meaning of every figure of a run (light: no torch)


def __getattr__(name: str):
    if name in _MODULES:
        return import_module(f".{name}", __name__)
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(import_module(f".{module}", __name__), attribute or name)
        globals()[name] = value  # once imported, an ordinary attribute
        return value
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


# `engine.preflight` is a module and its function: the package's attribute stays the function, imported
# on first use, even after an `import engine.preflight` anywhere (engine/lazy.py).
function_over_module(__name__, "preflight")


__all__ = sorted(
    [
        "ConfigError",
        "ContextOverflowError",
        "IncompatiblePairError",
        "ModelLoadError",
        "ModelNotFoundError",
        "OutOfMemoryError",
        "SpecDeckError",
        "preflight",
        *_MODULES,
        *_LAZY,
    ]
)
