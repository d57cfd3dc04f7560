"""`specdeck-cli bench`: prompt files, the aggregation math, peers, and a real short run."""

from __future__ import annotations

import json
import math
import mmap
import threading

import pytest

from engine import ConfigError, EngineConfig
from engine.api import Engine
from engine.bench import (
    BenchmarkCancelled,
    BenchSettings,
    PromptFileError,
    default_prompts_path,
    format_text,
    load_prompts,
    parse_prompts,
    run_benchmark,
    to_json,
)
from engine.bench.peers import PeerOutput, PeerSpec, default_peers, run_peers
from engine.bench.prompts import BenchPrompt
from engine.bench.results import (
    SPECULATIVE,
    VANILLA,
    FloorCheck,
    MemoryCheck,
    RunRecord,
    geometric_mean,
    memory_check,
    summarize,
)
from engine.bench.system import copy_bandwidth, floor_s_per_token, peak_rss_bytes, reset_peak_rss
from engine.cli.main import build_parser, main
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.ngram import NgramDrafter

USER = {"role": "user", "content": "Hello"}


def line(**record) -> str:
    return json.dumps(record)


# -- prompt files --------------------------------------------------------------------------


def test_the_shipped_prompt_set_has_reuse_and_open_prompts():
    prompts = load_prompts(default_prompts_path())
    kinds = [p.kind for p in prompts]
    assert kinds.count("reuse") >= 5 and kinds.count("open") >= 5
    assert len({p.id for p in prompts}) == len(prompts)
    assert load_prompts(default_prompts_path(), kinds=("open",)) == tuple(p for p in prompts if p.kind == "open")


def test_a_bad_json_line_is_named_by_its_number(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(line(id="a", kind="k", messages=[USER]) + "\n\n" + '{"id": "b", "kind": \n')
    with pytest.raises(PromptFileError, match=r"p\.jsonl, line 3: not valid JSON"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"id": "a", "messages": [USER]}, r"line 1: missing 'kind'"),
        ({"kind": "k"}, r"line 1: missing 'id', 'messages'"),
        (
            {"id": "a", "kind": "k", "messages": [{"role": "robot", "content": "hi"}]},
            r"line 1: message 1 has the unknown role 'robot'; use system, user, assistant",
        ),
        ({"id": "a", "kind": "k", "messages": []}, r"line 1: 'messages' must be a non-empty list"),
        ({"id": "a", "kind": "k", "messages": [{"role": "user"}]}, r'line 1: message 1 must be \{"role"'),
        ({"id": "a", "kind": "", "messages": [USER]}, r"line 1: 'kind' must be a non-empty string"),
        (
            {"id": "a", "kind": "k", "messages": [USER, {"role": "assistant", "content": "x"}]},
            r"line 1: the last message is the assistant's",
        ),
    ],
)
def test_invalid_prompts_get_a_clear_error_with_the_line_number(record, message):
    with pytest.raises(PromptFileError, match=message):
        parse_prompts(line(**record), "p.jsonl")


def test_duplicate_ids_empty_files_and_unknown_kinds_are_refused(tmp_path):
    text = line(id="a", kind="k", messages=[USER]) + "\n" + line(id="a", kind="k", messages=[USER])
    with pytest.raises(PromptFileError, match=r"line 2: the id 'a' is already used on line 1"):
        parse_prompts(text)
    with pytest.raises(PromptFileError, match="holds no prompts"):
        parse_prompts("\n  \n")
    path = tmp_path / "p.jsonl"
    path.write_text(line(id=1, kind="reuse", messages=[USER]))
    assert load_prompts(path)[0].id == "1"
    with pytest.raises(PromptFileError, match=r"no prompts of kind 'open'; its kinds are reuse"):
        load_prompts(path, kinds=("open",))
    with pytest.raises(PromptFileError, match="No prompts file at"):
        load_prompts(tmp_path / "missing.jsonl")


# -- aggregation ---------------------------------------------------------------------------


def record(
    pid,
    kind,
    mode,
    repeat,
    tokens,
    wall_s,
    *,
    steps=None,
    accepted=0,
    tested=0,
    predicted=1.0,
    identical=None,
    peak=None,
    divergence=None,
    drafted=None,
) -> RunRecord:
    drafted = tested if drafted is None else drafted
    return RunRecord(
        pid,
        kind,
        mode,
        repeat,
        tokens,
        wall_s,
        0.01,
        steps or tokens,
        drafted,
        accepted,
        tested,
        predicted,
        "length",
        peak,
        identical,
        divergence,
    )


