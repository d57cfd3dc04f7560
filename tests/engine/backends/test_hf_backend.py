"""The PyTorch backend: cache arithmetic, numerics, errors, text, devices.

Most tests use a tiny random Llama with the real SmolLM2 tokenizer (made in a
second by tests/factories/hf_models.py), on both implementations (native and
transformers' own forward); one module-scoped fixture loads the embedded
SmolLM2-135M GGUF through transformers to check a real model end to end.
The native implementation's own properties (trees, features, int8, other
architectures) are tested in test_hf_native.py.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from engine.backends.hf import base as hf_base
from engine.backends.hf import device as device_mod
from engine.backends.hf.backend import TorchBackend
from engine.backends.hf.device import cpu_has_native_bf16, pick_device, pick_dtype, weight_format
from engine.backends.hf.native_backend import NativeBackend
from engine.errors import ConfigError, ContextOverflowError, ModelLoadError, ModelNotFoundError
from tests.factories.hf_models import default_gguf_path, make_tiny_llama

CHAT = [{"role": "user", "content": "Write one sentence about cats."}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "target", seed=0)


@pytest.fixture(scope="module", params=["native", "transformers"])
def tiny(tiny_dir, request):
    backend = TorchBackend(tiny_dir, dtype="float32", impl=request.param)
    yield backend
    backend.close()


@pytest.fixture
def fresh(tiny):
    """The shared float32 tiny backend with an empty cache."""
    tiny.rollback(0)
    return tiny


@pytest.fixture(scope="module")
def prompt(tiny) -> list[int]:
    return tiny.apply_chat_template(CHAT)


def _cache_length(backend: TorchBackend) -> int:
    if isinstance(backend, NativeBackend):
        return backend._kv.length
    return backend._cache.get_seq_length()


# -- logits and the cache ------------------------------------------------------------


def test_logits_shape_dtype_and_last_row(fresh, prompt):
    all_rows = fresh.forward(prompt)
    assert all_rows.shape == (len(prompt), 49152)
    assert all_rows.dtype == torch.float32 and all_rows.device.type == "cpu"
    assert torch.isfinite(all_rows).all()
    fresh.rollback(0)
    last = fresh.forward(prompt, all_logits=False)
    assert last.shape == (1, 49152)
    torch.testing.assert_close(last[0], all_rows[-1], atol=1e-5, rtol=0)
    # The caller owns the tensor: in-place edits work outside inference mode.
    last[0, 0] = 0.0


def test_rollback_then_forward_equals_fresh_prefill(fresh, prompt):
    drafts = [int(t) for t in torch.randint(100, 40000, (6,), generator=torch.Generator().manual_seed(1))]
    fresh.forward(prompt)
    fresh.forward(drafts)
    keep = len(prompt) + 2
    fresh.rollback(keep)
    assert len(fresh.tokens) == keep == _cache_length(fresh)
    after_rollback = fresh.forward([777])[-1]

    fresh.rollback(0)
    assert _cache_length(fresh) == 0
    reference = fresh.forward(prompt + drafts[:2] + [777], all_logits=False)[-1]
    torch.testing.assert_close(after_rollback, reference, atol=1e-4, rtol=0)


def test_rebuild_path_is_exact_too(tiny_dir, prompt):
    # Models with sliding-window or recurrent layers cannot crop; they rebuild.
    backend = TorchBackend(tiny_dir, dtype="float32", impl="transformers")
    backend._exact_crop = False
    backend.forward(prompt + [500, 600, 700])
    backend.rollback(len(prompt) + 1)
    assert _cache_length(backend) == len(prompt) + 1
    got = backend.forward([800])[-1]
    backend.rollback(0)
    want = backend.forward(prompt + [500, 800])[-1]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(RuntimeError):
        backend.forward([1])


def test_batched_forward_matches_one_at_a_time_float32(fresh, prompt):
    fresh.forward(prompt, all_logits=False)
    block = [int(t) for t in torch.randint(100, 40000, (8,), generator=torch.Generator().manual_seed(2))]
    batched = fresh.forward(block)
    fresh.rollback(len(prompt))
    single = torch.cat([fresh.forward([t]) for t in block])
    diff = (batched - single).abs().max().item()
    assert diff < 1e-4, diff
    assert torch.equal(batched.argmax(-1), single.argmax(-1))


def test_batched_forward_in_bfloat16_stays_close(tiny_dir, prompt):
    backend = TorchBackend(tiny_dir, dtype="bfloat16")
    assert backend.info.dtype == "bfloat16"
    assert next(backend._model.parameters()).dtype == torch.bfloat16
    backend.forward(prompt, all_logits=False)
    block = [int(t) for t in torch.randint(100, 40000, (8,), generator=torch.Generator().manual_seed(2))]
    batched = backend.forward(block)
    backend.rollback(len(prompt))
    single = torch.cat([backend.forward([t]) for t in block])
    diff = (batched - single).abs().max().item()
    spread = batched.std().item()
    print(f"\nbf16 batched vs one-at-a-time: max |diff| {diff:.4f} (logit std {spread:.2f})")
    assert diff < 0.25 * spread  # bf16 rounding differs with the batch shape; only a loose bound
    backend.close()


def test_long_prefill_is_chunked_without_changing_logits(fresh, prompt, monkeypatch):
    whole = fresh.forward(prompt)
    fresh.rollback(0)
    monkeypatch.setattr(hf_base, "PREFILL_CHUNK", 7)
    calls = []
    run = fresh._run
    monkeypatch.setattr(fresh, "_run", lambda tokens, all_logits: calls.append(len(tokens)) or run(tokens, all_logits))
    chunked = fresh.forward(prompt)
    assert max(calls) == 7 and sum(calls) == len(prompt)
    torch.testing.assert_close(chunked, whole, atol=1e-4, rtol=0)
    fresh.rollback(0)
    last = fresh.forward(prompt, all_logits=False)
    torch.testing.assert_close(last[0], whole[-1], atol=1e-4, rtol=0)


def test_prefill_reuses_the_common_prefix(fresh, prompt, monkeypatch):
    fresh.prefill(prompt + [1000, 1001, 1002])
    seen = []
    forward = fresh._forward
    monkeypatch.setattr(
        fresh, "_forward", lambda tokens, all_logits: seen.append(tokens) or forward(tokens, all_logits)
    )
    fresh.prefill(prompt + [1000, 2000])
    assert seen == [[2000]]
    assert fresh.tokens == prompt + [1000, 2000] and _cache_length(fresh) == len(prompt) + 2
    fresh.prefill(prompt + [1000])  # a pure prefix: only a rollback, no model call
    assert seen == [[2000]] and _cache_length(fresh) == len(prompt) + 1


def test_context_overflow_is_refused_and_leaves_the_cache_alone(tiny_dir):
    backend = TorchBackend(tiny_dir, dtype="float32", n_ctx=16)
    assert backend.n_ctx == 16
    backend.forward(list(range(100, 110)))
    with pytest.raises(ContextOverflowError, match="16 tokens"):
        backend.forward(list(range(200, 210)))
    assert len(backend.tokens) == 10 == _cache_length(backend)
    backend.close()
    with pytest.raises(ConfigError, match="2048"):
        TorchBackend(tiny_dir, n_ctx=4096)


# -- model facts -----------------------------------------------------------------------


def test_info_describes_the_model(tiny, tiny_dir, tmp_path):
    info = tiny.info
    assert (info.backend, info.architecture, info.dtype, info.device) == ("torch", "llama", "float32", "cpu")
    assert (info.vocab_size, info.n_layers, info.context_length) == (49152, 2, 2048)
    assert info.name == "target" and info.path == os.path.abspath(tiny_dir)
    assert info.weight_bytes == 4 * info.n_params
    assert tiny.n_ctx == 2048
    assert tiny.eos_ids == frozenset({2})

    untied = TorchBackend(make_tiny_llama(tmp_path / "untied", tie_embeddings=False), dtype="float32", name="U")
    # An untied model has a second 49152 x 64 matrix: counted, not merged away.
    assert untied.info.n_params - info.n_params == 49152 * 64
    assert untied.info.name == "U"
    untied.close()


# -- text --------------------------------------------------------------------------------


def test_tokenizer_round_trip(tiny):
    text = "Hello world 2024! héllo 🙂\n  indented"
    ids = tiny.tokenize(text)
    assert ids[0] != 1  # no BOS/<|im_start|> added
    assert tiny.detokenize(ids) == text


def test_control_tokens_are_parsed_only_when_asked(tiny):
    assert tiny.tokenize("<|im_start|>", special=True) == [1]
    typed = tiny.tokenize("<|im_start|>")
    assert 1 not in typed and tiny.detokenize(typed) == "<|im_start|>"
    # detokenize hides control tokens; token_text shows every vocabulary entry.
    assert tiny.detokenize([1, 15876, 2]) == " hi"
    assert [tiny.token_text(i) for i in (1, 2, 15876, 198)] == ["<|im_start|>", "<|im_end|>", " hi", "\n"]


def test_chat_template_ends_ready_for_the_reply(tiny, prompt):
    assert "<|im_start|>" in tiny.chat_template
    assert prompt[-4:] == tiny.tokenize("<|im_start|>assistant\n", special=True)
    assert prompt[0] == 1 and prompt.count(2) == 2  # system + user turns, each closed by <|im_end|>
    assert "Write one sentence about cats." in tiny.detokenize(prompt)


def test_no_template_falls_back_to_plain_lines(tiny_dir, tmp_path):
    folder = tmp_path / "base"
    shutil.copytree(tiny_dir, folder)
    (folder / "chat_template.jinja").unlink()
    backend = TorchBackend(str(folder), dtype="float32")
    assert backend.chat_template is None
    ids = backend.apply_chat_template([{"role": "user", "content": "hi"}])
    assert backend.detokenize(ids) == "user: hi\nassistant:"
    backend.close()


# -- errors ------------------------------------------------------------------------------


def test_missing_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found.*config.json"):
        TorchBackend(str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError, match="GGUF file not found"):
        TorchBackend(str(tmp_path), gguf_file="missing.gguf")


def test_folder_without_config(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelLoadError, match="no config.json"):
        TorchBackend(str(tmp_path))


def test_config_without_weights(tiny_dir, tmp_path):
    shutil.copy(os.path.join(tiny_dir, "config.json"), tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match="no weights"):
        TorchBackend(str(tmp_path))


def test_corrupt_safetensors(tiny_dir, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(tiny_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated download
    with pytest.raises(ModelLoadError, match="corrupt") as caught:
        TorchBackend(str(folder))
    assert str(folder) in str(caught.value)


def test_pickle_weights_load_only_as_plain_tensors(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "bin"
    shutil.copytree(tiny_dir, folder)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    backend = TorchBackend(str(folder), dtype="float32")  # plain tensors: fine
    assert backend.info.n_params > 0
    backend.close()

    # A pickle that runs code when unpickled must be refused, not run.
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": _Exploit(str(marker))}, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError):
        TorchBackend(str(folder), dtype="float32")
    assert not marker.exists()


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- devices and dtypes --------------------------------------------------------------------


def test_auto_device_and_dtype_on_this_machine(tiny_dir):
    assert pick_device("auto") in ("cuda", "mps", "cpu")
    assert pick_device("cpu") == "cpu"
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert pick_dtype("cpu") == expected
    if not torch.cuda.is_available():
        backend = TorchBackend(tiny_dir)  # device and dtype "auto"
        assert backend.info.device == "cpu"
        assert backend.info.dtype == str(expected).removeprefix("torch.")
        backend.close()


def test_a_model_on_mps_says_that_path_has_not_run(tiny_dir):
    """Nothing here has run on Apple's MPS: --device auto still picks it, and the load line says so."""
    from dataclasses import replace

    from engine.backends.hf.loader import load

    loaded = load(tiny_dir, device="cpu", dtype="float32")
    on_cpu = NativeBackend(loaded)
    on_mps = NativeBackend(replace(loaded, device="mps"))  # as a Mac's load would report it
    assert on_cpu.info.placement == ""
    assert (
        on_mps.info.placement == "on Apple's MPS, not yet run there in this project (--device cpu is the tested path)"
    )
    on_cpu.close()


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads Linux CPU flags")
def test_native_bf16_is_read_from_cpu_flags():
    with open("/proc/cpuinfo") as f:
        flags = f.read().split()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert cpu_has_native_bf16() == native
    if native:  # e.g. this project's AMD EPYC build machine
        assert pick_dtype("cpu") == torch.bfloat16


