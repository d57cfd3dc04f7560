"""The load test (engine/bench/load_sweep.py) on a fake target whose verify cost the test sets.

The fake's forward over `rows` rows (all sequences' together) sleeps T(rows) = BASE_S up to
KNEE rows and BASE_S * rows / KNEE past it: flat while the batch leaves the forward room
(a memory-bound forward, where draft rows are free) and linear once it is full (each row
costs a token's time). Sampled at temperature 1 from a chain that goes i -> i + 1 two times
in three, n-gram drafts are accepted about 2/3 of the time: drafting pays at B = 1 and 2
and loses from B = 4 on, where automatic k must stop drafting.
"""

from __future__ import annotations

import time

import pytest

from engine.api import Engine
from engine.backends.base import common_prefix_length
from engine.bench.load_contexts import prompt_ids
from engine.bench.load_predict import plan_memory, predict
from engine.bench.load_report import format_load
from engine.bench.load_results import AUTO, VANILLA, LoadSweep
from engine.bench.load_settings import LoadSettings
from engine.bench.load_sweep import run_load_sweep
from engine.bench.prompts import BenchPrompt
from engine.bench.results import BenchmarkCancelled
from engine.config import EngineConfig
from engine.core.costs import CostSnapshot
from engine.core.draft_length import CostModel
from engine.drafters.registry import make_drafter
from tests.factories.fake import LETTERS, MarkovBackend, MarkovSlotsBackend, cycle_transition

BASE_S = 0.02  # well above the engine's own time per sequence and step, so T(rows) decides
KNEE = 4
K = 2


def verify_s(rows: int) -> float:
    return BASE_S * max(1.0, rows / KNEE)


class _TimedSequence(MarkovBackend):
    """A slot whose own forward (a sequence alone in its step, or its prefill) costs T(rows)."""

    def __init__(self, owner, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner

    def _forward(self, tokens, all_logits):
        if not self.owner.batching:  # a prefill (no logits wanted) costs a row: the sweep's prompts are all alike
            time.sleep(verify_s(len(tokens) if all_logits else 1))
        return MarkovBackend._forward(self, tokens, all_logits)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return [LETTERS.index(c) for c in text.lower() if c in LETTERS]


class TimedSlots(MarkovSlotsBackend):
    """MarkovSlotsBackend whose forward over the rows of all its sequences costs T(total rows)."""

    def __init__(self, max_slots: int = 8) -> None:
        super().__init__(cycle_transition(len(LETTERS), noise=0.02), n_ctx=512, max_slots=max_slots)
        self.batching = False
        self.owner = self  # its own forward (the first sequence's) is timed as a slot's is

    def open_slot(self):
        slot = super().open_slot()  # its count and SlotsFull
        self.opened.remove(slot)
        timed = _TimedSequence(self, self.transition, None, self._n_ctx)
        timed.close = lambda: self.opened.remove(timed)
        self.opened.append(timed)
        return timed

    def forward_batch(self, calls):
        time.sleep(verify_s(sum(len(c.tokens) for c in calls)))
        self.batching = True
        try:
            return super().forward_batch(calls)
        finally:
            self.batching = False

    _forward = _TimedSequence._forward
    tokenize = _TimedSequence.tokenize


PROMPTS = (
    BenchPrompt("alphabet", "reuse", ({"role": "user", "content": "abcdefghijklmnopqrstuvwxyz"},)),
    BenchPrompt("from-m", "reuse", ({"role": "user", "content": "mnopqrstuvwxyzabcdefghijkl"},)),
)


def timed_engine(parallel: int = 8) -> Engine:
    target = TimedSlots(max_slots=parallel)
    config = EngineConfig(target="fake", drafter="ngram", k_max=4, parallel=parallel, measure_costs=False)
    costs = CostModel()
    costs.verify_s.update({n: verify_s(n) for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 33, 48)})  # the load's curve
    return Engine(target, make_drafter(target, config), config, costs)


@pytest.fixture(scope="module")
def sweep() -> LoadSweep:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # softmax over a few rows took 16 ms with its thread pool on a busy machine
    try:
        settings = LoadSettings(batches=(1, 2, 4, 8), k=K, max_tokens=12, warmup=0, temperature=1.0)
        return run_load_sweep(timed_engine(), PROMPTS, settings)
    finally:
        torch.set_num_threads(threads)


def test_the_sweep_measures_every_batch_size_and_mode(sweep):
    assert sweep.batches == (1, 2, 4, 8)
    assert sweep.modes == (VANILLA, f"k={K}", AUTO)
    for batch in sweep.batches:
        for mode in sweep.modes:
            point = sweep.point(batch, mode)
            assert point is not None and point.aggregate_tps > 0 and point.request_tps > 0 and point.ttft_s > 0
            assert point.tokens == 12 * max(2, 2 * batch)  # every request ran to its max tokens
            assert 1 <= point.mean_batch <= batch
    assert sweep.point(8, VANILLA).mean_batch > 6  # the closed loop kept the batch full
    assert sweep.point(1, f"k={K}").mean_k > 1.4 and sweep.point(1, VANILLA).mean_k == 0  # the last steps draft less
    assert 0.25 < sweep.point(1, f"k={K}").acceptance < 0.9  # accepted / drafted: below the 2/3 per token tested


