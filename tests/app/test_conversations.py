"""The conversation store: journals that survive restarts, kills and torn writes."""

from __future__ import annotations

import json

import pytest

from app.conversations import ConversationStore, export_markdown
from engine.events import Source, TokenInfo


def tokens(*pieces: tuple[str, Source]) -> tuple[TokenInfo, ...]:
    return tuple(TokenInfo(i, text, source, 0.5, 0.8 if source is Source.ACCEPTED else None)
                 for i, (text, source) in enumerate(pieces))  # fmt: skip


def chat(store: ConversationStore, question="Hi?", reply=(("Hel", Source.PLAIN), ("lo", Source.ACCEPTED))):
    conversation = store.create("Greeting")
    store.add_user_message(conversation, question)
    store.begin_reply(conversation)
    store.add_reply_tokens(conversation, tokens(*reply))
    store.end_reply(conversation, "stop", {"tokens": 2})
    return conversation


def test_a_conversation_comes_back_from_a_new_store(tmp_path):
    conversation = chat(ConversationStore(tmp_path))

    again = ConversationStore(tmp_path).load(conversation.id)

    assert again.title == "Greeting"
    assert [(m.role, m.content) for m in again.messages] == [("user", "Hi?"), ("assistant", "Hello")]
    assert [t.source for t in again.messages[1].tokens] == [Source.PLAIN, Source.ACCEPTED]
    assert again.messages[1].tokens[1].q == pytest.approx(0.8)
    assert again.messages[1].finish_reason == "stop"


def test_a_reply_cut_by_a_kill_keeps_every_token_already_written(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = store.create()
    store.add_user_message(conversation, "Count")
    store.begin_reply(conversation)
    store.add_reply_tokens(conversation, tokens(("one", Source.PLAIN)))
    store.add_reply_tokens(conversation, tokens((" two", Source.BONUS)))
    # The process dies here: no end_reply, and a half-written line at the end of the file.
    with open(tmp_path / f"{conversation.id}.jsonl", "a", encoding="utf-8") as journal:
        journal.write('{"type":"tokens","tokens":[[9," thr')

    again = ConversationStore(tmp_path).load(conversation.id)

    assert again.messages[-1].content == "one two"
    assert again.messages[-1].finish_reason is None  # shown as interrupted, not lost


def test_compacting_rewrites_atomically_and_changes_nothing(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = chat(store)
    store.rename(conversation, "Renamed")
    before = store.load(conversation.id)

    store.compact(before)

    after = store.load(conversation.id)
    assert after.title == "Renamed"
    assert [(m.role, m.content, m.finish_reason) for m in after.messages] == [
        (m.role, m.content, m.finish_reason) for m in before.messages
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{conversation.id}.jsonl"]  # no temporary left
    lines = (tmp_path / f"{conversation.id}.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["conversation", "user", "reply", "tokens", "end"]


def test_list_is_most_recent_first_and_delete_removes(tmp_path):
    store = ConversationStore(tmp_path)
    older, newer = chat(store), chat(store)
    store.rename(older, "Touched last")

    assert [c.id for c in store.list()] == [older.id, newer.id]
    store.delete(older.id)
    assert [c.id for c in store.list()] == [newer.id]
    assert store.load(older.id) is None


def test_unreadable_files_are_skipped_not_fatal(tmp_path):
    store = ConversationStore(tmp_path)
    good = chat(store)
    (tmp_path / "garbage.jsonl").write_bytes(b"\xff\xfe not json")
    (tmp_path / "empty.jsonl").write_text("")

    assert [c.id for c in store.list()] == [good.id]


def test_ids_cannot_escape_the_folder(tmp_path):
    with pytest.raises(ValueError):
        ConversationStore(tmp_path).load("../../etc/passwd")


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
