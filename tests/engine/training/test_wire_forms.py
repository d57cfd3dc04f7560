"""Training records as JSON and back: the progress the engine server streams, the result and a saved run's
summary must come back equal, and the app must be able to hold them without loading torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from engine.training import CheckpointInfo, TrainProgress, TrainResult, TrainSettings, checkpoint_info, train_heads
from tests.factories.hf_models import make_tiny_llama

ROOT = Path(__file__).resolve().parents[3]
TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 60
FAST = dict(batch_size=2, seq_len=32, lr=3e-2, checkpoint_every=2, val_windows=2)


def through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real tiny run (features: data, load, cache, train, checkpoint, validate, done) and a cancelled one."""
    root = tmp_path_factory.mktemp("wire")
    tiny = make_tiny_llama(root / "tiny-llama", seed=0)
    data = root / "fox.txt"
    data.write_text(TEXT, encoding="utf-8")
    events = []
    result = train_heads(
        TrainSettings.of(tiny, str(data), steps=4, num_heads=2, **FAST), root / "heads", progress=events.append
    )

    cancel = threading.Event()
    cut_events = []

    def stop_at_two(event):
        cut_events.append(event)
        if event.phase == "train" and event.step == 2:
            cancel.set()

    cut = train_heads(
        TrainSettings.of(tiny, str(data), steps=6, num_heads=2, objective="kl", **FAST),
        root / "cut",
        progress=stop_at_two,
        cancel=cancel,
    )
    return {"root": root, "result": result, "events": events, "cut": cut, "cut_events": cut_events}


def test_every_progress_event_of_a_real_run_comes_back_equal(run):
    events = run["events"] + run["cut_events"]
    phases = {e.phase for e in events}
    assert {"data", "load", "cache", "train", "checkpoint", "validate", "done", "cancelled"} <= phases
    train = next(e for e in events if e.phase == "train")
    assert len(train.head_accuracy) == 2 and train.loss is not None and train.eta_s is not None

    back = [TrainProgress.from_dict(through_json(e.to_dict())) for e in events]

    assert back == events
    assert all(isinstance(e.head_loss, tuple) and isinstance(e.head_accuracy, tuple) for e in back)
    assert [e.fraction for e in back] == [e.fraction for e in events]


def test_a_finished_and_a_cancelled_result_come_back_equal(run):
    result, cut = run["result"], run["cut"]
    assert not result.cancelled and len(result.head_accuracy) == 2 and result.training["finished"] is True
    assert cut.cancelled and cut.step == 2
    for value in (result, cut):
        back = TrainResult.from_dict(through_json(value.to_dict()))
        assert back == value and isinstance(back.head_loss, tuple)


def test_a_saved_runs_summary_comes_back_equal(run):
    for folder, step, finished in (("heads", 4, True), ("cut", 2, False)):
        info = checkpoint_info(run["root"] / folder)
        assert (info.step, info.finished) == (step, finished) and isinstance(info.settings["data"], tuple)
        assert CheckpointInfo.from_dict(through_json(info.to_dict())) == info


def test_training_settings_come_back_equal(run):
    for settings in (
        TrainSettings(target="default", data=("builtin",)),
        TrainSettings(
            target="default",
            data=("a.txt", "b/"),
            self_generate=3,
            kind="eagle",
            val_windows=None,
            lr=3e-4,
            draft_vocab=0,
        ),
    ):
        back = TrainSettings.from_dict(through_json(settings.to_dict()))
        assert back == settings and isinstance(back.data, tuple)
    saved = checkpoint_info(run["root"] / "heads").settings  # what a run saves is a TrainSettings
    assert TrainSettings.from_dict(saved).to_dict() == through_json(saved)


# Every name app/training imports from `engine` today that it keeps, and the records it will rebuild.
APP_NAMES = (
    "ConfigError",
    "SpecDeckError",
    "list_models",
    "resolve",
    "CheckpointInfo",
    "TrainProgress",
    "TrainResult",
    "TrainSettings",
)


def test_the_app_holds_training_records_without_loading_torch(run, tmp_path):
    """In a fresh interpreter (this one has torch loaded): import the names and rebuild the real run's records
    from their JSON; torch, llama.cpp and transformers stay out."""
    payload = tmp_path / "payload.json"
    payload.write_text(
        json.dumps(
            {
                "events": [e.to_dict() for e in run["events"]],
                "result": run["result"].to_dict(),
                "saved": checkpoint_info(run["root"] / "heads").to_dict(),
            }
        )
    )
    script = textwrap.dedent(f"""
        import json, sys
        from engine import {", ".join(APP_NAMES)}
        data = json.load(open({str(payload)!r}))
        events = [TrainProgress.from_dict(e) for e in data["events"]]
        result = TrainResult.from_dict(data["result"])
        saved = CheckpointInfo.from_dict(data["saved"])
        TrainSettings.from_dict(saved.settings).check()
        print(json.dumps({{"heavy": [m for m in ("torch", "llama_cpp", "transformers") if m in sys.modules],
                           "events": len(events), "step": result.step, "saved": saved.step}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"heavy": [], "events": len(run["events"]), "step": 4, "saved": 4}