def test_dtype_overrides_and_unknown_dtype():
    assert pick_dtype("cpu", "fp32") == torch.float32
    assert pick_dtype("cpu", "bf16") == torch.bfloat16
    assert pick_dtype("cpu", "float16") == torch.float16
    # int8 weights compute in the automatic dtype of the device.
    assert pick_dtype("cpu", "int8") == pick_dtype("cpu") and weight_format(" INT8 ") == "int8"
    assert weight_format("bf16") is None and weight_format("auto") is None
    with pytest.raises(ConfigError, match="float32.*bfloat16.*float16.*int8"):
        pick_dtype("cpu", "int3")


def test_unavailable_or_unknown_device(monkeypatch):
    monkeypatch.setattr(device_mod, "available_devices", lambda: ["cpu"])
    with pytest.raises(ConfigError, match="not available.*available: cpu"):
        pick_device("cuda")
    with pytest.raises(ConfigError, match="not available"):
        pick_device("mps")
    with pytest.raises(ConfigError, match="Unknown device"):
        pick_device("tpu")
    assert pick_device("auto") == "cpu"


# -- the real embedded model through transformers' GGUF loader ------------------------------


@pytest.fixture(scope="module")
def smol():
    backend = TorchBackend(default_gguf_path(), dtype="float32")
    yield backend
    backend.close()


