"""Models that cannot be used say why: corrupt weights, too little memory, pickled code.

Each test breaks a model the way a user's machine does (a download overwritten with
noise, an address space too small for the weights, a checkpoint holding code) and
checks what the user reads: the error type, the file it names and what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

from engine.api import Engine, EngineConfig
from engine.backends.base import ModelInfo
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.errors import ModelLoadError
from engine.models.memory_errors import is_allocation_failure, out_of_memory
from tests.engine.drafters.build import make_drafter
from tests.factories.fake import MarkovBackend, random_transition
from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.hf_models import make_tiny_llama

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FEW_TOKENS = SamplingConfig(max_tokens=8)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("failures") / "tiny", seed=0)


# -- 9. corrupt tensor data ------------------------------------------------------------------


def overwrite_gguf_tensors(path: str) -> str:
    """Every tensor's bytes set to 0xFF (NaN in F16 and F32), the header left intact."""
    from gguf import GGUFReader

    regions = [(int(t.data_offset), int(t.n_bytes)) for t in GGUFReader(path).tensors]
    with open(path, "r+b") as f:
        for offset, size in regions:
            f.seek(offset)
            f.write(b"\xff" * size)
    return path


def overwrite_safetensors_data(folder: str) -> str:
    """model.safetensors with a valid header and 0xFF bytes (float32 NaN) for every tensor."""
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as f:
        (header,) = struct.unpack("<Q", f.read(8))
        f.seek(0, os.SEEK_END)
        size = f.tell() - 8 - header
        f.seek(8 + header)
        f.write(b"\xff" * size)
    return path


@pytest.fixture(scope="module")
def noise_gguf(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("noise") / "noise.gguf")
    return overwrite_gguf_tensors(make_tiny_gguf(path, n_layers=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64))


@pytest.fixture(scope="module")
def noise_folder(tiny_dir, tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("noise") / "noise-model")
    shutil.copytree(tiny_dir, folder)
    overwrite_safetensors_data(folder)
    return folder


def assert_names_corrupt_file(error: BaseException, path: str) -> None:
    message = str(error)
    assert path in message
    assert "corrupt" in message and "again" in message, message


@pytest.mark.parametrize("backend, model", [("llama.cpp", "noise_gguf"), ("torch", "noise_folder")])
def test_noise_for_weights_stops_the_load_with_the_files_name(request, backend, model):
    path = request.getfixturevalue(model)
    with pytest.raises(ModelLoadError) as caught:  # the verify-cost measurement is the first forward
        Engine.load(EngineConfig(target=path, backend=backend, drafter="ngram"))
    assert_names_corrupt_file(caught.value, path)


@pytest.mark.parametrize("backend, model", [("llama.cpp", "noise_gguf"), ("torch", "noise_folder")])
def test_noise_for_weights_stops_generation_instead_of_answering(request, backend, model):
    path = request.getfixturevalue(model)
    engine = Engine.load(EngineConfig(target=path, backend=backend, drafter="ngram", measure_costs=False))
    try:
        with pytest.raises(ModelLoadError) as caught:
            engine.generate(engine.prompt_ids("Hello"), FEW_TOKENS)
    finally:
        engine.close()
    assert_names_corrupt_file(caught.value, path)


class _GoesBad(MarkovBackend):
    """Logits that turn NaN once the sequence is long enough, as a broken layer would."""

    def __init__(self, transition, bad_after: int) -> None:
        super().__init__(transition)
        self.bad_after = bad_after

    @property
    def info(self) -> ModelInfo:
        v = self.transition.shape[0]
        return ModelInfo("bad", "/models/bad.gguf", "llama.cpp", "markov", v * v, v * v * 4, v, 1, 256, "F32", "cpu")

    def _forward(self, tokens, all_logits):
        logits = super()._forward(tokens, all_logits)
        if len(self.tokens) + len(tokens) > self.bad_after:
            logits[-1, 3] = float("nan")
        return logits


