"""A conversations.db damaged from outside: every chat that can be read still shows, the user is told what
was skipped and why, and a salvage copies the readable rows without losing the damaged file."""

from __future__ import annotations

import sqlite3
import time

import pytest
from PySide6.QtCore import QSettings

from app.chat.conversations import ConversationStore, StoreError
from app.chat.journals import IMPORTED_FOLDER
from app.shell import settings as keys
from engine import Source, TokenInfo
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG
PAGE = 4096  # SQLite's default page size, the store's


def make_chats(folder, count: int) -> list[str]:
    """`count` chats named "Chat 000", "Chat 001"…, each a question and a finished reply; their ids."""
    store = ConversationStore(folder)
    ids = []
    for i in range(count):
        conversation = store.create(f"Chat {i:03d}")
        store.add_user_message(conversation, f"Question {i}?")
        store.begin_reply(conversation)
        store.add_reply_tokens(conversation, (TokenInfo(1, f"Answer {i}.", Source.PLAIN, 0.5, None),))
        store.end_reply(conversation, "stop", {"tokens": 1})
        ids.append(conversation.id)
    store.close()  # checkpoints the WAL: every row is in conversations.db itself
    return ids


def damage(folder, sql: str, *parameters) -> None:
    """Change the database as another program (or a hand edit) could, behind the store's back."""
    db = sqlite3.connect(folder / "conversations.db")
    db.execute(sql, parameters)
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def zero_page_holding(folder, text: bytes) -> None:
    """Overwrite with zeros the 4 KB page of conversations.db that holds `text` (as a bad sector would)."""
    path = folder / "conversations.db"
    data = bytearray(path.read_bytes())
    page = data.index(text) // PAGE
    assert 2 < page < len(data) // PAGE - 2, "not a page in the middle"
    data[page * PAGE : (page + 1) * PAGE] = bytes(PAGE)
    path.write_bytes(data)


def notices(store: ConversationStore) -> str:
    return " ".join(store.notices)


# -- 9: a row of the wrong type ------------------------------------------------------------


def test_a_row_of_the_wrong_type_is_skipped_and_named_and_the_others_listed(tmp_path):
    ids = make_chats(tmp_path, 4)
    damage(tmp_path, "UPDATE conversations SET title = X'80FF' WHERE id = ?", ids[1])
    damage(tmp_path, "UPDATE conversations SET updated = 'yesterday' WHERE id = ?", ids[2])

    store = ConversationStore(tmp_path)

    assert [c.title for c in store.list()] == ["Chat 003", "Chat 000"]
    said = notices(store)
    assert ids[1] in said and "title is 2 bytes of binary data, not text" in said
    assert "“Chat 002”" in said and "last-change time is the text “yesterday”" in said
    assert store.load(ids[1]) is None and store.load(ids[3]).title == "Chat 003"


def test_statistics_that_are_not_json_cost_only_the_statistics(tmp_path):
    [chat] = make_chats(tmp_path, 1)
    damage(tmp_path, "UPDATE messages SET stats = '{not json' WHERE role = 'assistant'")

    store = ConversationStore(tmp_path)
    conversation = store.load(chat)

    assert [m.content for m in conversation.messages] == ["Question 0?", "Answer 0."]
    assert conversation.messages[1].stats is None
    assert "“Chat 000”" in notices(store) and "statistics of message 2 (not valid JSON)" in notices(store)
    store.add_user_message(conversation, "And then?")  # the chat goes on
    assert ConversationStore(tmp_path).load(chat).messages[-1].content == "And then?"


@pytest.mark.parametrize("bad", ["role = 42", "content = X'00FF'", "position = 'first'"])
def test_a_message_row_of_the_wrong_type_is_skipped_and_the_chat_goes_on(tmp_path, bad):
    [chat] = make_chats(tmp_path, 1)
    store = ConversationStore(tmp_path)
    conversation = store.load(chat)
    store.add_user_message(conversation, "Second question?")
    store.close()
    damage(tmp_path, f"UPDATE messages SET {bad} WHERE content = 'Question 0?'")

    store = ConversationStore(tmp_path)
    conversation = store.load(chat)

    assert [m.content for m in conversation.messages] == ["Answer 0.", "Second question?"]
    assert "Some of “Chat 000” could not be read and is left out: a message" in notices(store)
    store.add_user_message(conversation, "Third?")  # a new message does not collide with the skipped row
    store.truncate(conversation, 1)  # "Second question?" edited: the rows after it go, the others stay
    assert [m.content for m in ConversationStore(tmp_path).load(chat).messages] == ["Answer 0."]