def test_drafting_pays_while_the_forward_has_room_and_loses_once_it_is_full(sweep):
    fixed = f"k={K}"
    assert sweep.speedup(1, fixed) > 1.3
    assert sweep.speedup(8, fixed) < 0.9
    assert sweep.break_even_mode == fixed
    assert sweep.break_even_measured in (4, 8)
    assert sweep.break_even_predicted == 4  # T(12 rows) = 3 T(4): 2.1 tokens for 3 rows' time
    assert sweep.break_evens == ((sweep.contexts[0], sweep.break_even_measured, 4),)
    assert "failure mode 2" in sweep.failure_mode and f"B = {sweep.break_even_measured}" in sweep.failure_mode


def test_automatic_k_never_loses_and_stops_drafting_where_the_batch_is_full(sweep):
    for batch in sweep.batches:
        assert sweep.speedup(batch, AUTO) > 0.85, batch  # at least about vanilla's, timing noise allowed
    assert sweep.speedup(1, AUTO) > 1.3
    assert sweep.point(8, AUTO).mean_k < 0.5  # it stopped drafting
    assert dict(sweep.predicted)[1] > 1.5 and dict(sweep.predicted)[8] < 1.05  # (1.0: no drafting pays)


def test_the_prediction_follows_the_cost_curve():
    flat = CostSnapshot(verify_s=((1, 1.0), (64, 1.0)))  # a forward with room for every row
    linear = CostSnapshot(verify_s=((1, 1.0), (64, 64.0)))  # every row costs a token's time
    assert predict(flat, 0.8, 16, 8)[0] > 3 and predict(flat, 0.8, 16, 8)[1] == 8
    assert predict(linear, 0.8, 16, 8) == (1.0, 0.0)  # automatic k: no drafting
    assert predict(linear, 0.8, 16, 8, k=4)[0] < 1  # a fixed k loses


def test_the_result_travels_as_a_dict_and_prints_a_table(sweep):
    assert LoadSweep.from_dict(sweep.to_dict()) == sweep
    text = format_load(sweep)
    assert "Break-even" in text and sweep.failure_mode in text
    assert sweep.predicted_speedup(1, f"k={K}") is not None


def test_memory_counts_the_drafts_weights_and_cache_per_sequence():
    gib = 2**30
    memory = plan_memory(8 * gib, 4096, 2 * gib, gib // 4, draft_bytes=gib, draft_kv=gib // 4)
    assert memory.max_batch_plain == 24  # 6 GiB of quarter-GiB caches
    assert memory.max_batch_with_draft == 10  # 5 GiB of half-GiB caches


def test_prompts_are_padded_to_the_context_and_a_context_that_does_not_fit_is_noted():
    engine = timed_engine(parallel=2)
    padded = prompt_ids(engine, PROMPTS, 200, count=4)
    assert len(padded) == 4 and all(len(ids) == 200 for ids in padded)
    # a prompt's second copy shares no long prefix with its first: its prefill is not free in a slot
    # that held the first (which would make a mode's speed depend on where its requests landed)
    assert common_prefix_length(padded[0], padded[2]) < 10
    settings = LoadSettings(batches=(1,), contexts=(100, 5000), k=K, max_tokens=4, warmup=0, requests=1)
    sweep = run_load_sweep(engine, PROMPTS, settings)
    assert sweep.contexts == (100,) and any("5000" in note for note in sweep.notes)


def test_cancelling_stops_the_sweep():
    import threading

    cancel = threading.Event()
    cancel.set()
    with pytest.raises(BenchmarkCancelled):
        run_load_sweep(timed_engine(parallel=2), PROMPTS, LoadSettings(batches=(1, 2), warmup=0), cancel=cancel)


def _sweep_of(speedups: dict[int, float], memory=None) -> LoadSweep:
    """A LoadSweep whose fixed k=4 ran at `speedups[B]` times vanilla (automatic k at 1x)."""
    from engine.bench.load_results import LoadPoint

    points = []
    for batch, speedup in speedups.items():
        for mode, tps in ((VANILLA, 10.0), ("k=4", 10.0 * speedup), (AUTO, 10.0)):
            points.append(LoadPoint(batch, 100, mode, tps, tps, 0.1, mean_k=0.0 if mode != "k=4" else 4.0))
    below = next((b for b, s in speedups.items() if s < 1), None)
    return LoadSweep("t", "d", "torch", tuple(points), break_even_measured=below, break_even_mode="k=4", memory=memory)


def test_the_sentence_names_the_failure_mode_the_numbers_show():
    from engine.bench.load_predict import failure_mode

    said = failure_mode(_sweep_of({1: 0.8, 8: 0.5}), acceptance=0.2)
    assert "failure mode 1" in said and "20%" in said and said.endswith(".")
    said = failure_mode(_sweep_of({1: 1.8, 8: 0.7}), acceptance=0.8)
    assert said.startswith("At B = 8 the verify forward is no longer free") and "automatic k stopped drafting" in said
    memory = plan_memory(2**30, 4096, 2**28, 2**24, draft_bytes=2**27, draft_kv=2**24)
    said = failure_mode(_sweep_of({1: 1.8, 8: 1.2}, memory), acceptance=0.8)
    assert "paid at every batch size" in said and "room for 20 sequences of 4096 tokens instead of 48" in said
    assert "failure mode 3" in said


def test_a_models_cache_per_token_is_read_from_its_files(tiny_llama):
    from types import SimpleNamespace

    from engine.bench.load_predict import kv_bytes

    info = SimpleNamespace(path=tiny_llama, backend="torch", dtype="float32")
    assert kv_bytes(info, 1000) == 2 * 2 * 2 * 16 * 4 * 1000  # keys and values, 2 layers, 2 KV heads of 16, float32
    assert kv_bytes(SimpleNamespace(path="/no/such/model", backend="torch", dtype="float32"), 1000) == 0
