"""The conversation store: an SQLite database that survives restarts, kills, full and read-only disks."""

from __future__ import annotations

import sqlite3

import pytest

from app.chat.conversations import ConversationStore, StoreError, export_markdown
from engine.core.events import Source, TokenInfo
from tests.disks import fill, make_read_only, make_writable, small_disk


def tokens(*pieces: tuple[str, Source]) -> tuple[TokenInfo, ...]:
    return tuple(
        TokenInfo(i, text, source, 0.5, 0.8 if source is Source.ACCEPTED else None)
        for i, (text, source) in enumerate(pieces)
    )


def chat(store: ConversationStore, question="Hi?", reply=(("Hel", Source.PLAIN), ("lo", Source.ACCEPTED))):
    conversation = store.create("Greeting")
    store.add_user_message(conversation, question)
    store.begin_reply(conversation)
    store.add_reply_tokens(conversation, tokens(*reply))
    store.end_reply(conversation, "stop", {"tokens": 2})
    return conversation


def shown(conversation) -> list[tuple]:
    return [(m.role, m.content, m.finish_reason) for m in conversation.messages]


def test_a_conversation_comes_back_from_a_new_store(tmp_path):
    conversation = chat(ConversationStore(tmp_path))

    again = ConversationStore(tmp_path).load(conversation.id)

    assert again.title == "Greeting"
    assert [(m.role, m.content) for m in again.messages] == [("user", "Hi?"), ("assistant", "Hello")]
    assert [t.source for t in again.messages[1].tokens] == [Source.PLAIN, Source.ACCEPTED]
    assert again.messages[1].tokens[1].q == pytest.approx(0.8)
    assert again.messages[1].finish_reason == "stop"
    assert again.messages[1].stats == {"tokens": 2}