def hand_made_runs() -> list[RunRecord]:
    runs = []
    # "copy": vanilla 100, 80, 120 tok/s (median 100); speculative 200, 150, 250 (median 200).
    for r, (v, s) in enumerate([(100, 200), (80, 150), (120, 250)]):
        runs.append(record("copy", "reuse", VANILLA, r, 100, 100 / v, peak=1000))
        runs.append(
            record(
                "copy",
                "reuse",
                SPECULATIVE,
                r,
                100,
                100 / s,
                steps=40,
                accepted=60,
                tested=80,
                predicted=2.5,
                identical=True,
                peak=1050,
            )
        )
    # "edit": vanilla 100 (median), speculative 50: speedup 0.5; one repeat differs.
    for r, (v, s) in enumerate([(100, 50), (90, 40), (110, 60)]):
        runs.append(record("edit", "reuse", VANILLA, r, 50, 50 / v, peak=1200))
        runs.append(
            record(
                "edit",
                "reuse",
                SPECULATIVE,
                r,
                50,
                50 / s,
                steps=50,
                accepted=0,
                tested=20,
                predicted=0.5,
                identical=r != 1,
                peak=1100,
                divergence={"index": 7, "explained": True} if r == 1 else None,
            )
        )
    # "story" (open): vanilla 90, speculative 99.
    runs.append(record("story", "open", VANILLA, 0, 10, 10 / 90))
    runs.append(record("story", "open", SPECULATIVE, 0, 10, 10 / 99, steps=10, tested=5, predicted=1.0, identical=True))
    return runs


def test_per_prompt_numbers_are_medians_over_repeats_and_pooled_counts():
    prompts, _, _ = summarize(hand_made_runs())
    copy, edit, story = prompts
    assert (copy.vanilla_tps, copy.speculative_tps, copy.speedup) == pytest.approx((100, 200, 2.0))
    assert copy.acceptance == pytest.approx(180 / 240)
    assert copy.tokens_per_forward == pytest.approx(300 / 120)
    assert copy.predicted_speedup == 2.5 and copy.efficiency == pytest.approx(0.8)
    assert copy.identical and copy.repeats == 3
    assert edit.speedup == pytest.approx(0.5)
    assert not edit.identical and edit.divergence == {"index": 7, "explained": True}
    assert story.speedup == pytest.approx(1.1)


def test_kinds_group_prompts_with_geometric_mean_speedups():
    _, kinds, overall = summarize(hand_made_runs())
    assert [k.name for k in kinds] == ["reuse", "open"]
    reuse = kinds[0]
    assert reuse.prompts == 2
    assert reuse.speedup == pytest.approx(1.0)  # 2x and 0.5x: the geometric mean, not 1.25
    assert reuse.predicted_speedup == pytest.approx(math.sqrt(2.5 * 0.5))
    assert reuse.vanilla_tps == pytest.approx(100) and reuse.speculative_tps == pytest.approx(125)
    assert reuse.acceptance == pytest.approx(180 / 300)  # (180 + 0) accepted / (240 + 60) tested
    assert reuse.identical == 1
    assert overall.prompts == 3 and overall.speedup == pytest.approx((2.0 * 0.5 * 1.1) ** (1 / 3))
    assert overall.identical == 2
    assert geometric_mean([4, 1, 0]) == pytest.approx(2.0)  # zeros (failed runs) are left out


def test_floor_memory_and_efficiency_checks():
    floor = FloorCheck(100_000_000, 20e9, 2, "cpu", 0.005, 0.006)
    assert floor.ratio == pytest.approx(1.2) and floor.ok
    assert not FloorCheck(100_000_000, 20e9, 2, "cpu", 0.005, 0.0065).ok
    memory = memory_check(hand_made_runs(), draft_bytes=100, per_run=True)
    assert (memory.vanilla_peak_bytes, memory.speculative_peak_bytes) == (1200, 1100)
    assert memory.limit_bytes == round(1300 * 1.1) and memory.ok
    assert MemoryCheck(1000, 1200, 0, True).ok is False
    assert MemoryCheck(None, 1200, 0, False).ok is None