def test_logits_that_go_bad_in_a_later_step_stop_that_step():
    target = _GoesBad(random_transition(12, seed=1), bad_after=10)
    engine = Engine(target, None, EngineConfig(drafter="none"), CostModel())
    with pytest.raises(ModelLoadError) as caught:
        engine.generate([0, 1, 2], SamplingConfig(max_tokens=20), speculative=False)
    assert_names_corrupt_file(caught.value, "/models/bad.gguf")
    assert len(target.tokens) <= 10  # the bad forward's tokens left the cache


def test_masked_tokens_at_minus_infinity_are_not_corruption():
    transition = random_transition(12, seed=2)
    transition[:, 5] = 0.0  # log(0) = -inf: token 5 can never follow
    transition /= transition.sum(-1, keepdim=True)
    engine = Engine(MarkovBackend(transition), None, EngineConfig(drafter="none"), CostModel())
    result = engine.generate([0, 1], SamplingConfig(max_tokens=10), speculative=False)
    assert len(result.tokens) == 10


# -- 10. out of memory -----------------------------------------------------------------------


def _real_torch_allocation_error() -> BaseException:
    try:
        torch.empty(2**45)  # 128 TiB
    except BaseException as error:  # noqa: BLE001
        return error
    raise AssertionError("torch allocated 128 TiB")


@pytest.mark.parametrize(
    "error",
    [
        _real_torch_allocation_error(),  # "DefaultCPUAllocator: can't allocate memory: ..."
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 8.00 GB, other allocations: 1.2 GB)"),
        RuntimeError("could not create a primitive descriptor for a matmul primitive"),
        RuntimeError("std::bad_alloc"),
        MemoryError(),
        OSError(12, "Cannot allocate memory"),
        RuntimeError("unable to mmap 889235832 bytes from file <model.safetensors>: Cannot allocate memory (12)"),
        ValueError("Failed to create llama_context: failed to allocate buffer of size 1073741824"),
        RuntimeError("unable to allocate CPU buffer"),
    ],
    ids=["cpu-allocator", "cuda", "mps", "onednn", "bad_alloc", "MemoryError", "ENOMEM", "mmap", "ggml", "llama.cpp"],
)
def test_every_kind_of_failed_allocation_is_recognised(error):
    assert is_allocation_failure(error)
    wrapped = OSError(f"Unable to load weights from checkpoint file for 'model' ({type(error).__name__})")
    wrapped.__cause__ = error  # as transformers re-raises it
    assert is_allocation_failure(wrapped)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("Error while deserializing header: MetadataIncompleteBuffer"),
        ValueError("Failed to load model from file: broken.gguf"),
        KeyError("model.layers.0.mlp.up_proj.weight"),
    ],
)
def test_errors_of_broken_files_are_not_called_out_of_memory(error):
    assert not is_allocation_failure(error)


def _advice(message: str) -> str:
    return message.split(" Try ", 1)[1]


def test_out_of_memory_says_what_the_model_needs_and_offers_only_a_smaller_dtype(tiny_dir):
    float32 = str(out_of_memory("load tiny", path=tiny_dir, backend="torch", dtype="float32", device="cpu"))
    assert "needs about" in float32 and "of KV cache" in float32
    assert "bfloat16" in _advice(float32) and "other programs" in _advice(float32)
    bfloat16 = str(out_of_memory("load tiny", path=tiny_dir, backend="torch", dtype="bfloat16", device="cpu"))
    assert "needs about" in bfloat16
    assert "bfloat16" not in _advice(bfloat16) and "int8" in _advice(bfloat16)
    int8 = str(
        out_of_memory("load tiny", path=tiny_dir, backend="torch", dtype="int8 (weights) / float32", device="cpu")
    )
    assert "bfloat16" not in _advice(int8) and "int8" not in _advice(int8)


