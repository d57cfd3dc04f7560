"""Training Medusa heads by self-distillation: it learns, resumes exactly, cancels safely, saves loadable heads."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from engine.errors import ConfigError
from engine.heads.medusa import load_heads, read_config
from engine.training import TrainSettings, checkpoint_info, train_heads
from engine.training.data import Windows, jsonl_document, read_documents, tokenize_documents
from engine.training.loss import SoftCrossEntropy
from tests.factories.hf_models import make_tiny_llama

# A short periodic text: the target's distributions repeat with the text, so what
# it will say k tokens ahead is learnable from the hidden state of the phase.
TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 60
FAST = dict(batch_size=2, seq_len=32, lr=3e-2, checkpoint_every=100, val_windows=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", seed=0)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "fox.txt"
    path.write_text(TEXT, encoding="utf-8")
    return str(path)


def train(tiny, data, out, command=None, resume=True, **options):
    events = []
    settings = TrainSettings.of(tiny, data, **{**FAST, **options})
    result = train_heads(settings, out, resume=resume, command=command, progress=events.append)
    return result, [e for e in events if e.phase == "train"]


def test_training_lowers_the_loss(tiny, text_file, tmp_path):
    result, steps = train(tiny, text_file, tmp_path / "heads", steps=16)
    losses = [e.loss for e in steps]
    assert len(losses) == 16 and not result.cancelled
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.85 * first, losses  # deterministic: fixed model, data order and init
    # Every report carries what the CLI and the app show.
    assert len(steps[-1].head_accuracy) == 4 and steps[-1].tokens_per_s > 0 and steps[-1].eta_s == 0
    assert len(result.head_accuracy) == 4 and all(0 <= a <= 1 for a in result.head_accuracy)


def test_saved_heads_load_and_record_how_they_were_made(tiny, text_file, tmp_path):
    out = tmp_path / "heads"
    result, _ = train(tiny, text_file, out, steps=3, num_heads=3, command="specdeck-cli train-heads ...")
    heads = load_heads(str(out), hidden_size=64, vocab_size=49152)
    assert len(heads.heads) == 3
    assert any(p.abs().sum() > 0 for p in heads.parameters())  # trained: no longer the zero init
    facts = read_config(str(out)).training
    assert facts["steps"] == 3 and facts["finished"] is True
    assert facts["data"] == [text_file] and facts["command"] == "specdeck-cli train-heads ..."
    assert facts["final_loss"] == pytest.approx(result.final_loss, rel=1e-4)
    assert len(facts["validation_head_accuracy"]) == 3
    # The heads are small: no LM head of their own.
    assert read_config(str(out)).shared_lm_head


@pytest.mark.parametrize("objective", ["features", "kl"])
def test_resume_after_cancel_gives_the_uninterrupted_result(tiny, text_file, tmp_path, objective):
    whole, whole_steps = train(tiny, text_file, tmp_path / "whole", steps=8, objective=objective)

    cancel = threading.Event()
    events = []

    def stop_at_four(event):
        events.append(event)
        if event.phase == "train" and event.step == 4:
            cancel.set()

    cut = train_heads(
        TrainSettings.of(tiny, text_file, steps=8, objective=objective, **FAST),
        tmp_path / "cut",
        progress=stop_at_four,
        cancel=cancel,
    )
    assert cut.cancelled and cut.step == 4
    assert events[-1].phase == "cancelled"
    info = checkpoint_info(tmp_path / "cut")  # cancelling saved a checkpoint
    assert info is not None and (info.step, info.steps, info.finished) == (4, 8, False)

    resumed, resumed_steps = train(tiny, text_file, tmp_path / "cut", steps=8, resume=True, objective=objective)
    assert [e.step for e in resumed_steps] == [5, 6, 7, 8]
    assert [e.loss for e in resumed_steps] == [e.loss for e in whole_steps[4:]]
    a = load_heads(str(tmp_path / "whole"), 64, 49152).state_dict()
    b = load_heads(str(tmp_path / "cut"), 64, 49152).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert resumed.head_accuracy == whole.head_accuracy


def test_resume_refuses_other_settings_and_restart_replaces_the_run(tiny, text_file, tmp_path):
    out = tmp_path / "heads"
    train(tiny, text_file, out, steps=2)
    with pytest.raises(ConfigError, match="other settings.*seq_len"):
        train(tiny, text_file, out, steps=4, seq_len=16)
    _, steps = train(tiny, text_file, out, steps=2, seq_len=16, resume=False)
    assert [e.step for e in steps] == [1, 2] and checkpoint_info(out).settings["seq_len"] == 16


def test_a_finished_run_resumed_with_more_steps_continues(tiny, text_file, tmp_path):
    out = tmp_path / "heads"
    train(tiny, text_file, out, steps=2)
    _, steps = train(tiny, text_file, out, steps=3)
    assert [e.step for e in steps] == [3]


def test_bad_data_gives_a_clear_error(tiny, tmp_path):
    with pytest.raises(ConfigError, match="No training data at .*missing.txt"):
        train(tiny, str(tmp_path / "missing.txt"), tmp_path / "heads", steps=1)
    wrong = tmp_path / "weights.bin"
    wrong.write_bytes(b"\0" * 10)
    with pytest.raises(ConfigError, match="not a .txt, .md or .jsonl"):
        train(tiny, str(wrong), tmp_path / "heads", steps=1)
    short = tmp_path / "short.txt"
    short.write_text("Too short.", encoding="utf-8")
    with pytest.raises(ConfigError, match="Not enough training text"):
        train(tiny, str(short), tmp_path / "heads", steps=1)
    with pytest.raises(ConfigError, match="No training data"):
        train(tiny, None, tmp_path / "heads", steps=1)


def test_jsonl_chats_and_folders_are_read(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    lines = [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
        {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]},
        {"text": "Plain text."},
        {"other": 1},
    ]
    (folder / "chats.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n", encoding="utf-8")
    (folder / "notes.md").write_text("# Notes\nSome words.", encoding="utf-8")
    documents = read_documents(folder)
    assert [d.chat() for d in documents[:2]] == [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
    ]
    assert [d.text for d in documents[2:]] == ["Plain text.", "# Notes\nSome words."]
    assert jsonl_document({"prompt": "a", "response": "b"}).chat()[1] == {"role": "assistant", "content": "b"}


def test_windows_hold_out_the_last_and_shuffle_the_rest_by_position():
    windows = Windows(torch.arange(100, dtype=torch.int32), seq_len=10, seed=3, val_windows=2)
    assert (windows.n_train, windows.n_val) == (8, 2)
    epoch = torch.cat([windows.train_batch(i, 1) for i in range(8)])
    assert sorted(epoch[:, 0].tolist()) == list(range(0, 80, 10))  # every training window once per epoch
    assert torch.equal(windows.train_batch(5, 3), Windows(torch.arange(100), 10, 3, 2).train_batch(5, 3))
    assert [b[:, 0].tolist() for b in windows.validation_batches(4)] == [[80, 90]]


def test_soft_cross_entropy_matches_autograd():
    s = torch.randn(3, 5, 11, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(torch.randn(3, 5, 11, dtype=torch.float64), dim=-1)
    expected = -(p * torch.log_softmax(s, dim=-1)).sum()
    (grad_expected,) = torch.autograd.grad(expected, s)
    got = SoftCrossEntropy.apply(s, p)
    (grad_got,) = torch.autograd.grad(got, s)
    assert torch.allclose(got, expected) and torch.allclose(grad_got, grad_expected)


def test_self_generated_replies_are_kept_and_trained_on(tiny, tmp_path):
    out = tmp_path / "heads"
    result, _ = train(tiny, None, out, steps=1, self_generate=3, gen_max_tokens=24, seq_len=8, val_windows=1)
    replies = (out / "training" / "self_generated.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(replies) == 3 and result.training["self_generated"] == 3
    assert json.loads(replies[0])["messages"][0]["role"] == "user"


def test_cancel_while_the_target_writes_replies_keeps_them_for_the_next_start(tiny, tmp_path):
    out = tmp_path / "heads"
    cancel = threading.Event()

    def stop_after_first_reply(event):
        if event.phase == "generate" and event.step == 1:
            cancel.set()

    options = dict(steps=1, self_generate=3, gen_max_tokens=16, seq_len=8, val_windows=1, batch_size=2)
    cut = train_heads(TrainSettings.of(tiny, None, **options), out, progress=stop_after_first_reply, cancel=cancel)
    assert cut.cancelled and cut.step == 0
    replies = out / "training" / "self_generated.jsonl"
    first = replies.read_text(encoding="utf-8").splitlines()
    assert len(first) == 1
    done = train_heads(TrainSettings.of(tiny, None, **options), out)
    lines = replies.read_text(encoding="utf-8").splitlines()
    assert not done.cancelled and len(lines) == 3 and lines[0] == first[0]


def test_cli_trains_and_refuses_to_overwrite_without_resume(tiny, text_file, tmp_path, capsys):
    from engine.cli.main import main

    out = str(tmp_path / "heads")
    args = [
        "train-heads",
        "--target",
        tiny,
        "--data",
        text_file,
        "--out",
        out,
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--log-every",
        "1",
        "--json",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["step"] == 2 and len(report["head_accuracy"]) == 4
    assert "step 2/2  loss" in captured.err
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err
    # Medusa heads cannot be continued as an EAGLE head: the error names the setting that differs.
    assert main([*args, "--kind", "eagle", "--resume"]) == 2
    assert "kind 'medusa' -> 'eagle'" in capsys.readouterr().err


# -- the features objective ----------------------------------------------------------------


def held_out(tiny, text_file, heads_dir=None, num_heads=4):
    """(KL per head, top-1 agreement per head) on FAST's held-out windows; untrained heads when no folder."""
    from engine.heads.medusa import MedusaConfig, MedusaHeads
    from engine.training.loss import distill
    from engine.training.target import load_target

    target = load_target(tiny, device="cpu")
    tokens = tokenize_documents(target, read_documents(text_file))
    windows = Windows(tokens, FAST["seq_len"], 0, FAST["val_windows"])
    if heads_dir is None:
        config = MedusaConfig(num_heads, 1, target.hidden_size, target.vocab_size)
        heads = MedusaHeads(config, target.lm_head)
    else:
        heads = load_heads(str(heads_dir), target.hidden_size, target.vocab_size, target.lm_head)
    kl, accuracy = zip(
        *[distill(heads, target, b, [1.0] * num_heads, train=False) for b in windows.validation_batches(8)]
    )
    return [sum(x) / len(x) for x in zip(*kl)], [sum(x) / len(x) for x in zip(*accuracy)]