@pytest.mark.slow
def test_embedded_gguf_model_loads_and_answers(smol):
    info = smol.info
    assert (info.architecture, info.vocab_size, info.n_layers) == ("llama", 49152, 30)
    assert 130e6 < info.n_params < 140e6 and info.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert 2 in smol.eos_ids
    ids = smol.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    assert ids[-4:] == smol.tokenize("<|im_start|>assistant\n", special=True) == [1, 520, 9531, 198]

    logits = smol.forward(ids, all_logits=False)
    assert torch.isfinite(logits).all()
    log_probs = logits[-1].log_softmax(-1)
    entropy = -(log_probs.exp() * log_probs).sum().item()
    assert entropy < 6.0  # a trained model narrows 49152 choices (uniform: 10.8 nats)
    reply = []
    for _ in range(8):
        token = int(logits[-1].argmax())
        if token in smol.eos_ids:
            break
        reply.append(token)
        logits = smol.forward([token])
    assert "Paris" in smol.detokenize(reply)

    # Rollback on a 30-layer model: drop the reply, re-run its first token.
    smol.rollback(len(ids))
    again = smol.forward([reply[0]])
    smol.rollback(0)
    fresh = smol.forward(ids + [reply[0]], all_logits=False)
    torch.testing.assert_close(again[-1], fresh[-1], atol=1e-4, rtol=0)


def test_a_gguf_load_reports_the_tensors_as_they_are_dequantized(tmp_path):
    from tests.factories.gguf_models import make_tiny_gguf

    heard = []
    backend = TorchBackend(
        make_tiny_gguf(str(tmp_path / "tiny.gguf")),
        dtype="float32",
        progress=lambda message, fraction: heard.append((message, fraction)),
    )
    backend.close()
    dequantizing = [fraction for message, fraction in heard if message == "Dequantizing the GGUF weights"]
    assert len(dequantizing) > 5 and dequantizing == sorted(dequantizing)  # tensor by tensor, not one jump
    assert dequantizing[-1] > 0.5
    assert [message for message, _ in heard][-1] == "Building the forward pass"
    from transformers import modeling_gguf_pytorch_utils

    assert modeling_gguf_pytorch_utils.tqdm.__module__.startswith("tqdm")  # put back after the load