def test_out_of_memory_on_llama_cpp_suggests_a_quantized_gguf(noise_gguf):
    message = str(out_of_memory("load noise", path=noise_gguf, backend="llama.cpp", dtype="F32", device="cpu"))
    assert "needs about" in message and "more quantized GGUF" in message
    assert "bfloat16" not in message


def test_a_failed_allocation_while_generating_is_one_line_on_the_cli(tiny_dir, monkeypatch, capsys):
    from engine.backends.hf import native as native_llama

    def allocate_too_much(*args, **kwargs):
        torch.empty(2**45)  # the real allocator's RuntimeError, not "out of memory"

    monkeypatch.setattr(native_llama.NativeLlama, "forward", allocate_too_much)
    from engine.cli.main import main

    status = main(["generate", "--target", tiny_dir, "--dtype", "float32", "--prompt", "hi", "--max-tokens", "4"])
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Not enough memory" in lines[0] and "needs about" in lines[0], err
    assert "bfloat16" in _advice(lines[0])


# A model folder whose weights take ~850 MiB on paper and no disk: a sparse
# safetensors file of zeros. Under an address-space limit a little above what the
# imports use, loading it fails in the allocator (extra 0.25 of the weights) or when
# the file is mapped (extra 1.5 of the weights), which is where a real machine fails.
_BIG = dict(hidden=2048, intermediate=8192, layers=2, heads=16, kv_heads=4)


def make_big_sparse_llama(folder: str) -> int:
    make_tiny_llama(folder)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    h, i, n, kv, hd = (
        _BIG["hidden"],
        _BIG["intermediate"],
        _BIG["heads"],
        _BIG["kv_heads"],
        _BIG["hidden"] // _BIG["heads"],
    )
    config.update(
        hidden_size=h,
        intermediate_size=i,
        num_hidden_layers=_BIG["layers"],
        num_attention_heads=n,
        num_key_value_heads=kv,
        head_dim=hd,
    )
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    shapes = {"model.embed_tokens.weight": [config["vocab_size"], h], "model.norm.weight": [h]}
    for layer in range(_BIG["layers"]):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [n * hd, h],
            p + "self_attn.k_proj.weight": [kv * hd, h],
            p + "self_attn.v_proj.weight": [kv * hd, h],
            p + "self_attn.o_proj.weight": [h, n * hd],
            p + "mlp.gate_proj.weight": [i, h],
            p + "mlp.up_proj.weight": [i, h],
            p + "mlp.down_proj.weight": [h, i],
        }
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = 4 * int(torch.tensor(shape).prod())
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # sparse: zeros that take no disk
    return offset


