"""The architectures the torch backend's native forward runs (engine/backends/hf/native.py).

Light (no torch): the preflight and the drafter registry read it to say, before anything loads,
whether a drafter that needs the native path's capabilities can have them.
"""

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
