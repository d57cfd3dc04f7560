"""The crash guarantee: a writer killed with SIGKILL at any moment loses nothing it had acknowledged."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from app.chat.conversations import ConversationStore

KILLS = 24
ROOT = Path(__file__).resolve().parents[3]


def acknowledged(output: str) -> dict:
    """What the writer said it had saved: per conversation, per message, the last thing acknowledged."""
    saved: dict = {}
    for line in output.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("user", "tokens", "end", "rename") or len(parts) < 3:
            continue  # the last line may be cut by the kill: it was not acknowledged yet
        kind, conversation = parts[0], saved.setdefault(parts[1], {"messages": {}, "title": None})
        if kind == "rename":
            conversation["title"] = parts[2].replace("_", " ")
        elif kind == "user" and len(parts) == 4:
            conversation["messages"][int(parts[2])] = ("user", parts[3].replace("_", " "))
        elif kind == "tokens" and len(parts) == 4:
            conversation["messages"][int(parts[2])] = ("tokens", int(parts[3]))
        elif kind == "end":
            conversation["messages"][int(parts[2])] = ("end", None)
    return saved


def check(store: ConversationStore, saved: dict) -> None:
    for conversation_id, expected in saved.items():
        conversation = store.load(conversation_id)
        assert conversation is not None, f"conversation {conversation_id} was acknowledged and is gone"
        if expected["title"]:
            assert conversation.title == expected["title"]
        for position, (kind, value) in expected["messages"].items():
            message = conversation.messages[position]
            if kind == "user":
                assert (message.role, message.content) == ("user", value)
            elif kind == "tokens":
                assert len(message.tokens) >= value, f"{value} tokens acknowledged, {len(message.tokens)} kept"
            else:
                assert message.finish_reason == "stop"


def test_kill_9_at_random_moments_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(1234)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    total: dict = {}
    for seed in range(KILLS):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.app.chat.store_writer", str(tmp_path), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=environment,
        )
        assert writer.stdout.readline(), writer.stderr.read()  # it has started writing
        time.sleep(rng.uniform(0.0, 0.4))
        writer.send_signal(signal.SIGKILL)
        output, _ = writer.communicate(timeout=30)
        assert writer.returncode == -signal.SIGKILL
        total.update(acknowledged(output))

        store = ConversationStore(tmp_path)  # opens after every kill, WAL recovered
        check(store, total)
        store.close()

    assert len(total) >= KILLS
    database = sqlite3.connect(tmp_path / "conversations.db")
    assert database.execute("PRAGMA integrity_check").fetchone() == ("ok",)
