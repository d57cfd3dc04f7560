"""Auto-tune: candidates from what the target allows, ranked by measured speedup, on one loaded target."""

from __future__ import annotations

import dataclasses
import json
import threading
from types import SimpleNamespace

import pytest

from engine import EngineConfig, SamplingConfig
from engine.api import Engine
from engine.backends.capabilities import HiddenFeatures, LayerExit, LayerFeatures, ModelParts, TreeForward
from engine.bench import AutotuneSettings, BenchmarkCancelled, Candidate, format_autotune, run_autotune
from engine.bench.autotune import PLAIN, allowed_drafters, candidates_for, config_for
from engine.bench.prompts import BenchPrompt
from engine.cli.main import main

# One llama.cpp thread: on a busy 2-core machine two threads spin waiting for each other.
CONFIG = EngineConfig(measure_costs=False, threads=1)
SHORT = AutotuneSettings(max_tokens=48)
# Replies that copy their input: n-gram lookup drafts them almost whole, so it must beat plain decoding.
COPY_PROMPTS = (
    BenchPrompt(
        "copy-river",
        "reuse",
        (
            {
                "role": "user",
                "content": (
                    "Copy this paragraph exactly, word for word: The river runs past the old mill, under the stone "
                    "bridge, and into the quiet valley where the farmers keep their sheep."
                ),
            },
        ),
    ),
    BenchPrompt(
        "copy-fruit",
        "reuse",
        (
            {
                "role": "user",
                "content": (
                    "Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, oranges, melons, figs."
                ),
            },
        ),
    ),
)
NGRAM = (Candidate("ngram", 2), Candidate("ngram", 8))


def target(backend: str, name: str = "SmolLM2-135M-Instruct", capabilities=None):
    """A loaded target as auto-tune reads it: its info and capabilities (PyTorch's native path: all)."""
    info = SimpleNamespace(
        name=name, path=f"/models/{name}", backend=backend, architecture="llama", vocab_size=49152, n_layers=30
    )
    every = frozenset({TreeForward, HiddenFeatures, LayerFeatures, LayerExit, ModelParts})
    return SimpleNamespace(
        info=info, capabilities=every if capabilities is None and backend == "torch" else (capabilities or frozenset())
    )


def test_a_llama_cpp_target_allows_ngram_suffix_decoding_and_a_loaded_draft_model_and_their_chain():
    assert allowed_drafters(CONFIG, target("llama.cpp")) == ("ngram", "suffix")
    with_draft = CONFIG.with_drafter("model", draft="draft.gguf")
    # Suffix decoding needs nothing; the chain of it and the draft model is tried too (README: every drafter).
    assert allowed_drafters(with_draft, target("llama.cpp")) == ("ngram", "suffix", "model", "suffix+model")
    # A loaded chain is tried as it is; its draft model alone is not (auto-tune never loads a second model).
    chain = CONFIG.with_drafter("ngram+model", draft="draft.gguf")
    assert allowed_drafters(chain, target("llama.cpp")) == ("ngram", "suffix", "ngram+model")


def test_a_torch_target_also_allows_its_own_drafters_and_heads_where_they_exist():
    # The embedded model ships Medusa and EAGLE heads; another model has none unless given.
    assert allowed_drafters(CONFIG, target("torch")) == (
        "ngram",
        "suffix",
        "medusa",
        "eagle",
        "lookahead",
        "early-exit",
        "suffix+eagle",
        "suffix+medusa",
    )
    other = target("torch", "Qwen2-0.5B")
    other.info.n_layers = 24  # another model: no heads ship for it
    assert allowed_drafters(CONFIG, other) == ("ngram", "suffix", "lookahead", "early-exit")
    given = CONFIG.with_drafter("medusa", heads="/my/heads")
    assert allowed_drafters(given, other) == ("ngram", "suffix", "medusa", "lookahead", "early-exit", "suffix+medusa")
    # transformers' own forward (no native path) reads hidden states but verifies no trees and cannot exit early.
    plain_hf = target("torch", capabilities=frozenset({HiddenFeatures, ModelParts}))
    assert allowed_drafters(CONFIG, plain_hf) == ("ngram", "suffix", "medusa", "suffix+medusa")