# specdeck-cli with its imports done, then an address-space limit, then main().
_LIMITED_CLI = textwrap.dedent(
    """
    import resource, sys
    import safetensors.torch, torch, transformers
    import transformers.models.llama.modeling_llama
    import engine.backends.llama_cpp, engine.backends.hf.backend, engine.cli.main, engine.api
    with open("/proc/self/status") as f:
        used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = used + int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.exit(engine.cli.main.main(sys.argv[2:]))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
@pytest.mark.parametrize(
    "backend, headroom",
    [("torch", 0.25), ("torch", 1.5), ("llama.cpp", 0.5)],
    ids=["torch-allocator-fails", "torch-mmap-fails", "llama.cpp-mmap-fails"],
)
def test_cli_in_a_limited_address_space_says_out_of_memory_in_one_line(
    tmp_path_factory, default_gguf, backend, headroom
):
    if backend == "torch":
        target = str(tmp_path_factory.mktemp("big") / "big")
        weights = make_big_sparse_llama(target)
        options = ["--backend", "torch", "--dtype", "float32"]
    else:  # the embedded model's 94 MiB file, with half that to map it in
        target, weights, options = default_gguf, os.path.getsize(default_gguf), ["--backend", "llama.cpp"]
    args = ["generate", "--target", target, *options, "--prompt", "hi", "--max-tokens", "4"]
    run = subprocess.run(
        [sys.executable, "-c", _LIMITED_CLI, str(int(headroom * weights)), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, run.stderr[-2000:]
    assert "Not enough memory" in lines[0] and target in lines[0], lines[0]
    assert "corrupt" not in lines[0]
    if backend == "torch":
        assert "needs about" in lines[0] and "bfloat16" in _advice(lines[0])
    else:  # too little room even to read the header: the file's size is the estimate
        assert "on disk" in lines[0] and "bfloat16" not in lines[0]


# -- 12. pickled code ------------------------------------------------------------------------


class _Exploit:
    """Unpickling this creates `path`: the harmless stand-in for code a pickle could run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def assert_refused_as_pickled_code(error: BaseException, path: str, marker) -> None:
    message = str(error)
    assert f"{path} contains pickled code" in message, message
    assert "safetensors" in message and "weights-only" in message
    assert "only if you trust" in message.lower() or "if you trust" in message
    assert "weights_only=False" in message  # the conversion command, for a trusted file
    assert "corrupt" not in message and "download them again" not in message
    assert "\n" not in message and message.endswith('"') and message.count('"') == 2  # one whole line
    assert not marker.exists()  # and the pickle's code never ran


def test_a_model_folder_whose_weights_hold_pickled_code_is_refused_and_never_run(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_dir, folder)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    state["model.norm.weight"] = _Exploit(str(marker))
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as caught:
        Engine.load(EngineConfig(target=str(folder), backend="torch", drafter="ngram"))
    assert_refused_as_pickled_code(caught.value, str(folder / "pytorch_model.bin"), marker)
    assert "from_pretrained" in str(caught.value)  # a model folder converts through transformers


@pytest.fixture(scope="module")
def tiny_torch(tiny_dir):
    from engine.backends.hf.backend import TorchBackend

    backend = TorchBackend(tiny_dir, dtype="float32")
    yield backend
    backend.close()


def _medusa_folder(folder, marker) -> str:
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    torch.save({"0.0.linear.weight": _Exploit(str(marker))}, str(folder / "medusa_lm_head.pt"))
    return str(folder / "medusa_lm_head.pt")


def _eagle_folder(folder, marker) -> str:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
    }
    (folder / "config.json").write_text(json.dumps(config))
    torch.save({"fc.weight": _Exploit(str(marker))}, str(folder / "pytorch_model.bin"))
    return str(folder / "pytorch_model.bin")


@pytest.mark.parametrize("kind, make", [("medusa", _medusa_folder), ("eagle", _eagle_folder)])
def test_heads_whose_pickle_holds_code_are_refused_in_full_and_never_run(tiny_torch, tmp_path, kind, make):
    if not tiny_torch.supports_features:
        pytest.fail("the tiny llama should run on the native implementation, with hidden states")
    folder = tmp_path / "heads"
    folder.mkdir()
    marker = tmp_path / "code-ran"
    pickle_path = make(folder, marker)
    with pytest.raises(ModelLoadError) as caught:
        make_drafter(kind, tiny_torch, heads=str(folder))
    assert_refused_as_pickled_code(caught.value, pickle_path, marker)
    assert "save_file" in str(caught.value)


def test_out_of_memory_while_running_says_what_the_weights_take_when_the_files_cannot_be_read():
    from engine.models.memory_errors import model_out_of_memory

    info = ModelInfo(
        "gone", "/nowhere/gone.gguf", "torch", "llama", 10**8, 400 * 2**20, 49152, 30, 8192, "float32", "cpu"
    )
    message = str(model_out_of_memory("run gone on 97 tokens", info, 4096, "a shorter prompt"))
    assert message.startswith("Not enough memory to run gone on 97 tokens (float32 on cpu).")
    assert "weights alone take 400 MiB" in message and _advice(message).startswith("a shorter prompt")