def test_the_window_opens_over_wrong_typed_rows_and_says_which_were_skipped(make_window, data_dir):
    ids = make_chats(data_dir, 4)
    damage(data_dir, "UPDATE conversations SET title = X'80FF' WHERE id = ?", ids[0])
    damage(data_dir, "UPDATE conversations SET updated = 'yesterday' WHERE id = ?", ids[1])
    damage(data_dir, "UPDATE messages SET stats = '{not json' WHERE conversation = ? AND role = 'assistant'", ids[3])
    QSettings().setValue(keys.CURRENT_CONVERSATION, ids[3])  # the chat opened last

    window = make_window(load=False)

    assert window.conversation_panel.titles() == ["Chat 003", "Chat 002"]
    assert "Answer 3." in window.chat_view.transcript.toPlainText()
    said = window.banner.text()
    assert "title is 2 bytes of binary data" in said and ids[0] in said
    assert "“Chat 001”" in said and "yesterday" in said
    assert "statistics of message 2" in said


# -- 10: a bad byte, a damaged page -----------------------------------------------------------


def test_a_title_with_a_byte_that_is_not_utf8_costs_a_character_not_the_list(tmp_path):
    ids = make_chats(tmp_path, 3)
    damage(tmp_path, "UPDATE conversations SET title = CAST(X'436166FF' AS TEXT) WHERE id = ?", ids[1])
    damage(tmp_path, "UPDATE messages SET content = CAST(X'4869FE21' AS TEXT) WHERE conversation = ?", ids[1])

    store = ConversationStore(tmp_path)

    assert [c.title for c in store.list()] == ["Chat 002", "Caf\ufffd", "Chat 000"]
    assert store.load(ids[1]).messages[0].content == "Hi\ufffd!"


