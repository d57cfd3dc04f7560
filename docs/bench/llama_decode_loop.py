"""One-token llama_decode cost: our LlamaCppBackend vs llama-cpp-python's Llama.eval, same file and context size,
5 alternating runs of 64 decodes after a 100-token prompt (docs/benchmarks.md)."""

import time

import llama_cpp

from engine.backends.llama_cpp import LlamaCppBackend
from engine.models.locate import default_model_path

path = str(default_model_path())
ours = LlamaCppBackend(path, n_ctx=8192)
peer = llama_cpp.Llama(model_path=path, n_ctx=8192, n_threads=2, n_threads_batch=2, verbose=False)
prompt = list(range(1000, 1100))


def run_ours():
    ours.prefill(prompt)
    t = time.perf_counter()
    for i in range(64):
        ours.forward([2000 + i])
    return (time.perf_counter() - t) / 64 * 1e3


def run_peer():
    peer.reset()
    peer.eval(prompt)
    t = time.perf_counter()
    for i in range(64):
        peer.eval([2000 + i])
    return (time.perf_counter() - t) / 64 * 1e3


a = []
b = []
for r in range(5):
    a.append(run_ours())
    b.append(run_peer())
print("ours ms/token", [round(x, 2) for x in a], "peer", [round(x, 2) for x in b])
