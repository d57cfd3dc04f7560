"""Where a model's weights and KV cache will sit, said before it loads: for the doctor's memory check.

A PyTorch model sits on its device ("auto": the fastest one here, engine/backends/hf/device.py).
A llama.cpp model sits in system RAM, except the layers it offloads to a GPU (its GPU
layers: none unless asked for, engine/backends/gpu_layers.py); llama.cpp does not say which
GPU, so it is taken to be the one torch sees ("cuda:0", else "mps"), and "gpu" when torch
sees none (then the doctor cannot read its memory and says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SpecDeckError

LLAMA_CPP = "llama.cpp"


@dataclass(frozen=True)
class Placement:
    device: str = "cpu"  # "cpu", "cuda:0", "mps", "gpu" (a llama.cpp GPU torch does not see)
    layers: int | None = None  # layers on `device` (llama.cpp's GPU layers); None: the whole model
    said: str = ""  # what llama.cpp's GPU layers chose, in words ("all 30 layers on the GPU"); "" for PyTorch

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu" and self.layers != 0


CPU = Placement()


def placement(runs_on: str, device: str = "auto", gpu_layers="auto", n_layers: int | None = None) -> Placement:
    """Where a model loaded on backend `runs_on` ("torch" or "llama.cpp") with these load options sits.
    An option that cannot work counts as the CPU (the load options' own check says what is wrong)."""
    if runs_on == LLAMA_CPP:
        from engine.backends.gpu_layers import describe_offload, is_auto, llama_cpp_offloads, resolve_gpu_layers

        try:
            layers = resolve_gpu_layers(gpu_layers)
        except SpecDeckError:
            return CPU
        offloads = llama_cpp_offloads()
        said = describe_offload(layers, n_layers, offloads, is_auto(gpu_layers)) if n_layers else ""
        if layers == 0 or not offloads:
            return Placement("cpu", None, said)
        whole = layers < 0 or (n_layers is not None and layers >= n_layers)
        return Placement(_offload_device(), None if whole else layers, said)
    from engine.backends.hf.device import pick_device

    try:
        chosen = pick_device(device)
    except SpecDeckError:
        return CPU
    return Placement("cuda:0" if chosen == "cuda" else chosen)


def model_placement(ref, backend: str = "auto", device: str = "auto", gpu_layers="auto") -> Placement:
    """`placement` of the resolved model `ref` loaded on `backend` ("auto": llama.cpp for a GGUF
    file, PyTorch otherwise), its layer count read from its metadata."""
    from engine.models.metadata import read_metadata

    runs_on = backend if backend != "auto" else (LLAMA_CPP if ref.kind == "gguf" else "torch")
    try:
        n_layers = read_metadata(ref).n_layers
    except SpecDeckError:
        n_layers = None
    return placement(runs_on, device, gpu_layers, n_layers)


def _offload_device() -> str:
    from engine.backends.hf.device import available_devices

    first = available_devices()[0]
    return {"cuda": "cuda:0", "mps": "mps"}.get(first, "gpu")
