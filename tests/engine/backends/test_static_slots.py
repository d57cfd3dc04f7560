"""Several sequences on the static-shape native forward (`--compile on --parallel N`), on the CPU.

Every sequence has a slot of one shared KV buffer, and a batched step pads the rows of all
of them to one bucket (engine/backends/hf/static.py). A user serving requests together on
that path must get, for each request, what it gets alone on the eager path: the same
logits up to float32 rounding and the same greedy text, whatever its neighbours hold.
The reference for a call is the same call on a separately loaded eager backend holding
the same tokens. Every model is tiny and random (tests/factories/hf_models.py).
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, SamplingConfig
from engine.api import collect
from engine.backends.hf.backend import TorchBackend
from engine.backends.hf.static import ROW_BUCKETS
from engine.backends.slots import BatchCall, SlotsFull
from engine.config import EngineConfig
from engine.core.tree import ancestor_mask, depths
from tests.engine.backends.numerics import assert_batch_matches_alone, assert_close, run_alone
from tests.engine.backends.numerics import random_ids as ids
from tests.engine.backends.test_static_forward import ReplayLike
from tests.factories.hf_models import make_tiny_llama, make_tiny_model

TREE_PARENTS = [-1, 0, 0, 1, 2]  # two branches of depth 3
TREE_OFFSETS = [d - 1 for d in depths(TREE_PARENTS)]
CONFIGS = {
    "llama-2kv": ("llama", {"n_kv_heads": 2}),
    "qwen3-1kv": ("qwen3", {"n_kv_heads": 1, "head_dim": 32}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("static-slots")
    return {key: make_tiny_model(root / key, arch, seed=7, **opts) for key, (arch, opts) in CONFIGS.items()}


def _load(folder: str, compile: str, slots: int = 1, **options):
    backend = TorchBackend(folder, dtype="float32", impl="native", compile=compile, **options)
    backend.max_slots = slots  # as engine/models/loading.py sets it
    return backend


class Steps(ReplayLike):
    """Records each static step's key (rows bucket, span, ...), as a CUDA graph pool would see them."""

    def keys(self) -> list[tuple]:
        return list(self.runs)


@pytest.fixture(scope="module")
def pair(folders):
    """(static backend with two slots open, its step recorder, eager solo backend), llama."""
    static = _load(folders["llama-2kv"], "on", slots=3)
    steps = static._static.graphs = Steps()
    solo = _load(folders["llama-2kv"], "off")
    yield [static, static.open_slot(), static.open_slot()], steps, solo
    static.close()
    solo.close()


@pytest.fixture
def three(pair):
    """The three sequences holding 7, 12 and 3 tokens, whatever the last test left."""
    sequences, steps, solo = pair
    for seed, (sequence, n) in enumerate(zip(sequences, (7, 12, 3))):
        sequence.prefill(ids(n, seed))
    steps.runs.clear()
    return sequences, steps, solo


def _assert_batch_matches_alone(owner, solo, calls: list[BatchCall], what: str = "") -> list[torch.Tensor]:
    got = assert_batch_matches_alone(owner, solo, calls, what)
    for call in calls:
        if call.parents is not None:  # as a verifier does after a tree: keep one path, drop the rest
            call.slot.keep_nodes([0, 1, 3])
    return got


def _tree(slot, seed: int) -> BatchCall:
    return BatchCall(slot, ids(5, seed), TREE_OFFSETS, ancestor_mask(TREE_PARENTS), "a tree", TREE_PARENTS)


def _mixed(sequences, seed: int) -> list[BatchCall]:
    """A one-token step, a k + 1 = 4 verify block and a tree of 5: 10 rows, padded to 16."""
    owner, first, second = sequences
    return [BatchCall(owner, ids(1, seed)), BatchCall(first, ids(4, seed + 1)), _tree(second, seed + 2)]


# -- the same numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(CONFIGS))
def test_one_static_step_gives_each_sequence_the_logits_of_its_own_eager_forward(folders, key):
    static = _load(folders[key], "on", slots=3)
    steps = static._static.graphs = Steps()
    solo = _load(folders[key], "off")
    sequences = [static, static.open_slot(), static.open_slot()]
    for seed, (sequence, n) in enumerate(zip(sequences, (7, 12, 3))):
        sequence.forward(ids(n, seed))
    steps.runs.clear()
    _assert_batch_matches_alone(static, solo, _mixed(sequences, 10), key)
    _assert_batch_matches_alone(static, solo, [BatchCall(s, ids(1, 20 + i)) for i, s in enumerate(sequences)], key)
    assert [k[0] for k in steps.keys()] == [16, 4]  # both steps ran static: 10 rows padded to 16, then 3 to 4
    static.close()
    solo.close()


