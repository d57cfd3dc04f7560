"""A conversation writer for the kill test: writes chats as the app does and acknowledges each write.

    python -m tests.app.store_writer FOLDER SEED

Prints one line per store call after it has returned ("user ID N TEXT", "tokens ID N COUNT",
"end ID N", "rename ID TITLE"), so whatever it printed before it was killed must be in the
database afterwards.
"""

from __future__ import annotations

import random
import sys

from app.chat.conversations import ConversationStore
from engine.core.events import Source, TokenInfo


def main(folder: str, seed: int) -> None:
    rng = random.Random(seed)
    store = ConversationStore(folder)
    while True:
        conversation = store.create(f"Chat {seed}")
        for turn in range(rng.randint(1, 4)):
            text = f"question {seed}.{turn} é東☕"
            store.add_user_message(conversation, text)
            position = len(conversation.messages) - 1
            print("user", conversation.id, position, text.replace(" ", "_"), flush=True)
            store.begin_reply(conversation)
            reply = conversation.messages[-1]
            for _ in range(rng.randint(5, 60)):
                step = tuple(
                    TokenInfo(
                        rng.randrange(50000),
                        rng.choice(["a", " b", "é", "☕", "\n"]),
                        rng.choice(list(Source)),
                        rng.random(),
                        rng.random(),
                    )
                    for _ in range(rng.randint(1, 5))
                )
                store.add_reply_tokens(conversation, step)
                print("tokens", conversation.id, position + 1, len(reply.tokens), flush=True)
            store.end_reply(conversation, "stop", {"tokens": len(reply.tokens)})
            print("end", conversation.id, position + 1, flush=True)
        title = f"Renamed {rng.randrange(1000)}"
        store.rename(conversation, title)
        print("rename", conversation.id, title.replace(" ", "_"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
