"""`specdeck-cli bench`: vanilla against speculative decoding on a set of prompts.

    from engine.bench import BenchSettings, load_prompts, default_prompts_path, run_benchmark, format_text
    report = run_benchmark(EngineConfig(drafter="ngram"), load_prompts(default_prompts_path()), BenchSettings())
    print(format_text(report))

Modules: `prompts` (the JSONL prompt files), `runner` (our engine, both modes,
warm-up and repeats), `peers` (llama-cpp-python and transformers on the same
model), `system` (copy bandwidth, the bandwidth floor, peak memory), `results`
(frozen result records and the aggregation math), `report` (text and JSON),
`autotune` (the fastest drafter and draft length for a target on these prompts).
Like the rest of `engine`, nothing here imports Qt.
"""

from engine.bench.autotune import AutotuneResult, AutotuneSettings, Candidate, format_autotune, run_autotune
from engine.bench.prompts import BenchPrompt, PromptFileError, default_prompts_path, load_prompts, parse_prompts
from engine.bench.report import format_text, to_json, write_json
from engine.bench.results import BenchmarkCancelled, BenchReport, GroupSummary, PeerResult, PromptSummary, RunRecord
from engine.bench.runner import BenchSettings, run_benchmark

__all__ = [
    "AutotuneResult",
    "AutotuneSettings",
    "Candidate",
    "BenchPrompt",
    "BenchReport",
    "BenchSettings",
    "BenchmarkCancelled",
    "GroupSummary",
    "PeerResult",
    "PromptFileError",
    "PromptSummary",
    "RunRecord",
    "default_prompts_path",
    "format_autotune",
    "format_text",
    "load_prompts",
    "parse_prompts",
    "run_autotune",
    "run_benchmark",
    "to_json",
    "write_json",
]
