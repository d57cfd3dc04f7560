"""The Gemma 4 assistant: fed as transformers feeds it, drafting losslessly, refused for another model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.api import Engine, EngineConfig
from engine.backends.capabilities import CachedKV, HiddenFeatures, ModelParts
from engine.backends.hf.backend import TorchBackend
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.registry import drafter_spec
from engine.errors import ModelLoadError
from tests.engine.drafters.build import make_drafter
from tests.factories.gemma4_models import make_gemma4_pair
from tests.stats_helpers import first_two_tokens

GREEDY = SamplingConfig(max_tokens=30)
PROMPTS = ["Write a short poem about the sea.", "Repeat after me: the early bird catches the worm."]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(target folder, assistant folder) by the factory's options, made on first use."""
    made = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in made:
            made[key] = make_gemma4_pair(tmp_path_factory.mktemp("gemma4"), seed=1, **options)
        return made[key]

    return get


@pytest.fixture(scope="module")
def loaded(pairs):
    """Loaded targets by the factory's options, closed at the end."""
    backends = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in backends:
            backends[key] = TorchBackend(pairs(**options)[0], dtype="float32")
        return backends[key]

    yield get
    for backend in backends.values():
        backend.close()


def engine_for(backend, k=4, **options) -> Engine:
    drafter = make_drafter("assistant", backend, **options)
    return Engine(backend, drafter, EngineConfig(drafter="assistant", k=k), CostModel())


def test_the_spec_says_what_it_reads_and_that_it_fits_its_own_model_only():
    spec = drafter_spec("assistant")
    assert set(spec.needs) == {HiddenFeatures, ModelParts, CachedKV} and spec.torch_reason
    assert "fits only its own model" in spec.summary and not spec.trees


@pytest.mark.parametrize("window", [4096, 6])
def test_the_first_draft_is_what_the_assistant_gives_with_transformers_own_inputs(pairs, loaded, window):
    """q of d_1 against the assistant run on what transformers' generation hands it: the target's
    shared_kv_states and last hidden state of the prompt, the pending token's embedding, its position.
    With a window of 6 the sliding layer's keys reach past it (the assistant's own mask limits them)."""
    backend = loaded(kind="random", sliding_window=window)
    drafter = make_drafter("assistant", backend)
    prompt = backend.apply_chat_template([{"role": "user", "content": PROMPTS[1]}])
    backend.prefill(prompt[:-1])  # as the decode loop leaves it: all but the pending token
    draft = drafter.propose(prompt, 1, SamplingConfig(temperature=1.0, max_tokens=1), torch.Generator())

    model = backend._model
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt[:-1]]), return_shared_kv_states=True, output_hidden_states=True)
        embed = model.get_input_embeddings()(torch.tensor([prompt[-1:]]))
        reference = drafter.assistant(
            inputs_embeds=torch.cat([embed, out.hidden_states[-1][:, -1:]], dim=-1),
            position_ids=torch.tensor([[len(prompt) - 1]]),
            shared_kv_states=out.shared_kv_states,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        ).logits[0, -1]
    torch.testing.assert_close(draft.q[0], torch.softmax(reference.float(), -1), atol=1e-6, rtol=1e-4)
    backend.rollback(0)


@pytest.mark.parametrize("text_only", [False, True], ids=["gemma4", "gemma4_text"])
def test_float32_greedy_assistant_equals_vanilla_with_drafts_accepted_and_rejected(loaded, text_only):
    backend = loaded(text_only=text_only)
    engine = engine_for(backend)
    drafted = accepted = 0
    for text in PROMPTS:
        comparison = engine.compare(engine.prompt_ids(text), GREEDY)
        assert comparison.identical, comparison.divergence
        drafted += comparison.speculative.stats.drafted
        accepted += comparison.speculative.stats.accepted
    # An assistant that knows the target, where the target's layers leak in: drafts accepted and rejected.
    assert 0.3 < accepted / drafted < 1, (accepted, drafted)