@pytest.mark.parametrize("keep", ["keep_rows", "keep_nodes"])
def test_rollback_and_keeping_a_path_between_steps_touch_one_slot(three, keep):
    sequences, steps, solo = three
    owner, first, second = sequences
    owner.forward_batch(_mixed(sequences, 30))
    kept = [list(s.tokens) for s in sequences]
    getattr(second, keep)([0, 1, 3])  # one path of the tree (keep_rows takes the same rows)
    first.rollback(len(first.tokens) - 2)  # the last two of its four rows rejected
    assert second.tokens == kept[2][:3] + [kept[2][3 + i] for i in (0, 1, 3)]
    assert [s._kv.length for s in sequences] == [len(s.tokens) for s in sequences]
    _assert_batch_matches_alone(owner, solo, _mixed(sequences, 40), "after rollback")
    assert len(steps.keys()) == 1  # the same bucket and span twice: one graph


def test_a_prefill_past_the_largest_bucket_runs_eagerly_on_its_slot_and_the_next_steps_match(three):
    sequences, steps, solo = three
    owner, first, second = sequences
    first.forward(ids(100, 50))  # alone, past the largest bucket: the eager forward on the static slot
    _assert_batch_matches_alone(owner, solo, _mixed(sequences, 51), "after a long prefill")
    # In a batch: 70 + 1 + 5 rows are past the largest bucket, so the eager packed forward runs them.
    calls = [BatchCall(owner, ids(1, 52)), BatchCall(first, ids(70, 53)), _tree(second, 54)]
    _assert_batch_matches_alone(owner, solo, calls, "packed")
    _assert_batch_matches_alone(owner, solo, _mixed(sequences, 55), "after the packed step")
    assert [k[0] for k in steps.keys()] == [16]  # the two mixed steps; the long ones ran eager


def test_total_rows_on_either_side_of_each_bucket_boundary(three):
    sequences, steps, solo = three
    owner, first, second = sequences
    for total in (16, 17, 18, 32, 33, 34, 64, 65):
        base = [len(s.tokens) for s in sequences]
        calls = [BatchCall(owner, ids(1, total)), BatchCall(first, ids(total - 6, total + 1)), _tree(second, total + 2)]
        _assert_batch_matches_alone(owner, solo, calls, f"{total} rows")
        for sequence, length in zip(sequences, base):
            sequence.rollback(length)
    assert sorted({k[0] for k in steps.keys()}) == [16, 17, 32, 33, 64]  # 65 rows: eager packed


def test_a_slot_crossing_the_capacity_grows_the_buffer_under_every_slot(folders, pair):
    solo = pair[2]
    owner = _load(folders["llama-2kv"], "on", slots=3)
    steps = owner._static.graphs = Steps()
    sequences = [owner, owner.open_slot(), owner.open_slot()]
    for seed, (sequence, n) in enumerate(zip(sequences, (7, 250, 3))):
        sequence.forward(ids(n, seed))
    assert owner._kv.capacity == 256
    calls = [BatchCall(owner, ids(2, 61)), BatchCall(sequences[1], ids(9, 62)), _tree(sequences[2], 63)]  # 259 > 256
    _assert_batch_matches_alone(owner, solo, calls, "growing")
    assert owner._kv.capacity == sequences[2]._kv.capacity == 512 and steps.buffers_seen == 2
    _assert_batch_matches_alone(owner, solo, _mixed(sequences, 64), "after growing")
    owner.close()


def test_padding_and_other_slots_never_reach_a_sequences_rows(three):
    """The same call beside neighbours holding other tokens gives the same logits: bit for bit when the
    step's shapes are the same, within rounding when the neighbours change the bucket and the span."""
    sequences, _, solo = three
    owner, first, second = sequences
    probe = ids(3, 70)
    results = []
    for seed, (n_first, n_second) in enumerate([(12, 3), (12, 3), (40, 9), (300, 1)]):
        owner.prefill(ids(7, 0))
        first.prefill(ids(n_first, 71 + seed))
        second.prefill(ids(n_second, 81 + seed))
        calls = [BatchCall(owner, probe), BatchCall(first, ids(4, 91 + seed)), _tree(second, 95 + seed)]
        results.append(owner.forward_batch(calls)[0])
    assert torch.equal(results[0], results[1])
    want, _ = run_alone(solo, BatchCall(owner, probe), ids(7, 0))
    for i, got in enumerate(results):
        assert_close(got, want, f"beside neighbours {i}")