def test_the_system_measurements_are_plausible():
    bandwidth = copy_bandwidth(nbytes=16 * 2**20, repeats=3, threads=1)
    assert 0.1e9 < bandwidth.bytes_per_s < 10e12
    assert floor_s_per_token(10**9, bandwidth) == pytest.approx(10**9 / bandwidth.bytes_per_s)
    reset_peak_rss()
    before = peak_rss_bytes()
    # A fresh anonymous mapping, one byte written per page: 64 MiB that cannot already be resident
    # (heap memory freed by earlier tests may be, and calloc'd zeros may never be touched).
    blob = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(blob), mmap.PAGESIZE):
        blob[offset] = 1
    after = peak_rss_bytes()
    blob.close()
    assert before is not None and after >= before + 32 * 2**20


def test_the_memory_allowance_counts_a_draft_models_weights_and_full_cache(one_thread_llama, tmp_path):
    from engine.backends.llama_cpp import LlamaCppBackend
    from engine.bench.runner import draft_memory_bytes
    from engine.drafters.model import ModelDrafter
    from tests.factories.gguf_models import make_tiny_gguf

    draft = LlamaCppBackend(make_tiny_gguf(str(tmp_path / "tiny.gguf")), n_ctx=512, n_threads=1)
    try:
        engine = Engine(one_thread_llama, ModelDrafter(draft, one_thread_llama.vocab_size), EngineConfig(), CostModel())
        # 2 layers x 2 kv heads x head dim 16 x 512 tokens x (keys + values) x 2 bytes (float16)
        assert draft_memory_bytes(engine) == draft.info.weight_bytes + 2 * 2 * 16 * 512 * 2 * 2
        engine.drafter = NgramDrafter()
        assert draft_memory_bytes(engine) == 0
    finally:
        draft.close()


# -- peers ---------------------------------------------------------------------------------


class EchoPeer:
    def __init__(self, text: str, fail_on: str | None = None) -> None:
        self.text, self.fail_on, self.closed = text, fail_on, False

    def generate(self, prompt, prompt_ids, max_tokens):
        if prompt.id == self.fail_on:
            raise RuntimeError("llama_decode returned -3")
        return PeerOutput(self.text, 5, 0.5, 4, None)

    def close(self):
        self.closed = True


def test_a_peer_that_raises_is_a_failure_row_not_a_missing_one():
    prompts = (BenchPrompt("a", "reuse", (USER,)), BenchPrompt("b", "open", (USER,)))
    ids = {"a": [1, 2], "b": [3]}
    reference = {"a": ("same", (1,)), "b": ("other", (2,))}
    flaky = EchoPeer("same", fail_on="b")

    def cannot_load():
        raise OSError("no such library: libllama.so")

    specs = [
        PeerSpec("echo", VANILLA, lambda: EchoPeer(" same ")),
        PeerSpec("flaky", SPECULATIVE, lambda: flaky),
        PeerSpec("missing", VANILLA, cannot_load),
    ]
    echo, failed_run, failed_load = run_peers(specs, prompts, ids, reference, max_tokens=8, repeat=2)
    assert echo.ok and echo.tokens_per_s == pytest.approx(8.0)
    assert [p.identical for p in echo.prompts] == [True, False]  # compared by text when there are no ids
    assert not failed_run.ok and failed_run.error == "RuntimeError: llama_decode returned -3" and flaky.closed
    assert not failed_load.ok and "OSError: no such library" in failed_load.error


@pytest.mark.slow
def test_the_transformers_peers_run_on_the_torch_backends_models(tmp_path):
    from engine.core.sampling import SamplingConfig
    from tests.factories.hf_models import make_tiny_llama

    target = make_tiny_llama(tmp_path / "target", seed=0, n_layers=2)
    draft = make_tiny_llama(tmp_path / "draft", seed=1, n_layers=1)
    engine = Engine.load(
        EngineConfig(target=target, dtype="float32", k=3, measure_costs=False).with_drafter("model", draft=draft)
    )
    try:
        prompt = BenchPrompt("copy", "reuse", ({"role": "user", "content": "Copy: the cat sat on the mat."},))
        ids = engine.prompt_ids(list(prompt.messages))
        ours = engine.generate(ids, SamplingConfig(max_tokens=8), speculative=False)
        specs = default_peers(engine)
        assert [(s.name, s.mode) for s in specs] == [
            ("transformers generate", VANILLA),
            ("transformers prompt lookup (10)", SPECULATIVE),
            ("transformers assistant model", SPECULATIVE),
        ]
        results = run_peers(specs, (prompt,), {"copy": ids}, {"copy": (ours.text, ours.tokens)}, 8, 1, warmup=0)
    finally:
        engine.close()
    for peer in results:
        assert peer.ok, peer.error
        (row,) = peer.prompts
        assert row.tokens == len(ours.tokens) and row.tokens_per_s > 0
        assert row.identical  # float32 greedy on the same weights: token for token the same