def test_a_zeroed_page_hides_only_the_chats_on_it_and_the_salvage_keeps_every_other_one(tmp_path):
    make_chats(tmp_path, 300)
    zero_page_holding(tmp_path, b"Chat 150")
    damaged = (tmp_path / "conversations.db").read_bytes()

    store = ConversationStore(tmp_path)
    listed = [c.title for c in store.list()]

    assert "Chat 150" not in listed and 200 < len(listed) < 300  # one page's chats are gone, not all
    assert {"Chat 000", "Chat 299"} <= set(listed)
    assert f"{300 - len(listed)} conversations could not be read" in notices(store)
    assert "File ▸ Salvage conversations" in notices(store)
    assert [m.content for m in store.load(store.list()[0].id).messages] == ["Question 299?", "Answer 299."]

    said = store.salvage()

    assert f"Salvaged {len(listed)} conversations" in said and f"{300 - len(listed)} could not be read" in said
    [kept] = tmp_path.glob("conversations.damaged-*.db")
    assert kept.name in said and kept.read_bytes() == damaged  # the damaged file, as it was
    assert [c.title for c in store.list()] == listed
    store.add_user_message(store.load(store.list()[0].id), "Still here?")  # the new one takes writes
    store.close()
    again = ConversationStore(tmp_path)
    assert [c.title for c in again.list()] == listed and not again.damaged and again.notices == []
    assert sqlite3.connect(tmp_path / "conversations.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_zeroed_page_of_messages_costs_only_the_messages_on_it(tmp_path):
    make_chats(tmp_path, 300)
    zero_page_holding(tmp_path, b"Question 150?")

    store = ConversationStore(tmp_path)
    chats = {c.title: c.id for c in store.list()}
    opened = {title: store.load(chat) for title, chat in chats.items()}

    assert len(chats) == 300  # the list does not read messages
    whole = [title for title, chat in opened.items() if len(chat.messages) == 2]
    assert "Chat 000" in whole and "Chat 299" in whole and 200 < len(whole) < 300
    assert store.damaged and "may be missing messages" in notices(store)
    store.salvage()
    assert [title for title, chat in chats.items() if len(store.load(chat).messages) == 2] == whole


def test_the_window_offers_the_salvage_and_then_shows_the_salvaged_chats(qtbot, make_window, data_dir):
    make_chats(data_dir, 300)
    zero_page_holding(data_dir, b"Chat 150")

    window = make_window(load=False)
    listed = window.conversation_panel.titles()

    assert "Chat 299" in listed and "Chat 150" not in listed
    assert "damaged" in window.banner.text() and window.banner.action_labels() == ["Salvage conversations"]
    assert window.actions.salvage.isEnabled()
    [button] = window.banner._actions
    button.click()
    qtbot.waitUntil(lambda: "Salvaged" in window.banner.text())

    assert "Salvaged" in window.banner.text() and "conversations.damaged-" in window.banner.text()
    assert window.conversation_panel.titles() == listed
    assert len(list(data_dir.glob("conversations.damaged-*.db"))) == 1
    assert not window.actions.salvage.isEnabled()


# -- 11: a lone surrogate, the user's own files, another program's lock -----------------------------


def test_a_lone_surrogate_is_saved_as_the_replacement_character_and_kept_as_saved(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = store.create("Emoji cut in half \ud83d")

    store.add_user_message(conversation, "Look: \ud800!")
    store.begin_reply(conversation)
    store.add_reply_tokens(conversation, (TokenInfo(1, "\udfff", Source.PLAIN, 0.5, None),))
    store.end_reply(conversation, "stop")
    store.rename(conversation, "Joined \ud83d\ude00 pair")

    saved = ConversationStore(tmp_path).load(conversation.id)
    assert [m.content for m in saved.messages] == ["Look: \ufffd!", "\ufffd"]
    assert [m.content for m in conversation.messages] == [m.content for m in saved.messages]  # what the UI keeps
    assert saved.title == conversation.title == "Joined 😀 pair"
    assert not store.unsaved(conversation)


def test_a_message_with_a_lone_surrogate_shows_as_it_was_saved(make_window, monkeypatch):
    window = make_window(load=False)
    monkeypatch.setattr(window.controller, "chat", lambda messages, sampling: None)  # no reply needed

    window.send_message("Look: \ud800!")

    saved = window.store.load(window.chats.conversation.id)
    assert saved.messages[0].content == "Look: \ufffd!"
    assert "Look: \ufffd!" in window.chat_view.transcript.toPlainText()
    assert window.conversation_panel.titles() == ["Look: \ufffd!"]


def test_a_users_own_jsonl_files_are_left_where_they_are(tmp_path):
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"date": "2024-05-01", "text": "buy milk"}\n{"date": "2024-05-02", "text": "call Ana"}\n')
    todo = tmp_path / "todo.jsonl"
    todo.write_text('{"type":"todo","text":"water the plants"}\n')
    scratch = tmp_path / ".notes.backup.tmp"
    scratch.write_text("my scratch file")
    journal = tmp_path / ("a" * 32 + ".jsonl")
    journal.write_text(
        '{"type":"conversation","version":1,"id":"' + "a" * 32 + '","title":"Old chat","created":1.0}\n'
        '{"type":"user","content":"hi","at":2.0}\n'
    )
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in (notes, todo, scratch)}

    store = ConversationStore(tmp_path)

    assert [c.title for c in store.list()] == ["Old chat"]  # the app's own journal is imported
    assert {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in before} == before
    assert sorted(p.name for p in (tmp_path / IMPORTED_FOLDER).iterdir()) == [journal.name]
    assert "notes" not in notices(store) and "todo" not in notices(store)


def test_another_programs_lock_fails_a_write_at_once_and_saving_works_once_it_lets_go(tmp_path):
    [chat] = make_chats(tmp_path, 1)
    store = ConversationStore(tmp_path)
    conversation = store.load(chat)
    other = sqlite3.connect(tmp_path / "conversations.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")

    started = time.monotonic()
    with pytest.raises(StoreError, match="another program holds the database locked.*try again"):
        store.add_user_message(conversation, "Anyone there?")
    waited = time.monotonic() - started

    assert waited < 1.0, f"the window froze for {waited:.1f} s"
    assert [m.content for m in conversation.messages] == ["Question 0?", "Answer 0."]  # back in the composer
    assert [c.title for c in store.list()] == ["Chat 000"]  # reading goes on
    other.execute("ROLLBACK")
    store.add_user_message(conversation, "Anyone there?")
    assert ConversationStore(tmp_path).load(chat).messages[-1].content == "Anyone there?"
