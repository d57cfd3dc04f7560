"""Several sequences on the native backend: slots, and one forward over the rows of several.

The reference for every batched call is the same call on a second, separately loaded
backend holding the same tokens: a user serving requests together must get, for each,
the logits (and greedy tokens) that request would get alone.
"""

from __future__ import annotations

import pytest
import torch

from engine.api import collect
from engine.backends.capabilities import HiddenFeatures, LayerExit, LayerFeatures, Slots, TreeForward, has
from engine.backends.hf.backend import TorchBackend
from engine.backends.slots import BatchCall, SlotsFull
from engine.core.batch import Batch
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig
from engine.core.tree import ancestor_mask, depths
from engine.drafters.lookahead import LookaheadDrafter
from engine.drafters.model import ModelDrafter
from engine.drafters.ngram import NgramDrafter
from engine.errors import ContextOverflowError, CorruptModelError, OutOfMemoryError
from tests.engine.backends.numerics import assert_batch_matches_alone, assert_close, run_alone
from tests.engine.backends.numerics import random_ids as ids
from tests.factories.hf_models import make_tiny_model

TREE_PARENTS = [-1, 0, 0, 1, 2]  # two branches of depth 3
TREE_OFFSETS = [d - 1 for d in depths(TREE_PARENTS)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("slots") / "qwen3", "qwen3", seed=5, n_kv_heads=1, head_dim=32)


def _load(folder: str, slots: int = 3, **options):
    backend = TorchBackend(folder, dtype=options.pop("dtype", "float32"), impl="native", compile="off", **options)
    backend.max_slots = slots  # as engine/models/loading.py sets it
    return backend


