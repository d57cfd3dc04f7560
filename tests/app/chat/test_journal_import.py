"""The one-time import of the JSON-lines journals earlier versions wrote, with every kind of damage they can hold."""

from __future__ import annotations

import json

from app.chat.conversations import ConversationStore
from app.chat.journals import IMPORTED_FOLDER
from engine.core.events import Source
from tests.disks import make_read_only, make_writable, small_disk


def line(record: dict) -> bytes:
    """A record as the old writer wrote it: compact JSON, UTF-8, one line."""
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def journal(folder, conversation_id="c0ffee", title="Café chat", lines=()):
    """A journal as the old store wrote it; `lines` are the records after the header (bytes or dicts)."""
    header = {"type": "conversation", "version": 1, "id": conversation_id, "title": title, "created": 100.0}
    data = line(header) + b"".join(item if isinstance(item, bytes) else line(item) for item in lines)
    path = folder / f"{conversation_id}.jsonl"
    path.write_bytes(data)
    return path


USER = {"type": "user", "content": "Où est le café ? 東京 ☕", "at": 101.0}
REPLY = {"type": "reply", "at": 102.0}
TOKENS = {"type": "tokens", "tokens": [[1, "Au ", "p", 0.9, None], [2, "coin ☕", "a", 0.7, 0.8]], "at": 103.0}
END = {"type": "end", "finish_reason": "stop", "stats": {"tokens": 2}, "at": 104.0}


def test_a_healthy_journal_comes_across_whole_and_is_moved_aside(tmp_path):
    path = journal(tmp_path, lines=[USER, REPLY, TOKENS, END, {"type": "rename", "title": "Renamed", "at": 105.0}])

    store = ConversationStore(tmp_path)

    [summary] = store.list()
    assert (summary.id, summary.title, summary.created, summary.updated) == ("c0ffee", "Renamed", 100.0, 105.0)
    conversation = store.load("c0ffee")
    assert [(m.role, m.content, m.finish_reason) for m in conversation.messages] == [
        ("user", "Où est le café ? 東京 ☕", None),
        ("assistant", "Au coin ☕", "stop"),
    ]
    assert [(t.source, t.q) for t in conversation.messages[1].tokens] == [(Source.PLAIN, None), (Source.ACCEPTED, 0.8)]
    assert conversation.skipped == 0
    assert not path.exists() and (tmp_path / IMPORTED_FOLDER / path.name).exists()  # kept, out of the way
    assert store.notices == [
        f"Imported 1 conversation from the old journal files (now in {tmp_path / IMPORTED_FOLDER})."
    ]
    assert ConversationStore(tmp_path).notices == []  # once


def test_a_torn_last_line_does_not_swallow_the_message_written_after_it(tmp_path):
    # A crash mid-write left half a tokens record; the old writer then appended the user's
    # next message straight after it, on the same line.
    torn = line(TOKENS)[:40]
    journal(
        tmp_path, lines=[USER, REPLY, torn + line({"type": "user", "content": "Are you still there?", "at": 110.0})]
    )

    conversation = ConversationStore(tmp_path).load("c0ffee")

    assert [(m.role, m.content) for m in conversation.messages] == [
        ("user", "Où est le café ? 東京 ☕"),
        ("assistant", ""),
        ("user", "Are you still there?"),
    ]
    assert conversation.skipped == 1


def test_bad_bytes_cost_only_their_own_line_and_are_counted(tmp_path):
    tear = line(TOKENS)[: line(TOKENS).index("☕".encode()) + 1]  # cut inside a three-byte character
    stray = line({"type": "user", "content": "second question", "at": 120.0}).replace(b"second", b"sec\xff\xfeond")
    journal(tmp_path, lines=[USER, REPLY, tear + b"\n", stray, REPLY, TOKENS, END])

    store = ConversationStore(tmp_path)

    assert [c.id for c in store.list()] == ["c0ffee"]
    conversation = store.load("c0ffee")
    assert [m.content for m in conversation.messages] == [
        "Où est le café ? 東京 ☕",
        "",
        "sec\ufffd\ufffdond question",
        "Au coin ☕",
    ]
    assert conversation.skipped == 1
    assert "1 damaged record in 1 of them could not be read and was skipped" in store.notices[0]


def test_records_of_the_wrong_shape_are_skipped_and_the_rest_imported(tmp_path):
    bad_rows = {"type": "tokens", "tokens": [[1, "fine", "p", 0.5, None], [2, "no source"], "x", [3, 4, "p", 2, None]]}
    journal(tmp_path, lines=[b"42\n", b"null\n", b'"text"\n', USER, REPLY, bad_rows, {"type": "unknown"}, END])
    no_id = tmp_path / "d00d.jsonl"
    no_id.write_bytes(line({"type": "conversation", "title": "No id"}) + line(USER))

    store = ConversationStore(tmp_path)

    assert sorted(c.title for c in store.list()) == ["Café chat", "No id"]
    conversation = store.load("c0ffee")
    assert [m.content for m in conversation.messages] == ["Où est le café ? 東京 ☕", "fine"]
    assert conversation.skipped == 7  # 42, null, "text", three bad token rows, the unknown record
    assert store.load("d00d").messages[0].content == "Où est le café ? 東京 ☕"  # the file name stands in for the id


def test_journals_with_nothing_readable_are_moved_aside_and_named_and_other_files_left_alone(tmp_path):
    (tmp_path / "torn.jsonl").write_bytes(line({"type": "conversation", "id": "torn"})[:30])  # its header, cut
    (tmp_path / "garbage.jsonl").write_bytes(b"\xff\xfe not json at all")  # not ours: left as it is
    (tmp_path / "empty.jsonl").write_bytes(b"")
    journal(tmp_path, lines=[USER])

    store = ConversationStore(tmp_path)

    assert [c.id for c in store.list()] == ["c0ffee"]
    assert "Nothing could be read from torn.jsonl" in store.notices[1]
    assert sorted(p.name for p in (tmp_path / IMPORTED_FOLDER).iterdir()) == ["c0ffee.jsonl", "torn.jsonl"]
    assert (tmp_path / "garbage.jsonl").exists() and (tmp_path / "empty.jsonl").exists()


def test_temporary_files_of_killed_compactions_are_cleaned(tmp_path):
    journal(tmp_path, lines=[USER])
    (tmp_path / ".c0ffee.k2j3l4.tmp").write_bytes(line(USER)[:10])

    ConversationStore(tmp_path)

    assert not list(tmp_path.glob(".*.tmp"))


def test_journals_on_a_read_only_disk_stay_where_they_are_until_they_can_be_imported(tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        ConversationStore(disk).close()  # an existing database (opened read-only below)
        journal(disk, lines=[USER, REPLY, TOKENS, END])
        make_read_only(disk)
        try:
            store = ConversationStore(disk)
            assert store.list() == []
            assert any("could not be imported yet" in notice for notice in store.notices)
            assert (disk / "c0ffee.jsonl").exists()
            store.close()
        finally:
            make_writable(disk)

        store = ConversationStore(disk)
        assert [c.id for c in store.list()] == ["c0ffee"]
        assert not (disk / "c0ffee.jsonl").exists()
