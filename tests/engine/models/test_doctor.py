"""The pair doctor: findings about a draft/target pair, from metadata only."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest

from engine.errors import ConfigError, ModelNotFoundError
from engine.models import doctor
from engine.models.doctor import check_model, check_pair, estimate_memory
from engine.models.locate import resolve
from engine.models.metadata import read_metadata
from engine.models.placement import Placement
from tests.engine.models.test_models import TOKENS, isolated_home, write_gguf, write_hf_folder  # noqa: F401 (fixture)


def finding(report_or_findings, title_part: str):
    findings = getattr(report_or_findings, "findings", report_or_findings)
    matches = [f for f in findings if title_part.lower() in f.title.lower()]
    assert matches, f"no finding about {title_part!r} in {[f.title for f in findings]}"
    return matches[0]


@pytest.fixture(scope="module")
def default_meta():
    return read_metadata(resolve("default"))


@pytest.fixture
def plenty_of_memory(monkeypatch):
    monkeypatch.setattr(doctor, "available_memory_bytes", lambda: 64 * 2**30)


def test_the_default_model_with_itself(default_meta, plenty_of_memory):
    report = check_pair("default", "default")
    assert report.compatible
    assert finding(report, "vocabular").severity == "ok"
    assert finding(report, "special tokens").severity == "ok"
    assert finding(report, "chat templates").severity == "ok"
    ratio = finding(report, "not smaller")
    assert ratio.severity == "warning" and "8:1 to 70:1" in ratio.detail
    assert finding(report, "memory").severity == "ok"
    text = str(report)
    assert "SmolLM2-135M-Instruct.Q4_1" in text and "Verdict: compatible, with 1 warning." in text
    data = json.loads(json.dumps(report.as_dict()))  # JSON-ready
    assert data["compatible"] is True and data["target"]["n_params"] == 134_515_008
    assert "vocab" not in data["target"] and {f["severity"] for f in data["findings"]} == {"ok", "warning"}


def test_different_vocabularies_are_an_error_naming_the_first_difference(tmp_path):
    other = TOKENS[:6] + ["Ġdog"] + TOKENS[7:]
    report = check_pair(write_gguf(tmp_path / "t.gguf"), write_gguf(tmp_path / "d.gguf", other))
    assert not report.compatible
    error = finding(report, "different vocabularies")
    assert error.severity == "error"
    assert "Token 6 is 'Ġthe' in the target but 'Ġdog' in the draft" in error.detail
    assert "cannot be used together" in error.detail and "same family" in error.detail
    assert "NOT compatible" in str(report)


def test_a_padded_vocabulary_is_only_a_warning(tmp_path):
    padded = TOKENS + ["[PAD10]", "[PAD11]"]
    report = check_pair(write_gguf(tmp_path / "t.gguf", padded), write_gguf(tmp_path / "d.gguf"))
    warning = finding(report, "vocabulary sizes differ")
    assert report.compatible and warning.severity == "warning"
    assert "12 tokens" in warning.detail and "the draft 10" in warning.detail


def test_padded_output_layers_with_the_same_tokens(default_meta):
    report = check_pair(default_meta, replace(default_meta, vocab_size=49280))
    vocab = finding(report, "vocabularies match")
    assert vocab.severity == "info" and "49152" in vocab.detail and "49280" in vocab.detail


def test_special_tokens_and_templates_that_differ(tmp_path):
    target = write_gguf(tmp_path / "t.gguf", template=None)
    draft = write_gguf(tmp_path / "d.gguf", bos=0, eos=0)
    report = check_pair(target, draft)
    special = finding(report, "special tokens differ")
    assert special.severity == "warning" and "BOS 1 '<|im_start|>'" in special.detail and "BOS 0" in special.detail
    assert finding(report, "target has no chat template").severity == "warning"
    assert finding(check_pair(draft, target), "draft has no chat template").severity == "info"
    other = write_gguf(tmp_path / "o.gguf", template="{{ messages }}")
    assert finding(check_pair(draft, other), "templates differ").severity == "info"


@pytest.mark.parametrize(
    "ratio, severity, title",
    [
        (20, "ok", "useful range"),
        (8, "ok", "useful range"),
        (70, "ok", "useful range"),
        (4, "warning", "large for this target"),
        (100, "warning", "very small"),
        (0.5, "warning", "not smaller"),
    ],
)
def test_size_ratio_against_the_8_to_70_guidance(default_meta, ratio, severity, title):
    target = replace(default_meta, n_params=int(default_meta.n_params * ratio))
    result = finding(check_pair(target, default_meta), "ratio" if severity == "ok" else title)
    assert result.severity == severity and title in result.title


def test_memory_estimate_of_the_default_model(default_meta):
    weights, kv = estimate_memory(default_meta, 4096)
    assert weights == default_meta.weight_bytes and 90e6 < weights < 100e6  # the 98 MB file, Q4_1
    assert kv == 2 * 30 * 3 * 64 * 4096 * 2  # keys + values, 30 layers, 3 KV heads of 64, float16
    assert estimate_memory(default_meta, 8192)[1] == 2 * kv


def test_memory_of_hf_models_follows_the_load_dtype(tmp_path):
    meta = read_metadata(resolve(str(write_hf_folder(tmp_path / "hf"))))  # stored as float16
    assert estimate_memory(meta, 100) == (meta.weight_bytes, 2 * 2 * 2 * 4 * 100 * 2)
    assert estimate_memory(meta, 100, "fp32") == (2 * meta.weight_bytes, 2 * 2 * 2 * 4 * 100 * 4)
    with pytest.raises(ConfigError, match="Unknown dtype"):
        estimate_memory(meta, 100, "int3")


def test_memory_warning_when_the_pair_does_not_fit(monkeypatch):
    monkeypatch.setattr(doctor, "available_memory_bytes", lambda: 300 * 2**20)
    memory = finding(check_pair("default", "default"), "memory")
    assert memory.severity == "warning" and "300 MiB" in memory.detail
    monkeypatch.setattr(doctor, "available_memory_bytes", lambda: None)
    assert finding(check_pair("default", "default"), "memory").severity == "info"


def test_real_available_memory_is_readable():
    assert (doctor.available_memory_bytes() or 1) > 0


def test_context_longer_than_trained(tmp_path):
    report = check_pair(write_gguf(tmp_path / "t.gguf", ctx=4096), write_gguf(tmp_path / "d.gguf", ctx=1024))
    context = finding(report, "context longer")
    assert context.severity == "warning" and "the draft (1024 tokens)" in context.detail
    with pytest.raises(ConfigError):
        check_pair("default", "default", n_ctx=0)


def test_gguf_target_with_the_matching_hf_draft(tmp_path, default_meta, plenty_of_memory):
    """The same tokenizer in both formats: the SmolLM2 GGUF and a HF folder with its tokenizer."""
    from tests.factories.hf_models import tokenizer_dir  # the tokenizer transformers builds from the GGUF

    folder = write_hf_folder(tmp_path / "hf", TOKENS)
    for item in tokenizer_dir().iterdir():
        shutil.copy2(item, folder / item.name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 49152}))
    report = check_pair("default", str(folder))
    assert finding(report, "vocabular").severity == "ok"
    assert finding(report, "special tokens").severity == "ok"
    assert report.compatible


def test_check_model():
    findings = check_model("default")
    assert findings[0].severity == "ok" and "135M parameters" in findings[0].detail
    missing = check_model("/no/such/model.gguf")
    assert [f.severity for f in missing] == ["error"] and "specdeck-cli models" in missing[0].detail
    with pytest.raises(ModelNotFoundError):
        check_pair("default", "/no/such/model.gguf")


def test_special_tokens_are_compared_by_their_text_in_each_vocabulary(tmp_path):
    """Same ids, other tokens: the draft's 1 and 2 are <s> and </s>, the target's <|im_start|> and <|im_end|>."""
    llama_style = ["<unk>", "<s>", "</s>"] + TOKENS[3:]
    report = check_pair(write_gguf(tmp_path / "t.gguf"), write_gguf(tmp_path / "d.gguf", llama_style))
    special = finding(report, "special tokens")
    assert special.title == "Special tokens differ" and special.severity == "warning"
    assert "the draft uses BOS 1 '<s>' and EOS 2 '</s>'" in special.detail
    assert "The target uses BOS 1 '<|im_start|>' and EOS 2 '<|im_end|>'" in special.detail
    same = check_pair(write_gguf(tmp_path / "t.gguf"), write_gguf(tmp_path / "d2.gguf"))
    assert finding(same, "special tokens").title == "Special tokens match"


def test_a_chat_template_marker_the_draft_lacks(tmp_path):
    """The target added a <|tool|> token at the end of the shared vocabulary, and its template writes it."""
    template = "{% for m in messages %}<|im_start|>{{ m['role'] }}<|tool|>{{ m['content'] }}<|im_end|>{% endfor %}"
    target = write_gguf(tmp_path / "t.gguf", TOKENS + ["<|tool|>"], template=template)
    report = check_pair(target, write_gguf(tmp_path / "d.gguf"))
    assert report.compatible
    special = finding(report, "special tokens")
    assert special.severity == "warning"
    assert "'<|tool|>', token 10 in the target but not a token of the draft" in special.detail
    assert finding(check_pair(target, target), "special tokens").severity == "ok"


def test_memory_of_int8_weights_counts_a_byte_per_weight_and_the_cache_in_the_compute_dtype(tmp_path):
    """The bench reads a loaded model's dtype ("int8 (weights) / float32"): it used to be refused, and
    an int8 model's KV cache was then counted as 0 bytes."""
    meta = read_metadata(resolve(str(write_hf_folder(tmp_path / "hf"))))  # stored as float16
    cache = 2 * 2 * 2 * 4 * 100  # keys and values, 2 layers, 2 KV heads of 4, per byte of element
    assert estimate_memory(meta, 100, "int8 (weights) / float32") == (meta.n_params, cache * 4)
    assert estimate_memory(meta, 100, "int8") == (meta.n_params, cache * 2)  # the stored dtype's cache


