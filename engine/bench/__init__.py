"""`specdeck-cli bench`: vanilla against speculative decoding on a set of prompts.

    from engine.bench import BenchSettings, load_prompts, default_prompts_path, run_benchmark, format_text
    report = run_benchmark(EngineConfig(drafter="ngram"), load_prompts(default_prompts_path()), BenchSettings())
    print(format_text(report))

Modules: `prompts` (the JSONL prompt files), `runner` (our engine, both modes,
warm-up and repeats), `peers` (llama-cpp-python and transformers on the same
model), `system` (copy bandwidth, the bandwidth floor, peak memory), `results`
(frozen result records, the settings and the aggregation math), `report` (text
and JSON), `autotune` (the fastest drafter and draft length for a target on
these prompts) and `autotune_results` (its records). The load test, B requests
in flight at once (`specdeck-cli bench --concurrency`): `load_sweep` (the runs),
`load_contexts` (the context axis), `load_predict` (prediction, break-evens,
memory, the failure-mode sentence), `load_settings`, `load_results` (the
records the app's Load view draws) and `load_report` (the text). Like the rest of `engine`,
nothing here imports Qt.

The records (`results`, `autotune_results`, `prompts`, `report`) load no torch,
so a client of the engine server can hold and draw them; every record has
`to_dict` / `from_dict` (JSON-ready, and back to an equal record). Names are
imported on first use, so importing one of them, or `engine.bench.results`,
does not load the runner (torch).
"""

from engine.lazy import lazy_getattr

# name -> the module under engine.bench that defines it
_LAZY = {
    "AutotuneResult": "autotune_results",
    "AutotuneSettings": "autotune_results",
    "Candidate": "autotune_results",
    "CandidateResult": "autotune_results",
    "format_autotune": "autotune_results",
    "BenchPrompt": "prompts",
    "PromptFileError": "prompts",
    "count_prompts": "prompts",
    "default_prompts_path": "prompts",
    "load_prompts": "prompts",
    "parse_prompts": "prompts",
    "LoadSettings": "load_settings",
    "LoadSweep": "load_results",
    "LoadPoint": "load_results",
    "format_load": "load_report",
    "run_load_sweep": "load_sweep",  # loads torch
    "format_text": "report",
    "to_json": "report",
    "write_json": "report",
    "BenchmarkCancelled": "results",
    "BenchReport": "results",
    "BenchSettings": "results",
    "GroupSummary": "results",
    "PeerResult": "results",
    "PromptSummary": "results",
    "RunRecord": "results",
    "progress_to_dict": "results",
    "progress_from_dict": "results",
    "run_autotune": "autotune",  # loads torch
    "run_benchmark": "runner",  # loads torch
}


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = sorted(_LAZY)
