"""The PyTorch backend: a Hugging Face model loaded from local files, on the forward that fits it.

    backend = TorchBackend("models/smollm2", dtype="float32")   # a NativeBackend or a TransformersBackend

It loads a local folder (config.json + safetensors + tokenizer files) or a GGUF
file through `loader.load` (offline, never a pickle that runs code), then picks
the implementation (`impl`):

- "native" (`native_backend.NativeBackend`, for llama, mistral, qwen2 and qwen3):
  our own forward pass on the same weights, with trees, hidden features, early
  exit and optional int8 weights (every capability);
- "transformers" (`transformers_backend.TransformersBackend`): the model's own
  forward with one `DynamicCache`; any architecture transformers knows, chains only;
- "auto" (the default): native where it applies, transformers elsewhere.

Both are `HFBackend`s (engine/backends/hf/base.py), which holds what they share.
"""

from __future__ import annotations

import logging
import os

from engine.backends.hf.base import HFBackend
from engine.backends.hf.device import weight_format
from engine.backends.hf.loader import load
from engine.backends.hf.native import SUPPORTED_ARCHITECTURES, unsupported_reason
from engine.backends.hf.native_backend import NativeBackend
from engine.backends.hf.packed import PREPACK_CHOICES
from engine.backends.hf.static import COMPILE_CHOICES
from engine.backends.hf.transformers_backend import TransformersBackend
from engine.errors import ConfigError

logger = logging.getLogger(__name__)
IMPLEMENTATIONS = ("auto", "native", "transformers")


def TorchBackend(
    path: str | os.PathLike,
    *,
    impl: str = "auto",
    compile: str = "auto",  # noqa: N802
    prepack: str = "auto",
    **options,
) -> HFBackend:
    """Load `path` and return the backend that runs it: a NativeBackend or a TransformersBackend.

    `impl`: "auto", "native" or "transformers". `compile`: the native forward's path, "auto"
    (eager on every device: CUDA graphs are opt-in until they have run on a GPU), "on" (static
    shapes on any device, CUDA graphs on CUDA) or "off" (eager); see engine/backends/hf/static.py.
    transformers' own forward has one path. `prepack`: "auto" (float32 on a CPU multiplies with
    oneDNN-packed weights where the copy fits, see engine/backends/hf/packed.py) or "off".
    `options` are loader.load's: gguf_file, device, dtype,
    n_ctx, name, trust_remote_code, progress (which hears the phases of the load; transformers
    reports nothing finer). `dtype` "int8" keeps the linear weights
    in int8 (native implementation only) and computes in the device's default dtype.
    Named like the class it was: engine/models/loading.py and the tests call it so.
    """
    if impl not in IMPLEMENTATIONS:
        raise ConfigError(f"Unknown implementation {impl!r}: choose one of {', '.join(IMPLEMENTATIONS)}.")
    if compile not in COMPILE_CHOICES:
        raise ConfigError(f"Unknown compile setting {compile!r}: choose one of {', '.join(COMPILE_CHOICES)}.")
    if prepack not in PREPACK_CHOICES:
        raise ConfigError(f"Unknown prepack setting {prepack!r}: choose one of {', '.join(PREPACK_CHOICES)}.")
    int8 = weight_format(options.get("dtype", "auto")) is not None
    if int8 and impl == "transformers":
        raise ConfigError("int8 weights need the native implementation; use impl='auto' or 'native', or a float dtype.")
    loaded = load(path, **options)
    try:
        if options.get("progress") is not None:
            options["progress"]("Building the forward pass", 0.9)
        if impl == "transformers":
            return TransformersBackend(loaded)
        reason = unsupported_reason(loaded.model, loaded.n_ctx)
        if reason is None:
            return NativeBackend(loaded, compile, prepack)
        if impl == "native" or int8:
            what = "int8 weights need" if int8 else "impl='native' needs"
            raise ConfigError(
                f"{loaded.name} cannot run on the native implementation, which {what}: {reason}. "
                f"It supports the {', '.join(SUPPORTED_ARCHITECTURES)} architectures"
                + ("; use a float dtype." if int8 else "; use impl='auto' or 'transformers'.")
            )
        logger.debug("%s runs on transformers' own forward: %s", loaded.name, reason)
        return TransformersBackend(loaded)
    except BaseException:
        loaded.release()
        raise