@pytest.fixture(scope="module")
def solo(folder):
    """One sequence at a time: the reference."""
    backend = _load(folder, slots=1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def loaded(folder):
    """A backend with two slots open, loaded once."""
    backend = _load(folder)
    yield [backend, backend.open_slot(), backend.open_slot()]
    backend.close()


@pytest.fixture
def three(loaded):
    """The backend and its two slots holding 7, 12 and 3 tokens, whatever the last test left."""
    for seed, (slot, n) in enumerate(zip(loaded, (7, 12, 3))):
        slot.prefill(ids(n, seed)[:-1])  # a prefill keeps what it can; the last token's forward sets last_features
        slot.forward(ids(n, seed)[-1:])
    return loaded


def _mixed_calls(slots, seed: int) -> list[BatchCall]:
    """1, 3 and 5 rows: a decode step, a chain to verify, a tree."""
    owner, first, second = slots
    return [
        BatchCall(owner, ids(1, seed)),
        BatchCall(first, ids(3, seed + 1)),
        BatchCall(second, ids(5, seed + 2), TREE_OFFSETS, ancestor_mask(TREE_PARENTS), "a tree", TREE_PARENTS),
    ]


def test_each_slot_gets_the_logits_of_its_own_forward(three, solo):
    assert_batch_matches_alone(three[0], solo, _mixed_calls(three, 10))


@pytest.mark.parametrize("keep", ["keep_rows", "keep_nodes"])
def test_rollback_and_keeping_a_path_touch_one_slot_and_the_next_batch_still_matches(three, solo, keep):
    owner, first, second = three
    owner.forward_batch(_mixed_calls(three, 20))
    kept = [list(s.tokens) for s in three]
    getattr(second, keep)([0, 1, 3])  # one path of the tree
    first.rollback(len(first.tokens) - 2)
    assert second.tokens == kept[2][:3] + [kept[2][3 + i] for i in (0, 1, 3)]
    assert first.tokens == kept[1][:-2]
    assert owner.tokens == kept[0] and owner._kv.length == len(kept[0])
    assert [s._kv.length for s in three] == [len(s.tokens) for s in three]
    assert_batch_matches_alone(owner, solo, _mixed_calls(three, 30))


def test_a_prefill_longer_than_a_slice_runs_in_the_batch_as_alone(three, solo):
    owner, first, _ = three
    assert_batch_matches_alone(owner, solo, [BatchCall(first, ids(600, 40)), BatchCall(owner, ids(2, 41))])


def test_a_call_past_its_slots_context_changes_no_slot(folder):
    backend = _load(folder, n_ctx=32)
    slot = backend.open_slot()
    backend.forward(ids(10, 0))
    slot.forward(ids(30, 1))
    with pytest.raises(ContextOverflowError, match="context window"):
        backend.forward_batch([BatchCall(backend, ids(2, 2)), BatchCall(slot, ids(3, 3))])
    assert backend.tokens == ids(10, 0) and slot.tokens == ids(30, 1)
    assert backend._kv.length == 10 and slot._kv.length == 30
    backend.close()


def test_an_allocation_failure_leaves_every_slot_as_it_was(three, solo, monkeypatch):
    owner = three[0]
    before = [list(s.tokens) for s in three]
    calls = _mixed_calls(three, 50)
    calls[1] = BatchCall(three[1], ids(600, 51))  # a long prefill: its head runs alone first, then the batch
    head, runs = owner._native.head, []

    def head_then_no_memory(features):
        runs.append(features.shape[0])
        if len(runs) > 1:
            raise MemoryError("out of memory")
        return head(features)

    monkeypatch.setattr(owner._native, "head", head_then_no_memory)
    with pytest.raises(OutOfMemoryError):
        owner.forward_batch(calls)
    monkeypatch.undo()
    assert runs == [600 - 512, 1 + 512 + 5]  # the failure came after the long prefill's head had run
    assert [s.tokens for s in three] == before
    assert [s._kv.length for s in three] == [len(t) for t in before]
    assert_batch_matches_alone(owner, solo, _mixed_calls(three, 50))


def test_non_finite_logits_say_the_weights_are_corrupt_and_roll_every_slot_back(three, monkeypatch):
    owner = three[0]
    before = [list(s.tokens) for s in three]
    head = owner._native.head
    monkeypatch.setattr(owner._native, "head", lambda features: head(features) * float("nan"))
    with pytest.raises(CorruptModelError, match="corrupt"):
        owner.forward_batch(_mixed_calls(three, 80))
    assert [s.tokens for s in three] == before
    assert [s._kv.length for s in three] == [len(t) for t in before]


def test_slots_are_refused_past_max_slots_and_a_closed_slots_place_reopens(folder, solo):
    backend = _load(folder, slots=2)
    slot = backend.open_slot()
    with pytest.raises(SlotsFull, match="--parallel 2"):
        backend.open_slot()
    slot.forward(ids(5, 0))
    slot.close()
    with pytest.raises(RuntimeError, match="closed"):
        slot.forward(ids(1, 1))
    again = backend.open_slot()
    assert again.tokens == []
    assert_batch_matches_alone(backend, solo, [BatchCall(again, ids(4, 2)), BatchCall(backend, ids(3, 3))])
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        again.forward(ids(1, 4))


def test_a_slot_is_a_sequence_not_a_second_owner(three):
    owner, slot, _ = three
    assert has(owner, Slots) and not has(slot, Slots)
    assert all(has(slot, c) for c in (TreeForward, HiddenFeatures, LayerExit))
    assert not has(slot, LayerFeatures)
    with pytest.raises(RuntimeError, match="backend that loaded"):
        slot.watch_layers((0,))
    with pytest.raises(ValueError, match="open slots"):
        owner.forward_batch([BatchCall(owner, [5]), BatchCall(object(), [6])])
    with pytest.raises(ValueError, match="at most once"):
        owner.forward_batch([BatchCall(slot, [5]), BatchCall(slot, [6])])
    assert slot.tokens == ids(12, 1)


def test_early_exit_on_a_slot_equals_its_forward(three, solo):
    slot = three[1]
    base = list(slot.tokens)
    draft = ids(3, 60)
    slot.partial_forward(draft, n_layers=1, start=len(base))
    got = slot.forward_from_exit(draft, slot.exit_hidden(), exit_layer=1)
    solo.prefill(base)
    assert_close(got, solo.forward(draft), "early exit on a slot")


def test_the_static_path_opens_slots_too_and_batches_them_as_alone(folder, solo):
    """--compile on with --parallel: each slot a place in the static forward's shared buffer
    (tests/engine/backends/test_static_slots.py has the rest)."""
    backend = TorchBackend(folder, dtype="float32", impl="native", compile="on")
    backend.max_slots = 2
    slot = backend.open_slot()
    assert backend.info.forward.startswith("native forward, static shapes")
    assert type(slot._kv).__name__ == "StaticKVCache" and slot._kv.pool is backend._kv.pool
    backend.forward(ids(6, 0))
    slot.forward(ids(9, 1))
    assert_batch_matches_alone(backend, solo, [BatchCall(backend, ids(1, 2)), BatchCall(slot, ids(4, 3))])
    with pytest.raises(SlotsFull, match="--parallel 2"):
        backend.open_slot()
    backend.close()


def test_bfloat16_batches_run_close_to_alone(folder):
    backend = _load(folder, dtype="bfloat16")
    solo = _load(folder, slots=1, dtype="bfloat16")
    slots = [backend, backend.open_slot(), backend.open_slot()]
    for seed, (slot, n) in enumerate(zip(slots, (7, 12, 3))):
        slot.forward(ids(n, seed))
    calls = _mixed_calls(slots, 70)
    before = [list(call.slot.tokens) for call in calls]
    for call, logits, tokens in zip(calls, backend.forward_batch(calls), before):
        want, _ = run_alone(solo, call, tokens)
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
        scale = want.abs().max().item()
        assert (logits - want).abs().max().item() <= 0.05 * scale  # bfloat16 rounding, in other matmul shapes
    backend.close()
    solo.close()


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory) -> str:
    """A smaller model of another seed on the same tokenizer: a draft model for `folder`."""
    return make_tiny_model(tmp_path_factory.mktemp("slots") / "draft", "qwen3", seed=6, n_layers=1, n_kv_heads=1)


