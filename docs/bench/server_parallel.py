"""A real server with --parallel N against the same server with one client (issue 38's server target).

Starts `specdeck-cli serve` on loopback with the options given, then sends the same chat requests
(greedy, --max-tokens each) through the `openai` client, first one client at a time (each request
waits for the one before), then C clients at once (threads), and prints both runs' aggregate
tokens per second (completion tokens of every request over the run's wall time) and their ratio,
the median of --repeat runs. Each concurrent reply is also compared with its one-client reply.

    python docs/bench/server_parallel.py --clients 8 --repeat 3 -- -m default --backend torch \\
        --dtype bfloat16 --drafter ngram --parallel 4
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import threading
import time

from openai import OpenAI

PROMPTS = [
    "Write a short poem about the sea.",
    "List the days of the week, then list them again backwards.",
    "Explain in three sentences what a compiler does.",
    "def add(a, b):\n    return a + b\n\nRename the function add to plus and show the code again.",
    "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese.",
    "Give me a recipe for pancakes.",
    "What is the capital of France, and why is it famous?",
    "Summarize the plot of Romeo and Juliet in four sentences.",
]


def start(serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.cli.main", "serve", "--port", "0", *serve_args],
        stdout=subprocess.PIPE,
        text=True,
    )
    for line in process.stdout:  # "serving NAME at http://127.0.0.1:PORT: OpenAI's API at ..."
        found = re.search(r" at (http://\S+?):? OpenAI", line) if line.startswith("serving ") else None
        if found:
            return process, found.group(1).rstrip(":")
    raise SystemExit("the server stopped before it listened")


def ask(client: OpenAI, prompt: str, max_tokens: int) -> tuple[str, int]:
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
    )
    return reply.choices[0].message.content, reply.usage.completion_tokens


def one_client(client, prompts, max_tokens) -> tuple[float, list[str]]:
    begin, tokens, texts = time.perf_counter(), 0, []
    for prompt in prompts:
        text, n = ask(client, prompt, max_tokens)
        texts.append(text)
        tokens += n
    return tokens / (time.perf_counter() - begin), texts


def many_clients(client, prompts, max_tokens) -> tuple[float, list[str]]:
    results: list = [None] * len(prompts)

    def run(i: int) -> None:
        results[i] = ask(client, prompts[i], max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - begin
    return sum(n for _, n in results) / seconds, [text for text, _ in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("serve", nargs=argparse.REMAINDER, help="after --: specdeck-cli serve's options")
    args = parser.parse_args()
    serve_args = [a for a in args.serve if a != "--"]
    prompts = (PROMPTS * (args.clients // len(PROMPTS) + 1))[: args.clients]
    process, url = start(serve_args)
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="local", timeout=1800)
        ask(client, "Hello", 8)  # warm-up
        alone, together = [], []
        for _ in range(args.repeat):
            tps, solo_texts = one_client(client, prompts, args.max_tokens)
            alone.append(tps)
            tps, texts = many_clients(client, prompts, args.max_tokens)
            together.append(tps)
            same = sum(a == b for a, b in zip(solo_texts, texts))
            print(
                f"one client {alone[-1]:.1f} tok/s, {args.clients} clients {tps:.1f} tok/s; "
                f"{same} of {len(texts)} replies identical to one client's",
                flush=True,
            )
        a, t = statistics.median(alone), statistics.median(together)
        print(f"median: one client {a:.1f} tok/s, {args.clients} clients {t:.1f} tok/s, ratio {t / a:.2f}x")
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