def test_a_model_with_its_own_mtp_layers_has_them_tuned(tmp_path, monkeypatch):
    import engine.heads.mtp as mtp

    folder = tmp_path / "DeepSeek-V3-tiny"
    folder.mkdir()
    monkeypatch.setattr(mtp, "read_model_config", lambda path: {})
    monkeypatch.setattr(mtp, "find_mtp", lambda path, config: SimpleNamespace(n_layers=1))
    with_mtp = target("torch", "DeepSeek-V3-tiny")
    with_mtp.info.path = str(folder)
    assert "mtp" in allowed_drafters(CONFIG, with_mtp)
    assert "mtp" not in allowed_drafters(CONFIG, target("torch", "Qwen2-0.5B"))  # no folder, no MTP layers


def test_tree_drafters_are_tried_with_node_budgets_and_chains_with_draft_lengths():
    found = candidates_for(("ngram", "medusa", "suffix"), "torch")
    assert [c.k for c in found if c.drafter == "ngram"] == ["auto", 2, 4, 8]
    assert [c.k for c in found if c.drafter == "medusa"] == ["auto", 8, 16]
    assert [c.label for c in found if c.drafter == "suffix"] == [
        "suffix, node budget auto",
        "suffix, node budget 8",
        "suffix, node budget 16",
    ]
    # llama.cpp verifies whole trees too (sequence ids): there suffix decoding's k is a node budget as well.
    assert [c.label for c in candidates_for(("suffix",), "llama.cpp")][1] == "suffix, node budget 8"
    # A chain sizes its drafts itself: one candidate each, so the chains add a pass over the prompts each.
    assert [c.label for c in candidates_for(("suffix+model",), "llama.cpp")] == ["suffix+model, node budget auto"]
    assert [c.label for c in candidates_for(("suffix+eagle",), "torch")] == ["suffix+eagle, node budget auto"]


def test_a_candidates_config_keeps_the_loaded_target_and_its_backend():
    medusa_on_gguf = CONFIG.with_drafter("medusa", heads="/my/heads")
    chosen = config_for(medusa_on_gguf, Candidate("ngram", 4), "torch")
    # "auto" would load the GGUF on llama.cpp for n-gram: the speed measured was PyTorch's.
    assert (chosen.drafter, chosen.k, chosen.backend, chosen.heads) == ("ngram", 4, "torch", None)
    with_draft = CONFIG.with_drafter("model", draft="draft.gguf")
    assert config_for(with_draft, Candidate("ngram", 2), "llama.cpp").draft is None
    assert config_for(with_draft, Candidate("model", 8), "llama.cpp").draft == "draft.gguf"


def test_ngram_drafts_copies_whole_and_the_ranking_is_by_measured_speedup():
    # Which candidate is fastest is timed on a shared 2-core machine, so it is the benchmark's to
    # say (docs/benchmarks.md); what holds in every run is asserted: the ranking follows the
    # measured speedups, plain decoding is their unit, greedy output is lossless, and n-gram lookup
    # drafts a copied paragraph nearly whole (several tokens per target forward, not timed).
    progress = []
    result = run_autotune(
        CONFIG, COPY_PROMPTS, SHORT, candidates=NGRAM, progress=lambda message, fraction: progress.append(fraction)
    )

    speedups = [r.speedup for r in result.ranked]
    assert speedups == sorted(speedups, reverse=True)
    assert {r.candidate for r in result.ranked} == {*NGRAM, PLAIN}
    assert next(r for r in result.ranked if r.candidate == PLAIN).speedup == 1.0
    assert all(r.identical == 2 for r in result.ranked)  # greedy speculative decoding is lossless
    assert all(r.tokens_per_forward > 2.0 for r in result.ranked if r.candidate != PLAIN)
    assert result.beats_vanilla == (result.best.speedup > 1.0)
    best = result.best.candidate
    assert result.best_config == dataclasses.replace(CONFIG.with_drafter(best.drafter), k=best.k)
    assert progress == sorted(progress) and progress[-1] == 1.0
    text = format_autotune(result)
    assert f"Best: {best.label}, {result.best.speedup:.2f}×" in text
    assert ("no candidate beat plain decoding" in text) == (best == PLAIN)
    Engine.load(result.best_config).close()  # the proposal is a config that loads


