"""float32 weights prepacked for oneDNN (engine/backends/hf/packed.py) against the plain matmul.

What a user must see: the same greedy text, plain and speculative, logits equal up to
float32 rounding through decode, verify blocks, trees and a batch of sequences; a load
line that says which multiply runs; and no packing where it does not pay or would not fit.
What packing changes beyond speed: a row's logits no longer depend on how many rows run
beside it. Speed itself is measured in docs/benchmarks.md, not here.
"""

from __future__ import annotations

import pytest
import torch

from engine.api import collect
from engine.backends.hf.backend import TorchBackend
from engine.backends.hf.packed import PACKED, PackedLinear
from engine.backends.slots import BatchCall
from engine.core.decode import decode_steps
from engine.core.draft_length import DraftLength
from engine.core.sampling import SamplingConfig
from engine.errors import ConfigError
from tests.engine.backends.numerics import assert_close as _close
from tests.engine.backends.numerics import random_ids as _ids
from tests.engine.drafters.build import make_drafter
from tests.factories.hf_models import make_tiny_model

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN: nothing is packed"
)

GREEDY = SamplingConfig(max_tokens=32)
PROMPT = "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese."


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    # Biases on every linear map and untied head: what PackedLinear must carry besides the weight.
    return make_tiny_model(
        tmp_path_factory.mktemp("packed") / "llama", "llama", seed=5, attention_bias=True, mlp_bias=True,
        tie_embeddings=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pair(folder):
    """The same folder with packed weights and with the plain matmul."""
    on = TorchBackend(folder, dtype="float32")
    off = TorchBackend(folder, dtype="float32", prepack="off")
    yield on, off
    on.close()
    off.close()


def test_float32_on_the_cpu_is_packed_and_the_load_line_says_so(pair):
    on, off = pair
    assert on.info.forward == f"native forward, eager, {PACKED}"
    assert off.info.forward == "native forward, eager, prepacking off"
    linears = [on._native.head] + [getattr(b, n) for b in on._native.blocks for n in ("qkv", "o", "gate_up", "down")]
    assert all(isinstance(linear, PackedLinear) for linear in linears)
    assert not any(isinstance(b.qkv, PackedLinear) for b in off._native.blocks)


def test_packed_logits_equal_the_plain_matmul_through_decode_blocks_trees_and_rollback(pair):
    on, off = pair
    for backend in pair:
        backend.rollback(0)

    def script(backend):
        seen = [backend.forward(_ids(40, 0))]  # a prefill
        seen += [backend.forward([t]) for t in _ids(3, 1)]  # one-row steps
        seen.append(backend.forward(_ids(5, 2)))  # a verify block
        backend.rollback(len(backend.tokens) - 4)
        parents = [-1, 0, 0, 1, 2]  # a tree: two branches of two
        seen.append(backend.forward_tree(_ids(5, 3), parents))
        backend.keep_nodes([0, 2, 4])
        seen.append(backend.forward([7]))
        return seen

    for step, (got, want) in enumerate(zip(script(on), script(off), strict=True)):
        _close(got, want, f"call {step}")
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert on.tokens == off.tokens


def test_a_row_gets_the_same_logits_alone_or_with_others_in_its_forward(pair):
    """The first row of a verify block is the row a one-row step would run: with packed weights
    its logits are the same bits (the plain matmul rounds a GEMV and a GEMM differently)."""
    on, _ = pair
    linear = on._native.blocks[0].gate_up
    x = torch.randn(9, linear.weight.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        together = linear(x)
        for rows in (1, 2, 4):
            assert torch.equal(linear(x[:rows]), together[:rows])
        residual = torch.ones(3, together.shape[1])
        assert torch.equal(linear.add(residual, x[:3]), together[:3] + 1)


def test_a_batch_of_sequences_on_packed_weights_equals_each_alone(pair):
    on, off = pair
    on.rollback(0)
    on.max_slots = 2
    slot = on.open_slot()
    try:
        on.forward(_ids(20, 4))
        slot.forward(_ids(9, 5))
        got = on.forward_batch([BatchCall(on, _ids(3, 6)), BatchCall(slot, [11])])
        off.rollback(0)
        off.forward(_ids(20, 4))
        _close(got[0], off.forward(_ids(3, 6)), "the first sequence")
        off.rollback(0)
        off.forward(_ids(9, 5))
        _close(got[1], off.forward([11]), "the second sequence")
    finally:
        slot.close()
        on.max_slots = 1


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_greedy_text_is_the_same_packed_or_not(folder, drafter):
    replies = []
    for prepack in ("auto", "off"):
        backend = TorchBackend(folder, dtype="float32", prepack=prepack)
        try:
            prompt = backend.apply_chat_template([{"role": "user", "content": PROMPT}])
            made = make_drafter(drafter, backend) if drafter else None
            length = DraftLength(4) if made else None
            replies.append(collect(list(decode_steps(backend, prompt, GREEDY, drafter=made, draft_length=length))))
        finally:
            backend.close()
    assert replies[0].tokens == replies[1].tokens
    assert len(replies[0].tokens) == GREEDY.max_tokens


def test_no_packing_where_it_does_not_pay_or_would_not_fit(folder, monkeypatch):
    bf16 = TorchBackend(folder, dtype="bfloat16")
    assert "prepacked" not in bf16.info.forward and "prepacking" not in bf16.info.forward
    assert not isinstance(bf16._native.head, PackedLinear)
    bf16.close()
    int8 = TorchBackend(folder, dtype="int8")
    assert "prepack" not in int8.info.forward
    int8.close()
    # A machine whose memory is nearly full: the copy would take more than half of what is left.
    monkeypatch.setattr("engine.models.doctor.available_memory_bytes", lambda: 1000)
    tight = TorchBackend(folder, dtype="float32")
    assert "not prepacked: the copy" in tight.info.forward and "over half the memory left" in tight.info.forward
    assert not isinstance(tight._native.head, PackedLinear)
    assert tight.forward(_ids(5, 0)).shape[0] == 5  # and it runs, on the plain matmul
    tight.close()


def test_an_unknown_prepack_choice_is_refused_before_loading(folder):
    with pytest.raises(ConfigError, match="prepack.*auto, off"):
        TorchBackend(folder, dtype="float32", prepack="yes")
