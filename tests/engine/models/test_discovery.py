"""Drafter discovery: for the embedded SmolLM2-135M, a store with one fitting draft and others that do
not, each left out with its reason in words, on the command line (text and JSON) and from Python."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.models.discovery import Discovery, discover
from tests.factories.discovery_stores import OTHER_BASE, make_drafter_store

SPEEDUP_RATIO_RANGE = "outside what pays (about 8:1 to 70:1)"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict[str, str]:
    return make_drafter_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(autouse=True)
def only_this_store(tmp_path, monkeypatch):
    """No user's models: every store SpecDeck scans is empty, but the packaged models' cache stays."""
    monkeypatch.setenv("SPECDECK_CACHE", os.environ.get("SPECDECK_CACHE") or str(Path.home() / ".cache" / "specdeck"))
    for var, sub in (("HOME", "home"), ("HF_HUB_CACHE", "hub"), ("OLLAMA_MODELS", "ollama"), ("LLAMA_CACHE", "lc")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.delenv("SPECDECK_MODEL_DIRS", raising=False)
    monkeypatch.delenv("SPECDECK_DATA_DIR", raising=False)


def by_name(items) -> dict:
    return {item.name: item for item in items}


def test_the_fitting_draft_is_offered_and_every_other_model_is_left_out_with_its_reason(store):
    found = discover("default", extra_dirs=[Path(store["tiny-draft"]).parents[1]])

    offered = by_name(found.candidates)
    assert offered["tiny-draft"].drafter == "model"
    assert offered["tiny-draft"].spec == store["tiny-draft"]
    assert offered["tiny-draft"].why.startswith(
        "same vocabulary; 42:1 parameters (135M / 3M), in the useful 8:1 to 70:1"
    )
    left = by_name(found.left_out)
    assert left["other-vocab"].reason.startswith(
        "another vocabulary: Token 0 is '<|endoftext|>' in the target but '<s>'"
    )
    assert left["qwen-like"].reason.startswith("another family (qwen2; the target is llama), with another vocabulary")
    assert left["speck"].reason.startswith(f"a parameter ratio of 170.0:1 (135M / 791K), {SPEEDUP_RATIO_RANGE}")
    heads = left["Medusa heads (medusa-qwen)"]
    assert heads.path == store["medusa-qwen"]
    assert heads.reason.startswith(f"Medusa heads made for {OTHER_BASE}: their hidden size 896 (the target's: 576).")
    assert not set(offered) & set(left)


def test_heads_made_for_the_target_and_the_drafters_that_need_no_files_are_offered(store):
    found = discover("default", extra_dirs=[Path(store["tiny-draft"]).parents[1]])

    offered = by_name(found.candidates)
    assert offered["Medusa heads (medusa-smollm2)"].cli == f"--drafter medusa --heads {store['medusa-smollm2']}"
    assert "Medusa heads that ship with SpecDeck" in offered["Medusa heads (medusa-smollm2-135m)"].why
    order = [c.drafter for c in found.candidates]
    assert order.index("ngram") < order.index("suffix")  # n-gram lookup is llama.cpp's default
    assert order.index("model") < order.index("ngram")  # a draft in the useful range before lookup


def test_eagle_3_heads_in_the_hugging_face_cache_are_judged_by_their_shapes(tmp_path):
    from tests.factories.discovery_stores import add_cached_eagle3_head

    hub = tmp_path / "hub"  # the cache the fixture points HF_HUB_CACHE at
    fits = add_cached_eagle3_head(
        hub, "me/eagle3-smollm2", base_model="SmolLM2-135M-Instruct", hidden=576, heads=9, kv_heads=3
    )
    other = add_cached_eagle3_head(
        hub,
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        base_model="meta-llama/Llama-3.1-8B-Instruct",
        hidden=4096,
        heads=32,
        kv_heads=8,
    )

    found = discover("default", models=[])

    head = by_name(found.candidates)["EAGLE-3 head (me/eagle3-smollm2)"]
    assert head.cli == f"--drafter eagle3 --heads {fits}"
    assert head.why.startswith("EAGLE-3 head trained for SmolLM2-135M-Instruct.")
    reason = by_name(found.left_out)["EAGLE-3 head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)"].reason
    assert by_name(found.left_out)["EAGLE-3 head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)"].path == other
    assert reason.startswith(
        "EAGLE-3 head made for meta-llama/Llama-3.1-8B-Instruct: its hidden size 4096 (the target's: 576), "
        "vocabulary size 128256 (the target's: 49152), attention heads 32 (the target's: 9), "
        "key/value heads 8 (the target's: 3)."
    )


def test_a_target_pinned_to_llama_cpp_leaves_out_what_needs_pytorch_and_says_why(store):
    found = discover("default", extra_dirs=[Path(store["tiny-draft"]).parents[1]], backend="llama.cpp")

    assert {c.drafter for c in found.candidates} == {"model", "ngram", "suffix", "lookahead"}  # sequence ids
    early_exit = by_name(found.left_out)["Early exit"]
    assert early_exit.reason.startswith("needs the PyTorch backend: Early exit stops the target's forward")


def test_a_draft_that_does_not_fit_in_the_memory_left_says_how_much_it_needs(store, monkeypatch):
    from engine.models import doctor
    from engine.models.locate import resolve

    monkeypatch.setattr(doctor, "available_memory_bytes", lambda: 64 * 2**20)  # a machine with 64 MiB free
    found = discover("default", models=[resolve(store["tiny-draft"])])

    reason = by_name(found.left_out)["tiny-draft"].reason
    assert reason.startswith("too big for the memory left: Needs about ")
    assert "That is more than 80% of the 64 MiB free now." in reason


def test_cli_says_the_same_in_text_and_json(store, capsys):
    folder = str(Path(store["tiny-draft"]).parents[1])
    assert main(["models", "--drafters-for", "default", "--dir", folder]) == 0
    text = capsys.readouterr().out
    assert "tiny-draft [model]" in text
    assert f"use: --drafter model --draft {store['tiny-draft']}" in text
    assert f"  - speck  {store['speck']}" in text
    assert "another family (qwen2; the target is llama)" in text
    assert f"Medusa heads made for {OTHER_BASE}: their hidden size 896" in text

    assert main(["models", "--drafters-for", "default", "--dir", folder, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    reasons = {x["name"]: x["reason"] for x in data["left_out"]}
    assert reasons["speck"].startswith(f"a parameter ratio of 170.0:1 (135M / 791K), {SPEEDUP_RATIO_RANGE}")
    assert data["candidates"][0]["score"] >= data["candidates"][-1]["score"]
    assert Discovery.from_dict(data) == discover("default", extra_dirs=[folder])


def test_measure_without_a_target_is_refused_with_what_to_add(capsys):
    assert main(["models", "--measure"]) == 2
    assert "add --drafters-for and a target" in capsys.readouterr().err


def test_a_model_with_mtp_layers_offers_them_and_a_copy_saved_without_them_says_so(tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    from tests.factories.mtp_models import make_mtp_model

    with_layers = make_mtp_model(tmp_path / "with-mtp", n_layers=1)
    found = discover(with_layers, models=[])
    mtp = next(c for c in found.candidates if c.kind == "mtp")
    assert mtp.drafter == "mtp" and "the model's own 1 MTP layer(s)" in mtp.why

    stripped = tmp_path / "stripped"  # the same model saved without its MTP layer, as converted copies often are
    shutil.copytree(with_layers, stripped)
    weights = load_file(str(stripped / "model.safetensors"))
    save_file(
        {n: t for n, t in weights.items() if not n.startswith("model.layers.1.")}, str(stripped / "model.safetensors")
    )
    found = discover(stripped, models=[])
    assert not [c for c in found.candidates if c.kind == "mtp"]
    reason = next(x.reason for x in found.left_out if x.kind == "mtp")
    assert "this copy was saved without them" in reason


def test_a_gemma_4_assistant_beside_its_target_is_offered_and_one_for_another_target_says_what_differs(tmp_path):
    import shutil

    from tests.factories.gemma4_models import make_gemma4_pair

    target, assistant = make_gemma4_pair(tmp_path / "pair", seed=1)
    wider = Path(target).parent / "wider-assistant"
    shutil.copytree(assistant, wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "backbone_hidden_size": 96}))

    found = discover(target, models=[])

    offered = next(c for c in found.candidates if c.kind == "assistant")
    assert (offered.drafter, offered.path) == ("assistant", assistant)
    assert offered.cli == f"--drafter assistant --assistant {assistant}"
    reason = next(x.reason for x in found.left_out if x.path == str(wider))
    assert reason.startswith("an assistant for another target: ")
    assert "hidden size 64" in reason and "96" in reason


def test_a_measurement_where_nothing_beats_plain_decoding_says_to_decode_without_a_drafter():
    from engine.models.discovery import Candidate

    def measured(*speedups) -> Discovery:
        ran = tuple(
            Candidate("no files", "ngram", f"n{i}", "", "", 1, speedup=s, tokens_per_s=s)
            for i, s in enumerate(speedups)
        )
        return Discovery("t", "t", "t.gguf", "llama.cpp", ran, (), vanilla_tokens_per_s=1.0, measured_s=1.0)

    assert "decode without a drafter (--drafter none)" in str(measured(0.8, 0.95))
    assert measured(0.8, 1.3).verdict == ""
    assert "decode without" not in str(measured(0.8, 1.3))


def test_a_candidate_that_cannot_run_is_noted_and_the_others_are_still_measured(tmp_path):
    from engine.bench.discovery_measure import measure
    from engine.models.discovery import Candidate

    gone = str(tmp_path / "deleted-since.gguf")
    found = discover("default", models=[], backend="llama.cpp")
    lookup = next(c for c in found.candidates if c.drafter == "ngram")
    missing = Candidate("model", "model", "deleted-since", gone, "", 70, "draft", gone)
    both = Discovery(**{**found.__dict__, "candidates": (missing, lookup)})

    measured = by_name(measure(both, budget_s=0.5).candidates)

    assert measured["deleted-since"].note.startswith(f"could not run: No model '{gone}' on this machine")
    assert measured["deleted-since"].speedup is None
    assert measured[lookup.name].tokens_per_s > 0


def test_a_qwen3_5_checkpoint_offers_its_own_mtp_layers_first(tmp_path):
    """Qwen3.5 / 3.6 ship an MTP layer (`mtp.*` beside the wrapper's language model): discovery
    offers it as the best candidate, with the drafters that need nothing after it."""
    from tests.factories.mtp_models import make_mtp_model

    folder = make_mtp_model(tmp_path / "qwen3.5-tiny", "qwen3_5", n_layers=1)
    found = discover(folder, models=[])
    best = found.candidates[0]
    assert (best.kind, best.drafter) == ("mtp", "mtp") and "MTP layer" in best.why
    assert {"ngram", "suffix"} <= {c.drafter for c in found.candidates}