def test_features_objective_lowers_the_held_out_kl_and_raises_agreement(tiny, text_file, tmp_path):
    before_kl, before_accuracy = held_out(tiny, text_file)
    result, steps = train(tiny, text_file, tmp_path / "heads", steps=30, objective="features")
    after_kl, after_accuracy = held_out(tiny, text_file, tmp_path / "heads")
    assert list(result.head_loss) == pytest.approx(after_kl)  # the run validates as this measures
    assert all(a < 0.9 * b for a, b in zip(after_kl, before_kl)), (before_kl, after_kl)
    assert sum(after_accuracy) > sum(before_accuracy) + 0.1, (before_accuracy, after_accuracy)
    facts = read_config(str(tmp_path / "heads")).training
    assert facts["objective"] == "features" and facts["epochs"] > 1 and facts["train_tokens_per_s"] > 0
    assert steps[-1].step_s > 0


def test_features_cache_is_reused_on_resume_not_rebuilt(tiny, text_file, tmp_path, monkeypatch):
    from engine.training import features

    out = tmp_path / "heads"
    train(tiny, text_file, out, steps=2)
    cache = out / "training" / features.FEATURES_FILE
    stamp = cache.stat().st_mtime_ns
    builds = []
    original = features.FeatureCache.build
    monkeypatch.setattr(features.FeatureCache, "build", lambda self, *a: builds.append(1) or original(self, *a))
    _, steps = train(tiny, text_file, out, steps=4)
    assert [e.step for e in steps] == [3, 4]
    assert builds == [] and cache.stat().st_mtime_ns == stamp