def test_a_closed_slot_reopens_empty_whatever_it_held(pair):
    sequences, _, solo = pair
    owner = sequences[0]
    slot = sequences[2]
    slot.prefill(ids(40, 100))
    index = slot._kv.index
    slot.close()
    again = owner.open_slot()
    assert again.tokens == [] and again._kv.index == index and again._kv.length == 0
    owner.prefill(ids(5, 101))
    _assert_batch_matches_alone(owner, solo, [BatchCall(again, ids(3, 102)), BatchCall(owner, ids(2, 103))], "reopened")
    sequences[2] = again


def test_slots_are_refused_past_max_slots(folders):
    backend = _load(folders["llama-2kv"], "on", slots=2)
    backend.open_slot()
    with pytest.raises(SlotsFull, match="--parallel 2"):
        backend.open_slot()
    backend.close()


def test_one_slot_holds_what_one_sequence_held_and_n_slots_n_times_that(folders):
    """--parallel 1 reserves what the static path always did; --parallel 3 what three eager caches would."""
    sizes = {}
    for slots in (1, 3):
        backend = _load(folders["llama-2kv"], "on", slots=slots)
        backend.forward(ids(10, 0))
        static = backend._static
        sizes[slots] = static.kv.nbytes()
        layers, heads, dim = len(static.native.blocks), static.native.n_kv_heads, static.native.head_dim
        assert sizes[slots] == layers * 2 * heads * (256 + ROW_BUCKETS[-1]) * slots * dim * 4  # float32
        backend.close()
    assert sizes[3] == 3 * sizes[1]


def test_early_exit_on_a_static_slot_equals_eager(three):
    sequences, _, solo = three
    slot = sequences[1]
    base, draft = list(slot.tokens), ids(3, 110)
    slot.partial_forward(draft, n_layers=1, start=len(base))
    got = slot.forward_from_exit(draft, slot.exit_hidden(), exit_layer=1)
    solo.prefill(base)
    assert_close(got, solo.forward(draft), "early exit on a static slot")


# -- the same text -----------------------------------------------------------------------------------

TEXTS = [
    "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese.",
    "Write a short poem about the sea.",
    "List the days of the week, then list them again backwards.",
]


@pytest.mark.parametrize("drafter", [None, "ngram", "model"])
def test_greedy_replies_decoded_together_on_the_static_path_equal_their_solo_eager_replies(tmp_path_factory, drafter):
    """Plain decoding, n-gram drafts (verify chains) and a draft model, itself on the static path
    (a draft model follows the target's --compile) drafting for all three sequences at once."""
    root = tmp_path_factory.mktemp("static-batch")
    target = make_tiny_llama(root / "target", seed=0, n_layers=2)
    draft = {"draft": make_tiny_llama(root / "draft", seed=1, n_layers=1)} if drafter == "model" else {}

    def engine(compile: str, parallel: int) -> Engine:
        config = EngineConfig(
            target=target, parallel=parallel, dtype="float32", compile=compile, k=4, measure_costs=False
        )
        return Engine.load(config.with_drafter(drafter or "ngram", **draft))

    speculative = drafter is not None
    eager, static = engine("off", 1), engine("on", 3)
    try:
        models = [static.target] + ([static.drafter.backend] if drafter == "model" else [])
        assert all(m.info.forward.startswith("native forward, static shapes") and m.max_slots == 3 for m in models)
        prompts = [static.prompt_ids(t) for t in TEXTS]
        samplings = [SamplingConfig(max_tokens=n) for n in (40, 24, 32)]
        batch = static.batch()
        sequences = [batch.join(p, s, speculative=speculative) for p, s in zip(prompts, samplings)]
        events, widest = {id(s): [] for s in sequences}, 0
        while batch.sequences:
            for sequence, outcome in batch.step():
                assert not isinstance(outcome, BaseException), outcome
                events[id(sequence)].append(outcome)
                widest = max(widest, outcome.batch)
        batch.close()
        assert widest == 3  # one forward ran all three sequences' rows
        for prompt, sampling, sequence in zip(prompts, samplings, sequences):
            want = eager.generate(prompt, sampling, speculative=speculative)
            got = collect(events[id(sequence)])
            assert got.tokens == want.tokens
            assert eager.target.detokenize(got.tokens) == eager.target.detokenize(want.tokens)
            assert not speculative or got.stats.drafted > 0
    finally:
        eager.close()
        static.close()
