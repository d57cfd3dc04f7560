"""Whether llama.cpp may repack weights for its CPU kernels: not on CPUs with AMX.

llama.cpp moves a model's weights into "extra" CPU buffer types when it loads them:
repacked layouts for its AVX2/ARM kernels and, when it was built for a CPU with Intel
AMX (Sapphire Rapids and later Xeons: `-march=native` turns it on there), AMX tiles.
On such a machine (seen here on 2026-12-02, llama-cpp-python 0.3.36 and llama-server
515e855 alike) the first decode of more than a few tokens dies in
`ggml_backend_amx_mul_mat` with a segmentation fault: every prompt, before one token
comes out. Loading without the extra buffers (`use_extra_bufts = false`, llama-server's
`--no-repack`) keeps the same weights in their file's layout and decodes correctly.

So repacking is off where AMX is: in llama-cpp-python when its CPU backend was built
with AMX (its system info says `AMX_INT8 = 1`), and for a llama-server when the CPU has
it (the server is built on this machine, for this CPU). Elsewhere it stays on: repacked
Q4_0 and Q4_K weights prefill faster. SPECDECK_LLAMA_REPACK=1 turns it on everywhere
(a machine whose AMX kernels work), =0 off everywhere.
"""

from __future__ import annotations

import os

ENV = "SPECDECK_LLAMA_REPACK"
_CPUINFO = "/proc/cpuinfo"


def cpu_has_amx(cpuinfo: str = _CPUINFO) -> bool:
    """Whether this CPU has AMX's integer tiles (Linux: the `amx_int8` flag); False where it cannot tell."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_int8" in line.split(":", 1)[-1].split()
    except OSError:
        pass
    return False


def repack_allowed(amx: bool) -> bool:
    """Whether to let llama.cpp repack weights, given whether its CPU kernels would use AMX."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen in ("0", "1"):
        return chosen == "1"
    return not amx


def llama_cpp_has_amx(system_info: str) -> bool:
    """Whether llama-cpp-python's CPU backend was built with AMX (from `llama_print_system_info()`)."""
    return "AMX_INT8 = 1" in system_info


def server_flags() -> list[str]:
    """llama-server's flags for this machine: `--no-repack` where repacking would use AMX."""
    return [] if repack_allowed(cpu_has_amx()) else ["--no-repack"]