def test_cancelling_stops_the_peers():
    cancel = threading.Event()
    cancel.set()
    prompts = (BenchPrompt("a", "reuse", (USER,)),)
    with pytest.raises(BenchmarkCancelled):
        run_peers([PeerSpec("echo", VANILLA, lambda: EchoPeer("x"))], prompts, {"a": [1]}, {}, 8, 1, cancel=cancel)


# -- a real run ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_thread_llama(default_gguf):
    """The embedded model on one thread: on a shared 2-core machine two llama.cpp threads
    spin waiting for each other, and this test's run takes 60 s instead of 10."""
    from engine.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(default_gguf, n_ctx=1024, n_threads=1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def two_prompts():
    prompts = load_prompts(default_prompts_path())
    return (next(p for p in prompts if p.id == "quote-paragraph"), next(p for p in prompts if p.kind == "open"))


@pytest.mark.slow
def test_a_real_short_run_reports_both_modes_identity_and_peers(one_thread_llama, two_prompts):
    config = EngineConfig(k=4, measure_costs=False, threads=1)
    engine = Engine(one_thread_llama, NgramDrafter(), config, CostModel())

    def broken():
        raise RuntimeError("this peer always fails")

    peers = [*default_peers(engine), PeerSpec("broken peer", VANILLA, broken)]
    progress = []
    report = run_benchmark(
        engine.config,
        two_prompts,
        BenchSettings(max_tokens=16, repeat=1),
        engine=engine,
        peers=peers,
        progress=lambda m, f: progress.append(f),
    )

    assert [p.id for p in report.prompts] == [two_prompts[0].id, two_prompts[1].id]
    assert [k.name for k in report.kinds] == ["reuse", "open"]
    assert len(report.runs) == 4 and {r.mode for r in report.runs} == {VANILLA, SPECULATIVE}
    quote = report.prompts[0]
    assert quote.tokens == 16 and quote.vanilla_tps > 0 and quote.speculative_tps > 0
    assert quote.identical  # greedy n-gram drafting on a copy task: the same output, sooner
    assert quote.acceptance > 0.5 and quote.tokens_per_forward > 1.5
    assert all(isinstance(p.identical, bool) for p in report.prompts)
    assert report.floor is not None and report.floor.floor_s > 0 and report.floor.ratio > 0
    assert report.memory.vanilla_peak_bytes and report.memory.draft_bytes == 0
    assert progress[-1] == 1.0 and progress == sorted(progress)

    chat, lookup, *servers, broken_row = report.peers
    assert chat.ok and lookup.ok, (chat.error, lookup.error)
    # llama-server beside ours (README's install command builds it): plain, then each n-gram type.
    assert [p.name for p in servers] == [
        "llama-server",
        "llama-server ngram-simple",
        "llama-server ngram-map-k",
        "llama-server ngram-mod",
        "llama-server ngram-cache",
    ]
    assert all(p.ok and p.tokens_per_s > 0 for p in servers), [p.error for p in servers]
    assert [p.mode for p in servers] == [VANILLA] + [SPECULATIVE] * 4
    assert chat.tokens_per_s > 0 and all(p.tokens == 16 and isinstance(p.identical, bool) for p in chat.prompts)
    assert not broken_row.ok and broken_row.error == "RuntimeError: this peer always fails"

    text = format_text(report)
    assert "quote-paragraph" in text and "Bandwidth floor" in text and "Memory:" in text
    assert "broken peer" in text and "FAILED: RuntimeError: this peer always fails" in text
    data = json.loads(to_json(report))
    assert data["prompts"][0]["identical"] is True and len(data["runs"]) == 4
    assert data["peers"][-1]["ok"] is False and data["floor"]["ratio"] > 0
    # Both rates, by their names: accepted / drafted never exceeds accepted / tested.
    assert "draft acceptance" in text and "mean acceptance length" in text and "goal: at most" not in text
    assert 0 < data["prompts"][0]["draft_acceptance"] <= data["prompts"][0]["acceptance"]
    assert one_thread_llama.tokenize("still open")  # an engine handed in is the caller's to close


def test_the_engine_must_have_a_drafter(one_thread_llama, two_prompts):
    engine = Engine(one_thread_llama, None, EngineConfig(drafter="none", measure_costs=False), CostModel())
    with pytest.raises(ConfigError, match="needs a drafter"):
        run_benchmark(engine.config, two_prompts, BenchSettings(max_tokens=4, repeat=1), engine=engine)


def test_cancel_before_the_runs_raises_cancelled(one_thread_llama, two_prompts):
    engine = Engine(one_thread_llama, NgramDrafter(), EngineConfig(measure_costs=False), CostModel())
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(BenchmarkCancelled):
        run_benchmark(
            engine.config,
            two_prompts,
            BenchSettings(max_tokens=4, repeat=1, measure_bandwidth=False),
            engine=engine,
            cancel=cancel,
        )


# -- the command line ----------------------------------------------------------------------


def test_the_bench_command_parses_the_issue_options():
    args = build_parser().parse_args(
        [
            "bench",
            "--prompts",
            "p.jsonl",
            "--target",
            "m.gguf",
            "--drafter",
            "ngram",
            "--backend",
            "llama.cpp",
            "--k",
            "4",
            "--max-tokens",
            "32",
            "--repeat",
            "2",
            "--json",
            "out.json",
            "--peers",
            "--kinds",
            "reuse",
        ]
    )
    assert (args.command, args.k, args.max_tokens, args.repeat, args.peers, args.kinds) == (
        "bench",
        "4",
        32,
        2,
        True,
        "reuse",
    )
    assert str(args.json) == "out.json" and args.drafter == "ngram" and args.draft is None


def test_the_bench_command_reports_a_bad_prompts_file_in_one_line(tmp_path, capsys):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "kind": "k", "messages": [{"role": "bot", "content": "x"}]}\n')
    assert main(["bench", "--prompts", str(path)]) == 2
    assert "mine.jsonl, line 1: message 1 has the unknown role 'bot'" in capsys.readouterr().err