# -- memory on the device the models will sit on ----------------------------------------------------


ON_CUDA = Placement("cuda:0")


@pytest.fixture
def gpu_memory(monkeypatch):
    """A stub of the device query: set `free` and `total` (bytes), or None for a GPU it cannot read."""
    asked = []
    state = {"memory": (80 * 2**30, 80 * 2**30)}

    def device_memory(device):
        asked.append(device)
        return state["memory"]

    monkeypatch.setattr(doctor, "device_memory", device_memory)
    monkeypatch.setattr(doctor, "available_memory_bytes", lambda: 1)  # RAM must not count for a GPU model
    return SimpleNamespace(asked=asked, state=state)


def test_models_on_a_gpu_are_checked_against_its_free_memory(gpu_memory):
    gpu_memory.state["memory"] = (1400 * 2**20, 80 * 2**30)
    memory = finding(check_pair("default", "default", target_on=ON_CUDA, draft_on=ON_CUDA), "memory")
    assert memory.severity == "ok" and gpu_memory.asked == ["cuda:0"]
    assert "Needs about 364 MiB on cuda:0" in memory.detail and "1.4 GiB of 80.0 GiB is free on cuda:0" in memory.detail


def test_a_gpu_without_room_is_a_warning_that_names_it(gpu_memory):
    gpu_memory.state["memory"] = (200 * 2**20, 8 * 2**30)  # the model needs 182 MiB
    memory = finding(check_model("default", on=ON_CUDA), "memory")
    assert memory.severity == "warning" and "cuda:0" in memory.detail and "200 MiB of 8.0 GiB free" in memory.detail