def test_a_reply_cut_before_its_end_keeps_every_token_written(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = store.create()
    store.add_user_message(conversation, "Count")
    store.begin_reply(conversation)
    store.add_reply_tokens(conversation, tokens(("one", Source.PLAIN)))
    store.add_reply_tokens(conversation, tokens((" two", Source.BONUS)))
    # The process dies here, without end_reply.

    again = ConversationStore(tmp_path).load(conversation.id)

    assert again.messages[-1].content == "one two"
    assert again.messages[-1].finish_reason is None  # shown as interrupted, not lost


def test_list_is_most_recent_first_and_delete_removes(tmp_path):
    store = ConversationStore(tmp_path)
    older, newer = chat(store), chat(store)
    store.rename(older, "Touched last")

    assert [(c.id, c.title) for c in store.list()] == [(older.id, "Touched last"), (newer.id, "Greeting")]
    store.delete(older.id)
    assert [c.id for c in store.list()] == [newer.id]
    assert store.load(older.id) is None


def test_listing_reads_no_messages_or_tokens(tmp_path):
    store = ConversationStore(tmp_path)
    for _ in range(3):
        chat(store)
    statements = []
    store._db.set_trace_callback(statements.append)

    listed = store.list()

    assert len(listed) == 3 and statements
    assert not [s for s in statements if "tokens" in s or "messages" in s]


def test_ids_that_are_not_ids_find_nothing(tmp_path):
    store = ConversationStore(tmp_path)
    chat(store)

    assert store.load("../../etc/passwd") is None
    assert store.load("") is None
    store.delete("../../etc/passwd")  # nothing to delete, nothing raised
    assert len(store.list()) == 1


def test_writes_to_a_deleted_conversation_go_nowhere(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = store.create()
    store.add_user_message(conversation, "Long answer please")
    store.begin_reply(conversation)
    store.delete(conversation.id)

    store.add_reply_tokens(conversation, tokens(("late", Source.PLAIN)))
    store.end_reply(conversation, "stop")

    assert store.list() == [] and store.load(conversation.id) is None


def test_empty_replies_are_not_sent_back_to_the_model(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = store.create()
    store.add_user_message(conversation, "First")
    store.begin_reply(conversation)
    store.end_reply(conversation, "cancelled")  # stopped before the first token
    store.add_user_message(conversation, "Second")

    assert conversation.chat_messages() == [{"role": "user", "content": "First"}, {"role": "user", "content": "Second"}]


def test_markdown_export_keeps_code_blocks_and_marks_stopped_replies(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = store.create("Code")
    store.add_user_message(conversation, "Add?")
    store.begin_reply(conversation)
    store.add_reply_tokens(conversation, tokens(("```python\n", Source.PLAIN), ("x = 1 + 2\n```", Source.ACCEPTED)))
    store.end_reply(conversation, "cancelled")

    text = export_markdown(conversation)

    assert text.startswith("# Code\n")
    assert "## You\n\nAdd?" in text
    assert "## Assistant\n\n```python\nx = 1 + 2\n```\n\n*(stopped)*" in text


def test_an_in_memory_store_works_and_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = ConversationStore.in_memory()
    conversation = chat(store)

    assert store.load(conversation.id).messages[1].content == "Hello"
    assert list(tmp_path.iterdir()) == []


# -- damaged files -----------------------------------------------------------------------


def test_an_unreadable_database_is_kept_aside_and_a_new_one_started(tmp_path):
    (tmp_path / "conversations.db").write_bytes(b"this is not an SQLite database, just bytes" * 100)

    store = ConversationStore(tmp_path)

    assert store.list() == []
    kept = list(tmp_path.glob("conversations.unreadable-*.db"))
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"this is not")
    assert len(store.notices) == 1 and kept[0].name in store.notices[0] and "new, empty one" in store.notices[0]
    chat(store)  # and the new one works
    assert len(ConversationStore(tmp_path).list()) == 1


def test_a_database_from_a_newer_version_is_refused_with_what_to_do(tmp_path):
    db = sqlite3.connect(tmp_path / "conversations.db")
    db.execute("PRAGMA user_version = 99")
    db.close()

    with pytest.raises(StoreError, match="newer SpecDeck.*Update SpecDeck"):
        ConversationStore(tmp_path)


# -- full and read-only disks ------------------------------------------------------------


def test_a_full_disk_keeps_the_reply_in_memory_and_saves_it_once_there_is_room(tmp_path):
    with small_disk(tmp_path / "disk", size_kib=512) as disk:
        store = ConversationStore(disk)
        conversation = store.create("Story")
        store.add_user_message(conversation, "Tell me a story")
        store.begin_reply(conversation)
        store.add_reply_tokens(conversation, tokens(("Once", Source.PLAIN)))
        filler = fill(disk)

        failures = []
        for step in range(200):  # tokens go on arriving while the disk is full
            try:
                store.add_reply_tokens(conversation, tokens((f" w{step}", Source.ACCEPTED)))
            except StoreError as error:
                failures.append(str(error))
        assert failures, "the disk never filled up"
        assert "the disk is full" in failures[-1] and "Free some space" in failures[-1]
        assert conversation.messages[-1].content.endswith(" w199")  # the reply stays whole in memory
        assert store.unsaved(conversation)

        filler.unlink()
        store.end_reply(conversation, "stop")

        assert not store.unsaved(conversation)
        again = ConversationStore(disk).load(conversation.id)
        assert shown(again) == shown(conversation)
        assert len(again.messages[-1].tokens) == 201
        assert sqlite3.connect(disk / "conversations.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_read_only_folder_shows_its_chats_and_refuses_new_messages_without_losing_them(tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        store = ConversationStore(disk)
        conversation = chat(store)
        store.close()
        make_read_only(disk)
        try:
            store = ConversationStore(disk)
            assert [c.title for c in store.list()] == ["Greeting"]
            assert "read-only" in store.notices[0]
            conversation = store.load(conversation.id)
            with pytest.raises(StoreError, match="read-only.*SPECDECK_DATA_DIR"):
                store.add_user_message(conversation, "Are you there?")
            assert [m.content for m in conversation.messages] == ["Hi?", "Hello"]  # sending again adds it once
            store.close()
        finally:
            make_writable(disk)
        store = ConversationStore(disk)
        store.add_user_message(conversation, "Are you there?")
        assert [m.content for m in ConversationStore(disk).load(conversation.id).messages] == [
            "Hi?",
            "Hello",
            "Are you there?",
        ]


def test_a_folder_that_cannot_be_created_says_so(tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        make_read_only(disk)
        try:
            with pytest.raises(StoreError, match=r"cannot be created: read-only file system.*SPECDECK_DATA_DIR"):
                ConversationStore(disk / "SpecDeck" / "conversations")
        finally:
            make_writable(disk)


# -- system prompts, editing and regenerating ----------------------------------------------


def test_a_system_prompt_is_saved_and_sent_first(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = store.create("Pirate", system_prompt="Answer like a pirate.")
    store.add_user_message(conversation, "Hello")
    store.set_system_prompt(conversation, "Answer like a pirate, briefly.")

    again = ConversationStore(tmp_path).load(conversation.id)

    assert again.chat_messages() == [
        {"role": "system", "content": "Answer like a pirate, briefly."},
        {"role": "user", "content": "Hello"},
    ]


def test_truncating_drops_a_message_and_everything_after_it_for_good(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = chat(store, question="First?")
    store.add_user_message(conversation, "Second?")
    store.begin_reply(conversation)
    store.add_reply_tokens(conversation, tokens(("Two", Source.PLAIN)))
    store.end_reply(conversation, "stop")

    store.truncate(conversation, 2)  # edit "Second?" and send it again
    store.add_user_message(conversation, "Second, edited?")

    again = ConversationStore(tmp_path).load(conversation.id)
    assert [m.content for m in again.messages] == ["First?", "Hello", "Second, edited?"]
    assert again.messages[1].tokens[1].source is Source.ACCEPTED  # what stays keeps its provenance