@pytest.mark.parametrize("drafter", ["ngram", "lookahead", "draft model"])
def test_requests_decoded_together_reply_as_each_would_alone(folder, draft_folder, solo, drafter, monkeypatch):
    """The batched decode step (engine/core/batch.py) on the native backend: chains (n-gram drafts),
    masked windows (lookahead), and a draft model whose slots draft together too; each sequence's
    greedy reply is the one it gives alone."""
    jobs = [(ids(8, 1) * 2, 20), (ids(5, 2), 14), (ids(12, 3), 26)]
    draft = _load(draft_folder) if drafter == "draft model" else None
    batched: dict[str, list[int]] = {"target": [], "draft": []}  # calls per forward_batch of each

    def make(backend, i: int | None = None):  # i: the sequence's place in the batch, None alone
        if drafter == "ngram":
            return NgramDrafter()
        if drafter == "lookahead":
            return LookaheadDrafter(backend)
        if i is None:
            draft.rollback(0)
            return ModelDrafter(draft, backend.vocab_size)
        return ModelDrafter(draft if i == 0 else draft.open_slot(), backend.vocab_size, owner=draft)

    alone = []
    for prompt, n in jobs:
        solo.rollback(0)
        events = decode_steps(solo, prompt, _greedy(n), drafter=make(solo), draft_length=DraftLength(3))
        alone.append(collect(list(events)).tokens)
    target = _load(folder)
    for role, backend in (("target", target), ("draft", draft)):
        if backend is not None:
            monkeypatch.setattr(backend, "forward_batch", _counting(backend.forward_batch, batched[role]))
    batch = Batch(target, CostModel(), capacity=len(jobs))
    sequences = [
        batch.join(p, _greedy(n), drafter=make(target, i), draft_length=DraftLength(3)) for i, (p, n) in enumerate(jobs)
    ]
    events = {id(s): [] for s in sequences}
    while batch.sequences:
        for sequence, outcome in batch.step():
            assert not isinstance(outcome, BaseException), outcome
            events[id(sequence)].append(outcome)
    assert [collect(events[id(s)]).tokens for s in sequences] == alone
    assert max(batched["target"]) == len(jobs)  # one forward carried all three sequences' rows
    if draft is not None:
        assert max(batched["draft"]) == len(jobs)  # and one draft forward all three drafts' positions
    batch.close()
    target.close()
    if draft is not None:
        draft.close()


def _greedy(n: int) -> SamplingConfig:
    return SamplingConfig(temperature=0.0, max_tokens=n)


def _counting(forward_batch, sizes: list[int]):
    def counted(calls):
        sizes.append(len(calls))
        return forward_batch(calls)

    return counted