def test_a_gpu_whose_memory_cannot_be_read_is_said(gpu_memory):
    gpu_memory.state["memory"] = None
    memory = finding(check_model("default", on=Placement("gpu")), "memory")
    assert memory.severity == "info" and "Could not read how much memory gpu has free" in memory.detail


def test_models_on_the_cpu_are_checked_against_system_ram_only(gpu_memory, monkeypatch):
    monkeypatch.setattr(doctor, "available_memory_bytes", lambda: 300 * 2**20)
    assert finding(check_pair("default", "default"), "memory").severity == "warning"
    assert gpu_memory.asked == []


def test_layers_left_on_the_cpu_count_against_system_ram(gpu_memory, monkeypatch, default_meta):
    monkeypatch.setattr(doctor, "available_memory_bytes", lambda: 64 * 2**30)
    weights, kv = estimate_memory(default_meta, 4096)
    memory = finding(check_model("default", on=Placement("cuda:0", layers=10)), "memory")  # 10 of 30 layers
    assert f"Needs about {doctor.format_bytes(round((weights + kv) / 3))} on cuda:0" in memory.detail
    assert f"Needs about {doctor.format_bytes(round((weights + kv) * 2 / 3))} in system RAM" in memory.detail


def test_the_pair_dialogs_check_looks_at_the_gpu_llama_cpp_offloads_to(gpu_memory, monkeypatch):
    """Preflight threads the placement through: on a GPU build of llama.cpp, -1 GPU layers put the default GGUF
    on the GPU ("auto" keeps it in RAM: offload is opt-in)."""
    from engine import EngineConfig, preflight
    from engine.backends import gpu_layers
    from engine.models import placement

    monkeypatch.setattr(gpu_layers, "llama_cpp_offloads", lambda: True)
    monkeypatch.setattr(placement, "_offload_device", lambda: "cuda:0")
    gpu_memory.state["memory"] = (100 * 2**20, 16 * 2**30)
    memory = finding(preflight(EngineConfig(gpu_layers=-1)).findings, "memory")
    assert memory.severity == "warning" and "on cuda:0" in memory.detail
    assert finding(preflight(EngineConfig()).findings, "memory").severity == "warning"  # auto: RAM, 1 byte
    assert gpu_memory.asked == ["cuda:0"]


def test_the_device_query_reads_cuda_free_and_total_and_says_none_where_it_cannot(monkeypatch):
    import torch

    if not torch.cuda.is_available():
        assert doctor.device_memory("cuda:0") is None  # no CUDA here: unreadable, not an exception
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 * 2**30, 80 * 2**30))
    assert doctor.device_memory("cuda:1") == (3 * 2**30, 80 * 2**30)
    assert doctor.device_memory("gpu") is None  # a llama.cpp GPU torch does not see