def test_both_acceptance_rates_are_reported_by_their_names():
    """a = accepted / tested (the formula's); drafts accepted = accepted / drafted (vLLM's, llama.cpp's)."""
    runs = [
        record("copy", "reuse", VANILLA, 0, 100, 1.0),
        record("copy", "reuse", SPECULATIVE, 0, 100, 0.5, steps=40, accepted=60, tested=80, drafted=120),
    ]
    [copy], [reuse], _ = summarize(runs)

    assert copy.acceptance == pytest.approx(60 / 80) and copy.draft_acceptance == pytest.approx(60 / 120)
    assert reuse.draft_acceptance == pytest.approx(0.5)


def test_a_benchmarks_repeats_do_not_draft_from_each_others_replies(one_thread_llama, two_prompts):
    """Suffix decoding remembers replies; the benchmark's second run of a prompt must not copy the first's."""
    from engine.drafters.suffix import SuffixDrafter

    config = EngineConfig(drafter="suffix", k=4, measure_costs=False, threads=1)
    drafter = SuffixDrafter(trees=False)
    engine = Engine(one_thread_llama, drafter, config, CostModel())
    report = run_benchmark(
        engine.config, two_prompts[1:], BenchSettings(max_tokens=24, repeat=2, warmup=1), engine=engine
    )
    first, second = [r for r in report.runs if r.mode == SPECULATIVE]
    assert first.token_ids == second.token_ids  # greedy: the same reply twice
    assert (second.drafted, second.accepted) == (first.drafted, first.accepted)  # drafted as if for the first time
    # Outside the benchmark it does remember: the same prompt again drafts its whole earlier reply.
    again = engine.generate(engine.prompt_ids(list(two_prompts[1].messages)), SamplingConfig(max_tokens=24))
    assert again.stats.accepted > second.accepted and drafter.stats().from_history > 0