def test_a_cache_cancelled_half_built_continues_and_gives_the_uninterrupted_result(tiny, text_file, tmp_path):
    from engine.training import features

    whole, _ = train(tiny, text_file, tmp_path / "whole", steps=3)
    cancel = threading.Event()
    events = []

    def stop_after_first_chunk(event):
        events.append(event)
        if event.phase == "cache" and event.step == features.CHUNK_WINDOWS:
            cancel.set()

    cut = train_heads(
        TrainSettings.of(tiny, text_file, steps=3, **FAST),
        tmp_path / "cut",
        progress=stop_after_first_chunk,
        cancel=cancel,
    )
    assert cut.cancelled and cut.step == 0 and events[-1].phase == "cancelled"
    total = [e.steps for e in events if e.phase == "cache"][0]
    assert total > features.CHUNK_WINDOWS  # the corpus needs more than one chunk: the test means something
    resumed_events = []
    resumed = train_heads(
        TrainSettings.of(tiny, text_file, steps=3, **FAST), tmp_path / "cut", progress=resumed_events.append
    )
    cached = [e.step for e in resumed_events if e.phase == "cache"]
    assert cached[0] == features.CHUNK_WINDOWS and cached[-1] == total  # continued, not started over
    a = load_heads(str(tmp_path / "whole"), 64, 49152).state_dict()
    b = load_heads(str(tmp_path / "cut"), 64, 49152).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert resumed.head_accuracy == whole.head_accuracy


def test_bad_objective_options_give_clear_errors(tiny, text_file, tmp_path, capsys):
    from engine.cli.main import main

    with pytest.raises(ConfigError, match="Unknown training objective 'bogus'"):
        train(tiny, text_file, tmp_path / "heads", steps=1, objective="bogus")
    with pytest.raises(ConfigError, match="cached tokens must be 0"):
        train(tiny, text_file, tmp_path / "heads", steps=1, cache_tokens=-1)
    train(tiny, text_file, tmp_path / "heads", steps=1, objective="kl")
    with pytest.raises(ConfigError, match="other settings.*objective 'kl' -> 'features'"):
        train(tiny, text_file, tmp_path / "heads", steps=2, objective="features")
    with pytest.raises(SystemExit):
        main(["train-heads", "--objective", "bogus", "--out", str(tmp_path / "x")])
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