def test_float32_greedy_equals_vanilla_with_the_ordered_head_and_a_short_window(loaded):
    backend = loaded(kind="random", ordered=True, sliding_window=6)
    engine = engine_for(backend, k=3)
    assert engine.drafter.stats().ordered_head == "yes"
    comparison = engine.compare(engine.prompt_ids(PROMPTS[0]), GREEDY)
    assert comparison.identical, comparison.divergence
    assert comparison.speculative.stats.drafted > 0


def test_sampled_assistant_is_distributed_as_the_target(loaded):
    """The first two tokens after a prompt, sampled with top-k 3, against the target's own p."""
    backend = loaded()
    prompt = backend.apply_chat_template([{"role": "user", "content": "Hi"}])
    pvalue, accepted = first_two_tokens(engine_for(backend, k=3), prompt, top_k=3, draws=200)
    assert accepted > 200 // 4  # q was used, not just drafted and thrown away
    assert pvalue > 1e-3


def _edited(folder, tmp_path, name, change) -> str:
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    change(config)
    (copy / "config.json").write_text(json.dumps(config))
    return str(copy)


def test_an_assistant_for_another_model_is_refused_before_loading_naming_what_differs(pairs, loaded, tmp_path):
    from engine.preflight import preflight
    from tests.factories.hf_models import make_tiny_llama

    target, assistant = pairs()
    backend = loaded()
    wider = _edited(assistant, tmp_path, "wider", lambda c: c.update(backbone_hidden_size=96))
    with pytest.raises(
        ModelLoadError, match=r"another model: the target has hidden size 64 \(the assistant reads .* 96\)"
    ):
        make_drafter("assistant", backend, assistant=wider)

    def other_vocabulary(config):
        config["text_config"]["vocab_size"] = 32000

    other = _edited(assistant, tmp_path, "vocab", other_vocabulary)
    with pytest.raises(ModelLoadError, match=r"vocabulary size 49152 \(the assistant's is 32000\)"):
        make_drafter("assistant", backend, assistant=other)

    llama = make_tiny_llama(tmp_path / "llama", n_layers=2)
    result = preflight(EngineConfig(target=llama, dtype="float32").with_drafter("assistant", assistant=assistant))
    assert not result.compatible
    assert any("the target is llama (model_type differs" in f.detail for f in result.errors)
    ok = preflight(EngineConfig(target=target, dtype="float32").with_drafter("assistant"))  # found beside it
    assert ok.compatible and any("fits this model" in f.title for f in ok.findings)

    # Found beside the target but made for another model; then none beside it at all.
    pair = tmp_path / "pair"
    shutil.copytree(target, pair / "gemma-4-tiny")
    _edited(wider, pair, "gemma-4-tiny-assistant", lambda c: None)
    found = preflight(EngineConfig(target=str(pair / "gemma-4-tiny"), dtype="float32").with_drafter("assistant"))
    assert any("beside gemma-4-tiny: " in f.detail and "hidden size 64" in f.detail for f in found.errors)
    shutil.rmtree(pair / "gemma-4-tiny-assistant")
    alone = preflight(EngineConfig(target=str(pair / "gemma-4-tiny"), dtype="float32").with_drafter("assistant"))
    assert any("give one with --assistant PATH" in f.detail for f in alone.errors)


def test_cli_drafts_with_the_assistant_found_beside_the_target(pairs, capsys):
    from engine.cli.main import main

    target, _ = pairs()
    args = ["generate", "--target", target, "--drafter", "assistant", "--k", "4", "--dtype", "float32"]
    code = main([*args, "--prompt", PROMPTS[0], "--max-tokens", "16", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert 0 < stats["accepted"] <= stats["drafted"]


def test_cli_takes_an_assistant_given_as_the_draft(pairs, capsys):
    """`-md ASSISTANT`, as a llama.cpp user would write it, means the assistant drafter with that
    folder, not a draft model that then fails to load."""
    from engine.cli.main import main

    target, assistant = pairs()
    args = ["generate", "--target", target, "-md", assistant, "--k", "4", "--dtype", "float32"]
    code = main([*args, "--prompt", PROMPTS[0], "--max-tokens", "16", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["stats"]["accepted"] > 0  # a draft model would have failed to load
