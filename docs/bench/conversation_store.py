"""How long the conversation list and opening one chat take, with many long chats.

    python docs/bench/conversation_store.py [--chats 200] [--replies 10] [--tokens 320]

Writes that many chats in the old JSON-lines journal format, times reading them all
(what the old `list()` did on every refresh), imports them into the SQLite store (the
one-time migration), then times `list()` and `load()` on the database. Medians of 5 runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from app.chat.conversations import ConversationStore
from app.chat.journals import read_journal


def write_journals(folder: Path, chats: int, replies: int, tokens: int) -> None:
    def line(record: dict) -> str:
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"

    for c in range(chats):
        lines = [
            line(
                {
                    "type": "conversation",
                    "version": 1,
                    "id": f"chat{c:04d}",
                    "title": f"Chat {c}",
                    "created": 1000.0 + c,
                }
            )
        ]
        for r in range(replies):
            lines.append(line({"type": "user", "content": f"Question {r} of chat {c}", "at": 1000.0 + c}))
            lines.append(line({"type": "reply"}))
            rows = [[i, " word", "apbr"[i % 4], 0.73, 0.81] for i in range(tokens)]
            for start in range(0, tokens, 4):  # one record per decoding step, as the app wrote them
                lines.append(line({"type": "tokens", "tokens": rows[start : start + 4]}))
            lines.append(line({"type": "end", "finish_reason": "stop", "stats": {"tokens": tokens}}))
        (folder / f"chat{c:04d}.jsonl").write_text("".join(lines), encoding="utf-8")


def median_ms(work, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--replies", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=320)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_journals(folder, args.chats, args.replies, args.tokens)
        journals = sorted(folder.glob("*.jsonl"))
        old_list = median_ms(lambda: [read_journal(p) for p in journals], repeat=3)
        start = time.perf_counter()
        store = ConversationStore(folder)
        import_s = time.perf_counter() - start
        listed = store.list()
        assert len(listed) == args.chats, store.notices
        list_ms = median_ms(store.list)
        load_ms = median_ms(lambda: store.load(listed[len(listed) // 2].id))
        size = (folder / "conversations.db").stat().st_size / 2**20
    print(f"{args.chats} chats x {args.replies} replies x {args.tokens} tokens")
    print(f"  journals, reading them all (the old list()): {old_list:9.1f} ms")
    print(f"  one-time import into SQLite:                 {import_s * 1000:9.1f} ms")
    print(f"  SQLite list():                               {list_ms:9.2f} ms")
    print(f"  SQLite load() of one chat:                   {load_ms:9.2f} ms")
    print(f"  database size:                               {size:9.1f} MiB")


if __name__ == "__main__":
    main()