def test_candidates_run_on_the_engines_own_target_which_is_never_loaded_again(monkeypatch):
    engine = Engine.load(dataclasses.replace(CONFIG, drafter="none", k=0))
    try:
        import engine.models.loading as loading

        def no_second_target(*args, **kwargs):
            raise AssertionError("a second copy of the target was loaded")

        monkeypatch.setattr(loading, "load_backend", no_second_target)
        monkeypatch.setattr("engine.api.load_backend", no_second_target)
        result = run_autotune(
            engine.config,
            COPY_PROMPTS[:1],
            AutotuneSettings(max_tokens=16, warmup=False),
            engine=engine,
            candidates=(Candidate("ngram", 4),),
        )
        assert result.best_config.drafter in ("ngram", "none")
        assert engine.generate(
            engine.prompt_ids("Hi"), SamplingConfig(max_tokens=4), speculative=False
        ).tokens  # still open
    finally:
        engine.close()


def test_suffix_decoding_and_the_chain_with_the_draft_model_run_on_the_loaded_draft(monkeypatch):
    engine = Engine.load(CONFIG.with_drafter("model", draft="default"))  # the embedded model drafts for itself
    try:
        import engine.models.loading as loading

        def no_second_model(*args, **kwargs):
            raise AssertionError("a second copy of a model was loaded")

        monkeypatch.setattr(loading, "load_backend", no_second_model)
        monkeypatch.setattr("engine.api.load_backend", no_second_model)
        result = run_autotune(
            engine.config, COPY_PROMPTS[:1], AutotuneSettings(max_tokens=16, warmup=False), engine=engine
        )
        tried = {r.candidate.drafter for r in result.ranked}
        assert {"suffix", "suffix+model", "model", "ngram"} <= tried
        chain = next(r for r in result.ranked if r.candidate.drafter == "suffix+model")
        assert chain.identical == 1 and chain.tokens_per_forward >= 1.0  # greedy: the reply plain decoding gives
        if result.best.candidate.drafter == "suffix+model":
            assert result.best_config.options.draft == "default"  # the proposal loads the same draft model
        assert engine.generate(engine.prompt_ids("Hi"), SamplingConfig(max_tokens=4)).tokens  # its drafter still open
    finally:
        engine.close()


def test_a_candidates_speedup_is_the_geometric_mean_over_prompts_as_the_benchmarks():
    from engine.bench.autotune import _score

    def run(tps):
        return SimpleNamespace(
            tokens=[1], stats=SimpleNamespace(tokens_per_s=tps, accepted=1, tested=1, drafted=2, tokens=2, steps=1)
        )

    vanilla = [run(10.0), run(10.0), run(10.0)]
    scored = _score(Candidate("ngram", 4), [run(40.0), run(10.0), run(10.0)], vanilla)
    # 4x, 1x and 1x: the benchmark's aggregate (4 ** (1/3)), not the median (1x), so one dialog gives one number.
    assert scored.speedup == pytest.approx(4 ** (1 / 3))
    assert scored.draft_acceptance == pytest.approx(0.5)  # accepted / drafted, the glossary's leading figure


def test_cancel_stops_auto_tune_between_two_generations():
    cancel = threading.Event()
    seen = []

    def progress(message, fraction):
        seen.append(message)
        if message.startswith("ngram"):
            cancel.set()

    with pytest.raises(BenchmarkCancelled):
        run_autotune(CONFIG, COPY_PROMPTS, SHORT, candidates=NGRAM, progress=progress, cancel=cancel)
    assert not any(message.startswith("ngram, k 8") for message in seen)


def test_the_cli_prints_the_ranked_table(tmp_path, capsys):
    prompts = tmp_path / "copy.jsonl"
    prompts.write_text(json.dumps({"id": "copy", "kind": "reuse", "messages": list(COPY_PROMPTS[1].messages)}))
    assert main(["bench", "--autotune", "--prompts", str(prompts), "--max-tokens", "16", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "Auto-tune: 1 prompts" in out and "ngram" in out and "Best:" in out


def test_every_candidate_run_reads_its_prompt_cold_so_greedy_replies_match_plain_decoding():
    """Runs that reused the prefix the run before left in the cache (keys and values computed in
    other batch shapes: the last plain run's, a reply's) rounded differently: 11 of the 24 shipped
    turns differed from plain decoding's greedy reply, the first prompt too, where the benchmark
    had all 24 identical."""
    from engine.bench.prompts import default_prompts_path, load_prompts

    prompts = load_prompts(default_prompts_path())
    result = run_autotune(
        CONFIG, prompts, AutotuneSettings(max_tokens=24, warmup=False), candidates=(Candidate("ngram", "auto"),)
    )
    ngram = next(r for r in result.ranked if r.candidate != PLAIN)
    assert ngram.identical == ngram.prompts == 24, "a greedy reply differed from plain decoding's"
